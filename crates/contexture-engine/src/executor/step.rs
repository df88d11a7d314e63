//! Running one state: rendering its task, running what it runs (an assistant, a tool, a
//! transform), and recording its end. A failure is recorded (`step_failed`, `run_ended`)
//! before it is returned.

use std::sync::Arc;

use contexture_core::Message;
use contexture_core::context::Path;
use contexture_core::context::args::resolve_args;
use contexture_core::context::iter::plan_items;
use contexture_core::context::{ContextStore, MergePolicy, RenderIsolation, RenderOptions};
use contexture_core::thread::{
    DEFAULT_CONTEXT, EventKind, RunEnd, RunStatus, StepEnd, StepFailure, StepStart,
};
use serde_json::{Map, Value};

use super::error::{ExecError, StepError};
use super::log::{ExecutionLog, ItemResult, Iteration};
use super::transition::{Finishing, finish};
use super::{CHILD_SEPARATOR, Executor, Run, cancelled_results, origin_of};
use crate::hooks::{Hook, HookFailed, HookPoint, StepInfo};
use crate::tools::{ToolError, configured_arguments, is_context_manager};
use crate::workflow::{State, StepKind, Workflow, WorkflowOrigin};
use contexture_store::Store;

/// The model whose tokenizer measures a compaction a tool state runs (no assistant names
/// one there).
const DEFAULT_MEASURE_MODEL: &str = "gpt-4o";

/// What a state run is part of.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// A state run once.
    Plain,
    /// One item of an iteration.
    Item {
        /// Its position.
        index: usize,
        /// The item.
        value: Value,
        /// How many items there are.
        total: usize,
        /// The items finished before it.
        done: Vec<ItemResult>,
        /// How the items' outputs come together.
        merge: MergePolicy,
        /// The only context keys the item's run sees (with its own); `None` for all.
        keys: Option<Vec<String>>,
    },
    /// An iteration over an empty list: the state runs no item and its transition is taken
    /// at once.
    NoItems,
}

impl Work {
    /// The work of an iteration's next item, with the results of the items before it.
    pub(crate) fn item(mut iteration: Iteration) -> Work {
        let index = iteration.done.len();
        let done = std::mem::take(&mut iteration.done);
        Work::item_at(&iteration, index, done)
    }

    /// The work of item `index` of `iteration`, `done` the results it carries (an item run
    /// alongside earlier ones carries none: its end is recorded once theirs are, through
    /// [`Work::item`]).
    pub(crate) fn item_at(iteration: &Iteration, index: usize, done: Vec<ItemResult>) -> Work {
        match iteration.items.get(index) {
            Some(value) => Work::Item {
                index,
                value: value.clone(),
                total: iteration.items.len(),
                done,
                merge: iteration.merge,
                keys: iteration.keys.clone(),
            },
            None => Work::NoItems,
        }
    }

