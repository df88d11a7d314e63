//! The workflow executor: runs a workflow's states from the first, fits
//! every LLM request to its model's window, applies the transition flags, and records
//! everything in the execution's thread, so that a run can resume after a crash.
//!
//! An execution is a thread (its id is the execution id). Its log holds:
//! - `run_started` (the workflow's text, the input, the limits), the input as the first user
//!   message of the shared history, and the input's JSON root keys as store changes;
//! - per step: `step_started` (the rendered task, a tool's arguments); for an assistant,
//!   each LLM call as `request_started` (exactly what was sent, the budget breakdown, what
//!   fitting left out and why) and `request_ended` (the reply, usage, cost), and the
//!   step's tool calls and results as `step_message` events, which stay in the step's own
//!   log; then, in one transaction, the step's exchange (its task and final answer)
//!   in the shared history, the store changes and `step_finished` with the next state;
//! - `step_failed` and `run_ended` when a step fails, `run_ended` when the run completes.
//!
//! Resuming folds the log ([`ExecutionLog`]) and continues with the step that has not
//! finished: finished steps never run again, and an interrupted assistant step goes on
//! from the tool loop it recorded (its model turns are not asked for again).

mod assistant;
mod building;
mod child;
mod compacting;
mod driving;
mod error;
mod forks;
mod item_budget;
mod items;
mod lifecycle;
mod log;
mod request;
mod step;
mod transition;
mod tree_budget;
mod user_context;

use std::sync::Arc;
use std::time::Duration;

use contexture_core::context::{ContextStore, RenderIsolation, RenderOptions};
use contexture_core::fit::cancelled_result_text;
use contexture_core::registry::Registry;
use contexture_core::thread::{Event, EventKind, RunLimits, RunStart, Usage};
use contexture_core::{Message, ToolCall};
use contexture_llm::StreamDelta;
use serde_json::{Map, Value};

use crate::conversation::ConversationKey;
use crate::hooks::Hook;
use crate::llm::Router;
use crate::sources::WorkflowSource;
use crate::tools::Toolbox;
use crate::workflow::{Programs, Workflow, WorkflowOrigin};
pub use error::{ExecError, StepError};
pub use log::{ExecutionLog, ItemResult, Iteration, LogError, Position};
pub use user_context::{
    MAX_USER_CONTEXT_BYTES, UserContextError, parse_user_context, user_context_from_value,
};

/// Sees a run as it happens: every event as it is recorded, and streamed reply pieces.
/// Used for progress displays and live feeds; it cannot change anything.
pub trait Observer: Send + Sync {
    /// An event was recorded in the execution's log.
    fn on_event(&self, execution_id: &str, event: &Event) {
        let _ = (execution_id, event);
    }

    /// A piece of a streamed reply arrived (only when streaming is on).
    fn on_delta(&self, execution_id: &str, step: u64, delta: &StreamDelta) {
        let _ = (execution_id, step, delta);
    }

    /// An MCP server of the run is starting, or has started.
    fn on_mcp_server(&self, execution_id: &str, progress: &McpProgress) {
        let _ = (execution_id, progress);
    }
}

/// How the start of a run's MCP server goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpProgress {
    /// It is being started (its program run, or its URL reached).
    Starting {
        /// The server's name.
        server: String,
        /// Its program and arguments, or its URL.
        endpoint: String,
    },
    /// It answered the handshake and listed its tools.
    Ready {
        /// The server's name.
        server: String,
        /// Its tools' names, on the server.
        tools: Vec<String>,
        /// How long it took.
        elapsed: Duration,
    },
}

/// A run to start.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    /// The workflow's file name, for errors and the log.
    pub workflow_file: String,
    /// The workflow's YAML text.
    pub workflow_text: String,
    /// The user input: JSON (its root keys fill the context store) or plain text.
    pub input: String,
    /// The execution id; a fresh UUID when `None`.
    pub execution_id: Option<String>,
    /// How the caller named the LLM (`scripted:FILE`, `openai:MODEL`, ...), for the log.
    pub llm: Option<String>,
    /// The conversation the run continues: its recent history is loaded first, and the
    /// run's input and answer are added to it when the run completes.
    pub conversation: Option<ConversationKey>,
    /// Who wrote the workflow: a client's never starts a program (nor do its sub-workflows
    /// or a resume of it), whatever the executor allows.
    pub origin: WorkflowOrigin,
    /// The run's user context (who asked, for what): every template of the run and of its
    /// sub-workflows reads it, read-only, as `user_context.*`.
    pub user_context: Option<Map<String, Value>>,
}

