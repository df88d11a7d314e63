//! Contexture as an MCP server, driven by the Python `mcp` package's client (installed by
//! `.ci/run`; the client is `tests/mcp/contexture_client.py`): `contexture mcp` over stdio
//! for the operator, and `/mcp` of `contexture serve` over streamable HTTP behind API keys.
//! Every tool is listed and called; a wrong or missing argument is a tool error naming it
//! with nothing written; another tenant's threads and executions are not found; a request
//! without a key is a 401, one for another host name a 403.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::python;
use common::serving::{Server, create_key};
use common::{RunToEnd, contexture, root, sqlite_url};
use contexture_mcp::testing::python_mcp;
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

/// The tools, in the order they are listed.
const TOOLS: [&str; 8] = [
    "thread_append",
    "thread_list",
    "thread_search",
    "thread_context",
    "thread_compact",
    "thread_fork",
    "run_workflow",
    "execution_result",
];

/// Runs the Python client with `calls` and the connection arguments; its summary.
fn drive(dir: &TempDir, name: &str, calls: &Value, connection: &[&str]) -> Value {
    let file = dir.join(&format!("{name}.json"));
    std::fs::write(&file, calls.to_string()).unwrap();
    let mut command = Command::new("python3");
    command
        .arg(root().join("tests/mcp/contexture_client.py"))
        .arg(&file)
        .args(connection);
    python::summary(command, "the MCP client", String::new)
}

/// The result of call `index`, checked to be a success.
fn ok(summary: &Value, index: usize) -> &Value {
    let result = &summary["results"][index];
    assert_eq!(
        result["isError"], false,
        "call {index} ({}) failed: {}",
        result["tool"], result["text"]
    );
    &result["structured"]
}

/// The text of call `index`, checked to be a tool error.
fn refused(summary: &Value, index: usize) -> String {
    let result = &summary["results"][index];
    assert_eq!(
        result["isError"], true,
        "call {index} ({}) should have failed: {}",
        result["tool"], result["text"]
    );
    result["text"].as_str().unwrap().to_owned()
}

