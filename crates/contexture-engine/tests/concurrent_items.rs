//! Iterations whose items run at once (`max_concurrency`), over real HTTP: up to that many
//! items are in flight together, never more; whatever order they finish in, the log, the
//! step numbers, the output and the merged store read in item order; a failed item stops
//! the iteration with the items before it recorded, and a resume runs only what is left;
//! token and cost budgets hold with items at once as one at a time; bad values are named.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{events, failed_steps, http_executor, sqlite, start};
use contexture_core::thread::{EventKind, RunLimits};
use contexture_engine::executor::ExecError;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::Store;
use serde_json::{Value, json};

/// A workflow that reviews each of the input's `files`, `CONCURRENCY` at a time, collecting
/// the reviews under `reviews`.
fn workflow(concurrency: &str) -> String {
    format!(
        r#"
assistants: [{{id: a, model: gpt-4o-mini}}]
states:
  - id: plan
    transform: {{planned: true}}
    next: {{state_id: each, iter_key: files, iter_merge: append{concurrency}}}
  - id: each
    assistant_id: a
    task: 'Review {{{{ item }}}}'
    next: {{state_id: end, output_key: reviews}}
"#
    )
}

const INPUT: &str = r#"{"files": ["a", "b", "c", "d"]}"#;

/// When each call arrived and when its reply was sent.
type Spans = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// A provider that answers `Review X` with `review of X` after a delay that shrinks with
/// the item (the first item is the slowest, so items finish in reverse order when they run
/// at once); `failing` items get a 400.
fn reviewer(upstream: &FakeUpstream, failing: &'static [&'static str]) -> Spans {
    let spans: Spans = Arc::default();
    let seen = spans.clone();
    upstream.otherwise(move |_, request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let task = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned();
        let item = task.trim_start_matches("Review ").to_owned();
        let delay = match item.as_str() {
            "a" => 900,
            "b" => 600,
            "c" => 300,
            _ => 50,
        };
        let now = Instant::now();
        seen.lock()
            .unwrap()
            .push((item.clone(), now, now + Duration::from_millis(delay)));
        if failing.contains(&item.as_str()) {
            Reply::error(400, "this item is refused").after(Duration::from_millis(delay))
        } else {
            Reply::text(format!("review of {item}")).after(Duration::from_millis(delay))
        }
    });
    spans
}

