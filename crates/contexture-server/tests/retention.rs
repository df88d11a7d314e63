//! Retention of request records through the API: a thread's own policy set at creation or
//! later, shown and cleared; and the server's background pruning, on SQLite and PostgreSQL,
//! applying each thread's policy, else its tenant's, else the server's, to chat threads
//! that go on answering as before.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{TestServer, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{TempDir, pg_store};
use contexture_store::{AnyStore, RequestRetention, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn a_threads_retention_is_set_at_creation_shown_changed_and_cleared() {
    let dir = TempDir::new("contexture-retention-api");
    let store = SqliteStore::open(dir.join("api.db")).await.unwrap();
    let mut config = config(None);
    config.retention.keep_days = Some(90);
    config.retention.tenants.insert(
        "acme".into(),
        RequestRetention::new(None, Some(50)).unwrap(),
    );
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;

    let (status, created) = server
        .call(
            &acme,
            "POST",
            "/v1/threads",
            Some(json!({"id": "t", "retention": {"keep_last": 5}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, shown) = server.call(&acme, "GET", "/v1/threads/t", None).await;
    assert_eq!(shown["retention"], json!({"keep_last": 5}), "{shown}");
    assert_eq!(
        shown["applied_retention"],
        json!({"keep_last": 5}),
        "{shown}"
    );

    let (status, set) = server
        .call(
            &acme,
            "PUT",
            "/v1/threads/t/retention",
            Some(json!({"keep_days": 7, "keep_last": 20})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(
        set,
        json!({"id": "t", "retention": {"keep_days": 7, "keep_last": 20},
               "applied_retention": {"keep_days": 7, "keep_last": 20}})
    );
    let (_, listed) = server.call(&acme, "GET", "/v1/threads", None).await;
    assert_eq!(listed["threads"][0]["id"], "t", "{listed}");
    assert_eq!(
        listed["threads"][0]["retention"],
        json!({"keep_days": 7, "keep_last": 20}),
        "{listed}"
    );

    // Cleared, the tenant's policy applies; another tenant's thread gets the server's.
    let (status, cleared) = server
        .call(&acme, "DELETE", "/v1/threads/t/retention", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    assert_eq!(
        cleared,
        json!({"id": "t", "retention": null, "applied_retention": {"keep_last": 50}})
    );
    server
        .call(&globex, "POST", "/v1/threads", Some(json!({"id": "t"})))
        .await;
    let (_, theirs) = server.call(&globex, "GET", "/v1/threads/t", None).await;
    assert_eq!(theirs["retention"], Value::Null, "{theirs}");
    assert_eq!(
        theirs["applied_retention"],
        json!({"keep_days": 90}),
        "{theirs}"
    );
    server.shutdown().await;
}

/// The `request_started` events of `thread`: how many there are, and how many are pruned
/// (their messages gone, their count kept).
async fn records(server: &TestServer, key: &str, thread: &str) -> (usize, usize) {
    let (status, page) = server
        .call(
            key,
            "GET",
            &format!("/v1/threads/{thread}/events?limit=1000"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let started: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["type"] == "request_started")
        .collect();
    let pruned = started
        .iter()
        .filter(|event| {
            let pruned = event.get("pruned").is_some();
            assert_eq!(
                pruned,
                event["messages"].as_array().unwrap().is_empty(),
                "{event}"
            );
            pruned
        })
        .count();
    (started.len(), pruned)
}

async fn the_server_prunes_each_thread_by_its_policy_in_the_background(store: AnyStore) {
    let upstream = FakeUpstream::start().await;
    let mut config = config(Some(&upstream.base_url()));
    config.retention.keep_last = Some(2);
    config.retention.interval_secs = 1;
    config
        .retention
        .tenants
        .insert("acme".into(), RequestRetention::new(None, Some(0)).unwrap());
    let server = TestServer::start(config, store).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;
    server
        .call(
            &acme,
            "POST",
            "/v1/threads",
            Some(json!({"id": "own", "retention": {"keep_last": 3}})),
        )
        .await;
    let mut conversations: BTreeMap<(&str, &str), Vec<Value>> = BTreeMap::new();
    let chat = |key: String, thread: &'static str, turn: usize, history: Vec<Value>| {
        let upstream = &upstream;
        let server = &server;
        async move {
            upstream.push(Reply::text(format!("answer {turn} on {thread}")));
            let mut messages = history;
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
            let (status, answer) = server
                .call(
                    &key,
                    "POST",
                    "/v1/chat/completions",
                    Some(
                        json!({"model": "gpt-4o-mini", "messages": [messages.last().unwrap()],
                            "metadata": {"contexture_thread": thread}}),
                    ),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            let reply = answer["choices"][0]["message"]["content"].clone();
            assert_eq!(reply, json!(format!("answer {turn} on {thread}")));
            messages.push(json!({"role": "assistant", "content": reply}));
            messages
        }
    };
    for turn in 0..4 {
        for (key, tenant, thread) in [
            (&acme, "acme", "talk"),
            (&acme, "acme", "own"),
            (&globex, "globex", "talk"),
        ] {
            let history = conversations.remove(&(tenant, thread)).unwrap_or_default();
            let history = chat(key.clone(), thread, turn, history).await;
            conversations.insert((tenant, thread), history);
        }
    }
    // Each thread's own policy, else its tenant's, else the server's.
    let expected = [
        (&acme, "talk", (4, 4)),
        (&acme, "own", (4, 1)),
        (&globex, "talk", (4, 2)),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    for (key, thread, want) in expected {
        loop {
            let got = records(&server, key, thread).await;
            if got == want {
                break;
            }
            assert!(Instant::now() < deadline, "{thread}: {got:?}, not {want:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("contexture_request_records_pruned_total 7"),
        "{metrics}"
    );
    // The conversations go on as before, and the new records read back whole until the
    // next pruning.
    let history = conversations.remove(&("globex", "talk")).unwrap();
    let history = chat(globex.clone(), "talk", 4, history).await;
    assert_eq!(history.len(), 10);
    let (_, page) = server
        .call(
            &globex,
            "GET",
            "/v1/threads/talk/context?model=gpt-4o-mini",
            None,
        )
        .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 10, "{page}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_prunes_each_thread_by_its_policy_in_the_background_on_sqlite() {
    let dir = TempDir::new("contexture-retention-pruner");
    let store = SqliteStore::open(dir.join("pruner.db")).await.unwrap();
    the_server_prunes_each_thread_by_its_policy_in_the_background(AnyStore::Sqlite(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_prunes_each_thread_by_its_policy_in_the_background_on_postgres() {
    let Some((store, _schema)) = pg_store("retention").await else {
        return;
    };
    let cleanup = store.clone();
    the_server_prunes_each_thread_by_its_policy_in_the_background(AnyStore::Postgres(store)).await;
    cleanup.drop_schema().await.unwrap();
}
