//! What an execution did, read from its log: its steps, every LLM call with what it was sent
//! and its budget, and its totals. The data behind `contexture inspect` and
//! the server's execution log.

use std::collections::{HashMap, VecDeque};

use contexture_core::message::Message;
use contexture_core::thread::{
    Event, EventKind, PrefixReuse, RequestEnd, RequestRecord, RunStatus, StepCompaction, StepStart,
    Usage,
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
    /// Its place among the execution's calls, from 1.
    pub number: usize,
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
    /// How its messages differ from the previous call of its step (for the step's first
    /// call, and when a retention policy removed either call's messages, none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<CallDiff>,
}

/// How a call's messages differ from those of the previous call its step made for the
/// same purpose: what entered, what left, and how much of the previous request it sent
/// again unchanged at its start (what a provider's prompt cache can reuse).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallDiff {
    /// The previous call's number.
    pub previous_call: usize,
    /// How many messages the previous call sent.
    pub previous_messages: usize,
    /// How many of them this call sends first, unchanged.
    pub prefix_kept: usize,
    /// Whether the whole previous request starts this one (its prefix was kept).
    pub prefix_stable: bool,
    /// The positions (from 0) of this call's messages the previous call did not send.
    pub entered: Vec<usize>,
    /// The previous call's messages this call does not send.
    pub left: Vec<LeftMessage>,
}

/// A message the previous call sent and a call no longer sends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeftMessage {
    /// Its position (from 0) in the previous call.
    pub index: usize,
    /// The message.
    pub message: Message,
}

impl CallDiff {
    /// How `current` differs from `previous`, the messages of call `previous_call`: each
    /// message matched to an equal one at most once, in order.
    pub fn between(previous_call: usize, previous: &[Message], current: &[Message]) -> CallDiff {
        let prefix = PrefixReuse::between(previous, current);
        let fingerprint = |message: &Message| serde_json::to_string(message).unwrap_or_default();
        let mut unmatched: HashMap<String, VecDeque<usize>> = HashMap::new();
        for (index, message) in previous.iter().enumerate() {
            unmatched
                .entry(fingerprint(message))
                .or_default()
                .push_back(index);
        }
        let mut entered = Vec::new();
        for (index, message) in current.iter().enumerate() {
            let matched = unmatched
                .get_mut(&fingerprint(message))
                .and_then(VecDeque::pop_front);
            if matched.is_none() {
                entered.push(index);
            }
        }
        let mut left: Vec<usize> = unmatched.into_values().flatten().collect();
        left.sort_unstable();
        CallDiff {
            previous_call,
            previous_messages: previous.len(),
            prefix_kept: prefix.shared as usize,
            prefix_stable: prefix.stable(),
            entered,
            left: left
                .into_iter()
                .map(|index| LeftMessage {
                    index,
                    message: previous[index].clone(),
                })
                .collect(),
        }
    }
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
    /// How many calls the execution made (kept or not).
    pub calls_made: usize,
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
        calls_made: folding.calls_met,
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

/// The step that made a call, and why (a step's own call, or its loop's summarizer's): a
/// call's diff is against the previous call of the same place.
type CallPlace = (Option<u64>, Option<String>);

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
    /// The last call of each step and purpose so far: its number and messages (shared, not
    /// copied), for the next one's diff.
    /// `None` for a call whose messages a retention policy removed.
    last_calls: HashMap<CallPlace, (usize, Option<Vec<Message>>)>,
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
            last_calls: HashMap::new(),
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
                let number = self.calls_met + 1;
                let mut call = CallReport {
                    number,
                    state_id,
                    request: request.clone(),
                    end: None,
                    loop_compactions: before,
                    diff: None,
                };
                let place = (request.step, request.purpose.clone());
                let messages = request.pruned.is_none().then(|| request.messages.clone());
                let previous = self.last_calls.insert(place, (number, messages));
                if self.keeps(&call) {
                    if let Some((previous_call, Some(previous))) = previous
                        && request.pruned.is_none()
                    {
                        call.diff = Some(CallDiff::between(
                            previous_call,
                            &previous,
                            &request.messages,
                        ));
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(messages: &[&str]) -> Vec<Message> {
        messages.iter().map(|text| Message::user(*text)).collect()
    }

    #[test]
    fn a_calls_diff_names_what_entered_what_left_and_the_prefix_kept() {
        /// Previous messages, current ones, the prefix kept, entered and left positions.
        type Case = (
            &'static [&'static str],
            &'static [&'static str],
            usize,
            &'static [usize],
            &'static [usize],
        );
        let table: [Case; 6] = [
            // A loop's next call: the previous request and two new messages.
            (
                &["s", "u", "a"],
                &["s", "u", "a", "t", "a2"],
                3,
                &[3, 4],
                &[],
            ),
            // A result cleared: the prefix breaks where it was replaced.
            (
                &["s", "u", "r1", "r2"],
                &["s", "u", "x", "r2", "a"],
                2,
                &[2, 4],
                &[2],
            ),
            // Trimmed from the front: everything after the system prompt moved.
            (&["s", "1", "2", "3"], &["s", "2", "3", "4"], 1, &[3], &[1]),
            // Equal messages are matched once each.
            (&["s", "x", "x"], &["s", "x"], 2, &[], &[2]),
            (&["s", "x"], &["s", "x", "x"], 2, &[2], &[]),
            (&[], &["s"], 0, &[0], &[]),
        ];
        for (previous, current, prefix, entered, left) in table {
            let diff = CallDiff::between(4, &texts(previous), &texts(current));
            assert_eq!(diff.previous_call, 4);
            assert_eq!(diff.previous_messages, previous.len());
            assert_eq!(diff.prefix_kept, prefix, "{previous:?} -> {current:?}");
            assert_eq!(diff.prefix_stable, prefix == previous.len());
            assert_eq!(diff.entered, entered, "{previous:?} -> {current:?}");
            let left_at: Vec<usize> = diff.left.iter().map(|left| left.index).collect();
            assert_eq!(left_at, left, "{previous:?} -> {current:?}");
            for message in &diff.left {
                assert_eq!(message.message.text(), previous[message.index]);
            }
        }
    }
}
