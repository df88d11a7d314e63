//! A message as the inspector shows it: its role, its text, and whatever else it carries
//! (tool calls, non-text parts) as JSON, every piece shown as text.

use contexture_core::message::{Content, Message, Part};
use serde::Serialize;

/// One message, ready to be shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageView {
    /// Its position (from 0) in the list it belongs to.
    pub index: usize,
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// The participant's name, when it has one.
    pub name: Option<String>,
    /// Its text (the text parts joined by newlines).
    pub text: String,
    /// Its parts that are not text (images, reasoning, parts of other kinds), as JSON.
    pub other_parts: Option<String>,
    /// The tool calls of an assistant turn, as JSON.
    pub tool_calls: Option<String>,
    /// For a tool result: the call it answers.
    pub tool_call_id: Option<String>,
    /// Whether it is pinned (kept by every fit).
    pub pinned: bool,
    /// Its tags (`summary` for a compaction's summary, `notes` for notes it kept).
    pub tags: Vec<String>,
    /// Whether the previous call of its step did not send it.
    pub entered: bool,
}

impl MessageView {
    /// The view of `message`, at `index` in its list.
    pub fn of(index: usize, message: &Message) -> MessageView {
        let other_parts = match &message.content {
            Some(Content::Parts(parts)) => {
                let others: Vec<&Part> = parts
                    .iter()
                    .filter(|part| !matches!(part, Part::Text { .. }))
                    .collect();
                (!others.is_empty()).then(|| pretty(&others))
            }
            _ => None,
        };
        MessageView {
            index,
            role: message.role.as_str(),
            name: message.name.clone(),
            text: message
                .content
                .as_ref()
                .map(Content::text)
                .unwrap_or_default(),
            other_parts,
            tool_calls: (!message.tool_calls.is_empty()).then(|| pretty(&message.tool_calls)),
            tool_call_id: message.tool_call_id.as_deref().map(str::to_owned),
            pinned: message.metadata.pinned,
            tags: message.metadata.tags.clone(),
            entered: false,
        }
    }
}

fn pretty<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}