impl RunRequest {
    /// A run of `workflow_text` (named `workflow_file`) with `input`, a fresh id, no LLM
    /// label and no conversation.
    pub fn new(
        workflow_file: impl Into<String>,
        workflow_text: impl Into<String>,
        input: impl Into<String>,
    ) -> RunRequest {
        RunRequest {
            workflow_file: workflow_file.into(),
            workflow_text: workflow_text.into(),
            input: input.into(),
            execution_id: None,
            llm: None,
            conversation: None,
            origin: WorkflowOrigin::Operator,
            user_context: None,
        }
    }
}

/// A finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The execution's id.
    pub execution_id: String,
    /// The last step's output (for a final iteration, its items' outputs as a JSON list).
    pub output: String,
    /// The context store at the end.
    pub store: ContextStore,
    /// Tokens spent, as providers reported them.
    pub usage: Usage,
    /// Dollars spent; `None` when a call spent tokens at no known price.
    pub cost_usd: Option<f64>,
    /// Steps run (a step re-run after a failure counts again).
    pub steps: u64,
}

/// Separates an execution's id from the part that names one of its sub-workflow executions
/// or forked steps: `PARENT~STATE.VISIT[.ITEM]`, `RUN~STATE.fork.STEP`. Not `/`, which
/// separates a tenant's name from its ids in the store.
pub const CHILD_SEPARATOR: char = '~';

/// Runs workflows against a store and an LLM router.
pub struct Executor<S> {
    store: S,
    router: Arc<dyn Router>,
    registry: Arc<Registry>,
    tools: Toolbox,
    hooks: Vec<Arc<dyn Hook>>,
    observer: Option<Arc<dyn Observer>>,
    render: RenderOptions,
    limits: RunLimits,
    stream: bool,
    sources: Arc<dyn WorkflowSource>,
    cancel_poll: Duration,
    programs: Programs,
    caps: RunLimits,
    client_isolation: Option<Arc<dyn RenderIsolation>>,
    /// Whose calibration of token estimates the runs read and feed.
    learner: crate::estimates::Learner,
}

/// A run in progress: its workflow and the fold of its log, kept in step with the store.
pub(crate) struct Run {
    pub id: String,
    pub workflow: Arc<Workflow>,
    pub log: ExecutionLog,
    pub limits: RunLimits,
    /// What the run's sub-workflows (and theirs) spent: its limits bound them too.
    pub descendants: tree_budget::Spent,
    /// The hooks of its steps: the workflow's hook programs, then the executor's hooks.
    pub hooks: Vec<Arc<dyn Hook>>,
    /// Set on the copy of the run one item of a concurrent iteration runs in.
    pub staging: Option<Staging>,
    /// For the fork a step runs on: the execution whose cancellation stops it, and the seq
    /// after which one is new there.
    pub watch: Option<(String, u64)>,
    /// The MCP servers it started, shared with its items' and forks' copies.
    pub mcp: Arc<crate::mcp::RunServers>,
}

/// One item of an iteration whose items run at once, as it runs in its own copy of the run:
/// what it records is held here (and folded into the copy) until the items before it are
/// recorded, then recorded in item order, so the log reads as if the items had run one after
/// another.
pub(crate) struct Staging {
    /// The events held, in order.
    pub events: Vec<EventKind>,
    /// The store's last seq this copy has seen: a cancellation is looked for after it.
    pub store_seq: u64,
    /// Earlier items of the iteration not recorded when the copy was taken: their steps
    /// come first.
    pub earlier_items: u64,
    /// The ledger of what the iteration's items spend.
    pub ledger: Arc<item_budget::ItemLedger>,
    /// This item's index in the iteration (its place in the ledger).
    pub item: usize,
}

impl Run {
    /// What the run and its sub-workflows spent so far: what its limits are held against.
    pub fn tree_spent(&self) -> tree_budget::Spent {
        let mut spent = tree_budget::Spent::own(&self.log).plus(self.descendants);
        spent.steps += self.earlier_items();
        spent
    }

    /// The number the next step of this run gets.
    pub fn next_step(&self) -> u64 {
        self.log.steps_started() + 1 + self.earlier_items()
    }

    /// The store's last seq this run has seen: a cancellation recorded after it is new.
    pub fn store_seq(&self) -> u64 {
        match &self.staging {
            Some(staging) => staging.store_seq,
            None => self.log.thread().last_seq(),
        }
    }

