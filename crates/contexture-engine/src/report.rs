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

/// Summarizes an execution's events; `None` when they are not an execution's.
pub fn report(execution_id: &str, events: &[Event]) -> Option<ExecutionReport> {
    let Some(EventKind::RunStarted(start)) = events.first().map(|event| &event.kind) else {
        return None;
    };
    let mut report = ExecutionReport {
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
    };
    fold(&mut report, events);
    Some(report)
}

/// Adds the calls of `report`'s steps that ran on a fork of the execution's thread, read
/// from each fork's own events, in step order. Their usage and cost are already in the
/// report: the `merged` event that ended (or accounted for) each such step carries them.
pub async fn add_fork_calls<S: Store>(
    store: &S,
    report: &mut ExecutionReport,
) -> Result<(), StoreError> {
    let forks: Vec<String> = report
        .steps
        .iter()
        .filter_map(|step| step.start.fork_thread.clone())
        .collect();
    if forks.is_empty() {
        return Ok(());
    }
    for fork in forks {
        let events = match store.events(&fork).await {
            Ok(events) => events,
            // A fork the step's process never took: it made no call.
            Err(StoreError::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        };
        let own = events
            .iter()
            .position(|event| matches!(event.kind, EventKind::Forked { .. }))
            .map_or(&events[..0], |at| &events[at + 1..]);
        let mut scratch = ExecutionReport {
            calls: Vec::new(),
            ..report.clone()
        };
        fold(&mut scratch, own);
        report.calls.extend(scratch.calls);
    }
    report.calls.sort_by_key(|call| call.request.step);
    Ok(())
}

/// Folds `events` into `report`: its steps, calls, usage and end.
fn fold(report: &mut ExecutionReport, events: &[Event]) {
    // Loop compactions wait for their step's next call.
    let mut compactions: Vec<StepCompaction> = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::CancelRequested(_) => report.cancel_requested = true,
            EventKind::StepCompacted(compaction) => compactions.push(compaction.clone()),
            EventKind::StepStarted(start) => {
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
            EventKind::StepFinished(end) => {
                if let Some(step) = step_mut(&mut report.steps, end.step) {
                    step.output = Some(end.output.clone());
                    step.next = end.next.clone();
                }
            }
            EventKind::StepFailed(failure) => {
                if let Some(step) = step_mut(&mut report.steps, failure.step) {
                    step.error = Some(failure.error.clone());
                }
            }
            EventKind::RequestStarted(request) => {
                let state_id = request.step.and_then(|number| {
                    report
                        .steps
                        .iter()
                        .rev()
                        .find(|s| s.start.step == number)
                        .map(|s| s.start.state_id.clone())
                });
                let (before, later): (Vec<_>, Vec<_>) = compactions
                    .drain(..)
                    .partition(|c| request.purpose.is_none() && Some(c.step) == request.step);
                compactions = later;
                report.calls.push(CallReport {
                    state_id,
                    request: request.clone(),
                    end: None,
                    loop_compactions: before,
                });
            }
            EventKind::RequestEnded(end) => {
                report.usage = report.usage.plus(end.usage);
                report.cost_usd = report
                    .cost_usd
                    .zip(end.known_cost_usd())
                    .map(|(sum, cost)| sum + cost);
                if let Some(call) = report
                    .calls
                    .iter_mut()
                    .rev()
                    .find(|call| call.request.request_id == end.request_id)
                {
                    call.end = Some(end.clone());
                }
            }
            // A step run on a fork: its calls were recorded there, and are counted here.
            EventKind::Merged(merge) => {
                report.usage = report.usage.plus(merge.usage);
                report.cost_usd = if merge.cost_unknown {
                    None
                } else {
                    report
                        .cost_usd
                        .map(|sum| sum + merge.cost_usd.unwrap_or(0.0))
                };
            }
            EventKind::RunEnded(end) => {
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

/// The usage tree of `execution_id`, reading each descendant's log from `store`.
pub async fn usage_tree<S: Store>(store: &S, execution_id: &str) -> Result<UsageTree, StoreError> {
    let events = store.events(execution_id).await?;
    let report = report(execution_id, &events).ok_or_else(|| StoreError::NotFound {
        thread: execution_id.to_owned(),
    })?;
    let mut children = Vec::new();
    for child in &report.children {
        match Box::pin(usage_tree(store, child)).await {
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
        execution_id: execution_id.to_owned(),
        workflow_file: report.workflow_file,
        status: report.status,
        own: report.usage,
        own_cost_usd: report.cost_usd,
        total,
        total_cost_usd,
        children,
    })
}
