//! MCP servers in runs, against real servers (the Python `mcp` package's, over stdio and
//! over streamable HTTP) and the fake provider over HTTP: tools offered under their
//! servers' names, arguments and headers rendered from the context store, a server per run
//! closed at its end however it ends, crashes and hangs failing the step, `resume` going
//! on, and what a client's workflow may name.
//!
//! Under CI (`CI=true`) a missing `mcp` package fails these tests; elsewhere they skip
//! loudly.

use crate::common;

use std::time::{Duration, Instant};

use common::{events, failed_steps, http_executor, requests, sqlite, start};
use contexture_core::thread::{EventKind, RunStatus};
use contexture_engine::executor::{ExecError, RunRequest};
use contexture_engine::tools::Toolbox;
use contexture_engine::workflow::{McpServerConfig, WorkflowOrigin};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_mcp::testing::{
    HttpToolsServer, fixture, process_runs, python_mcp, wait_until_gone,
};
use serde_json::{Value, json};

/// The tool names a request offered.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The text of the tool result answering call `id` in a request.
fn tool_result(body: &Value, id: &str) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no result of {id} in {body}"))["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A workflow whose assistant uses the stdio server `files` (its project path rendered from
/// the context) and, when `search_url` is given, the HTTP server `search`.
fn workflow(search_url: Option<&str>, extra: &str) -> String {
    let files = fixture("tools_server.py");
    let search = search_url
        .map(|url| {
            format!(
                "  - name: search\n    config: {{url: '{url}', headers: {{Authorization: 'Bearer {{{{search_token}}}}'}}}}\n"
            )
        })
        .unwrap_or_default();
    let servers = if search_url.is_some() {
        "[files, search]"
    } else {
        "[files]"
    };
    format!(
        r#"mcp_servers:
  - name: files
    resolve_dynamic_values_in_arguments: true
    config: {{command: python3, args: ['{files}', '--name', files, '--project', '{{{{project_path}}}}'], env: {{LOG: quiet}}{extra}}}
{search}assistants:
  - {{id: coder, model: gpt-4o-mini, mcp_servers: {servers}}}
states:
  - {{id: work, assistant_id: coder, task: Work on it}}
"#
    )
}

const INPUT: &str = r#"{"project_path": "/srv/project", "search_token": "tok-1"}"#;

#[tokio::test]
async fn an_assistant_calls_tools_of_a_stdio_and_an_http_server() {
    if !python_mcp() {
        return;
    }
    let search = HttpToolsServer::start("search");
    let upstream = FakeUpstream::scripted([
        Reply::tool_call("c1", "files__project", json!({})).with_tool_call(
            "c2",
            "files__pid",
            json!({}),
        ),
        Reply::tool_call("c3", "search__whoami", json!({})).with_tool_call(
            "c4",
            "search__search",
            json!({"query": "rust"}),
        ),
        Reply::text("done"),
    ])
    .await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let out = start(&exec, &workflow(Some(&search.url), ""), INPUT)
        .await
        .unwrap();
    assert_eq!(out.output, "done");

    let bodies = upstream.bodies();
    let names = offered(&bodies[0]);
    // Both servers have a `search`: each keeps its server's name.
    for name in [
        "files__search",
        "search__search",
        "files__echo",
        "search__whoami",
    ] {
        assert!(names.contains(&name.to_owned()), "{names:?}");
    }
    let add = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "files__add")
        .unwrap();
    assert_eq!(add["function"]["description"], "Adds two integers.");
    assert_eq!(add["function"]["parameters"]["type"], "object");

    // The argument rendered from the context; the workflow's env; this process's variables.
    let project: Value = serde_json::from_str(&tool_result(&bodies[1], "c1")).unwrap();
    assert_eq!(project["project"], "/srv/project");
    assert_eq!(project["log"], "quiet");
    assert_eq!(
        project["home"].as_str(),
        std::env::var("HOME").ok().as_deref()
    );
    // The header rendered from the context.
    let who: Value = serde_json::from_str(&tool_result(&bodies[2], "c3")).unwrap();
    assert_eq!(who["authorization"], "Bearer tok-1");
    assert_eq!(tool_result(&bodies[2], "c4"), "search found: rust");

    // The server was started once for the run, and is gone with it.
    let pid: u32 = tool_result(&bodies[1], "c2").parse().unwrap();
    wait_until_gone(pid);
    // Every call and result is in the log, and every request counted the tools' schemas.
    let log = events(&store, "run-1").await;
    let records = requests(&log);
    assert_eq!(records.len(), 3);
    for record in &records {
        assert!(
            record
                .tools
                .iter()
                .any(|t| t["function"]["name"] == "search__search")
        );
        assert!(record.breakdown.as_ref().unwrap().tools > 0);
    }
}

#[tokio::test]
async fn a_crash_fails_the_step_naming_the_server_and_resume_goes_on() {
    if !python_mcp() {
        return;
    }
    let upstream =
        FakeUpstream::scripted([Reply::tool_call("c1", "files__crash", json!({}))]).await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let error = start(&exec, &workflow(None, ""), INPUT).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("MCP server `files` stopped while tool `crash` ran"),
        "{text}"
    );
    assert!(text.contains("exited with code 3"), "{text}");
    assert!(text.contains("crashing on purpose"), "{text}");
    let log = events(&store, "run-1").await;
    assert_eq!(failed_steps(&log), [1]);

    upstream.extend([
        Reply::tool_call("c2", "files__echo", json!({"text": "again"})),
        Reply::text("recovered"),
    ]);
    let out = exec.resume("run-1").await.unwrap();
    assert_eq!(out.output, "recovered");
    let bodies = upstream.bodies();
    assert_eq!(tool_result(bodies.last().unwrap(), "c2"), "again");
    let log = events(&store, "run-1").await;
    let ended = log.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunEnded(end) => Some(end.status),
        _ => None,
    });
    assert_eq!(ended, Some(RunStatus::Completed));
}