    /// Where a cancellation of this run is recorded, and the seq after which one is new:
    /// the execution itself, or for a fork, the execution it was forked from.
    pub fn cancel_source(&self) -> (String, u64) {
        match &self.watch {
            Some((execution, seq)) => (execution.clone(), *seq),
            None => (self.id.clone(), self.store_seq()),
        }
    }

    /// Folds `kind` into this item's copy of the run without recording it (at the copy's
    /// next seq): what the item records is held apart, and what an earlier item records or
    /// another writer appended is only seen.
    pub fn see(&mut self, kind: EventKind) -> Result<(), ExecError> {
        let seq = self.log.thread().last_seq() + 1;
        self.log
            .apply(Event::new(seq, kind))
            .map_err(|source| ExecError::Log {
                execution_id: self.id.clone(),
                source,
            })
    }

    /// Records `kind` in this item's copy of the run: seen at once, held until the items
    /// before it are recorded.
    fn hold(&mut self, kind: EventKind) -> Result<(), ExecError> {
        self.see(kind.clone())?;
        let own = self.tree_spent();
        if let Some(staging) = &mut self.staging {
            let call_ended = matches!(kind, EventKind::RequestEnded(_));
            staging.ledger.held(staging.item, own, call_ended);
            staging.events.push(kind);
        }
        Ok(())
    }

    /// What the run's budgets are held against: [`Run::tree_spent`], and for an item's copy
    /// also what the other items running at once spent and may still spend.
    pub fn budget_spent(&self) -> tree_budget::Spent {
        let own = self.tree_spent();
        match &self.staging {
            Some(staging) => staging.ledger.seen_by(staging.item, own),
            None => own,
        }
    }

    fn earlier_items(&self) -> u64 {
        self.staging.as_ref().map_or(0, |s| s.earlier_items)
    }

    /// A copy of the run for item `item` of a concurrent iteration, `earlier_items` items
    /// after the last one recorded, entered in the iteration's `ledger`.
    pub fn staged_item(
        &self,
        earlier_items: u64,
        ledger: Arc<item_budget::ItemLedger>,
        item: usize,
    ) -> Run {
        ledger.join(item);
        Run {
            id: self.id.clone(),
            workflow: self.workflow.clone(),
            log: self.log.clone(),
            limits: self.limits,
            descendants: self.descendants,
            hooks: self.hooks.clone(),
            staging: Some(Staging {
                events: Vec::new(),
                store_seq: self.log.thread().last_seq(),
                earlier_items,
                ledger,
                item,
            }),
            watch: self.watch.clone(),
            mcp: self.mcp.clone(),
        }
    }
}

/// What a cancellation's records say.
pub(crate) fn cancel_text(reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("cancelled: {reason}"),
        None => "cancelled".to_owned(),
    }
}

/// The tool calls of the last turn of `messages` that have no result after it: the calls
/// left open at the end of a tool loop. None when the loop's end has moved on past them (a
/// message that is not a tool result follows the turn: it was repaired or answered).
pub(crate) fn unanswered_calls(messages: &[Message]) -> Vec<&ToolCall> {
    let Some(last_turn) = messages.iter().rposition(|m| !m.tool_calls.is_empty()) else {
        return Vec::new();
    };
    let after = &messages[last_turn + 1..];
    if after.iter().any(|m| m.tool_call_id.is_none()) {
        return Vec::new();
    }
    let answered: Vec<&str> = after
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    messages[last_turn]
        .tool_calls
        .iter()
        .filter(|call| !answered.contains(&&*call.id))
        .collect()
}

/// A synthetic "cancelled" result for each call in `messages` that has no result, so the
/// history stays valid for every provider.
pub(crate) fn cancelled_results(messages: &[Message]) -> Vec<Message> {
    unanswered_calls(messages)
        .into_iter()
        .map(|call| Message::tool_result(call.id.clone(), cancelled_result_text(&call.name)))
        .collect()
}

/// The outcome a log describes.
fn outcome(execution_id: &str, log: &ExecutionLog) -> RunOutcome {
    RunOutcome {
        execution_id: execution_id.to_owned(),
        output: log.last_output().unwrap_or_default().to_owned(),
        store: log.store(),
        usage: log.usage(),
        cost_usd: log.total_cost_usd(),
        steps: log.steps_started(),
    }
}

/// Who wrote the workflow of a recorded run.
pub(crate) fn origin_of(start: &RunStart) -> WorkflowOrigin {
    if start.from_client {
        WorkflowOrigin::Client
    } else {
        WorkflowOrigin::Operator
    }
}
