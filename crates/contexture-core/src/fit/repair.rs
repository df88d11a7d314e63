//! Repairing a message list so that a provider accepts it, without inventing
//! content.
//!
//! [`repair`] applies, in order:
//! 1. reasoning parts outside assistant turns are removed;
//! 2. system-like messages after index 0 are moved to the front and merged into one system
//!    prompt (their text is kept, in order);
//! 3. tool results that answer no open call are dropped; a call left without a result gets a
//!    synthetic result saying the call was cancelled (the only text repair ever writes, and
//!    it states a fact: no result exists);
//! 4. where alternation is required: leading non-user turns (an assistant turn with its tool
//!    results) are dropped, unless pinned; consecutive user turns, and consecutive assistant
//!    turns, are merged into one turn whose parts are the originals' parts in order.
//!
//! Every change is reported. What cannot be fixed this way (a pinned leading assistant turn)
//! is reported as [`RepairChange::Unrepaired`]; such a list still fails [`validate`].

use std::sync::Arc;

use serde::Serialize;
use serde_json::Map;

use super::validate::{Rules, Violation, has_reasoning, validate};
use crate::message::{Content, Message, Part, Role};

/// One change [`repair`] made. Indices are positions in the list given to [`repair`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum RepairChange {
    /// Reasoning parts were removed from a message that is not an assistant turn.
    RemovedReasoning {
        /// The message.
        index: usize,
    },
    /// A system-like message after the start was moved into the system prompt at the front.
    MovedSystem {
        /// The message that was moved.
        index: usize,
    },
    /// A tool result answering no open call was dropped.
    DroppedOrphanToolResult {
        /// The dropped result.
        index: usize,
        /// The call id it named, if any.
        tool_call_id: Option<String>,
    },
    /// A call without a result was answered with a synthetic "cancelled" result.
    AnsweredCancelledCall {
        /// The assistant message that made the call.
        index: usize,
        /// The call's id.
        tool_call_id: String,
        /// The tool's name.
        tool: String,
    },
    /// A turn before the first user turn was dropped (with its tool results).
    DroppedLeadingTurn {
        /// The dropped message.
        index: usize,
        /// Its role.
        role: Role,
    },
    /// A turn was merged into the turn before it, which has the same role.
    MergedTurn {
        /// The message merged into the previous one.
        index: usize,
        /// Their role.
        role: Role,
    },
    /// A violation repair cannot fix without inventing content or dropping a pinned
    /// message. The index refers to the repaired list.
    Unrepaired {
        /// The violation left in place.
        violation: Violation,
    },
}

/// The text of the synthetic result given to a call that has none.
pub fn cancelled_result_text(tool: &str) -> String {
    format!("[call to `{tool}` was cancelled; no result]")
}

/// Repairs `messages` for `provider` (see the module documentation for what is changed) and
/// reports each change.
pub fn repair(messages: Vec<Message>, rules: Rules) -> (Vec<Message>, Vec<RepairChange>) {
    let mut changes = Vec::new();
    let mut list: Vec<(usize, Message)> = messages.into_iter().enumerate().collect();

    for (index, message) in &mut list {
        if message.role != Role::Assistant && has_reasoning(message.content.as_ref()) {
            if let Some(Content::Parts(parts)) = &mut message.content {
                parts.retain(|part| !matches!(part, Part::Reasoning { .. }));
            }
            message.touch();
            changes.push(RepairChange::RemovedReasoning { index: *index });
        }
    }

    lift_system(&mut list, &mut changes);
    let list = pair_tool_results(list, &mut changes);
    let list = if rules.requires_alternation() {
        let list = drop_leading_turns(list, &mut changes);
        merge_turns(list, &mut changes)
    } else {
        list
    };

    let messages: Vec<Message> = list.into_iter().map(|(_, message)| message).collect();
    changes.extend(
        validate(&messages, rules)
            .into_iter()
            .map(|violation| RepairChange::Unrepaired { violation }),
    );
    (messages, changes)
}