#[tokio::test]
async fn a_hung_call_fails_the_step_at_its_timeout() {
    if !python_mcp() {
        return;
    }
    let upstream = FakeUpstream::scripted([Reply::tool_call(
        "c1",
        "files__sleep",
        json!({"seconds": 60}),
    )])
    .await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let started = Instant::now();
    let error = start(&exec, &workflow(None, ", timeout_secs: 1"), INPUT)
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        error
            .to_string()
            .contains("MCP server `files`: tool `sleep` gave no result within 1 s"),
        "{error}"
    );
}

#[tokio::test]
async fn a_cancelled_run_closes_its_servers() {
    if !python_mcp() {
        return;
    }
    let upstream = FakeUpstream::scripted([
        Reply::tool_call("c1", "files__pid", json!({})),
        Reply::tool_call("c2", "files__sleep", json!({"seconds": 60})),
    ])
    .await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    // Long enough for the server to start and answer its first call on a loaded machine
    // (a Python process), far shorter than the call it is cancelled in.
    let text = workflow(None, "").replace("states:", "limits: {max_seconds: 8}\nstates:");
    let started = Instant::now();
    let error = start(&exec, &text, INPUT).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cancelled: wall-clock limit reached"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let bodies = upstream.bodies();
    assert!(
        bodies.len() >= 2,
        "the run was cancelled before the server answered its first call ({} calls)",
        bodies.len()
    );
    let pid: u32 = tool_result(&bodies[1], "c1").parse().unwrap();
    // Closed with the run, not left to the end of its 60-second call.
    wait_until_gone(pid);
    assert!(!process_runs(pid));
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_the_step_before_any_call() {
    let upstream = FakeUpstream::scripted([]).await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let text = r#"
mcp_servers:
  - {name: files, config: {command: no-such-mcp-server}}
assistants:
  - {id: coder, model: gpt-4o-mini, mcp_servers: [files]}
states:
  - {id: work, assistant_id: coder, task: Work}
"#;
    let error = start(&exec, text, "go").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("MCP server `files`: cannot start `no-such-mcp-server`: no such program"),
        "{error}"
    );
    assert_eq!(upstream.call_count(), 0);
    let log = events(&store, "run-1").await;
    assert!(requests(&log).is_empty());
    assert_eq!(failed_steps(&log), [1]);
}

fn client(text: &str) -> RunRequest {
    RunRequest {
        execution_id: Some("run-1".into()),
        origin: WorkflowOrigin::Client,
        ..RunRequest::new("request.yaml", text, "go")
    }
}

#[tokio::test]
async fn a_clients_workflow_may_only_name_the_hosts_servers() {
    if !python_mcp() {
        return;
    }
    let upstream = FakeUpstream::scripted([
        Reply::tool_call("c1", "files__project", json!({})),
        Reply::text("done"),
    ])
    .await;
    let (_dir, store) = sqlite().await;
    let mut toolbox = Toolbox::default();
    toolbox.declare_mcp_server(
        "files",
        McpServerConfig {
            command: Some("python3".into()),
            args: vec![
                json!(fixture("tools_server.py")),
                json!("--project"),
                json!("{{x}}"),
            ],
            env: [("LOG".to_owned(), "host".to_owned())].into(),
            ..McpServerConfig::default()
        },
    );
    let exec = http_executor(store.clone(), &upstream.base_url()).with_tools(toolbox);

    let named = "assistants: [{id: a, model: gpt-4o-mini, mcp_servers: [files]}]\nstates: [{id: s, assistant_id: a, task: Go}]\n";
    let out = exec.start(client(named)).await.unwrap();
    assert_eq!(out.output, "done");
    // The host's configuration as written (no template rendered), and only its variables.
    let project: Value = serde_json::from_str(&tool_result(&upstream.bodies()[1], "c1")).unwrap();
    assert_eq!(
        project,
        json!({"project": "{{x}}", "log": "host", "home": null})
    );

    for (text, path) in [
        (
            "mcp_servers: [{name: files, config: {url: 'http://10.0.0.1/mcp'}}]\nstates: [{id: s, transform: {a: b}}]\n",
            "mcp_servers[0].config.url",
        ),
        (
            "assistants: [{id: a, model: m, mcp_servers: [{name: own, config: {command: sh}}]}]\nstates: [{id: s, transform: {a: b}}]\n",
            "assistants[0].mcp_servers[0].config.command",
        ),
    ] {
        let ExecError::Workflow(error) = exec.validate(&client(text)).unwrap_err() else {
            panic!("not a validation error");
        };
        assert_eq!(error.diagnostics.len(), 1, "{error}");
        assert_eq!(error.diagnostics[0].path, path);
        assert!(
            error.diagnostics[0]
                .message
                .contains("which is refused here"),
            "{error}"
        );
    }

    let unknown = "assistants: [{id: a, model: m, mcp_servers: [search]}]\nstates: [{id: s, assistant_id: a}]\n";
    let error = exec.validate(&client(unknown)).unwrap_err().to_string();
    assert!(
        error.contains("assistant `a` names MCP server `search`, which neither the workflow's mcp_servers nor the host declares (declared: files)"),
        "{error}"
    );
}
