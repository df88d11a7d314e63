//! Request records are stored by reference to the messages their thread holds, and read back
//! exactly as they were appended: a property test over random threads (message events of
//! every kind, duplicates, context replaces, merges, forks, requests that send windows of
//! the history with messages left out, added, repeated and rendered, keyed or not, tools
//! the same or changed), on SQLite and on PostgreSQL; and a test that a long conversation's
//! records take bytes in proportion to its text, not to its square.

mod common;

use common::Harness;
use contexture_core::budget::{BudgetBreakdown, Limits};
use contexture_core::thread::{
    ContextReplace, Event, EventKind, FitRecord, Merge, RecordedBudget, ReplaceReason, RequestEnd,
    RequestOutcome, RequestRecord, StepMessage, Usage,
};
use contexture_core::{Message, ToolCall};
use contexture_store::testing::{message_length, prose};
use contexture_store::{EventOutline, NewEvent, RequestRetention, Store};
use proptest::prelude::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Few texts, so that the same message often appears more than once.
const TEXTS: [&str; 6] = [
    "yes",
    "no",
    "tell me more",
    "here is the answer",
    "ok",
    "why?",
];

fn message(role: u8, text: u8) -> Message {
    let text = TEXTS[usize::from(text) % TEXTS.len()];
    match role % 6 {
        0 => Message::user(text),
        1 => Message::assistant(text),
        2 => Message::tool_result(format!("call-{text}"), text),
        3 => Message::assistant_tool_calls(vec![ToolCall::new(
            format!("call-{text}"),
            "search",
            json!({"q": text}).to_string(),
        )]),
        4 => Message::user(text).pinned(),
        _ => Message::system(text),
    }
}

fn tools(set: u8) -> Vec<serde_json::Value> {
    match set % 3 {
        0 => Vec::new(),
        1 => vec![
            json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}),
        ],
        _ => vec![
            json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}),
            json!({"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}}}),
        ],
    }
}

/// A request's counted tokens: the sum of its breakdown's parts (see [`breakdown`]).
fn used_tokens(set: u8, n: u32) -> u32 {
    u32::from(set % 3) + u32::from(set % 3) * 20 + n * 7 + u32::from(set) + 3
}

/// A request's breakdown, whose numbers mostly follow from each other as counting makes
/// them (`used` the sum of the parts, `remaining` the limit less `used`), and sometimes not:
/// an over-limit request, and numbers written by some other counting.
fn breakdown(set: u8, n: u32, used: u32) -> BudgetBreakdown {
    let limit = if set.is_multiple_of(17) {
        used / 2
    } else {
        100_000
    };
    BudgetBreakdown {
        model: "gpt-4o".into(),
        exact: true,
        encoding: "o200k_base".into(),
        limits: Limits {
            context_window: 128_000,
            budget_ratio: 0.9,
            usable: 115_200,
            reserve_output: 15_200,
            limit,
        },
        system: u32::from(set % 3),
        tools: u32::from(set % 3) * 20,
        pinned: 0,
        summary: 0,
        messages: n * 7 + u32::from(set),
        reply_priming: 3,
        used: if set.is_multiple_of(11) {
            used + 1
        } else {
            used
        },
        remaining: if set.is_multiple_of(13) {
            7
        } else {
            i64::from(limit) - i64::from(used)
        },
    }
}

/// What a fit did: mostly nothing (`tokens_before` and `tokens_after` are `used`), sometimes
/// a trim or an uncounted start.
fn fit(set: u8, used: u32) -> FitRecord {
    let used = u64::from(used);
    FitRecord {
        limit: 100_000,
        tokens_before: match set % 4 {
            0 => None,
            1 => Some(used + 50),
            _ => Some(used),
        },
        tokens_after: if set % 8 == 5 { used - 1 } else { used },
        ..FitRecord::default()
    }
}

