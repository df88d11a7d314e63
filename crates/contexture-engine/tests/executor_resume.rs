//! Resuming runs from their log: finished steps never run again, a failed
//! or interrupted step runs anew, and the same workflow gives the same result on SQLite and
//! on PostgreSQL.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{events, executor, kinds, script, sqlite, start, texts};
use contexture_core::thread::{EventKind, RequestOutcome, RunStatus};
use contexture_engine::executor::{ExecError, Executor, RunRequest};
use contexture_llm::{BoxFuture, ChatRequest, ChatResponse, LlmError, Provider, StreamDelta};
use contexture_store::{NewEvent, Store};

const THREE_STEPS: &str = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: a, task: One, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Two, next: {state_id: three}}
  - {id: three, assistant_id: a, task: Three, next: {end: true}}
"#;

#[tokio::test]
async fn a_failed_step_runs_anew_on_resume_and_finished_steps_do_not() {
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: '{\"a\": 1}'}, {error: {status: 500, message: down}}]");
    let exec = executor(store.clone(), provider.clone());
    let error = start(&exec, THREE_STEPS, "go").await.unwrap_err();
    assert!(
        matches!(&error, ExecError::StepFailed { step: 2, state_id, .. } if state_id == "two"),
        "{error}"
    );
    assert!(error.to_string().contains("HTTP 500: down"), "{error}");
    let failed = exec.load("run-1").await.unwrap();
    assert_eq!(failed.end().unwrap().status, RunStatus::Failed);

    let provider = script("[{content: '{\"b\": 2}'}, {content: done}]");
    let exec = executor(store.clone(), provider.clone());
    let out = exec.resume("run-1").await.unwrap();
    assert_eq!(out.output, "done");
    assert_eq!(
        serde_json::to_value(&out.store).unwrap(),
        serde_json::json!({"a": 1, "b": 2})
    );
    let sent = provider.requests();
    assert_eq!(sent.len(), 2, "step one was not sent again");
    assert_eq!(
        texts(&sent[0].messages),
        ["go", "One", r#"{"a": 1}"#, "Two"]
    );
    assert_eq!(out.steps, 4, "steps one, two (failed), two, three");
    let log = events(&store, "run-1").await;
    let names = kinds(&log);
    assert_eq!(names.iter().filter(|k| **k == "run_ended").count(), 2);
    assert_eq!(names.iter().filter(|k| **k == "step_failed").count(), 1);

    // Resuming a completed run changes nothing.
    let again = executor(store.clone(), script("[]"))
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(again, out);
    assert_eq!(events(&store, "run-1").await.len(), log.len());
}

/// A provider that never answers: the process "dies" during the call.
struct Hang;

impl Provider for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn complete<'a>(
        &'a self,
        _request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(std::future::pending())
    }
    fn stream<'a>(
        &'a self,
        _request: &'a ChatRequest,
        _on_delta: &'a mut (dyn FnMut(StreamDelta) + Send),
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_run_interrupted_during_a_call_closes_the_call_and_runs_the_step_anew() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), Arc::new(Hang));
    // The process "dies" once the call is in flight: the run is dropped there, however long
    // a busy machine takes to get to it.
    let in_flight = async {
        loop {
            if let Ok(log) = exec.load("run-1").await
                && log.thread().in_flight().is_some()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        _ = start(&exec, THREE_STEPS, "go") => panic!("the run cannot end: its call never answers"),
        reached = tokio::time::timeout(Duration::from_secs(30), in_flight) => {
            reached.expect("the call goes in flight");
        }
    }
    let log = exec.load("run-1").await.unwrap();
    assert!(log.open_step().is_some());
    assert!(log.thread().in_flight().is_some());

    let provider = script("[{content: a}, {content: b}, {content: c}]");
    let out = executor(store.clone(), provider.clone())
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(out.output, "c");
    let ends: Vec<_> = events(&store, "run-1")
        .await
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::RequestEnded(end) => Some((end.outcome, end.error)),
            _ => None,
        })
        .collect();
    assert_eq!(ends[0].0, RequestOutcome::Failed);
    assert!(ends[0].1.as_deref().unwrap().starts_with("interrupted"));
    assert_eq!(ends.len(), 4);
}

/// Answers its first `answered` calls from a script, then never answers again: the process
/// "dies" during the next call.
struct ScriptThenHang {
    script: Arc<contexture_llm::ScriptedProvider>,
    answered: usize,
    calls: std::sync::atomic::AtomicUsize,
}

