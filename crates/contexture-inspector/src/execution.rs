//! An execution as the inspector shows it: its totals, its tree of sub-executions, its
//! steps, and each LLM call with the messages exactly as sent, the budget bar, what fitting
//! changed and why, the usage reported, and how it differs from its step's previous call.

use contexture_core::thread::{FitRecord, RequestOutcome};
use contexture_engine::report::{
    CallReport, ExecutionReport, ExecutionStatus, ReadReport, StepReport, UsageTree,
};
use serde::Serialize;

use crate::budget_bar::BudgetBar;
use crate::message_view::MessageView;

/// An execution, ready to be shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionView {
    /// The execution's id.
    pub id: String,
    /// The workflow file it ran.
    pub workflow_file: String,
    /// The execution that started it, for a sub-workflow.
    pub parent: Option<String>,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: &'static str,
    /// Whether it has not ended (its page follows it, and it may be cancelled).
    pub running: bool,
    /// Whether a cancellation was asked for.
    pub cancel_requested: bool,
    /// Its final output, when completed.
    pub output: Option<String>,
    /// Why it stopped, when it failed or was cancelled.
    pub error: Option<String>,
    /// Its own calls' input tokens.
    pub input_tokens: u64,
    /// Its own calls' output tokens.
    pub output_tokens: u64,
    /// Its own calls' dollars, as shown.
    pub cost: String,
    /// How many LLM calls it made.
    pub calls_made: usize,
    /// The execution and its sub-executions, depth first.
    pub tree: Vec<TreeRow>,
    /// Its steps, in order.
    pub steps: Vec<StepView>,
    /// The calls shown: all of them, or a page.
    pub calls: Vec<CallView>,
    /// The calls skipped before those shown.
    pub calls_after: usize,
    /// Where the next page of calls starts, when calls are left.
    pub next_after: Option<usize>,
}

/// One execution of the tree, at its depth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeRow {
    /// 0 for the execution shown, 1 for its children, and so on.
    pub depth: usize,
    /// The execution.
    pub id: String,
    /// The workflow file it ran.
    pub workflow_file: String,
    /// Where it stands.
    pub status: &'static str,
    /// Its own calls' tokens.
    pub own_tokens: u64,
    /// Its subtree's tokens.
    pub total_tokens: u64,
    /// Its own calls' dollars, as shown.
    pub own_cost: String,
    /// Its subtree's dollars, as shown.
    pub total_cost: String,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    /// Its number.
    pub step: u64,
    /// The state it ran.
    pub state: String,
    /// Its iteration item (from 1), for an item of an iteration.
    pub item: Option<usize>,
    /// The sub-execution it started.
    pub child: Option<String>,
    /// The fork it ran on.
    pub fork: Option<String>,
    /// `next`, `done`, `failed` or `running`.
    pub end: &'static str,
    /// Where the run went next, or why it failed.
    pub detail: Option<String>,
}

/// One LLM call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallView {
    /// Its place among the execution's calls, from 1.
    pub number: usize,
    /// The step that made it.
    pub step: Option<u64>,
    /// The state whose step made it.
    pub state: Option<String>,
    /// The model called.
    pub model: Option<String>,
    /// Why it was made, when it is not a step's own call (`compaction`).
    pub purpose: Option<String>,
    /// `completed`, `failed`, `cancelled` (as recorded) or `in_flight`.
    pub outcome: String,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// The input tokens reported.
    pub input_tokens: Option<u64>,
    /// The output tokens reported.
    pub output_tokens: Option<u64>,
    /// Whether the usage was estimated (the provider reported none).
    pub usage_estimated: bool,
    /// Its dollars, as shown.
    pub cost: Option<String>,
    /// The budget it was fitted to.
    pub budget: Option<BudgetBar>,
    /// Why fitting left anything out or changed it, in words.
    pub fit_reason: Option<String>,
    /// The tokens before and after fitting, in words.
    pub fit_tokens: Option<String>,
    /// The history messages fitting left out, as ranges of the unfitted request.
    pub dropped: Vec<String>,
    /// The tool results cleared or cut, with the tokens each freed, and the prefix kept.
    pub changes: Vec<String>,
    /// The reasoning left out, in words.
    pub thinking: Option<String>,
    /// The compactions of its step's loop made just before it, in words.
    pub compactions: Vec<String>,
    /// The messages exactly as sent.
    pub messages: Vec<MessageView>,
    /// When a retention policy removed its messages: how many there were.
    pub pruned_messages: Option<u64>,
    /// How it differs from its step's previous call.
    pub diff: Option<DiffView>,
}

