//! Shared test support: a store in a temporary directory and executors over scripted or HTTP
//! providers.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use contexture_core::Message;
use contexture_core::context::RenderOptions;
use contexture_core::registry::Registry;
use contexture_core::thread::{Event, EventKind, RequestRecord};
use contexture_engine::executor::{ExecError, Executor, RunOutcome, RunRequest};
use contexture_engine::llm::FixedRouter;
use contexture_engine::sources::WorkflowSource;
use contexture_llm::{OpenAiProvider, Provider, RetryPolicy, ScriptedProvider};
use contexture_store::testing::TempDir;
use contexture_store::{SqliteStore, Store};

/// A fresh SQLite store (the directory is removed when the first value is dropped).
pub async fn sqlite() -> (TempDir, SqliteStore) {
    let dir = TempDir::new("contexture-engine-test");
    let store = SqliteStore::open(dir.join("runs.db"))
        .await
        .expect("open sqlite");
    (dir, store)
}

/// A scripted provider from a YAML script.
pub fn script(yaml: &str) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::from_yaml(yaml, "script.yaml").expect("a valid script"))
}

/// An executor over `store` whose every call goes to `provider`, rendering at a fixed time.
pub fn executor<S: Store>(store: S, provider: Arc<dyn Provider>) -> Executor<S> {
    Executor::new(store, Arc::new(FixedRouter::new(provider)))
        .with_render_options(RenderOptions::fixed(1_767_225_600))
}

/// An executor over `store` whose every call goes over HTTP to the OpenAI-compatible server
/// at `base` (a fake upstream), without retries, rendering at time 0.
pub fn http_executor<S: Store>(store: S, base: &str) -> Executor<S> {
    let provider = OpenAiProvider::new(base, Some("sk-test".into()))
        .with_timeout(Duration::from_secs(20))
        .with_retry(RetryPolicy {
            max_retries: 0,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(10),
        });
    Executor::new(store, Arc::new(FixedRouter::new(Arc::new(provider))))
        .with_render_options(RenderOptions::fixed(0))
}

/// The steps that failed in a log, in order.
pub fn failed_steps(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepFailed(failure) => Some(failure.step),
            _ => None,
        })
        .collect()
}

/// Starts `workflow` (YAML text) with `input`.
pub async fn start<S: Store>(
    executor: &Executor<S>,
    workflow: &str,
    input: &str,
) -> Result<RunOutcome, ExecError> {
    executor
        .start(RunRequest {
            workflow_file: "workflow.yaml".into(),
            workflow_text: workflow.into(),
            input: input.into(),
            execution_id: Some("run-1".into()),
            llm: None,
            conversation: None,
            origin: Default::default(),
            user_context: None,
        })
        .await
}

/// Every event of an execution.
pub async fn events<S: Store>(store: &S, id: &str) -> Vec<Event> {
    store.events(id).await.expect("read the execution's events")
}

/// The requests an execution recorded, in order.
pub fn requests(events: &[Event]) -> Vec<RequestRecord> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::RequestStarted(record) => Some(record.clone()),
            _ => None,
        })
        .collect()
}

/// A one-step agent that searches forty times, each result about 3,000 tokens, on a
/// 16,000-token window (`reserve` 1,000), with `context` (indented YAML lines) added to
/// its assistant's `context:`; its task is "Search forty times and report.".
pub fn forty_call_workflow(context: &str) -> String {
    format!(
        r#"
assistants:
  - id: agent
    model: gpt-4o-mini
    tools: [search]
    max_iterations: 60
    context:
      window: 16000
      reserve: 1000
{context}
tools:
  - id: search
    description: Search.
    response: '{{% for i in range(430) %}}hit {{{{ i }}}} for query {{{{ arguments.q }}}}
      {{% endfor %}}'
states:
  - {{id: s, assistant_id: agent, task: Search forty times and report., next: {{end: true}}}}
"#
    )
}

/// The texts of messages.
pub fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

/// The type names of events, in order.
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|event| event.kind.type_name()).collect()
}

/// Sub-workflows kept in memory, by path.
pub struct Library(HashMap<String, String>);

impl WorkflowSource for Library {
    fn load(&self, path: &str, _parent: &str) -> Result<(String, String), String> {
        self.0
            .get(path)
            .map(|text| (path.to_owned(), text.clone()))
            .ok_or_else(|| format!("no workflow {path}"))
    }
}

pub fn library(entries: &[(&str, &str)]) -> Arc<Library> {
    Arc::new(Library(
        entries
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect(),
    ))
}

/// The built-in models and two small ones: `small-summarizer` (a 700-token window) and
/// `small-window` (1,500 tokens), both answering at most 200 tokens.
pub fn small_models() -> Registry {
    let mut registry = Registry::builtin();
    registry
        .apply_toml(
            r#"
[models."small-summarizer"]
provider = "openai"
context_window = 700
max_output_tokens = 200
encoding = "o200k_base"

[models."small-window"]
provider = "openai"
context_window = 1500
max_output_tokens = 200
encoding = "o200k_base"
"#,
            "test-models.toml",
        )
        .expect("the small models");
    registry
}
