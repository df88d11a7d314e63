//! The events a workflow execution records in its thread.
//!
//! An execution is a thread: its conversation is the history the workflow's assistants share,
//! its key-value store is the workflow's context store, and these events are the execution
//! log. They do not change the projection; the executor folds them to know where a run
//! stands, so a run can resume from its log after a crash.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::MergePolicy;
use crate::fit::{ClearedResult, ClearedThinking, TruncatedResult};
use crate::message::Message;

/// A run began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStart {
    /// The workflow's file name, as given.
    pub workflow_file: String,
    /// The workflow's YAML text, so that the run can resume without the file.
    pub workflow_text: String,
    /// The user input the run started with.
    pub input: String,
    /// Which LLM answers (`scripted:FILE`, `openai:MODEL`, ...), as the caller named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<String>,
    /// The execution that started this one, for a sub-workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_execution_id: Option<String>,
    /// The limits the run was started with.
    #[serde(default, skip_serializing_if = "RunLimits::is_unlimited")]
    pub limits: RunLimits,
    /// The conversation thread the run continues: its history was loaded at the start, and
    /// the run's input and final answer are appended to it when the run completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// The workflow was sent by a client rather than written by the operator: neither it,
    /// its sub-workflows nor a resume of it ever start a program on the host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_client: bool,
    /// The run's user context: an object every template of the run and of its
    /// sub-workflows reads, read-only, as `user_context.*`. A sub-workflow's run carries its
    /// parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_context: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What one execution may spend before it is stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    /// Most tokens (prompt and completion, as providers report them) over all calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most dollars over all calls, at the models' list prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most steps (state runs, each iteration item counting as one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Most seconds of wall-clock time from the run's start (or its resume); past it the
    /// run is cancelled, as if asked to, with a reason naming the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seconds: Option<f64>,
}

impl RunLimits {
    /// True when nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        *self == RunLimits::default()
    }

    /// These limits, each one replaced by `other`'s where `other` sets it.
    pub fn overridden_by(self, other: RunLimits) -> RunLimits {
        RunLimits {
            max_tokens: other.max_tokens.or(self.max_tokens),
            max_cost_usd: other.max_cost_usd.or(self.max_cost_usd),
            max_steps: other.max_steps.or(self.max_steps),
            max_seconds: other.max_seconds.or(self.max_seconds),
        }
    }

    /// These limits, each one lowered to `cap`'s where `cap` sets a lower one (or where
    /// these set none): what an operator's ceiling leaves of a workflow's own limits.
    pub fn capped_by(self, cap: RunLimits) -> RunLimits {
        fn lower<T: PartialOrd + Copy>(own: Option<T>, cap: Option<T>) -> Option<T> {
            match (own, cap) {
                (Some(own), Some(cap)) => Some(if cap < own { cap } else { own }),
                (own, cap) => own.or(cap),
            }
        }
        RunLimits {
            max_tokens: lower(self.max_tokens, cap.max_tokens),
            max_cost_usd: lower(self.max_cost_usd, cap.max_cost_usd),
            max_steps: lower(self.max_steps, cap.max_steps),
            max_seconds: lower(self.max_seconds, cap.max_seconds),
        }
    }
}

/// A step began: one state run, or one item of an iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepStart {
    /// The step's number in the run, from 1.
    pub step: u64,
    /// The state it runs.
    pub state_id: String,
    /// The item's position, when the step is one item of an iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// The step's task as rendered (the user turn an assistant step adds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// For a tool step, the arguments the tool is called with; for a sub-workflow step, the
    /// child's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// For a sub-workflow step, the child execution it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_execution_id: Option<String>,
    /// For a step run on a fork of the execution's thread, the fork: its calls and end are
    /// recorded there, and a `merged` event brings back what the state's fork settings say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_thread: Option<String>,
}

/// A message that stays in a step's own log: an assistant turn that called tools, or
/// a tool's result. Only the step's final answer enters the shared history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMessage {
    /// The step it belongs to.
    pub step: u64,
    /// The message.
    pub message: Message,
}

/// A step's own tool loop compacted: its oldest messages (the task first, then the step's
/// log in order) stood for, in the requests that follow, by a replacement (the task kept
/// verbatim, notes, a summary). The step's log keeps every message whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCompaction {
    /// The step it belongs to.
    pub step: u64,
    /// How many of the step's own messages, from its task on, the replacement stands for.
    pub covered: usize,
    /// What the requests send in their place.
    pub replacement: Vec<Message>,
    /// Who wrote the summary: a model, or `extractive`.
    pub summarizer: String,
    /// The loop's tokens (its task and messages, as requests sent them) before and after.
    pub tokens_before: u64,
    /// See `tokens_before`.
    pub tokens_after: u64,
}

