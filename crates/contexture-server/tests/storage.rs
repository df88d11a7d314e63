//! A conversation's storage grows with its text, not with the square of its length: 1,000
//! messages through the OpenAI-compatible endpoint, every turn sending the whole conversation
//! upstream, take at most 3 bytes on disk per byte of their messages, on SQLite and on
//! PostgreSQL; and every request reads back through the API exactly as the upstream got it.

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{self, TempDir, message_length, prose};
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Turns of the conversation: a question and an answer each.
const TURNS: usize = 500;

/// Holds a 1,000-message conversation on `server`, then checks what the upstream got against
/// what the API reads back, and returns the thread's message bytes.
async fn converse(server: &TestServer, upstream: &FakeUpstream, key: &str) -> u64 {
    for turn in 0..TURNS {
        let mut messages =
            vec![json!({"role": "user", "content": prose(turn, message_length(turn))})];
        if turn == 0 {
            messages.insert(0, json!({"role": "system", "content": "Answer briefly."}));
        }
        let response = client()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("X-Contexture-Thread", "long")
            .json(&json!({"model": "gpt-4o-mini", "messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "turn {turn}");
    }
    let calls = upstream.calls();
    assert_eq!(calls.len(), TURNS);
    assert_eq!(
        calls[TURNS - 1].json["messages"].as_array().unwrap().len(),
        2 * TURNS,
        "every turn sends the whole conversation"
    );
    // Every request record reads back as the upstream got it.
    let mut sent = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = client()
            .get(server.url(&format!("/v1/threads/long/events?after={after}&limit=500")))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let events = page["events"].as_array().expect("an events page");
        if events.is_empty() {
            break;
        }
        for event in events {
            after = event["seq"].as_u64().unwrap();
            if event["type"] == "request_started" {
                sent.push(event["messages"].clone());
            }
        }
    }
    assert_eq!(sent.len(), TURNS);
    for (turn, (recorded, call)) in sent.iter().zip(&calls).enumerate() {
        assert_eq!(
            *recorded, call.json["messages"],
            "turn {turn}'s record reads back as sent"
        );
    }
    let listed: Value = client()
        .get(server.url("/v1/threads"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let thread = listed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|thread| thread["id"] == "long")
        .expect("the thread is listed")
        .clone();
    thread["message_bytes"].as_u64().unwrap()
}

fn upstream_answering_prose(upstream: &FakeUpstream) {
    upstream.otherwise(|call, _| Reply::text(prose(call + TURNS, message_length(call + TURNS))));
}

/// Checks what the conversation added to a store that held `empty` bytes on disk before it
/// against its text: the store's fixed cost (its tables' and indexes' first pages) is not the
/// conversation's.
fn assert_linear(store: &str, empty: u64, disk: u64, message_bytes: u64) {
    let grown = disk - empty;
    let ratio = grown as f64 / message_bytes as f64;
    eprintln!(
        "{store}: {disk} bytes on disk, {grown} more than the empty store's {empty}, for {message_bytes} bytes of messages ({ratio:.2}x)"
    );
    assert!(ratio <= 3.0, "{store}: {ratio:.2}x the text on disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_conversation_takes_at_most_three_times_its_text_on_sqlite() {
    let upstream = FakeUpstream::start().await;
    upstream_answering_prose(&upstream);
    let dir = TempDir::new("contexture-storage");
    let path = dir.join("chat.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let empty = testing::sqlite_disk_bytes(&path);
    let server =
        TestServer::start(config(Some(&upstream.base_url())), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let message_bytes = converse(&server, &upstream, &key).await;
    server.shutdown().await;
    eprintln!(
        "sqlite: event bodies by kind: {:?}",
        testing::sqlite_body_bytes_by_kind(&path)
    );
    assert_linear(
        "sqlite",
        empty,
        testing::sqlite_disk_bytes(&path),
        message_bytes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_conversation_takes_at_most_three_times_its_text_on_postgres() {
    let Some((store, schema)) = testing::pg_store("ctx_storage").await else {
        return;
    };
    let empty = testing::pg_disk_bytes(&schema).await;
    let upstream = FakeUpstream::start().await;
    upstream_answering_prose(&upstream);
    let server = TestServer::start(
        config(Some(&upstream.base_url())),
        AnyStore::Postgres(store.clone()),
    )
    .await;
    let key = server.key("acme").await;
    let message_bytes = converse(&server, &upstream, &key).await;
    server.shutdown().await;
    let disk = testing::pg_disk_bytes(&schema).await;
    store.drop_schema().await.unwrap();
    assert_linear("postgres", empty, disk, message_bytes);
}
