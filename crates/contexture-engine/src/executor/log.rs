//! An execution's log folded into where the run stands: the thread (shared history, context
//! store, usage) plus the step cursor. A resumed run starts from this fold, so it never
//! re-runs a finished step.

use contexture_core::Message;
use contexture_core::context::{ContextStore, MergePolicy, parse_output};
use std::collections::HashMap;

use contexture_core::thread::{
    CancelRequest, Event, EventKind, RunEnd, RunStart, RunStatus, StepFailure, StepStart, Thread,
    ThreadError, Usage,
};
use contexture_llm::SCRIPT_EXHAUSTED;
use serde_json::Value;

/// The end target of a transition.
const END: &str = crate::workflow::END;

/// One finished item of an iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemResult {
    /// The item's task as rendered.
    pub task: Option<String>,
    /// Its output.
    pub output: String,
    /// The child execution it ran, for a sub-workflow state.
    pub child_execution_id: Option<String>,
}

/// An iteration under way: one state run once per item.
#[derive(Debug, Clone, PartialEq)]
pub struct Iteration {
    /// The state each item runs.
    pub state_id: String,
    /// The items.
    pub items: Vec<Value>,
    /// The items finished so far, in order.
    pub done: Vec<ItemResult>,
    /// How the items' outputs come together.
    pub merge: MergePolicy,
    /// The only context keys each item's run sees (with the item's own); `None` for all.
    pub keys: Option<Vec<String>>,
    /// How many items may run at once (1: one after another).
    pub concurrency: u32,
}

/// What runs next.
#[derive(Debug, Clone, PartialEq)]
pub enum Position {
    /// Nothing has run yet: the first state runs next.
    Start,
    /// This state runs next.
    State(String),
    /// The next item of this iteration runs next.
    Iteration(Iteration),
    /// The workflow reached its end.
    End,
}

/// The fold of an execution's log.
#[derive(Debug, Clone)]
pub struct ExecutionLog {
    thread: Thread,
    start: Option<RunStart>,
    position: Position,
    steps_started: u64,
    requests_started: u64,
    script_exhausted: u64,
    open_step: Option<StepStart>,
    /// The open step's own messages as recorded (its tool loop), unless its loop was
    /// compacted: what a resumed step continues from.
    open_step_messages: Option<Vec<Message>>,
    last_output: Option<String>,
    failure: Option<StepFailure>,
    end: Option<RunEnd>,
    cost_usd: f64,
    /// A call spent tokens at no known price.
    cost_unknown: bool,
    cancel: Option<CancelRequest>,
    /// How many times each state has finished (an iteration counts once).
    visits: HashMap<String, u64>,
    /// Each state's last output.
    outputs: HashMap<String, String>,
    /// The child executions started, in order.
    children: Vec<String>,
}

/// A log that does not describe a run.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An event breaks the thread's rules.
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// The log does not start with `run_started`.
    #[error("the first event is `{found}`, not `run_started`: this thread is not an execution")]
    NotAnExecution {
        /// The first event's type.
        found: String,
    },
    /// A step ended that is not the one that started.
    #[error("event {seq}: step {step} ended, but step {open:?} is the one running")]
    StepMismatch {
        /// The event's seq.
        seq: u64,
        /// The step that ended.
        step: u64,
        /// The step running, if any.
        open: Option<u64>,
    },
}

impl ExecutionLog {
    /// An empty log for the execution `id`.
    pub fn new(id: impl Into<String>) -> ExecutionLog {
        ExecutionLog {
            thread: Thread::new(id),
            start: None,
            position: Position::Start,
            steps_started: 0,
            requests_started: 0,
            script_exhausted: 0,
            open_step: None,
            open_step_messages: None,
            last_output: None,
            failure: None,
            end: None,
            cost_usd: 0.0,
            cost_unknown: false,
            cancel: None,
            visits: HashMap::new(),
            outputs: HashMap::new(),
            children: Vec::new(),
        }
    }