/// One step of a random thread's life.
#[derive(Debug, Clone)]
enum Op {
    /// A `message_appended` event.
    Say(u8, u8),
    /// A `step_message` event.
    Step(u8, u8),
    /// A context replace whose replacement repeats messages of the history and adds one.
    Replace(Vec<u16>, u8),
    /// A merge bringing messages back.
    Merge(Vec<(u8, u8)>),
    /// A request: a window of the history (start, length), positions in it left out,
    /// messages put in (position, role, text), a rendered system prompt first, the
    /// previous request's messages sent again, a tool set, and whether it has a key.
    Request {
        window: (u16, u16),
        left_out: Vec<u16>,
        put_in: Vec<(u16, u8, u8)>,
        system: Option<u8>,
        again: bool,
        tools: u8,
        keyed: bool,
    },
    /// The thread goes on as a fork of itself at a seq (a fraction of its length, in 256ths).
    Fork(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), any::<u8>()).prop_map(|(r, t)| Op::Say(r, t)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(r, t)| Op::Step(r, t)),
        1 => (prop::collection::vec(any::<u16>(), 0..4), any::<u8>()).prop_map(|(p, t)| Op::Replace(p, t)),
        1 => prop::collection::vec((any::<u8>(), any::<u8>()), 0..3).prop_map(Op::Merge),
        6 => (
            (any::<u16>(), any::<u16>()),
            prop::collection::vec(any::<u16>(), 0..3),
            prop::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 0..3),
            prop::option::of(any::<u8>()),
            any::<bool>(),
            any::<u8>(),
            any::<bool>(),
        )
            .prop_map(|(window, left_out, put_in, system, again, tools, keyed)| Op::Request {
                window,
                left_out,
                put_in,
                system,
                again,
                tools,
                keyed,
            }),
        1 => any::<u8>().prop_map(Op::Fork),
    ]
}

/// What a thread holds, as the test appended it.
#[derive(Debug, Clone, Default)]
struct Model {
    /// Every event, in order (a fork's prefix included).
    events: Vec<EventKind>,
    /// The messages of its message events, in order.
    history: Vec<Message>,
    /// The last request's messages.
    last_sent: Vec<Message>,
    /// The keys of keyed requests, with their seqs.
    keys: Vec<(String, u64)>,
    /// The index in `events` of its first own event (after a fork's prefix).
    own_from: usize,
}

fn at(items: usize, pick: u16) -> usize {
    usize::from(pick) % items.max(1)
}

