//! Chat turns on one thread never corrupt it: turns run one at a time, in the order they
//! arrived, on SQLite and PostgreSQL and across two servers sharing a store; a turn that
//! waits too long is refused with nothing stored; and a thread that an earlier release wrote
//! with overlapping turns reads back whole.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{TestServer, client, config};
use contexture_core::thread::{Event, EventKind, Thread};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_server::ServerConfig;
use contexture_store::testing::{self, TempDir};
use contexture_store::{AnyStore, PgStore, SqliteStore, Store};
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// One chat turn on `thread` through the server at `base`: the status and the answer's text
/// (when it answered), or the error body's message.
async fn turn(
    base: &str,
    key: &str,
    thread: &str,
    text: &str,
    idempotency_key: Option<&str>,
) -> (StatusCode, String) {
    let mut request = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .header("X-Contexture-Thread", thread)
        .timeout(Duration::from_secs(60))
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}));
    if let Some(idempotency_key) = idempotency_key {
        request = request.header("Idempotency-Key", idempotency_key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let text = body["choices"][0]["message"]["content"]
        .as_str()
        .or(body["error"]["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    (status, text)
}

/// The texts of the messages appended to a thread, in seq order.
fn appended_texts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::MessageAppended { message } => Some(message.text()),
            _ => None,
        })
        .collect()
}

/// Fails unless every prefix of `events` replays and no two requests were in flight at
/// once: what the turns' queue guarantees of a log written from now on.
fn assert_turns_never_overlap(events: &[Event], thread: &str) {
    let mut fold = Thread::new(thread);
    for event in events {
        if let EventKind::RequestStarted(record) = &event.kind {
            assert_eq!(
                fold.in_flight(),
                None,
                "seq {}: request `{}` started while another was in flight",
                event.seq,
                record.request_id
            );
        }
        fold.apply(event.clone()).unwrap_or_else(|error| {
            panic!(
                "the prefix up to seq {} does not replay: {error}",
                event.seq
            )
        });
    }
    assert_eq!(fold.in_flight(), None, "a request was left in flight");
}

