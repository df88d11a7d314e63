//! The executor's tools, iteration bound, budgets, template errors and refusals, with the
//! scripted provider.

use crate::common;

use std::sync::Arc;

use common::{events, executor, kinds, script, sqlite, start};
use contexture_core::registry::Registry;
use contexture_core::thread::{EventKind, RunLimits, RunStatus};
use contexture_engine::executor::{ExecError, StepError};
use contexture_store::Store;
use serde_json::json;

const TOOL_STATE: &str = r#"
tools:
  - id: run
    arguments: {name: '{{user}}', fixed: configured}
    TOOL
states:
  - id: call
    tool_id: run
    tool_args: {extra: '{{ n + 1 }}'}
    next: {state_id: end}
"#;

#[tokio::test]
async fn a_command_tool_gets_its_arguments_as_json_and_its_output_is_stored() {
    let (_dir, store) = sqlite().await;
    let workflow = TOOL_STATE.replace("TOOL", r#"command: [sh, -c, 'cat; echo']"#);
    let exec = executor(store.clone(), script("[]"));
    let out = start(&exec, &workflow, r#"{"user": "ann", "n": 1}"#)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out.output).unwrap(),
        json!({"name": "ann", "fixed": "configured", "extra": 2})
    );
    assert_eq!(out.store.get("fixed"), Some(&json!("configured")));
    let log = events(&store, "run-1").await;
    let started = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::StepStarted(s) => s.arguments.clone(),
            _ => None,
        })
        .unwrap();
    assert_eq!(started["name"], "ann");
}

#[tokio::test]
async fn a_failing_or_slow_command_fails_the_step_with_what_it_said() {
    let table = [
        (
            r#"command: [sh, -c, 'echo "no such table" >&2; exit 3']"#,
            "exited with exit status: 3: no such table",
        ),
        (
            "command: [sleep, '5']\n    timeout_seconds: 0.2",
            "no result within 200ms",
        ),
        (
            "command: [/nonexistent/program]",
            "cannot start `/nonexistent/program`",
        ),
    ];
    for (tool, expected) in table {
        let (_dir, store) = sqlite().await;
        let exec = executor(store.clone(), script("[]"));
        let error = start(
            &exec,
            &TOOL_STATE.replace("TOOL", tool),
            r#"{"user": "a", "n": 0}"#,
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains(expected), "{tool}: {error}");
        assert!(matches!(error, ExecError::StepFailed { step: 1, .. }));
    }
}

#[tokio::test]
async fn model_tool_calls_get_errors_as_results_and_configured_arguments_win() {
    let workflow = r#"
assistants:
  - {id: a, model: gpt-4o-mini, tools: [echo-tool]}
tools:
  - {id: echo-tool, tool: echo, arguments: {mode: '{{mode}}'}}
states:
  - {id: s, assistant_id: a, task: Go, next: {end: true}}
"#;
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- tool_calls:
    - {id: c1, name: missing-tool, arguments: {}}
    - {id: c2, name: echo-tool, arguments: 'not json'}
    - {id: c3, name: echo-tool, arguments: {mode: model-wants, q: 1}}
- content: finished
"#,
    );
    let exec = executor(store, provider.clone());
    let out = start(&exec, workflow, r#"{"mode": "safe"}"#).await.unwrap();
    assert_eq!(out.output, "finished");
    let results: Vec<String> = provider.requests()[1]
        .messages
        .iter()
        .filter(|m| m.tool_call_id.is_some())
        .map(|m| m.text())
        .collect();
    assert_eq!(results.len(), 3);
    assert!(
        results[0].starts_with("error: there is no tool `missing-tool`"),
        "{}",
        results[0]
    );
    assert!(
        results[1].starts_with("error: the arguments are not valid JSON"),
        "{}",
        results[1]
    );
    assert_eq!(results[2], r#"{"mode":"safe","q":1}"#);
}

#[tokio::test]
async fn an_assistant_that_never_stops_calling_tools_fails_at_max_iterations() {
    let workflow = r#"
assistants:
  - {id: looper, model: gpt-4o-mini, tools: [t], max_iterations: 3}
tools:
  - {id: t, response: again}
states:
  - {id: s, assistant_id: looper, task: Go}
"#;
    let call = "{tool_calls: [{name: t}]}";
    let (_dir, store) = sqlite().await;
    let provider = script(&format!("[{call}, {call}, {call}, {call}]"));
    let exec = executor(store.clone(), provider.clone());
    let error = start(&exec, workflow, "").await.unwrap_err();
    assert!(
        matches!(&error, ExecError::StepFailed { error, .. } if matches!(**error, StepError::MaxIterations { max: 3, .. })),
        "{error}"
    );
    assert!(error.to_string().contains("max_iterations 3"));
    assert_eq!(provider.requests().len(), 3);
}

#[tokio::test]
async fn a_token_budget_stops_the_run_and_a_resume_with_more_goes_on() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: a, task: One, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Two, next: {end: true}}
limits: {max_tokens: 45}
"#;
    let (_dir, store) = sqlite().await;
    let replies = "[{content: first, usage: {prompt_tokens: 30, completion_tokens: 10}}, {content: second, usage: {prompt_tokens: 30, completion_tokens: 10}}]";
    let provider = script(replies);
    let exec = executor(store.clone(), provider.clone());
    let error = start(&exec, workflow, "").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("token budget exceeded: 40 tokens spent and this request needs"),
        "{error}"
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "the second call was never sent"
    );

    // Resumed with a larger budget, the run finishes without re-running step one.
    let provider = script("[{content: second}]");
    let exec = executor(store.clone(), provider.clone()).with_limits(RunLimits {
        max_tokens: Some(1000),
        ..RunLimits::default()
    });
    let out = exec.resume("run-1").await.unwrap();
    assert_eq!(out.output, "second");
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(
        provider.requests()[0].messages.last().unwrap().text(),
        "Two"
    );
}

