//! Compaction, the pure part: when to compact, what the summary covers and
//! what stays verbatim, what the summarizer is given, how an oversized part is split for
//! map-reduce, the offline extractive summarizer, and the messages that replace the covered
//! part. Running a summarizer and recording the result is the engine's job
//! (`contexture_engine::compaction`); a compaction is a replace event, so the covered messages
//! stay in the log and can be restored ([`restore_before`]).
//!
//! The replacement, in order: the original user request (verbatim, when it is covered), the
//! covered pinned messages (verbatim, earlier notes among them), the new notes (verbatim, never
//! shown to the summarizer), and the summary. The messages after the covered part (the kept
//! tail) follow it unchanged. A summary that extends an earlier one (a running summary) gets
//! the earlier summary and only the newer messages.

mod extractive;
mod plan;
mod prompt;
mod report;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Message;
use crate::registry::ModelInfo;

pub use extractive::{extractive_summary, identifiers};
pub use plan::{Plan, plan};
pub use prompt::{
    DEFAULT_PROMPT, MERGE_PROMPT, PromptError, chunk_transcripts, cut_to_fit, merge_prompt,
    prompt_hash, summary_prompt, transcript, with_instructions,
};
pub use replace::{RestoreError, replacement, restore_before, summary_text};
pub use report::{CompactionInfo, CompactionOutcome, CompactionReport};

mod replace;

/// The tag of the message holding the original user request once a compaction kept it.
pub const ORIGINAL_REQUEST_TAG: &str = "original-request";

/// The tag of a notes message (verbatim content a compaction kept).
pub const NOTES_TAG: &str = "notes";

/// How the summary message begins.
pub const SUMMARY_HEADING: &str = "Summary of the earlier conversation:";

/// How a notes message begins.
pub const NOTES_HEADING: &str = "Notes (kept verbatim):";

/// The token trigger of a compaction policy that names no trigger: a request over 10,000
/// tokens compacts (AWorld's `trigger_compress_token_length` default). A policy that sets
/// `trigger: {}` on purpose never compacts on its own (only when asked: the `context_manager`
/// tool, `contexture thread compact`, the compact route).
pub const DEFAULT_TRIGGER_TOKENS: u64 = 10_000;

/// The seconds a summarizer call may take when the policy sets none (Dynamiq's context
/// manager's default).
pub const DEFAULT_SUMMARIZER_TIMEOUT_SECS: u64 = 600;

/// When a compaction fires: any trigger that is set and exceeded fires it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Trigger {
    /// The request's tokens (system prompt, tools, history, the step's own messages) are over
    /// this number.
    pub tokens: Option<u64>,
    /// The request's tokens are over this share of the model's window, in (0, 1].
    pub window_share: Option<f64>,
    /// The history holds more than this many messages.
    pub messages: Option<usize>,
}

impl Trigger {
    /// True when no trigger is set.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_none() && self.window_share.is_none() && self.messages.is_none()
    }

    /// When it fires, in words: "when the request is over 10000 tokens", several joined by
    /// "or"; for an empty trigger, that it never fires on its own.
    pub fn describe(&self) -> String {
        let mut when = Vec::new();
        if let Some(tokens) = self.tokens {
            when.push(format!("the request is over {tokens} tokens"));
        }
        if let Some(share) = self.window_share {
            when.push(format!("the request is over {share} of the model's window"));
        }
        if let Some(messages) = self.messages {
            when.push(format!("the history has more than {messages} messages"));
        }
        if when.is_empty() {
            return "only when asked for (`trigger: {}`)".to_owned();
        }
        format!("when {}", when.join(" or "))
    }

    /// Why the compaction fires for a request to `model` made of `messages` (its system
    /// prompt, history and own messages) and `tools`, counted as the request would be,
    /// where the history holds `history_messages` messages (more than `messages` gives when
    /// only the history's tail was read); `None` when it does not. Nothing is counted when
    /// no trigger is set.
    pub fn fires_for<'a>(
        &self,
        model: &ModelInfo,
        messages: impl IntoIterator<Item = &'a Message>,
        history_messages: usize,
        tools: &[Value],
    ) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let tokens = model.counter.count_request_total(messages, tools);
        self.fires(tokens, history_messages, model.context_window)
    }

    /// Why the compaction fires for a request of `tokens` tokens and a history of `messages`
    /// messages on a model with a `window`-token window; `None` when it does not. Each
    /// threshold fires only when exceeded, not when reached.
    pub fn fires(&self, tokens: u64, messages: usize, window: u32) -> Option<String> {
        if let Some(limit) = self.tokens
            && tokens > limit
        {
            return Some(format!("the request has {tokens} tokens, over {limit}"));
        }
        if let Some(share) = self.window_share {
            let limit = (f64::from(window) * share).floor() as u64;
            if tokens > limit {
                return Some(format!(
                    "the request has {tokens} tokens, over {share} of the {window}-token window ({limit})"
                ));
            }
        }
        if let Some(limit) = self.messages
            && messages > limit
        {
            return Some(format!("the history has {messages} messages, over {limit}"));
        }
        None
    }
}