/// A server on the SQLite file `turns.db` in `dir` with the fake `upstream`.
async fn sqlite_server(
    dir: &TempDir,
    upstream: &FakeUpstream,
    tweak: impl FnOnce(&mut ServerConfig),
) -> TestServer {
    let store = SqliteStore::open(dir.join("turns.db")).await.unwrap();
    let mut config = config(Some(&upstream.base_url()));
    tweak(&mut config);
    TestServer::start(config, AnyStore::Sqlite(store)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_turns_at_once_run_one_at_a_time_each_fitted_with_the_answer_before_it() {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|number, _| {
        Reply::text(format!("answer {number}"))
            .usage(10, 2)
            .after(Duration::from_millis(100))
    });
    let dir = TempDir::new("contexture-turns");
    let server = sqlite_server(&dir, &upstream, |_| {}).await;
    let key = server.key("acme").await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (base, key) = (server.base.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            turn(&base, &key, "twin-clicks", &format!("question {i}"), None).await
        }));
        // Arrival order is the order the requests were sent in: far enough apart that a
        // busy machine does not swap two on their way to the server.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for task in tasks {
        let (status, text) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    // The thread reads back, and so does every later read.
    let (status, body) = server
        .call(&key, "GET", "/v1/threads/twin-clicks/messages", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["messages"].as_array().unwrap().len(), 16, "{body}");
    let events = server.state.store.events("acme/twin-clicks").await.unwrap();
    assert_turns_never_overlap(&events, "acme/twin-clicks");
    // Each call was sent every turn and answer before it: the k-th (from 0) holds 2k + 1
    // messages, the answer of the call before it second to last.
    let calls = upstream.bodies();
    assert_eq!(calls.len(), 8);
    for (k, call) in calls.iter().enumerate() {
        let messages = call["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 * k + 1, "call {k}: {messages:?}");
        if k > 0 {
            assert_eq!(messages[2 * k - 1]["content"], format!("answer {k}"));
        }
    }
    // The questions were taken in the order they arrived.
    let questions: Vec<String> = appended_texts(&events)
        .into_iter()
        .filter(|text| text.starts_with("question"))
        .collect();
    let expected: Vec<String> = (0..8).map(|i| format!("question {i}")).collect();
    assert_eq!(questions, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_waits_past_the_limit_is_refused_with_nothing_stored() {
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("slow answer").after(Duration::from_millis(1500)));
    let dir = TempDir::new("contexture-turns");
    let server = sqlite_server(&dir, &upstream, |config| {
        config.limits.thread_turn_wait_secs = 0.3;
    })
    .await;
    let key = server.key("acme").await;
    let first = tokio::spawn({
        let (base, key) = (server.base.clone(), key.clone());
        async move { turn(&base, &key, "busy", "first", None).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let (status, message) = turn(&server.base, &key, "busy", "second", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{message}");
    assert!(
        message.contains("busy") && message.contains("nothing was stored"),
        "{message}"
    );
    assert!(
        !message.contains("acme/"),
        "the tenant's prefix stays inside: {message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let (status, text) = first.await.unwrap();
    assert_eq!((status, text.as_str()), (StatusCode::OK, "slow answer"));
    let events = server.state.store.events("acme/busy").await.unwrap();
    assert_eq!(appended_texts(&events), ["first", "slow answer"]);
    assert_turns_never_overlap(&events, "acme/busy");
    // The thread is free again.
    let (status, _) = turn(&server.base, &key, "busy", "third", None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_stopped_server_left_in_flight_is_ended_by_the_next_turn() {
    let upstream = FakeUpstream::start().await;
    let dir = TempDir::new("contexture-turns");
    let server = sqlite_server(&dir, &upstream, |_| {}).await;
    let key = server.key("acme").await;
    let (status, _) = turn(&server.base, &key, "left", "hello", None).await;
    assert_eq!(status, StatusCode::OK);
    // What a server that stopped mid-call leaves: a request started and never ended.
    let started = EventKind::RequestStarted(contexture_core::thread::RequestRecord {
        request_id: "acme/left/chat-stopped".into(),
        ..Default::default()
    });
    server
        .state
        .store
        .append_one("acme/left", started.into())
        .await
        .unwrap();
    let (status, text) = turn(&server.base, &key, "left", "still there?", None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = server.state.store.events("acme/left").await.unwrap();
    assert_turns_never_overlap(&events, "acme/left");
    let abandoned = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::RequestEnded(end) if end.request_id == "acme/left/chat-stopped" => {
                Some(end.clone())
            }
            _ => None,
        })
        .expect("the abandoned request's end");
    assert!(abandoned.error.unwrap().starts_with("abandoned"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_written_with_overlapping_turns_reads_back_whole_after_the_upgrade() {
    // Written by the release before turns were queued: eight turns sent at once on one
    // thread, their requests overlapping (8 questions, 8 requests started, then 8 ends and
    // answers), which that release could no longer read.
    let dir = TempDir::new("contexture-turns");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/overlapping-turns.db");
    std::fs::copy(&fixture, dir.join("turns.db")).unwrap();
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("after the upgrade"));
    let server = sqlite_server(&dir, &upstream, |_| {}).await;
    let key = server.key("acme").await;
    let (status, body) = server
        .call(&key, "GET", "/v1/threads/overlapping/messages", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let texts: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["content"].as_str().unwrap())
        .collect();
    // The turns and answers in seq order: the questions, then the answers as they ended.
    assert_eq!(texts.len(), 16, "{texts:?}");
    let mut questions: Vec<&str> = texts[..8].to_vec();
    questions.sort_unstable();
    let expected: Vec<String> = (0..8).map(|i| format!("question {i}")).collect();
    assert_eq!(questions, expected);
    assert!(
        texts[8..].iter().all(|text| text.starts_with("answer ")),
        "{texts:?}"
    );
    let (status, body) = server
        .call(
            &key,
            "GET",
            "/v1/threads/overlapping/events?limit=1000",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A new turn on it is fitted with everything it holds.
    let (status, text) = turn(&server.base, &key, "overlapping", "and now?", None).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, "after the upgrade")
    );
    let sent = upstream.bodies();
    assert_eq!(sent[0]["messages"].as_array().unwrap().len(), 17);
}

/// What one client does to a thread, at once with the others.
#[derive(Debug, Clone)]
enum Op {
    /// A chat turn, through server `on` (0 or 1).
    Turn { on: usize },
    /// The same keyed turn sent through both servers at once: answered once.
    KeyedTwice,
    /// Messages appended through the threads API.
    Append { on: usize },
    /// A switch of the active context.
    Switch { on: usize, alt: bool },
    /// A compaction through the threads API (the offline summarizer).
    Compact { on: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..2).prop_map(|on| Op::Turn { on }),
        1 => Just(Op::KeyedTwice),
        2 => (0usize..2).prop_map(|on| Op::Append { on }),
        1 => (0usize..2, any::<bool>()).prop_map(|(on, alt)| Op::Switch { on, alt }),
        1 => (0usize..2).prop_map(|on| Op::Compact { on }),
    ]
}

/// Runs `ops` at once on one thread through `servers` (two sharing a store) and checks the
/// thread: readable, every answered turn in it once, no two requests in flight at once, and
/// every prefix of its log replays.
async fn drive(servers: &[TestServer; 2], key: &str, thread: &str, ops: Vec<Op>, delays: Vec<u64>) {
    let mut tasks = Vec::new();
    for (i, (op, delay)) in ops.into_iter().zip(delays).enumerate() {
        let bases = [servers[0].base.clone(), servers[1].base.clone()];
        let (key, thread) = (key.to_owned(), thread.to_owned());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let question = format!("question {i}");
            let mut answered = Vec::new();
            match op {
                Op::Turn { on } => {
                    let (status, text) = turn(&bases[on], &key, &thread, &question, None).await;
                    assert_eq!(status, StatusCode::OK, "{text}");
                    answered.push((question, text));
                }
                Op::KeyedTwice => {
                    let idempotency_key = format!("key-{i}");
                    let (one, two) = tokio::join!(
                        turn(&bases[0], &key, &thread, &question, Some(&idempotency_key)),
                        turn(&bases[1], &key, &thread, &question, Some(&idempotency_key)),
                    );
                    // One answers; the other waits for it and replays its answer, or is
                    // told the first attempt is still being answered.
                    let oks: Vec<&(StatusCode, String)> =
                        [&one, &two].into_iter().filter(|(s, _)| *s == StatusCode::OK).collect();
                    assert!(!oks.is_empty(), "{one:?} {two:?}");
                    assert!(oks.iter().all(|(_, text)| *text == oks[0].1), "{one:?} {two:?}");
                    for (status, text) in [&one, &two] {
                        assert!(
                            *status == StatusCode::OK || *status == StatusCode::CONFLICT,
                            "{status} {text}"
                        );
                    }
                    answered.push((question, oks[0].1.clone()));
                }
                Op::Append { on } => {
                    let response = client()
                        .post(format!("{}/v1/threads/{thread}/messages", bases[on]))
                        .bearer_auth(&key)
                        .json(&json!({"messages": [{"role": "user", "content": format!("note {i}")}]}))
                        .send()
                        .await
                        .unwrap();
                    assert!(response.status().is_success(), "{}", response.status());
                }
                Op::Switch { on, alt } => {
                    let context = if alt { "alt" } else { "main" };
                    let response = client()
                        .post(format!("{}/v1/threads/{thread}/switch", bases[on]))
                        .bearer_auth(&key)
                        .json(&json!({"context": context, "create": true}))
                        .send()
                        .await
                        .unwrap();
                    // A thread not written yet has nothing to switch.
                    let status = response.status();
                    assert!(
                        status.is_success() || status == StatusCode::NOT_FOUND,
                        "{status}"
                    );
                }
                Op::Compact { on } => {
                    let response = client()
                        .post(format!("{}/v1/threads/{thread}/compact", bases[on]))
                        .bearer_auth(&key)
                        .json(&json!({"keep_messages": 2}))
                        .send()
                        .await
                        .unwrap();
                    let status = response.status();
                    assert!(
                        status.is_success()
                            || status == StatusCode::NOT_FOUND
                            || status == StatusCode::CONFLICT
                            || status == StatusCode::UNPROCESSABLE_ENTITY,
                        "{status}: {}",
                        response.text().await.unwrap_or_default()
                    );
                }
            }
            answered
        }));
    }
    let mut answered = Vec::new();
    for task in tasks {
        answered.extend(task.await.unwrap());
    }
    let scoped = format!("acme/{thread}");
    for server in servers {
        let (status, body) = server
            .call(
                key,
                "GET",
                &format!("/v1/threads/{thread}/messages?context=main"),
                None,
            )
            .await;
        assert!(
            status == StatusCode::OK || (answered.is_empty() && status == StatusCode::NOT_FOUND),
            "{status}: {body}"
        );
    }
    if answered.is_empty() {
        return;
    }
    let events = servers[0].state.store.events(&scoped).await.unwrap();
    assert_turns_never_overlap(&events, &scoped);
    let texts = appended_texts(&events);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for text in &texts {
        *counts.entry(text.as_str()).or_default() += 1;
    }
    for (question, answer) in &answered {
        assert_eq!(
            counts.get(question.as_str()),
            Some(&1),
            "{question}: {texts:?}"
        );
        assert_eq!(counts.get(answer.as_str()), Some(&1), "{answer}: {texts:?}");
    }
}

/// Two servers sharing one SQLite file, as two processes would.
async fn sqlite_pair(dir: &TempDir, upstream: &FakeUpstream) -> [TestServer; 2] {
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store = SqliteStore::open(dir.join("shared.db")).await.unwrap();
        let config = config(Some(&upstream.base_url()));
        servers.push(TestServer::start(config, AnyStore::Sqlite(store)).await);
    }
    servers.try_into().map_err(|_| ()).unwrap()
}

/// Two servers sharing one PostgreSQL schema, as two stateless nodes would.
async fn pg_pair(upstream: &FakeUpstream) -> Option<([TestServer; 2], PgStore)> {
    let (store, schema) = testing::pg_store("ctx_turns").await?;
    let second = PgStore::open_in_schema(&testing::pg_url(), &schema)
        .await
        .unwrap();
    let mut servers = Vec::new();
    for store in [store.clone(), second] {
        let config = config(Some(&upstream.base_url()));
        servers.push(TestServer::start(config, AnyStore::Postgres(store)).await);
    }
    Some((servers.try_into().map_err(|_| ()).unwrap(), store))
}

/// The fake upstream of the property: every answer unique, after a short random wait.
fn varied_upstream(upstream: &FakeUpstream) {
    upstream.otherwise(|number, _| {
        Reply::text(format!("answer {number}"))
            .usage(10, 2)
            .after(Duration::from_millis((number as u64 * 7) % 40))
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_turns_appends_and_operations_keep_a_thread_whole_on_sqlite(
        ops in prop::collection::vec(op(), 2..10),
        delays in prop::collection::vec(0u64..30, 10),
    ) {
        runtime().block_on(async {
            let upstream = FakeUpstream::start().await;
            varied_upstream(&upstream);
            let dir = TempDir::new("contexture-turns");
            let servers = sqlite_pair(&dir, &upstream).await;
            let key = servers[0].key("acme").await;
            drive(&servers, &key, "shared", ops, delays).await;
        });
    }

    #[test]
    fn concurrent_turns_appends_and_operations_keep_a_thread_whole_on_postgres(
        ops in prop::collection::vec(op(), 2..10),
        delays in prop::collection::vec(0u64..30, 10),
    ) {
        runtime().block_on(async {
            let upstream = FakeUpstream::start().await;
            varied_upstream(&upstream);
            let Some((servers, store)) = pg_pair(&upstream).await else { return };
            let key = servers[0].key("acme").await;
            drive(&servers, &key, "shared", ops, delays).await;
            for server in servers {
                server.shutdown().await;
            }
            store.drop_schema().await.unwrap();
        });
    }
}
