//! Units: the pieces a history is kept or dropped in.
//!
//! An assistant message with tool calls and the tool results right after it form one unit;
//! every other message is a unit of its own. Reasoning parts live inside the assistant
//! message, so they move with it. A unit holding a pinned message is pinned as a whole.
//!
//! [`IndexedHistory`] keeps a history together with its units and their token costs, built
//! incrementally as messages are appended, so that fitting it touches only the units it keeps.

use std::ops::Range;

use crate::message::{Message, Role};
use crate::tokens::TokenCounter;

/// A run of messages kept or dropped together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// Index of the unit's first message.
    pub start: usize,
    /// Index one past the unit's last message.
    pub end: usize,
    /// Role of the first message.
    pub first_role: Role,
    /// Role of the last message.
    pub last_role: Role,
    /// True when any message of the unit is pinned.
    pub pinned: bool,
    /// True while the unit's assistant turn has calls, so that tool results extend it.
    open: bool,
}

impl Unit {
    /// The unit's message indices.
    pub fn messages(&self) -> Range<usize> {
        self.start..self.end
    }

    /// How many messages the unit holds.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True for a unit without messages (never produced by the segmentation).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Builds units as messages arrive; shared by [`units`] and [`IndexedHistory`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Segmenter {
    pub(crate) units: Vec<Unit>,
    /// Indices of the pinned units, ascending.
    pub(crate) pinned: Vec<usize>,
    /// How many units at the start are system-like messages.
    pub(crate) system_units: usize,
}

impl Segmenter {
    /// Adds message `index`; returns true when it extended the last unit rather than
    /// starting a new one.
    pub(crate) fn push(&mut self, index: usize, message: &Message) -> bool {
        let pinned = message.is_pinned();
        if message.role == Role::Tool
            && let Some(last) = self.units.last_mut()
            && last.open
            && last.end == index
        {
            last.end += 1;
            last.last_role = Role::Tool;
            if pinned && !last.pinned {
                last.pinned = true;
                self.pinned.push(self.units.len() - 1);
            }
            return true;
        }
        if message.role.is_system_like() && self.system_units == self.units.len() {
            self.system_units += 1;
        }
        if pinned {
            self.pinned.push(self.units.len());
        }
        self.units.push(Unit {
            start: index,
            end: index + 1,
            first_role: message.role,
            last_role: message.role,
            pinned,
            open: message.role == Role::Assistant && !message.tool_calls.is_empty(),
        });
        false
    }
}

/// The units of `messages`, in order. Tokenizes nothing.
pub fn units(messages: &[Message]) -> Vec<Unit> {
    let mut segmenter = Segmenter::default();
    for (index, message) in messages.iter().enumerate() {
        segmenter.push(index, message);
    }
    segmenter.units
}

/// Where the last `limit` units of `messages` start: the index of the first message a view
/// limited to them keeps (0 when there are no more units than that, `messages.len()` for a
/// limit of 0). A limit counts whole units, so a view never starts with tool results cut from
/// the turn that called them.
pub fn last_units_start(messages: &[Message], limit: usize) -> usize {
    if limit == 0 {
        return messages.len();
    }
    let units = units(messages);
    units
        .len()
        .checked_sub(limit)
        .map_or(0, |first| units[first].start)
}

/// A history indexed for fitting: its messages, their units, each unit's token cost and the
/// prefix sums of those costs, the pinned units and the leading system units.
///
/// Appending a message costs one count of that message (cached inside it); fitting with
/// [`IndexedHistory::fit`] then reads only the units it keeps (plus the pinned and system
/// ones), never the whole history.
///
/// The index is append-only: a message's pin and content are read when it is pushed, so pin
/// a message before pushing it (or rebuild the index after changing pushed messages).
#[derive(Debug, Clone)]
pub struct IndexedHistory {
    counter: TokenCounter,
    messages: Vec<Message>,
    segmenter: Segmenter,
    /// `prefix[u]` is the cost of units `0..u`; one longer than the unit list.
    prefix: Vec<u64>,
}

impl IndexedHistory {
    /// An empty history counted with `counter`.
    pub fn new(counter: TokenCounter) -> IndexedHistory {
        IndexedHistory {
            counter,
            messages: Vec::new(),
            segmenter: Segmenter::default(),
            prefix: vec![0],
        }
    }

    /// Indexes `messages`, counting each (counts already cached in a message are reused).
    pub fn from_messages(messages: Vec<Message>, counter: TokenCounter) -> IndexedHistory {
        let mut history = IndexedHistory::new(counter);
        history.messages.reserve(messages.len());
        history.segmenter.units.reserve(messages.len());
        history.prefix.reserve(messages.len());
        for message in messages {
            history.push(message);
        }
        history
    }

    /// Appends a message, counting it once.
    pub fn push(&mut self, message: Message) {
        let cost = u64::from(self.counter.count_message(&message));
        let index = self.messages.len();
        let extended = self.segmenter.push(index, &message);
        self.messages.push(message);
        let total = self.prefix.last().copied().unwrap_or(0) + cost;
        if extended {
            if let Some(last) = self.prefix.last_mut() {
                *last = total;
            }
        } else {
            self.prefix.push(total);
        }
    }

    /// The messages, in order.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The units, in order.
    pub fn units(&self) -> &[Unit] {
        &self.segmenter.units
    }

    /// The counter the costs were taken with.
    pub fn counter(&self) -> &TokenCounter {
        &self.counter
    }

    /// The tokens of all messages together (without reply priming or tool schemas).
    pub fn message_tokens(&self) -> u64 {
        self.prefix.last().copied().unwrap_or(0)
    }

    /// The cost of unit `unit`.
    pub fn unit_tokens(&self, unit: usize) -> u64 {
        self.prefix[unit + 1] - self.prefix[unit]
    }

    /// Hands the messages back.
    pub fn into_messages(self) -> Vec<Message> {
        self.messages
    }

    pub(crate) fn segmenter(&self) -> &Segmenter {
        &self.segmenter
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    #[test]
    fn tool_results_join_their_call_and_pins_spread_to_the_unit() {
        let messages = vec![
            Message::system("s"),
            Message::user("u"),
            Message::assistant_tool_calls(vec![ToolCall::new("a", "t", "{}")]),
            Message::tool_result("a", "r").pinned(),
            Message::tool_result("x", "stray"),
            Message::assistant("done"),
            Message::tool_result("y", "orphan"),
        ];
        let shapes: Vec<_> = units(&messages)
            .iter()
            .map(|u| (u.start, u.end, u.pinned))
            .collect();
        assert_eq!(
            shapes,
            vec![
                (0, 1, false),
                (1, 2, false),
                (2, 5, true),
                (5, 6, false),
                (6, 7, false)
            ]
        );
        let history = IndexedHistory::from_messages(
            messages.clone(),
            TokenCounter::exact(Encoding::O200kBase),
        );
        assert_eq!(history.segmenter().pinned, vec![2]);
        assert_eq!(history.segmenter().system_units, 1);
        let counter = TokenCounter::exact(Encoding::O200kBase);
        let total: u64 = messages
            .iter()
            .map(|m| u64::from(counter.count_message(m)))
            .sum();
        assert_eq!(history.message_tokens(), total);
        assert_eq!(
            history.unit_tokens(2),
            (2..5)
                .map(|i| u64::from(counter.count_message(&messages[i])))
                .sum::<u64>()
        );
    }
}
