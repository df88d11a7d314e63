//! Property tests for fitting inside an agent loop: random loops (result sizes, parallel
//! calls, excluded tools, a shared history before the task) fitted call after call with
//! truncation, clearing and hysteresis and the loop's cut memory. Every request validates for
//! OpenAI's and Anthropic's rules, keeps the task, every call's result (cut or cleared, never
//! dropped), the `keep` most recent tool uses uncleared and excluded tools' results whole;
//! only the request's view changes: the loop's messages are never altered; and a call made
//! again with the same memory gives the same request.

use contexture_core::fit::{
    ClearInputs, ClearPolicy, CutMemory, Hysteresis, RequestParts, Rules, ShrinkPolicy,
    TruncatePolicy, is_cleared_placeholder, shrink, validate,
};
use contexture_core::{Encoding, Message, Role, TokenCounter, ToolCall};
use proptest::prelude::*;

const COUNTER: TokenCounter = TokenCounter::exact(Encoding::O200kBase);
const TOOLS: [&str; 3] = ["search", "fetch", "notes"];

/// One iteration of a loop: the tool uses of one assistant turn (tool, result lines).
type Iteration = Vec<(usize, usize)>;

fn iteration() -> impl Strategy<Value = Iteration> {
    prop::collection::vec(
        (
            0..TOOLS.len(),
            prop_oneof![3 => 1usize..20, 1 => 100usize..400],
        ),
        1..4,
    )
}

/// The loop's own messages after `iterations`: the task, then each assistant turn with its
/// results in order.
fn own(iterations: &[Iteration]) -> Vec<Message> {
    let mut own = vec![Message::user("Do the task with the tools.")];
    for (turn, uses) in iterations.iter().enumerate() {
        let calls: Vec<ToolCall> = uses
            .iter()
            .enumerate()
            .map(|(n, (tool, _))| ToolCall::new(format!("c{turn}_{n}"), TOOLS[*tool], "{}"))
            .collect();
        own.push(Message::assistant_tool_calls(calls));
        for (n, (tool, lines)) in uses.iter().enumerate() {
            let text: String = (0..*lines)
                .map(|line| format!("{} line {line} of turn {turn}\n", TOOLS[*tool]))
                .collect();
            own.push(Message::tool_result(format!("c{turn}_{n}"), text));
        }
    }
    own
}

