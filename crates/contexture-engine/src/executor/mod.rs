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
//! finished: finished steps never run again.

mod assistant;
mod child;
mod compacting;
mod error;
mod forks;
mod item_budget;
mod items;
mod log;
mod request;
mod step;
mod transition;
mod tree_budget;
mod user_context;

use std::sync::Arc;
use std::time::Duration;

use contexture_core::Message;
use contexture_core::context::{ContextStore, RenderIsolation, RenderOptions};
use contexture_core::fit::cancelled_result_text;
use contexture_core::registry::Registry;
use contexture_core::thread::{
    CancelRequest, Event, EventKind, RequestEnd, RunEnd, RunLimits, RunStart, RunStatus,
    StoreChange, Usage,
};
use contexture_llm::StreamDelta;
use contexture_store::{NewEvent, Store};
use serde_json::{Map, Value};

use crate::compaction::{
    CompactRequest, CompactionError, CompactionTarget, Compactor, StoredThread,
};
use crate::conversation::{self, ConversationKey};
use crate::hooks::{Hook, ProgramHook};
use crate::llm::Router;
use crate::sources::{FileSource, WorkflowSource};
use crate::system::new_id;
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
    pub context: ContextStore,
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
        }
    }
}

impl<S: Store> Executor<S> {
    /// An executor over `store` whose LLM calls go where `router` says; the built-in model
    /// registry and tools, no hooks, the system clock and random ids for templates.
    pub fn new(store: S, router: Arc<dyn Router>) -> Executor<S> {
        Executor {
            store,
            router,
            registry: Arc::new(Registry::builtin()),
            tools: Toolbox::default(),
            hooks: Vec::new(),
            observer: None,
            render: crate::system::render_options(None),
            limits: RunLimits::default(),
            stream: false,
            sources: Arc::new(FileSource),
            cancel_poll: Duration::from_millis(250),
            programs: Programs::Allowed,
            caps: RunLimits::default(),
            client_isolation: None,
            learner: crate::estimates::Learner::Operator,
        }
    }

    /// Builder: whether operator workflows may start programs on this host (`command`
    /// tools, MCP servers started as programs). Default: allowed. A client's workflow never
    /// may, whatever this says.
    pub fn with_programs(mut self, programs: Programs) -> Executor<S> {
        self.programs = programs;
        self
    }

    /// Loads and checks the workflow of `request` (and its sub-workflows) as a run of it
    /// would, without starting anything: every problem that would stop it before its first
    /// step, programs it may not start included.
    pub fn validate(&self, request: &RunRequest) -> Result<Workflow, ExecError> {
        let programs = Programs::for_run(&self.programs, request.origin);
        let workflow = Workflow::load_tree_for(
            &request.workflow_text,
            &request.workflow_file,
            self.sources.as_ref(),
            &programs,
        )?;
        self.check_runnable(&workflow, &request.workflow_file, &programs)?;
        Ok(workflow)
    }

    /// Builder: where sub-workflows are read from (default: files, relative to the parent's).
    pub fn with_workflow_source(mut self, sources: Arc<dyn WorkflowSource>) -> Executor<S> {
        self.sources = sources;
        self
    }

    /// Where sub-workflows are read from.
    pub fn sources(&self) -> &Arc<dyn WorkflowSource> {
        &self.sources
    }

    /// Builder: how often a running step looks for a cancellation asked for by another
    /// process (default 250 ms).
    pub fn with_cancel_poll(mut self, interval: Duration) -> Executor<S> {
        self.cancel_poll = interval;
        self
    }

    /// Builder: the model registry (windows, tokenizers, prices).
    pub fn with_registry(mut self, registry: Arc<Registry>) -> Executor<S> {
        self.registry = registry;
        self
    }

    /// Builder: the tool implementations.
    pub fn with_tools(mut self, tools: Toolbox) -> Executor<S> {
        self.tools = tools;
        self
    }

    /// Builder: adds a hook after those already added.
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Executor<S> {
        self.hooks.push(hook);
        self
    }