/// Runs `ops` on a thread `id` of `store` (forks named after it), then checks that every
/// thread reads back as appended: whole, after seqs, and by key; then, with `prune`, that
/// pruning each thread's records past its last few (parents or forks first) leaves them
/// reading back as appended or pruned, and later requests read back as appended. Returns
/// the threads that hold events.
async fn run(
    store: &impl Store,
    id: &str,
    ops: Vec<Op>,
    prune: Option<(u8, bool)>,
) -> Result<Vec<String>, TestCaseError> {
    let mut thread = id.to_string();
    let mut model = Model::default();
    let mut threads: Vec<(String, Model)> = Vec::new();
    let mut requests = 0u64;
    for (n, op) in ops.into_iter().enumerate() {
        let mut batch: Vec<NewEvent> = Vec::new();
        match op {
            Op::Say(role, text) => {
                let message = message(role, text);
                model.history.push(message.clone());
                batch.push(NewEvent::new(EventKind::MessageAppended { message }));
            }
            Op::Step(role, text) => {
                let message = message(role, text);
                model.history.push(message.clone());
                batch.push(NewEvent::new(EventKind::StepMessage(StepMessage {
                    step: 1,
                    message,
                })));
            }
            Op::Replace(picks, text) => {
                let mut replacement: Vec<Message> = picks
                    .iter()
                    .filter(|_| !model.history.is_empty())
                    .map(|p| model.history[at(model.history.len(), *p)].clone())
                    .collect();
                replacement.push(Message::assistant(format!(
                    "summary {n}: {}",
                    TEXTS[usize::from(text) % 6]
                )));
                model.history.extend(replacement.iter().cloned());
                let based_on = model.events.len() as u64;
                batch.push(NewEvent::new(EventKind::ContextReplaced(
                    ContextReplace::new(
                        format!("op-{n}"),
                        ReplaceReason::Manual,
                        based_on,
                        replacement,
                    ),
                )));
            }
            Op::Merge(items) => {
                let messages: Vec<Message> = items.iter().map(|(r, t)| message(*r, *t)).collect();
                model.history.extend(messages.iter().cloned());
                batch.push(NewEvent::new(EventKind::Merged(Merge {
                    child: format!("{id}-child-{n}"),
                    child_seq: 3,
                    policy: Default::default(),
                    conflict: Default::default(),
                    messages,
                    store_changes: Vec::new(),
                    usage: Usage::default(),
                    cost_usd: None,
                    cost_unknown: false,
                })));
            }
            Op::Request {
                window,
                left_out,
                put_in,
                system,
                again,
                tools: set,
                keyed,
            } => {
                let len = model.history.len();
                let start = at(len + 1, window.0).min(len);
                let end = (start + usize::from(window.1) % (len - start + 1)).min(len);
                let mut sent: Vec<Message> = model.history[start..end].to_vec();
                for pick in left_out {
                    if !sent.is_empty() {
                        sent.remove(at(sent.len(), pick));
                    }
                }
                for (position, role, text) in put_in {
                    let position = at(sent.len() + 1, position);
                    sent.insert(position, message(role, text));
                }
                if again {
                    sent.splice(0..0, model.last_sent.iter().cloned());
                }
                if let Some(text) = system {
                    sent.insert(0, Message::system(format!("rendered {}", text % 4)));
                }
                model.last_sent = sent.clone();
                requests += 1;
                let request_id = format!("r{requests}");
                let used = used_tokens(set, n as u32);
                // Fields that change from request to request, and fields that come and go.
                let record = RequestRecord {
                    request_id: request_id.clone(),
                    model: (set % 4 != 3)
                        .then(|| ["gpt-4o", "gpt-4o-mini"][usize::from(set % 2)].into()),
                    messages: sent,
                    budget: (set % 7 != 6).then_some(RecordedBudget {
                        context_window: 128_000,
                        max_output_tokens: 4_096,
                        input_tokens: if set.is_multiple_of(2) {
                            used
                        } else {
                            u32::from(set) * 10 + n as u32
                        },
                    }),
                    breakdown: (set % 5 != 4).then(|| breakdown(set, n as u32, used)),
                    fit: (set % 3 != 0).then(|| fit(set, used)),
                    tools: tools(set),
                    purpose: Some("chat".into()),
                    ..RequestRecord::default()
                };
                let started = NewEvent::new(EventKind::RequestStarted(record));
                batch.push(if keyed {
                    let key = format!("key-{n}");
                    model
                        .keys
                        .push((key.clone(), model.events.len() as u64 + 1));
                    started.with_key(key)
                } else {
                    started
                });
                // The reply goes into the thread (or a step's log) in the same append, as the
                // engine does, and is then stored once; or a different message follows.
                let reply = Message::assistant(format!("reply {requests}"));
                let ended = NewEvent::new(EventKind::RequestEnded(RequestEnd {
                    reply: Some(reply.clone()),
                    ..RequestEnd::new(request_id, RequestOutcome::Completed, Usage::new(3, 4))
                }));
                batch.push(if keyed {
                    let key = format!("end-{n}");
                    model
                        .keys
                        .push((key.clone(), model.events.len() as u64 + 2));
                    ended.with_key(key)
                } else {
                    ended
                });
                let next = if set % 5 == 4 {
                    Message::assistant("something else")
                } else {
                    reply
                };
                model.history.push(next.clone());
                batch.push(NewEvent::new(if again {
                    EventKind::StepMessage(StepMessage {
                        step: 2,
                        message: next,
                    })
                } else {
                    EventKind::MessageAppended { message: next }
                }));
            }
            Op::Fork(fraction) => {
                if model.events.is_empty() {
                    continue;
                }
                let at_seq = 1 + ((model.events.len() as u64 - 1) * u64::from(fraction)) / 256;
                let child = format!("{id}-fork-{n}");
                store.fork(&thread, at_seq, &child).await.map_err(fail)?;
                let mut forked = Model {
                    events: model.events[..at_seq as usize].to_vec(),
                    own_from: at_seq as usize,
                    ..Model::default()
                };
                forked.events.push(EventKind::Forked {
                    parent: thread.clone(),
                    at_seq,
                });
                forked.history = forked
                    .events
                    .iter()
                    .filter(|e| {
                        matches!(
                            e,
                            EventKind::MessageAppended { .. }
                                | EventKind::StepMessage(_)
                                | EventKind::ContextReplaced(_)
                                | EventKind::Merged(_)
                        )
                    })
                    .flat_map(|e| e.messages().into_iter().cloned())
                    .collect();
                threads.push((thread, std::mem::replace(&mut model, forked)));
                thread = child;
                continue;
            }
        }
        model.events.extend(batch.iter().map(|e| e.kind.clone()));
        store.append(&thread, batch).await.map_err(fail)?;
    }
    threads.push((thread, model));
    for (thread, model) in &threads {
        if model.events.is_empty() {
            continue;
        }
        let read: Vec<EventKind> = store
            .events(thread)
            .await
            .map_err(fail)?
            .into_iter()
            .map(|e| e.kind)
            .collect();
        prop_assert_eq!(&read, &model.events, "thread {}", thread);
        for after in [
            1,
            model.events.len() / 2,
            model.events.len().saturating_sub(2),
        ] {
            let tail: Vec<EventKind> = store
                .events_after(thread, after as u64)
                .await
                .map_err(fail)?
                .into_iter()
                .map(|e| e.kind)
                .collect();
            prop_assert_eq!(&tail[..], &model.events[after.min(model.events.len())..]);
            // An outline read of the same events sees each one's type and request id.
            let through = (after + 5) as u64;
            let outlines = store
                .outlines_through(thread, after as u64, through)
                .await
                .map_err(fail)?;
            let expected: Vec<EventOutline> = (after..model.events.len().min(after + 5))
                .map(|index| {
                    EventOutline::of(&Event::new(index as u64 + 1, model.events[index].clone()))
                })
                .collect();
            prop_assert_eq!(outlines, expected, "thread {} after {}", thread, after);
        }
        // A fork shares its parent's events, not their keys: each thread finds its own.
        for (key, seq) in &model.keys {
            let keyed = store.keyed_event(thread, key).await.map_err(fail)?;
            let keyed = keyed.ok_or_else(|| TestCaseError::fail(format!("{key} not found")))?;
            prop_assert_eq!(keyed.event.seq, *seq);
            prop_assert_eq!(&keyed.event.kind, &model.events[*seq as usize - 1]);
        }
    }
    if let Some((keep, forks_first)) = prune {
        check_pruning(store, &mut threads, u64::from(keep % 4), forks_first).await?;
    }
    Ok(threads
        .into_iter()
        .filter(|(_, model)| !model.events.is_empty())
        .map(|(thread, _)| thread)
        .collect())
}

