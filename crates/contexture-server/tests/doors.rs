//! The command line and the HTTP API are two doors to the same operations: for the same
//! input they give the same result.

mod common;

use std::process::Command;

use common::{TestServer, client, config, contexture_binary};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A conversation that the rules of each provider treat differently (two user turns in a
/// row, a tool call) and that is longer than small budgets.
fn conversation() -> Value {
    let long = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": format!("first question {long}")}),
        json!({"role": "user", "content": "and one more thing"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"q\":\"fox\"}"}
        }]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": format!("found {long}")}),
        json!({"role": "assistant", "content": "It jumps."}),
    ];
    for turn in 0..12 {
        messages.push(json!({"role": "user", "content": format!("question {turn} {long}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {turn} {long}")}));
    }
    Value::Array(messages)
}

fn cli_fit(db: &str, thread: &str, args: &[&str]) -> Value {
    let output = Command::new(contexture_binary())
        .args(["thread", "messages", "--db", db, "--thread", thread])
        .args(args)
        .output()
        .expect("run contexture");
    assert!(
        output.status.success(),
        "contexture thread messages {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("a JSON array")
}

#[tokio::test]
async fn a_thread_fitted_for_a_model_is_the_same_from_the_command_line_and_the_api() {
    let dir = TempDir::new("contexture-doors");
    let path = dir.join("doors.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let response = client()
        .post(server.url("/v1/threads/talk/messages"))
        .bearer_auth(&key)
        .json(&json!({"messages": conversation()}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{}",
        response.text().await.unwrap()
    );
    let db = format!("sqlite:{}", path.display());

    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("gpt-4o-mini", &[]),
        ("claude-3-5-sonnet-20241022", &[]),
        ("gemini-2.5-pro", &[("max_tokens", "900")]),
        ("claude-3-5-sonnet-20241022", &[("max_tokens", "700")]),
        (
            "gpt-4o-mini",
            &[("max_tokens", "800"), ("strategy", "head-tail")],
        ),
        (
            "claude-3-5-sonnet-20241022",
            &[
                ("max_tokens", "1200"),
                ("strategy", "head-tail:2"),
                ("reserve_output", "100"),
            ],
        ),
    ];
    for (model, options) in cases {
        let mut query = format!("model={model}");
        let mut args = vec!["--model", model];
        let flags: Vec<String> = options
            .iter()
            .map(|(name, _)| format!("--{}", name.replace('_', "-")))
            .collect();
        for ((name, value), flag) in options.iter().zip(&flags) {
            query.push_str(&format!("&{name}={value}"));
            args.push(flag);
            args.push(value);
        }
        let answer: Value = client()
            .get(server.url(&format!("/v1/threads/talk/context?{query}")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let from_cli = cli_fit(&db, "acme/talk", &args);
        assert_eq!(from_cli, answer["messages"], "{query}");
    }
    // The rules differ by model, so the doors agreeing is not agreeing on one answer.
    let openai = cli_fit(&db, "acme/talk", &["--model", "gpt-4o-mini"]);
    let anthropic = cli_fit(&db, "acme/talk", &["--model", "claude-3-5-sonnet-20241022"]);
    assert_ne!(
        openai, anthropic,
        "Anthropic's rules merge the two user turns"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_keyed_append_retried_through_the_other_door_stores_nothing_twice() {
    let dir = TempDir::new("contexture-doors");
    let path = dir.join("keyed.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let db = format!("sqlite:{}", path.display());
    let message = json!({"role": "user", "content": "Hello"});
    let file = dir.join("message.json");
    std::fs::write(&file, message.to_string()).unwrap();
    let file = file.display().to_string();

    // First through the command line, then the same request through the API; and the
    // other way round on a second thread.
    let cli_append = |thread: &str| {
        let output = Command::new(contexture_binary())
            .args(["thread", "append", "--db", &db, "--thread", thread])
            .args(["--key", "turn-1", &file])
            .output()
            .expect("run contexture");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let api_append = |thread: &'static str| {
        client()
            .post(server.url(&format!("/v1/threads/{thread}/messages")))
            .bearer_auth(&key)
            .header("Idempotency-Key", "turn-1")
            .json(&json!({"messages": [message.clone()]}))
            .send()
    };
    assert_eq!(cli_append("acme/cli-first").trim(), "1");
    let response = api_append("cli-first").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = api_append("api-first").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(cli_append("acme/api-first").trim(), "1");
    for thread in ["cli-first", "api-first"] {
        let page: Value = client()
            .get(server.url(&format!("/v1/threads/{thread}/events")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let events = page["events"].as_array().unwrap();
        assert_eq!(events.len(), 1, "{thread}: {page}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_compaction_asked_through_either_door_gives_the_same_thread() {
    let dir = TempDir::new("contexture-doors");
    let path = dir.join("compact.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let db = format!("sqlite:{}", path.display());
    for thread in ["by-cli", "by-api"] {
        let response = client()
            .post(server.url(&format!("/v1/threads/{thread}/messages")))
            .bearer_auth(&key)
            .json(&json!({"messages": conversation()}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    let output = Command::new(contexture_binary())
        .args(["thread", "compact", "--db", &db, "--thread", "acme/by-cli"])
        .args(["--keep-messages", "4", "--notes", "Keep the fox.", "--json"])
        .output()
        .expect("run contexture");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let by_cli: Value = serde_json::from_slice(&output.stdout).unwrap();
    let by_api: Value = client()
        .post(server.url("/v1/threads/by-api/compact"))
        .bearer_auth(&key)
        .json(&json!({"keep_messages": 4, "notes": "Keep the fox."}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_cli["outcome"], "compacted", "{by_cli}");
    for field in [
        "outcome",
        "covered",
        "covered_messages",
        "tokens_before",
        "tokens_after",
        "summarizer",
        "summary",
    ] {
        assert_eq!(by_cli[field], by_api[field], "{field}: {by_cli} / {by_api}");
    }
    // What the next request sees of each thread is the same.
    let by_cli = cli_fit(&db, "acme/by-cli", &["--model", "gpt-4o"]);
    let by_api = cli_fit(&db, "acme/by-api", &["--model", "gpt-4o"]);
    assert_eq!(by_cli, by_api);
    server.shutdown().await;
}

#[tokio::test]
async fn a_fork_made_through_either_door_reads_the_same_events() {
    let dir = TempDir::new("contexture-doors");
    let path = dir.join("fork.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let db = format!("sqlite:{}", path.display());
    let response = client()
        .post(server.url("/v1/threads/parent/messages"))
        .bearer_auth(&key)
        .json(&json!({"messages": conversation()}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let output = Command::new(contexture_binary())
        .args(["thread", "fork", "--db", &db, "--thread", "acme/parent"])
        .args(["--at", "5", "--new", "acme/cli-fork"])
        .output()
        .expect("run contexture");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let response = client()
        .post(server.url("/v1/threads/parent/fork"))
        .bearer_auth(&key)
        .json(&json!({"id": "api-fork", "at_seq": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    // The events through either door's reader: the command line's JSON lines and the
    // API's page hold the same events.
    let events_of = |thread: &str| {
        let output = Command::new(contexture_binary())
            .args(["thread", "events", "--db", &db, "--thread", thread])
            .output()
            .expect("run contexture");
        assert!(output.status.success());
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .collect::<Vec<_>>()
    };
    let from_cli = events_of("acme/cli-fork");
    assert_eq!(from_cli, events_of("acme/api-fork"));
    assert_eq!(from_cli.len(), 6, "five shared events and the fork's own");
    let page: Value = client()
        .get(server.url("/v1/threads/cli-fork/events"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The API names the parent as its tenant knows it; the messages are the same.
    let messages = |events: &[Value]| {
        events
            .iter()
            .filter(|event| event["type"] == "message_appended")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        messages(page["events"].as_array().unwrap()),
        messages(&from_cli)
    );
    server.shutdown().await;
}