#[tokio::test]
async fn a_cost_budget_needs_prices_and_stops_the_run() {
    let workflow = r#"
assistants: [{id: a, model: MODEL}]
states:
  - {id: one, assistant_id: a, task: One, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Two, next: {end: true}}
limits: {max_cost_usd: 0.001}
"#;
    // gpt-4o: $2.50 per million prompt tokens, $10 per million completion tokens.
    let (_dir, store) = sqlite().await;
    let provider =
        script("[{content: a, usage: {prompt_tokens: 200, completion_tokens: 100}}, {content: b}]");
    let exec = executor(store, provider.clone());
    let error = start(&exec, &workflow.replace("MODEL", "gpt-4o"), "")
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cost budget exceeded: $0.001500 spent"),
        "{error}"
    );
    assert_eq!(provider.requests().len(), 1);

    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[{content: a}]"));
    let error = start(&exec, &workflow.replace("MODEL", "my-local-llama"), "")
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("model `my-local-llama` has no price in the registry"),
        "{error}"
    );
}

#[tokio::test]
async fn a_loop_between_states_stops_at_max_steps() {
    let workflow = r#"
states:
  - id: spin
    transform: {n: '{{ (n | default(0)) + 1 }}'}
    next:
      condition: {expression: 'true', then: spin, otherwise: end}
      include_in_llm_history: false
limits: {max_steps: 5}
"#;
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    let error = start(&exec, workflow, "").await.unwrap_err();
    assert!(
        error.to_string().contains("step limit reached: 5 steps"),
        "{error}"
    );
    let log = events(&store, "run-1").await;
    let started = kinds(&log).iter().filter(|k| **k == "step_started").count();
    assert_eq!(started, 5);
    assert!(matches!(
        &log.last().unwrap().kind,
        EventKind::RunEnded(end) if end.status == RunStatus::Failed
    ));
}

#[tokio::test]
async fn template_errors_fail_the_step_with_their_place() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini, system_prompt: 'You help {{who}}.'}]
missing_variables: error
states:
  - {id: s, assistant_id: a, task: 'Hello {{name}}'}
"#;
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[{content: x}]"));
    let error = start(&exec, workflow, r#"{"name": "ann"}"#)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "execution `run-1`, step 1 (`s`): the system prompt of assistant `a`: missing variable: who"
    );
    let error = start(&exec, workflow, "{}").await.unwrap_err();
    assert!(matches!(error, ExecError::AlreadyExists { .. }), "{error}");
}

#[tokio::test]
async fn workflows_that_cannot_run_are_refused_before_anything_is_recorded() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    let workflow = r#"
tools:
  - {id: db-query}
assistants:
  - {id: a, model: gpt-4o, mcp_servers: [search]}
mcp_servers:
  - {name: files}
states:
  - {id: s, tool_id: db-query}
"#;
    let error = start(&exec, workflow, "").await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("tool `db-query` has no implementation"),
        "{text}"
    );
    assert!(
        text.contains("mcp_servers[0]: MCP server `files` has no `config.command` or `config.url`, and the host declares no server of that name (none is declared)"),
        "{text}"
    );
    assert!(
        text.contains("assistant `a` names MCP server `search`"),
        "{text}"
    );
    assert!(store.list().await.unwrap().is_empty());

    let error = start(&exec, "states: [{id: s, assistant_id: nobody}]", "")
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow.yaml:1:32: states[0].assistant_id: unknown assistant `nobody` (none are declared)"
    );
}

#[tokio::test]
async fn registered_tools_run_by_name() {
    use contexture_engine::tools::{ToolCallRequest, ToolError, ToolRunner, Toolbox};
    struct Upper;
    impl ToolRunner for Upper {
        fn call<'a>(
            &'a self,
            request: ToolCallRequest<'a>,
        ) -> contexture_llm::BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async move {
                Ok(request.arguments["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_uppercase())
            })
        }
    }
    let mut tools = Toolbox::default();
    tools.register("upper", Arc::new(Upper));
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[]")).with_tools(tools);
    let workflow = r#"
tools: [{id: shout, tool: upper, arguments: {text: '{{word}}'}}]
states: [{id: s, tool_id: shout, next: {end: true, output_key: loud}}]
"#;
    let out = start(&exec, workflow, r#"{"word": "hi"}"#).await.unwrap();
    assert_eq!(out.store.get("loud"), Some(&json!("HI")));
}

#[tokio::test]
async fn unknown_models_get_the_default_window_and_no_price() {
    // A model the registry does not list is fitted to the default 128K window.
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: ok}]");
    let exec = executor(store.clone(), provider).with_registry(Arc::new(Registry::builtin()));
    start(
        &exec,
        "assistants: [{id: a, model: some-new-model}]\nstates: [{id: s, assistant_id: a, task: Hi}]",
        "",
    )
    .await
    .unwrap();
    let requests = common::requests(&events(&store, "run-1").await);
    let breakdown = requests[0].breakdown.as_ref().unwrap();
    assert_eq!(breakdown.limits.context_window, 128_000);
}
