//! The message view of a thread: the last replace in effect plus the messages
//! appended after the seq it was based on, with the system prompt kept apart.

use serde::Serialize;

use crate::fit::units::last_units_start;
use crate::message::Message;
use crate::thread::Thread;

/// A message of the projection with the seqs it stands for: its own event's seq, or, for a
/// message of a replacement, the range the replace covered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProjectedMessage {
    /// The first seq it stands for.
    pub from_seq: u64,
    /// The last seq it stands for.
    pub to_seq: u64,
    /// The message.
    pub message: Message,
}

/// What a model call on a thread sees: the system prompt and the conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Projection {
    /// The named context projected.
    pub context: String,
    /// The system prompt in effect, if any. Never also present in `messages`.
    pub system: Option<Message>,
    /// The conversation, oldest first; never contains a system or developer message.
    pub messages: Vec<Message>,
}

impl Projection {
    /// The messages to send: the system prompt first (when there is one), then the
    /// conversation.
    pub fn to_messages(&self) -> Vec<Message> {
        self.system
            .iter()
            .chain(self.messages.iter())
            .cloned()
            .collect()
    }

    /// A message list (a request's, a file's) as a projection of the default context: a
    /// leading system (or developer) message is the system prompt, the rest the
    /// conversation (the inverse of [`Projection::into_messages`]).
    pub fn from_messages(mut messages: Vec<Message>) -> Projection {
        let system = match messages.first() {
            Some(first) if first.role.is_system_like() => Some(messages.remove(0)),
            _ => None,
        };
        Projection {
            context: crate::thread::DEFAULT_CONTEXT.to_owned(),
            system,
            messages,
        }
    }

    /// Like [`Projection::to_messages`], consuming the projection.
    pub fn into_messages(self) -> Vec<Message> {
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        messages.extend(self.system);
        messages.extend(self.messages);
        messages
    }
}

impl Thread {
    /// The projection of the active context, unlimited.
    pub fn projection(&self) -> Projection {
        self.projection_of(&self.active, None)
    }

    /// The active context's conversation (no system prompt) with the seqs each message stands
    /// for: what compaction plans on.
    pub fn projected_messages(&self) -> Vec<ProjectedMessage> {
        let state = self.contexts.get(&self.active);
        let anchor = state.and_then(|s| s.anchor.as_ref());
        let base = anchor.map_or(0, |a| a.to_seq);
        let mut messages: Vec<ProjectedMessage> = anchor
            .into_iter()
            .flat_map(|anchor| {
                anchor.messages.iter().map(|message| ProjectedMessage {
                    from_seq: anchor.from_seq,
                    to_seq: anchor.to_seq,
                    message: message.clone(),
                })
            })
            .collect();
        messages.extend(
            self.messages_after(base)
                .iter()
                .map(|entry| ProjectedMessage {
                    from_seq: entry.seq,
                    to_seq: entry.seq,
                    message: entry.message.clone(),
                }),
        );
        messages
    }

    /// The projection of the named context `context`, keeping only the last `limit` units of
    /// the conversation when a limit is given (a message, or an assistant turn with its tool
    /// results counted as one; the system prompt is not counted).
    /// A context never replaced shows the whole conversation.
    pub fn projection_of(&self, context: &str, limit: Option<usize>) -> Projection {
        let state = self.contexts.get(context);
        let (base, replacement): (u64, &[Message]) = match state.and_then(|s| s.anchor.as_ref()) {
            Some(anchor) => (anchor.to_seq, &anchor.messages),
            None => (0, &[]),
        };
        let after = self.messages_after(base);
        let mut messages = Vec::with_capacity(replacement.len() + after.len());
        messages.extend(replacement.iter().cloned());
        messages.extend(after.iter().map(|e| e.message.clone()));
        if let Some(limit) = limit {
            // Whole units: an assistant turn keeps its tool results, and they it.
            messages.drain(..last_units_start(&messages, limit));
        }
        let own_system = state.and_then(|s| s.system.as_ref());
        let system = match (&self.system, own_system) {
            (Some(shared), Some(own)) => Some(if own.0 > shared.0 { own } else { shared }),
            (shared, own) => shared.as_ref().or(own),
        };
        Projection {
            context: context.to_string(),
            system: system.map(|(_, message)| message.clone()),
            messages,
        }
    }
}
