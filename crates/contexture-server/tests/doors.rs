//! The command line and the HTTP API are two doors to the same operations: for the same
//! input they give the same result.

use crate::common;

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

/// A server on an SQLite database that the `contexture` binary opens too, and tenant
/// `acme`'s key: the two doors to one store.
struct Doors {
    dir: TempDir,
    server: TestServer,
    key: String,
    db: String,
}

impl Doors {
    async fn open(name: &str) -> Doors {
        let dir = TempDir::new("contexture-doors");
        let path = dir.join(&format!("{name}.db"));
        let store = SqliteStore::open(&path).await.unwrap();
        let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
        let key = server.key("acme").await;
        let db = format!("sqlite:{}", path.display());
        Doors {
            dir,
            server,
            key,
            db,
        }
    }

    /// `contexture ARGS... --db DB`, as it ended.
    fn contexture(&self, args: &[&str]) -> std::process::Output {
        Command::new(contexture_binary())
            .args(args)
            .args(["--db", &self.db])
            .output()
            .expect("run contexture")
    }

    /// `contexture ARGS... --db DB`: its standard output (it must succeed).
    fn contexture_ok(&self, args: &[&str]) -> String {
        let output = self.contexture(args);
        assert!(
            output.status.success(),
            "contexture {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// `contexture thread COMMAND ARGS... --db DB`: its standard output (it must succeed).
    fn cli(&self, command: &str, args: &[&str]) -> String {
        let mut all = vec!["thread", command];
        all.extend_from_slice(args);
        self.contexture_ok(&all)
    }

    /// `contexture thread messages --thread THREAD ARGS...` as JSON.
    fn cli_fit(&self, thread: &str, args: &[&str]) -> Value {
        let mut all = vec!["--thread", thread];
        all.extend_from_slice(args);
        serde_json::from_str(&self.cli("messages", &all)).expect("a JSON array")
    }

    /// A request through the API as `acme`.
    fn api(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        client()
            .request(method, self.server.url(path))
            .bearer_auth(&self.key)
    }

    /// `POST path` with a JSON body through the API as `acme`: the status (it must be
    /// `expected`) and the answer as JSON.
    async fn post_json(&self, path: &str, body: &Value, expected: StatusCode) -> Value {
        let response = self
            .api(reqwest::Method::POST, path)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, expected, "POST {path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Appends `conversation()` to `thread` through the API.
    async fn post_conversation(&self, thread: &str) {
        self.post_json(
            &format!("/v1/threads/{thread}/messages"),
            &json!({"messages": conversation()}),
            StatusCode::OK,
        )
        .await;
    }

    /// `GET path` through the API, as JSON.
    async fn get_json(&self, path: &str) -> Value {
        self.api(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn a_thread_fitted_for_a_model_is_the_same_from_the_command_line_and_the_api() {
    let doors = Doors::open("fit").await;
    doors.post_conversation("talk").await;

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
        let answer = doors
            .get_json(&format!("/v1/threads/talk/context?{query}"))
            .await;
        let from_cli = doors.cli_fit("acme/talk", &args);
        assert_eq!(from_cli, answer["messages"], "{query}");
    }
    // The rules differ by model, so the doors agreeing is not agreeing on one answer.
    let openai = doors.cli_fit("acme/talk", &["--model", "gpt-4o-mini"]);
    let anthropic = doors.cli_fit("acme/talk", &["--model", "claude-3-5-sonnet-20241022"]);
    assert_ne!(
        openai, anthropic,
        "Anthropic's rules merge the two user turns"
    );
    doors.server.shutdown().await;
}

#[tokio::test]
async fn a_keyed_append_retried_through_the_other_door_stores_nothing_twice() {
    let doors = Doors::open("keyed").await;
    let message = json!({"role": "user", "content": "Hello"});
    let file = doors.dir.join("message.json");
    std::fs::write(&file, message.to_string()).unwrap();
    let file = file.display().to_string();

    // First through the command line, then the same request through the API; and the
    // other way round on a second thread.
    let cli_append =
        |thread: &str| doors.cli("append", &["--thread", thread, "--key", "turn-1", &file]);
    let api_append = |thread: &'static str| {
        doors
            .api(
                reqwest::Method::POST,
                &format!("/v1/threads/{thread}/messages"),
            )
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
        let page = doors
            .get_json(&format!("/v1/threads/{thread}/events"))
            .await;
        let events = page["events"].as_array().unwrap();
        assert_eq!(events.len(), 1, "{thread}: {page}");
    }
    doors.server.shutdown().await;
}

#[tokio::test]
async fn a_compaction_and_its_restore_through_either_door_give_the_same_thread() {
    let doors = Doors::open("compact").await;
    for thread in ["by-cli", "by-api"] {
        doors.post_conversation(thread).await;
    }

    let by_cli = doors.cli(
        "compact",
        &[
            "--thread",
            "acme/by-cli",
            "--keep-messages",
            "4",
            "--notes",
            "Keep the fox.",
            "--json",
        ],
    );
    let by_cli: Value = serde_json::from_str(&by_cli).unwrap();
    let by_api = doors
        .post_json(
            "/v1/threads/by-api/compact",
            &json!({"keep_messages": 4, "notes": "Keep the fox."}),
            StatusCode::OK,
        )
        .await;
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
    let fitted_cli = doors.cli_fit("acme/by-cli", &["--model", "gpt-4o"]);
    let fitted_api = doors.cli_fit("acme/by-api", &["--model", "gpt-4o"]);
    assert_eq!(fitted_cli, fitted_api);

    // Each door's restore of its compaction brings the whole conversation back.
    let replaced = |report: &Value| report["replace_seq"].as_u64().expect("a replace seq");
    let restored_cli: u64 = doors
        .cli(
            "restore",
            &[
                "--thread",
                "acme/by-cli",
                "--before",
                &replaced(&by_cli).to_string(),
            ],
        )
        .trim()
        .parse()
        .unwrap();
    let restored_api = doors
        .post_json(
            "/v1/threads/by-api/restore",
            &json!({"before": replaced(&by_api)}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(restored_api["seq"], json!(restored_cli), "{restored_api}");
    let whole_cli = doors.cli_fit("acme/by-cli", &[]);
    assert_eq!(whole_cli, doors.cli_fit("acme/by-api", &[]));
    assert_eq!(whole_cli, conversation());
    doors.server.shutdown().await;
}

#[tokio::test]
async fn a_fork_made_through_either_door_reads_the_same_events() {
    let doors = Doors::open("fork").await;
    doors.post_conversation("parent").await;

    doors.cli(
        "fork",
        &[
            "--thread",
            "acme/parent",
            "--at",
            "5",
            "--new",
            "acme/cli-fork",
        ],
    );
    doors
        .post_json(
            "/v1/threads/parent/fork",
            &json!({"id": "api-fork", "at_seq": 5}),
            StatusCode::CREATED,
        )
        .await;
    // The events through either door's reader: the command line's JSON lines and the
    // API's page hold the same events.
    let events_of = |thread: &str| {
        doors
            .cli("events", &["--thread", thread])
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .collect::<Vec<_>>()
    };
    let from_cli = events_of("acme/cli-fork");
    assert_eq!(from_cli, events_of("acme/api-fork"));
    assert_eq!(from_cli.len(), 6, "five shared events and the fork's own");
    let page = doors.get_json("/v1/threads/cli-fork/events").await;
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
    doors.server.shutdown().await;
}

#[tokio::test]
async fn a_merge_made_through_either_door_records_the_same_event() {
    let doors = Doors::open("merge").await;
    // `keys: all` (`--all-keys`) brings every key of the fork's store (none here: the
    // threads' stores are a workflow's), and both doors record the same merge for it.
    for (policy, all_keys) in [
        ("append-messages", false),
        ("summary-only", false),
        ("append-messages", true),
    ] {
        let (cli_parent, api_parent) = (
            format!("cli-{policy}-{all_keys}"),
            format!("api-{policy}-{all_keys}"),
        );
        for parent in [&cli_parent, &api_parent] {
            doors.post_conversation(parent).await;
            doors
                .post_json(
                    &format!("/v1/threads/{parent}/fork"),
                    &json!({"id": format!("{parent}-fork"), "at_seq": 5}),
                    StatusCode::CREATED,
                )
                .await;
            doors
                .post_json(
                    &format!("/v1/threads/{parent}-fork/messages"),
                    &json!({"messages": [
                        {"role": "user", "content": "explore this"},
                        {"role": "assistant", "content": "explored: it holds"}
                    ]}),
                    StatusCode::OK,
                )
                .await;
        }
        let (thread, from) = (
            format!("acme/{cli_parent}"),
            format!("acme/{cli_parent}-fork"),
        );
        let mut args = vec!["--thread", &thread, "--from", &from, "--policy", policy];
        let mut body = json!({"from": format!("{api_parent}-fork"), "policy": policy});
        if all_keys {
            args.push("--all-keys");
            body["keys"] = json!("all");
        }
        let cli_seq: u64 = doors.cli("merge", &args).trim().parse().unwrap();
        let merged = doors
            .post_json(
                &format!("/v1/threads/{api_parent}/merge"),
                &body,
                StatusCode::OK,
            )
            .await;
        assert_eq!(merged["seq"], json!(cli_seq), "{policy}: {merged}");
        let merge_event = |thread: &str| {
            let events = doors.cli("events", &["--thread", thread]);
            let last: Value = serde_json::from_str(events.lines().last().unwrap()).unwrap();
            assert_eq!(last["type"], "merged", "{thread}: {last}");
            last
        };
        let mut from_cli = merge_event(&format!("acme/{cli_parent}"));
        let from_api = merge_event(&format!("acme/{api_parent}"));
        // The forks' names differ; everything else the merge recorded is the same.
        from_cli["child"] = from_api["child"].clone();
        assert_eq!(from_cli, from_api, "{policy}");
    }
    doors.server.shutdown().await;
}

/// The stored ids in a document as tenant `acme` sees them through the API.
fn as_acme_sees(value: &mut Value) {
    match value {
        Value::String(text) => {
            if let Some(rest) = text.strip_prefix("acme/") {
                *text = rest.to_owned();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(as_acme_sees),
        Value::Object(map) => map.values_mut().for_each(as_acme_sees),
        _ => {}
    }
}

#[tokio::test]
async fn an_execution_inspected_through_either_door_reports_the_same_run() {
    let doors = Doors::open("inspect").await;
    let workflow = doors.dir.join("release.yaml");
    std::fs::write(
        &workflow,
        "assistants:\n  - {id: writer, model: gpt-4o-mini, system_prompt: Be brief.}\nstates:\n  - {id: draft, assistant_id: writer, task: 'Draft a note on {{topic}}.', next: {state_id: polish}}\n  - {id: polish, assistant_id: writer, task: Polish it., next: {state_id: end}}\n",
    )
    .unwrap();
    let replies = doors.dir.join("replies.yaml");
    std::fs::write(
        &replies,
        "replies:\n  - content: A first draft.\n  - content: A polished note.\n",
    )
    .unwrap();
    let (workflow, llm) = (
        workflow.display().to_string(),
        format!("scripted:{}", replies.display()),
    );
    doors.contexture_ok(&[
        "run",
        &workflow,
        "--input",
        "{\"topic\": \"the fox\"}",
        "--tenant",
        "acme",
        "--execution-id",
        "run-1",
        "--llm",
        &llm,
    ]);
    let inspected = doors.contexture_ok(&["inspect", "acme/run-1", "--json"]);
    let mut inspected: Value = serde_json::from_str(&inspected).unwrap();
    as_acme_sees(&mut inspected);
    let status = doors.get_json("/v1/executions/run-1").await;
    assert_eq!(status["status"], "completed", "{status}");
    for field in [
        "status",
        "output",
        "error",
        "usage",
        "cost_usd",
        "steps",
        "children",
        "usage_tree",
    ] {
        assert_eq!(inspected[field], status[field], "{field}");
    }
    let requests = doors.get_json("/v1/executions/run-1/requests").await;
    assert_eq!(inspected["calls"], requests["requests"]);
    assert_eq!(requests["requests"].as_array().unwrap().len(), 2);
    doors.server.shutdown().await;
}

#[tokio::test]
async fn threads_listed_and_deleted_through_either_door_agree() {
    let doors = Doors::open("list").await;
    for thread in ["a", "b"] {
        doors.post_conversation(thread).await;
    }
    doors.cli(
        "fork",
        &["--thread", "acme/a", "--at", "3", "--new", "acme/a-fork"],
    );
    let listed = |doors: &Doors| {
        let mut rows: Vec<Value> = doors
            .cli("list", &["--json"])
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        rows.iter_mut().for_each(as_acme_sees);
        rows
    };
    let page = doors.get_json("/v1/threads").await;
    assert_eq!(page["threads"].as_array().unwrap(), &listed(&doors));

    // Neither door deletes a thread that has a fork.
    let output = doors.contexture(&["thread", "delete", "--thread", "acme/a"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("has forks"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let refused = doors
        .api(reqwest::Method::DELETE, "/v1/threads/a")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(listed(&doors).len(), 3, "nothing was deleted");

    // Each door deletes a thread without forks.
    doors.cli("delete", &["--thread", "acme/a-fork"]);
    let deleted = doors
        .api(reqwest::Method::DELETE, "/v1/threads/b")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let ids: Vec<Value> = listed(&doors).iter().map(|row| row["id"].clone()).collect();
    assert_eq!(ids, vec![json!("a")]);
    let page = doors.get_json("/v1/threads").await;
    assert_eq!(page["threads"].as_array().unwrap(), &listed(&doors));
    doors.server.shutdown().await;
}