/// The most calls that were in flight at one moment.
fn most_at_once(spans: &Spans) -> usize {
    let spans = spans.lock().unwrap();
    spans
        .iter()
        .map(|(_, arrived, _)| {
            spans
                .iter()
                .filter(|(_, from, to)| from <= arrived && arrived < to)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The items of the recorded step ends, with their step numbers, in log order.
async fn item_ends<S: Store>(store: &S, id: &str) -> Vec<(u64, Option<usize>, String)> {
    events(store, id)
        .await
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::StepFinished(end) => Some((end.step, end.item, end.output)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn items_run_up_to_max_concurrency_at_once_and_come_together_in_item_order() {
    for (concurrency, most) in [
        ("", 1),
        (", max_concurrency: 2", 2),
        (", max_concurrency: 4", 4),
    ] {
        let upstream = FakeUpstream::start().await;
        let spans = reviewer(&upstream, &[]);
        let (_dir, store) = sqlite().await;
        let exec = http_executor(store.clone(), &upstream.base_url());
        let out = start(&exec, &workflow(concurrency), INPUT)
            .await
            .expect("every item is answered");
        assert_eq!(
            most_at_once(&spans),
            most,
            "{concurrency:?}: calls in flight together"
        );
        let reviews = json!(["review of a", "review of b", "review of c", "review of d"]);
        assert_eq!(out.output, reviews.to_string(), "{concurrency:?}");
        assert_eq!(out.store.get("reviews"), Some(&reviews), "{concurrency:?}");
        assert_eq!(
            item_ends(&store, "run-1").await,
            [
                (1, None, r#"{"planned":true}"#.to_owned()),
                (2, Some(0), "review of a".to_owned()),
                (3, Some(1), "review of b".to_owned()),
                (4, Some(2), "review of c".to_owned()),
                (5, Some(3), "review of d".to_owned()),
            ],
            "{concurrency:?}: the log reads as if the items had run one after another"
        );
        // Each item's call is recorded inside its own step, in item order.
        let log = events(&store, "run-1").await;
        let calls: Vec<u64> = log
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::RequestStarted(record) => record.step,
                _ => None,
            })
            .collect();
        assert_eq!(calls, [2, 3, 4, 5], "{concurrency:?}");
        let started: Vec<u64> = log
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::StepStarted(start) => Some(start.step),
                _ => None,
            })
            .collect();
        assert_eq!(started, [1, 2, 3, 4, 5], "{concurrency:?}");
    }
}

/// Items of a state that runs in a named context: the switch is recorded once, by the first
/// item, whatever the timing, and every item's request sees that context.
#[tokio::test]
async fn items_in_a_named_context_record_one_switch() {
    let upstream = FakeUpstream::start().await;
    reviewer(&upstream, &[]);
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let in_context = workflow(", max_concurrency: 4").replace(
        "    assistant_id: a\n    task: 'Review",
        "    assistant_id: a\n    thread_context: reviews\n    task: 'Review",
    );
    assert!(in_context.contains("thread_context"));
    start(&exec, &in_context, INPUT)
        .await
        .expect("the items run");
    let log = events(&store, "run-1").await;
    let switches = log
        .iter()
        .filter(|event| matches!(&event.kind, EventKind::ContextSwitched { .. }))
        .count();
    assert_eq!(switches, 1);
    assert_eq!(
        item_ends(&store, "run-1").await.len(),
        5,
        "the plan and four items"
    );
}

#[tokio::test]
async fn a_failed_item_stops_the_iteration_after_the_items_before_it_and_a_resume_runs_the_rest() {
    let upstream = FakeUpstream::start().await;
    let spans = reviewer(&upstream, &["c"]);
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let error = start(&exec, &workflow(", max_concurrency: 4"), INPUT)
        .await
        .expect_err("item c is refused");
    match &error {
        ExecError::StepFailed { step, .. } => assert_eq!(*step, 4, "item c's step"),
        other => panic!("{other:?}"),
    }
    // The items before the failed one are recorded; the one after it, although it finished
    // first, is not: a resume runs it again.
    assert_eq!(
        item_ends(&store, "run-1")
            .await
            .into_iter()
            .map(|(step, item, _)| (step, item))
            .collect::<Vec<_>>(),
        [(1, None), (2, Some(0)), (3, Some(1))]
    );
    let log = events(&store, "run-1").await;
    assert_eq!(failed_steps(&log), [4]);
    assert!(matches!(
        log.last().map(|e| &e.kind),
        Some(EventKind::RunEnded(_))
    ));

    // Resumed against a provider that answers every item: only c and d are asked again.
    let healed = FakeUpstream::start().await;
    let again = reviewer(&healed, &[]);
    let exec = http_executor(store.clone(), &healed.base_url());
    let out = exec
        .resume("run-1")
        .await
        .expect("the rest of the items run");
    assert_eq!(
        out.output,
        json!(["review of a", "review of b", "review of c", "review of d"]).to_string()
    );
    let mut asked: Vec<String> = again.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    asked.sort();
    assert_eq!(asked, ["c", "d"]);
    drop(spans);
}

/// The reply limits of the recorded calls, sorted, and the tokens they spent together.
async fn calls_and_spending<S: Store>(store: &S, id: &str) -> (Vec<u32>, u64) {
    let mut limits = Vec::new();
    let mut spent = 0;
    for event in events(store, id).await {
        match event.kind {
            EventKind::RequestStarted(request) => {
                limits.push(request.budget.expect("a budget").max_output_tokens);
            }
            EventKind::RequestEnded(end) => {
                spent += end.usage.input_tokens + end.usage.output_tokens;
            }
            _ => {}
        }
    }
    limits.sort_unstable();
    (limits, spent)
}

/// The review workflow with replies limited to `reserve` tokens, at `concurrency`, under a
/// token budget of `max_tokens`.
fn budgeted(reserve: u32, concurrency: u32, max_tokens: u64) -> String {
    workflow(&format!(", max_concurrency: {concurrency}")).replace(
        "model: gpt-4o-mini}",
        &format!("model: gpt-4o-mini, context: {{reserve: {reserve}}}}}"),
    ) + &format!("limits: {{max_tokens: {max_tokens}}}\n")
}

#[tokio::test]
async fn token_and_cost_budgets_let_items_run_at_once_and_hold_as_one_at_a_time_would() {
    // Roomy budgets: each call reserves its request and its most reply before it starts,
    // and four reservations fit, so four items are in flight at once.
    for limits in [
        RunLimits {
            max_tokens: Some(1_000_000),
            ..RunLimits::default()
        },
        RunLimits {
            max_cost_usd: Some(1.0),
            ..RunLimits::default()
        },
    ] {
        let upstream = FakeUpstream::start().await;
        let spans = reviewer(&upstream, &[]);
        let (_dir, store) = sqlite().await;
        let exec = http_executor(store.clone(), &upstream.base_url()).with_limits(limits);
        let out = start(&exec, &workflow(", max_concurrency: 4"), INPUT)
            .await
            .expect("the budget is large enough");
        assert_eq!(most_at_once(&spans), 4, "{limits:?}");
        assert_eq!(
            out.output,
            json!(["review of a", "review of b", "review of c", "review of d"]).to_string()
        );
    }

    // Each call below sends 38 tokens (as estimated) and reserves 100 for its reply; the
    // fake spends 12 (10 in, 2 out). A budget of 300 holds two reservations at once, not
    // three: two items run at once, the others wait for a reservation to end, every reply
    // keeps its full limit, and the spending stays inside the budget.
    let upstream = FakeUpstream::start().await;
    let spans = reviewer(&upstream, &[]);
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    start(&exec, &budgeted(100, 4, 300), INPUT)
        .await
        .expect("every item fits the budget");
    let (limits, spent) = calls_and_spending(&store, "run-1").await;
    assert_eq!(most_at_once(&spans), 2, "two reservations fit at once");
    assert_eq!(limits, [100, 100, 100, 100], "no reply was shortened");
    assert_eq!(spent, 4 * 12);

    // Near its end, a budget shortens replies and stops the run exactly as one item at a
    // time does: the same calls with the same reply limits, the same spending, the same
    // error, whatever max_concurrency says.
    let mut outcomes = Vec::new();
    for concurrency in [1, 4] {
        let upstream = FakeUpstream::start().await;
        reviewer(&upstream, &[]);
        let (_dir, store) = sqlite().await;
        let exec = http_executor(store.clone(), &upstream.base_url());
        let error = start(&exec, &budgeted(100, concurrency, 60), INPUT)
            .await
            .map(|out| out.output)
            .map_err(|error| error.to_string());
        let ends: Vec<(u64, Option<usize>)> = item_ends(&store, "run-1")
            .await
            .into_iter()
            .map(|(step, item, _)| (step, item))
            .collect();
        outcomes.push((calls_and_spending(&store, "run-1").await, ends, error));
    }
    assert_eq!(outcomes[0], outcomes[1], "max_concurrency 1, then 4");
    let ((limits, spent), _, result) = &outcomes[1];
    assert!(*spent <= 60, "spent {spent} of 60");
    assert!(
        limits.iter().any(|limit| *limit < 100),
        "the budget's end shortened a reply: {limits:?} ({result:?})"
    );
}

#[tokio::test]
async fn a_step_budget_holds_exactly_with_items_at_once() {
    // A step budget with assistant items: they still run at once, and the budget stops the
    // run at the same step as one at a time would: plan, a and b fit in 3 steps, c does not.
    let upstream = FakeUpstream::start().await;
    let spans = reviewer(&upstream, &[]);
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url()).with_limits(RunLimits {
        max_steps: Some(3),
        ..RunLimits::default()
    });
    let error = start(&exec, &workflow(", max_concurrency: 4"), INPUT)
        .await
        .expect_err("the fourth step passes the step budget");
    assert!(error.to_string().contains("3"), "{error}");
    assert_eq!(
        item_ends(&store, "run-1")
            .await
            .into_iter()
            .map(|(step, item, _)| (step, item))
            .collect::<Vec<_>>(),
        [(1, None), (2, Some(0)), (3, Some(1))]
    );
    let mut asked: Vec<String> = spans.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    asked.sort();
    assert_eq!(asked, ["a", "b"], "no call is made past the step budget");
}

#[tokio::test]
async fn max_concurrency_must_be_a_sensible_number_of_items_on_an_iteration() {
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store, "http://127.0.0.1:9");
    for (concurrency, expected) in [
        (
            ", max_concurrency: 0",
            "max_concurrency is 0: give a number of items from 1",
        ),
        (", max_concurrency: 65", "max_concurrency is 65"),
    ] {
        let error = start(&exec, &workflow(concurrency), INPUT)
            .await
            .expect_err("refused before any step");
        let text = error.to_string();
        assert!(text.contains("states[0].next.max_concurrency"), "{text}");
        assert!(text.contains(expected), "{text}");
        assert!(
            text.contains("workflow.yaml:"),
            "names the file and line: {text}"
        );
    }
    let no_iteration =
        "states:\n  - {id: s, transform: {a: 1}, next: {state_id: end, max_concurrency: 2}}\n";
    let error = start(&exec, no_iteration, "").await.expect_err("refused");
    assert!(
        error.to_string().contains("max_concurrency needs iter_key"),
        "{error}"
    );
}

#[tokio::test]
async fn a_cancellation_reaches_every_item_in_flight_and_ends_the_run_once() {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|_, _| Reply::hang());
    let (_dir, store) = sqlite().await;
    let exec = Arc::new(
        http_executor(store.clone(), &upstream.base_url())
            .with_cancel_poll(Duration::from_millis(20)),
    );
    let running = {
        let exec = exec.clone();
        tokio::spawn(async move { start(&exec, &workflow(", max_concurrency: 3"), INPUT).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.call_count() < 3 {
        assert!(Instant::now() < deadline, "three items should be in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    exec.cancel("run-1", Some("enough".into())).await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the items stop")
        .unwrap()
        .expect_err("cancelled");
    assert!(error.to_string().contains("enough"), "{error}");
    assert_eq!(
        upstream.call_count(),
        3,
        "no item starts after the cancellation"
    );
    let log = events(&store, "run-1").await;
    let ended: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::RunEnded(end) => Some(end.status),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [contexture_core::thread::RunStatus::Cancelled]);
    // The first item's cancelled call and failure are recorded; the items after it are not.
    assert_eq!(failed_steps(&log), [2]);
}
