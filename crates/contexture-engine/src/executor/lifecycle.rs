//! A run's lifecycle: validated and started, resumed from its log, cancelled (with its
//! descendants), loaded; the checks before it runs and the conversation history it starts with.

use std::sync::Arc;

use contexture_core::Message;
use contexture_core::context::ContextStore;
use contexture_core::thread::{
    CancelRequest, EventKind, RequestEnd, RunEnd, RunLimits, RunStart, RunStatus, StoreChange,
};
use contexture_store::{NewEvent, Store};

use crate::compaction::{
    CompactRequest, CompactionError, CompactionTarget, Compactor, StoredThread,
};
use crate::conversation::{self, ConversationKey};
use crate::hooks::{Hook, ProgramHook};
use crate::system::new_id;
use crate::workflow::{Programs, Workflow, WorkflowOrigin};

use super::{
    ExecError, ExecutionLog, Executor, Run, RunOutcome, RunRequest, cancel_text, origin_of,
    outcome, tree_budget,
};

impl<S: Store> Executor<S> {
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

    /// Starts a run and drives it to its end.
    pub async fn start(&self, request: RunRequest) -> Result<RunOutcome, ExecError> {
        self.begin(request, None, RunLimits::default()).await
    }

    /// Writes the start of a run to its log (its workflow, input, limits, and the history
    /// of the conversation it continues) without running a step, and returns its id: a
    /// queued run, which [`Executor::resume`] then runs from its first step wherever it is
    /// taken up.
    pub async fn open(&self, request: RunRequest) -> Result<String, ExecError> {
        let run = self.open_run(request, None, RunLimits::default()).await?;
        Ok(run.id)
    }

    /// Starts a run, as a child of `parent` when given, its limits held under `within`
    /// (what the parent has left).
    pub(crate) async fn begin(
        &self,
        request: RunRequest,
        parent: Option<String>,
        within: RunLimits,
    ) -> Result<RunOutcome, ExecError> {
        let mut run = self.open_run(request, parent, within).await?;
        self.drive_and_close(&mut run).await
    }