    /// Builder: the observer of events and streamed pieces.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Executor<S> {
        self.observer = Some(observer);
        self
    }

    /// Builder: the clock, ids and variables templates see.
    pub fn with_render_options(mut self, options: RenderOptions) -> Executor<S> {
        self.render = options;
        self
    }

    /// Builder: limits that override the workflow's (and, on resume, the recorded ones).
    pub fn with_limits(mut self, limits: RunLimits) -> Executor<S> {
        self.limits = limits;
        self
    }

    /// Builder: ceilings on every run's limits: a workflow (or [`Executor::with_limits`])
    /// may set lower ones, never higher, and a limit nobody sets is the ceiling.
    pub fn with_limit_caps(mut self, caps: RunLimits) -> Executor<S> {
        self.caps = caps;
        self
    }

    /// Builder: whose calibration of token estimates the runs read and feed (default the
    /// operator's; a server's executions read it and feed nothing, since a client shapes
    /// their requests).
    pub fn with_estimate_learner(mut self, learner: crate::estimates::Learner) -> Executor<S> {
        self.learner = learner;
        self
    }

    /// Builder: render the templates and expressions of workflows a client sent through
    /// `isolation` (worker processes whose memory and time are bounded), not in this
    /// process. Without it they render here, bounded only by fuel and the output limit.
    pub fn with_client_isolation(mut self, isolation: Arc<dyn RenderIsolation>) -> Executor<S> {
        self.client_isolation = Some(isolation);
        self
    }

    /// Builder: stream replies (the observer sees each piece as it arrives).
    pub fn with_streaming(mut self, stream: bool) -> Executor<S> {
        self.stream = stream;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// This executor, set up as it is, over another store: a tenant's view of this one
    /// (see [`contexture_store::Scoped`]), so that the runs it starts see only the tenant's
    /// threads.
    pub fn on_store<T: Store>(&self, store: T) -> Executor<T> {
        Executor {
            store,
            router: self.router.clone(),
            registry: self.registry.clone(),
            tools: self.tools.clone(),
            hooks: self.hooks.clone(),
            observer: self.observer.clone(),
            render: self.render.clone(),
            limits: self.limits,
            stream: self.stream,
            sources: self.sources.clone(),
            cancel_poll: self.cancel_poll,
            programs: self.programs.clone(),
            caps: self.caps,
            client_isolation: self.client_isolation.clone(),
            learner: self.learner.clone(),
        }
    }

    /// Starts a run and drives it to its end.
    pub async fn start(&self, request: RunRequest) -> Result<RunOutcome, ExecError> {
        self.begin(request, None, RunLimits::default()).await
    }

    /// Starts a run, as a child of `parent` when given, its limits held under `within`
    /// (what the parent has left).
    pub(crate) async fn begin(
        &self,
        request: RunRequest,
        parent: Option<String>,
        within: RunLimits,
    ) -> Result<RunOutcome, ExecError> {
        let workflow = self.validate(&request)?;
        let hooks = self.hooks_of(&workflow, &request.workflow_file)?;
        let id = request
            .execution_id
            .clone()
            .unwrap_or_else(|| new_id(self.render.ids.as_ref()));
        let limits = workflow
            .limits
            .overridden_by(self.limits)
            .capped_by(self.caps)
            .capped_by(within);
        match self.store.events(&id).await {
            Ok(existing) if !existing.is_empty() => {
                return Err(ExecError::AlreadyExists { execution_id: id });
            }
            Ok(_) | Err(contexture_store::StoreError::NotFound { .. }) => {}
            Err(other) => return Err(other.into()),
        }
        let conversation = request
            .conversation
            .as_ref()
            .map(ConversationKey::thread_id);
        let history = match &conversation {
            Some(thread) => self.conversation_history(&workflow, thread, &hooks).await?,
            None => Vec::new(),
        };
        let mut events = vec![EventKind::RunStarted(RunStart {
            workflow_file: request.workflow_file,
            workflow_text: request.workflow_text,
            input: request.input.clone(),
            llm: request.llm,
            parent_execution_id: parent,
            limits,
            conversation,
            from_client: request.origin == WorkflowOrigin::Client,
            user_context: request.user_context,
        })];
        events.extend(
            history
                .into_iter()
                .map(|message| EventKind::MessageAppended { message }),
        );
        if !request.input.is_empty() {
            events.push(EventKind::MessageAppended {
                message: Message::user(request.input.clone()),
            });
        }
        let initial = ContextStore::from_user_input(&request.input);
        events.extend(
            initial
                .into_map()
                .into_iter()
                .map(|(key, value)| EventKind::StoreChanged(StoreChange::Set { key, value })),
        );
        let seqs = self
            .store
            .append(&id, events.iter().cloned().map(NewEvent::new).collect())
            .await?;
        // Another start with the same id got there first.
        if seqs.first() != Some(&1) {
            return Err(ExecError::AlreadyExists { execution_id: id });
        }
        let mut run = Run {
            id: id.clone(),
            hooks,
            workflow: Arc::new(workflow),
            log: ExecutionLog::new(id.clone()),
            limits,
            descendants: tree_budget::Spent::default(),
            staging: None,
            watch: None,
        };
        self.absorb(&mut run, &seqs, events).await?;
        self.drive_within_time(&mut run).await
    }

    /// Continues a run from its log: finished steps are not run again; the step that was
    /// running (or failed) runs anew. A completed run is returned as it is; a cancelled one
    /// (or one whose cancellation was asked for) is not run again.
    pub async fn resume(&self, execution_id: &str) -> Result<RunOutcome, ExecError> {
        self.resume_within(execution_id, RunLimits::default()).await
    }

    /// [`Executor::resume`] with the run's limits held under `within` (what its parent has
    /// left, for a sub-workflow).
    pub(crate) async fn resume_within(
        &self,
        execution_id: &str,
        within: RunLimits,
    ) -> Result<RunOutcome, ExecError> {
        let log = self.load(execution_id).await?;
        let start = log.start().cloned().ok_or_else(|| ExecError::NotFound {
            execution_id: execution_id.to_owned(),
        })?;
        match log.end().map(|end| end.status) {
            Some(RunStatus::Completed) => return Ok(outcome(execution_id, &log)),
            Some(RunStatus::Cancelled) => {
                return Err(ExecError::Cancelled {
                    execution_id: execution_id.to_owned(),
                    reason: log
                        .cancel_requested()
                        .and_then(|c| c.reason.clone())
                        .unwrap_or_else(|| "cancelled".to_owned()),
                });
            }
            _ => {}
        }
        let workflow = Workflow::load(&start.workflow_text, &start.workflow_file)?;
        let programs = Programs::for_run(&self.programs, origin_of(&start));
        self.check_runnable(&workflow, &start.workflow_file, &programs)?;
        let limits = start
            .limits
            .overridden_by(self.limits)
            .capped_by(self.caps)
            .capped_by(within);
        let mut run = Run {
            id: execution_id.to_owned(),
            hooks: self.hooks_of(&workflow, &start.workflow_file)?,
            workflow: Arc::new(workflow),
            limits,
            descendants: if tree_budget::bounds_tree(limits) {
                self.descendants_spent(&log).await?
            } else {
                tree_budget::Spent::default()
            },
            log,
            staging: None,
            watch: None,
        };
        if let Some(request_id) = run.log.thread().in_flight().map(str::to_owned) {
            let end = RequestEnd::failed(
                request_id,
                "interrupted: the run stopped before the reply was recorded",
            );
            self.append(&mut run, vec![EventKind::RequestEnded(end)])
                .await?;
        }
        self.drive_within_time(&mut run).await
    }

    /// [`Executor::drive`] under the run's wall-clock limit: when it passes, the run is
    /// cancelled through the store like any cancellation, so its steps end the way a
    /// cancel ends them (open tool calls answered, `run_ended` recorded).
    async fn drive_within_time(&self, run: &mut Run) -> Result<RunOutcome, ExecError> {
        let Some(seconds) = run.limits.max_seconds else {
            return self.drive(run).await;
        };
        let id = run.id.clone();
        let deadline = tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0)));
        let drive = self.drive(run);
        tokio::pin!(deadline, drive);
        tokio::select! {
            outcome = &mut drive => return outcome,
            () = &mut deadline => {}
        }
        self.cancel(
            &id,
            Some(format!(
                "wall-clock limit reached: the run may take {seconds} s"
            )),
        )
        .await?;
        drive.await
    }

    /// Cancels an execution and all its descendants (through the store, so a run in another
    /// process stops too): each gets a `cancel_requested` event; a run that is not running
    /// (it failed) ends as cancelled at once. Returns the executions newly marked, the given
    /// one first.
    pub async fn cancel(
        &self,
        execution_id: &str,
        reason: Option<String>,
    ) -> Result<Vec<String>, ExecError> {
        let mut marked = Vec::new();
        let mut queue = vec![execution_id.to_owned()];
        while let Some(id) = queue.pop() {
            let log = match self.load(&id).await {
                Ok(log) => log,
                // A child its parent named but never started: nothing to cancel.
                Err(ExecError::NotFound { .. }) if id != execution_id => continue,
                Err(other) => return Err(other),
            };
            queue.extend(log.children().iter().rev().cloned());
            if log.is_over() || log.cancel_requested().is_some() {
                continue;
            }
            let mut events = vec![EventKind::CancelRequested(CancelRequest {
                reason: reason.clone(),
                cascaded_from: (id != execution_id).then(|| execution_id.to_owned()),
            })];
            if log.end().is_some() {
                events.push(EventKind::RunEnded(RunEnd {
                    status: RunStatus::Cancelled,
                    output: None,
                    error: Some(cancel_text(reason.as_deref())),
                }));
            }
            self.store
                .append(&id, events.into_iter().map(NewEvent::new).collect())
                .await?;
            marked.push(id);
        }
        Ok(marked)
    }

    /// The fold of an execution's log.
    pub async fn load(&self, execution_id: &str) -> Result<ExecutionLog, ExecError> {
        let events = self
            .store
            .events(execution_id)
            .await
            .map_err(|error| match error {
                contexture_store::StoreError::NotFound { .. } => ExecError::NotFound {
                    execution_id: execution_id.to_owned(),
                },
                other => ExecError::Store(other),
            })?;
        if events.is_empty() {
            return Err(ExecError::NotFound {
                execution_id: execution_id.to_owned(),
            });
        }
        ExecutionLog::replay(execution_id, events).map_err(|source| ExecError::Log {
            execution_id: execution_id.to_owned(),
            source,
        })
    }

    /// The hooks of a run of `workflow` (from `file`): its hook programs, then the
    /// executor's.
    fn hooks_of(&self, workflow: &Workflow, file: &str) -> Result<Vec<Arc<dyn Hook>>, ExecError> {
        let mut hooks: Vec<Arc<dyn Hook>> = Vec::with_capacity(workflow.hooks.len());
        for (index, spec) in workflow.hooks.iter().enumerate() {
            let hook =
                ProgramHook::new(spec.clone()).map_err(|problem| ExecError::NotRunnable {
                    file: file.to_owned(),
                    problems: vec![format!("hooks[{index}]: {problem}")],
                })?;
            hooks.push(Arc::new(hook));
        }
        hooks.extend(self.hooks.iter().cloned());
        Ok(hooks)
    }

    /// Problems that would stop the workflow before or during its run, found up front.
    fn check_runnable(
        &self,
        workflow: &Workflow,
        file: &str,
        programs: &Programs,
    ) -> Result<(), ExecError> {
        let mut problems: Vec<String> = workflow
            .tools
            .iter()
            .filter_map(|tool| self.tools.check(tool).err())
            .collect();
        problems.extend(
            crate::workflow::program_refusals(workflow, programs)
                .into_iter()
                .map(|(_, problem)| problem),
        );
        if !workflow.mcp_servers.is_empty() {
            problems.push(format!(
                "mcp_servers are declared ({}), but running MCP servers is not supported yet; remove them to run",
                workflow
                    .mcp_servers
                    .iter()
                    .map(|m| &*m.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ExecError::NotRunnable {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// Runs steps until the workflow ends or a step fails.
    async fn drive(&self, run: &mut Run) -> Result<RunOutcome, ExecError> {
        loop {
            self.refresh(run).await?;
            if let Some(request) = run.log.cancel_requested().cloned() {
                return Err(self.end_cancelled(run, &request).await);
            }
            match run.log.position().clone() {
                Position::Start => {
                    let first = run.workflow.states[0].id.clone();
                    self.run_state(run, first, step::Work::Plain).await?;
                }
                Position::State(id) => self.run_state(run, id, step::Work::Plain).await?,
                Position::Iteration(iteration) => {
                    let state = iteration.state_id.clone();
                    let workflow = run.workflow.clone();
                    let at_once = iteration.concurrency > 1
                        && iteration.items.len() > iteration.done.len() + 1
                        && workflow
                            .state(&state)
                            .is_some_and(|s| !items::one_at_a_time(run, &workflow, s));
                    if at_once {
                        self.run_items_at_once(run, iteration).await?;
                    } else {
                        self.run_state(run, state, step::Work::item(iteration))
                            .await?;
                    }
                }
                Position::End => {
                    let output = run.log.last_output().unwrap_or_default().to_owned();
                    if let Some(thread) = run.log.start().and_then(|s| s.conversation.clone()) {
                        let input = run.log.start().map(|s| s.input.clone()).unwrap_or_default();
                        self.store
                            .append(&thread, conversation::turns(&run.id, &input, &output))
                            .await?;
                    }
                    self.append(
                        run,
                        vec![EventKind::RunEnded(RunEnd {
                            status: RunStatus::Completed,
                            output: Some(output),
                            error: None,
                        })],
                    )
                    .await?;
                    return Ok(outcome(&run.id, &run.log));
                }
            }
        }
    }

    /// Appends `events` to the run's log in one transaction and folds them in.
    pub(crate) async fn append(
        &self,
        run: &mut Run,
        events: Vec<EventKind>,
    ) -> Result<(), ExecError> {
        if run.staging.is_some() {
            return events.into_iter().try_for_each(|kind| run.hold(kind));
        }
        let seqs = self
            .store
            .append(&run.id, events.iter().cloned().map(NewEvent::new).collect())
            .await?;
        self.absorb(run, &seqs, events).await
    }

    /// Folds events the store acknowledged at `seqs`. When another writer appended in
    /// between (the seqs do not follow the fold), the fold catches up from the store.
    async fn absorb(
        &self,
        run: &mut Run,
        seqs: &[u64],
        events: Vec<EventKind>,
    ) -> Result<(), ExecError> {
        let expected = run.log.thread().last_seq() + 1;
        let in_order = seqs
            .iter()
            .enumerate()
            .all(|(n, seq)| *seq == expected + n as u64);
        let fold = |run: &mut Run, event: Event| {
            if let Some(observer) = &self.observer {
                observer.on_event(&run.id, &event);
            }
            run.log.apply(event).map_err(|source| ExecError::Log {
                execution_id: run.id.clone(),
                source,
            })
        };
        if in_order {
            for (seq, kind) in seqs.iter().zip(events) {
                fold(run, Event::new(*seq, kind))?;
            }
        } else {
            let last = run.log.thread().last_seq();
            for event in self.store.events(&run.id).await? {
                if event.seq > last {
                    fold(run, event)?;
                }
            }
        }
        Ok(())
    }
}

impl<S: Store> Executor<S> {
    /// Folds in what other writers appended to the run's log (a cancellation, say).
    pub(crate) async fn refresh(&self, run: &mut Run) -> Result<(), ExecError> {
        if run.staging.is_some() {
            // An item's copy holds events the store has not seen, so it takes in only what
            // concerns it from other writers: a cancellation.
            for event in self.store.events_after(&run.id, run.store_seq()).await? {
                if let Some(staging) = &mut run.staging {
                    staging.store_seq = event.seq;
                }
                if let EventKind::CancelRequested(_) = event.kind {
                    run.see(event.kind)?;
                }
            }
            return Ok(());
        }
        let last = run.log.thread().last_seq();
        for event in self.store.events_after(&run.id, last).await? {
            if let Some(observer) = &self.observer {
                observer.on_event(&run.id, &event);
            }
            run.log.apply(event).map_err(|source| ExecError::Log {
                execution_id: run.id.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Resolves when a cancellation of `execution_id` is recorded after `after` (polling
    /// the store); never resolves otherwise.
    pub(crate) async fn cancellation(&self, execution_id: &str, mut after: u64) -> CancelRequest {
        loop {
            tokio::time::sleep(self.cancel_poll).await;
            // A store error here is not the call's business: the next poll tries again.
            if let Ok(events) = self.store.events_after(execution_id, after).await {
                for event in events {
                    after = event.seq;
                    if let EventKind::CancelRequested(request) = event.kind {
                        return request;
                    }
                }
            }
        }
    }

    /// Ends a run between steps as cancelled: calls left unanswered in the shared history
    /// get a synthetic result, then the run's end is recorded.
    async fn end_cancelled(&self, run: &mut Run, request: &CancelRequest) -> ExecError {
        let reason = cancel_text(request.reason.as_deref());
        let mut events = cancelled_results(&run.log.thread().projection().messages)
            .into_iter()
            .map(|message| EventKind::MessageAppended { message })
            .collect::<Vec<_>>();
        events.push(EventKind::RunEnded(RunEnd {
            status: RunStatus::Cancelled,
            output: None,
            error: Some(reason.clone()),
        }));
        if let Err(error) = self.append(run, events).await {
            return error;
        }
        ExecError::Cancelled {
            execution_id: run.id.clone(),
            reason,
        }
    }

    /// The recent history a run continuing the conversation `thread` starts with,
    /// compacting the conversation first when its policy's trigger fires.
    async fn conversation_history(
        &self,
        workflow: &Workflow,
        thread: &str,
        hooks: &[Arc<dyn Hook>],
    ) -> Result<Vec<Message>, ExecError> {
        let policy = &workflow.conversation;
        let model = workflow.assistants.first().map_or_else(
            || "gpt-4o".to_owned(),
            |a| self.router.route(&a.model).model,
        );
        let model = self.registry.resolve(&model);
        let mut target = match StoredThread::load(&self.store, thread).await {
            Ok(target) => target,
            Err(CompactionError::Store(contexture_store::StoreError::NotFound { .. })) => {
                return Ok(Vec::new());
            }
            Err(other) => return Err(other.into()),
        };
        if let Some(compaction) = &policy.compaction {
            let projection = target.thread().projection();
            let tokens: u64 = projection
                .to_messages()
                .iter()
                .map(|m| u64::from(model.counter.count_message(m)))
                .sum();
            if let Some(reason) =
                compaction
                    .trigger
                    .fires(tokens, projection.messages.len(), model.context_window)
            {
                let mut request = CompactRequest::new(compaction.clone(), reason);
                request.measure_model = model.id.clone();
                Compactor::new(self.router.clone(), self.registry.clone())
                    .with_hooks(hooks.to_vec())
                    .compact(&mut target, &request)
                    .await?;
            }
        }
        Ok(conversation::history(
            target.thread(),
            policy,
            &model.counter,
        ))
    }
}

/// What a cancellation's records say.
pub(crate) fn cancel_text(reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("cancelled: {reason}"),
        None => "cancelled".to_owned(),
    }
}

/// A synthetic "cancelled" result for each call in `messages` that has no result, so the
/// history stays valid for every provider.
pub(crate) fn cancelled_results(messages: &[Message]) -> Vec<Message> {
    let Some(last_turn) = messages.iter().rposition(|m| !m.tool_calls.is_empty()) else {
        return Vec::new();
    };
    let answered: Vec<&str> = messages[last_turn + 1..]
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    // Only an open turn at the end needs answers; one followed by other turns was repaired
    // or answered already.
    if messages[last_turn + 1..]
        .iter()
        .any(|m| m.tool_call_id.is_none())
    {
        return Vec::new();
    }
    messages[last_turn]
        .tool_calls
        .iter()
        .filter(|call| !answered.contains(&&*call.id))
        .map(|call| Message::tool_result(call.id.clone(), cancelled_result_text(&call.name)))
        .collect()
}

/// The outcome a log describes.
fn outcome(execution_id: &str, log: &ExecutionLog) -> RunOutcome {
    RunOutcome {
        execution_id: execution_id.to_owned(),
        output: log.last_output().unwrap_or_default().to_owned(),
        context: log.store(),
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
