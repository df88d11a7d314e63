//! Clearing old tool results: the results of older tool uses are replaced
//! by a short placeholder naming the tool, the call and the tokens it held, keeping the conversation's shape (every call
//! keeps a result, so the output is as valid as the input) while freeing their tokens.

use rustc_hash::{FxHashMap, FxHashSet};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::message::{Content, Message, Role};
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
    /// Stop once at least this many tokens were cleared (oldest results first) and, under
    /// [`ClearTrigger::Tokens`], the request is back under the trigger; `None` clears
    /// every eligible result.
    pub clear_at_least: Option<u64>,
    /// Tools whose results are never cleared.
    pub exclude_tools: Vec<String>,
    /// Also replace the cleared calls' arguments with `{}` (every tool's, or the listed
    /// tools').
    pub clear_arguments: ClearInputs,
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
            clear_arguments: ClearInputs::default(),
            tools_tokens: 0,
        }
    }
}

/// Whose cleared calls also lose their inputs (arguments): `true` every tool's, `false`
/// none (the default), or a list of the tools whose inputs go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClearInputs {
    /// Every cleared call's inputs (`true`), or none (`false`).
    All(bool),
    /// The inputs of the cleared calls of these tools.
    Tools(Vec<String>),
}

impl Default for ClearInputs {
    fn default() -> Self {
        ClearInputs::All(false)
    }
}

impl From<bool> for ClearInputs {
    fn from(all: bool) -> Self {
        ClearInputs::All(all)
    }
}

impl ClearInputs {
    /// True when a cleared call of `tool` loses its inputs.
    pub fn of(&self, tool: &str) -> bool {
        match self {
            ClearInputs::All(all) => *all,
            ClearInputs::Tools(tools) => tools.iter().any(|listed| listed == tool),
        }
    }

    /// True when no call loses its inputs.
    pub fn is_none(&self) -> bool {
        match self {
            ClearInputs::All(all) => !*all,
            ClearInputs::Tools(tools) => tools.is_empty(),
        }
    }
}

/// When and how a request's old tool results are cleared (`clear_tool_results:` of an
/// assistant's context, or of a chat thread's policy). Clearing starts once the request
/// passes `trigger_tokens` or its history holds more than `trigger_tool_uses` tool uses
/// (whichever is set; with both, whichever is passed first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearPolicy {
    /// Clear once the request (messages and tool schemas) is over this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_tokens: Option<u64>,
    /// Clear once the request holds more than this many tool uses (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_tool_uses: Option<usize>,
    /// How many of the most recent tool uses keep their results (default 3).
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// Each time, clear at least this many tokens, oldest results first, and go on until
    /// the request is back under the token trigger (default: clear every older result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear_at_least: Option<u64>,
    /// Clear only when that frees at least this many tokens; a clearing that would free
    /// less is not made (it would cost the provider's prompt cache for little). Default:
    /// whatever it frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cleared: Option<u64>,
    /// Tools whose results are never cleared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_tools: Vec<String>,
    /// Also replace the cleared calls' inputs (their arguments) with `{}`: `true` for every
    /// tool, or a list of tools.
    #[serde(default, skip_serializing_if = "ClearInputs::is_none")]
    pub clear_inputs: ClearInputs,
}

fn default_keep() -> usize {
    3
}

impl ClearPolicy {
    /// Clearing once a request passes `tokens`, with the default settings otherwise (keep
    /// the 3 newest tool uses, clear every older result, no tool excluded, inputs kept).
    pub fn past_tokens(tokens: u64) -> ClearPolicy {
        ClearPolicy {
            trigger_tokens: Some(tokens),
            trigger_tool_uses: None,
            keep: default_keep(),
            clear_at_least: None,
            min_cleared: None,
            exclude_tools: Vec::new(),
            clear_inputs: ClearInputs::default(),
        }
    }

    /// The clearing options of a request whose tool schemas take `tools_tokens`.
    pub fn options(&self, tools_tokens: u32) -> ClearOptions {
        let trigger = match (self.trigger_tokens, self.trigger_tool_uses) {
            (_, Some(uses)) if self.trigger_tokens.is_none() => ClearTrigger::ToolUses(uses),
            (Some(tokens), _) => ClearTrigger::Tokens(tokens),
            (None, _) => ClearTrigger::Always,
        };
        ClearOptions {
            trigger,
            keep_tool_uses: self.keep,
            clear_at_least: self.clear_at_least,
            exclude_tools: self.exclude_tools.clone(),
            clear_arguments: self.clear_inputs.clone(),
            tools_tokens,
        }
    }

