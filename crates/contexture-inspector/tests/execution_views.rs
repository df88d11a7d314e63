//! The execution view rendered from a real execution's log (the agent-loop example run with
//! its scripted replies): what each call shows, that the numbers are the log's, and that
//! contents are text.

use contexture_core::budget::BudgetParts;
use contexture_core::thread::{Event, Usage};
use contexture_engine::report::{ExecutionStatus, ReadReport, UsageTree, report};
use contexture_inspector::{ContextView, ExecutionView, ForkRow, HomeView, Inspector, ThreadView};
use contexture_store::ThreadInfo;

/// The agent-loop example's log: one step, seven calls that cut, clear and keep prefixes.
fn events() -> Vec<Event> {
    include_str!("data/agent_loop.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("an event"))
        .collect()
}

fn read(events: &[Event]) -> ReadReport {
    let report = report("agent-loop", events).expect("an execution");
    ReadReport {
        calls_made: report.calls.len(),
        next_after: None,
        report,
    }
}

/// The usage tree of `read` with one child, as a sub-workflow's would be.
fn tree(read: &ReadReport) -> UsageTree {
    let report = &read.report;
    let child = UsageTree {
        execution_id: "agent-loop~summarize.1".into(),
        workflow_file: "summarize.yaml".into(),
        status: ExecutionStatus::Completed,
        own: Usage::new(40, 2),
        own_cost_usd: None,
        total: Usage::new(40, 2),
        total_cost_usd: None,
        children: Vec::new(),
    };
    UsageTree {
        execution_id: report.execution_id.clone(),
        workflow_file: report.workflow_file.clone(),
        status: report.status,
        own: report.usage,
        own_cost_usd: report.cost_usd,
        total: report.usage.plus(child.total),
        total_cost_usd: None,
        children: vec![child],
    }
}

#[test]
fn an_execution_renders_every_call_with_its_budget_fitting_and_diff() {
    let events = events();
    let read = read(&events);
    let view = ExecutionView::new(&read, &tree(&read), 0);
    let html = Inspector::new().execution_fragment(&view).unwrap();
    insta::assert_snapshot!("agent_loop_fragment", html);
}

#[test]
fn the_budget_shown_for_each_call_is_its_recorded_breakdown() {
    let events = events();
    let read = read(&events);
    let html = Inspector::new()
        .execution_fragment(&ExecutionView::new(&read, &tree(&read), 0))
        .unwrap();
    assert_eq!(read.report.calls.len(), 7);
    for call in &read.report.calls {
        let start = html
            .find(&format!("data-call=\"{}\"", call.number))
            .unwrap_or_else(|| panic!("call {} is shown", call.number));
        let end = html[start..]
            .find("</article>")
            .map_or(html.len(), |end| start + end);
        let shown = &html[start..end];
        let budget = call.request.breakdown.as_ref().expect("a recorded budget");
        let parts = BudgetParts::of(budget);
        for (name, tokens) in ["system", "tools", "history", "reserve", "free"]
            .into_iter()
            .zip(parts.in_order())
        {
            assert!(
                shown.contains(&format!("data-part=\"{name}\">{tokens}<")),
                "call {}: {name} {tokens}",
                call.number
            );
        }
        assert!(shown.contains(&format!("data-window=\"usable\">{}<", budget.limits.usable)));
        // Every message sent is there, in order.
        assert_eq!(
            shown.matches("<li class=\"message").count()
                - call.diff.as_ref().map_or(0, |diff| diff.left.len()),
            call.request.messages.len(),
            "call {}",
            call.number
        );
    }
}

#[test]
fn a_saved_page_is_self_contained_and_loads_nothing() {
    let events = events();
    let read = read(&events);
    let page = Inspector::new()
        .execution_page(&ExecutionView::new(&read, &tree(&read), 0))
        .unwrap();
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
    ));
    assert!(page.contains(contexture_inspector::STYLE));
    for loads in ["<script", "<link", "src=", "@import", "url("] {
        assert!(!page.contains(loads), "the page holds {loads}");
    }
}