/// Records pruned in all the cases run, and threads where some were pruned and some kept:
/// what the property covered.
static PRUNED: AtomicU64 = AtomicU64::new(0);
static PRUNED_WITH_KEPT: AtomicU64 = AtomicU64::new(0);

/// Prunes every thread's request records but its last `keep`, then checks what reads back.
async fn check_pruning(
    store: &impl Store,
    threads: &mut [(String, Model)],
    keep: u64,
    forks_first: bool,
) -> Result<(), TestCaseError> {
    let retention = RequestRetention::new(None, Some(keep)).unwrap();
    let mut order: Vec<usize> = (0..threads.len()).collect();
    if forks_first {
        order.reverse();
    }
    // A parent's record that only a fork's record took a message from is pruned once the
    // fork's record is: a round per generation of forks, at most, until nothing is left.
    let mut pruned_by = std::collections::HashMap::new();
    let mut rounds = 0;
    loop {
        let mut pruned = 0;
        for &i in &order {
            let thread = &threads[i].0;
            if threads[i].1.events.is_empty() {
                continue;
            }
            let report = store
                .prune_thread_requests(thread, &retention, SystemTime::now())
                .await
                .map_err(fail)?;
            *pruned_by.entry(thread.clone()).or_insert(0) += report.records;
            pruned += report.records;
        }
        rounds += 1;
        if pruned == 0 {
            break;
        }
        prop_assert!(
            rounds <= threads.len() + 1,
            "pruning goes on after {} rounds",
            rounds
        );
    }
    for (thread, model) in threads.iter_mut() {
        if model.events.is_empty() {
            continue;
        }
        let read = store.events(thread).await.map_err(fail)?;
        prop_assert_eq!(read.len(), model.events.len());
        let own_records: Vec<usize> = (model.own_from..model.events.len())
            .filter(|i| matches!(model.events[*i], EventKind::RequestStarted(_)))
            .collect();
        let exact_from = own_records.len().saturating_sub(keep as usize);
        let must_be_exact: Vec<usize> = own_records[exact_from..].to_vec();
        let mut own_pruned = 0;
        for (i, (event, appended)) in read.iter().zip(&model.events).enumerate() {
            match (&event.kind, appended) {
                (EventKind::RequestStarted(got), EventKind::RequestStarted(sent))
                    if got != sent =>
                {
                    prop_assert!(
                        !must_be_exact.contains(&i),
                        "{} seq {}: one of the last {} records was pruned",
                        thread,
                        i + 1,
                        keep
                    );
                    let mark = got.pruned.ok_or_else(|| {
                        TestCaseError::fail(format!("{thread} seq {}: changed, not pruned", i + 1))
                    })?;
                    prop_assert_eq!(mark.messages, sent.messages.len() as u64);
                    prop_assert!(got.messages.is_empty());
                    let unmarked = RequestRecord {
                        pruned: None,
                        ..got.clone()
                    };
                    let bare = RequestRecord {
                        messages: Vec::new(),
                        ..sent.clone()
                    };
                    prop_assert_eq!(unmarked, bare);
                    if i >= model.own_from {
                        own_pruned += 1;
                    }
                }
                _ => prop_assert_eq!(&event.kind, appended, "{} seq {}", thread, i + 1),
            }
        }
        prop_assert_eq!(own_pruned, pruned_by[thread.as_str()], "{}", thread);
        PRUNED.fetch_add(own_pruned, Ordering::Relaxed);
        if own_pruned > 0 && !must_be_exact.is_empty() {
            PRUNED_WITH_KEPT.fetch_add(1, Ordering::Relaxed);
        }
        // A later request, whose record may be stored as a change of a pruned one, reads
        // back as appended.
        let newest = model.events.iter().rev().find_map(|event| match event {
            EventKind::RequestStarted(record) => Some(record.clone()),
            _ => None,
        });
        let record = RequestRecord {
            request_id: format!("{thread}-after-pruning"),
            messages: model.history.iter().rev().take(3).cloned().collect(),
            ..newest.unwrap_or_default()
        };
        let kind = EventKind::RequestStarted(record);
        store
            .append(thread, vec![NewEvent::new(kind.clone())])
            .await
            .map_err(fail)?;
        model.events.push(kind.clone());
        let last = store
            .events(thread)
            .await
            .map_err(fail)?
            .pop()
            .map(|e| e.kind);
        prop_assert_eq!(last.as_ref(), Some(&kind), "{}", thread);
    }
    Ok(())
}