/// How a call differs from its step's previous call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffView {
    /// The previous call's number.
    pub previous_call: usize,
    /// How many messages it sent.
    pub previous_messages: usize,
    /// How many of them this call sent first, unchanged.
    pub prefix_kept: usize,
    /// Whether all of them were (the prefix a provider's cache reuses was kept).
    pub prefix_stable: bool,
    /// How many of this call's messages the previous did not send.
    pub entered: usize,
    /// The previous call's messages this one did not send.
    pub left: Vec<MessageView>,
}

/// Dollars as shown: six decimals, or unknown when a call had no known price.
fn dollars(cost: Option<f64>) -> String {
    match cost {
        Some(cost) => format!("${cost:.6}"),
        None => "unknown".to_owned(),
    }
}

fn status_name(status: ExecutionStatus) -> &'static str {
    match status {
        ExecutionStatus::Running => "running",
        ExecutionStatus::Completed => "completed",
        ExecutionStatus::Failed => "failed",
        ExecutionStatus::Cancelled => "cancelled",
    }
}

impl ExecutionView {
    /// The view of an execution read with its calls (all of them, or the page after the
    /// first `calls_after`), and its usage tree.
    pub fn new(read: &ReadReport, tree: &UsageTree, calls_after: usize) -> ExecutionView {
        let report: &ExecutionReport = &read.report;
        let mut rows = Vec::new();
        flatten(tree, 0, &mut rows);
        ExecutionView {
            id: report.execution_id.clone(),
            workflow_file: report.workflow_file.clone(),
            parent: report.parent_execution_id.clone(),
            status: status_name(report.status),
            running: report.status == ExecutionStatus::Running,
            cancel_requested: report.cancel_requested,
            output: report.output.clone(),
            error: report.error.clone(),
            input_tokens: report.usage.input_tokens,
            output_tokens: report.usage.output_tokens,
            cost: dollars(report.cost_usd),
            calls_made: read.calls_made,
            tree: rows,
            steps: report.steps.iter().map(StepView::of).collect(),
            calls: report.calls.iter().map(CallView::of).collect(),
            calls_after,
            next_after: read.next_after,
        }
    }
}

fn flatten(tree: &UsageTree, depth: usize, rows: &mut Vec<TreeRow>) {
    rows.push(TreeRow {
        depth,
        id: tree.execution_id.clone(),
        workflow_file: tree.workflow_file.clone(),
        status: status_name(tree.status),
        own_tokens: tree.own.total(),
        total_tokens: tree.total.total(),
        own_cost: dollars(tree.own_cost_usd),
        total_cost: dollars(tree.total_cost_usd),
    });
    for child in &tree.children {
        flatten(child, depth + 1, rows);
    }
}

impl StepView {
    fn of(step: &StepReport) -> StepView {
        let (end, detail) = match (&step.next, &step.error) {
            (Some(next), _) => ("next", Some(next.clone())),
            (None, Some(error)) => ("failed", Some(error.clone())),
            (None, None) if step.output.is_some() => ("done", None),
            (None, None) => ("running", None),
        };
        StepView {
            step: step.start.step,
            state: step.start.state_id.clone(),
            item: step.start.item.map(|item| item + 1),
            child: step.start.child_execution_id.clone(),
            fork: step.start.fork_thread.clone(),
            end,
            detail,
        }
    }
}