    /// True when a request of `tokens` tokens holding `tool_uses` tool uses passes a
    /// trigger.
    pub fn fires(&self, tokens: u64, tool_uses: usize) -> bool {
        self.trigger_tokens.is_some_and(|limit| tokens > limit)
            || self
                .trigger_tool_uses
                .is_some_and(|limit| tool_uses > limit)
    }

    /// The token trigger, or no limit when clearing is set off by tool uses alone.
    pub fn token_trigger(&self) -> u64 {
        self.trigger_tokens.unwrap_or(u64::MAX)
    }

    /// What is wrong with the policy, as `(field, problem)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.trigger_tokens == Some(0) {
            problems.push((
                "trigger_tokens",
                "must be at least 1 (the request's tokens past which results are cleared)".into(),
            ));
        }
        if self.trigger_tokens.is_none() && self.trigger_tool_uses.is_none() {
            problems.push((
                "trigger_tokens",
                "set trigger_tokens (the request's tokens past which results are cleared) or trigger_tool_uses (the tool uses past which they are)".into(),
            ));
        }
        if self.clear_at_least == Some(0) {
            problems.push((
                "clear_at_least",
                "must be at least 1, or left out to clear every older result".into(),
            ));
        }
        if self.min_cleared == Some(0) {
            problems.push((
                "min_cleared",
                "must be at least 1, or left out to clear whatever it frees".into(),
            ));
        }
        if let Some(blank) = self
            .exclude_tools
            .iter()
            .find(|tool| tool.trim().is_empty())
        {
            problems.push(("exclude_tools", format!("`{blank}` is not a tool name")));
        }
        if let ClearInputs::Tools(tools) = &self.clear_inputs
            && let Some(blank) = tools.iter().find(|tool| tool.trim().is_empty())
        {
            problems.push(("clear_inputs", format!("`{blank}` is not a tool name")));
        }
        problems
    }
}

/// One cleared result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearedResult {
    /// The tool result's index.
    pub index: usize,
    /// The call it answers.
    pub tool_call_id: Arc<str>,
    /// The tool's name.
    pub tool: Arc<str>,
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

/// The placeholder a cleared result of `tool` for the call `call_id`, which held `tokens`
/// tokens, becomes.
pub fn cleared_placeholder(tool: &str, call_id: &str, tokens: u64) -> String {
    format!("[cleared `{tool}` result ({call_id}, {tokens} tokens)]")
}

/// True for a result [`clear_tool_results`] cleared already.
pub fn is_cleared_placeholder(text: &str) -> bool {
    text.starts_with("[cleared `") && text.ends_with(" tokens)]")
}

/// True when `message`'s body is a placeholder, read without copying a long result's text.
fn holds_placeholder(message: &Message) -> bool {
    match &message.content {
        Some(Content::Text(text)) => is_cleared_placeholder(text),
        Some(Content::Parts(_)) => is_cleared_placeholder(&message.text()),
        None => false,
    }
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
    let uses = tool_uses(messages).len();
    let (fire, stop_below) = match options.trigger {
        ClearTrigger::Always => (true, None),
        ClearTrigger::ToolUses(limit) => (uses > limit, None),
        ClearTrigger::Tokens(limit) => (
            request_tokens(messages, options.tools_tokens, counter) > limit,
            options.clear_at_least.map(|_| limit),
        ),
    };
    clear_tool_results_with(
        messages.to_vec(),
        options,
        &FxHashSet::default(),
        (fire, stop_below),
        &mut Replacements::default(),
        counter,
    )
}

/// The tokens of a request of `messages` with tool schemas of `tools_tokens`.
pub(crate) fn request_tokens(
    messages: &[Message],
    tools_tokens: u32,
    counter: &TokenCounter,
) -> u64 {
    u64::from(counter.count_request(messages, &[]).total) + u64::from(tools_tokens)
}

