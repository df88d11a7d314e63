//! Hooks: code that sees, and may change, what a run does.
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
//! A hook may fail ([`HookError`]): the step (or the compaction) fails with an error naming
//! the hook and the point ([`HookFailed`]), and nothing the hook answered is used. A view or
//! a change is checked like everything the engine sends: the messages must pass the
//! provider-rule validator (after [`contexture_core::fit::repair()`]) and fit the budget, or
//! the step fails with an error naming the hook.
//!
//! Besides Rust code, a hook may be a program ([`ProgramHook`]): it reads the point and its
//! payload as JSON on standard input and answers with a JSON decision.

mod program;

pub use program::{DEFAULT_HOOK_TIMEOUT, HookProgramSpec, ProgramHook};

use serde::{Deserialize, Serialize};

use contexture_core::Message;

pub use contexture_core::compact::{CompactionInfo, CompactionReport};

/// The step a hook is called for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

/// The points where hooks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// A step starts ([`Hook::on_step_enter`]).
    OnStepEnter,
    /// An LLM call is about to be sent ([`Hook::before_llm_call`]).
    BeforeLlmCall,
    /// An LLM call answered ([`Hook::after_llm_call`]).
    AfterLlmCall,
    /// A step ends ([`Hook::on_step_exit`]).
    OnStepExit,
    /// A compaction is about to run ([`Hook::before_compaction`]).
    BeforeCompaction,
    /// A compaction ran ([`Hook::after_compaction`]).
    AfterCompaction,
}

impl HookPoint {
    /// Every point, in the order a step meets them.
    pub const ALL: [HookPoint; 6] = [
        HookPoint::OnStepEnter,
        HookPoint::BeforeLlmCall,
        HookPoint::AfterLlmCall,
        HookPoint::OnStepExit,
        HookPoint::BeforeCompaction,
        HookPoint::AfterCompaction,
    ];

    /// The point's name, as configuration and hook programs write it.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::OnStepEnter => "on_step_enter",
            HookPoint::BeforeLlmCall => "before_llm_call",
            HookPoint::AfterLlmCall => "after_llm_call",
            HookPoint::OnStepExit => "on_step_exit",
            HookPoint::BeforeCompaction => "before_compaction",
            HookPoint::AfterCompaction => "after_compaction",
        }
    }
}

impl std::fmt::Display for HookPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a hook could not decide: the step (or compaction) it ran for fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    /// What went wrong, in words.
    pub message: String,
}

impl HookError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> HookError {
        HookError {
            message: message.into(),
        }
    }
}

/// A hook that failed, where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hook `{hook}` failed at {point}: {error}")]
pub struct HookFailed {
    /// The hook's name.
    pub hook: String,
    /// The point it failed at.
    pub point: HookPoint,
    /// Why.
    pub error: HookError,
}

impl HookFailed {
    /// `error` of `hook` at `point`.
    pub fn new(hook: &dyn Hook, point: HookPoint, error: HookError) -> HookFailed {
        HookFailed {
            hook: hook.name().to_owned(),
            point,
            error,
        }
    }
}

/// Code that runs at the hook points. Every method has a default that changes nothing.
pub trait Hook: Send + Sync {
    /// A name for errors.
    fn name(&self) -> &str {
        "hook"
    }

    /// A step starts; `task` is its rendered task (or the previous hook's version of it).
    fn on_step_enter(
        &self,
        step: &StepInfo,
        task: Option<String>,
    ) -> Result<Option<String>, HookError> {
        let _ = step;
        Ok(task)
    }

    /// An LLM call is about to be sent with `messages` (fitted and validated).
    fn before_llm_call(
        &self,
        call: &CallInfo,
        messages: &[Message],
    ) -> Result<BeforeCall, HookError> {
        let _ = (call, messages);
        Ok(BeforeCall::Continue)
    }

    /// An LLM call answered `reply` (or the previous hook's version of it).
    fn after_llm_call(&self, call: &CallInfo, reply: Message) -> Result<Message, HookError> {
        let _ = call;
        Ok(reply)
    }

    /// A step ends with `output` (or the previous hook's version of it), before the output
    /// is stored.
    fn on_step_exit(&self, step: &StepInfo, output: String) -> Result<String, HookError> {
        let _ = step;
        Ok(output)
    }

    /// A compaction is about to run; `Ok(false)` skips it (the first hook that says no
    /// stops the chain).
    fn before_compaction(&self, compaction: &CompactionInfo) -> Result<bool, HookError> {
        let _ = compaction;
        Ok(true)
    }

    /// A compaction ran (compacted, or failed and replaced nothing).
    fn after_compaction(
        &self,
        compaction: &CompactionInfo,
        report: &CompactionReport,
    ) -> Result<(), HookError> {
        let _ = (compaction, report);
        Ok(())
    }
}