impl StepCompaction {
    /// What it did, in one line.
    pub fn describe(&self) -> String {
        format!(
            "loop compacted: its first {} messages (task, tool calls and results) sent as {} ({}): {} -> {} tokens",
            self.covered,
            self.replacement.len(),
            self.summarizer,
            self.tokens_before,
            self.tokens_after
        )
    }
}

/// A step ended with an output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEnd {
    /// The step's number.
    pub step: u64,
    /// The state it ran.
    pub state_id: String,
    /// The item's position, for one item of an iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// The step's output text (the assistant's final answer, the tool's result, or the
    /// transform's values as JSON).
    pub output: String,
    /// Where the run goes next: a state id or `end`. `None` for an iteration item that is
    /// not the last; the iteration's transition is taken once all its items have ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// When the transition iterates (`iter_key`): the items the next state runs once each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<Value>>,
    /// When the transition iterates: how the items' outputs come together in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergePolicy>,
    /// When the transition iterates and says so: the only context keys each item's run
    /// sees (with the item's own keys); `None` for all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_keys: Option<Vec<String>>,
    /// When the transition iterates and lets items run at once: how many may (`None`: one
    /// at a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_concurrency: Option<u32>,
}

/// A step failed; the run stops and may be resumed from this step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepFailure {
    /// The step's number.
    pub step: u64,
    /// The state it ran.
    pub state_id: String,
    /// What went wrong.
    pub error: String,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The workflow reached its end.
    Completed,
    /// A step failed or a budget was exceeded; the run can be resumed.
    Failed,
    /// The run was cancelled.
    Cancelled,
}

/// A run ended (a failed run may still be resumed; a new `run_started` is then not written).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    /// How it ended.
    pub status: RunStatus,
    /// The final output, for a completed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// What went wrong, for a failed or cancelled run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What trimming did to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitRecord {
    /// The most tokens the request could use.
    pub limit: u32,
    /// The request's tokens before trimming, when every message was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_before: Option<u64>,
    /// The request's tokens as sent.
    pub tokens_after: u64,
    /// The history messages left out, as `[start, end)` ranges of the unfitted request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<[usize; 2]>,
    /// Why anything was left out or changed, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The tool results replaced by a placeholder (their indexes in the unfitted request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleared: Vec<ClearedResult>,
    /// The tool results cut to their start and end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<TruncatedResult>,
    /// The assistant turns whose reasoning was left out, and the tokens that freed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_thinking: Option<ClearedThinking>,
    /// For a call after the first of a loop: how much of the previous call's request this
    /// one sends again, unchanged, at its start (what a provider's prompt cache can reuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixReuse>,
}

/// How much of the previous call's request a call sends again at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixReuse {
    /// The previous call's messages.
    pub previous: u32,
    /// How many of them this call sends first, unchanged.
    pub shared: u32,
}

impl PrefixReuse {
    /// How much of `previous` starts `current`, message for message.
    pub fn between(previous: &[Message], current: &[Message]) -> PrefixReuse {
        let shared = previous
            .iter()
            .zip(current)
            .take_while(|(before, now)| before == now)
            .count();
        PrefixReuse {
            previous: u32::try_from(previous.len()).unwrap_or(u32::MAX),
            shared: u32::try_from(shared).unwrap_or(u32::MAX),
        }
    }

    /// True when the whole previous request starts this one: its prefix is stable.
    pub fn stable(&self) -> bool {
        self.shared == self.previous
    }
}

impl FitRecord {
    /// One line per tool result the fit changed, in words (what was cut and what was
    /// cleared, with the tokens each freed), then how much of the previous call's request
    /// this one sent again.
    pub fn tool_result_changes(&self) -> Vec<String> {
        let truncated = self.truncated.iter().map(|result| {
            format!(
                "cut `{}` result ({}): {} -> {} tokens",
                result.tool.as_deref().unwrap_or("?"),
                result.tool_call_id,
                result.tokens_before,
                result.tokens_after
            )
        });
        let cleared = self.cleared.iter().map(|result| {
            format!(
                "cleared `{}` result ({}): {} tokens freed",
                result.tool, result.tool_call_id, result.tokens
            )
        });
        let prefix = self.prefix.iter().map(|prefix| {
            if prefix.stable() {
                format!(
                    "prefix: the previous call's {} messages, unchanged",
                    prefix.previous
                )
            } else {
                format!(
                    "prefix: {} of the previous call's {} messages, unchanged (changed at message {})",
                    prefix.shared,
                    prefix.previous,
                    prefix.shared + 1
                )
            }
        });
        truncated.chain(cleared).chain(prefix).collect()
    }
}
