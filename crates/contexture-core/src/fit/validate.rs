//! Provider rules: what a message list must look like for a provider to
//! accept it, and [`validate`], which lists every place a list breaks them.
//!
//! The rules, per provider:
//!
//! | rule                                                        | OpenAI | Anthropic | Gemini |
//! |-------------------------------------------------------------|--------|-----------|--------|
//! | a system-like message only at index 0                       | yes    | yes       | yes    |
//! | every tool call answered before the next non-tool message   | yes    | yes       | yes    |
//! | no tool result without an open call of the preceding turn   | yes    | yes       | yes    |
//! | reasoning parts only inside assistant turns                 | yes    | yes       | yes    |
//! | the first non-system turn is a user turn                    | no     | yes       | yes    |
//! | no two user turns or two assistant turns in a row           | no     | yes       | yes    |
//!
//! Tool results count as the user side of the conversation: the Anthropic and Gemini wire
//! formats send the results of one assistant turn, and a user message right after them, in
//! one user turn, so `tool` followed by `user` is not a repeated turn. For Anthropic the
//! system prompt is lifted out of the list into its own field, which is why it must be
//! first.

use serde::Serialize;

use crate::message::{Content, Message, Part, Role};

/// A set of message rules a list must follow, named for the provider that enforces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rules {
    /// OpenAI chat completions (and the OpenAI-compatible servers).
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic messages.
    Anthropic,
    /// Google Gemini `generateContent`.
    Gemini,
}

/// A rule set name that is not one of `openai`, `anthropic`, `gemini`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown rules `{name}` (known rules: openai, anthropic, gemini)")]
pub struct UnknownRules {
    /// The name that was asked for.
    pub name: String,
}

impl Rules {
    /// Every provider.
    pub const ALL: [Rules; 3] = [Rules::OpenAi, Rules::Anthropic, Rules::Gemini];

    /// The provider's name: `openai`, `anthropic` or `gemini`.
    pub fn name(self) -> &'static str {
        match self {
            Rules::OpenAi => "openai",
            Rules::Anthropic => "anthropic",
            Rules::Gemini => "gemini",
        }
    }

    /// True when the provider requires user and assistant turns to alternate, starting with
    /// a user turn.
    pub fn requires_alternation(self) -> bool {
        matches!(self, Rules::Anthropic | Rules::Gemini)
    }
}

impl std::fmt::Display for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Rules {
    type Err = UnknownRules;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Rules::ALL
            .into_iter()
            .find(|provider| provider.name() == name)
            .ok_or_else(|| UnknownRules {
                name: name.to_owned(),
            })
    }
}

/// One broken rule, at one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The index of the offending message in the list that was validated.
    pub index: usize,
    /// Which rule is broken.
    pub kind: ViolationKind,
}

/// The rule a [`Violation`] breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ViolationKind {
    /// A system or developer message somewhere other than index 0.
    SystemNotFirst {
        /// The message's role.
        role: Role,
    },
    /// A tool result that answers no open call of the assistant turn right before it (its
    /// call was cut away, it answers a call twice, or it has no `tool_call_id`).
    OrphanToolResult {
        /// The id the result names, if any.
        tool_call_id: Option<String>,
    },
    /// An assistant tool call with no result before the next non-tool message (or the end
    /// of the list). The index is the assistant message's.
    UnansweredToolCall {
        /// The call's id.
        tool_call_id: String,
    },
    /// The first message after the system prompt is not a user message.
    FirstTurnNotUser {
        /// The role it has instead.
        role: Role,
    },
    /// A user message right after a user message, or an assistant message right after an
    /// assistant message.
    ConsecutiveSameRole {
        /// The repeated role.
        role: Role,
    },
    /// A reasoning part in a message that is not an assistant turn.
    ReasoningOutsideAssistant {
        /// The message's role.
        role: Role,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let index = self.index;
        match &self.kind {
            ViolationKind::SystemNotFirst { role } => {
                write!(
                    f,
                    "message {index}: {role} message after the start of the conversation"
                )
            }
            ViolationKind::OrphanToolResult {
                tool_call_id: Some(id),
            } => write!(
                f,
                "message {index}: tool result for `{id}` answers no open tool call"
            ),
            ViolationKind::OrphanToolResult { tool_call_id: None } => {
                write!(f, "message {index}: tool result without a tool_call_id")
            }
            ViolationKind::UnansweredToolCall { tool_call_id } => {
                write!(
                    f,
                    "message {index}: tool call `{tool_call_id}` has no result"
                )
            }
            ViolationKind::FirstTurnNotUser { role } => write!(
                f,
                "message {index}: the conversation must start with a user message, not {role}"
            ),
            ViolationKind::ConsecutiveSameRole { role } => {
                write!(f, "message {index}: two {role} turns in a row")
            }
            ViolationKind::ReasoningOutsideAssistant { role } => {
                write!(f, "message {index}: reasoning part in a {role} message")
            }
        }
    }
}

/// Every place `messages` breaks `provider`'s rules, in message order. An empty list means
/// the provider accepts the messages as far as these rules go.
pub fn validate(messages: &[Message], rules: Rules) -> Vec<Violation> {
    validate_refs(messages, rules)
}