fn history(turns: usize) -> Vec<Message> {
    (0..turns)
        .flat_map(|turn| {
            [
                Message::user(format!("earlier question {turn}: {}", "why ".repeat(30))),
                Message::assistant(format!("earlier answer {turn}: {}", "so ".repeat(30))),
            ]
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_call_of_a_random_loop_is_valid_and_loses_nothing(
        iterations in prop::collection::vec(iteration(), 1..25),
        earlier in 0usize..30,
        limit in 1_500u32..12_000,
        trigger_share in 0.3f64..0.9,
        // A token trigger, a tool-use trigger, or both.
        triggers in (any::<bool>(), prop::option::of(0usize..12))
            .prop_filter("one trigger at least", |(tokens, uses)| *tokens || uses.is_some()),
        keep in 0usize..4,
        at_least in prop::option::of(0u64..3_000),
        min_cleared in prop::option::of(1u64..4_000),
        exclude in prop::option::of(0..TOOLS.len()),
        clear_inputs in prop_oneof![
            any::<bool>().prop_map(ClearInputs::from),
            prop::sample::subsequence(TOOLS.to_vec(), 0..=TOOLS.len())
                .prop_map(|tools| ClearInputs::Tools(tools.into_iter().map(String::from).collect())),
        ],
        truncate in prop::option::of(100u32..2_000),
        marks in prop::option::of((0.5f64..1.0, 0.1f64..0.5)),
    ) {
        let clear = ClearPolicy {
            trigger_tokens: triggers.0.then_some((f64::from(limit) * trigger_share) as u64),
            trigger_tool_uses: triggers.1,
            min_cleared,
            keep,
            clear_at_least: at_least.filter(|n| *n > 0),
            exclude_tools: exclude.map(|t| vec![TOOLS[t].to_string()]).unwrap_or_default(),
            clear_inputs,
        };
        let truncate = truncate.map(|max_tokens| TruncatePolicy { max_tokens });
        let hysteresis = marks.map(|(high, low)| Hysteresis { high, low });
        let policy = ShrinkPolicy {
            truncate: truncate.as_ref(),
            clear: Some(&clear),
            hysteresis: hysteresis.as_ref(),
            history_oldest_first: true,
        };
        let system = Message::system("You are an agent.");
        let history = history(earlier);
        let mut memory = CutMemory::default();
        for calls in 0..=iterations.len() {
            let own = own(&iterations[..calls]);
            let log = own.clone();
            let request = RequestParts {
                system: Some(&system),
                history: &history,
                own: &own,
                limit,
                tools_tokens: 0,
            };
            let before = memory.clone();
            let shrunk = shrink(&request, &policy, &mut memory, &COUNTER);
            // The loop's messages are never changed: only the request's view is.
            prop_assert_eq!(&own, &log);
            // The same call with the same memory gives the same request.
            let again = shrink(&request, &policy, &mut before.clone(), &COUNTER);
            prop_assert_eq!(&again.messages, &shrunk.messages);
            let sent = &shrunk.messages;
            for rules in [Rules::OpenAi, Rules::Anthropic] {
                prop_assert_eq!(validate(sent, rules), vec![], "call {}", calls);
            }
            prop_assert_eq!(&sent[0], &system);
            // Every own message is there, in order: the task whole, every call answered.
            let own_sent = &sent[shrunk.own_from..];
            prop_assert_eq!(own_sent.len(), own.len());
            prop_assert_eq!(&own_sent[0], &own[0]);
            for (kept, original) in own_sent.iter().zip(&own) {
                prop_assert_eq!(kept.role, original.role);
                prop_assert_eq!(&kept.tool_call_id, &original.tool_call_id);
                prop_assert_eq!(kept.tool_calls.len(), original.tool_calls.len());
            }
            // The `keep` most recent tool uses are not cleared; excluded tools never are.
            let results: Vec<(&Message, &Message)> = own_sent
                .iter()
                .zip(&own)
                .filter(|(m, _)| m.role == Role::Tool)
                .collect();
            for (n, (kept, original)) in results.iter().enumerate() {
                let cleared = is_cleared_placeholder(&kept.text());
                // What an earlier call cleared stays cleared: the prefix does not change back.
                if original.tool_call_id.as_deref().is_some_and(|id| before.cleared.contains(id)) {
                    prop_assert!(cleared, "call {}: result {} was cleared before, not now", calls, n);
                }
                if n + keep >= results.len() {
                    prop_assert!(!cleared, "call {}: result {} is among the last {}", calls, n, keep);
                }
                let tool = own.iter().flat_map(|m| &m.tool_calls)
                    .find(|c| Some(&*c.id) == original.tool_call_id.as_deref())
                    .map(|c| &*c.name);
                if exclude.is_some_and(|t| Some(TOOLS[t]) == tool) {
                    prop_assert!(!cleared, "an excluded tool's result was cleared");
                }
                if let (false, Some(truncate)) = (cleared, &truncate) {
                    prop_assert!(COUNTER.count_text(&kept.text()) <= truncate.max_tokens);
                }
                if !cleared && truncate.is_none() {
                    prop_assert_eq!(kept, original);
                }
            }
            // History goes only from the front, whole turns.
            prop_assert!(shrunk.history_dropped <= history.len());
            prop_assert!(shrunk.history_dropped.is_multiple_of(2));
            prop_assert_eq!(&sent[1..shrunk.own_from], &history[shrunk.history_dropped..]);
        }
    }
}