fn fail(error: contexture_store::StoreError) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

fn check_random_threads(store: &impl Store, runtime: &tokio::runtime::Runtime, cases: u32) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(
            &(
                prop::collection::vec(op(), 1..40),
                prop::option::of((any::<u8>(), any::<bool>())),
            ),
            |(ops, prune)| {
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                runtime
                    .block_on(run(store, &format!("case-{n}"), ops, prune))
                    .map(|_| ())
            },
        )
        .unwrap();
    let (pruned, mixed) = (
        PRUNED.load(Ordering::Relaxed),
        PRUNED_WITH_KEPT.load(Ordering::Relaxed),
    );
    eprintln!("{pruned} records pruned; {mixed} threads with records pruned and kept");
    assert!(pruned > 0 && mixed > 0, "the cases pruned nothing");
}

#[test]
fn sqlite_reads_request_records_back_as_appended() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let harness = runtime.block_on(common::Sqlite::new());
    check_random_threads(harness.store(), &runtime, 64);
}

/// A store keeps the message bodies a thread's last record was compared with, so that the
/// next one reads only the newer messages: every record is stored exactly as a store that
/// keeps none stores it (the same references, so the same bytes).
fn check_kept_bodies_change_nothing(
    kept: &impl Store,
    unkept: &impl Store,
    runtime: &tokio::runtime::Runtime,
    cases: u32,
) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    let case = AtomicU64::new(0);
    runner
        .run(&prop::collection::vec(op(), 1..40), |ops| {
            let id = format!("same-{}", case.fetch_add(1, Ordering::Relaxed));
            runtime.block_on(async {
                let threads = run(kept, &id, ops.clone(), None).await?;
                run(unkept, &id, ops, None).await?;
                for thread in threads {
                    prop_assert_eq!(
                        sizes(kept, &thread).await,
                        sizes(unkept, &thread).await,
                        "thread {}",
                        thread
                    );
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn sqlite_kept_message_bodies_change_no_stored_record() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let kept = runtime.block_on(common::Sqlite::new());
    let unkept = runtime.block_on(common::Sqlite::new());
    unkept.store().set_projection_cache_bytes(0);
    check_kept_bodies_change_nothing(kept.store(), unkept.store(), &runtime, 48);
}

#[test]
fn postgres_kept_message_bodies_change_no_stored_record() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (Some(kept), Some(unkept)) = (
        runtime.block_on(common::Pg::new()),
        runtime.block_on(common::Pg::new()),
    ) else {
        return;
    };
    unkept.store().set_projection_cache_bytes(0);
    check_kept_bodies_change_nothing(kept.store(), unkept.store(), &runtime, 24);
    runtime.block_on(kept.cleanup());
    runtime.block_on(unkept.cleanup());
}

fn request(id: &str, messages: &[&Message]) -> NewEvent {
    NewEvent::new(EventKind::RequestStarted(RequestRecord {
        request_id: id.into(),
        messages: messages.iter().map(|m| (*m).clone()).collect(),
        ..RequestRecord::default()
    }))
}

fn said(message: &Message) -> NewEvent {
    NewEvent::new(EventKind::MessageAppended {
        message: message.clone(),
    })
}

async fn sent_by(store: &impl Store, thread: &str, seq: u64) -> Vec<Message> {
    let events = store.events(thread).await.unwrap();
    match &events[seq as usize - 1].kind {
        EventKind::RequestStarted(record) => record.messages.clone(),
        other => panic!("seq {seq} is a {}", other.type_name()),
    }
}

/// What a store kept of a write that was rolled back is not used: a message appended with a
/// record that failed (the thread full, set by `limit`) is gone, and a record that sends it
/// later is not stored as a reference to what took its seq.
async fn rolled_back_write_leaves_no_kept_bodies(store: &impl Store, limit: impl Fn(Option<u64>)) {
    let (a, b) = (Message::user("first"), Message::assistant("second"));
    store
        .append("t", vec![said(&a), said(&b), request("r1", &[&a, &b])])
        .await
        .unwrap();
    let (x, y) = (Message::user("gone"), Message::user("in its place"));
    limit(Some(4));
    let failed = store
        .append("t", vec![said(&x), request("r2", &[&a, &b, &x])])
        .await;
    assert!(
        matches!(failed, Err(contexture_store::StoreError::ThreadFull { .. })),
        "{failed:?}"
    );
    limit(None);
    store
        .append("t", vec![said(&y), request("r3", &[&a, &b, &x])])
        .await
        .unwrap();
    assert_eq!(sent_by(store, "t", 5).await, vec![a, b, x]);
}

#[tokio::test]
async fn sqlite_a_rolled_back_write_leaves_no_kept_bodies_behind() {
    let h = common::Sqlite::new().await;
    rolled_back_write_leaves_no_kept_bodies(h.store(), |max| h.store().set_max_thread_events(max))
        .await;
}

#[tokio::test]
async fn postgres_a_rolled_back_write_leaves_no_kept_bodies_behind() {
    let Some(h) = common::Pg::new().await else {
        return;
    };
    rolled_back_write_leaves_no_kept_bodies(h.store(), |max| h.store().set_max_thread_events(max))
        .await;
    h.cleanup().await;
}

/// Another process on the same database (`elsewhere`) appends to a thread, then deletes it
/// and starts one with the same id: the bodies `here` kept of the old one stay right through
/// the appends and are not used for the new one's records.
async fn kept_bodies_of_a_thread_deleted_elsewhere_are_not_used<S: Store>(here: &S, elsewhere: &S) {
    let (a, b) = (Message::user("old"), Message::user("new"));
    here.append("t", vec![said(&a), request("r1", &[&a])])
        .await
        .unwrap();
    let c = Message::assistant("from elsewhere");
    elsewhere.append("t", vec![said(&c)]).await.unwrap();
    here.append("t", vec![request("r2", &[&a, &c])])
        .await
        .unwrap();
    assert_eq!(sent_by(here, "t", 4).await, vec![a.clone(), c]);
    elsewhere.delete("t").await.unwrap();
    // Longer than what was kept, so that only the deletion tells the bodies are stale.
    let more: Vec<NewEvent> = (0..4).map(|_| said(&b)).collect();
    elsewhere.append("t", more).await.unwrap();
    here.append("t", vec![request("r3", &[&a])]).await.unwrap();
    assert_eq!(sent_by(here, "t", 5).await, vec![a]);
}

#[tokio::test]
async fn sqlite_kept_bodies_of_a_thread_deleted_elsewhere_are_not_used() {
    let h = common::Sqlite::new().await;
    kept_bodies_of_a_thread_deleted_elsewhere_are_not_used(h.store(), &h.reopen().await).await;
}

#[tokio::test]
async fn postgres_kept_bodies_of_a_thread_deleted_elsewhere_are_not_used() {
    let Some(h) = common::Pg::new().await else {
        return;
    };
    kept_bodies_of_a_thread_deleted_elsewhere_are_not_used(h.store(), &h.reopen().await).await;
    h.cleanup().await;
}

#[test]
fn postgres_reads_request_records_back_as_appended() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(harness) = runtime.block_on(common::Pg::new()) else {
        return;
    };
    check_random_threads(harness.store(), &runtime, 32);
    runtime.block_on(harness.cleanup());
}

/// (bytes, message bytes) of `thread`, as the store reports them.
async fn sizes(store: &impl Store, thread: &str) -> (u64, u64) {
    let info = store
        .thread_info(thread)
        .await
        .unwrap()
        .expect("the thread is listed");
    (info.bytes, info.message_bytes)
}

/// A chat of 1,000 messages whose every request sends the whole conversation (a window large
/// enough for all of it), and an agent's 200 calls each sending a rendered system prompt,
/// the task, every tool call and result so far, and the same tools: each stores at most 3
/// bytes of events per byte of its messages.
async fn long_threads_store_requests_in_proportion_to_their_text(h: &impl Harness) {
    let s = h.store();
    let system = Message::system("You are a helpful assistant. Answer briefly and cite sources.");
    s.append_one(
        "chat",
        NewEvent::new(EventKind::MessageAppended {
            message: system.clone(),
        }),
    )
    .await
    .unwrap();
    let mut history = vec![system];
    for turn in 0..500 {
        let question = Message::user(prose(turn, message_length(turn)));
        history.push(question.clone());
        let id = format!("r{turn}");
        let record = RequestRecord {
            request_id: id.clone(),
            model: Some("gpt-4o".into()),
            messages: history.clone(),
            purpose: Some("chat".into()),
            ..RequestRecord::default()
        };
        let answer = Message::assistant(prose(turn + 1, message_length(turn + 1)));
        s.append(
            "chat",
            vec![
                NewEvent::new(EventKind::MessageAppended { message: question }),
                NewEvent::new(EventKind::RequestStarted(record)),
            ],
        )
        .await
        .unwrap();
        s.append(
            "chat",
            vec![
                NewEvent::new(EventKind::RequestEnded(RequestEnd {
                    reply: Some(answer.clone()),
                    ..RequestEnd::new(id, RequestOutcome::Completed, Usage::new(10, 10))
                })),
                NewEvent::new(EventKind::MessageAppended {
                    message: answer.clone(),
                }),
            ],
        )
        .await
        .unwrap();
        history.push(answer);
    }
    let tools = tools(2);
    let rendered = Message::system(format!("You are an agent. {}", prose(0, 2_000)));
    let task = Message::user("Find the three largest files and summarize them.");
    s.append_one(
        "agent",
        NewEvent::new(EventKind::StepMessage(StepMessage {
            step: 1,
            message: task.clone(),
        })),
    )
    .await
    .unwrap();
    let mut sent = vec![rendered, task];
    for call in 0..200 {
        let id = format!("a{call}");
        let record = RequestRecord {
            request_id: id.clone(),
            model: Some("gpt-4o".into()),
            messages: sent.clone(),
            step: Some(1),
            tools: tools.clone(),
            ..RequestRecord::default()
        };
        let call_id = format!("call-{call}");
        let asked = Message::assistant_tool_calls(vec![ToolCall::new(
            call_id.clone(),
            "fetch",
            json!({"url": format!("file:///data/{call}")}).to_string(),
        )]);
        let result = Message::tool_result(call_id, prose(call, message_length(call)));
        let step = |message: Message| {
            NewEvent::new(EventKind::StepMessage(StepMessage { step: 1, message }))
        };
        s.append(
            "agent",
            vec![
                NewEvent::new(EventKind::RequestStarted(record)),
                NewEvent::new(EventKind::RequestEnded(RequestEnd {
                    reply: Some(asked.clone()),
                    ..RequestEnd::new(id, RequestOutcome::Completed, Usage::new(10, 10))
                })),
                step(asked.clone()),
                step(result.clone()),
            ],
        )
        .await
        .unwrap();
        sent.extend([asked, result]);
    }
    for (thread, last) in [
        ("chat", history),
        ("agent", sent[..sent.len() - 2].to_vec()),
    ] {
        let events = s.events(thread).await.unwrap();
        let Some(EventKind::RequestStarted(record)) = events
            .iter()
            .rev()
            .map(|e| &e.kind)
            .find(|kind| matches!(kind, EventKind::RequestStarted(_)))
        else {
            panic!("{thread} has no request");
        };
        let expected = if thread == "chat" {
            &last[..last.len() - 1]
        } else {
            &last[..]
        };
        assert_eq!(
            record.messages, expected,
            "{thread}'s last request reads back as sent"
        );
        let (bytes, message_bytes) = sizes(s, thread).await;
        let ratio = bytes as f64 / message_bytes as f64;
        eprintln!(
            "{thread}: {bytes} bytes of events for {message_bytes} of messages ({ratio:.2}x)"
        );
        assert!(ratio <= 3.0, "{thread}: {ratio:.2}x");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_long_threads_store_requests_in_proportion_to_their_text() {
    long_threads_store_requests_in_proportion_to_their_text(&common::Sqlite::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_long_threads_store_requests_in_proportion_to_their_text() {
    let Some(harness) = common::Pg::new().await else {
        return;
    };
    long_threads_store_requests_in_proportion_to_their_text(&harness).await;
    harness.cleanup().await;
}

/// The token counts an older build stored for `messages` (see `src/record.rs`).
fn old_counts(messages: &[&Message]) -> String {
    messages
        .iter()
        .map(|message| {
            contexture_core::tokens::Encoding::ALL
                .iter()
                .map(|encoding| {
                    format!(
                        "{}={}",
                        encoding.name(),
                        contexture_core::tokens::message_tokens(message, *encoding)
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// A database an older build wrote (its last schema before request records by reference),
/// holding a conversation whose request records copy their messages, is migrated on open:
/// every event reads back as it was, its message bytes are counted again, and a new turn's
/// record refers to the old messages instead of copying them.
async fn old_request_records_read_back_after_the_migration<H: Harness>(h: &H) {
    let turn = |n: usize| Message::user(format!("old question {n}: {}", prose(n, 300)));
    let answer = |n: usize| Message::assistant(format!("old answer {n}: {}", prose(n + 7, 300)));
    let mut history = vec![Message::system("Be brief.")];
    let mut events: Vec<EventKind> = vec![EventKind::MessageAppended {
        message: history[0].clone(),
    }];
    for n in 0..2 {
        history.push(turn(n));
        events.push(EventKind::MessageAppended { message: turn(n) });
        events.push(EventKind::RequestStarted(RequestRecord {
            request_id: format!("old-{n}"),
            model: Some("gpt-4o-mini".into()),
            messages: history.clone(),
            ..RequestRecord::default()
        }));
        events.push(EventKind::RequestEnded(RequestEnd {
            reply: Some(answer(n)),
            ..RequestEnd::new(
                format!("old-{n}"),
                RequestOutcome::Completed,
                Usage::new(9, 9),
            )
        }));
        history.push(answer(n));
        events.push(EventKind::MessageAppended { message: answer(n) });
    }
    // The rows as the older build wrote them: a message event's body is the message, any
    // other event's the whole event, records with every message they sent.
    let mut rows = Vec::new();
    let mut bytes = 0;
    for (i, event) in events.iter().enumerate() {
        let (body, ordinary) = match event {
            EventKind::MessageAppended { message } => (
                serde_json::to_string(message).unwrap(),
                if message.role.is_system_like() {
                    "NULL"
                } else {
                    "1"
                },
            ),
            other => (serde_json::to_string(other).unwrap(), "NULL"),
        };
        let messages = event.messages();
        let tokens = if messages.is_empty() {
            "NULL".to_string()
        } else {
            format!("'{}'", old_counts(&messages))
        };
        bytes += body.len();
        rows.push(format!(
            "('old', {}, '{}', '{body}', {tokens}, NULL, 0, {ordinary})",
            i + 1,
            event.type_name()
        ));
    }
    h.execute_raw(&format!(
        "INSERT INTO threads (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes)
             VALUES ('old', NULL, NULL, {}, 0, 0, {bytes}, 0);
         INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
             VALUES {};",
        events.len(),
        rows.join(",\n")
    ))
    .await;

    let new = h.reopen().await;
    let read: Vec<EventKind> = new
        .events("old")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(read, events, "every old event reads back as it was written");
    let text: u64 = history
        .iter()
        .map(|m| serde_json::to_string(m).unwrap().len() as u64)
        .sum();
    let (before, message_bytes) = sizes(&new, "old").await;
    assert_eq!(message_bytes, text, "the message bytes are counted again");

    // A new turn's record sends the whole conversation: it refers to the old messages.
    let question = turn(2);
    history.push(question.clone());
    let record = RequestRecord {
        request_id: "new-2".into(),
        model: Some("gpt-4o-mini".into()),
        messages: history.clone(),
        ..RequestRecord::default()
    };
    new.append(
        "old",
        vec![
            NewEvent::new(EventKind::MessageAppended {
                message: question.clone(),
            }),
            NewEvent::new(EventKind::RequestStarted(record.clone())),
        ],
    )
    .await
    .unwrap();
    let last = new.events("old").await.unwrap().pop().unwrap();
    assert_eq!(last.kind, EventKind::RequestStarted(record));
    let (after, _) = sizes(&new, "old").await;
    let question_bytes = serde_json::to_string(&question).unwrap().len() as u64;
    assert!(
        after - before < question_bytes + 400,
        "the new record holds references, not {text} bytes of copies: it took {}",
        after - before - question_bytes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_old_request_records_read_back_after_the_migration() {
    // Version 6: the last before request records by reference.
    old_request_records_read_back_after_the_migration(&common::Sqlite::at_version(6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_old_request_records_read_back_after_the_migration() {
    // Version 5: the last before request records by reference.
    let Some(harness) = common::Pg::at_version(5).await else {
        return;
    };
    old_request_records_read_back_after_the_migration(&harness).await;
    harness.cleanup().await;
}