impl Provider for ScriptThenHang {
    fn name(&self) -> &str {
        "script-then-hang"
    }
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if call < self.answered {
            self.script.complete(request)
        } else {
            Box::pin(std::future::pending())
        }
    }
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        _on_delta: &'a mut (dyn FnMut(StreamDelta) + Send),
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        self.complete(request)
    }
}

const TOOL_LOOP: &str = r#"
assistants:
  - {id: a, model: gpt-4o-mini, tools: [echo-tool]}
tools:
  - {id: echo-tool, tool: echo}
states:
  - {id: s, assistant_id: a, task: Go, next: {end: true}}
"#;

#[tokio::test]
async fn a_step_interrupted_in_its_tool_loop_goes_on_from_its_log_without_calling_again() {
    let (_dir, store) = sqlite().await;
    // Two turns of tool calls answered, then the third call never comes back.
    let first = Arc::new(ScriptThenHang {
        script: script(
            r#"
- tool_calls: [{id: c1, name: echo-tool, arguments: {n: 1}}]
- tool_calls: [{id: c2, name: echo-tool, arguments: {n: 2}}, {id: c3, name: echo-tool, arguments: {n: 3}}]
"#,
        ),
        answered: 2,
        calls: std::sync::atomic::AtomicUsize::new(0),
    });
    let exec = executor(store.clone(), first.clone());
    let third_in_flight = async {
        loop {
            if let Ok(log) = exec.load("run-1").await
                && log.thread().in_flight().is_some()
                && log.open_step_messages().is_some_and(|m| m.len() == 5)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        _ = start(&exec, TOOL_LOOP, "go") => panic!("the run cannot end: its third call never answers"),
        reached = tokio::time::timeout(Duration::from_secs(30), third_in_flight) => {
            reached.expect("the third call goes in flight");
        }
    }

    // Resumed: only the call that was in flight is made again, with the loop so far.
    let provider = script("[{content: finished}]");
    let out = executor(store.clone(), provider.clone())
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(out.output, "finished");
    let sent = provider.requests();
    assert_eq!(
        sent.len(),
        1,
        "the model's two answered turns were not asked for again"
    );
    let results: Vec<(String, String)> = sent[0]
        .messages
        .iter()
        .filter_map(|m| Some((m.tool_call_id.clone()?.to_string(), m.text())))
        .collect();
    assert_eq!(
        results,
        [
            ("c1".to_owned(), r#"{"n":1}"#.to_owned()),
            ("c2".to_owned(), r#"{"n":2}"#.to_owned()),
            ("c3".to_owned(), r#"{"n":3}"#.to_owned()),
        ]
    );
    // Both attempts of the third call are in the log: the first closed as interrupted.
    let log = events(&store, "run-1").await;
    let ends: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RequestEnded(end) => Some((end.outcome, end.error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 4, "{ends:?}");
    assert_eq!(ends[2].0, RequestOutcome::Failed);
    assert!(ends[2].1.as_deref().unwrap().starts_with("interrupted"));
    let names = kinds(&log);
    assert_eq!(names.iter().filter(|k| **k == "step_finished").count(), 1);
    // The finished step's own log holds its whole loop.
    let finished_step = log
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::StepFinished(end) => Some(end.step),
            _ => None,
        })
        .unwrap();
    let own = log
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::StepMessage(m) if m.step == finished_step))
        .count();
    assert_eq!(own, 5, "two turns and three results");
}

#[tokio::test]
async fn a_step_interrupted_between_its_tool_calls_runs_only_the_calls_without_results() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    // The log as a process that stopped after the first of two tool calls left it.
    let request = RunRequest::new("workflow.yaml", TOOL_LOOP, "go");
    let mut request = request;
    request.execution_id = Some("run-1".into());
    exec.open(request).await.unwrap();
    let turn = contexture_core::Message::assistant_tool_calls(vec![
        contexture_core::ToolCall::new("c1", "echo-tool", r#"{"n":1}"#),
        contexture_core::ToolCall::new("c2", "echo-tool", r#"{"n":2}"#),
    ]);
    let step = |message| {
        NewEvent::new(EventKind::StepMessage(
            contexture_core::thread::StepMessage { step: 1, message },
        ))
    };
    store
        .append(
            "run-1",
            vec![
                NewEvent::new(EventKind::StepStarted(contexture_core::thread::StepStart {
                    step: 1,
                    state_id: "s".into(),
                    item: None,
                    task: Some("Go".into()),
                    arguments: None,
                    child_execution_id: None,
                    fork_thread: None,
                })),
                step(turn),
                step(contexture_core::Message::tool_result("c1", r#"{"n":1}"#)),
            ],
        )
        .await
        .unwrap();
    let provider = script("[{content: finished}]");
    let out = executor(store.clone(), provider.clone())
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(out.output, "finished");
    let sent = provider.requests();
    assert_eq!(sent.len(), 1);
    let answered: Vec<String> = sent[0]
        .messages
        .iter()
        .filter_map(|m| m.tool_call_id.as_ref().map(|id| id.to_string()))
        .collect();
    assert_eq!(answered, ["c1", "c2"], "c1's result kept, c2 run once");
}

#[tokio::test]
async fn an_iteration_resumes_at_the_first_unfinished_item() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: start, transform: {n: 3}, next: {state_id: each, iter_key: items, include_in_llm_history: false}}
  - {id: each, assistant_id: a, task: 'Item {{item}}', next: {end: true, output_key: out, append_to_context: true}}
"#;
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: r1}, {error: {status: 503}}]");
    let exec = executor(store.clone(), provider);
    start(&exec, workflow, r#"{"items": ["x", "y", "z"]}"#)
        .await
        .unwrap_err();
    let provider = script("[{content: r2}, {content: r3}]");
    let out = executor(store.clone(), provider.clone())
        .resume("run-1")
        .await
        .unwrap();
    let sent: Vec<String> = provider
        .requests()
        .iter()
        .map(|r| r.messages.last().unwrap().text())
        .collect();
    assert_eq!(sent, ["Item y", "Item z"]);
    assert_eq!(
        out.store.get("out"),
        Some(&serde_json::json!(["r1", "r2", "r3"]))
    );
}

#[tokio::test]
async fn resuming_what_is_not_a_run_says_so() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    assert!(matches!(
        exec.resume("nope").await.unwrap_err(),
        ExecError::NotFound { .. }
    ));
    store
        .append_one(
            "chat",
            NewEvent::new(EventKind::MessageAppended {
                message: contexture_core::Message::user("hi"),
            }),
        )
        .await
        .unwrap();
    let error = exec.resume("chat").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("this thread is not an execution"),
        "{error}"
    );
}

