//! The executor against the fake upstream over real HTTP: what the upstream receives
//! (history flags, window, provider rules), failures on purpose (500, a slow answer), and
//! streams.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{events, forty_call_workflow, kinds, sqlite, start};
use contexture_core::context::RenderOptions;
use contexture_core::fit::{Rules, validate};
use contexture_core::format::openai;
use contexture_core::registry::Registry;
use contexture_core::thread::{Event, EventKind, RequestOutcome};
use contexture_engine::executor::{ExecError, Executor, Observer};
use contexture_engine::hooks::{BeforeCall, CallInfo, Hook, HookError};
use contexture_engine::llm::FixedRouter;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{OpenAiProvider, RetryPolicy, StreamDelta};
use contexture_store::Store;
use serde_json::Value;

fn provider(base: &str, timeout: Duration, retries: u32) -> Arc<OpenAiProvider> {
    Arc::new(
        OpenAiProvider::new(base, Some("sk-test".into()))
            .with_timeout(timeout)
            .with_retry(RetryPolicy {
                max_retries: retries,
                initial_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(100),
            }),
    )
}

fn http_executor<S: Store>(store: S, base: &str) -> Executor<S> {
    Executor::new(
        store,
        Arc::new(FixedRouter::new(provider(base, Duration::from_secs(10), 2))),
    )
    .with_render_options(RenderOptions::fixed(0))
}

/// The texts of a request body's messages.
fn sent_texts(body: &Value) -> Vec<String> {
    openai::parse_request(body)
        .expect("the engine sends valid OpenAI requests")
        .iter()
        .map(|m| m.text())
        .collect()
}

#[tokio::test]
async fn include_in_llm_history_false_hides_an_output_from_later_requests() {
    let upstream = FakeUpstream::scripted([
        Reply::text(r#"{"ids": [101, 102, 103]}"#),
        Reply::text("processed"),
    ])
    .await;
    let base = upstream.base_url();
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store, &base);
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: fetch, assistant_id: a, task: Fetch the ids, next: {state_id: use, include_in_llm_history: false}}
  - {id: use, assistant_id: a, task: 'Process {{ ids | length }} users', next: {end: true}}
"#;
    let out = start(&exec, workflow, "start").await.unwrap();
    assert_eq!(out.output, "processed");
    let received = upstream.bodies();
    assert_eq!(received.len(), 2);
    assert_eq!(sent_texts(&received[1]), ["start", "Process 3 users"]);
    assert!(!received[1].to_string().contains("101"));
}

#[tokio::test]
async fn clear_prior_messages_gives_later_requests_a_clean_slate() {
    let upstream = FakeUpstream::scripted([
        Reply::text("phase one notes"),
        Reply::text("phase one summary"),
        Reply::text("phase two"),
    ])
    .await;
    let base = upstream.base_url();
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store, &base);
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini, system_prompt: You work in phases.}]
states:
  - {id: work, assistant_id: a, task: Work, next: {state_id: wrap}}
  - {id: wrap, assistant_id: a, task: Summarize, next: {state_id: next-phase, clear_prior_messages: true}}
  - {id: next-phase, assistant_id: a, task: Go on, next: {end: true}}
"#;
    start(&exec, workflow, "the request").await.unwrap();
    let received = upstream.bodies();
    assert_eq!(
        sent_texts(&received[1]),
        [
            "You work in phases.",
            "the request",
            "Work",
            "phase one notes",
            "Summarize"
        ]
    );
    // A clean slate: the system prompt and the next state's own task only.
    assert_eq!(sent_texts(&received[2]), ["You work in phases.", "Go on"]);
}

