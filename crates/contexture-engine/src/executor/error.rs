//! Why a run or a step failed.

use contexture_core::budget::BudgetError;
use contexture_core::context::{ExprError, IterError, TemplateError};
use contexture_core::fit::{TrimError, Violation};
use contexture_core::thread::MergeError;
use contexture_llm::LlmError;
use contexture_store::StoreError;

use super::log::LogError;
use crate::compaction::CompactionError;
use crate::hooks::HookFailed;
use crate::tools::ToolError;
use crate::workflow::WorkflowError;

/// Why a step failed. The run stops; it can be resumed from this step.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A template (task, system prompt, transform value, tool argument) failed.
    #[error("{place}: {error}")]
    Template {
        /// Which template.
        place: String,
        /// Why.
        error: TemplateError,
    },
    /// The model's budget policy is invalid.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The request cannot fit the model's window even with all history left out.
    #[error(
        "the request cannot fit the model's window: {0} (the step's task and its tool loop are kept whole; an assistant's `context.truncate_tool_results` and `context.clear_tool_results` make them smaller, and its `compaction` summarizes the loop's older iterations)"
    )]
    Fit(TrimError),
    /// The assistant's fitting is off and its request does not fit the model's window.
    #[error("{0}")]
    Unfitted(String),
    /// A message list breaks the provider's rules.
    #[error("the messages from {by} break the provider's rules: {}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidRequest {
        /// What produced them.
        by: String,
        /// What is wrong.
        violations: Vec<Violation>,
    },
    /// A hook failed (a hook program that could not start, exited non-zero, or answered
    /// what the point does not take).
    #[error(transparent)]
    Hook(#[from] HookFailed),
    /// A hook's view is over the request's budget.
    #[error("hook `{hook}` gave messages of {tokens} tokens, over the request's limit of {limit}")]
    ViewOverBudget {
        /// The hook.
        hook: String,
        /// The view's tokens.
        tokens: u32,
        /// The limit.
        limit: u32,
    },
    /// The registry cannot describe the model called.
    #[error(transparent)]
    Model(#[from] contexture_core::registry::RegistryError),
    /// The LLM call failed (after the provider's retries).
    #[error("the LLM call failed: {0}")]
    Llm(#[from] LlmError),
    /// A tool state's tool failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// An MCP server could not start, or stopped or hung during a call.
    #[error(transparent)]
    Mcp(Box<contexture_mcp::McpError>),
    /// An assistant names an MCP server that neither the workflow nor the host declares
    /// (validation refuses such a workflow; a run reaches this only from an older log).
    #[error("MCP server `{server}` is declared neither by the workflow nor by the host")]
    UndeclaredMcpServer {
        /// The name.
        server: String,
    },
    /// The assistant kept calling tools.
    #[error(
        "assistant `{assistant}` still called tools after {max} rounds (max_iterations {max}); it never gave a final answer"
    )]
    MaxIterations {
        /// The assistant.
        assistant: String,
        /// Its max_iterations.
        max: u32,
    },
    /// A condition could not be evaluated.
    #[error("the transition's condition failed: {0}")]
    Condition(#[from] ExprError),
    /// No switch case matched and there is no default.
    #[error("no switch case matched the output and the switch has no default")]
    NoCaseMatched,
    /// The items of an iteration could not be selected.
    #[error("cannot iterate: {0}")]
    Iteration(#[from] IterError),
    /// The execution's token budget is spent.
    #[error(
        "token budget exceeded: {spent} tokens spent{} against a budget of {limit}",
        request.map(|r| format!(" and this request needs {r} more")).unwrap_or_default()
    )]
    TokenBudget {
        /// Tokens spent so far.
        spent: u64,
        /// The next request's input tokens, when it was refused before sending.
        request: Option<u64>,
        /// The budget.
        limit: u64,
    },
    /// The execution's cost budget is spent.
    #[error(
        "cost budget exceeded: ${spent:.6} spent{} against a budget of ${limit:.6}",
        request.map(|r| format!(" and this request costs at least ${r:.6} more")).unwrap_or_default()
    )]
    CostBudget {
        /// Dollars spent so far.
        spent: f64,
        /// The next request's prompt cost, when it was refused before sending.
        request: Option<f64>,
        /// The budget.
        limit: f64,
    },
    /// A cost budget is set but the model has no price.
    #[error(
        "a cost budget is set but model `{model}` has no price in the registry (add `pricing` to a models file)"
    )]
    NoPrice {
        /// The model.
        model: String,
    },
    /// The execution was cancelled.
    #[error("{}", super::cancel_text(reason.as_deref()))]
    Cancelled {
        /// Why, as the cancellation said.
        reason: Option<String>,
    },
    /// A sub-workflow's input names a parent path that does not exist.
    #[error("the sub-workflow's input: {0}")]
    SubWorkflowInput(String),
    /// A sub-workflow cannot be read or did not complete.
    #[error("sub-workflow `{workflow}` (execution `{child}`): {error}")]
    SubWorkflow {
        /// The workflow reference.
        workflow: String,
        /// The child execution.
        child: String,
        /// What went wrong.
        error: String,
    },
    /// The fork the step ran on could not be merged back (a key it should bring back is
    /// missing, a conflict under `error`, no answer to summarize).
    #[error("the fork could not be merged back: {0}")]
    Fork(#[source] MergeError),
    /// The run took more steps than allowed.
    #[error("step limit reached: {max} steps (a loop between states?)")]
    StepLimit {
        /// The limit.
        max: u64,
    },
}