fn lift_system(list: &mut Vec<(usize, Message)>, changes: &mut Vec<RepairChange>) {
    let late: Vec<usize> = list
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, (_, message))| message.role.is_system_like())
        .map(|(position, _)| position)
        .collect();
    if late.is_empty() {
        return;
    }
    let mut moved = Vec::with_capacity(late.len());
    for position in late.into_iter().rev() {
        moved.push(list.remove(position));
    }
    moved.reverse();
    let mut moved = moved.into_iter();
    if !list
        .first()
        .is_some_and(|(_, message)| message.role.is_system_like())
        && let Some(first) = moved.next()
    {
        changes.push(RepairChange::MovedSystem { index: first.0 });
        list.insert(0, first);
    }
    for (index, message) in moved {
        changes.push(RepairChange::MovedSystem { index });
        merge_into(&mut list[0].1, message);
    }
}

fn pair_tool_results(
    list: Vec<(usize, Message)>,
    changes: &mut Vec<RepairChange>,
) -> Vec<(usize, Message)> {
    let mut out = Vec::with_capacity(list.len());
    let mut items = list.into_iter().peekable();
    while let Some((index, message)) = items.next() {
        if message.role == Role::Tool {
            changes.push(RepairChange::DroppedOrphanToolResult {
                index,
                tool_call_id: message.tool_call_id.as_deref().map(str::to_owned),
            });
            continue;
        }
        let mut open: Vec<(Arc<str>, Arc<str>)> = message
            .tool_calls
            .iter()
            .map(|call| (call.id.clone(), call.name.clone()))
            .collect();
        let calls = !open.is_empty();
        let pinned = message.is_pinned();
        out.push((index, message));
        if !calls {
            continue;
        }
        while let Some((result_index, result)) = items.next_if(|(_, m)| m.role == Role::Tool) {
            let position = result
                .tool_call_id
                .as_deref()
                .and_then(|id| open.iter().position(|(open_id, _)| **open_id == *id));
            match position {
                Some(position) => {
                    open.remove(position);
                    out.push((result_index, result));
                }
                None => changes.push(RepairChange::DroppedOrphanToolResult {
                    index: result_index,
                    tool_call_id: result.tool_call_id.as_deref().map(str::to_owned),
                }),
            }
        }
        for (id, tool) in open {
            let mut result = Message::tool_result(id.clone(), cancelled_result_text(&tool));
            result.metadata.pinned = pinned;
            changes.push(RepairChange::AnsweredCancelledCall {
                index,
                tool_call_id: id.to_string(),
                tool: tool.to_string(),
            });
            out.push((index, result));
        }
    }
    out
}

fn drop_leading_turns(
    list: Vec<(usize, Message)>,
    changes: &mut Vec<RepairChange>,
) -> Vec<(usize, Message)> {
    let system = list
        .first()
        .is_some_and(|(_, message)| message.role.is_system_like()) as usize;
    let mut cut = system;
    while let Some((_, message)) = list.get(cut) {
        if message.role == Role::User {
            break;
        }
        // The turn and the tool results answering it move together.
        let mut end = cut + 1;
        while list.get(end).is_some_and(|(_, m)| m.role == Role::Tool) {
            end += 1;
        }
        if list[cut..end].iter().any(|(_, m)| m.is_pinned()) {
            break;
        }
        cut = end;
    }
    if cut == system {
        return list;
    }
    let mut out = Vec::with_capacity(list.len() - (cut - system));
    for (position, (index, message)) in list.into_iter().enumerate() {
        if position >= system && position < cut {
            changes.push(RepairChange::DroppedLeadingTurn {
                index,
                role: message.role,
            });
        } else {
            out.push((index, message));
        }
    }
    out
}

