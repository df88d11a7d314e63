//! Property tests for fitting: every output of trim, clear and repair
//! validates for its provider, fits its budget, keeps the system prompt and pinned messages;
//! strategy last is maximal; the indexed and the lazy entry points agree.

use contexture_core::fit::{
    ClearOptions, ClearTrigger, IndexedHistory, RepairChange, Rules, Strategy as Keep, TrimError,
    TrimOptions, TruncatePolicy, ViolationKind, clear_tool_results, cleared_placeholder, repair,
    trim, truncate_tool_results, units, validate,
};
use contexture_core::{Content, Encoding, Message, Part, Role, TokenCounter, ToolCall};
use proptest::prelude::*;

const COUNTER: TokenCounter = TokenCounter::exact(Encoding::O200kBase);

/// One generated turn of a conversation.
#[derive(Debug, Clone)]
enum Turn {
    User {
        text: String,
        pinned: bool,
    },
    Assistant {
        text: String,
        pinned: bool,
        reasoning: bool,
    },
    Tools {
        calls: Vec<(String, String)>,
        pinned: bool,
        reversed: bool,
        text: Option<String>,
    },
    /// Garbage for repair: a stray result, a system message mid-way, reasoning in a user turn.
    Stray {
        kind: u8,
        text: String,
    },
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        8 => prop::collection::vec("[a-z]{1,8}( [a-z]{1,8}){0,12}", 1..5).prop_map(|l| l.join("\n")),
        1 => (1usize..4).prop_map(|k| {
            // One huge message: thousands of tokens over many lines.
            (0..k * 40).map(|i| format!("line {i} of a long tool output with numbers {}", i * 7)).collect::<Vec<_>>().join("\n")
        }),
    ]
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        4 => (text(), prop::bool::weighted(0.1)).prop_map(|(text, pinned)| Turn::User { text, pinned }),
        3 => (text(), prop::bool::weighted(0.1), any::<bool>())
            .prop_map(|(text, pinned, reasoning)| Turn::Assistant { text, pinned, reasoning }),
        3 => (
            prop::collection::vec(("(search|fetch|shell)", text()), 1..4),
            prop::bool::weighted(0.1),
            any::<bool>(),
            prop::option::of(text()),
        )
            .prop_map(|(calls, pinned, reversed, text)| Turn::Tools { calls, pinned, reversed, text }),
    ]
}

