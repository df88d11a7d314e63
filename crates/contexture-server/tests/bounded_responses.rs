//! What one response may cost the server, tried as a hostile tenant would: a page of a
//! thread's events whose request records each resolve to the whole history they sent is
//! bounded by bytes as well as by count, and five clients that never read their pages do
//! not take the server's memory.

mod common;

use std::time::Duration;

use common::{TestServer, client, config};
use contexture_core::Message;
use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, RequestRecord, Usage};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, NewEvent, SqliteStore, Store};
use reqwest::StatusCode;
use serde_json::Value;

/// This process's resident memory, in bytes (the server runs in it).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A thread of `turns` chat turns of about 2.4 KB a message, each with its request record
/// (the whole history so far) and its end: about 1 MB of text whose records resolve to
/// about 200 MB.
async fn thread_with_records(store: &AnyStore, thread: &str, turns: usize) {
    let mut history: Vec<Message> = Vec::new();
    for turn in 0..turns {
        let question = Message::user(format!("question {turn}: {}", "q".repeat(2_400)));
        history.push(question.clone());
        let record = RequestRecord {
            request_id: format!("{thread}/chat-{turn}"),
            model: Some("gpt-4o-mini".into()),
            messages: history.clone(),
            ..Default::default()
        };
        let answer = Message::assistant(format!("answer {turn}"));
        let events = vec![
            NewEvent::new(EventKind::MessageAppended { message: question }),
            NewEvent::new(EventKind::RequestStarted(record)),
            NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                format!("{thread}/chat-{turn}"),
                RequestOutcome::Completed,
                Usage::new(5, 2),
            ))),
            NewEvent::new(EventKind::MessageAppended {
                message: answer.clone(),
            }),
        ];
        store.append(thread, events).await.unwrap();
        history.push(answer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_large_records_is_bounded_by_bytes_and_slow_readers_hold_little() {
    let dir = TempDir::new("contexture-bounded");
    let store = SqliteStore::open(dir.join("bounded.db")).await.unwrap();
    let server = TestServer::start(config(None), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    thread_with_records(&server.state.store, "acme/big", 400).await;
    let max = server.state.config.limits.max_page_bytes;

    // Paged by bytes: every event once, each page within the bound but for its last event.
    let mut after = 0u64;
    let mut seen = 0usize;
    let mut pages = 0usize;
    loop {
        let response = client()
            .get(server.url(&format!("/v1/threads/big/events?limit=1000&after={after}")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.bytes().await.unwrap();
        let page: Value = serde_json::from_slice(&body).unwrap();
        let events = page["events"].as_array().unwrap();
        let last = serde_json::to_vec(events.last().unwrap()).unwrap().len();
        assert!(
            body.len() <= max + last + 64,
            "a page of {} bytes, bound {max}",
            body.len()
        );
        assert_eq!(events[0]["seq"], after + 1);
        seen += events.len();
        pages += 1;
        match page["next_after"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(seen, 1600);
    assert!(pages > 10, "{pages} pages");

    // Five clients ask for the largest page and never read it.
    let before = resident_bytes();
    let mut held = Vec::new();
    for _ in 0..5 {
        let response = client()
            .get(server.url("/v1/threads/big/events?limit=1000&after=1000"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = resident_bytes().saturating_sub(before);
    eprintln!("resident memory grew by {} MB", grown / 1_000_000);
    assert!(grown < 100_000_000, "grew by {grown} bytes");
    drop(held);
    let healthz = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(healthz.status(), StatusCode::OK);
}
