//! What an execution did, read from its log: its steps, every LLM call with what it was sent
//! and its budget, and its totals. The data behind `contexture inspect` and
//! the server's execution log.

use contexture_core::thread::{
    Event, EventKind, RequestEnd, RequestRecord, RunStatus, StepCompaction, StepStart, Usage,
};
use contexture_store::{Store, StoreError};
use serde::Serialize;

/// Where an execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// It has not ended (it is running, or its process stopped before it could record an
    /// end; `contexture run --resume` continues it).
    Running,
    /// It reached the workflow's end.
    Completed,
    /// A step failed; it can be resumed.
    Failed,
    /// It was cancelled.
    Cancelled,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    /// How it started.
    #[serde(flatten)]
    pub start: StepStart,
    /// Its output, when it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Where the run went next, when it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One LLM call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallReport {
    /// The state whose step made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_id: Option<String>,
    /// What was sent, and under which budget.
    pub request: RequestRecord,
    /// How it ended; `None` while in flight (or when the process stopped during it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<RequestEnd>,
    /// The compactions of its step's own tool loop made just before it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loop_compactions: Vec<StepCompaction>,
}

/// An execution's log, summarized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionReport {
    /// The execution.
    pub execution_id: String,
    /// The workflow file it ran.
    pub workflow_file: String,
    /// The execution that started it, for a sub-workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_execution_id: Option<String>,
    /// Where it stands.
    pub status: ExecutionStatus,
    /// The final output, when completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Why it stopped, when it failed or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its steps, in order.
    pub steps: Vec<StepReport>,
    /// Its LLM calls, in order.
    pub calls: Vec<CallReport>,
    /// Tokens spent by this execution's own calls, as providers reported them.
    pub usage: Usage,
    /// Dollars spent on this execution's own calls; `None` (unknown) when a call spent tokens
    /// on a model with no known price: never a total that leaves it out.
    pub cost_usd: Option<f64>,
    /// The child executions it started (sub-workflows), in order.
    pub children: Vec<String>,
    /// Whether a cancellation was asked for.
    pub cancel_requested: bool,
}

/// Summarizes an execution's events (its own log: the calls of steps run on a fork are not
/// in it, see [`read_report`]); `None` when they are not an execution's.
pub fn report(execution_id: &str, events: &[Event]) -> Option<ExecutionReport> {
    let mut folding = Folding::new(execution_id, events.first()?, CallsKept::All)?;
    for event in events {
        folding.absorb(event, Source::Own);
    }
    Some(folding.report)
}

/// Which of an execution's calls a [`read_report`] keeps whole (a call holds every message
/// it sent, so an execution's calls together can be far larger than its log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallsKept {
    /// Every call.
    All,
    /// None of them: the report's totals count them all the same.
    None,
    /// A page: the calls after the first `after`, at most `limit` of them, and no more than
    /// fit `max_bytes` as JSON (the first always).
    Page {
        /// Calls skipped.
        after: usize,
        /// The most calls kept.
        limit: usize,
        /// The most bytes of calls kept.
        max_bytes: usize,
    },
}

/// A report read by [`read_report`].
#[derive(Debug, Clone, PartialEq)]
pub struct ReadReport {
    /// The report, its calls as kept.
    pub report: ExecutionReport,
    /// With [`CallsKept::Page`]: the `after` of the next page, when calls are left.
    pub next_after: Option<usize>,
}

/// Events read at once by [`read_report`].
const EVENTS_AT_ONCE: usize = 256;

/// Reads the report of `execution_id` from `store` a page of events at a time (at most
/// `page_bytes` of them, as JSON, and one event), so what it holds is the report, not the
/// log: the calls of its steps run on a fork are read from the fork, in their step's place,
/// and only the calls `kept` are kept whole. `None` when the thread is not an execution.
pub async fn read_report<S: Store>(
    store: &S,
    execution_id: &str,
    kept: CallsKept,
    page_bytes: usize,
) -> Result<Option<ReadReport>, StoreError> {
    let mut folding: Option<Folding> = None;
    let mut pages = EventPages::new(store, execution_id, page_bytes);
    while let Some(events) = pages.next().await? {
        for event in &events {
            let folding = match &mut folding {
                Some(folding) => folding,
                None => match Folding::new(execution_id, event, kept) {
                    Some(started) => folding.insert(started),
                    None => return Ok(None),
                },
            };
            folding.absorb(event, Source::Own);
            // A fork holds only calls (its usage is counted by the step's merge), so it is
            // read only when calls are kept.
            if let EventKind::StepStarted(start) = &event.kind
                && let Some(fork) = &start.fork_thread
                && kept != CallsKept::None
            {
                read_fork_calls(store, fork, folding, page_bytes).await?;
            }
        }
    }
    Ok(folding.map(|folding| ReadReport {
        next_after: folding.next_after,
        report: folding.report,
    }))
}