/// The messages earlier calls of a loop put in place of results and tool calls, with their
/// token counts: made again for the same call (the loop's messages do not change), they are
/// taken from here instead of being counted again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replacements {
    /// A cleared result's placeholder and the tokens it saved, by call id.
    results: FxHashMap<Arc<str>, (Message, u64)>,
    /// An assistant turn with a call's arguments cleared, and the tokens that saved, by the
    /// call's id, for each set of the turn's calls whose arguments were cleared before (a
    /// bit per call).
    turns: FxHashMap<Arc<str>, Vec<(u64, Message, u64)>>,
}

/// Clears, first, the results of the calls in `carried` (what earlier calls of a loop
/// cleared: they stay cleared, whatever the trigger), then, when `fire`, old results by
/// `options` (its trigger aside): oldest first, until at least `clear_at_least` tokens were
/// cleared and the request is at most `stop_below` tokens (with neither, every eligible
/// result; with `stop_below` alone, until the request is under it). `(fire, stop_below)`
/// come as a pair. Replacements earlier calls made are taken from `replacements`, and the
/// new ones added to it.
pub fn clear_tool_results_with(
    messages: Vec<Message>,
    options: &ClearOptions,
    carried: &FxHashSet<Arc<str>>,
    (fire, stop_below): (bool, Option<u64>),
    replacements: &mut Replacements,
    counter: &TokenCounter,
) -> Cleared {
    let uses = tool_uses(&messages);
    let mut request = request_tokens(&messages, options.tools_tokens, counter);
    let at_least =
        options
            .clear_at_least
            .unwrap_or(if stop_below.is_some() { 0 } else { u64::MAX });
    let mut out = messages;
    let mut cleared = Vec::new();
    let mut tokens_cleared = 0u64;
    let older = uses.len().saturating_sub(options.keep_tool_uses);
    for (position, tool_use) in uses.iter().enumerate() {
        let call = &out[tool_use.assistant].tool_calls[tool_use.call];
        let is_carried = carried.contains(&call.id);
        if !is_carried {
            let enough = tokens_cleared >= at_least && stop_below.is_none_or(|t| request <= t);
            if !fire || position >= older || enough {
                continue;
            }
        }
        let Some(result_index) = tool_use.result else {
            continue;
        };
        let result = &out[result_index];
        if options.exclude_tools.iter().any(|tool| *tool == *call.name)
            || result.is_pinned()
            || out[tool_use.assistant].is_pinned()
            || holds_placeholder(result)
        {
            continue;
        }
        let (tool, id) = (call.name.clone(), call.id.clone());
        let (replacement, mut saved) = match replacements.results.get(&id) {
            Some(made) => made.clone(),
            None => {
                let before = u64::from(counter.count_message(result));
                let mut replacement = result.clone();
                replacement.set_text(cleared_placeholder(&tool, &id, before));
                let after = u64::from(counter.count_message(&replacement));
                let made = (replacement, before.saturating_sub(after));
                replacements.results.insert(id.clone(), made.clone());
                made
            }
        };
        if saved == 0 {
            continue;
        }
        out[result_index] = replacement;
        if options.clear_arguments.of(&tool)
            && *out[tool_use.assistant].tool_calls[tool_use.call].arguments != *"{}"
        {
            let assistant = &out[tool_use.assistant];
            let mask = assistant
                .tool_calls
                .iter()
                .take(64)
                .enumerate()
                .filter(|(_, call)| *call.arguments == *"{}")
                .fold(0u64, |mask, (bit, _)| mask | 1 << bit);
            let made = replacements
                .turns
                .get(&id)
                .and_then(|made| made.iter().find(|(cleared, ..)| *cleared == mask));
            let (turn, turn_saved) = match made {
                Some((_, turn, saved)) => (turn.clone(), *saved),
                None => {
                    let before = u64::from(counter.count_message(assistant));
                    let mut turn = assistant.clone();
                    turn.tool_calls[tool_use.call].arguments = "{}".into();
                    turn.touch();
                    let saved = before.saturating_sub(u64::from(counter.count_message(&turn)));
                    replacements.turns.entry(id.clone()).or_default().push((
                        mask,
                        turn.clone(),
                        saved,
                    ));
                    (turn, saved)
                }
            };
            out[tool_use.assistant] = turn;
            saved += turn_saved;
        }
        tokens_cleared += saved;
        request = request.saturating_sub(saved);
        cleared.push(ClearedResult {
            index: result_index,
            tool_call_id: id,
            tool,
            tokens: saved,
        });
    }
    Cleared {
        messages: out,
        triggered: fire,
        cleared,
        tokens_cleared,
    }
}

