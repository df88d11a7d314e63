//! Tenancy on every route that names an id, with two tenants on SQLite and on PostgreSQL:
//! another tenant's threads, forks and executions answer 404 on every read and write (events
//! streams resumed with `Last-Event-ID` too), merges from another tenant's fork find
//! nothing, the same names are separate threads, and nothing of the owner's changes. A
//! conversation that executions continue is one of its tenant's threads: listed, readable
//! and deletable by it, not found by another.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{TempDir, pg_store};
use contexture_store::{AnyStore, SqliteStore};
use reqwest::Method as M;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn call(
    server: &TestServer,
    key: &str,
    method: M,
    path: &str,
    body: Option<Value>,
    last_event_id: Option<&str>,
) -> (StatusCode, String) {
    let mut request = client()
        .request(method, server.url(path))
        .bearer_auth(key)
        .timeout(Duration::from_secs(10));
    if let Some(body) = body {
        request = request.json(&body);
    }
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.text().await.unwrap_or_default())
}

/// Everything acme owns, as its own key reads it.
async fn acme_view(server: &TestServer, key: &str) -> Vec<String> {
    let mut view = Vec::new();
    for path in [
        "/v1/threads",
        "/v1/threads/secret",
        "/v1/threads/secret/events",
        "/v1/threads/secret-fork/events",
        "/v1/threads/run-1/events",
        "/v1/executions/run-1",
        "/v1/executions/run-1/requests",
        "/ui/views/executions/run-1",
        "/ui/views/threads/secret?model=gpt-4o-mini",
        "/ui/views/threads/secret-fork",
        "/v1/threads/conversation:alice:support",
        "/v1/threads/conversation:alice:support/events",
    ] {
        let (status, body) = call(server, key, M::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        view.push(body);
    }
    view
}

async fn every_route_keeps_tenants_apart(store: AnyStore) {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::text("acme's answer"));
    upstream.push(Reply::text("acme's second answer"));
    let mut config = config(Some(&base));
    config.llm = "openai:gpt-4o-mini".into();
    let server = TestServer::start(config, store).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;

    let setup = [
        (
            M::POST,
            "/v1/threads",
            json!({"id": "secret", "system": "acme only"}),
        ),
        (
            M::POST,
            "/v1/threads/secret/messages",
            json!({"messages": [{"role": "user", "content": "acme's question"}]}),
        ),
        (
            M::POST,
            "/v1/threads/secret/fork",
            json!({"id": "secret-fork"}),
        ),
        (
            M::PUT,
            "/v1/threads/secret/retention",
            json!({"keep_days": 30}),
        ),
        (
            M::PUT,
            "/v1/threads/secret/policy",
            json!({"context": {"window": 4000, "hysteresis": {"high": 0.9, "low": 0.6}}}),
        ),
        (
            M::POST,
            "/v1/executions",
            json!({"id": "run-1", "workflow_yaml": WORKFLOW, "conversation": {"user": "alice"}}),
        ),
    ];
    for (method, path, body) in setup {
        let (status, body) = call(&server, &acme, method, path, Some(body), None).await;
        assert!(status.is_success(), "{path}: {body}");
    }
    wait_for_completion(&server, &acme, "run-1").await;
    // A second run continues alice's conversation.
    let (status, text) = call(
        &server,
        &acme,
        M::POST,
        "/v1/executions",
        Some(json!({"id": "run-2", "workflow_yaml": WORKFLOW, "conversation": {"user": "alice"}})),
        None,
    )
    .await;
    assert!(status.is_success(), "{text}");
    wait_for_completion(&server, &acme, "run-2").await;
    let (_, listed) = call(&server, &acme, M::GET, "/v1/threads", None, None).await;
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let ids: Vec<&str> = listed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "conversation:alice:support",
            "run-1",
            "run-2",
            "secret",
            "secret-fork"
        ]
    );
    let (_, turns) = call(
        &server,
        &acme,
        M::GET,
        "/v1/threads/conversation:alice:support/messages",
        None,
        None,
    )
    .await;
    assert!(turns.contains("acme's second answer"), "{turns}");
    let before = acme_view(&server, &acme).await;

    let not_found: Vec<(M, &str, Option<Value>, Option<&str>)> = vec![
        (M::GET, "/v1/threads/secret", None, None),
        (M::GET, "/v1/threads/secret/events", None, None),
        (M::GET, "/v1/threads/secret/search?query=plans", None, None),
        (M::GET, "/v1/threads/secret/messages?limit=1", None, None),
        (
            M::GET,
            "/v1/threads/secret/messages?context=main",
            None,
            None,
        ),
        (
            M::GET,
            "/v1/threads/secret/context?model=gpt-4o",
            None,
            None,
        ),
        (
            M::POST,
            "/v1/threads/secret/fork",
            Some(json!({"id": "mine"})),
            None,
        ),
        (M::POST, "/v1/threads/secret/compact", Some(json!({})), None),
        (
            M::POST,
            "/v1/threads/secret/restore",
            Some(json!({"before": 1})),
            None,
        ),
        (M::POST, "/v1/threads/secret/pop", Some(json!({})), None),
        (
            M::POST,
            "/v1/threads/secret/pop",
            Some(json!({"format": "responses"})),
            None,
        ),
        (M::POST, "/v1/threads/secret/clear", Some(json!({})), None),
        (
            M::POST,
            "/v1/threads/secret/merge",
            Some(json!({"from": "secret-fork"})),
            None,
        ),
        (
            M::POST,
            "/v1/threads/secret/switch",
            Some(json!({"context": "main", "create": true})),
            None,
        ),
        (
            M::PUT,
            "/v1/threads/secret/retention",
            Some(json!({"keep_last": 0})),
            None,
        ),
        (M::DELETE, "/v1/threads/secret/retention", None, None),
        (
            M::PUT,
            "/v1/threads/secret/policy",
            Some(json!({"context": {"window": 100}})),
            None,
        ),
        (M::DELETE, "/v1/threads/secret/policy", None, None),
        (M::DELETE, "/v1/threads/secret", None, None),
        (M::DELETE, "/v1/threads/secret-fork", None, None),
        (M::GET, "/v1/executions/run-1", None, None),
        (M::GET, "/v1/executions/run-1/events", None, None),
        (M::GET, "/v1/executions/run-1/events", None, Some("2")),
        (M::GET, "/v1/executions/run-1/events?after=1", None, None),
        (M::GET, "/v1/executions/run-1/requests", None, None),
        (M::GET, "/ui/views/executions/run-1", None, None),
        (M::GET, "/ui/views/executions/run-1?after=1", None, None),
        (M::GET, "/ui/views/threads/secret", None, None),
        (M::GET, "/ui/views/threads/secret-fork?after=2", None, None),
        (
            M::POST,
            "/v1/executions/run-1/cancel",
            Some(json!({"reason": "x"})),
            None,
        ),
        (M::GET, "/v1/threads/run-1/events", None, None),
        (M::GET, "/v1/threads/conversation:alice:support", None, None),
        (
            M::DELETE,
            "/v1/threads/conversation:alice:support",
            None,
            None,
        ),
    ];
    for (method, path, body, last_event_id) in not_found {
        let (status, text) =
            call(&server, &globex, method.clone(), path, body, last_event_id).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {text}");
        assert!(!text.contains("acme"), "{method} {path}: {text}");
    }
    // The inspector's list shows globex none of acme's threads, whatever it searches for.
    for search in ["", "?q=secret", "?q=acme", "?q=run"] {
        let path = format!("/ui/views/home{search}");
        let (status, text) = call(&server, &globex, M::GET, &path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        assert!(!text.contains("data-row="), "{path}: {text}");
    }
    let (status, text) = call(
        &server,
        &acme,
        M::GET,
        "/ui/views/home?q=secret",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        text.contains("data-row=\"secret\"") && text.contains("data-row=\"secret-fork\""),
        "{text}"
    );
    // Merging acme's fork into a thread of globex's own finds no such fork (the path's thread
    // exists, so the body's `from` is what is wrong).
    call(
        &server,
        &globex,
        M::POST,
        "/v1/threads/own/messages",
        Some(json!({"messages": [{"role": "user", "content": "globex"}]})),
        None,
    )
    .await;
    let (status, text) = call(
        &server,
        &globex,
        M::POST,
        "/v1/threads/own/merge",
        Some(json!({"from": "secret-fork"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(
        text.contains("no thread `secret-fork`") && !text.contains("acme"),
        "{text}"
    );
    // The same names are globex's own threads: an append and a chat turn land there.
    for (path, body) in [
        (
            "/v1/threads/secret/messages",
            json!({"messages": [{"role": "user", "content": "globex"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "globex chat"}], "metadata": {"contexture_thread": "secret-fork"}}),
        ),
    ] {
        let (status, text) = call(&server, &globex, M::POST, path, Some(body), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        assert!(!text.contains("acme"), "{path}: {text}");
    }
    let (_, context) = call(
        &server,
        &globex,
        M::GET,
        "/v1/threads/secret-fork/context?model=gpt-4o",
        None,
        None,
    )
    .await;
    assert!(!context.contains("acme"), "{context}");
    // acme's data is as it was.
    assert_eq!(acme_view(&server, &acme).await, before);
    // Its tenant can erase a user's conversation, events and all.
    let path = "/v1/threads/conversation:alice:support";
    let (status, text) = call(&server, &acme, M::DELETE, path, None, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{text}");
    let (status, _) = call(&server, &acme, M::GET, path, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

/// A workflow of one call, named so that its conversations are `conversation:USER:support`.
const WORKFLOW: &str = "name: support\nassistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: s, assistant_id: a, task: go, next: {state_id: end}}\n";

async fn wait_for_completion(server: &TestServer, key: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let path = format!("/v1/executions/{id}");
    while !call(server, key, M::GET, &path, None, None)
        .await
        .1
        .contains("\"completed\"")
    {
        assert!(Instant::now() < deadline, "{id} never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn every_route_keeps_tenants_apart_on_sqlite() {
    let dir = TempDir::new("contexture-tenancy");
    let store = SqliteStore::open(dir.join("tenancy.db")).await.unwrap();
    every_route_keeps_tenants_apart(AnyStore::Sqlite(store)).await;
}

#[tokio::test]
async fn every_route_keeps_tenants_apart_on_postgres() {
    let Some((store, _schema)) = pg_store("tenancy").await else {
        return;
    };
    every_route_keeps_tenants_apart(AnyStore::Postgres(store)).await;
}