#[tokio::test]
async fn every_request_fits_the_model_window_and_validates() {
    let long_answer = |n: usize| {
        format!(
            "Finding {n}: {}",
            "the data shows a steady trend. ".repeat(30)
        )
    };
    let answers: Vec<Reply> = (0..8).map(|n| Reply::text(long_answer(n))).collect();
    let upstream = FakeUpstream::scripted(answers).await;
    let base = upstream.base_url();
    let mut registry = Registry::builtin();
    registry
        .apply_toml(
            "[models.small-window]\ncontext_window = 1200\nmax_output_tokens = 200\nencoding = \"o200k_base\"\n",
            "small.toml",
        )
        .unwrap();
    let registry = Arc::new(registry);
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &base).with_registry(registry.clone());
    let mut workflow = String::from(
        "assistants: [{id: a, model: small-window, system_prompt: You analyse data., tools: [lookup]}]\n\
         tools: [{id: lookup, description: Look a figure up., response: '42'}]\nstates:\n",
    );
    for n in 0..8 {
        let next = if n == 7 {
            "end".to_owned()
        } else {
            format!("s{}", n + 1)
        };
        workflow += &format!(
            "  - {{id: s{n}, assistant_id: a, task: 'Analyse part {n}', next: {{state_id: {next}}}}}\n"
        );
    }
    start(&exec, &workflow, "Analyse the dataset.")
        .await
        .unwrap();
    let model = registry.resolve("small-window");
    let limit = 1200 - 200;
    let received = upstream.bodies();
    assert_eq!(received.len(), 8);
    for (n, body) in received.iter().enumerate() {
        let messages = openai::parse_request(body).unwrap();
        let tools = body["tools"].as_array().cloned().unwrap_or_default();
        let tokens = model.counter.count_request(&messages, &tools).total;
        assert!(tokens <= limit, "request {n}: {tokens} tokens > {limit}");
        assert_eq!(validate(&messages, Rules::OpenAi), vec![], "request {n}");
        assert_eq!(body["max_tokens"], 200, "the reserve is the reply's limit");
        assert_eq!(
            messages.last().unwrap().text(),
            format!("Analyse part {n}"),
            "the step's task is always sent"
        );
    }
    // The later requests were trimmed, and the log says what was left out and why.
    let log = events(&store, "run-1").await;
    let trimmed = common::requests(&log)
        .into_iter()
        .filter(|r| r.fit.as_ref().is_some_and(|f| !f.dropped.is_empty()))
        .collect::<Vec<_>>();
    assert!(trimmed.len() >= 3, "{} trimmed", trimmed.len());
    let reason = trimmed[0].fit.as_ref().unwrap().reason.as_ref().unwrap();
    assert!(
        reason.contains("the history did not fit 1000 tokens"),
        "{reason}"
    );
    // Nothing was lost: the thread keeps every exchange.
    let thread = store.load("run-1").await.unwrap();
    assert_eq!(thread.projection().messages.len(), 1 + 8 * 2);
}

/// Counts before/after firings.
#[derive(Default)]
struct Count(Mutex<(u32, u32)>);

impl Hook for Count {
    fn before_llm_call(
        &self,
        _: &CallInfo,
        _: &[contexture_core::Message],
    ) -> Result<BeforeCall, HookError> {
        self.0.lock().unwrap().0 += 1;
        Ok(BeforeCall::Continue)
    }
    fn after_llm_call(
        &self,
        _: &CallInfo,
        reply: contexture_core::Message,
    ) -> Result<contexture_core::Message, HookError> {
        self.0.lock().unwrap().1 += 1;
        Ok(reply)
    }
}

#[tokio::test]
async fn a_500_followed_by_a_200_is_retried_and_succeeds() {
    let upstream = FakeUpstream::scripted([
        Reply::error(500, "busy"),
        Reply::text("recovered").usage(50, 10),
    ])
    .await;
    let base = upstream.base_url();
    let (_dir, store) = sqlite().await;
    let count = Arc::new(Count::default());
    let exec = http_executor(store.clone(), &base).with_hook(count.clone());
    let out = start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: s, assistant_id: a, task: T}]",
        "",
    )
    .await
    .unwrap();
    assert_eq!(out.output, "recovered");
    assert_eq!(upstream.bodies().len(), 2);
    assert_eq!(upstream.bodies()[0], upstream.bodies()[1]);
    assert_eq!(*count.0.lock().unwrap(), (1, 1), "hooks fire once per call");
    let ends: Vec<_> = events(&store, "run-1")
        .await
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::RequestEnded(end) => Some(end),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].attempts, Some(2));
    assert_eq!(
        ends[0].usage.input_tokens, 50,
        "the provider's usage is kept"
    );
}

