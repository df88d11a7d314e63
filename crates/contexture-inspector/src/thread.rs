//! A thread as the inspector shows it: what it is, a page of its event timeline, its forks
//! as a tree, and its context fitted for a chosen model with the budget bar and what
//! fitting left out.

use std::time::{Duration, UNIX_EPOCH};

use contexture_core::budget::BudgetBreakdown;
use contexture_core::message::Message;
use contexture_core::thread::{
    Event, EventKind, FitRecord, ReplaceReason, RequestOutcome, RunStatus,
};
use contexture_store::ThreadInfo;
use serde::Serialize;

use crate::budget_bar::BudgetBar;
use crate::execution::fit_lines;
use crate::message_view::MessageView;

/// One thread of a fork tree, at its depth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForkRow {
    /// 0 for the root of the tree shown.
    pub depth: usize,
    /// The thread.
    pub id: String,
    /// Where it left its parent (the parent's last event it shares).
    pub fork_seq: Option<u64>,
    /// Its last event.
    pub last_seq: u64,
    /// Whether it is the thread shown.
    pub current: bool,
    /// Whether it has forks the tree leaves out (it is cut at a depth or a count).
    pub more: bool,
}

/// A thread's context fitted for a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextView {
    /// The model it was fitted for.
    pub model: String,
    /// The budget.
    pub budget: BudgetBar,
    /// The tokens before and after fitting, in words.
    pub fit_tokens: String,
    /// Why fitting left anything out or changed it.
    pub fit_reason: Option<String>,
    /// The messages left out, as ranges of the unfitted context.
    pub dropped: Vec<String>,
    /// How many messages were left out.
    pub dropped_count: usize,
    /// The tool results cleared or cut.
    pub changes: Vec<String>,
    /// How many messages would be sent.
    pub messages_total: usize,
    /// The newest of them (at most [`CONTEXT_MESSAGES_SHOWN`]), as they would be sent.
    pub messages: Vec<MessageView>,
}

/// The most messages of a fitted context the view holds: a large window holds thousands,
/// and a page that draws them all opens slowly (the context API answers them all).
pub const CONTEXT_MESSAGES_SHOWN: usize = 200;

impl ContextView {
    /// The view of a context fitted for `model`.
    pub fn new(
        model: &str,
        messages: &[Message],
        breakdown: &BudgetBreakdown,
        fit: &FitRecord,
    ) -> ContextView {
        let (fit_tokens, dropped, changes) = fit_lines(fit);
        ContextView {
            model: model.to_owned(),
            budget: BudgetBar::of(breakdown),
            fit_tokens,
            fit_reason: fit.reason.clone(),
            dropped,
            dropped_count: fit.dropped.iter().map(|[start, end]| end - start).sum(),
            changes,
            messages_total: messages.len(),
            messages: messages
                .iter()
                .enumerate()
                .skip(messages.len().saturating_sub(CONTEXT_MESSAGES_SHOWN))
                .map(|(index, message)| MessageView::of(index, message))
                .collect(),
        }
    }
}

/// One event of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Its seq.
    pub seq: u64,
    /// Its type, as the log names it (`message_appended`, `request_started`, ...).
    pub kind: String,
    /// What happened, in words.
    pub title: String,
    /// More of it, a line each.
    pub lines: Vec<String>,
    /// The message it holds (an appended message, a request's reply).
    pub message: Option<MessageView>,
    /// The messages it puts in place (a compaction's summary, a restore, a merge).
    pub messages: Vec<MessageView>,
    /// A thread it names (a fork's parent, a merged fork).
    pub thread_link: Option<String>,
    /// An execution it names (a sub-execution a step started).
    pub execution_link: Option<String>,
    /// For a request's record: its budget.
    pub budget: Option<BudgetBar>,
}