async fn run_example<S: Store>(store: S, id: &str) -> contexture_engine::executor::RunOutcome {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/iterate");
    let replies = std::fs::read_to_string(format!("{root}/replies.yaml")).unwrap();
    let exec: Executor<S> = executor(store, script(&replies));
    exec.start(RunRequest {
        workflow_file: "examples/iterate/workflow.yaml".into(),
        workflow_text: std::fs::read_to_string(format!("{root}/workflow.yaml")).unwrap(),
        input: std::fs::read_to_string(format!("{root}/input.json")).unwrap(),
        execution_id: Some(id.into()),
        llm: None,
        conversation: None,
        origin: Default::default(),
        user_context: None,
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_same_run_on_postgresql_gives_the_same_outcome_and_log() {
    let Some((pg, _schema)) = contexture_store::testing::pg_store("ctx_engine").await else {
        return;
    };
    let (_dir, sqlite) = sqlite().await;
    let on_pg = run_example(pg.clone(), "iterate").await;
    let on_sqlite = run_example(sqlite.clone(), "iterate").await;
    assert_eq!(on_pg, on_sqlite);
    assert_eq!(
        events(&pg, "iterate").await,
        events(&sqlite, "iterate").await
    );
    // Resuming on PostgreSQL after a failure works the same way.
    let exec = executor(
        pg.clone(),
        script("[{content: '{\"a\": 1}'}, {error: {status: 500}}]"),
    );
    start(&exec, THREE_STEPS, "").await.unwrap_err();
    let out = executor(pg.clone(), script("[{content: b}, {content: c}]"))
        .resume("run-1")
        .await
        .unwrap();
    assert_eq!(out.output, "c");
    pg.drop_schema().await.unwrap();
}

#[tokio::test]
async fn a_run_that_could_not_be_queued_ends_failed_with_the_reason() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    let mut request = RunRequest::new("workflow.yaml", TOOL_LOOP, "go");
    request.execution_id = Some("run-1".into());
    exec.open(request).await.unwrap();
    exec.end_unqueued("run-1", "the queue's database is gone")
        .await
        .unwrap();
    let log = exec.load("run-1").await.unwrap();
    let end = log.end().expect("the run ended");
    assert_eq!(end.status, contexture_core::thread::RunStatus::Failed);
    assert_eq!(
        end.error.as_deref(),
        Some("the run could not be queued: the queue's database is gone")
    );
    // No step ran: the run's whole log is its start and its end.
    assert_eq!(log.steps_started(), 0);
}