#[tokio::test]
async fn a_timeout_ends_the_step_with_a_clear_error_and_loses_nothing() {
    let upstream = FakeUpstream::scripted([
        Reply::text(r#"{"found": "alpha"}"#),
        Reply::text("too late").after(Duration::from_secs(3)),
    ])
    .await;
    let base = upstream.base_url();
    let (_dir, store) = sqlite().await;
    let exec = Executor::new(
        store.clone(),
        Arc::new(FixedRouter::new(provider(
            &base,
            Duration::from_millis(300),
            0,
        ))),
    );
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: find, assistant_id: a, task: Find, next: {state_id: use}}
  - {id: use, assistant_id: a, task: 'Use {{found}}', next: {end: true}}
"#;
    let error = start(&exec, workflow, "").await.unwrap_err();
    assert!(
        matches!(&error, ExecError::StepFailed { step: 2, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("no answer within 300ms"),
        "{error}"
    );
    let log = events(&store, "run-1").await;
    let names = kinds(&log);
    assert_eq!(
        &names[names.len() - 4..],
        [
            "request_started",
            "request_ended",
            "step_failed",
            "run_ended"
        ]
    );
    assert!(log.iter().any(|e| matches!(&e.kind,
        EventKind::RequestEnded(end) if end.outcome == RequestOutcome::Failed)));
    // Everything stored before the timeout is still there.
    let thread = store.load("run-1").await.unwrap();
    assert_eq!(thread.store()["found"], "alpha");
    assert_eq!(
        common::texts(&thread.projection().messages),
        ["Find", r#"{"found": "alpha"}"#]
    );
    // And the run goes on from there against a server that answers.
    let upstream = FakeUpstream::scripted([Reply::text("used alpha")]).await;
    let base = upstream.base_url();
    let out = http_executor(store.clone(), &base)
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(out.output, "used alpha");
    assert_eq!(
        sent_texts(&upstream.bodies()[0]).last().unwrap(),
        "Use alpha"
    );
}

/// Collects streamed text.
#[derive(Default)]
struct Deltas(Mutex<String>);

impl Observer for Deltas {
    fn on_event(&self, _: &str, _: &Event) {}
    fn on_delta(&self, _: &str, _: u64, delta: &StreamDelta) {
        if let StreamDelta::Text(text) = delta {
            self.0.lock().unwrap().push_str(text);
        }
    }
}

#[tokio::test]
async fn streamed_replies_reach_the_observer_piece_by_piece() {
    let upstream = FakeUpstream::scripted([Reply::text_in_pieces(["Hel", "lo ", "there"])]).await;
    let base = upstream.base_url();
    let (_dir, store) = sqlite().await;
    let deltas = Arc::new(Deltas::default());
    let exec = http_executor(store, &base)
        .with_streaming(true)
        .with_observer(deltas.clone());
    let out = start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: s, assistant_id: a, task: Hi}]",
        "",
    )
    .await
    .unwrap();
    assert_eq!(out.output, "Hello there");
    assert_eq!(*deltas.0.lock().unwrap(), "Hello there");
    assert_eq!(upstream.bodies()[0]["stream"], true);
}

/// The forty-call agent loop of the agent-loop tests over real HTTP: 3,000-token results on a
/// 16,000-token window with clearing and hysteresis. Every request the upstream received
/// parses as OpenAI's format, fits the window (counted as received), validates for OpenAI's
/// and Anthropic's rules, and keeps the task and every call's result.
#[tokio::test]
async fn a_forty_call_loop_over_http_sends_only_requests_that_fit_and_validate() {
    let mut replies: Vec<Reply> = (0..40)
        .map(|call| {
            Reply::tool_call(
                &format!("call-{call}"),
                "search",
                serde_json::json!({"q": call}),
            )
        })
        .collect();
    replies.push(Reply::text("forty searches done"));
    let upstream = FakeUpstream::scripted(replies).await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store, &upstream.base_url());
    let workflow = forty_call_workflow(
        "      clear_tool_results: {trigger_tokens: 9000, keep: 3, clear_at_least: 2000}\n      hysteresis: {high: 0.9, low: 0.6}",
    );
    let out = start(&exec, &workflow, "").await.unwrap();
    assert_eq!(out.output, "forty searches done");
    let counter = Registry::builtin().resolve("gpt-4o-mini").counter;
    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), 41);
    for (n, body) in bodies.iter().enumerate() {
        let messages = openai::parse_request(body).expect("a valid OpenAI request");
        let tokens = counter.count_request(&messages, &[]).total;
        assert!(tokens <= 15_000, "request {n}: {tokens} tokens");
        for rules in [Rules::OpenAi, Rules::Anthropic] {
            assert_eq!(validate(&messages, rules), vec![], "request {n}");
        }
        assert!(
            messages
                .iter()
                .any(|m| m.text() == "Search forty times and report.")
        );
        let results = messages.iter().filter(|m| m.tool_call_id.is_some()).count();
        assert_eq!(results, n, "request {n}: every call keeps its result");
    }
}
