//! Hooks: caller code that sees, and may change, what a run does.
//!
//! The points: [`Hook::on_step_enter`] (may change a step's task), [`Hook::before_llm_call`]
//! (may give a view of the messages for this call only, or record a change in the
//! execution's thread), [`Hook::after_llm_call`] (may change the reply the step goes on
//! with), [`Hook::on_step_exit`] (may change the step's output before it is stored), and
//! [`Hook::before_compaction`] (may skip it) / [`Hook::after_compaction`].
//!
//! Hooks run in the order they were registered, each receiving the previous one's result,
//! and each fires exactly once per step or per LLM call: a provider's retries happen below
//! the hooks, and a recorded change rebuilds the request without firing the hooks before it
//! again (fixing AWorld, whose hooks fired twice). Hooks are synchronous and should be quick:
//! they run on the request path.
//!
//! A view or a change is checked like everything the engine sends: the messages must pass
//! the provider-rule validator (after [`contexture_core::fit::repair()`]) and fit the budget,
//! or the step fails with an error naming the hook.

use contexture_core::Message;

use crate::compaction::CompactionReport;

/// The step a hook is called for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInfo {
    /// The execution.
    pub execution_id: String,
    /// The step's number in the run, from 1.
    pub step: u64,
    /// The state it runs.
    pub state_id: String,
    /// The item's position, for one item of an iteration.
    pub item: Option<usize>,
}

/// The LLM call a hook is called for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    /// The step making the call.
    pub step: StepInfo,
    /// The assistant.
    pub assistant_id: String,
    /// The model called.
    pub model: String,
    /// The call's position within the step, from 0 (each reply with tool calls leads to
    /// one more call).
    pub round: u32,
}

/// A change a hook records in the execution's thread before a call.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryChange {
    /// Append these messages to the shared history.
    Append(Vec<Message>),
    /// Replace the whole shared history by these messages (a manual context replace: the
    /// replaced messages stay in the log).
    Replace(Vec<Message>),
}

/// What [`Hook::before_llm_call`] decides.
#[derive(Debug, Clone, PartialEq)]
pub enum BeforeCall {
    /// Send the messages as they are.
    Continue,
    /// Send these messages instead, for this call only; the thread is not changed.
    View(Vec<Message>),
    /// Record this change in the thread, then rebuild (and refit) the request from it. A
    /// view given by an earlier hook in the chain is replaced by the rebuilt request.
    Record(HistoryChange),
}

/// A compaction about to run (or that ran).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Code that runs at the hook points. Every method has a default that changes nothing.
pub trait Hook: Send + Sync {
    /// A name for errors.
    fn name(&self) -> &str {
        "hook"
    }

    /// A step starts; `task` is its rendered task (or the previous hook's version of it).
    fn on_step_enter(&self, step: &StepInfo, task: Option<String>) -> Option<String> {
        let _ = step;
        task
    }

    /// An LLM call is about to be sent with `messages` (fitted and validated).
    fn before_llm_call(&self, call: &CallInfo, messages: &[Message]) -> BeforeCall {
        let _ = (call, messages);
        BeforeCall::Continue
    }

    /// An LLM call answered `reply` (or the previous hook's version of it).
    fn after_llm_call(&self, call: &CallInfo, reply: Message) -> Message {
        let _ = call;
        reply
    }

    /// A step ends with `output` (or the previous hook's version of it), before the output
    /// is stored.
    fn on_step_exit(&self, step: &StepInfo, output: String) -> String {
        let _ = step;
        output
    }

    /// A compaction is about to run; returning false skips it (the first hook that says no
    /// stops the chain).
    fn before_compaction(&self, compaction: &CompactionInfo) -> bool {
        let _ = compaction;
        true
    }

    /// A compaction ran (compacted, or failed and replaced nothing).
    fn after_compaction(&self, compaction: &CompactionInfo, report: &CompactionReport) {
        let _ = (compaction, report);
    }
}
