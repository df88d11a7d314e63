//! Truncating oversized tool results: a result past a number of tokens keeps its start and
//! its end, around a marker saying how many tokens were cut from the middle. The result
//! still answers its call, so the output is as valid as the input.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::message::{Content, Message, Role};
use crate::tokens::TokenCounter;

/// Tokens a truncation marker takes at most, whatever the number in it.
const MARKER_ROOM: u32 = 24;

/// How oversized tool results are cut (`truncate_tool_results:` of an assistant's context).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruncatePolicy {
    /// The most tokens a tool result's text keeps: two thirds from its start, one third
    /// from its end, the marker between.
    pub max_tokens: u32,
}

impl TruncatePolicy {
    /// What is wrong with the policy, as `(field, problem)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        if self.max_tokens < 2 * MARKER_ROOM {
            return vec![(
                "max_tokens",
                format!(
                    "must be at least {} (room for the start, the end and the marker), not {}",
                    2 * MARKER_ROOM,
                    self.max_tokens
                ),
            )];
        }
        Vec::new()
    }
}

/// One truncated result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruncatedResult {
    /// The call it answers.
    pub tool_call_id: Arc<str>,
    /// The tool's name, when the call that asked for it is in the messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Arc<str>>,
    /// The result's tokens before.
    pub tokens_before: u64,
    /// Its tokens after.
    pub tokens_after: u64,
}

/// The messages after truncation and what was truncated.
#[derive(Debug, Clone, PartialEq)]
pub struct Truncated {
    /// The messages, same count and order as the input.
    pub messages: Vec<Message>,
    /// The truncated results, in order.
    pub truncated: Vec<TruncatedResult>,
}

/// The marker between a truncated result's start and end.
fn marker(cut: u32) -> String {
    format!("\n[... {cut} tokens of this result cut; its start and end are kept ...]\n")
}

/// Cuts every tool result of `messages` whose text passes `policy.max_tokens` (counted
/// with `counter`) to its start and end around a marker. A result with parts other than
/// text (an image, say) is left whole: cutting it would lose what no marker can say.
pub fn truncate_tool_results(
    messages: &[Message],
    policy: &TruncatePolicy,
    counter: &TokenCounter,
) -> Truncated {
    let mut out = messages.to_vec();
    let mut truncated = Vec::new();
    for index in 0..out.len() {
        let message = &out[index];
        // A result whose whole message (counted once, then cached) is within the limit
        // needs no look at its text.
        if message.role != Role::Tool
            || counter.count_message(message) <= policy.max_tokens
            || !is_plain_text(message.content.as_ref())
        {
            continue;
        }
        // A plain text's count is its message's stored count less the rest of the message:
        // a long result is never tokenized whole, only around its start and end.
        let cut = match message.content.as_ref() {
            Some(Content::Text(text)) => {
                let encoding = counter.encoding();
                let exact = crate::tokens::message_tokens(message, encoding)
                    .saturating_sub(crate::tokens::message_overhead_tokens(message, encoding));
                cut_to_head_and_tail(
                    text,
                    counter.scale(exact),
                    policy.max_tokens,
                    counter,
                    marker,
                )
            }
            _ => keep_head_and_tail(&message.text(), policy.max_tokens, counter, marker),
        };
        let Some(cut) = cut else {
            continue;
        };
        let before = u64::from(counter.count_message(message));
        let id = message.tool_call_id.clone().unwrap_or_default();
        let tool = tool_of(&out[..index], &id);
        out[index].set_text(cut);
        truncated.push(TruncatedResult {
            tool_call_id: id,
            tool,
            tokens_before: before,
            tokens_after: u64::from(counter.count_message(&out[index])),
        });
    }
    Truncated {
        messages: out,
        truncated,
    }
}

/// True for a body of text only (a string, or text parts).
fn is_plain_text(content: Option<&Content>) -> bool {
    match content {
        None | Some(Content::Text(_)) => true,
        Some(Content::Parts(parts)) => parts
            .iter()
            .all(|part| matches!(part, crate::message::Part::Text { .. })),
    }
}

/// The name of the tool the call `id` asked for, from the newest assistant turn holding it.
fn tool_of(before: &[Message], id: &str) -> Option<Arc<str>> {
    before.iter().rev().find_map(|message| {
        message
            .tool_calls
            .iter()
            .find(|call| *call.id == *id)
            .map(|call| call.name.clone())
    })
}

/// `text` cut to at most `limit` tokens when it is longer: its start (two thirds of the
/// room) and its end (one third) around `marker(tokens cut)`. `None` when it fits.
pub fn keep_head_and_tail(
    text: &str,
    limit: u32,
    counter: &TokenCounter,
    marker: impl Fn(u32) -> String,
) -> Option<String> {
    cut_to_head_and_tail(text, counter.count_text(text), limit, counter, marker)
}

/// [`keep_head_and_tail`] for a text of `total` tokens under `counter`, known already.
fn cut_to_head_and_tail(
    text: &str,
    total: u32,
    limit: u32,
    counter: &TokenCounter,
    marker: impl Fn(u32) -> String,
) -> Option<String> {
    if total <= limit {
        return None;
    }
    let room = limit.saturating_sub(MARKER_ROOM);
    let head_room = room * 2 / 3;
    let tail_room = room - head_room;
    let head = longest_prefix(text, head_room, counter);
    let tail = longest_suffix(&text[head.len()..], tail_room, counter);
    let cut = total.saturating_sub(counter.count_text(head) + counter.count_text(tail));
    Some(format!("{head}{}{tail}", marker(cut)))
}