/// The ids of a `thread_list` answer.
fn listed(answer: &Value) -> Vec<String> {
    answer["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|thread| thread["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Writes a one-step workflow and the scripted model's reply for it into `dir`.
fn write_workflow(dir: &Path) {
    std::fs::write(
        dir.join("greet.yaml"),
        "assistants:\n  - {id: a, model: gpt-4o-mini}\nstates:\n  - {id: greet, assistant_id: a, task: 'Greet {{name}}', next: {end: true}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("replies.yaml"),
        "replies:\n  - content: Hello, Ada!\n  - content: Hello again, Ada!\n",
    )
    .unwrap();
}

/// The tools are listed with descriptions and object schemas, in order.
fn check_listing(summary: &Value) {
    assert_eq!(summary["server"], "contexture");
    let tools = summary["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    for tool in tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert!(tool["description"].as_str().unwrap().len() > 20, "{tool}");
    }
}

#[test]
fn contexture_mcp_over_stdio_serves_every_tool_to_the_python_client() {
    if !python_mcp() {
        return;
    }
    let dir = TempDir::new("contexture-mcp-stdio");
    write_workflow(dir.path());
    let db = sqlite_url(&dir, "mcp.db");
    let workflow = dir.join("greet.yaml").display().to_string();
    let calls = json!([
        {"tool": "thread_append", "arguments": {"thread": "t1", "messages": [
            {"role": "user", "content": "The launch code is TULIP-7."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "What else should I pack?"},
        ]}},
        {"tool": "thread_list", "arguments": {}},
        {"tool": "thread_search", "arguments": {"thread": "t1", "query": "tulip"}},
        {"tool": "thread_context", "arguments": {"thread": "t1", "model": "gpt-4o", "max_tokens": 2000}},
        {"tool": "thread_fork", "arguments": {"thread": "t1", "new": "t1-branch", "at_seq": 2}},
        {"tool": "thread_compact", "arguments": {"thread": "t1", "keep_tokens": 10, "notes": "Packing list."}},
        {"tool": "run_workflow", "arguments": {"workflow": workflow, "input": {"name": "Ada"}}},
        {"tool": "execution_result", "arguments": {"execution": {"$from": [6, "execution"]}, "wait_secs": 60}},
        // 8..: mistakes, each refused with the argument named and nothing written.
        {"tool": "thread_fork", "arguments": {"thread": "t1"}},
        {"tool": "thread_list", "arguments": {"limit": "ten"}},
        {"tool": "thread_context", "arguments": {"thread": "t1", "model": "no-such-model"}},
        {"tool": "thread_append", "arguments": {"thread": "t2", "messages": [{"role": "wizard", "content": "x"}]}},
        {"tool": "thread_search", "arguments": {"thread": "nowhere", "query": "x"}},
        {"tool": "execution_result", "arguments": {"execution": "t1"}},
        {"tool": "run_workflow", "arguments": {"workflow": dir.join("missing.yaml").display().to_string(), "input": ""}},
        {"tool": "thread_append", "arguments": {"thread": "bad\u{0007}id", "messages": [{"role": "user", "content": "x"}]}},
        {"tool": "thread_search", "arguments": {"thread": "t1", "query": "tulip", "page": 2}},
        {"tool": "thread_delete", "arguments": {"thread": "t1"}},
        {"tool": "thread_list", "arguments": {}},
    ]);
    let program = env!("CARGO_BIN_EXE_contexture");
    let replies = format!("scripted:{}", dir.join("replies.yaml").display());
    let summary = drive(
        &dir,
        "stdio",
        &calls,
        &["--stdio", program, "mcp", "--db", &db, "--llm", &replies],
    );
    check_listing(&summary);

    assert_eq!(ok(&summary, 0)["seqs"].as_array().unwrap().len(), 3);
    assert_eq!(listed(ok(&summary, 1)), ["t1"]);
    let hits = ok(&summary, 2)["hits"].as_array().unwrap().clone();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["role"], "user");
    assert!(hits[0]["seq"].as_u64().unwrap() >= 1);
    let context = ok(&summary, 3);
    assert_eq!(context["thread"], "t1");
    assert_eq!(context["messages"].as_array().unwrap().len(), 3);
    assert!(context["budget"]["used"].as_u64().unwrap() > 0, "{context}");
    let fork = ok(&summary, 4);
    assert_eq!(
        (fork["id"].as_str(), fork["at_seq"].as_u64()),
        (Some("t1-branch"), Some(2))
    );
    let compacted = ok(&summary, 5);
    assert!(compacted.is_object(), "{compacted}");
    let started = ok(&summary, 6);
    assert_eq!(started["status"], "running");
    let result = ok(&summary, 7);
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "Hello, Ada!");

    assert!(refused(&summary, 8).contains("`new`"));
    assert!(refused(&summary, 9).starts_with("argument `limit`"));
    assert!(refused(&summary, 10).starts_with("argument `model`"));
    assert!(refused(&summary, 11).starts_with("argument `messages"));
    assert_eq!(refused(&summary, 12), "no thread `nowhere`");
    assert_eq!(refused(&summary, 13), "no execution `t1`");
    assert!(refused(&summary, 14).starts_with("argument `workflow`: cannot read workflow"));
    assert!(
        refused(&summary, 15)
            .starts_with("argument `thread`: a thread id may not contain control characters")
    );
    assert!(refused(&summary, 16).contains("`page`"));
    assert!(refused(&summary, 17).starts_with("no tool `thread_delete`"));
    // Nothing of the refused calls was written: the operator sees the same threads as the
    // CLI does, the run's log among them.
    let threads = listed(ok(&summary, 18));
    assert!(threads.contains(&"t1".to_owned()) && threads.contains(&"t1-branch".to_owned()));
    assert!(
        !threads.iter().any(|id| id == "t2" || id.starts_with("bad")),
        "{threads:?}"
    );
    let found = contexture(["thread", "search", "--db", &db, "--thread", "t1", "TULIP"])
        .run()
        .expect_success();
    assert!(found.contains("TULIP-7"), "{found}");
}