impl From<crate::fitting::FitError> for StepError {
    fn from(error: crate::fitting::FitError) -> StepError {
        match error {
            crate::fitting::FitError::Budget(error) => StepError::Budget(error),
            crate::fitting::FitError::Trim(error) => StepError::Fit(error),
            error @ crate::fitting::FitError::OverWindow { .. } => {
                StepError::Unfitted(error.to_string())
            }
            crate::fitting::FitError::Invalid { violations } => StepError::InvalidRequest {
                by: "fitting".into(),
                violations,
            },
        }
    }
}

impl From<CompactionError> for ExecError {
    fn from(error: CompactionError) -> ExecError {
        match error {
            CompactionError::Store(error) => ExecError::Store(error),
            CompactionError::Hook(error) => ExecError::Hook(error),
            other => ExecError::Compaction(other),
        }
    }
}

/// Why a run could not start, go on, or finish.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A hook failed at a compaction; within a step, the step fails with it.
    #[error(transparent)]
    Hook(#[from] HookFailed),
    /// The workflow is invalid.
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// The workflow cannot run as declared.
    #[error("{file}: {}", problems.join("; "))]
    NotRunnable {
        /// The workflow file.
        file: String,
        /// What prevents it.
        problems: Vec<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A compaction of the run's history could not run (its store and hook failures are
    /// [`ExecError::Store`] and [`ExecError::Hook`], as the run's own).
    #[error("compaction: {0}")]
    Compaction(#[source] CompactionError),
    /// No execution has this id.
    #[error("no execution `{execution_id}` in the store")]
    NotFound {
        /// The id.
        execution_id: String,
    },
    /// An execution with this id exists already.
    #[error("execution `{execution_id}` exists already (resume it instead)")]
    AlreadyExists {
        /// The id.
        execution_id: String,
    },
    /// The execution's log cannot be read as a run.
    #[error("execution `{execution_id}`: {source}")]
    Log {
        /// The id.
        execution_id: String,
        /// Why.
        source: LogError,
    },
    /// The log names a state the workflow does not have.
    #[error("execution `{execution_id}`: the log's next state `{state_id}` is not in the workflow")]
    UnknownState {
        /// The id.
        execution_id: String,
        /// The state named.
        state_id: String,
    },
    /// The execution was cancelled (or a cancellation was asked for); it does not resume.
    #[error("execution `{execution_id}` was cancelled{}; a cancelled run cannot be resumed (start it again)", reason.as_deref().map(|reason| format!(": {reason}")).unwrap_or_default())]
    Cancelled {
        /// The execution.
        execution_id: String,
        /// Why, as the cancellation said.
        reason: Option<String>,
    },
    /// A step failed; the run stopped and can be resumed.
    #[error("execution `{execution_id}`, step {step} (`{state_id}`): {error}")]
    StepFailed {
        /// The execution.
        execution_id: String,
        /// The step.
        step: u64,
        /// The state.
        state_id: String,
        /// Why.
        error: Box<StepError>,
    },
}

impl ExecError {
    /// True when the execution stopped because it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        match self {
            ExecError::Cancelled { .. } => true,
            ExecError::StepFailed { error, .. } => {
                matches!(**error, StepError::Cancelled { .. })
            }
            _ => false,
        }
    }

    /// The execution the error belongs to, when there is one.
    pub fn execution_id(&self) -> Option<&str> {
        match self {
            ExecError::NotFound { execution_id }
            | ExecError::AlreadyExists { execution_id }
            | ExecError::Log { execution_id, .. }
            | ExecError::UnknownState { execution_id, .. }
            | ExecError::Cancelled { execution_id, .. }
            | ExecError::StepFailed { execution_id, .. } => Some(execution_id),
            _ => None,
        }
    }
}

impl From<contexture_mcp::McpError> for StepError {
    fn from(error: contexture_mcp::McpError) -> StepError {
        // Boxed: its errors carry a server's standard error, and every step result would
        // otherwise be as large.
        StepError::Mcp(Box::new(error))
    }
}