    fn item_index(&self) -> Option<usize> {
        match self {
            Work::Item { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// One step as it runs, built once when it starts. The run it belongs to (its log and
/// limits) travels beside it rather than in it, as the step appends to the run.
pub(crate) struct StepContext<'a> {
    /// The step as the hooks see it.
    pub info: StepInfo,
    /// The workflow the run executes.
    pub workflow: &'a Workflow,
    /// The state the step runs.
    pub state: &'a State,
    /// What the state runs.
    pub kind: StepKind<'a>,
    /// What the step's templates render against: an item's context store, in an
    /// iteration.
    pub store: ContextStore,
    /// How the step's templates render.
    pub options: RenderOptions,
    /// The tool loop an interrupted attempt of this same step recorded (its process
    /// stopped before the step ended): an assistant step goes on from it instead of
    /// calling the model for those turns again.
    pub carried: Vec<Message>,
}

/// A step's task, a tool state's arguments, or a sub-workflow's child, worked out before
/// the step is recorded.
pub(crate) struct StepInput {
    task: Option<String>,
    arguments: Option<Map<String, Value>>,
    child: Option<ChildPlan>,
}

/// The child execution a sub-workflow step runs.
#[derive(Debug, Clone)]
pub(crate) struct ChildPlan {
    /// Its id: the parent's, the state and its visit (and the item, in an iteration), so a
    /// resumed parent finds the child it had started.
    pub id: String,
    /// What it receives: a string, or an object from an input mapping.
    pub input_value: Value,
}

impl ChildPlan {
    /// The child's input text.
    pub fn input_text(&self) -> String {
        match &self.input_value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}

/// What a sub-workflow state hands its child: the parent's last message, a state's last
/// output, or an object built from dotted paths into the parent's context. Nothing else.
fn child_input(
    state: &State,
    store: &ContextStore,
    log: &ExecutionLog,
) -> Result<Value, StepError> {
    let input = state.input.clone().unwrap_or_default();
    if let Some(mapping) = &input.mapping {
        let mut object = Map::new();
        for (key, path) in mapping {
            let parsed = Path::parse(path).map_err(|error| {
                StepError::SubWorkflowInput(format!("invalid path `{path}`: {}", error.reason))
            })?;
            let value = store.lookup(&parsed).ok_or_else(|| {
                StepError::SubWorkflowInput(format!(
                    "`{key}` maps `{path}`, which is not in the context (its keys: {})",
                    if store.is_empty() {
                        "none".to_owned()
                    } else {
                        store.keys().collect::<Vec<_>>().join(", ")
                    }
                ))
            })?;
            object.insert(key.clone(), value.clone());
        }
        return Ok(Value::Object(object));
    }
    if let Some(source) = &input.state {
        return log
            .output_of(source)
            .map(|output| Value::String(output.to_owned()))
            .ok_or_else(|| {
                StepError::SubWorkflowInput(format!(
                    "state `{source}` has not run in this execution yet"
                ))
            });
    }
    Ok(Value::String(
        log.thread()
            .projection()
            .messages
            .last()
            .map(Message::text)
            .unwrap_or_default(),
    ))
}

/// A step run to its output, its end not yet recorded.
pub(crate) struct Ran {
    /// The step.
    pub info: StepInfo,
    /// Its task, output and child, as the shared history and the iteration take them.
    pub exchange: ItemResult,
    /// The context store when it started: its transition writes to it.
    pub store: ContextStore,
    /// Where its templates render, for the transition's.
    pub isolation: Option<Arc<dyn RenderIsolation>>,
    /// The fork it ran on, for a state run on a fork: its end is recorded there, then merged.
    pub fork: Option<Run>,
}

/// Why a step stopped: a step error is recorded in the log; an execution error (the store
/// failed) is returned as it is.
pub(crate) enum Abort {
    Step(StepError),
    Exec(ExecError),
}

impl From<StepError> for Abort {
    fn from(error: StepError) -> Abort {
        Abort::Step(error)
    }
}

impl From<HookFailed> for Abort {
    fn from(failed: HookFailed) -> Abort {
        Abort::Step(StepError::Hook(failed))
    }
}

impl From<ExecError> for Abort {
    fn from(error: ExecError) -> Abort {
        match error {
            // A hook that fails at a compaction within a step fails the step, as at its
            // other points.
            ExecError::Hook(failed) => Abort::Step(StepError::Hook(failed)),
            error => Abort::Exec(error),
        }
    }
}

impl<S: Store> Executor<S> {
    /// Runs `state_id` as `work` and records its end (or its failure).
    pub(crate) async fn run_state(
        &self,
        run: &mut Run,
        state_id: String,
        work: Work,
    ) -> Result<(), ExecError> {
        let ran = self.run_step(run, &state_id, &work).await?;
        self.finish_step(run, ran, work).await
    }

    /// Starts a step of `state_id` as `work` and runs it to its output, its exit hooks
    /// passed; its end is left to [`Executor::finish_step`]. A failure is recorded.
    pub(crate) async fn run_step(
        &self,
        run: &mut Run,
        state_id: &str,
        work: &Work,
    ) -> Result<Ran, ExecError> {
        let state_id = state_id.to_owned();
        let workflow = run.workflow.clone();
        let state = workflow
            .state(&state_id)
            .ok_or_else(|| ExecError::UnknownState {
                execution_id: run.id.clone(),
                state_id: state_id.clone(),
            })?;
        let step = run.next_step();
        // Sub-workflows' steps count against the run's limit too.
        if let Some(max) = run.limits.max_steps
            && run.tree_spent().steps + 1 > max
        {
            let error = StepError::StepLimit { max };
            self.append(
                run,
                vec![EventKind::RunEnded(RunEnd {
                    status: RunStatus::Failed,
                    output: None,
                    error: Some(error.to_string()),
                })],
            )
            .await?;
            return Err(ExecError::StepFailed {
                execution_id: run.id.clone(),
                step,
                state_id,
                error: Box::new(error),
            });
        }
        let info = StepInfo {
            execution_id: run.id.clone(),
            step,
            state_id: state_id.clone(),
            item: work.item_index(),
        };
        let store = run.log.store();
        let mut options = self
            .render
            .clone()
            .with_missing(workflow.missing_variables)
            .with_user_context(run.log.start().and_then(|start| start.user_context.clone()));
        if run.log.start().map(origin_of) == Some(WorkflowOrigin::Client) {
            options = crate::system::for_client(options);
            if let Some(isolation) = &self.client_isolation {
                options = options.with_isolation(isolation.clone());
            }
        }
        let step_store = match work {
            Work::Item {
                index, value, keys, ..
            } => {
                options = options
                    .with_variable("item", value.clone())
                    .with_variable("item_index", Value::from(*index));
                plan_items(vec![value.clone()], &store, keys.as_deref())
                    .pop()
                    .map_or_else(|| store.clone(), |item| item.store)
            }
            _ => store.clone(),
        };

        let kind = workflow
            .step_kind(state)
            .ok_or_else(|| ExecError::NotRunnable {
                file: run
                    .log
                    .start()
                    .map(|s| s.workflow_file.clone())
                    .unwrap_or_default(),
                problems: vec![format!("state `{state_id}` runs nothing")],
            })?;
        let mut current = StepContext {
            info,
            workflow: &workflow,
            state,
            kind,
            store: step_store,
            options,
            carried: Vec::new(),
        };
        let prepared = self.prepare_step(&current, work, &run.log, &run.hooks);
        let (task, arguments, child) = match &prepared {
            Ok(input) => (
                input.task.clone(),
                input.arguments.clone(),
                input.child.clone(),
            ),
            Err(_) => (None, None, None),
        };
        // A state run on a fork works on a fork of the run's thread taken just after its
        // start; the id names the step, so a re-run step gets a fork of its own.
        let fork_id = state
            .fork
            .as_ref()
            .map(|_| format!("{}{CHILD_SEPARATOR}{state_id}.fork.{step}", run.id));
        // The state's named context becomes the active one with the step's start (no
        // request is in flight between steps, so it applies at once).
        // The step an interrupted run left open, of this state (and item) with this task,
        // goes on where its tool loop stopped. Not a step on a fork or an item run alongside
        // others: those start over.
        if fork_id.is_none()
            && run.staging.is_none()
            && let (Some(open), Some(messages)) =
                (run.log.open_step(), run.log.open_step_messages())
            && open.state_id == state_id
            && open.item == current.info.item
            && open.task == task
            && open.fork_thread.is_none()
        {
            current.carried = messages.to_vec();
        }
        let named = state.thread_context.as_deref().unwrap_or(DEFAULT_CONTEXT);
        let mut started = Vec::with_capacity(2);
        if run.log.thread().active_context() != named {
            let switch = EventKind::ContextSwitched {
                context: named.to_owned(),
                op_id: Some(format!("{}/step-{step}/context", run.id)),
            };
            if run.staging.as_ref().is_some_and(|s| s.earlier_items > 0) {
                // An item running alongside earlier ones: the earliest records the switch,
                // so the log holds one whatever the timing; this one only sees it.
                run.see(switch)?;
            } else {
                started.push(switch);
            }
        }
        started.push(EventKind::StepStarted(StepStart {
            step,
            state_id: state_id.clone(),
            item: current.info.item,
            task: task.clone(),
            arguments: match &child {
                Some(child) => Some(child.input_value.clone()),
                None => arguments.clone().map(Value::Object),
            },
            child_execution_id: child.as_ref().map(|c| c.id.clone()),
            fork_thread: fork_id.clone(),
        }));
        self.append(run, started).await?;

        let mut fork = match (&fork_id, &prepared) {
            (Some(id), Ok(_)) => Some(self.fork_run(run, id).await?),
            _ => None,
        };
        let result = match prepared {
            Err(error) => Err(Abort::Step(error)),
            Ok(_) if matches!(work, Work::NoItems) => Ok(None),
            Ok(_) => {
                let on = match fork.as_mut() {
                    Some(fork) => fork,
                    None => &mut *run,
                };
                self.execute(on, &current, task.as_deref(), arguments, child.as_ref())
                    .await
                    .map(Some)
            }
        };
        let output = match result {
            Ok(output) => output,
            Err(Abort::Exec(error)) => return Err(error),
            Err(Abort::Step(error)) => {
                return Err(self
                    .fail_forked(run, fork.as_ref(), &current.info, error)
                    .await);
            }
        };
        let output = match output.map(|output| {
            run.hooks.iter().try_fold(output, |output, hook| {
                hook.on_step_exit(&current.info, output)
                    .map_err(|error| HookFailed::new(&**hook, HookPoint::OnStepExit, error))
            })
        }) {
            None => None,
            Some(Ok(output)) => Some(output),
            Some(Err(failed)) => {
                return Err(self.fail(run, &current.info, StepError::Hook(failed)).await);
            }
        };

        let own = output.unwrap_or_else(|| "[]".to_owned());
        Ok(Ran {
            exchange: ItemResult {
                task,
                output: own,
                child_execution_id: child.map(|c| c.id),
            },
            store,
            isolation: current.options.isolation.clone(),
            info: current.info,
            fork,
        })
    }

    /// Records the end of a step [`Executor::run_step`] ran: its transition (for the last
    /// item of an iteration, the iteration's, with every item's result), or its failure.
    pub(crate) async fn finish_step(
        &self,
        run: &mut Run,
        mut ran: Ran,
        work: Work,
    ) -> Result<(), ExecError> {
        let workflow = run.workflow.clone();
        let state = workflow
            .state(&ran.info.state_id)
            .ok_or_else(|| ExecError::UnknownState {
                execution_id: run.id.clone(),
                state_id: ran.info.state_id.clone(),
            })?;
        // A step run on a fork ends there, then comes back by the merge.
        let mut fork = ran.fork.take();
        let on: &Run = fork.as_ref().unwrap_or(run);
        let history = on.log.thread().projection().messages;
        let context = on.log.thread().active_context().to_owned();
        let last_seq = on.log.thread().last_seq();
        let execution_id = on.id.clone();
        let step = ran.info.step;
        let at = Finishing {
            execution_id: &execution_id,
            step,
            state,
            item: ran.info.item,
            output: &ran.exchange.output,
            store: &ran.store,
            history: &history,
            last_seq,
            context: &context,
            isolation: ran.isolation.as_deref(),
        };
        let events = match work {
            Work::Plain => finish(&at, std::slice::from_ref(&ran.exchange), None),
            Work::NoItems => finish(&at, &[], Some(MergePolicy::LastWins)),
            Work::Item { index, total, .. } if index + 1 < total => {
                Ok(vec![EventKind::StepFinished(StepEnd {
                    step,
                    state_id: state.id.clone(),
                    item: Some(index),
                    output: ran.exchange.output.clone(),
                    next: None,
                    items: None,
                    merge: None,
                    item_keys: None,
                    item_concurrency: None,
                })])
            }
            Work::Item {
                mut done, merge, ..
            } => {
                done.push(ran.exchange.clone());
                finish(&at, &done, Some(merge))
            }
        };
        let events = match events {
            Ok(events) => events,
            Err(error) => return Err(self.fail_forked(run, fork.as_ref(), &ran.info, error).await),
        };
        let (Some(fork), Some(settings)) = (fork.as_mut(), state.fork.as_ref()) else {
            return self.append(run, events).await;
        };
        let end = events.iter().rev().find_map(|event| match event {
            EventKind::StepFinished(end) => Some(end.clone()),
            _ => None,
        });
        self.append(fork, events).await?;
        let Some(end) = end else {
            return Err(ExecError::UnknownState {
                execution_id: run.id.clone(),
                state_id: state.id.clone(),
            });
        };
        match self.merge_fork(run, fork, settings, end).await {
            Ok(()) => Ok(()),
            Err(Abort::Exec(error)) => Err(error),
            Err(Abort::Step(error)) => {
                Err(self.fail_forked(run, Some(fork), &ran.info, error).await)
            }
        }
    }

    /// The step's task (rendered, then passed through the hooks); for a tool state, the
    /// configured arguments it calls the tool with; for a sub-workflow state, the child's
    /// id and input.
    fn prepare_step(
        &self,
        step: &StepContext<'_>,
        work: &Work,
        log: &ExecutionLog,
        hooks: &[Arc<dyn Hook>],
    ) -> Result<StepInput, StepError> {
        let StepContext {
            info,
            state,
            store,
            options,
            ..
        } = step;
        if let StepKind::Workflow(_) = step.kind {
            let execution_id = &info.execution_id;
            let mut part = format!("{}.{}", state.id, log.visits(&state.id) + 1);
            if let Some(item) = info.item {
                part.push_str(&format!(".{item}"));
            }
            // A child an earlier release started (its id separated by `/`) is resumed, not
            // started again under the new name.
            let earlier = format!("{execution_id}/{part}");
            let id = if log.children().contains(&earlier) {
                earlier
            } else {
                format!("{execution_id}{CHILD_SEPARATOR}{part}")
            };
            let input_value = child_input(state, store, log)?;
            return Ok(StepInput {
                task: None,
                arguments: None,
                child: Some(ChildPlan { id, input_value }),
            });
        }
        let task = match (&state.task, work) {
            (Some(task), _) if state.resolve_dynamic_values_in_prompt => Some(
                task.render(store, options)
                    .map_err(|error| StepError::Template {
                        place: "the task".into(),
                        error,
                    })?
                    .text,
            ),
            (Some(task), _) => Some(task.template.clone()),
            // An item with no task is handed over as the step's user turn.
            (None, Work::Item { value, .. }) => Some(match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            }),
            (None, _) => None,
        };
        let task = hooks.iter().try_fold(task, |task, hook| {
            hook.on_step_enter(info, task)
                .map_err(|error| HookFailed::new(&**hook, HookPoint::OnStepEnter, error))
        })?;
        let arguments = match step.kind {
            StepKind::Tool(tool) => Some(
                configured_arguments(tool, state.tool_args.as_ref(), store, options).map_err(
                    |error| StepError::Template {
                        place: format!("argument `{}` of tool `{}`", error.argument, tool.id),
                        error: error.error,
                    },
                )?,
            ),
            _ => None,
        };
        Ok(StepInput {
            task,
            arguments,
            child: None,
        })
    }

    /// Runs what the state runs and returns its output.
    async fn execute(
        &self,
        run: &mut Run,
        step: &StepContext<'_>,
        task: Option<&str>,
        arguments: Option<Map<String, Value>>,
        child: Option<&ChildPlan>,
    ) -> Result<String, Abort> {
        let StepContext {
            info,
            store,
            options,
            ..
        } = step;
        match step.kind {
            StepKind::Workflow(reference) => {
                let child = child.ok_or_else(|| StepError::SubWorkflow {
                    workflow: reference.to_owned(),
                    child: String::new(),
                    error: "no child execution was planned".to_owned(),
                })?;
                let state = run
                    .workflow
                    .clone()
                    .state(&info.state_id)
                    .cloned()
                    .ok_or_else(|| ExecError::UnknownState {
                        execution_id: run.id.clone(),
                        state_id: info.state_id.clone(),
                    })?;
                self.run_child(run, &state, reference, child).await
            }
            StepKind::Assistant(assistant) => self.run_assistant(run, step, assistant, task).await,
            StepKind::Tool(tool) if is_context_manager(tool) => Ok(self
                .context_manager(
                    run,
                    None,
                    &arguments.unwrap_or_default(),
                    DEFAULT_MEASURE_MODEL,
                    info.step,
                    None,
                )
                .await
                .map_err(|message| {
                    StepError::Tool(ToolError {
                        tool: tool.id.clone(),
                        message,
                    })
                })?),
            StepKind::Tool(tool) => {
                let (id, seq) = run.cancel_source();
                tokio::select! {
                    biased;
                    result = self.tools.run(tool, arguments.unwrap_or_default(), store, options) => {
                        Ok(result.map_err(StepError::Tool)?)
                    }
                    request = self.cancellation(&id, seq) => {
                        Err(StepError::Cancelled { reason: request.reason }.into())
                    }
                }
            }
            StepKind::Transform(values) => Ok(transform(values, store, options)?),
        }
    }

    /// Records a step's failure ([`Executor::fail`]), after what its `fork` spent, when it
    /// ran on one ([`Executor::account_fork`]).
    async fn fail_forked(
        &self,
        run: &mut Run,
        fork: Option<&Run>,
        info: &StepInfo,
        error: StepError,
    ) -> ExecError {
        if let Some(fork) = fork
            && let Err(error) = self.account_fork(run, fork).await
        {
            return error;
        }
        self.fail(run, info, error).await
    }

    /// Records a step's failure and the run's end (failed, or cancelled), and returns the
    /// error to report. Calls left unanswered in the shared history by a cancellation get a
    /// synthetic result first.
    async fn fail(&self, run: &mut Run, info: &StepInfo, error: StepError) -> ExecError {
        let message = error.to_string();
        let cancelled = matches!(error, StepError::Cancelled { .. });
        let mut events: Vec<EventKind> = if cancelled {
            cancelled_results(&run.log.thread().projection().messages)
                .into_iter()
                .map(|message| EventKind::MessageAppended { message })
                .collect()
        } else {
            Vec::new()
        };
        events.push(EventKind::StepFailed(StepFailure {
            step: info.step,
            state_id: info.state_id.clone(),
            error: message.clone(),
        }));
        events.push(EventKind::RunEnded(RunEnd {
            status: if cancelled {
                RunStatus::Cancelled
            } else {
                RunStatus::Failed
            },
            output: None,
            error: Some(message),
        }));
        let recorded = self.append(run, events).await;
        match recorded {
            Err(store_error) => store_error,
            Ok(()) => ExecError::StepFailed {
                execution_id: run.id.clone(),
                step: info.step,
                state_id: info.state_id.clone(),
                error: Box::new(error),
            },
        }
    }
}

/// A transform state's output: its values with their templates rendered (a lone
/// `{{ path }}` keeps its JSON type), as one JSON object.
fn transform(
    values: &Map<String, Value>,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<String, StepError> {
    let resolved = resolve_args(values, store, options).map_err(|error| StepError::Template {
        place: format!("transform value `{}`", error.argument),
        error: error.error,
    })?;
    Ok(Value::Object(resolved.args).to_string())
}
