//! `contexture inspect`: an execution's steps and each LLM call's token budget drawn as a bar
//! (system, tools, history, reserve, free), from the execution's log.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use contexture_core::budget::{BudgetBreakdown, BudgetParts};
use contexture_core::thread::RequestOutcome;
use contexture_engine::report::{
    CallsKept, ExecutionReport, UsageTree, read_report, usage_tree_of,
};
use contexture_inspector::{ExecutionView, Inspector};

use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The execution's id.
    execution_id: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Print the report as JSON (every request's messages included).
    #[arg(long, conflicts_with = "html")]
    json: bool,
    /// Write the report as one self-contained HTML page to FILE (`-`: standard output):
    /// every call with its messages as sent, budget bar, fitting and usage; it loads
    /// nothing from the network, for attaching to a bug report.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Width of the budget bars, in characters.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u16).range(10..=400))]
    width: u16,
}

/// The most bytes of events read from the store at once.
const PAGE_BYTES: usize = 8 * 1024 * 1024;

/// Runs `contexture inspect`.
pub fn run(args: InspectArgs) -> Result<()> {
    runtime::on_current_thread(execute(args))
}

async fn execute(args: InspectArgs) -> Result<()> {
    let store = Arc::new(args.store.open().await?);
    let read = read_report(
        store.as_ref(),
        &args.execution_id,
        CallsKept::All,
        PAGE_BYTES,
    )
    .await
    .with_context(|| format!("cannot read execution {}", args.execution_id))?
    .ok_or_else(|| {
        anyhow!(
            "`{}` is a thread but not an execution (it has no run_started event)",
            args.execution_id
        )
    })?;
    let report = &read.report;
    let tree = usage_tree_of(store.as_ref(), report, PAGE_BYTES)
        .await
        .with_context(|| format!("cannot read the sub-executions of {}", args.execution_id))?;
    if let Some(path) = &args.html {
        let page = Inspector::new().execution_page(&ExecutionView::new(&read, &tree, 0))?;
        if path.as_os_str() == "-" {
            std::io::stdout()
                .write_all(page.as_bytes())
                .context("cannot write the page to standard output")?;
        } else {
            std::fs::write(path, page)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "wrote {} ({} steps, {} LLM calls)",
                path.display(),
                report.steps.len(),
                read.calls_made
            );
        }
    } else if args.json {
        let mut value = serde_json::to_value(report)?;
        value["usage_tree"] = serde_json::to_value(&tree)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(report, usize::from(args.width)));
        if !tree.children.is_empty() {
            println!("\nexecution tree (own tokens / subtree tokens):");
            print_tree(&tree, 0);
        }
    }
    Ok(())
}

/// Dollars as printed: six decimals, or `cost unknown` when a call had no known price.
pub(crate) fn dollars(cost: Option<f64>) -> String {
    match cost {
        Some(cost) => format!("${cost:.6}"),
        None => "cost unknown (a model without a price)".to_owned(),
    }
}