fn build(system: Option<(String, bool)>, turns: &[Turn]) -> Vec<Message> {
    let mut messages = Vec::new();
    if let Some((text, pinned)) = system {
        let mut system = Message::system(text);
        system.metadata.pinned = pinned;
        messages.push(system);
    }
    let mut next_id = 0;
    for turn in turns {
        match turn {
            Turn::User { text, pinned } => {
                let mut m = Message::user(text.clone());
                m.metadata.pinned = *pinned;
                messages.push(m);
            }
            Turn::Assistant {
                text,
                pinned,
                reasoning,
            } => {
                let mut m = Message::assistant(text.clone());
                if *reasoning {
                    m.content = Some(Content::Parts(vec![
                        Part::reasoning("thinking it over"),
                        Part::text(text.clone()),
                    ]));
                }
                m.metadata.pinned = *pinned;
                messages.push(m);
            }
            Turn::Tools {
                calls,
                pinned,
                reversed,
                text,
            } => {
                let ids: Vec<String> = calls
                    .iter()
                    .map(|_| {
                        next_id += 1;
                        format!("call_{next_id}")
                    })
                    .collect();
                let mut call = Message::assistant_tool_calls(
                    calls
                        .iter()
                        .zip(&ids)
                        .map(|((name, _), id)| {
                            ToolCall::new(id.clone(), name.clone(), r#"{"q":"x"}"#)
                        })
                        .collect(),
                );
                if let Some(text) = text {
                    call.content = Some(Content::Parts(vec![
                        Part::reasoning("plan"),
                        Part::text(text.clone()),
                    ]));
                }
                call.metadata.pinned = *pinned;
                messages.push(call);
                let mut results: Vec<Message> = calls
                    .iter()
                    .zip(&ids)
                    .map(|((_, result), id)| Message::tool_result(id.clone(), result.clone()))
                    .collect();
                if *reversed {
                    results.reverse();
                }
                messages.extend(results);
            }
            Turn::Stray { kind, text } => match kind % 3 {
                0 => messages.push(Message::tool_result(
                    format!("ghost_{next_id}"),
                    text.clone(),
                )),
                1 => messages.push(Message::system(text.clone())),
                _ => {
                    let mut m = Message::user(text.clone());
                    m.content = Some(Content::Parts(vec![
                        Part::reasoning("leaked"),
                        Part::text(text.clone()),
                    ]));
                    messages.push(m);
                }
            },
        }
    }
    messages
}

fn history() -> impl Strategy<Value = Vec<Message>> {
    (
        prop::option::weighted(0.8, (text(), prop::bool::weighted(0.2))),
        prop::collection::vec(turn(), 0..40),
    )
        .prop_map(|(system, turns)| build(system, &turns))
}

fn provider() -> impl Strategy<Value = Rules> {
    prop::sample::select(Rules::ALL.to_vec())
}

fn options() -> impl Strategy<Value = TrimOptions> {
    (
        prop_oneof![3 => 20u32..800, 1 => 800u32..6000],
        prop::option::of(0.3f64..1.0),
        0u32..60,
        prop_oneof![
            Just(Keep::Last),
            Just(Keep::First),
            (0usize..4).prop_map(|head| Keep::HeadTail { head })
        ],
        prop::bool::weighted(0.8),
        prop::sample::select(vec![vec![], vec![Role::User]]),
        prop::sample::select(vec![
            vec![],
            vec![Role::Assistant],
            vec![Role::User, Role::Tool],
        ]),
        any::<bool>(),
        provider(),
    )
        .prop_map(
            |(
                max,
                low,
                tools,
                strategy,
                keep_system,
                start_on,
                end_on,
                allow_partial,
                provider,
            )| TrimOptions {
                max_tokens: max,
                low_water: low.map(|f| (f64::from(max) * f) as u32),
                tools_tokens: tools,
                strategy,
                keep_system,
                start_on,
                end_on,
                allow_partial,
                rules: provider,
            },
        )
}

/// The input made valid for the provider; `None` when repair cannot (a pinned opening
/// assistant turn), which the repair property checks separately.
fn valid_input(messages: Vec<Message>, provider: Rules) -> Option<Vec<Message>> {
    let (repaired, changes) = repair(messages, provider);
    let unrepaired = changes
        .iter()
        .any(|c| matches!(c, RepairChange::Unrepaired { .. }));
    (!unrepaired).then_some(repaired)
}

fn request_tokens(messages: &[Message], tools: u32) -> u64 {
    u64::from(COUNTER.count_request(messages, &[]).total) + u64::from(tools)
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn repair_output_validates_or_reports_what_it_left(
        system in prop::option::of((text(), any::<bool>())),
        mut turns in prop::collection::vec(turn(), 0..20),
        strays in prop::collection::vec((any::<u8>(), text(), any::<prop::sample::Index>()), 0..4),
        provider in provider(),
    ) {
        for (kind, text, at) in strays {
            let at = at.index(turns.len() + 1);
            turns.insert(at, Turn::Stray { kind, text });
        }
        let mut messages = build(system, &turns);
        // Cut a random tail off a tool block now and then: an unanswered call.
        if messages.last().is_some_and(|m| m.role == Role::Tool) {
            messages.pop();
        }
        let (repaired, changes) = repair(messages.clone(), provider);
        let left: Vec<_> = changes.iter().filter_map(|c| match c { RepairChange::Unrepaired { violation } => Some(violation.clone()), _ => None }).collect();
        prop_assert_eq!(validate(&repaired, provider), left.clone());
        for violation in &left {
            // Only a pinned opening turn may be left: repair never drops a pinned message.
            prop_assert!(matches!(violation.kind, ViolationKind::FirstTurnNotUser { .. }), "{violation}");
        }
        let pinned_in = messages.iter().filter(|m| m.is_pinned()).count();
        prop_assert!(repaired.iter().filter(|m| m.is_pinned()).count() <= pinned_in + changes.len());
        if provider == Rules::OpenAi {
            // Without alternation, repair never removes a pinned message.
            let pinned_out: Vec<_> = repaired.iter().filter(|m| m.is_pinned() && m.role != Role::Tool).map(Message::text).collect();
            let pinned_expected: Vec<_> = messages.iter().filter(|m| m.is_pinned() && m.role != Role::Tool && !m.role.is_system_like()).map(Message::text).collect();
            for text in pinned_expected {
                prop_assert!(pinned_out.contains(&text));
            }
        }
    }

    #[test]
    fn trim_output_validates_fits_and_keeps_system_and_pinned(
        messages in history(),
        options in options(),
    ) {
        let Some(input) = valid_input(messages, options.rules) else { return Ok(()) };
        prop_assert!(validate(&input, options.rules).is_empty());
        let lazy = trim(&input, &options, &COUNTER);
        let indexed = IndexedHistory::from_messages(input.clone(), COUNTER).fit(&options);
        match (&lazy, &indexed) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(&a.messages, &b.messages);
                prop_assert_eq!(&a.dropped, &b.dropped);
                prop_assert_eq!(a.tokens_after, b.tokens_after);
                prop_assert_eq!(b.tokens_before, Some(request_tokens(&input, options.tools_tokens)));
                if let Some(before) = a.tokens_before {
                    prop_assert_eq!(Some(before), b.tokens_before);
                }
                prop_assert!(a.tokens_before_at_least <= b.tokens_before.unwrap_or(u64::MAX));
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            _ => prop_assert!(false, "lazy {lazy:?} and indexed {indexed:?} disagree"),
        }
        let trimmed = match lazy {
            Ok(trimmed) => trimmed,
            Err(TrimError::FixedTooLarge { required, max_tokens }) => {
                prop_assert!(required > u64::from(max_tokens));
                let fixed: u64 = input.iter().enumerate()
                    .filter(|(i, m)| m.is_pinned() || (*i == 0 && options.keep_system && m.role.is_system_like()))
                    .map(|(_, m)| u64::from(COUNTER.count_message(m))).sum();
                prop_assert!(required >= fixed + 3);
                return Ok(());
            }
            Err(other) => { prop_assert!(false, "unexpected error {other}"); unreachable!() }
        };
        let out = &trimmed.messages;
        prop_assert_eq!(validate(out, options.rules), vec![]);
        let tokens = request_tokens(out, options.tools_tokens);
        prop_assert_eq!(tokens, trimmed.tokens_after);
        prop_assert!(tokens <= u64::from(options.max_tokens));
        // Pinned messages and the system prompt are never dropped.
        for index in trimmed.dropped_indices() {
            prop_assert!(!input[index].is_pinned(), "pinned {index} dropped");
            prop_assert!(!(index == 0 && options.keep_system && input[0].role.is_system_like()));
        }
        if options.keep_system && input.first().is_some_and(|m| m.role.is_system_like()) {
            prop_assert_eq!(&out[0], &input[0]);
        }
        if options.rules == Rules::OpenAi {
            for message in input.iter().filter(|m| m.is_pinned()) {
                prop_assert!(out.contains(message));
            }
            let expected = input.len() - trimmed.dropped_count() + usize::from(trimmed.marker.is_some());
            prop_assert_eq!(out.len(), expected);
        }
        // A trimmed history is left alone by the next call with the same options
        // (hysteresis keeps the prefix stable).
        if trimmed.over_budget && trimmed.repairs.is_empty() && trimmed.partial.is_none() && trimmed.marker.is_none() {
            let again = trim(out, &options, &COUNTER).expect("a fitted history fits again");
            prop_assert!(!again.over_budget);
            prop_assert_eq!(&again.messages, out);
        }
    }

    #[test]
    fn strategy_last_is_maximal(
        messages in history(),
        max_tokens in 30u32..5000,
        tools_tokens in 0u32..40,
    ) {
        let options = TrimOptions { tools_tokens, ..TrimOptions::new(max_tokens) };
        let Ok(trimmed) = trim(&messages, &options, &COUNTER) else { return Ok(()) };
        prop_assert!(trimmed.repairs.is_empty());
        let Some(last_dropped) = trimmed.dropped.last().map(|range| range.end - 1) else { return Ok(()) };
        // The newest dropped unit is the next older one: adding it would go over budget.
        let unit = units(&messages).into_iter().find(|u| u.messages().contains(&last_dropped)).unwrap();
        let unit_cost: u64 = messages[unit.messages()].iter().map(|m| u64::from(COUNTER.count_message(m))).sum();
        prop_assert!(trimmed.tokens_after + unit_cost > u64::from(max_tokens));
        // And everything after it is kept.
        prop_assert!(trimmed.dropped.last().unwrap().end <= messages.len());
        let kept_after = messages.len() - trimmed.dropped.last().unwrap().end;
        prop_assert!(trimmed.messages.len() >= kept_after);
    }

    #[test]
    fn truncating_keeps_shape_and_cuts_every_result_to_its_limit(
        messages in history(),
        max_tokens in 48u32..400,
        provider in provider(),
    ) {
        let Some(input) = valid_input(messages, provider) else { return Ok(()) };
        let policy = TruncatePolicy { max_tokens };
        let truncated = truncate_tool_results(&input, &policy, &COUNTER);
        let out = &truncated.messages;
        prop_assert_eq!(out.len(), input.len());
        prop_assert_eq!(validate(out, provider), vec![]);
        let mut changed = 0;
        for (before, after) in input.iter().zip(out) {
            prop_assert_eq!(before.role, after.role);
            prop_assert_eq!(&before.tool_call_id, &after.tool_call_id);
            if before.role == Role::Tool && before.text() != after.text() {
                changed += 1;
                prop_assert!(COUNTER.count_text(&after.text()) <= max_tokens);
            } else {
                prop_assert_eq!(before, after);
            }
            if after.role == Role::Tool && matches!(after.content, Some(Content::Text(_)) | None) {
                prop_assert!(COUNTER.count_text(&after.text()) <= max_tokens);
            }
        }
        prop_assert_eq!(changed, truncated.truncated.len());
    }

    #[test]
    fn clearing_keeps_shape_and_recent_results(
        messages in history(),
        keep in 0usize..4,
        at_least in prop::option::of(0u64..3000),
        clear_arguments in any::<bool>(),
        exclude_search in any::<bool>(),
        provider in provider(),
    ) {
        let Some(input) = valid_input(messages, provider) else { return Ok(()) };
        let options = ClearOptions {
            trigger: ClearTrigger::Always,
            keep_tool_uses: keep,
            clear_at_least: at_least,
            exclude_tools: if exclude_search { vec!["search".into()] } else { vec![] },
            clear_arguments: clear_arguments.into(),
            tools_tokens: 0,
        };
        let cleared = clear_tool_results(&input, &options, &COUNTER);
        let out = &cleared.messages;
        prop_assert_eq!(out.len(), input.len());
        prop_assert_eq!(validate(out, provider), vec![]);
        prop_assert_eq!(
            request_tokens(out, 0) + cleared.tokens_cleared,
            request_tokens(&input, 0)
        );
        prop_assert_eq!(cleared.cleared.iter().map(|c| c.tokens).sum::<u64>(), cleared.tokens_cleared);
        for (before, after) in input.iter().zip(out) {
            if before.is_pinned() { prop_assert_eq!(before, after); }
            prop_assert_eq!(before.role, after.role);
            prop_assert_eq!(&before.tool_call_id, &after.tool_call_id);
        }
        for result in &cleared.cleared {
            let held = u64::from(COUNTER.count_message(&input[result.index]));
            prop_assert_eq!(
                out[result.index].text(),
                cleared_placeholder(&result.tool, &result.tool_call_id, held)
            );
            prop_assert!(!(exclude_search && *result.tool == *"search"));
        }
        // The `keep` most recent calls keep their results.
        let recent: Vec<&str> = input.iter().rev().flat_map(|m| m.tool_calls.iter().rev()).take(keep).map(|c| &*c.id).collect();
        for result in &cleared.cleared {
            prop_assert!(!recent.contains(&&*result.tool_call_id));
        }
        // Oldest first, stopping once enough was cleared.
        if let Some(enough) = at_least {
            let before_last: u64 = cleared.cleared.iter().rev().skip(1).map(|c| c.tokens).sum();
            prop_assert!(cleared.cleared.is_empty() || before_last < enough);
        }
    }
}