/// Folds the calls a step made on `fork` (its events after the fork point).
async fn read_fork_calls<S: Store>(
    store: &S,
    fork: &str,
    folding: &mut Folding,
    page_bytes: usize,
) -> Result<(), StoreError> {
    let mut pages = EventPages::new(store, fork, page_bytes);
    let mut own = false;
    loop {
        let events = match pages.next().await {
            Ok(Some(events)) => events,
            // A fork the step's process never took: it made no call.
            Ok(None) | Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        for event in &events {
            if own {
                folding.absorb(event, Source::Fork);
            }
            own |= matches!(event.kind, EventKind::Forked { .. });
        }
    }
}

/// A thread's events, read a page at a time (at most [`EVENTS_AT_ONCE`] events and about
/// `page_bytes` of JSON).
struct EventPages<'a, S> {
    store: &'a S,
    thread: &'a str,
    page_bytes: usize,
    after: u64,
}

impl<'a, S: Store> EventPages<'a, S> {
    fn new(store: &'a S, thread: &'a str, page_bytes: usize) -> EventPages<'a, S> {
        EventPages {
            store,
            thread,
            page_bytes,
            after: 0,
        }
    }

    /// The next page; `None` past the last event.
    async fn next(&mut self) -> Result<Option<Vec<Event>>, StoreError> {
        let page = self
            .store
            .events_page(self.thread, self.after, EVENTS_AT_ONCE, self.page_bytes)
            .await?;
        let Some(last) = page.events.last() else {
            return Ok(None);
        };
        self.after = last.seq;
        Ok(Some(page.events))
    }
}

/// Where an event was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The execution's own log.
    Own,
    /// A fork a step ran on: its calls are the execution's, their usage and cost are counted
    /// by the `merged` event that accounted for the step.
    Fork,
}

/// A report being folded from an execution's events.
struct Folding {
    report: ExecutionReport,
    /// Loop compactions wait for their step's next call.
    compactions: Vec<StepCompaction>,
    kept: CallsKept,
    /// Calls met so far.
    calls_met: usize,
    /// Bytes of the calls kept.
    kept_bytes: usize,
    next_after: Option<usize>,
}

impl Folding {
    /// A fold of the execution whose first event is `first`; `None` when it is not a run's
    /// start.
    fn new(execution_id: &str, first: &Event, kept: CallsKept) -> Option<Folding> {
        let EventKind::RunStarted(start) = &first.kind else {
            return None;
        };
        Some(Folding {
            report: ExecutionReport {
                execution_id: execution_id.to_owned(),
                workflow_file: start.workflow_file.clone(),
                parent_execution_id: start.parent_execution_id.clone(),
                status: ExecutionStatus::Running,
                output: None,
                error: None,
                steps: Vec::new(),
                calls: Vec::new(),
                usage: Usage::default(),
                cost_usd: Some(0.0),
                children: Vec::new(),
                cancel_requested: false,
            },
            compactions: Vec::new(),
            kept,
            calls_met: 0,
            kept_bytes: 0,
            next_after: None,
        })
    }

    /// Whether the call met next is kept (and counted as kept when it is).
    fn keeps(&mut self, call: &CallReport) -> bool {
        let position = self.calls_met;
        self.calls_met += 1;
        match self.kept {
            CallsKept::All => true,
            CallsKept::None => false,
            CallsKept::Page {
                after,
                limit,
                max_bytes,
            } => {
                if position < after || self.next_after.is_some() {
                    return false;
                }
                let size = serde_json::to_vec(call).map_or(0, |json| json.len());
                let full = self.report.calls.len() >= limit
                    || (!self.report.calls.is_empty()
                        && self.kept_bytes.saturating_add(size) > max_bytes);
                if full {
                    self.next_after = Some(position);
                    return false;
                }
                self.kept_bytes += size;
                true
            }
        }
    }