/// [`validate`] over any sequence of message references (the fitting code validates its
/// output before it clones anything).
pub(crate) fn validate_refs<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    rules: Rules,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    // The open calls of the current assistant turn, and that turn's index.
    let mut open: Vec<&str> = Vec::new();
    let mut open_turn = 0;
    // True while tool results may follow (after an assistant turn with calls).
    let mut in_tool_block = false;
    let mut previous_turn: Option<Role> = None;

    let close = |open: &mut Vec<&str>, turn: usize, violations: &mut Vec<Violation>| {
        for id in open.drain(..) {
            violations.push(Violation {
                index: turn,
                kind: ViolationKind::UnansweredToolCall {
                    tool_call_id: id.to_owned(),
                },
            });
        }
    };

    for (index, message) in messages.into_iter().enumerate() {
        let role = message.role;
        if role != Role::Assistant && has_reasoning(message.content.as_ref()) {
            violations.push(Violation {
                index,
                kind: ViolationKind::ReasoningOutsideAssistant { role },
            });
        }
        if role == Role::Tool {
            let answered = in_tool_block
                && message.tool_call_id.as_deref().is_some_and(|id| {
                    open.iter()
                        .position(|open_id| *open_id == id)
                        .map(|position| open.remove(position))
                        .is_some()
                });
            if !answered {
                violations.push(Violation {
                    index,
                    kind: ViolationKind::OrphanToolResult {
                        tool_call_id: message.tool_call_id.as_deref().map(str::to_owned),
                    },
                });
            }
        } else {
            close(&mut open, open_turn, &mut violations);
            in_tool_block = false;
            if role.is_system_like() {
                if index > 0 {
                    violations.push(Violation {
                        index,
                        kind: ViolationKind::SystemNotFirst { role },
                    });
                }
                continue;
            }
            if role == Role::Assistant && !message.tool_calls.is_empty() {
                open.extend(message.tool_calls.iter().map(|call| &*call.id));
                open_turn = index;
                in_tool_block = true;
            }
        }
        if rules.requires_alternation() {
            match previous_turn {
                None if role != Role::User => violations.push(Violation {
                    index,
                    kind: ViolationKind::FirstTurnNotUser { role },
                }),
                Some(previous) if previous == role && role != Role::Tool => {
                    violations.push(Violation {
                        index,
                        kind: ViolationKind::ConsecutiveSameRole { role },
                    })
                }
                _ => {}
            }
        }
        previous_turn = Some(role);
    }
    close(&mut open, open_turn, &mut violations);
    violations.sort_by_key(|violation| violation.index);
    violations
}

/// True when `content` holds a reasoning part.
pub(crate) fn has_reasoning(content: Option<&Content>) -> bool {
    matches!(content, Some(Content::Parts(parts))
        if parts.iter().any(|part| matches!(part, Part::Reasoning { .. })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    fn kinds(messages: &[Message], rules: Rules) -> Vec<(usize, ViolationKind)> {
        validate(messages, rules)
            .into_iter()
            .map(|v| (v.index, v.kind))
            .collect()
    }

    #[test]
    fn parallel_calls_answered_in_any_order_are_valid() {
        let messages = vec![
            Message::system("s"),
            Message::user("u"),
            Message::assistant_tool_calls(vec![
                ToolCall::new("a", "search", "{}"),
                ToolCall::new("b", "fetch", "{}"),
            ]),
            Message::tool_result("b", "2"),
            Message::tool_result("a", "1"),
            Message::assistant("done"),
        ];
        for provider in Rules::ALL {
            assert_eq!(kinds(&messages, provider), vec![]);
        }
    }

    #[test]
    fn unanswered_and_orphan_results_are_reported_at_their_messages() {
        let messages = vec![
            Message::user("u"),
            Message::assistant_tool_calls(vec![
                ToolCall::new("a", "search", "{}"),
                ToolCall::new("b", "fetch", "{}"),
            ]),
            Message::tool_result("a", "1"),
            Message::tool_result("a", "again"),
            Message::user("next"),
            Message::tool_result("z", "late"),
        ];
        assert_eq!(
            kinds(&messages, Rules::OpenAi),
            vec![
                (
                    1,
                    ViolationKind::UnansweredToolCall {
                        tool_call_id: "b".into()
                    }
                ),
                (
                    3,
                    ViolationKind::OrphanToolResult {
                        tool_call_id: Some("a".into())
                    }
                ),
                (
                    5,
                    ViolationKind::OrphanToolResult {
                        tool_call_id: Some("z".into())
                    }
                ),
            ]
        );
    }

    #[test]
    fn alternation_rules_apply_only_where_required() {
        let messages = vec![
            Message::system("s"),
            Message::assistant("hello"),
            Message::user("a"),
            Message::user("b"),
            Message::system("late"),
        ];
        assert_eq!(
            kinds(&messages, Rules::OpenAi),
            vec![(4, ViolationKind::SystemNotFirst { role: Role::System })]
        );
        assert_eq!(
            kinds(&messages, Rules::Anthropic),
            vec![
                (
                    1,
                    ViolationKind::FirstTurnNotUser {
                        role: Role::Assistant
                    }
                ),
                (3, ViolationKind::ConsecutiveSameRole { role: Role::User }),
                (4, ViolationKind::SystemNotFirst { role: Role::System }),
            ]
        );
    }

    #[test]
    fn reasoning_outside_an_assistant_turn_is_reported() {
        let mut user = Message::user("");
        user.content = Some(Content::Parts(vec![Part::reasoning("r"), Part::text("t")]));
        assert_eq!(
            kinds(&[user], Rules::Gemini),
            vec![(
                0,
                ViolationKind::ReasoningOutsideAssistant { role: Role::User }
            )]
        );
    }

    #[test]
    fn violations_render_with_their_index() {
        let violation = Violation {
            index: 7,
            kind: ViolationKind::UnansweredToolCall {
                tool_call_id: "c1".into(),
            },
        };
        assert_eq!(
            violation.to_string(),
            "message 7: tool call `c1` has no result"
        );
        assert_eq!("gemini".parse::<Rules>(), Ok(Rules::Gemini));
        assert!(
            "bard"
                .parse::<Rules>()
                .unwrap_err()
                .to_string()
                .contains("bard")
        );
    }
}
