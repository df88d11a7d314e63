//! Sessions with real MCP servers: the Python `mcp` package's server (the reference peer)
//! over stdio and over streamable HTTP, and a peer that breaks the protocol on purpose.
//!
//! Under CI (`CI=true`) a missing `mcp` package fails these tests; elsewhere they say
//! loudly that they skipped. `.ci/run` installs it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use contexture_mcp::testing::{
    HttpToolsServer, fixture, process_runs, python_mcp, wait_until_gone,
};
use contexture_mcp::{Endpoint, HttpEndpoint, McpError, McpSession, ProgramEndpoint};
use serde_json::{Map, Value, json};

const START: Duration = Duration::from_secs(20);
const CALL: Duration = Duration::from_secs(10);

fn program(script: &str, args: &[&str], env: &[(&str, &str)]) -> Endpoint {
    Endpoint::Program(ProgramEndpoint {
        program: "python3".into(),
        args: std::iter::once(fixture(script))
            .chain(args.iter().map(|a| a.to_string()))
            .collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        inherit_environment: false,
    })
}

fn arguments(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[tokio::test]
async fn a_program_server_lists_and_answers_its_tools() {
    if !python_mcp() {
        return;
    }
    let endpoint = program(
        "tools_server.py",
        &["--project", "/srv/project"],
        &[("LOG", "quiet")],
    );
    let session = McpSession::connect("files", &endpoint, START)
        .await
        .unwrap();
    let names: Vec<&str> = session.tools().iter().map(|t| t.name.as_str()).collect();
    for expected in ["echo", "add", "search", "project", "fail", "sleep", "crash"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let add = session.tools().iter().find(|t| t.name == "add").unwrap();
    assert_eq!(add.input_schema["type"], "object");
    assert_eq!(add.description.as_deref(), Some("Adds two integers."));
    assert_eq!(session.protocol_version(), "2025-11-25");

    let sum = session
        .call("add", arguments(json!({"a": 2, "b": 40})), CALL)
        .await
        .unwrap();
    assert!(!sum.is_error);
    assert_eq!(sum.text, "42");

    // Only its own variables and PATH: not this process's (where API keys live).
    let seen = session.call("project", Map::new(), CALL).await.unwrap();
    let seen: Value = serde_json::from_str(&seen.text).unwrap();
    assert_eq!(
        seen,
        json!({"project": "/srv/project", "log": "quiet", "home": null})
    );

    let failed = session
        .call("fail", arguments(json!({"reason": "no disk"})), CALL)
        .await
        .unwrap();
    assert!(failed.is_error);
    assert!(
        failed.text.contains("failed on purpose: no disk"),
        "{}",
        failed.text
    );

    let pid = session.process_id().unwrap();
    assert!(process_runs(pid));
    session.close().await;
    wait_until_gone(pid);
}

#[tokio::test]
async fn a_slow_call_times_out_and_the_session_goes_on() {
    if !python_mcp() {
        return;
    }
    let session = McpSession::connect("slow", &program("tools_server.py", &[], &[]), START)
        .await
        .unwrap();
    let started = Instant::now();
    let error = session
        .call(
            "sleep",
            arguments(json!({"seconds": 30})),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&error, McpError::CallTimeout { server, tool, .. } if server == "slow" && tool == "sleep"),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("gave no result within 0.5 s"),
        "{error}"
    );
    let echo = session
        .call("echo", arguments(json!({"text": "still here"})), CALL)
        .await
        .unwrap();
    assert_eq!(echo.text, "still here");
    session.close().await;
}

#[tokio::test]
async fn a_crash_in_the_middle_of_a_call_is_an_error_with_its_exit_and_stderr() {
    if !python_mcp() {
        return;
    }
    let session = McpSession::connect("files", &program("tools_server.py", &[], &[]), START)
        .await
        .unwrap();
    let error = session.call("crash", Map::new(), CALL).await.unwrap_err();
    let McpError::Closed { exit, stderr, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(exit.as_deref(), Some("exited with code 3"));
    assert!(
        stderr.as_deref().unwrap().contains("crashing on purpose"),
        "{stderr:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with("MCP server `files` stopped while tool `crash` ran"),
        "{text}"
    );
    session.close().await;
}

#[tokio::test]
async fn dropping_a_session_kills_its_program() {
    if !python_mcp() {
        return;
    }
    let session = McpSession::connect("files", &program("tools_server.py", &[], &[]), START)
        .await
        .unwrap();
    let pid = session.process_id().unwrap();
    drop(session);
    wait_until_gone(pid);
}

#[tokio::test]
async fn servers_that_cannot_start_say_why() {
    let missing = Endpoint::Program(ProgramEndpoint {
        program: "no-such-mcp-server".into(),
        args: vec![],
        env: BTreeMap::new(),
        inherit_environment: false,
    });
    let error = McpSession::connect("ghost", &missing, START)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "MCP server `ghost`: cannot start `no-such-mcp-server`: no such program (is it installed and on PATH?)"
    );

    let error = McpSession::connect(
        "broken",
        &program("broken_server.py", &["exit"], &[]),
        START,
    )
    .await
    .unwrap_err();
    let McpError::Handshake { exit, stderr, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(exit.as_deref(), Some("exited with code 3"));
    assert!(
        stderr
            .as_deref()
            .unwrap()
            .contains("missing configuration file")
    );

    let started = Instant::now();
    let error = McpSession::connect(
        "mute",
        &program("broken_server.py", &["silent"], &[]),
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    let McpError::StartTimeout { stderr, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(stderr.as_deref().unwrap().contains("never answering"));

    let error = McpSession::connect(
        "old",
        &program("broken_server.py", &["version"], &[]),
        START,
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("1999-01-01"), "{error}");

    let error = McpSession::connect("odd", &program("broken_server.py", &["schema"], &[]), START)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, McpError::InvalidTool { problem, .. } if problem.contains("tool `odd`")),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_http_server_gets_the_headers_and_answers() {
    if !python_mcp() {
        return;
    }
    let server = HttpToolsServer::start("search");
    let endpoint = Endpoint::Http(HttpEndpoint {
        url: server.url.clone(),
        headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
    });
    let session = McpSession::connect("search", &endpoint, START)
        .await
        .unwrap();
    assert!(session.process_id().is_none());
    let who = session.call("whoami", Map::new(), CALL).await.unwrap();
    let who: Value = serde_json::from_str(&who.text).unwrap();
    assert_eq!(who["authorization"], "Bearer s3cret");
    let found = session
        .call("search", arguments(json!({"query": "rust"})), CALL)
        .await
        .unwrap();
    assert_eq!(found.text, "search found: rust");
    session.close().await;

    let nobody = Endpoint::Http(HttpEndpoint {
        url: "http://127.0.0.1:9/mcp".into(),
        headers: BTreeMap::new(),
    });
    let error = McpSession::connect("gone", &nobody, START)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("MCP server `gone` (http://127.0.0.1:9/mcp) failed its handshake"),
        "{error}"
    );
}
