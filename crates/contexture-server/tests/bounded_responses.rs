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

/// Held by each test of this file while it runs: they measure the process's resident memory
/// and time, which the other's 58 MB thread would blur if they ran at once.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _alone = ALONE.lock().await;
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

/// A thread of 20 tool results of 2.9 MB each (58 MB), whose own policy truncates each to 48
/// tokens.
async fn thread_with_huge_results(store: &AnyStore, thread: &str) {
    use contexture_core::ToolCall;
    use contexture_core::thread::{PolicyChange, ThreadPolicy};
    let policy: contexture_core::fit::FitPolicy =
        serde_json::from_value(serde_json::json!({"truncate_tool_results": {"max_tokens": 48}}))
            .unwrap();
    let set = PolicyChange {
        policy: Some(ThreadPolicy {
            fit: Some(policy),
            compaction: None,
        }),
    };
    store
        .append(thread, vec![NewEvent::new(EventKind::PolicySet(set))])
        .await
        .unwrap();
    let say = |message: Message| NewEvent::new(EventKind::MessageAppended { message });
    store
        .append(thread, vec![say(Message::user("Find the slow requests."))])
        .await
        .unwrap();
    for i in 0..20 {
        let id = format!("call-{i}");
        let mut log = String::with_capacity(2_900_100);
        let mut line = 0usize;
        while log.len() < 2_900_000 {
            log.push_str(&format!(
                "{line:08} INFO request {} served in {} ms\n",
                (line * 31 + i) % 100_000,
                (line * 7) % 900
            ));
            line += 1;
        }
        store
            .append(
                thread,
                vec![
                    say(Message::assistant_tool_calls(vec![ToolCall::new(
                        id.clone(),
                        "logs",
                        "{}",
                    )])),
                    say(Message::tool_result(id, log)),
                ],
            )
            .await
            .unwrap();
    }
}

/// The `q`-th quantile of `samples` (nearest rank).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_reads_of_a_huge_thread_leave_another_tenant_served() {
    let _alone = ALONE.lock().await;
    let dir = TempDir::new("contexture-bounded");
    let store = SqliteStore::open(dir.join("bounded.db")).await.unwrap();
    let mut config = config(None);
    config.limits.max_thread_bytes = 1024 * 1024 * 1024;
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let acme = server.key("acme").await;
    let zeta = server.key("zeta").await;
    thread_with_huge_results(&server.state.store, "acme/huge").await;
    let (status, _) = server
        .call(
            &zeta,
            "POST",
            "/v1/threads/small/messages",
            Some(serde_json::json!({"messages": [{"role": "user", "content": "hello"}]})),
        )
        .await;
    assert!(status.is_success());
    let context = "/v1/threads/huge/context?model=gpt-4o-mini";
    // The first read loads the thread; a repeated one on the unchanged thread costs a small
    // part of it.
    let timed_read = || async {
        let started = std::time::Instant::now();
        let (status, body) = server.call(&acme, "GET", context, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["fit"]["truncated"].as_array().map(Vec::len),
            Some(20),
            "{body}"
        );
        started.elapsed()
    };
    let first = timed_read().await;
    let mut again: Vec<Duration> = Vec::new();
    for _ in 0..5 {
        again.push(timed_read().await);
    }
    let repeated = quantile(&mut again, 0.5);
    eprintln!("GET /context: first {first:?}, repeated {repeated:?} (median of 5)");
    assert!(
        repeated < first / 10,
        "first {first:?}, repeated {repeated:?}"
    );

    // Tenant A reads it four at a time, again and again; tenant B's health checks and reads
    // go on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..4 {
        let (base, key, stop) = (server.base.clone(), acme.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let response = client()
                    .get(format!("{base}{context}"))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                response.bytes().await.unwrap();
                reads += 1;
            }
            reads
        }));
    }
    let mut health = Vec::new();
    let mut reads = Vec::new();
    for _ in 0..40 {
        let started = std::time::Instant::now();
        let response = client().get(server.url("/healthz")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        health.push(started.elapsed());
        let started = std::time::Instant::now();
        let (status, _) = server
            .call(&zeta, "GET", "/v1/threads/small/messages", None)
            .await;
        assert_eq!(status, StatusCode::OK);
        reads.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut read_by_a = 0;
    for reader in readers {
        read_by_a += reader.await.unwrap();
    }
    // Of 40 samples the 99th percentile is the slowest one, which a single scheduling
    // hiccup of this 2-core machine decides; nine in ten within the bound, and none starved,
    // is what says B is served while A reads.
    let health_p90 = quantile(&mut health, 0.9);
    let reads_p90 = quantile(&mut reads, 0.9);
    let (health_max, reads_max) = (quantile(&mut health, 1.0), quantile(&mut reads, 1.0));
    eprintln!(
        "tenant B while A read {read_by_a} times: /healthz p90 {health_p90:?} (max {health_max:?}), reads p90 {reads_p90:?} (max {reads_max:?})"
    );
    assert!(read_by_a >= 4, "{read_by_a}");
    assert!(health_p90 < Duration::from_millis(100), "{health_p90:?}");
    assert!(reads_p90 < Duration::from_millis(200), "{reads_p90:?}");
    assert!(
        health_max < Duration::from_secs(1) && reads_max < Duration::from_secs(1),
        "{health_max:?} {reads_max:?}"
    );
}