/// A thread, ready to be shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadView {
    /// What it is.
    pub facts: ThreadInfo,
    /// Whether it is an execution's log.
    pub execution: bool,
    /// When it was created, as a date.
    pub created: String,
    /// When it was last appended to, as a date.
    pub updated: String,
    /// The page of its timeline shown.
    pub events: Vec<EventRow>,
    /// The seq the page starts after.
    pub events_after: u64,
    /// Where the next page starts, when events are left.
    pub next_after: Option<u64>,
    /// Where the previous page starts, when the page is not the first.
    pub previous_after: Option<u64>,
    /// Where the last page starts.
    pub last_after: u64,
    /// Events a page holds.
    pub page_size: u64,
    /// Its fork tree, from its root, depth first.
    pub forks: Vec<ForkRow>,
    /// Its context fitted for the model asked for.
    pub context: Option<ContextView>,
    /// Why the context could not be fitted.
    pub context_error: Option<String>,
    /// The model the context is fitted for (asked for, or the default).
    pub model: String,
}

impl ThreadView {
    /// The view of a thread: `events` is the page after seq `events_after` (at most
    /// `page_size`), `more` whether events follow it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        facts: ThreadInfo,
        events: &[Event],
        events_after: u64,
        more: bool,
        page_size: u64,
        forks: Vec<ForkRow>,
        context: Result<ContextView, String>,
        model: &str,
    ) -> ThreadView {
        let last_after = facts.last_seq.saturating_sub(page_size);
        let (context, context_error) = match context {
            Ok(context) => (Some(context), None),
            Err(error) => (None, Some(error)),
        };
        ThreadView {
            created: date(facts.created_at_ms),
            updated: date(facts.updated_at_ms),
            next_after: if more {
                events.last().map(|event| event.seq)
            } else {
                None
            },
            previous_after: (events_after > 0).then(|| events_after.saturating_sub(page_size)),
            last_after,
            page_size,
            events: events.iter().map(EventRow::of).collect(),
            events_after,
            execution: facts.execution,
            facts,
            forks,
            context,
            context_error,
            model: model.to_owned(),
        }
    }
}

/// A time as an HTTP date (`Sun, 29 Nov 2026 10:14:00 GMT`).
pub(crate) fn date(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    httpdate::fmt_http_date(time)
}

fn messages_of(messages: &[Message]) -> Vec<MessageView> {
    messages
        .iter()
        .enumerate()
        .map(|(index, message)| MessageView::of(index, message))
        .collect()
}

