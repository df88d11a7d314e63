//! What a compaction reports, as plain data: how it ended, what it covered and cost
//! ([`CompactionReport`]), and what hooks are told of a compaction about to run or that ran
//! ([`CompactionInfo`]). The engine runs compactions and fills them in.

use serde::Serialize;

use super::CompactionPolicy;

/// How a compaction ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CompactionOutcome {
    /// The covered part was replaced.
    Compacted {
        /// The seq of the replace event.
        replace_seq: u64,
        /// A request was in flight: the replace is queued and applies when it ends (the
        /// projection is unchanged until then).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        queued: bool,
    },
    /// Nothing was done, for this reason.
    Skipped {
        /// Why.
        reason: String,
    },
    /// The summarizer failed; nothing was replaced.
    Failed {
        /// What went wrong, after every retry.
        error: String,
    },
}

/// What a compaction did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionReport {
    /// How it ended.
    #[serde(flatten)]
    pub outcome: CompactionOutcome,
    /// The covered seqs, when there was something to cover.
    pub covered: Option<(u64, u64)>,
    /// How many messages the covered part held.
    pub covered_messages: usize,
    /// The projection's tokens before (system prompt and messages).
    pub tokens_before: u64,
    /// The projection's tokens after.
    pub tokens_after: u64,
    /// The summarizer: a model, or `extractive`.
    pub summarizer: String,
    /// How many summarizer calls were made (retries included).
    pub calls: u32,
    /// The summary written, when there is one.
    pub summary: Option<String>,
}

impl CompactionReport {
    /// A report of a compaction that has not done anything yet, of a part of `tokens`.
    pub fn new(tokens: u64, policy: &CompactionPolicy) -> CompactionReport {
        CompactionReport {
            outcome: CompactionOutcome::Skipped {
                reason: String::new(),
            },
            covered: None,
            covered_messages: 0,
            tokens_before: tokens,
            tokens_after: tokens,
            summarizer: policy.summarizer_name().to_owned(),
            calls: 0,
            summary: None,
        }
    }
}

/// A compaction about to run (or that ran).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactionInfo {
    /// The thread compacted (an execution's id, for a workflow).
    pub thread_id: String,
    /// Why it runs: a trigger's reason, `manual`, or the context manager tool.
    pub reason: String,
    /// The first seq it covers.
    pub from_seq: u64,
    /// The last seq it covers.
    pub to_seq: u64,
    /// How many messages it covers.
    pub covered_messages: usize,
    /// The step whose own tool loop it compacts (then `from_seq` and `to_seq` are positions
    /// in the loop's messages, from 1); `None` for a thread's history.
    pub loop_step: Option<u64>,
}
