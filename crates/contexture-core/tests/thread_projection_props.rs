//! The projection is a pure function of the events: random logs are replayed through
//! [`Thread`] and checked against a naive reference written straight from the rules.

use contexture_core::fit::units::units;
use contexture_core::fit::{Rules, validate};
use contexture_core::thread::{
    ContextReplace, Event, EventKind, ReplaceReason, RequestEnd, RequestOutcome, RequestRecord,
    StoreChange, Thread, Usage, projection_watermark,
};
use contexture_core::{Message, Role, ToolCall};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// What a random log does next; turned into a valid event by [`build`].
#[derive(Debug, Clone)]
enum Step {
    Say {
        role: Role,
        text: u8,
        pinned: bool,
    },
    Replace {
        op: u8,
        alt: bool,
        back: u8,
        lead_system: bool,
        len: u8,
    },
    Switch {
        alt: bool,
        /// An op id from a small set, so that retries (a repeated id) happen.
        op: Option<u8>,
    },
    /// Starts a request, which may overlap others (a log written by turns that were not
    /// serialized).
    Start,
    /// Ends the request in flight picked by `pick`, or, when `stray` is set or none is in
    /// flight, a request that is not in flight.
    End {
        pick: u8,
        stray: bool,
    },
    Set {
        key: u8,
        value: u8,
    },
    Unset {
        key: u8,
    },
    Clear,
}

fn step() -> impl Strategy<Value = Step> {
    let role = prop_oneof![
        Just(Role::System),
        Just(Role::Developer),
        Just(Role::User),
        Just(Role::Assistant),
        Just(Role::Tool),
    ];
    prop_oneof![
        6 => (role, any::<u8>(), any::<bool>()).prop_map(|(role, text, pinned)| Step::Say { role, text, pinned }),
        3 => (0u8..6, any::<bool>(), any::<u8>(), any::<bool>(), 0u8..4)
            .prop_map(|(op, alt, back, lead_system, len)| Step::Replace { op, alt, back, lead_system, len }),
        1 => (any::<bool>(), prop::option::of(0u8..4)).prop_map(|(alt, op)| Step::Switch { alt, op }),
        2 => Just(Step::Start),
        2 => (any::<u8>(), prop::bool::weighted(0.1)).prop_map(|(pick, stray)| Step::End { pick, stray }),
        1 => (0u8..3, any::<u8>()).prop_map(|(key, value)| Step::Set { key, value }),
        1 => (0u8..3).prop_map(|key| Step::Unset { key }),
        1 => Just(Step::Clear),
    ]
}

fn context(alt: bool) -> String {
    if alt { "alt".into() } else { "main".into() }
}

/// Builds a log a store may hold: requests start and end (with varied outcomes), mostly one
/// at a time, sometimes overlapping, sometimes with an end of a request not in flight.
fn build(steps: &[Step]) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let mut busy: Vec<String> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let seq = events.len() as u64 + 1;
        let kind = match step {
            Step::Say { role, text, pinned } => {
                let mut message = match role {
                    // Some assistant turns call tools, and tool results follow them.
                    Role::Assistant if text % 3 == 0 => Message::assistant_tool_calls(
                        (0..1 + text % 2)
                            .map(|call| ToolCall::new(format!("c{seq}-{call}"), "look", "{}"))
                            .collect(),
                    ),
                    Role::Tool => {
                        Message::tool_result(format!("c{}-0", seq - 1), format!("r{seq}"))
                    }
                    _ => Message::new(*role, format!("m{seq}-{text}")),
                };
                message.metadata.pinned = *pinned;
                EventKind::MessageAppended { message }
            }
            Step::Replace {
                op,
                alt,
                back,
                lead_system,
                len,
            } => {
                let to_seq = (seq - 1).saturating_sub(u64::from(*back) % seq);
                let mut replacement = Vec::new();
                if *lead_system {
                    replacement.push(Message::system(format!("snapshot-sys{seq}")));
                }
                for k in 0..*len {
                    replacement.push(Message::assistant(format!("r{seq}-{k}")));
                }
                let reason = [
                    ReplaceReason::Compaction,
                    ReplaceReason::Manual,
                    ReplaceReason::Restore,
                    ReplaceReason::Clear,
                ][usize::from(*op) % 4];
                EventKind::ContextReplaced(
                    ContextReplace::new(format!("op{op}"), reason, to_seq, replacement)
                        .in_context(context(*alt)),
                )
            }
            Step::Switch { alt, op } => EventKind::ContextSwitched {
                context: context(*alt),
                op_id: op.map(|op| format!("switch{op}")),
            },
            Step::Start => {
                let request_id = format!("req{seq}");
                busy.push(request_id.clone());
                EventKind::RequestStarted(RequestRecord {
                    request_id,
                    model: None,
                    messages: vec![],
                    budget: None,
                    ..Default::default()
                })
            }
            Step::End { pick, stray } => {
                let request_id = if *stray || busy.is_empty() {
                    format!("stray{seq}")
                } else {
                    busy.remove(usize::from(*pick) % busy.len())
                };
                EventKind::RequestEnded(RequestEnd::new(
                    request_id,
                    [
                        RequestOutcome::Completed,
                        RequestOutcome::Failed,
                        RequestOutcome::Cancelled,
                    ][i % 3],
                    Usage::new(seq, 1),
                ))
            }
            Step::Set { key, value } => EventKind::StoreChanged(StoreChange::Set {
                key: format!("k{key}"),
                value: json!(value),
            }),
            Step::Unset { key } => EventKind::StoreChanged(StoreChange::Unset {
                key: format!("k{key}"),
            }),
            Step::Clear => EventKind::StoreChanged(StoreChange::Cleared),
        };
        events.push(Event::new(seq, kind));
    }
    events
}

