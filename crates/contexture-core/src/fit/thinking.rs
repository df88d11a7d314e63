//! Clearing old reasoning ("thinking"): the reasoning parts of all but the newest few
//! assistant turns that hold some are left out of a request, the turns themselves (their
//! text and tool calls) kept, so that the conversation's shape and its validity do not
//! change while the tokens of reasoning the model no longer needs are freed.

use serde::{Deserialize, Serialize};

use crate::message::{Content, Message, Part, Role};
use crate::tokens::TokenCounter;

/// How much of a history's reasoning a request keeps: the reasoning of the newest
/// `keep_turns` assistant turns that hold some; older turns lose theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingPolicy {
    /// How many of the newest assistant turns with reasoning keep it (0: none does).
    pub keep_turns: usize,
}

/// What clearing reasoning took out of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearedThinking {
    /// The assistant turns whose reasoning was left out.
    pub turns: usize,
    /// The tokens that freed.
    pub tokens: u64,
}

impl ClearedThinking {
    /// True when nothing was cleared.
    pub fn is_empty(&self) -> bool {
        self.turns == 0
    }
}

/// How many assistant turns of `messages` hold reasoning.
pub fn reasoning_turns(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|message| holds_reasoning(message))
        .count()
}

/// True when `message` is an assistant turn holding reasoning.
fn holds_reasoning(message: &Message) -> bool {
    message.role == Role::Assistant
        && matches!(&message.content, Some(Content::Parts(parts))
            if parts.iter().any(|part| matches!(part, Part::Reasoning { .. })))
}

/// Leaves the reasoning of all but the newest `policy.keep_turns` assistant turns holding
/// some out of `messages`, counting what that frees with `counter`. A turn that holds
/// nothing but reasoning (no text, no tool call) keeps it: taking it would leave an empty
/// turn, which providers refuse. Pinned turns keep theirs.
pub fn clear_thinking(
    messages: &mut [Message],
    policy: ThinkingPolicy,
    counter: &TokenCounter,
) -> ClearedThinking {
    let with_reasoning: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, message)| holds_reasoning(message))
        .map(|(index, _)| index)
        .collect();
    let older = with_reasoning.len().saturating_sub(policy.keep_turns);
    let mut cleared = ClearedThinking::default();
    for &index in &with_reasoning[..older] {
        let message = &messages[index];
        if message.is_pinned() {
            continue;
        }
        let Some(Content::Parts(parts)) = &message.content else {
            continue;
        };
        let kept: Vec<Part> = parts
            .iter()
            .filter(|part| !matches!(part, Part::Reasoning { .. }))
            .cloned()
            .collect();
        if kept.is_empty() && message.tool_calls.is_empty() {
            continue;
        }
        let before = u64::from(counter.count_message(message));
        let mut turn = message.clone();
        turn.content = if kept.is_empty() {
            None
        } else {
            Some(Content::Parts(kept))
        };
        turn.touch();
        let after = u64::from(counter.count_message(&turn));
        messages[index] = turn;
        cleared.turns += 1;
        cleared.tokens += before.saturating_sub(after);
    }
    cleared
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    fn thinking_turn(thought: &str, text: &str) -> Message {
        let mut message = Message::assistant("");
        message.content = Some(Content::Parts(vec![
            Part::Reasoning {
                text: thought.into(),
                signature: Some(format!("sig-{thought}")),
                redacted: None,
                extra: Default::default(),
            },
            Part::text(text),
        ]));
        message
    }

    fn reasoning_of(message: &Message) -> Vec<String> {
        match &message.content {
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|part| match part {
                    Part::Reasoning { text, .. } => Some(text.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn keeps_the_newest_turns_reasoning_and_every_turns_text() {
        let counter = TokenCounter::exact(Encoding::Cl100kBase);
        let mut messages = vec![
            Message::user("q1"),
            thinking_turn("first thought, long enough to count", "a1"),
            Message::user("q2"),
            thinking_turn("second thought", "a2"),
            Message::user("q3"),
            thinking_turn("third thought", "a3"),
            Message::user("q4"),
        ];
        let cleared = clear_thinking(&mut messages, ThinkingPolicy { keep_turns: 1 }, &counter);
        assert_eq!(cleared.turns, 2);
        assert!(cleared.tokens > 0);
        assert_eq!(reasoning_of(&messages[1]), Vec::<String>::new());
        assert_eq!(reasoning_of(&messages[3]), Vec::<String>::new());
        assert_eq!(reasoning_of(&messages[5]), vec!["third thought".to_owned()]);
        for (index, text) in [(1, "a1"), (3, "a2"), (5, "a3")] {
            assert_eq!(messages[index].text(), text);
        }
    }

    #[test]
    fn a_turn_of_reasoning_and_tool_calls_keeps_its_calls() {
        let counter = TokenCounter::exact(Encoding::Cl100kBase);
        let mut turn = Message::assistant_tool_calls(vec![ToolCall {
            id: "c1".into(),
            name: "search".into(),
            arguments: "{}".into(),
            extra: Default::default(),
        }]);
        turn.content = Some(Content::Parts(vec![Part::reasoning("why search")]));
        let mut messages = vec![
            Message::user("q"),
            turn,
            Message::tool_result("c1", "found"),
            thinking_turn("then", "done"),
        ];
        let cleared = clear_thinking(&mut messages, ThinkingPolicy { keep_turns: 1 }, &counter);
        assert_eq!(cleared.turns, 1);
        assert_eq!(messages[1].content, None);
        assert_eq!(messages[1].tool_calls.len(), 1);
    }

    #[test]
    fn keeps_everything_when_there_are_no_more_turns_than_kept_and_spares_pinned_and_bare_ones() {
        let counter = TokenCounter::exact(Encoding::Cl100kBase);
        let mut bare = Message::assistant("");
        bare.content = Some(Content::Parts(vec![Part::reasoning("only thought")]));
        let original = vec![
            Message::user("q"),
            thinking_turn("pinned thought", "a").pinned(),
            Message::user("q"),
            bare,
            Message::user("q"),
            thinking_turn("newest", "b"),
        ];
        let mut messages = original.clone();
        let cleared = clear_thinking(&mut messages, ThinkingPolicy { keep_turns: 3 }, &counter);
        assert_eq!(
            (cleared, &messages),
            (ClearedThinking::default(), &original)
        );
        let cleared = clear_thinking(&mut messages, ThinkingPolicy { keep_turns: 0 }, &counter);
        assert_eq!(cleared.turns, 1);
        assert_eq!(messages[..5], original[..5]);
        assert_eq!(reasoning_of(&messages[5]), Vec::<String>::new());
    }
}
