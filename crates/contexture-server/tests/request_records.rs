//! Property: every request a chat thread records reads back, through the API, exactly as the
//! upstream received it, whatever happened to the thread: turns trimmed to a small window,
//! automatic and requested compactions, restores, forks continued and merged back. Cases:
//! `PROPTEST_CASES` (default 16; each case is a server on a fresh SQLite file).

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// One thing a client does to the conversation.
#[derive(Debug, Clone)]
enum Op {
    /// A chat turn: on the small-window model or the large one, a question of some length.
    Turn { small: bool, words: usize },
    /// `POST .../compact`.
    Compact,
    /// `POST .../restore` before the thread's last replace, when it has one.
    Restore,
    /// `POST .../fork`; the conversation goes on in the fork.
    Fork,
    /// `POST .../merge` of the fork the conversation is in into its parent, which it goes on
    /// in.
    Merge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (any::<bool>(), 1..60usize).prop_map(|(small, words)| Op::Turn { small, words }),
        1 => Just(Op::Compact),
        1 => Just(Op::Restore),
        1 => Just(Op::Fork),
        1 => Just(Op::Merge),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

/// `method path` with `body`: the status and the JSON answer. A server error fails the test.
async fn call(
    server: &TestServer,
    key: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let request = match method {
        "GET" => client().get(server.url(path)),
        _ => client().post(server.url(path)).json(&body),
    };
    let response = request.bearer_auth(key).send().await.unwrap();
    let status = response.status();
    let value: Value = response.json().await.unwrap_or(Value::Null);
    assert!(
        !status.is_server_error(),
        "{method} {path}: {status} {value}"
    );
    (status, value)
}

/// The request records of `thread` after `after`, with the seq of its last event.
async fn records_after(
    server: &TestServer,
    key: &str,
    thread: &str,
    mut after: u64,
) -> (Vec<Value>, u64) {
    let mut records = Vec::new();
    loop {
        let (status, page) = call(
            server,
            key,
            "GET",
            &format!("/v1/threads/{thread}/events?after={after}&limit=1000"),
            Value::Null,
        )
        .await;
        if status == StatusCode::NOT_FOUND {
            return (records, after);
        }
        let events = page["events"].as_array().unwrap();
        if events.is_empty() {
            return (records, after);
        }
        for event in events {
            after = event["seq"].as_u64().unwrap();
            if event["type"] == "request_started" {
                records.push(event["messages"].clone());
            }
        }
    }
}

/// The seq of `thread`'s last replace event, if any.
async fn last_replace(server: &TestServer, key: &str, thread: &str) -> Option<u64> {
    let (_, page) = call(
        server,
        key,
        "GET",
        &format!("/v1/threads/{thread}/events?limit=1000"),
        Value::Null,
    )
    .await;
    page["events"]
        .as_array()?
        .iter()
        .filter(|event| event["type"] == "context_replaced")
        .filter_map(|event| event["seq"].as_u64())
        .next_back()
}

/// How many of each operation succeeded over all cases, so that the property is known to
/// have covered them.
#[derive(Debug, Default)]
struct Covered {
    compacted: std::sync::atomic::AtomicUsize,
    restored: std::sync::atomic::AtomicUsize,
    forked: std::sync::atomic::AtomicUsize,
    merged: std::sync::atomic::AtomicUsize,
}

fn count(counter: &std::sync::atomic::AtomicUsize, status: StatusCode) {
    if status.is_success() {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn run(ops: Vec<Op>, covered: &Covered) -> Result<(), TestCaseError> {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|n, _| {
        let words = ["the", "window", "holds", "what", "the", "call", "needs"];
        let text: Vec<&str> = (0..(n * 7) % 40 + 1).map(|i| words[(n + i) % 7]).collect();
        Reply::text(format!("answer {n}: {}", text.join(" ")))
    });
    let dir = TempDir::new("contexture-records-prop");
    let models = dir.join("models.toml");
    std::fs::write(
        &models,
        "[models.\"tiny-llm\"]\ncontext_window = 500\nmax_output_tokens = 100\nencoding = \"cl100k_base\"\n",
    )
    .unwrap();
    let store = SqliteStore::open(dir.join("chat.db")).await.unwrap();
    let mut config = config(Some(&upstream.base_url()));
    config.models_file = Some(models);
    config.compaction = Some(
        serde_json::from_value(json!({"trigger": {"messages": 14}, "keep": {"messages": 4}}))
            .unwrap(),
    );
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    // The threads the conversation went through (parents before their forks), and how far
    // each one's records were checked.
    let mut path: Vec<String> = vec!["conv".into()];
    let mut checked: std::collections::HashMap<String, u64> = Default::default();
    let mut calls_checked = 0;
    let mut turns = 0usize;
    let mut forks = 0usize;
    for op in ops {
        let thread = path.last().unwrap().clone();
        match op {
            Op::Turn { small, words } => {
                turns += 1;
                let question = format!("question {turns}: {}", "tell me more ".repeat(words));
                let mut messages = vec![json!({"role": "user", "content": question})];
                if turns == 1 {
                    messages.insert(0, json!({"role": "system", "content": "Be brief."}));
                }
                let model = if small { "tiny-llm" } else { "gpt-4o-mini" };
                let response = client()
                    .post(server.url("/v1/chat/completions"))
                    .bearer_auth(&key)
                    .header("X-Contexture-Thread", &thread)
                    .json(&json!({"model": model, "messages": messages}))
                    .send()
                    .await
                    .unwrap();
                // A question too large for the small window is refused, and nothing is sent.
                let status = response.status();
                prop_assert!(
                    status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
                    "{status}"
                );
            }
            Op::Compact => {
                if checked.contains_key(&thread) {
                    let (status, _) = call(
                        &server,
                        &key,
                        "POST",
                        &format!("/v1/threads/{thread}/compact"),
                        json!({}),
                    )
                    .await;
                    count(&covered.compacted, status);
                }
            }
            Op::Restore => {
                if let Some(before) = last_replace(&server, &key, &thread).await {
                    let (status, _) = call(
                        &server,
                        &key,
                        "POST",
                        &format!("/v1/threads/{thread}/restore"),
                        json!({"before": before}),
                    )
                    .await;
                    count(&covered.restored, status);
                }
            }
            Op::Fork => {
                if checked.contains_key(&thread) {
                    forks += 1;
                    let child = format!("fork{forks}");
                    let (status, _) = call(
                        &server,
                        &key,
                        "POST",
                        &format!("/v1/threads/{thread}/fork"),
                        json!({"id": child}),
                    )
                    .await;
                    count(&covered.forked, status);
                    let (_, through) = records_after(&server, &key, &child, 0).await;
                    checked.insert(child.clone(), through);
                    path.push(child);
                }
            }
            Op::Merge => {
                if path.len() > 1 {
                    let child = path.pop().unwrap();
                    let parent = path.last().unwrap();
                    let (status, _) = call(
                        &server,
                        &key,
                        "POST",
                        &format!("/v1/threads/{parent}/merge"),
                        json!({"from": child}),
                    )
                    .await;
                    count(&covered.merged, status);
                }
            }
        }
        // Every call the upstream received since the last check is the thread's next record.
        let thread = path.last().unwrap().clone();
        let after = checked.get(&thread).copied().unwrap_or(0);
        let (records, through) = records_after(&server, &key, &thread, after).await;
        checked.insert(thread, through);
        let calls = upstream.calls();
        prop_assert_eq!(records.len(), calls.len() - calls_checked);
        // A record holds the messages as Contexture keeps them; the upstream got them in
        // OpenAI's form (without Contexture's own metadata).
        for (record, received) in records.iter().zip(&calls[calls_checked..]) {
            let mut sent = record.clone();
            for message in sent.as_array_mut().unwrap() {
                message.as_object_mut().unwrap().remove("metadata");
            }
            prop_assert_eq!(&sent, &received.json["messages"]);
        }
        calls_checked = calls.len();
    }
    server.shutdown().await;
    Ok(())
}

#[test]
fn every_chat_request_reads_back_as_the_upstream_received_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A fixed seed: the cases, and so what they cover, are the same on every machine.
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig {
            cases: cases(),
            ..ProptestConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let covered = Covered::default();
    // One conversation that goes through every operation, whatever the random ones draw.
    let every = vec![
        Op::Turn {
            small: false,
            words: 3,
        },
        Op::Turn {
            small: true,
            words: 5,
        },
        Op::Fork,
        Op::Turn {
            small: false,
            words: 8,
        },
        Op::Turn {
            small: true,
            words: 2,
        },
        Op::Merge,
        Op::Turn {
            small: false,
            words: 4,
        },
        Op::Compact,
        Op::Turn {
            small: true,
            words: 6,
        },
        Op::Restore,
        Op::Turn {
            small: false,
            words: 1,
        },
    ];
    runtime.block_on(run(every, &covered)).unwrap();
    runner
        .run(&prop::collection::vec(op(), 1..25), |ops| {
            runtime.block_on(run(ops, &covered))
        })
        .unwrap();
    for (operation, counter) in [
        ("compaction", &covered.compacted),
        ("restore", &covered.restored),
        ("fork", &covered.forked),
        ("merge", &covered.merged),
    ] {
        let done = counter.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("{operation}: {done}");
        assert!(
            done > 0,
            "no case made a {operation}: the property did not cover it"
        );
    }
}
