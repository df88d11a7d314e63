//! Clearing old tool results: the results of older tool uses are replaced
//! by a short placeholder naming the tool, keeping the conversation's shape (every call
//! keeps a result, so the output is as valid as the input) while freeing their tokens.

use serde::Serialize;

use crate::message::{Message, Role};
use crate::tokens::TokenCounter;

/// When clearing starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ClearTrigger {
    /// Always clear.
    Always,
    /// Clear when the request (messages, reply priming and tool schemas) is over this many
    /// tokens. Counts every message.
    Tokens(u64),
    /// Clear when the history holds more than this many tool uses (calls). Counts nothing.
    ToolUses(usize),
}

/// How to clear old tool results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearOptions {
    /// When to clear.
    pub trigger: ClearTrigger,
    /// How many of the most recent tool uses keep their results.
    pub keep_tool_uses: usize,
    /// Stop once at least this many tokens were cleared (oldest results first); `None`
    /// clears every eligible result.
    pub clear_at_least: Option<u64>,
    /// Tools whose results are never cleared.
    pub exclude_tools: Vec<String>,
    /// Also replace the cleared calls' arguments with `{}`.
    pub clear_arguments: bool,
    /// Tokens of the tool schemas, for [`ClearTrigger::Tokens`].
    pub tools_tokens: u32,
}

impl Default for ClearOptions {
    /// Always clear, keep the 3 most recent tool uses, clear every older result, exclude
    /// nothing, keep arguments.
    fn default() -> Self {
        ClearOptions {
            trigger: ClearTrigger::Always,
            keep_tool_uses: 3,
            clear_at_least: None,
            exclude_tools: Vec::new(),
            clear_arguments: false,
            tools_tokens: 0,
        }
    }
}

/// One cleared result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClearedResult {
    /// The tool result's index.
    pub index: usize,
    /// The call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// Tokens saved (the result's, and the arguments' when those were cleared too).
    pub tokens: u64,
}

/// The history after clearing and what was cleared.
#[derive(Debug, Clone, PartialEq)]
pub struct Cleared {
    /// The messages, same count and order as the input.
    pub messages: Vec<Message>,
    /// True when the trigger fired.
    pub triggered: bool,
    /// The cleared results, oldest first.
    pub cleared: Vec<ClearedResult>,
    /// Tokens saved in total.
    pub tokens_cleared: u64,
}

/// The placeholder a cleared result of `tool` becomes.
pub fn cleared_placeholder(tool: &str) -> String {
    format!("[result of `{tool}` cleared to save context]")
}

/// One tool call and where its result is.
struct ToolUse {
    assistant: usize,
    call: usize,
    result: Option<usize>,
}

/// Clears old tool results of `messages` by `options`, counting with `counter`. A result is
/// cleared only when the placeholder is smaller than it; pinned results, results of pinned
/// turns, results of excluded tools and results already cleared are left alone.
pub fn clear_tool_results(
    messages: &[Message],
    options: &ClearOptions,
    counter: &TokenCounter,
) -> Cleared {
    let uses = tool_uses(messages);
    let triggered = match options.trigger {
        ClearTrigger::Always => true,
        ClearTrigger::ToolUses(limit) => uses.len() > limit,
        ClearTrigger::Tokens(limit) => {
            let tools = vec![];
            let count = counter.count_request(messages, &tools);
            u64::from(count.total) + u64::from(options.tools_tokens) > limit
        }
    };
    let mut out = messages.to_vec();
    let mut cleared = Vec::new();
    let mut tokens_cleared = 0u64;
    if triggered {
        let older = uses.len().saturating_sub(options.keep_tool_uses);
        for tool_use in &uses[..older] {
            if options
                .clear_at_least
                .is_some_and(|enough| tokens_cleared >= enough)
            {
                break;
            }
            let Some(result_index) = tool_use.result else {
                continue;
            };
            let call = &out[tool_use.assistant].tool_calls[tool_use.call];
            let (tool, id) = (call.name.clone(), call.id.clone());
            let placeholder = cleared_placeholder(&tool);
            let result = &out[result_index];
            if options.exclude_tools.contains(&tool)
                || result.is_pinned()
                || out[tool_use.assistant].is_pinned()
                || result.text() == placeholder
            {
                continue;
            }
            let before = u64::from(counter.count_message(result));
            let mut replacement = result.clone();
            replacement.set_text(placeholder);
            let after = u64::from(counter.count_message(&replacement));
            if after >= before {
                continue;
            }
            let mut saved = before - after;
            out[result_index] = replacement;
            if options.clear_arguments
                && out[tool_use.assistant].tool_calls[tool_use.call].arguments != "{}"
            {
                let assistant = &mut out[tool_use.assistant];
                let before = u64::from(counter.count_message(assistant));
                assistant.tool_calls[tool_use.call].arguments = "{}".to_owned();
                assistant.touch();
                saved += before.saturating_sub(u64::from(counter.count_message(assistant)));
            }
            tokens_cleared += saved;
            cleared.push(ClearedResult {
                index: result_index,
                tool_call_id: id,
                tool,
                tokens: saved,
            });
        }
    }
    Cleared {
        messages: out,
        triggered,
        cleared,
        tokens_cleared,
    }
}

/// Every tool call in order, with the index of its result in the tool results right after
/// its turn.
fn tool_uses(messages: &[Message]) -> Vec<ToolUse> {
    let mut uses = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if message.role != Role::Assistant {
            continue;
        }
        let results = messages[index + 1..]
            .iter()
            .take_while(|m| m.role == Role::Tool)
            .count();
        for (call, tool_call) in message.tool_calls.iter().enumerate() {
            let result = (index + 1..index + 1 + results)
                .find(|&r| messages[r].tool_call_id.as_deref() == Some(tool_call.id.as_str()));
            uses.push(ToolUse {
                assistant: index,
                call,
                result,
            });
        }
    }
    uses
}