    /// Writes the start of a run to its log and gives the run, ready to drive.
    async fn open_run(
        &self,
        request: RunRequest,
        parent: Option<String>,
        within: RunLimits,
    ) -> Result<Run, ExecError> {
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
            mcp: Arc::default(),
        };
        self.absorb(&mut run, &seqs, events).await?;
        Ok(run)
    }

    /// Continues a run from its log: finished steps are not run again; a failed step runs
    /// anew; the step that was running when the run stopped starts again with the tool loop
    /// it recorded (the model's turns of it are not asked for again, its tool calls without
    /// a result run, and its call that was in flight is recorded as interrupted and made
    /// again). A completed run is returned as it is; a cancelled one (or one whose
    /// cancellation was asked for) is not run again.
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
                    reason: log.cancel_requested().and_then(|c| c.reason.clone()),
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
            mcp: Arc::default(),
        };
        if let Some(request_id) = run.log.thread().in_flight().map(str::to_owned) {
            let end = RequestEnd::failed(
                request_id,
                "interrupted: the run stopped before the reply was recorded",
            );
            self.append(&mut run, vec![EventKind::RequestEnded(end)])
                .await?;
        }
        self.drive_and_close(&mut run).await
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

    /// Ends as cancelled a run whose cancellation was asked for before any of its steps
    /// started (a queued run nobody took): it will never run, so its log says so now.
    /// Returns false, and writes nothing, when it started a step, ended, or was not asked to
    /// cancel.
    pub async fn end_cancelled_before_start(&self, execution_id: &str) -> Result<bool, ExecError> {
        let log = self.load(execution_id).await?;
        let Some(request) = log.cancel_requested() else {
            return Ok(false);
        };
        if log.end().is_some() || log.steps_started() > 0 {
            return Ok(false);
        }
        let end = RunEnd {
            status: RunStatus::Cancelled,
            output: None,
            error: Some(cancel_text(request.reason.as_deref())),
        };
        self.store
            .append(execution_id, vec![NewEvent::new(EventKind::RunEnded(end))])
            .await?;
        Ok(true)
    }

    /// Ends as failed a run that was opened ([`Executor::open`]) but could not be queued
    /// for a worker to take, `reason` saying why: no worker will ever run it, so its log
    /// says it ended rather than leaving it to look like a run that waits.
    pub async fn end_unqueued(&self, execution_id: &str, reason: &str) -> Result<(), ExecError> {
        let end = RunEnd {
            status: RunStatus::Failed,
            output: None,
            error: Some(format!("the run could not be queued: {reason}")),
        };
        self.store
            .append(execution_id, vec![NewEvent::new(EventKind::RunEnded(end))])
            .await?;
        Ok(())
    }

    /// Ends as failed, `reason` saying why, a run no server will go on with (it stopped
    /// on database errors more times than the server allows), and each of its sub-workflow
    /// runs that has not ended: their logs say they ended rather than leaving them to look
    /// like runs that wait. False, with nothing written, when the run had already ended.
    pub async fn end_failed(&self, execution_id: &str, reason: &str) -> Result<bool, ExecError> {
        let log = self.load(execution_id).await?;
        if log.end().is_some() {
            return Ok(false);
        }
        let mut children: Vec<String> = log.children().to_vec();
        while let Some(id) = children.pop() {
            let child = match self.load(&id).await {
                Ok(child) => child,
                // A child its parent named but never started.
                Err(ExecError::NotFound { .. }) => continue,
                Err(other) => return Err(other),
            };
            children.extend(child.children().iter().cloned());
            if child.end().is_none() {
                let end = RunEnd {
                    status: RunStatus::Failed,
                    output: None,
                    error: Some(format!("its parent run `{execution_id}` failed: {reason}")),
                };
                self.store
                    .append(&id, vec![NewEvent::new(EventKind::RunEnded(end))])
                    .await?;
            }
        }
        let end = RunEnd {
            status: RunStatus::Failed,
            output: None,
            error: Some(reason.to_owned()),
        };
        self.store
            .append(execution_id, vec![NewEvent::new(EventKind::RunEnded(end))])
            .await?;
        Ok(true)
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
    pub(super) fn hooks_of(
        &self,
        workflow: &Workflow,
        file: &str,
    ) -> Result<Vec<Arc<dyn Hook>>, ExecError> {
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

    /// The MCP servers `workflow` names that nobody declares: an assistant's name that is
    /// neither the workflow's nor the host's, and a declaration without `command` or `url`
    /// for which the host has no server.
    fn mcp_problems(&self, workflow: &Workflow) -> Vec<String> {
        let declared = || {
            let mut names: Vec<&str> = workflow
                .mcp_declarations()
                .filter(|(_, server)| !server.config.is_reference())
                .map(|(_, server)| &*server.name)
                .chain(self.tools.mcp_server_names())
                .collect();
            names.sort_unstable();
            names.dedup();
            if names.is_empty() {
                "none is declared".to_owned()
            } else {
                format!("declared: {}", names.join(", "))
            }
        };
        let mut problems = Vec::new();
        for (base, server) in workflow.mcp_declarations() {
            if server.config.is_reference() && self.tools.mcp_server(&server.name).is_none() {
                problems.push(format!(
                    "{base}: MCP server `{}` has no `config.command` or `config.url`, and the host declares no server of that name ({})",
                    server.name,
                    declared()
                ));
            }
        }
        for assistant in &workflow.assistants {
            for used in &assistant.mcp_servers {
                let name = used.name();
                if workflow.mcp_server(name).is_none() && self.tools.mcp_server(name).is_none() {
                    problems.push(format!(
                        "assistant `{}` names MCP server `{name}`, which neither the workflow's mcp_servers nor the host declares ({})",
                        assistant.id,
                        declared()
                    ));
                }
            }
        }
        problems
    }

    /// Problems that would stop the workflow before or during its run, found up front.
    pub(super) fn check_runnable(
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
        problems.extend(self.mcp_problems(workflow));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ExecError::NotRunnable {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// The recent history a run continuing the conversation `thread` starts with,
    /// compacting the conversation first when its policy's trigger fires.
    pub(super) async fn conversation_history(
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