/// Copies `messages` into a request with the results of the `carried` calls (what earlier
/// calls of a loop cleared) replaced by the placeholders `replacements` holds for them, and,
/// with `clear_arguments`, their single-call turns by the turns with the arguments cleared:
/// each message is copied once, a result that is cleared again is never copied. What it
/// leaves (a result with no placeholder made yet, a turn of several calls) is for
/// [`clear_tool_results_with`] to clear.
pub fn carry_cleared<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    carried: &FxHashSet<Arc<str>>,
    replacements: &Replacements,
    clear_arguments: &ClearInputs,
) -> Carried {
    let messages = messages.into_iter();
    let mut out: Vec<Message> = Vec::with_capacity(messages.size_hint().0);
    let mut cleared = Vec::new();
    // The tool names of the calls of the latest assistant turn, and whether it is one that
    // carried clearing may change (one call, not pinned).
    let mut turn: Vec<(&'a Arc<str>, &'a Arc<str>)> = Vec::new();
    let mut turn_saved = 0u64;
    let mut turn_clearable = false;
    let mut left = false;
    for message in messages {
        match message.role {
            Role::Assistant => {
                turn.clear();
                turn.extend(message.tool_calls.iter().map(|call| (&call.id, &call.name)));
                turn_clearable = message.tool_calls.len() == 1 && !message.is_pinned();
                turn_saved = 0;
                let made = match turn.first() {
                    Some((id, tool))
                        if clear_arguments.of(tool)
                            && turn_clearable
                            && carried.contains(&***id)
                            && *message.tool_calls[0].arguments != *"{}" =>
                    {
                        replacements
                            .turns
                            .get(&***id)
                            .and_then(|made| made.iter().find(|(mask, ..)| *mask == 0))
                    }
                    _ => None,
                };
                match made {
                    Some((_, replacement, saved)) => {
                        turn_saved = *saved;
                        out.push(replacement.clone());
                    }
                    None => out.push(message.clone()),
                }
            }
            Role::Tool if turn_clearable => {
                let id = message.tool_call_id.as_deref().unwrap_or_default();
                let made = turn
                    .iter()
                    .find(|(call, _)| ***call == *id)
                    .filter(|_| carried.contains(id) && !message.is_pinned())
                    .filter(|_| !holds_placeholder(message))
                    .and_then(|(call, tool)| Some((call, tool, replacements.results.get(id)?)));
                match made {
                    Some((call, tool, (replacement, saved))) if *saved > 0 => {
                        cleared.push(ClearedResult {
                            index: out.len(),
                            tool_call_id: Arc::clone(call),
                            tool: Arc::clone(tool),
                            tokens: saved + turn_saved,
                        });
                        out.push(replacement.clone());
                    }
                    _ => {
                        left |= carried.contains(id);
                        out.push(message.clone());
                    }
                }
            }
            Role::Tool => {
                left |= message
                    .tool_call_id
                    .as_deref()
                    .is_some_and(|id| carried.contains(id));
                out.push(message.clone());
            }
            _ => {
                turn.clear();
                turn_clearable = false;
                out.push(message.clone());
            }
        }
    }
    Carried {
        messages: out,
        cleared,
        left,
    }
}

/// A request copied with what earlier calls of a loop cleared put in again
/// ([`carry_cleared`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Carried {
    /// The request's messages.
    pub messages: Vec<Message>,
    /// The results put in as their placeholders, with the tokens each saved (its turn's
    /// arguments included).
    pub cleared: Vec<ClearedResult>,
    /// True when a result of a carried call was left as it was (no placeholder made for it
    /// yet, a turn of several calls, or one kept for a reason clearing checks): it is for
    /// [`clear_tool_results_with`] to clear. False, nothing carried is left to clear.
    pub left: bool,
}

/// How many tool uses (calls) `messages` hold.
pub(crate) fn tool_use_count(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|message| message.role == Role::Assistant)
        .map(|message| message.tool_calls.len())
        .sum()
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
                .find(|&r| messages[r].tool_call_id.as_deref() == Some(&*tool_call.id));
            uses.push(ToolUse {
                assistant: index,
                call,
                result,
            });
        }
    }
    uses
}