fn print_tree(tree: &UsageTree, depth: usize) {
    let status = serde_json::to_value(tree.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    println!(
        "{}{} ({}, {status}): {} / {} tokens, {} / {}",
        "  ".repeat(depth + 1),
        tree.execution_id,
        tree.workflow_file,
        tree.own.input_tokens + tree.own.output_tokens,
        tree.total.input_tokens + tree.total.output_tokens,
        dollars(tree.own_cost_usd),
        dollars(tree.total_cost_usd)
    );
    for child in &tree.children {
        print_tree(child, depth + 1);
    }
}

/// The report as text.
fn render(report: &ExecutionReport, width: usize) -> String {
    let mut out = String::new();
    let status = serde_json::to_value(report.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    out += &format!(
        "execution {} ({}): {status}\n",
        report.execution_id, report.workflow_file
    );
    if let Some(parent) = &report.parent_execution_id {
        out += &format!("parent: {parent}\n");
    }
    if let Some(error) = &report.error {
        out += &format!("error: {error}\n");
    }
    if report.cancel_requested
        && report.status != contexture_engine::report::ExecutionStatus::Cancelled
    {
        out += "cancel requested\n";
    }
    out += &format!(
        "{} steps, {} LLM calls, {} tokens ({} in, {} out), {}\n",
        report.steps.len(),
        report.calls.len(),
        report.usage.input_tokens + report.usage.output_tokens,
        report.usage.input_tokens,
        report.usage.output_tokens,
        dollars(report.cost_usd)
    );
    out += "\nsteps:\n";
    for step in &report.steps {
        let item = step
            .start
            .item
            .map(|i| format!(" (item {})", i + 1))
            .unwrap_or_default();
        let end = match (&step.next, &step.error) {
            (Some(next), _) => format!("-> {next}"),
            (None, Some(error)) => format!("failed: {error}"),
            (None, None) if step.output.is_some() => "done".to_owned(),
            (None, None) => "not finished".to_owned(),
        };
        let child = step
            .start
            .child_execution_id
            .as_ref()
            .map(|c| format!(" (sub-execution {c})"))
            .unwrap_or_default();
        let fork = step
            .start
            .fork_thread
            .as_ref()
            .map(|f| format!(" (on fork {f})"))
            .unwrap_or_default();
        out += &format!(
            "  [{}] {}{item}{child}{fork} {end}\n",
            step.start.step, step.start.state_id
        );
    }
    out += &format!(
        "\nLLM calls (bar: S system, T tools, H history, R reserve, . free; {width} chars = the usable window):\n"
    );
    for (index, call) in report.calls.iter().enumerate() {
        let request = &call.request;
        let outcome = match &call.end {
            Some(end) if end.outcome == RequestOutcome::Completed => format!(
                "{} in / {} out{}{}",
                end.usage.input_tokens,
                end.usage.output_tokens,
                if end.usage_estimated {
                    " (estimated)"
                } else {
                    ""
                },
                end.cost_usd
                    .map(|c| format!(", ${c:.6}"))
                    .unwrap_or_default()
            ),
            Some(end) => format!(
                "{:?}: {}",
                end.outcome,
                end.error.as_deref().unwrap_or("no detail")
            )
            .to_lowercase(),
            None => "no end recorded".to_owned(),
        };
        out += &format!(
            "#{} step {} {} {}: {} messages, {outcome}\n",
            index + 1,
            request.step.map_or("?".to_owned(), |s| s.to_string()),
            call.state_id.as_deref().unwrap_or("?"),
            request.model.as_deref().unwrap_or("?"),
            request.messages.len(),
        );
        for compaction in &call.loop_compactions {
            out += &format!("   before it, {}\n", compaction.describe());
        }
        if let Some(budget) = &request.breakdown {
            out += &format!("   [{}]\n", bar(budget, width));
            let BudgetParts {
                system,
                tools,
                history,
                reserve,
                free,
            } = BudgetParts::of(budget);
            out += &format!(
                "   window {} x {} = {}: system {system}, tools {tools}, history {history}, reserve {reserve}, free {free}\n",
                budget.limits.context_window, budget.limits.budget_ratio, budget.limits.usable
            );
        }
        if let Some(reason) = request.fit.as_ref().and_then(|fit| fit.reason.as_ref()) {
            out += &format!("   fitted: {reason}\n");
        }
        for change in request.fit.iter().flat_map(|fit| fit.tool_result_changes()) {
            out += &format!("     {change}\n");
        }
    }
    out
}

/// Draws the budget as `width` characters; every part that is not empty gets at least one.
fn bar(budget: &BudgetBreakdown, width: usize) -> String {
    let cells = BudgetParts::of(budget).cells(width);
    cells
        .iter()
        .zip(['S', 'T', 'H', 'R', '.'])
        .map(|(&n, symbol)| symbol.to_string().repeat(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use contexture_core::budget::{BudgetPolicy, Limits};

    fn budget(
        system: u32,
        tools: u32,
        messages: u32,
        usable: u32,
        reserve: u32,
    ) -> BudgetBreakdown {
        BudgetBreakdown {
            model: "m".into(),
            exact: true,
            encoding: "o200k_base".into(),
            limits: Limits {
                context_window: usable,
                budget_ratio: BudgetPolicy::default().budget_ratio,
                usable,
                reserve_output: reserve,
                limit: usable - reserve,
            },
            system,
            tools,
            pinned: 0,
            summary: 0,
            messages,
            reply_priming: 3,
            used: system + tools + messages + 3,
            remaining: 0,
        }
    }

    #[test]
    fn bars_are_proportional_and_show_every_part() {
        let table = [
            (budget(100, 100, 297, 1000, 250), 20, "SSTTHHHHHHRRRRR....."),
            // 12 tokens of 128,000: the small parts still get a cell each.
            (
                budget(9, 0, 33, 128_000, 16_384),
                20,
                "SHRRR...............",
            ),
            (budget(0, 0, 997, 1000, 0), 10, "HHHHHHHHHH"),
        ];
        for (budget, width, expected) in table {
            let drawn = bar(&budget, width);
            assert_eq!(drawn.chars().count(), width);
            assert_eq!(drawn, expected);
        }
    }
}