#[test]
fn the_mcp_endpoint_of_contexture_serve_is_behind_keys_and_tenants() {
    if !python_mcp() {
        return;
    }
    let dir = TempDir::new("contexture-mcp-http");
    let workflows = dir.join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    write_workflow(&workflows);
    let db = sqlite_url(&dir, "serve.db");
    let acme = create_key(&db, "acme");
    let globex = create_key(&db, "globex");
    let replies = format!("scripted:{}", workflows.join("replies.yaml").display());
    let workflows_dir = workflows.display().to_string();
    let server = Server::start_with(
        &db,
        "http://127.0.0.1:9/v1",
        "sk-unused",
        &[
            ("CONTEXTURE_LLM", replies.as_str()),
            ("CONTEXTURE_WORKFLOWS_DIR", workflows_dir.as_str()),
        ],
    );
    let url = format!("http://{}/mcp", server.address);

    let calls = json!([
        {"tool": "thread_append", "arguments": {"thread": "plans", "messages": [
            {"role": "user", "content": "The merger closes on Friday."},
        ]}},
        {"tool": "run_workflow", "arguments": {"workflow": "greet.yaml", "input": {"name": "Ada"}, "conversation": {"user": "ada"}}},
        {"tool": "execution_result", "arguments": {"execution": {"$from": [1, "execution"]}, "wait_secs": 60}},
        {"tool": "thread_search", "arguments": {"thread": "plans", "query": "merger"}},
        // 4..: what a client may not do: read the host's files, name a path outside the
        // workflows directory.
        {"tool": "run_workflow", "arguments": {"workflow": "../serve.db", "input": ""}},
        {"tool": "run_workflow", "arguments": {"workflow": "/etc/passwd", "input": ""}},
        {"tool": "execution_result", "arguments": {"execution": "x", "wait_secs": 1e9}},
    ]);
    let summary = drive(&dir, "acme", &calls, &["--http", &url, "--key", &acme]);
    check_listing(&summary);
    ok(&summary, 0);
    let execution = ok(&summary, 1)["execution"].as_str().unwrap().to_owned();
    let result = ok(&summary, 2);
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "Hello, Ada!");
    assert_eq!(ok(&summary, 3)["hits"].as_array().unwrap().len(), 1);
    assert!(refused(&summary, 4).starts_with("argument `workflow`"));
    assert!(refused(&summary, 5).starts_with("argument `workflow`"));
    assert!(refused(&summary, 6).starts_with("argument `wait_secs`"));

    // Another tenant finds none of it, and its own thread of the same name is its own.
    let calls = json!([
        {"tool": "thread_search", "arguments": {"thread": "plans", "query": "merger"}},
        {"tool": "thread_context", "arguments": {"thread": "plans", "model": "gpt-4o"}},
        {"tool": "thread_fork", "arguments": {"thread": "plans", "new": "stolen"}},
        {"tool": "thread_compact", "arguments": {"thread": "plans"}},
        {"tool": "execution_result", "arguments": {"execution": execution}},
        {"tool": "thread_list", "arguments": {}},
        {"tool": "thread_append", "arguments": {"thread": "plans", "messages": [
            {"role": "user", "content": "Our own plans."},
        ]}},
        {"tool": "thread_search", "arguments": {"thread": "plans", "query": "merger"}},
    ]);
    let summary = drive(&dir, "globex", &calls, &["--http", &url, "--key", &globex]);
    assert_eq!(refused(&summary, 0), "no thread `plans`");
    assert_eq!(refused(&summary, 1), "no thread `plans`");
    assert_eq!(refused(&summary, 2), "no thread `plans`");
    assert_eq!(refused(&summary, 3), "no thread `plans`");
    assert_eq!(refused(&summary, 4), format!("no execution `{execution}`"));
    assert_eq!(listed(ok(&summary, 5)), Vec::<String>::new());
    ok(&summary, 6);
    assert_eq!(ok(&summary, 7)["hits"].as_array().unwrap().len(), 0);
    // acme's thread is as it was.
    let events = server.get_json("/v1/threads/plans/events", &acme);
    assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");

    // No key: 401; a key for another host name (DNS rebinding): 403.
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}})
    .to_string();
    let (head, body) = server.request("POST", "/mcp", "", Some(&initialize));
    assert!(head.starts_with("HTTP/1.1 401"), "{head}\n{body}");
    let (head, _) = server.request("POST", "/mcp", "ctx_not-a-key", Some(&initialize));
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    let (head, body) = server.request_with_host("POST", "/mcp", &acme, "evil.example", &initialize);
    assert!(head.starts_with("HTTP/1.1 403"), "{head}\n{body}");
}