fn merge_turns(
    list: Vec<(usize, Message)>,
    changes: &mut Vec<RepairChange>,
) -> Vec<(usize, Message)> {
    let mut out: Vec<(usize, Message)> = Vec::with_capacity(list.len());
    for (index, message) in list {
        let same = out.last().is_some_and(|(_, previous)| {
            previous.role == message.role && matches!(message.role, Role::User | Role::Assistant)
        });
        if same && let Some((_, previous)) = out.last_mut() {
            changes.push(RepairChange::MergedTurn {
                index,
                role: message.role,
            });
            merge_into(previous, message);
        } else {
            out.push((index, message));
        }
    }
    out
}

/// Appends `next` to `into`: the bodies become one list of parts (so nothing is re-joined
/// or re-worded), tool calls are concatenated, and the merged turn is pinned if either was.
pub(crate) fn merge_into(into: &mut Message, next: Message) {
    let next = next.into_fields();
    into.content = match (into.content.take(), next.content) {
        (None, other) | (other, None) => other,
        (Some(first), Some(second)) => {
            let mut parts = into_parts(first);
            parts.extend(into_parts(second));
            Some(Content::Parts(parts))
        }
    };
    into.tool_calls.extend(next.tool_calls);
    into.metadata.pinned |= next.metadata.pinned;
    for tag in next.metadata.tags {
        if !into.metadata.tags.contains(&tag) {
            into.metadata.tags.push(tag);
        }
    }
    for (key, value) in next.extra {
        into.extra.entry(key).or_insert(value);
    }
    into.touch();
}

fn into_parts(content: Content) -> Vec<Part> {
    match content {
        Content::Text(text) if text.is_empty() => Vec::new(),
        Content::Text(text) => vec![Part::Text {
            text: text.to_string(),
            extra: Map::new(),
        }],
        Content::Parts(parts) => parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    #[test]
    fn unanswered_call_gets_a_cancelled_result_and_orphans_go() {
        let messages = vec![
            Message::user("u"),
            Message::tool_result("zz", "orphan"),
            Message::assistant_tool_calls(vec![
                ToolCall::new("a", "search", "{}"),
                ToolCall::new("b", "fetch", "{}"),
            ]),
            Message::tool_result("a", "1"),
            Message::user("next"),
        ];
        let (out, changes) = repair(messages, Rules::OpenAi);
        assert!(validate(&out, Rules::OpenAi).is_empty());
        assert_eq!(out.len(), 5);
        assert_eq!(out[3].tool_call_id.as_deref(), Some("b"));
        assert_eq!(out[3].text(), "[call to `fetch` was cancelled; no result]");
        assert_eq!(
            changes,
            vec![
                RepairChange::DroppedOrphanToolResult {
                    index: 1,
                    tool_call_id: Some("zz".into())
                },
                RepairChange::AnsweredCancelledCall {
                    index: 2,
                    tool_call_id: "b".into(),
                    tool: "fetch".into()
                },
            ]
        );
    }

    #[test]
    fn alternation_merges_and_drops_a_leading_assistant() {
        let messages = vec![
            Message::system("s"),
            Message::assistant("hi"),
            Message::user("a"),
            Message::user("b"),
            Message::assistant("c"),
            Message::system("late"),
        ];
        let (out, changes) = repair(messages, Rules::Anthropic);
        assert!(validate(&out, Rules::Anthropic).is_empty(), "{out:?}");
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].text(), "s\nlate");
        assert_eq!(out[1].text(), "a\nb");
        assert_eq!(
            changes,
            vec![
                RepairChange::MovedSystem { index: 5 },
                RepairChange::DroppedLeadingTurn {
                    index: 1,
                    role: Role::Assistant
                },
                RepairChange::MergedTurn {
                    index: 3,
                    role: Role::User
                },
            ]
        );
    }

    #[test]
    fn a_pinned_leading_assistant_is_reported_not_dropped() {
        let messages = vec![Message::assistant("pinned").pinned(), Message::user("u")];
        let (out, changes) = repair(messages, Rules::Gemini);
        assert_eq!(out.len(), 2);
        assert!(matches!(
            changes.as_slice(),
            [RepairChange::Unrepaired { .. }]
        ));
    }
}
