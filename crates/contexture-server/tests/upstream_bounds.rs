//! What one tenant's requests may cost the operator's upstream, tried as a hostile tenant
//! would: a thread policy whose summarizer never succeeds makes a bounded number of calls,
//! with waits between them; a tenant's completions in flight are bounded (a 429 beyond,
//! another tenant unaffected); and a server that stops ends the work its requests started
//! within its shutdown grace.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_server::ServerConfig;
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn server(
    dir: &TempDir,
    upstream: &FakeUpstream,
    tweak: impl FnOnce(&mut ServerConfig),
) -> TestServer {
    let store = SqliteStore::open(dir.join("bounds.db")).await.unwrap();
    let mut config = config(Some(&upstream.base_url()));
    tweak(&mut config);
    TestServer::start(config, AnyStore::Sqlite(store)).await
}

/// A chat turn on `thread` (none: passed through): its status and body.
async fn chat(base: &str, key: &str, thread: Option<&str>, text: &str) -> (StatusCode, Value) {
    let mut request = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .timeout(Duration::from_secs(60))
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}));
    if let Some(thread) = thread {
        request = request.header("X-Contexture-Thread", thread);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The summarizer prompt of the reproduction: the tenant asks for an empty summary.
const EMPTY_SUMMARY_PROMPT: &str = "REPLY_WITH_ONE_SPACE {transcript}";

/// Answers the summarizer's calls with one space (an empty summary), the rest with text.
fn upstream_refusing_summaries(upstream: &FakeUpstream) {
    upstream.otherwise(|number, request| {
        let first = request.json["messages"][0]["content"]
            .as_str()
            .unwrap_or_default();
        if first.starts_with("REPLY_WITH_ONE_SPACE") {
            Reply::text(" ")
        } else {
            Reply::text(format!("answer {number}"))
        }
    });
}

/// A thread whose own policy compacts after two messages with the tenant's summarizer and
/// prompt, and `max_retries` retries.
async fn thread_compacting_on_every_turn(server: &TestServer, key: &str, max_retries: u64) {
    let policy = json!({
        "compaction": {
            "trigger": {"messages": 2},
            "keep": {"messages": 1},
            "summarizer": "gpt-4o-mini",
            "prompt": EMPTY_SUMMARY_PROMPT,
            "max_retries": max_retries,
        }
    });
    let (status, body) = server
        .call(
            key,
            "POST",
            "/v1/threads",
            Some(json!({"id": "spin", "policy": policy})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = server
        .call(
            key,
            "POST",
            "/v1/threads/spin/messages",
            Some(json!({"messages": [
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "two"},
            ]})),
        )
        .await;
    assert!(status.is_success(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summarizer_that_never_succeeds_costs_one_chat_request_at_most_seven_calls() {
    let upstream = FakeUpstream::start().await;
    upstream_refusing_summaries(&upstream);
    let dir = TempDir::new("contexture-bounds");
    let server = server(&dir, &upstream, |_| {}).await;
    let key = server.key("acme").await;
    // The largest count a policy may set; the reproduction's 4294967294 is refused (the
    // hostile-input suite names the field).
    thread_compacting_on_every_turn(&server, &key, 5).await;
    let (status, _) = server
        .call(
            &key,
            "PUT",
            "/v1/threads/spin/policy",
            Some(json!({"compaction": {"trigger": {"messages": 2}, "max_retries": 4294967294u64}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let started = Instant::now();
    let (status, body) = chat(&server.base, &key, Some("spin"), "three").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = upstream.bodies();
    let summaries = calls
        .iter()
        .filter(|call| {
            call["messages"][0]["content"]
                .as_str()
                .is_some_and(|text| text.starts_with("REPLY_WITH_ONE_SPACE"))
        })
        .count();
    // 1 + 5 summarizer attempts, then the chat call itself (trimmed instead).
    assert_eq!((summaries, calls.len()), (6, 7), "{calls:#?}");
    // The retries waited for each other: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s.
    assert!(
        started.elapsed() >= Duration::from_millis(3000),
        "{:?}",
        started.elapsed()
    );
    // Nothing more is called once the turn has answered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.bodies().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_at_most_its_share_of_completions_in_flight() {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|number, _| {
        Reply::text(format!("answer {number}")).after(Duration::from_millis(800))
    });
    let dir = TempDir::new("contexture-bounds");
    let server = server(&dir, &upstream, |config| config.limits.max_chat_turns = 2).await;
    let acme = server.key("acme").await;
    let zeta = server.key("zeta").await;
    // Two in flight: one waiting for its thread behind a turn, and one passed through.
    let mut held = Vec::new();
    for thread in [Some("a"), None] {
        let (base, key) = (server.base.clone(), acme.clone());
        held.push(tokio::spawn(async move {
            chat(&base, &key, thread, "hold").await
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = chat(&server.base, &acme, Some("b"), "one too many").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("limits.max_chat_turns"), "{message}");
    // Nothing of the refused turn was stored.
    let (status, _) = server.call(&acme, "GET", "/v1/threads/b", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Another tenant is not held to acme's share.
    let (status, body) = chat(&server.base, &zeta, Some("z"), "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for task in held {
        assert_eq!(task.await.unwrap().0, StatusCode::OK);
    }
    // The slots come back once the completions end.
    let (status, body) = chat(&server.base, &acme, Some("b"), "now").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_ends_a_turns_compaction_within_its_grace() {
    let upstream = FakeUpstream::start().await;
    // Every summary comes back empty after a while: without a bound, the retries would
    // go on past the shutdown.
    upstream.otherwise(|number, request| {
        let first = request.json["messages"][0]["content"]
            .as_str()
            .unwrap_or_default();
        if first.starts_with("REPLY_WITH_ONE_SPACE") {
            Reply::text(" ").after(Duration::from_millis(400))
        } else {
            Reply::text(format!("answer {number}"))
        }
    });
    let dir = TempDir::new("contexture-bounds");
    let server = server(&dir, &upstream, |config| config.shutdown_grace_secs = 1).await;
    let key = server.key("acme").await;
    thread_compacting_on_every_turn(&server, &key, 5).await;
    let turn = tokio::spawn({
        let (base, key) = (server.base.clone(), key.clone());
        async move { chat(&base, &key, Some("spin"), "three").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopping = Instant::now();
    server.shutdown().await;
    let stopped_in = stopping.elapsed();
    assert!(stopped_in < Duration::from_secs(3), "{stopped_in:?}");
    let (status, _) = turn.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let calls = upstream.bodies().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        upstream.bodies().len(),
        calls,
        "calls went on after the server stopped"
    );
    assert!(calls < 6, "{calls} calls");
}