/// What stays verbatim after the summary: the most recent whole units (an assistant turn with
/// its tool results, or one message) that fit both limits. The last unit always stays, and a
/// tool call still waiting for its result is never summarized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Keep {
    /// The most tokens the kept tail may have.
    pub tokens: Option<u64>,
    /// The most messages the kept tail may have.
    pub messages: Option<usize>,
}

impl Default for Keep {
    fn default() -> Self {
        Keep {
            tokens: Some(2_000),
            messages: None,
        }
    }
}

/// The most retries a compaction policy may ask for: each one is another call to the
/// summarizer, so a policy (which a client may set on its thread) bounds the calls one
/// compaction makes.
pub const MAX_RETRIES: u32 = 5;

/// The longest a policy may let one summarizer call take (an hour): a policy may come from a
/// client, and a compaction holds its thread's turn while it runs.
pub const MAX_TIMEOUT_SECS: u64 = 3_600;

/// A compaction policy: for an assistant (in a workflow) or a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionPolicy {
    /// When it fires (for automatic compaction before a request).
    #[serde(deserialize_with = "crate::map_only::required")]
    pub trigger: Trigger,
    /// What stays verbatim.
    #[serde(deserialize_with = "crate::map_only::required")]
    pub keep: Keep,
    /// The summarizer model; `None` uses the offline extractive summarizer.
    pub summarizer: Option<String>,
    /// The summarizer's prompt, overriding [`DEFAULT_PROMPT`]; it must contain
    /// `{transcript}` and may contain `{previous_summary}`.
    pub prompt: Option<String>,
    /// Attempts after a failed or empty summary before the compaction gives up (default 2,
    /// at most [`MAX_RETRIES`]).
    pub max_retries: u32,
    /// The most tokens the summary may take (default 1,024): the summarizer's reply limit,
    /// and the extractive summary's budget.
    pub summary_tokens: u32,
    /// Above this many tokens, the covered part is summarized by map-reduce (chunks
    /// summarized apart, then merged) instead of in one call (AWorld's
    /// `trigger_mapreduce_compress_token_length`); default (`None`): whatever does not fit
    /// the summarizer's window in one call. A chunk never exceeds it either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapreduce_tokens: Option<u64>,
    /// The seconds one summarizer call may take, in place of the run's or the server's LLM
    /// timeout (default 600, Dynamiq's).
    pub timeout_secs: u64,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            // A policy that names no trigger compacts past the default threshold: a policy
            // that never fires unless told is asked for with `trigger: {}`.
            trigger: Trigger {
                tokens: Some(DEFAULT_TRIGGER_TOKENS),
                ..Trigger::default()
            },
            keep: Keep::default(),
            summarizer: None,
            prompt: None,
            max_retries: 2,
            summary_tokens: 1_024,
            mapreduce_tokens: None,
            timeout_secs: DEFAULT_SUMMARIZER_TIMEOUT_SECS,
        }
    }
}

impl CompactionPolicy {
    /// Every problem with the policy's values, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if let Some(share) = self.trigger.window_share
            && !(share.is_finite() && share > 0.0 && share <= 1.0)
        {
            problems.push((
                "trigger.window_share",
                format!("window_share must be greater than 0 and at most 1, not {share}"),
            ));
        }
        if self.keep.tokens == Some(0) || self.keep.messages == Some(0) {
            problems.push((
                "keep",
                "keep limits must be at least 1 (the last unit always stays)".to_owned(),
            ));
        }
        if let Some(prompt) = &self.prompt
            && let Err(error) = prompt::check_template(prompt)
        {
            problems.push(("prompt", error.to_string()));
        }
        if self.max_retries > MAX_RETRIES {
            problems.push((
                "max_retries",
                format!(
                    "max_retries must be at most {MAX_RETRIES} (each retry is another summarizer call), not {}",
                    self.max_retries
                ),
            ));
        }
        if let Some(tokens) = self.mapreduce_tokens
            && tokens < 64
        {
            problems.push((
                "mapreduce_tokens",
                format!(
                    "mapreduce_tokens must be at least 64 (each chunk is one summarizer call), not {tokens}"
                ),
            ));
        }
        if self.timeout_secs == 0 || self.timeout_secs > MAX_TIMEOUT_SECS {
            problems.push((
                "timeout_secs",
                format!(
                    "timeout_secs must be from 1 to {MAX_TIMEOUT_SECS}, not {}",
                    self.timeout_secs
                ),
            ));
        }
        if self.summary_tokens < 16 {
            problems.push((
                "summary_tokens",
                format!(
                    "summary_tokens must be at least 16, not {}",
                    self.summary_tokens
                ),
            ));
        }
        problems
    }

    /// The name recorded for the summarizer: the model, or `extractive`.
    pub fn summarizer_name(&self) -> &str {
        self.summarizer.as_deref().unwrap_or("extractive")
    }
}