/// An effect in the order it took place.
enum Effect<'a> {
    System(&'a Message),
    Replace(&'a ContextReplace),
}

/// The reference: returns (system prompt, conversation) of `context` with `limit`, the
/// active context, and the key-value store.
fn naive(
    events: &[Event],
    context: &str,
    limit: Option<usize>,
) -> (Option<Message>, Vec<Message>, String, Map<String, Value>) {
    let mut effects = Vec::new();
    let mut pending = Vec::new();
    let mut seen = Vec::new();
    // The requests in flight: operations wait until none is.
    let mut busy: Vec<&str> = Vec::new();
    let mut active = "main".to_string();
    let mut store = Map::new();
    for event in events {
        match &event.kind {
            EventKind::MessageAppended { message } if message.role.is_system_like() => {
                effects.push(Effect::System(message))
            }
            EventKind::ContextReplaced(op) if !seen.contains(&op.op_id) => {
                seen.push(op.op_id.clone());
                if !busy.is_empty() {
                    pending.push(Ok(op))
                } else {
                    effects.push(Effect::Replace(op))
                }
            }
            EventKind::RequestStarted(record) => busy.push(&record.request_id),
            EventKind::RequestEnded(end) if busy.contains(&end.request_id.as_str()) => {
                busy.retain(|id| *id != end.request_id);
                if !busy.is_empty() {
                    continue;
                }
                for op in pending.drain(..) {
                    match op {
                        Ok(op) => effects.push(Effect::Replace(op)),
                        Err(context) => active = context,
                    }
                }
            }
            // A switch is a context operation: once per op id, queued behind a request.
            EventKind::ContextSwitched { context, op_id } => {
                let fresh = match op_id {
                    Some(op_id) if seen.contains(op_id) => false,
                    Some(op_id) => {
                        seen.push(op_id.clone());
                        true
                    }
                    None => true,
                };
                if fresh && !busy.is_empty() {
                    pending.push(Err(context.clone()));
                } else if fresh {
                    active = context.clone();
                }
            }
            EventKind::StoreChanged(StoreChange::Set { key, value }) => {
                store.insert(key.clone(), value.clone());
            }
            EventKind::StoreChanged(StoreChange::Unset { key }) => {
                store.shift_remove(key);
            }
            EventKind::StoreChanged(StoreChange::Cleared) => store.clear(),
            _ => {}
        }
    }
    let mut system = None;
    let mut anchor: Option<&ContextReplace> = None;
    for effect in &effects {
        match effect {
            Effect::System(message) => system = Some((*message).clone()),
            Effect::Replace(op) if op.context == context => {
                anchor = Some(op);
                if let Some(last) = op
                    .replacement
                    .iter()
                    .rev()
                    .find(|m| m.role.is_system_like())
                {
                    system = Some(last.clone());
                }
            }
            Effect::Replace(_) => {}
        }
    }
    let base = anchor.map_or(0, |op| op.to_seq);
    let mut messages: Vec<Message> = anchor
        .map(|op| {
            op.replacement
                .iter()
                .filter(|m| !m.role.is_system_like())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    for event in events {
        if let EventKind::MessageAppended { message } = &event.kind
            && event.seq > base
            && !message.role.is_system_like()
        {
            messages.push(message.clone());
        }
    }
    if let Some(limit) = limit {
        // A limit counts units: a tool result right after a turn with calls (or after
        // another such result) belongs to that turn's unit; every other message starts one.
        let mut starts = Vec::new();
        let mut open = false;
        for (index, message) in messages.iter().enumerate() {
            let continues = message.role == Role::Tool && open;
            if !continues {
                starts.push(index);
            }
            open = continues || (message.role == Role::Assistant && !message.tool_calls.is_empty());
        }
        let keep_from = match limit {
            0 => messages.len(),
            limit => starts
                .len()
                .checked_sub(limit)
                .map_or(0, |first| starts[first]),
        };
        messages.drain(..keep_from);
    }
    (system, messages, active, store)
}

/// The whole projection of `context`, for comparing a limited one with it.
fn messages_of(thread: &Thread, context: &str) -> Vec<Message> {
    thread.projection_of(context, None).messages
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn projection_matches_the_naive_reference(steps in prop::collection::vec(step(), 0..60), limit in prop::option::of(0usize..8)) {
        let events = build(&steps);
        let thread = Thread::replay("t", events.clone()).expect("built logs are valid");
        for context in ["main", "alt"] {
            let view = thread.projection_of(context, limit);
            let (system, messages, active, store) = naive(&events, context, limit);
            prop_assert_eq!(&view.system, &system);
            prop_assert_eq!(&view.messages, &messages);
            prop_assert!(view.messages.iter().all(|m| !m.role.is_system_like()));
            // A limited view starts where a unit of the whole one starts.
            let whole = messages_of(&thread, context);
            let start = whole.len() - view.messages.len();
            let at_a_unit = start == whole.len() || units(&whole).iter().any(|unit| unit.start == start);
            prop_assert!(at_a_unit, "view starts at {}", start);
            prop_assert_eq!(thread.active_context(), active.as_str());
            prop_assert_eq!(thread.store(), &store);
        }
        // Deterministic: replaying again gives the same view.
        let again = Thread::replay("t", events).unwrap();
        prop_assert_eq!(again.projection(), thread.projection());
    }

    /// Loading for the projection only (what stores do for long threads) decodes no message
    /// at or below the watermark except system ones, and gives the same projection, store and
    /// usage as a full replay.
    #[test]
    fn elided_replay_gives_the_same_projection(steps in prop::collection::vec(step(), 0..80)) {
        let events = build(&steps);
        let full = Thread::replay("t", events.clone()).expect("built logs are valid");
        let watermark = projection_watermark(
            events
                .iter()
                .filter(|e| !matches!(e.kind, EventKind::MessageAppended { .. }))
                .map(|e| (e.seq, &e.kind)),
        );
        let mut lazy = Thread::new("t");
        let mut elided = 0;
        for event in events {
            match &event.kind {
                EventKind::MessageAppended { message }
                    if event.seq <= watermark && !message.role.is_system_like() =>
                {
                    elided += 1;
                    lazy.apply_elided(event.seq).unwrap();
                }
                _ => lazy.apply(event).unwrap(),
            }
        }
        prop_assert_eq!(lazy.projection(), full.projection());
        prop_assert_eq!(lazy.store(), full.store());
        prop_assert_eq!(lazy.usage(), full.usage());
        prop_assert_eq!(lazy.last_seq(), full.last_seq());
        prop_assert!(elided <= full.last_seq());
    }
}

#[test]
fn the_watermark_is_the_active_anchor() {
    let say = |seq: u64, message: Message| Event::new(seq, EventKind::MessageAppended { message });
    let replace = |seq: u64, op: &str, context: &str, to_seq: u64| {
        let mut op = ContextReplace::new(
            op.to_string(),
            ReplaceReason::Compaction,
            to_seq,
            vec![Message::assistant("summary")],
        );
        op.context = context.to_string();
        Event::new(seq, EventKind::ContextReplaced(op))
    };
    let events = vec![
        say(1, Message::system("be brief")),
        say(2, Message::user("a")),
        say(3, Message::assistant("b")),
        replace(4, "c1", "main", 3),
        say(5, Message::user("c")),
        replace(6, "c2", "alt", 5),
    ];
    let others = |events: &[Event]| -> u64 {
        projection_watermark(
            events
                .iter()
                .filter(|e| !matches!(e.kind, EventKind::MessageAppended { .. }))
                .map(|e| (e.seq, &e.kind)),
        )
    };
    assert_eq!(others(&events), 3);
    let mut switched = events.clone();
    switched.push(Event::new(
        7,
        EventKind::ContextSwitched {
            context: "alt".into(),
            op_id: None,
        },
    ));
    assert_eq!(others(&switched), 5);
    // A replace queued behind a request in flight does not move the anchor yet.
    let mut queued = events[..5].to_vec();
    queued.push(Event::new(
        6,
        EventKind::RequestStarted(RequestRecord {
            request_id: "r1".into(),
            model: None,
            messages: Vec::new(),
            budget: None,
            ..Default::default()
        }),
    ));
    queued.push(replace(7, "c3", "main", 5));
    assert_eq!(others(&queued), 3);
}

/// A valid conversation: user turns, assistant turns that call one to three tools followed by
/// every result, and plain answers.
fn conversation() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec((0u8..3, 1usize..4), 0..12).prop_map(|turns| {
        let mut messages = Vec::new();
        for (n, (kind, calls)) in turns.into_iter().enumerate() {
            match kind {
                0 => messages.push(Message::user(format!("question {n}"))),
                1 => {
                    let ids: Vec<String> = (0..calls).map(|c| format!("call-{n}-{c}")).collect();
                    messages.push(Message::assistant_tool_calls(
                        ids.iter()
                            .map(|id| ToolCall::new(id.clone(), "look", "{}"))
                            .collect(),
                    ));
                    messages.extend(
                        ids.iter()
                            .map(|id| Message::tool_result(id.clone(), "found")),
                    );
                }
                _ => messages.push(Message::assistant(format!("answer {n}"))),
            }
        }
        messages
    })
}

proptest! {
    /// Every limit of a valid conversation is valid: no view holds a tool result without the
    /// turn that called it, or a turn without its results.
    #[test]
    fn every_limit_of_a_valid_conversation_is_valid(messages in conversation()) {
        let mut events = vec![Event::new(1, EventKind::MessageAppended { message: Message::system("Be brief.") })];
        for message in &messages {
            let seq = events.len() as u64 + 1;
            events.push(Event::new(seq, EventKind::MessageAppended { message: message.clone() }));
        }
        let thread = Thread::replay("t", events).expect("a valid log");
        prop_assert!(validate(&thread.projection().into_messages(), Rules::OpenAi).is_empty());
        for limit in 0..=messages.len() + 1 {
            let view = thread.projection_of("main", Some(limit)).into_messages();
            let violations = validate(&view, Rules::OpenAi);
            prop_assert!(violations.is_empty(), "limit {}: {:?}", limit, violations);
        }
    }
}

/// The example from the bug report: the last unit of `[system, user, assistant(calls), tool]`
/// is the turn with its result, not the result alone.
#[test]
fn a_limit_of_one_keeps_the_turn_with_its_result() {
    let call = ToolCall::new("c1", "look", "{}");
    let messages = [
        Message::system("Be brief."),
        Message::user("Look it up."),
        Message::assistant_tool_calls(vec![call]),
        Message::tool_result("c1", "found"),
    ];
    let events: Vec<Event> = messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            Event::new(
                i as u64 + 1,
                EventKind::MessageAppended {
                    message: message.clone(),
                },
            )
        })
        .collect();
    let thread = Thread::replay("t", events).unwrap();
    let view = thread.projection_of("main", Some(1)).into_messages();
    assert_eq!(
        view,
        messages[..1]
            .iter()
            .chain(&messages[2..])
            .cloned()
            .collect::<Vec<_>>()
    );
    let two = thread.projection_of("main", Some(2)).into_messages();
    assert_eq!(two, messages);
}