    /// Folds a whole log.
    pub fn replay(
        id: impl Into<String>,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<ExecutionLog, LogError> {
        let mut log = ExecutionLog::new(id);
        for event in events {
            log.apply(event)?;
        }
        Ok(log)
    }

    /// Applies the next event.
    pub fn apply(&mut self, event: Event) -> Result<(), LogError> {
        let seq = event.seq;
        if self.start.is_none() && !matches!(event.kind, EventKind::RunStarted(_)) {
            return Err(LogError::NotAnExecution {
                found: event.kind.type_name().to_owned(),
            });
        }
        match &event.kind {
            EventKind::RunStarted(start) => {
                if self.start.is_some() {
                    return Err(LogError::NotAnExecution {
                        found: "a second run_started".to_owned(),
                    });
                }
                self.start = Some(start.clone());
            }
            EventKind::StepStarted(step) => {
                self.steps_started += 1;
                if let Some(child) = &step.child_execution_id
                    && !self.children.contains(child)
                {
                    self.children.push(child.clone());
                }
                self.open_step = Some(step.clone());
                self.open_step_messages = Some(Vec::new());
                self.failure = None;
                self.end = None;
            }
            EventKind::StepMessage(recorded) => {
                if self.open_step.as_ref().map(|s| s.step) == Some(recorded.step)
                    && let Some(messages) = &mut self.open_step_messages
                {
                    messages.push(recorded.message.clone());
                }
            }
            // A compacted loop is not continued: what it sends is no longer its messages.
            EventKind::StepCompacted(compaction)
                if self.open_step.as_ref().map(|s| s.step) == Some(compaction.step) =>
            {
                self.open_step_messages = None;
            }
            EventKind::StepFinished(step) => {
                self.open_step_messages = None;
                let open = self.open_step.take();
                if open.as_ref().map(|s| s.step) != Some(step.step) {
                    return Err(LogError::StepMismatch {
                        seq,
                        step: step.step,
                        open: open.map(|s| s.step),
                    });
                }
                let next = step.next.clone();
                if next.is_some() {
                    *self.visits.entry(step.state_id.clone()).or_default() += 1;
                }
                self.outputs
                    .insert(step.state_id.clone(), step.output.clone());
                match (step.item, &mut self.position) {
                    (Some(_), Position::Iteration(iteration)) => {
                        let (task, child_execution_id) = open
                            .map(|s| (s.task, s.child_execution_id))
                            .unwrap_or_default();
                        iteration.done.push(ItemResult {
                            task,
                            output: step.output.clone(),
                            child_execution_id,
                        });
                        if next.is_some() {
                            self.last_output = Some(combined_output(&iteration.done));
                        }
                    }
                    _ => self.last_output = Some(step.output.clone()),
                }
                if let Some(next) = next {
                    self.position = match &step.items {
                        _ if next == END => Position::End,
                        Some(items) => Position::Iteration(Iteration {
                            state_id: next,
                            items: items.clone(),
                            done: Vec::new(),
                            merge: step.merge.unwrap_or_default(),
                            keys: step.item_keys.clone(),
                            concurrency: step.item_concurrency.unwrap_or(1).max(1),
                        }),
                        None => Position::State(next),
                    };
                }
            }
            EventKind::StepFailed(failure) => {
                self.open_step = None;
                self.open_step_messages = None;
                self.failure = Some(failure.clone());
            }
            EventKind::RunEnded(end) => self.end = Some(end.clone()),
            EventKind::CancelRequested(request) if self.cancel.is_none() => {
                self.cancel = Some(request.clone());
            }
            EventKind::RequestStarted(_) => self.requests_started += 1,
            // A step run on a fork: its calls were recorded there, and are paid for here.
            EventKind::Merged(merge) => {
                self.cost_usd += merge.cost_usd.unwrap_or(0.0);
                self.cost_unknown |= merge.cost_unknown;
            }
            EventKind::RequestEnded(end) => {
                self.cost_usd += end.cost_usd.unwrap_or(0.0);
                self.cost_unknown |= end.known_cost_usd().is_none();
                if end
                    .error
                    .as_deref()
                    .is_some_and(|e| e.starts_with(SCRIPT_EXHAUSTED))
                {
                    self.script_exhausted += 1;
                }
            }
            _ => {}
        }
        self.thread.apply(event)?;
        Ok(())
    }

    /// The execution's thread: shared history, context store, usage.
    pub fn thread(&self) -> &Thread {
        &self.thread
    }

    /// How the run started (`None` only for an empty log).
    pub fn start(&self) -> Option<&RunStart> {
        self.start.as_ref()
    }

    /// What runs next.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// How many steps have started (a re-run step counts again).
    pub fn steps_started(&self) -> u64 {
        self.steps_started
    }

    /// How many LLM requests have started.
    pub fn requests_started(&self) -> u64 {
        self.requests_started
    }

    /// How many replies a scripted LLM has handed out: every request started, but those
    /// that found the script exhausted. A resumed scripted run skips this many.
    pub fn script_replies_used(&self) -> u64 {
        self.requests_started - self.script_exhausted
    }

    /// The LLM a resume of this run uses, and how many of a scripted LLM's replies to skip:
    /// `named` when one is named (from its first reply), else the one the run started with
    /// (`auto` when it recorded none), continuing a script after the replies the log used.
    pub fn resume_llm(&self, named: Option<&str>) -> (String, usize) {
        match named {
            Some(spec) => (spec.to_owned(), 0),
            None => (
                self.start()
                    .and_then(|start| start.llm.clone())
                    .unwrap_or_else(|| "auto".to_owned()),
                usize::try_from(self.script_replies_used()).unwrap_or(usize::MAX),
            ),
        }
    }

    /// The step that started and has neither finished nor failed (a crash left it).
    pub fn open_step(&self) -> Option<&StepStart> {
        self.open_step.as_ref()
    }

    /// The messages the open step recorded of its tool loop (assistant turns that called
    /// tools, and tools' results), in order; `None` when no step is open or its loop was
    /// compacted.
    pub fn open_step_messages(&self) -> Option<&[Message]> {
        self.open_step.as_ref()?;
        self.open_step_messages.as_deref()
    }

    /// The output of the last step (for a finished iteration, the items' outputs as a JSON
    /// list).
    pub fn last_output(&self) -> Option<&str> {
        self.last_output.as_deref()
    }

    /// The last step failure, unless a step started since.
    pub fn failure(&self) -> Option<&StepFailure> {
        self.failure.as_ref()
    }

    /// How the run ended, unless it went on since (a resumed run).
    pub fn end(&self) -> Option<&RunEnd> {
        self.end.as_ref()
    }

    /// The cancellation asked for, if any (it stays once asked).
    pub fn cancel_requested(&self) -> Option<&CancelRequest> {
        self.cancel.as_ref()
    }

    /// How many times `state_id` has finished (an iteration counts once).
    pub fn visits(&self, state_id: &str) -> u64 {
        self.visits.get(state_id).copied().unwrap_or(0)
    }

    /// The last output of `state_id`, if it has finished.
    pub fn output_of(&self, state_id: &str) -> Option<&str> {
        self.outputs.get(state_id).map(String::as_str)
    }

    /// The child executions this run started, in order.
    pub fn children(&self) -> &[String] {
        &self.children
    }

    /// True when the run is over: completed or cancelled (a failed run can still resume).
    pub fn is_over(&self) -> bool {
        self.end
            .as_ref()
            .is_some_and(|end| end.status != RunStatus::Failed)
    }

    /// The context store.
    pub fn store(&self) -> ContextStore {
        ContextStore::from_map(self.thread.store().clone())
    }

    /// Tokens spent by the execution's calls.
    pub fn usage(&self) -> Usage {
        self.thread.usage()
    }

    /// Dollars spent by the execution's calls whose price is known.
    pub fn cost_usd(&self) -> f64 {
        self.cost_usd
    }

    /// Dollars spent on the run's calls, `None` when one of them spent tokens at no known
    /// price (the total is then unknown, not the known part).
    pub fn total_cost_usd(&self) -> Option<f64> {
        (!self.cost_unknown).then_some(self.cost_usd)
    }
}

/// The output of a whole iteration: the items' parsed outputs, as a JSON list.
pub(crate) fn combined_output(done: &[ItemResult]) -> String {
    Value::Array(
        done.iter()
            .map(|item| parse_output(&item.output).value)
            .collect(),
    )
    .to_string()
}