/// A fit in words: its tokens before and after against its limit, the ranges it left out,
/// and the tool results it cleared or cut (then how much of the previous call's request it
/// sent again).
pub(crate) fn fit_lines(fit: &FitRecord) -> (String, Vec<String>, Vec<String>) {
    let tokens = match fit.tokens_before {
        Some(before) => format!(
            "{before} tokens before fitting, {} sent, of a limit of {}",
            fit.tokens_after, fit.limit
        ),
        None => format!(
            "{} tokens sent, of a limit of {}",
            fit.tokens_after, fit.limit
        ),
    };
    let dropped = fit
        .dropped
        .iter()
        .map(|[start, end]| match end - start {
            1 => format!("message {start}"),
            _ => format!("messages {start} to {}", end - 1),
        })
        .collect();
    (tokens, dropped, fit.tool_result_changes())
}

impl CallView {
    fn of(call: &CallReport) -> CallView {
        let request = &call.request;
        let end = call.end.as_ref();
        let outcome = match end {
            None => "in_flight".to_owned(),
            Some(end) => serde_json::to_value(end.outcome)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default(),
        };
        let completed = end.is_some_and(|end| end.outcome == RequestOutcome::Completed);
        let fit = request.fit.as_ref();
        let fit_view = fit.map(fit_lines);
        let entered: Vec<usize> = call
            .diff
            .as_ref()
            .map(|diff| diff.entered.clone())
            .unwrap_or_default();
        let messages = request
            .messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                let mut view = MessageView::of(index, message);
                view.entered = call.diff.is_some() && entered.binary_search(&index).is_ok();
                view
            })
            .collect();
        CallView {
            number: call.number,
            step: request.step,
            state: call.state_id.clone(),
            model: request.model.clone(),
            purpose: request.purpose.clone(),
            outcome,
            error: end.and_then(|end| end.error.clone()),
            input_tokens: end.filter(|_| completed).map(|end| end.usage.input_tokens),
            output_tokens: end.filter(|_| completed).map(|end| end.usage.output_tokens),
            usage_estimated: end.is_some_and(|end| end.usage_estimated),
            cost: end.map(|end| dollars(end.known_cost_usd())),
            budget: request.breakdown.as_ref().map(BudgetBar::of),
            fit_reason: fit.and_then(|fit| fit.reason.clone()),
            fit_tokens: fit_view.as_ref().map(|(tokens, _, _)| tokens.clone()),
            dropped: fit_view
                .as_ref()
                .map(|(_, dropped, _)| dropped.clone())
                .unwrap_or_default(),
            changes: fit_view
                .map(|(_, _, mut changes)| {
                    // The prefix's line comes last; the diff says it with more.
                    if call.diff.is_some() && fit.is_some_and(|fit| fit.prefix.is_some()) {
                        changes.pop();
                    }
                    changes
                })
                .unwrap_or_default(),
            thinking: fit
                .and_then(|fit| fit.cleared_thinking.as_ref())
                .filter(|thinking| !thinking.is_empty())
                .map(|thinking| {
                    format!(
                        "the reasoning of {} assistant turn(s) left out: {} tokens freed",
                        thinking.turns, thinking.tokens
                    )
                }),
            compactions: call
                .loop_compactions
                .iter()
                .map(|compaction| compaction.describe())
                .collect(),
            messages,
            pruned_messages: request.pruned.map(|pruned| pruned.messages),
            diff: call.diff.as_ref().map(|diff| DiffView {
                previous_call: diff.previous_call,
                previous_messages: diff.previous_messages,
                prefix_kept: diff.prefix_kept,
                prefix_stable: diff.prefix_stable,
                entered: diff.entered.len(),
                left: diff
                    .left
                    .iter()
                    .map(|left| MessageView::of(left.index, &left.message))
                    .collect(),
            }),
        }
    }
}
