//! Properties of compaction planning and replacement: the cut never falls inside a tool-call
//! unit or between messages sharing a seq, the kept tail honours the keep limits (the last
//! unit always stays), and the replacement followed by the tail passes the provider rules
//! whenever the history did. Cases: `PROPTEST_CASES` (default 2,000).

use contexture_core::compact::{Keep, plan, replacement};
use contexture_core::fit::{Rules, repair, units, validate};
use contexture_core::thread::ProjectedMessage;
use contexture_core::tokens::{Encoding, TokenCounter};
use contexture_core::{Message, ToolCall};
use proptest::prelude::*;

/// One exchange of a generated history.
#[derive(Debug, Clone)]
enum Turn {
    User(usize),
    Assistant(usize),
    Tools { calls: usize, answered: bool },
    Pinned,
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        4 => (1..60usize).prop_map(Turn::User),
        4 => (1..60usize).prop_map(Turn::Assistant),
        2 => (1..4usize, prop::bool::weighted(0.9)).prop_map(|(calls, answered)| Turn::Tools { calls, answered }),
        1 => Just(Turn::Pinned),
    ]
}

fn build(turns: &[Turn], shared_seqs: bool) -> Vec<ProjectedMessage> {
    let mut messages = Vec::new();
    let mut call = 0;
    for (n, turn) in turns.iter().enumerate() {
        match turn {
            Turn::User(words) => messages.push(Message::user("word ".repeat(*words))),
            Turn::Assistant(words) => messages.push(Message::assistant("done ".repeat(*words))),
            Turn::Pinned => messages.push(Message::user(format!("pinned {n}")).pinned()),
            Turn::Tools { calls, answered } => {
                let ids: Vec<String> = (0..*calls)
                    .map(|_| {
                        call += 1;
                        format!("c{call}")
                    })
                    .collect();
                messages.push(Message::assistant_tool_calls(
                    ids.iter()
                        .map(|id| ToolCall::new(id.clone(), "t", "{}"))
                        .collect(),
                ));
                // An unanswered call can only be the last thing in a valid history.
                if *answered || n + 1 < turns.len() {
                    for id in &ids {
                        messages.push(Message::tool_result(id.clone(), "result ".repeat(10)));
                    }
                }
            }
        }
    }
    let mut seq = 0;
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            // Now and then two messages share a seq, as a merge's messages do.
            if !(shared_seqs && i % 5 == 4) {
                seq += 1;
            }
            ProjectedMessage {
                from_seq: seq.max(1),
                to_seq: seq.max(1),
                message,
            }
        })
        .collect()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn cuts_fall_between_units_and_the_result_stays_valid(
        turns in prop::collection::vec(turn(), 1..30),
        keep_tokens in prop::option::of(1..400u64),
        keep_messages in prop::option::of(1..12usize),
        shared_seqs in any::<bool>(),
    ) {
        let counter = TokenCounter::Exact { encoding: Encoding::O200kBase };
        let messages = build(&turns, shared_seqs);
        let plain: Vec<Message> = messages.iter().map(|m| m.message.clone()).collect();
        let keep = Keep { tokens: keep_tokens, messages: keep_messages };
        let Some(plan) = plan(&messages, &keep, &counter) else {
            return Ok(());
        };
        let end = plan.covered.end;
        prop_assert!(end > 0 && end < messages.len(), "the last unit always stays");
        // The cut is on a unit boundary.
        prop_assert!(units(&plain).iter().any(|unit| unit.start == end));
        // No seq is split between the covered part and the tail.
        prop_assert!(messages[end - 1].to_seq < messages[end].from_seq);
        prop_assert_eq!(plan.to_seq, messages[end - 1].to_seq);
        // Every covered message is summarized, kept verbatim, or is the request.
        let mut accounted: Vec<usize> = plan.to_summarize.iter().chain(&plan.verbatim).copied().collect();
        accounted.extend(plan.original_request);
        accounted.extend(plan.previous_summary);
        accounted.sort_unstable();
        prop_assert_eq!(accounted, (0..end).collect::<Vec<_>>());
        // Pinned messages are never summarized.
        prop_assert!(plan.to_summarize.iter().all(|&i| !plain[i].is_pinned()));
        // The replacement and the tail pass OpenAI's rules when the history did (no tool call
        // or result is cut from its partner); for providers that need alternating turns, the
        // replacement's user turns are merged with their neighbours by repair, as every
        // request is, and nothing is dropped.
        let mut after = replacement(&plan, &messages, Some("the summary"), Some("notes"));
        after.extend(plain[end..].iter().cloned());
        if validate(&plain, Rules::OpenAi).is_empty() {
            prop_assert_eq!(validate(&after, Rules::OpenAi), vec![]);
        }
        for provider in [Rules::OpenAi, Rules::Anthropic] {
            let (repaired, changes) = repair(after.clone(), provider);
            prop_assert_eq!(validate(&repaired, provider), vec![]);
            if validate(&plain, Rules::OpenAi).is_empty() {
                prop_assert!(changes.iter().all(|c| matches!(c, contexture_core::fit::RepairChange::MergedTurn { .. })),
                    "{:?}", changes);
            }
        }
        // Every pinned covered message is still there.
        let pinned_before = plain[..end].iter().filter(|m| m.is_pinned()).count();
        let pinned_after = after.iter().filter(|m| m.is_pinned() && m.text().starts_with("pinned")).count()
            - plain[end..].iter().filter(|m| m.is_pinned()).count();
        prop_assert_eq!(pinned_before, pinned_after);
    }
}
