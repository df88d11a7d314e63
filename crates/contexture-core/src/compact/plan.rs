//! What a compaction covers: the older part of the projection, up to a kept tail of whole
//! units, never cutting between messages that share a seq (a merge brings several at once).

use std::ops::Range;

use super::{Keep, NOTES_TAG, ORIGINAL_REQUEST_TAG};
use crate::budget::SUMMARY_TAG;
use crate::fit::units;
use crate::message::{Message, Role};
use crate::thread::ProjectedMessage;
use crate::tokens::TokenCounter;

/// What a compaction will do with a projection's messages (indices into them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The messages the replacement stands for: always a prefix `0..end`.
    pub covered: Range<usize>,
    /// The first seq covered.
    pub from_seq: u64,
    /// The last seq covered: the replace is based on it, and every message after it (the
    /// kept tail) follows the replacement unchanged.
    pub to_seq: u64,
    /// The original user request, kept verbatim.
    pub original_request: Option<usize>,
    /// An earlier compaction's summary, which the new summary extends.
    pub previous_summary: Option<usize>,
    /// Covered messages kept verbatim: pinned ones (earlier notes among them).
    pub verbatim: Vec<usize>,
    /// Covered messages the summarizer reads.
    pub to_summarize: Vec<usize>,
}

/// Plans a compaction of `messages` (a projection, oldest first) keeping the tail `keep`
/// allows; `None` when there is nothing older than the kept tail worth summarizing.
pub fn plan(messages: &[ProjectedMessage], keep: &Keep, counter: &TokenCounter) -> Option<Plan> {
    let plain: Vec<Message> = messages.iter().map(|m| m.message.clone()).collect();
    let units = units(&plain);
    let mut end = plain.len();
    let (mut tokens, mut count) = (0u64, 0usize);
    for (position, unit) in units.iter().enumerate().rev() {
        let unit_tokens: u64 = plain[unit.messages()]
            .iter()
            .map(|m| u64::from(counter.count_message(m)))
            .sum();
        let last = position + 1 == units.len();
        let over = keep
            .tokens
            .is_some_and(|limit| tokens + unit_tokens > limit)
            || keep
                .messages
                .is_some_and(|limit| count + unit.len() > limit);
        if over && !last && !open_call(&plain[unit.messages()]) {
            break;
        }
        tokens += unit_tokens;
        count += unit.len();
        end = unit.start;
    }
    // Messages that share a seq are covered together or kept together: the cut moves back to
    // an earlier unit boundary until it falls between seqs.
    while end > 0 && end < messages.len() && messages[end - 1].to_seq >= messages[end].from_seq {
        end = units
            .iter()
            .map(|unit| unit.start)
            .filter(|&start| start < end)
            .max()
            .unwrap_or(0);
    }
    if end == 0 {
        return None;
    }
    let covered = 0..end;
    let compacted_before = plain.iter().any(|m| {
        m.metadata
            .tags
            .iter()
            .any(|t| t == SUMMARY_TAG || t == NOTES_TAG || t == ORIGINAL_REQUEST_TAG)
    });
    let original_request = covered
        .clone()
        .find(|&i| has_tag(&plain[i], ORIGINAL_REQUEST_TAG))
        .or_else(|| {
            (!compacted_before)
                .then(|| covered.clone().find(|&i| plain[i].role == Role::User))
                .flatten()
        });
    let previous_summary = covered
        .clone()
        .rev()
        .find(|&i| has_tag(&plain[i], SUMMARY_TAG));
    let mut verbatim = Vec::new();
    let mut to_summarize = Vec::new();
    for index in covered.clone() {
        if Some(index) == original_request || Some(index) == previous_summary {
            continue;
        }
        if plain[index].is_pinned() {
            verbatim.push(index);
        } else {
            to_summarize.push(index);
        }
    }
    if to_summarize.is_empty() {
        return None;
    }
    Some(Plan {
        from_seq: messages[0].from_seq,
        to_seq: messages[end - 1].to_seq,
        covered,
        original_request,
        previous_summary,
        verbatim,
        to_summarize,
    })
}

fn has_tag(message: &Message, tag: &str) -> bool {
    message.metadata.tags.iter().any(|t| t == tag)
}

/// True when the unit is an assistant turn with a call that has no result yet.
fn open_call(unit: &[Message]) -> bool {
    let Some(first) = unit.first() else {
        return false;
    };
    first.tool_calls.iter().any(|call| {
        !unit[1..]
            .iter()
            .any(|m| m.tool_call_id.as_deref() == Some(&*call.id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    fn projected(messages: Vec<Message>) -> Vec<ProjectedMessage> {
        messages
            .into_iter()
            .enumerate()
            .map(|(i, message)| ProjectedMessage {
                from_seq: i as u64 + 1,
                to_seq: i as u64 + 1,
                message,
            })
            .collect()
    }

    fn counter() -> TokenCounter {
        TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        }
    }

    #[test]
    fn the_tail_keeps_whole_units_and_the_original_request_is_found() {
        let messages = projected(vec![
            Message::user("Build the report for ACME."),
            Message::assistant("Working on it."),
            Message::user("Use Q3 numbers."),
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "fetch", "{}")]),
            Message::tool_result("c1", "Q3: 42"),
            Message::assistant("Done: 42."),
        ]);
        let keep = Keep {
            tokens: None,
            messages: Some(3),
        };
        let plan = plan(&messages, &keep, &counter()).unwrap();
        // The answer and the tool unit (call and result together) make 3 messages.
        assert_eq!(plan.covered, 0..3);
        assert_eq!((plan.from_seq, plan.to_seq), (1, 3));
        assert_eq!(plan.original_request, Some(0));
        assert_eq!(plan.to_summarize, vec![1, 2]);

        // With 2, the tool unit cannot be kept in part: only the answer stays.
        let keep = Keep {
            tokens: None,
            messages: Some(2),
        };
        let plan = super::plan(&messages, &keep, &counter()).unwrap();
        assert_eq!(
            plan.covered,
            0..5,
            "the call and its result are covered together"
        );
        assert_eq!(plan.to_summarize, vec![1, 2, 3, 4]);
    }

    #[test]
    fn an_open_call_and_the_last_unit_are_never_covered() {
        let messages = projected(vec![
            Message::user("go"),
            Message::assistant("a"),
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "slow", "{}")]),
        ]);
        let keep = Keep {
            tokens: Some(1),
            messages: None,
        };
        let plan = plan(&messages, &keep, &counter()).unwrap();
        assert_eq!(plan.covered, 0..2);
        let only = projected(vec![Message::user("just one")]);
        assert_eq!(super::plan(&only, &keep, &counter()), None);
    }

    #[test]
    fn messages_sharing_a_seq_are_not_split() {
        let mut messages = projected(vec![
            Message::user("u1"),
            Message::assistant("a1"),
            Message::user("merged 1"),
            Message::assistant("merged 2"),
        ]);
        messages[3].from_seq = 3;
        messages[3].to_seq = 3;
        let keep = Keep {
            tokens: None,
            messages: Some(1),
        };
        let plan = plan(&messages, &keep, &counter()).unwrap();
        assert_eq!(plan.covered, 0..2);
        assert_eq!(plan.to_seq, 2);
    }
}