fn type_name(kind: &EventKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|value| {
            value
                .get("type")
                .and_then(|t| t.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

impl EventRow {
    fn of(event: &Event) -> EventRow {
        let mut row = EventRow {
            seq: event.seq,
            kind: type_name(&event.kind),
            title: String::new(),
            lines: Vec::new(),
            message: None,
            messages: Vec::new(),
            thread_link: None,
            execution_link: None,
            budget: None,
        };
        match &event.kind {
            EventKind::MessageAppended { message } => {
                row.title = format!("{} message", message.role.as_str());
                row.message = Some(MessageView::of(0, message));
            }
            EventKind::RequestStarted(record) => {
                row.title = format!(
                    "request to {}: {} messages{}",
                    record.model.as_deref().unwrap_or("?"),
                    record
                        .pruned
                        .map_or(record.messages.len() as u64, |pruned| pruned.messages),
                    record
                        .purpose
                        .as_deref()
                        .map(|purpose| format!(" ({purpose})"))
                        .unwrap_or_default()
                );
                if let Some(fit) = &record.fit {
                    let (tokens, dropped, changes) = fit_lines(fit);
                    row.lines.push(tokens);
                    row.lines.extend(fit.reason.clone());
                    row.lines.extend(
                        dropped
                            .into_iter()
                            .map(|range| format!("left out: {range}")),
                    );
                    row.lines.extend(changes);
                }
                if record.pruned.is_some() {
                    row.lines
                        .push("its messages were removed by a retention policy".to_owned());
                }
                row.budget = record.breakdown.as_ref().map(BudgetBar::of);
            }
            EventKind::RequestEnded(end) => {
                row.title = match end.outcome {
                    RequestOutcome::Completed => format!(
                        "request completed: {} in / {} out{}",
                        end.usage.input_tokens,
                        end.usage.output_tokens,
                        if end.usage_estimated {
                            " (estimated)"
                        } else {
                            ""
                        }
                    ),
                    _ => format!(
                        "request {}",
                        serde_json::to_value(end.outcome)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    ),
                };
                row.lines.extend(end.error.clone());
                if let Some(cost) = end.known_cost_usd() {
                    row.lines.push(format!("${cost:.6}"));
                }
                row.message = end.reply.as_ref().map(|reply| MessageView::of(0, reply));
            }
            EventKind::ContextReplaced(replace) => {
                let what = match replace.reason {
                    ReplaceReason::Compaction => "compaction",
                    ReplaceReason::Manual => "messages replaced",
                    ReplaceReason::Restore => "restore",
                    ReplaceReason::Clear => "clear",
                };
                row.title = format!(
                    "{what}: events {} to {} of context `{}` stood for by {} message(s)",
                    replace.from_seq,
                    replace.to_seq,
                    replace.context,
                    replace.replacement.len()
                );
                if let Some(provenance) = &replace.provenance {
                    row.lines.extend(
                        provenance
                            .summarizer_model
                            .as_ref()
                            .map(|model| format!("summarized by {model}")),
                    );
                    row.lines.extend(
                        provenance
                            .snapshot_seq
                            .map(|seq| format!("the snapshot of event {seq} put back")),
                    );
                }
                row.messages = messages_of(&replace.replacement);
            }
            EventKind::ContextSwitched { context, .. } => {
                row.title = format!("context switched to `{context}`");
            }
            EventKind::StoreChanged(change) => {
                row.title = "store changed".to_owned();
                row.lines
                    .push(serde_json::to_string(change).unwrap_or_default());
            }
            EventKind::Forked { parent, at_seq } => {
                row.title = format!("forked from {parent} after its event {at_seq}");
                row.thread_link = Some(parent.clone());
            }
            EventKind::Merged(merge) => {
                row.title = format!(
                    "merged fork {} (through its event {}): {} message(s)",
                    merge.child,
                    merge.child_seq,
                    merge.messages.len()
                );
                row.thread_link = Some(merge.child.clone());
                row.messages = messages_of(&merge.messages);
            }
            EventKind::RunStarted(start) => {
                row.title = format!("run started: {}", start.workflow_file);
            }
            EventKind::StepStarted(start) => {
                row.title = format!("step {} started: {}", start.step, start.state_id);
                row.execution_link = start.child_execution_id.clone();
            }
            EventKind::StepMessage(message) => {
                row.title = format!("step {} message", message.step);
                row.message = Some(MessageView::of(0, &message.message));
            }
            EventKind::StepCompacted(compaction) => {
                row.title = format!("step {}: {}", compaction.step, compaction.describe());
            }
            EventKind::StepFinished(end) => {
                row.title = format!(
                    "step {} finished{}",
                    end.step,
                    end.next
                        .as_ref()
                        .map(|next| format!(" -> {next}"))
                        .unwrap_or_default()
                );
            }
            EventKind::StepFailed(failure) => {
                row.title = format!("step {} failed", failure.step);
                row.lines.push(failure.error.clone());
            }
            EventKind::RunEnded(end) => {
                row.title = format!(
                    "run {}",
                    match end.status {
                        RunStatus::Completed => "completed",
                        RunStatus::Failed => "failed",
                        RunStatus::Cancelled => "cancelled",
                    }
                );
                row.lines.extend(end.error.clone());
            }
            EventKind::CancelRequested(cancel) => {
                row.title = "cancel requested".to_owned();
                row.lines.extend(cancel.reason.clone());
            }
            EventKind::CompactionFailed(failure) => {
                row.title = format!(
                    "compaction of events {} to {} failed after {} attempt(s)",
                    failure.from_seq, failure.to_seq, failure.attempts
                );
                row.lines.push(failure.error.clone());
            }
            EventKind::PolicySet(change) => {
                row.title = if change.policy.is_some() {
                    "policy set".to_owned()
                } else {
                    "policy cleared".to_owned()
                };
                if let Some(policy) = &change.policy {
                    row.lines
                        .push(serde_json::to_string(policy).unwrap_or_default());
                }
            }
            EventKind::RequestDeleted { request_seq } => {
                row.title = format!("the turn of the request at event {request_seq} deleted");
            }
        }
        row
    }
}