/// Every character boundary of `text`, its end included.
fn char_bounds(text: &str) -> Vec<usize> {
    text.char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect()
}

/// The bytes a search for at most `limit` tokens first looks within: a token is rarely
/// longer than this many bytes on average, and the window doubles until it holds more than
/// `limit` tokens (or the whole text), so the search stays exact.
const BYTES_PER_TOKEN_GUESS: usize = 16;

/// Which end of a text a search keeps.
#[derive(Clone, Copy)]
enum End {
    Start,
    Finish,
}

/// The part of `text` at its `end` a search for at most `limit` tokens there need look at:
/// the shortest window, doubling from a guess, that holds more than `limit` tokens, or all
/// of it. Long texts are then never tokenized whole.
fn window<'t>(text: &'t str, end: End, limit: u32, counter: &TokenCounter) -> &'t str {
    let mut size = (limit as usize + 1).saturating_mul(BYTES_PER_TOKEN_GUESS);
    while size < text.len() {
        let part = match end {
            End::Start => {
                let mut cut = size;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                &text[..cut]
            }
            End::Finish => {
                let mut cut = text.len() - size;
                while !text.is_char_boundary(cut) {
                    cut += 1;
                }
                &text[cut..]
            }
        };
        if counter.count_text(part) > limit {
            return part;
        }
        size = size.saturating_mul(2);
    }
    text
}

/// The longest prefix of `text` (on a character boundary) of at most `limit` tokens.
fn longest_prefix<'t>(text: &'t str, limit: u32, counter: &TokenCounter) -> &'t str {
    let text = window(text, End::Start, limit, counter);
    let bounds = char_bounds(text);
    let (mut low, mut high) = (0, bounds.len() - 1);
    while low < high {
        let mid = (low + high).div_ceil(2);
        if counter.count_text(&text[..bounds[mid]]) <= limit {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    &text[..bounds[low]]
}

/// The longest suffix of `text` (on a character boundary) of at most `limit` tokens.
fn longest_suffix<'t>(text: &'t str, limit: u32, counter: &TokenCounter) -> &'t str {
    let text = window(text, End::Finish, limit, counter);
    let bounds = char_bounds(text);
    let (mut low, mut high) = (0, bounds.len() - 1);
    while low < high {
        let mid = (low + high) / 2;
        if counter.count_text(&text[bounds[mid]..]) <= limit {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    &text[bounds[low]..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        }
    }

    #[test]
    fn an_oversized_result_keeps_its_start_and_end_and_says_what_was_cut() {
        let counter = counter();
        let long: String = (0..2_000).map(|i| format!("line {i}\n")).collect();
        let messages = vec![
            Message::user("go"),
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", "{}")]),
            Message::tool_result("c1", long.clone()),
            Message::tool_result("c2", "short"),
        ];
        let out = truncate_tool_results(&messages, &TruncatePolicy { max_tokens: 300 }, &counter);
        assert_eq!(out.messages.len(), 4);
        let text = out.messages[2].text();
        assert!(text.starts_with("line 0\nline 1\n"), "{text}");
        assert!(text.ends_with("line 1999\n"), "{text}");
        assert!(text.contains("tokens of this result cut"), "{text}");
        assert!(
            counter.count_text(&text) <= 300,
            "{}",
            counter.count_text(&text)
        );
        assert_eq!(out.messages[3], messages[3]);
        let [result] = out.truncated.as_slice() else {
            panic!("{:?}", out.truncated)
        };
        assert_eq!(&*result.tool_call_id, "c1");
        assert_eq!(result.tool.as_deref(), Some("search"));
        assert!(
            result.tokens_before > 8_000 && result.tokens_after <= 310,
            "{result:?}"
        );
        // Truncating again changes nothing.
        let again =
            truncate_tool_results(&out.messages, &TruncatePolicy { max_tokens: 300 }, &counter);
        assert!(again.truncated.is_empty());
    }

    #[test]
    fn a_policy_with_no_room_for_the_marker_is_refused() {
        assert_eq!(TruncatePolicy { max_tokens: 10 }.problems().len(), 1);
        assert!(TruncatePolicy { max_tokens: 48 }.problems().is_empty());
    }

    proptest::proptest! {
        /// The start and end kept, found in a window of the text, are within their room,
        /// and the whole text when it fits; a long text keeps close to its room (counts do
        /// not always grow with the text, so the cut may differ from a search over the
        /// whole text by a word).
        #[test]
        fn the_start_and_end_kept_fit_their_room(
            words in proptest::collection::vec("[a-z]{1,8}", 0..600),
            limit in 8u32..120,
        ) {
            let text = words.join(" ");
            let counter = counter();
            let fits = counter.count_text(&text) <= limit;
            for kept in [
                longest_prefix(&text, limit, &counter),
                longest_suffix(&text, limit, &counter),
            ] {
                let tokens = counter.count_text(kept);
                proptest::prop_assert!(tokens <= limit);
                proptest::prop_assert!(text.contains(kept));
                if fits {
                    proptest::prop_assert_eq!(kept, text.as_str());
                } else {
                    proptest::prop_assert!(tokens + 8 >= limit, "{tokens} of {limit}");
                }
            }
        }
    }
}