#[test]
fn markup_in_any_recorded_text_is_shown_as_text() {
    let hostile = r#"<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">"#;
    // Every text the log gives the view, replaced by markup.
    let events: Vec<Event> = include_str!("data/agent_loop.jsonl")
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            poison(&mut value, hostile);
            serde_json::from_value(value).expect("an event")
        })
        .collect();
    let read = read(&events);
    let mut tree = tree(&read);
    tree.children[0].execution_id = hostile.into();
    tree.children[0].workflow_file = hostile.into();
    let html = Inspector::new()
        .execution_page(&ExecutionView::new(&read, &tree, 0))
        .unwrap();
    assert!(html.contains("&lt;script&gt;window.pwned = 1&lt;&#x2f;script&gt;"));
    for markup in ["<script", "<img", "onerror=\""] {
        assert!(!html.contains(markup), "{markup} in the page");
    }
}

/// Replaces every string of `value` that is text a person wrote or a model or tool
/// returned (not the event's structure: types, roles, ids the fold matches on).
fn poison(value: &mut serde_json::Value, hostile: &str) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    (
                        "content" | "text" | "output" | "model" | "state_id" | "reason"
                        | "tool_call_id" | "name" | "arguments" | "next" | "error"
                        | "workflow_file",
                        Value::String(text),
                    ) => *text = hostile.to_owned(),
                    (_, value) => poison(value, hostile),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| poison(item, hostile)),
        _ => {}
    }
}

/// The agent-loop log read as a thread: its facts, a page of its events, a fork tree and
/// its last request's messages as a fitted context.
fn thread_view(events: &[Event], hostile: &str) -> ThreadView {
    let facts = ThreadInfo {
        id: format!("agent-loop{hostile}"),
        execution: true,
        parent: None,
        fork_seq: None,
        last_seq: events.last().unwrap().seq,
        created_at_ms: 1_764_000_000_000,
        updated_at_ms: 1_764_000_060_000,
        bytes: 82_000,
        message_bytes: 40_000,
        retention: None,
    };
    let record = events
        .iter()
        .rev()
        .find_map(|event| match &event.kind {
            contexture_core::thread::EventKind::RequestStarted(record) => Some(record),
            _ => None,
        })
        .unwrap();
    let context = ContextView::new(
        "gpt-4o-mini",
        &record.messages,
        record.breakdown.as_ref().unwrap(),
        record.fit.as_ref().unwrap(),
    );
    let forks = vec![
        ForkRow {
            depth: 0,
            id: facts.id.clone(),
            fork_seq: None,
            last_seq: facts.last_seq,
            current: true,
            more: false,
        },
        ForkRow {
            depth: 1,
            id: format!("branch{hostile}"),
            fork_seq: Some(3),
            last_seq: 9,
            current: false,
            more: false,
        },
    ];
    ThreadView::new(
        facts,
        &events[..10],
        0,
        true,
        10,
        forks,
        Ok(context),
        "gpt-4o-mini",
    )
}

#[test]
fn a_thread_renders_its_timeline_forks_and_fitted_context() {
    let events = events();
    let html = Inspector::new()
        .thread_fragment(&thread_view(&events, ""))
        .unwrap();
    assert!(html.contains("data-view=\"thread\""));
    assert_eq!(html.matches("<li class=\"event ").count(), 10);
    assert!(html.contains("data-fork=\"branch\""));
    assert!(html.contains("href=\"#/threads/branch\""));
    assert!(html.contains("data-page=\"next\""));
    assert!(
        html.contains("href=\"#/executions/agent-loop\""),
        "an execution's log links to its view"
    );
    // The context's numbers are the breakdown's.
    let record = events
        .iter()
        .rev()
        .find_map(|event| match &event.kind {
            contexture_core::thread::EventKind::RequestStarted(record) => Some(record),
            _ => None,
        })
        .unwrap();
    let parts = BudgetParts::of(record.breakdown.as_ref().unwrap());
    assert!(html.contains(&format!("data-part=\"history\">{}<", parts.history)));
}

#[test]
fn markup_in_thread_and_list_views_is_shown_as_text() {
    let hostile = "<script>window.pwned = 1</script>";
    let events: Vec<Event> = include_str!("data/agent_loop.jsonl")
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            poison(&mut value, hostile);
            serde_json::from_value(value).expect("an event")
        })
        .collect();
    let inspector = Inspector::new();
    let thread = inspector
        .thread_fragment(&thread_view(&events, hostile))
        .unwrap();
    let facts = thread_view(&events, hostile).facts;
    let home = inspector
        .home_fragment(&HomeView::new(hostile, vec![facts], true, false))
        .unwrap();
    for html in [thread, home] {
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!html.contains("<script"), "{html}");
        // In a link, an id is percent-encoded: it cannot end the attribute or the route.
        assert!(!html.contains("href=\"#/threads/agent-loop<"), "{html}");
    }
}