    fn absorb(&mut self, event: &Event, source: Source) {
        let report = &mut self.report;
        match (&event.kind, source) {
            (EventKind::StepCompacted(compaction), _) => self.compactions.push(compaction.clone()),
            (EventKind::RequestStarted(request), _) => {
                let state_id = request.step.and_then(|number| {
                    report
                        .steps
                        .iter()
                        .rev()
                        .find(|s| s.start.step == number)
                        .map(|s| s.start.state_id.clone())
                });
                let (before, later): (Vec<_>, Vec<_>) = self
                    .compactions
                    .drain(..)
                    .partition(|c| request.purpose.is_none() && Some(c.step) == request.step);
                self.compactions = later;
                let call = CallReport {
                    state_id,
                    request: request.clone(),
                    end: None,
                    loop_compactions: before,
                };
                if self.keeps(&call) {
                    self.report.calls.push(call);
                }
            }
            (EventKind::RequestEnded(end), _) => {
                if source == Source::Own {
                    report.usage = report.usage.plus(end.usage);
                    report.cost_usd = report
                        .cost_usd
                        .zip(end.known_cost_usd())
                        .map(|(sum, cost)| sum + cost);
                }
                if let Some(call) = report
                    .calls
                    .iter_mut()
                    .rev()
                    .find(|call| call.request.request_id == end.request_id)
                {
                    call.end = Some(end.clone());
                }
            }
            (_, Source::Fork) => {}
            (EventKind::CancelRequested(_), _) => report.cancel_requested = true,
            (EventKind::StepStarted(start), _) => {
                if let Some(child) = &start.child_execution_id
                    && !report.children.contains(child)
                {
                    report.children.push(child.clone());
                }
                report.status = ExecutionStatus::Running;
                report.error = None;
                report.steps.push(StepReport {
                    start: start.clone(),
                    output: None,
                    next: None,
                    error: None,
                });
            }
            (EventKind::StepFinished(end), _) => {
                if let Some(step) = step_mut(&mut report.steps, end.step) {
                    step.output = Some(end.output.clone());
                    step.next = end.next.clone();
                }
            }
            (EventKind::StepFailed(failure), _) => {
                if let Some(step) = step_mut(&mut report.steps, failure.step) {
                    step.error = Some(failure.error.clone());
                }
            }
            // A step run on a fork: its calls were recorded there, and are counted here.
            (EventKind::Merged(merge), _) => {
                report.usage = report.usage.plus(merge.usage);
                report.cost_usd = if merge.cost_unknown {
                    None
                } else {
                    report
                        .cost_usd
                        .map(|sum| sum + merge.cost_usd.unwrap_or(0.0))
                };
            }
            (EventKind::RunEnded(end), _) => {
                report.status = match end.status {
                    RunStatus::Completed => ExecutionStatus::Completed,
                    RunStatus::Failed => ExecutionStatus::Failed,
                    RunStatus::Cancelled => ExecutionStatus::Cancelled,
                };
                report.output = end.output.clone();
                report.error = end.error.clone();
            }
            _ => {}
        }
    }
}

fn step_mut(steps: &mut [StepReport], number: u64) -> Option<&mut StepReport> {
    steps
        .iter_mut()
        .rev()
        .find(|step| step.start.step == number)
}

/// An execution's usage with its descendants': its own calls, and the totals of its subtree
/// (each call counted once: a call is recorded only in the log of the execution that made it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageTree {
    /// The execution.
    pub execution_id: String,
    /// The workflow file it ran.
    pub workflow_file: String,
    /// Where it stands.
    pub status: ExecutionStatus,
    /// Its own calls' tokens.
    pub own: Usage,
    /// Its own calls' dollars (`None`: unknown, a call had no price).
    pub own_cost_usd: Option<f64>,
    /// Its subtree's tokens: its own and every descendant's.
    pub total: Usage,
    /// Its subtree's dollars (`None`: unknown somewhere in it).
    pub total_cost_usd: Option<f64>,
    /// Its children's trees, in the order they started.
    pub children: Vec<UsageTree>,
}

/// The usage tree of `execution_id`, reading each descendant's log from `store` (a page of
/// at most `page_bytes` at a time, see [`read_report`]).
pub async fn usage_tree<S: Store>(
    store: &S,
    execution_id: &str,
    page_bytes: usize,
) -> Result<UsageTree, StoreError> {
    let report = read_report(store, execution_id, CallsKept::None, page_bytes)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            thread: execution_id.to_owned(),
        })?
        .report;
    usage_tree_of(store, &report, page_bytes).await
}

/// The usage tree of the execution `report` was read from: its descendants' logs are read
/// as [`usage_tree`] reads them, its own is not read again.
pub async fn usage_tree_of<S: Store>(
    store: &S,
    report: &ExecutionReport,
    page_bytes: usize,
) -> Result<UsageTree, StoreError> {
    let mut children = Vec::new();
    for child in &report.children {
        match Box::pin(usage_tree(store, child, page_bytes)).await {
            Ok(tree) => children.push(tree),
            // A step that named its child but stopped before the child started (a budget
            // already spent, a sub-workflow that could not be read): nothing was spent.
            Err(StoreError::NotFound { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    let total = children
        .iter()
        .fold(report.usage, |sum, child: &UsageTree| sum.plus(child.total));
    let total_cost_usd = children.iter().fold(report.cost_usd, |sum, child| {
        sum.zip(child.total_cost_usd).map(|(sum, cost)| sum + cost)
    });
    Ok(UsageTree {
        execution_id: report.execution_id.clone(),
        workflow_file: report.workflow_file.clone(),
        status: report.status,
        own: report.usage,
        own_cost_usd: report.cost_usd,
        total,
        total_cost_usd,
        children,
    })
}
