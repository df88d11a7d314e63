//! Finding text in a thread's events: which messages hold a query, by seq.
//!
//! The messages searched are those the thread was given or made: appended messages, the
//! replacements of compactions and clears, merged forks' messages, and a workflow step's
//! own messages and loop compactions. A request record's messages are not searched (they
//! repeat the thread's own), nor is a reply (it is appended as a message too). A message's
//! text is its content and, for an assistant turn, its tool calls' names and arguments.

use serde::Serialize;

use super::{Event, EventKind};
use crate::Message;

/// The most characters of a hit's text a [`SearchHit`] quotes around the match.
pub const EXCERPT_CHARS: usize = 240;

/// One message that holds the query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchHit {
    /// The event's seq.
    pub seq: u64,
    /// The event's type (`message_appended`, `context_replaced`, ...).
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// The message's place among the event's messages (0 for most events).
    pub index: usize,
    /// The message's role.
    pub role: &'static str,
    /// Up to [`EXCERPT_CHARS`] characters of the message's text around the first match
    /// (`...` marks a cut).
    pub excerpt: String,
}

/// A query: text matched case-insensitively (Unicode lowercase) as a substring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchQuery {
    lowered: String,
}

impl SearchQuery {
    /// A query for `text`; `None` when it holds no character besides white space.
    pub fn new(text: &str) -> Option<SearchQuery> {
        (!text.trim().is_empty()).then(|| SearchQuery {
            lowered: text.to_lowercase(),
        })
    }

    /// The messages of `event` that hold the query, in order.
    pub fn hits(&self, event: &Event) -> Vec<SearchHit> {
        searched_messages(&event.kind)
            .into_iter()
            .enumerate()
            .filter_map(|(index, message)| {
                let text = searched_text(message);
                let excerpt = self.excerpt(&text)?;
                Some(SearchHit {
                    seq: event.seq,
                    event_type: event.kind.type_name(),
                    index,
                    role: message.role.as_str(),
                    excerpt,
                })
            })
            .collect()
    }

    /// The excerpt of `text` around the query's first match; `None` without a match.
    fn excerpt(&self, text: &str) -> Option<String> {
        // Lowercasing can change a character's length, so the match is found on the
        // lowered characters one by one, keeping their places in the original.
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let lowered: Vec<(usize, String)> = chars
            .iter()
            .map(|(at, c)| (*at, c.to_lowercase().collect()))
            .collect();
        let mut flat = String::new();
        let mut starts = Vec::with_capacity(lowered.len());
        for (index, (_, lower)) in lowered.iter().enumerate() {
            starts.push((flat.len(), index));
            flat.push_str(lower);
        }
        let found = flat.find(&self.lowered)?;
        let first = starts
            .iter()
            .rev()
            .find(|(start, _)| *start <= found)
            .map_or(0, |(_, index)| *index);
        let query_chars = self.lowered.chars().count();
        let room = EXCERPT_CHARS.saturating_sub(query_chars) / 2;
        let from = first.saturating_sub(room);
        let to = (from + EXCERPT_CHARS).min(chars.len());
        let from = to.saturating_sub(EXCERPT_CHARS).min(from);
        let mut excerpt = String::new();
        if from > 0 {
            excerpt.push_str("...");
        }
        excerpt.extend(chars[from..to].iter().map(|(_, c)| *c));
        if to < chars.len() {
            excerpt.push_str("...");
        }
        Some(excerpt)
    }
}

/// The messages of an event that a search reads.
fn searched_messages(kind: &EventKind) -> Vec<&Message> {
    match kind {
        EventKind::MessageAppended { message } => vec![message],
        EventKind::ContextReplaced(replace) => replace.replacement.iter().collect(),
        EventKind::Merged(merge) => merge.messages.iter().collect(),
        EventKind::StepMessage(step) => vec![&step.message],
        EventKind::StepCompacted(compaction) => compaction.replacement.iter().collect(),
        _ => Vec::new(),
    }
}

/// A message's searched text: its content, then its tool calls' names and arguments.
fn searched_text(message: &Message) -> String {
    let mut text = message.text();
    for call in &message.tool_calls {
        text.push('\n');
        text.push_str(&call.name);
        text.push(' ');
        text.push_str(&call.arguments);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolCall;

    fn event(seq: u64, message: Message) -> Event {
        Event::new(seq, EventKind::MessageAppended { message })
    }

    #[test]
    fn hits_name_the_event_and_quote_around_the_match() {
        let query = SearchQuery::new("paris").unwrap();
        let hits = query.hits(&event(3, Message::assistant("The capital is Paris.")));
        assert_eq!(
            hits,
            [SearchHit {
                seq: 3,
                event_type: "message_appended",
                index: 0,
                role: "assistant",
                excerpt: "The capital is Paris.".into(),
            }]
        );
        assert!(query.hits(&event(4, Message::user("Berlin"))).is_empty());
        let call =
            Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", r#"{"q": "Paris"}"#)]);
        assert_eq!(query.hits(&event(5, call)).len(), 1);
        assert_eq!(SearchQuery::new("  "), None);
    }

    #[test]
    fn a_long_text_is_quoted_around_its_match_whatever_its_letters() {
        let text = format!("{}ÉCOLE İstanbul{}", "a".repeat(500), "b".repeat(500));
        let query = SearchQuery::new("école i").unwrap();
        let hits = query.hits(&event(1, Message::user(text)));
        let excerpt = &hits[0].excerpt;
        assert!(
            excerpt.starts_with("...") && excerpt.ends_with("..."),
            "{excerpt}"
        );
        assert!(excerpt.contains("ÉCOLE İstanbul"), "{excerpt}");
        assert!(excerpt.chars().count() <= EXCERPT_CHARS + 6);
    }
}
