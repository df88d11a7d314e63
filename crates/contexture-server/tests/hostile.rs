//! Hostile input, sent as an attacker would: deep and repeated-key JSON, invalid UTF-8,
//! wrong content types, bad numbers in query strings and headers, invisible characters in
//! ids, made-up HTTP methods, and clients that send their headers or body one byte at a
//! time. Each gets a 4xx that names what was wrong (or a closed connection), nothing bad is
//! stored, and the server stays healthy.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn hostile_server(dir: &TempDir) -> (TestServer, String) {
    let mut config = config(None);
    config.limits.header_read_timeout_secs = 0.5;
    config.limits.body_read_timeout_secs = 0.5;
    let store = SqliteStore::open(dir.join("hostile.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (server, key)
}

async fn send(
    server: &TestServer,
    key: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut request = client()
        .request(method.parse().unwrap(), server.url(path))
        .bearer_auth(key)
        .body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = request.send().await.unwrap();
    (
        response.status(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn healthy(server: &TestServer) {
    let response = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

fn nested(depth: usize) -> String {
    format!(
        r#"{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "hi", "x": {}1{}}}]}}]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

/// A body, its content type, and the status, param and words of the message it gets.
type Case = (
    Vec<u8>,
    Option<&'static str>,
    StatusCode,
    &'static str,
    &'static str,
);

#[tokio::test]
async fn malformed_bodies_are_refused_with_what_and_where() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let append = "/v1/threads/t/messages";
    let json = Some("application/json");
    let table: Vec<Case> = vec![
        (
            nested(100_000).into_bytes(),
            json,
            StatusCode::BAD_REQUEST,
            "messages[0].content[0].x",
            "nests deeper than 64 levels",
        ),
        (
            nested(122).into_bytes(),
            json,
            StatusCode::BAD_REQUEST,
            "messages[0].content[0].x",
            "nests deeper than 64 levels",
        ),
        (
            br#"{"messages": [{"role": "user", "content": "a", "content": "b"}]}"#.to_vec(),
            json,
            StatusCode::BAD_REQUEST,
            "messages[0].content",
            "the key appears twice",
        ),
        (
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(),
            json,
            StatusCode::BAD_REQUEST,
            "messages[0].content",
            "invalid unicode code point at line 1 column 44",
        ),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}]}"#.to_vec(),
            Some("text/plain"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
            "must be JSON",
        ),
        (
            b"messages=hi".to_vec(),
            Some("application/x-www-form-urlencoded"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
            "must be JSON",
        ),
    ];
    for (body, content_type, status, param, words) in table {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (got, error) = send(&server, &key, "POST", append, content_type, body).await;
        assert_eq!(got, status, "{shown}: {error}");
        assert_eq!(error["error"]["param"], param, "{shown}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{shown}: {message}");
        healthy(&server).await;
    }
    // Nothing of it was stored, and the thread is still readable once something is.
    let (status, _) = send(
        &server,
        &key,
        "POST",
        append,
        json,
        serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "fine"}]})).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{thread}");
    assert_eq!(thread["messages"], 1, "{thread}");
    server.shutdown().await;
}

/// Appends one user message `text` to `thread`.
async fn append_one(server: &TestServer, key: &str, thread: &str, text: &str) {
    let body = serde_json::to_vec(&json!({"messages": [{"role": "user", "content": text}]}));
    let path = format!("/v1/threads/{thread}/messages");
    let (status, answer) = send(
        server,
        key,
        "POST",
        &path,
        Some("application/json"),
        body.unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// Sends `(method, path, body)` as JSON and checks that it is a 400 naming `param` (unless it
/// is empty) with `words` in its message, and that the server is still healthy.
async fn refused(
    server: &TestServer,
    key: &str,
    (method, path, sent): (&str, &str, Vec<u8>),
    param: &str,
    words: &str,
) {
    let shown = String::from_utf8_lossy(&sent).into_owned();
    let (status, error) = send(server, key, method, path, Some("application/json"), sent).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{shown}: {error}");
    if !param.is_empty() {
        assert_eq!(error["error"]["param"], param, "{shown}: {error}");
    }
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(words), "{shown}: {message}");
    healthy(server).await;
}

#[tokio::test]
async fn bad_retention_policies_are_refused_naming_the_field_and_change_nothing() {
    let dir = TempDir::new("contexture-hostile-retention");
    let (server, key) = hostile_server(&dir).await;
    let json = Some("application/json");
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    let (status, _) = send(
        &server,
        &key,
        "POST",
        "/v1/threads",
        json,
        body(json!({"id": "t", "retention": {"keep_last": 5}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let path = "/v1/threads/t/retention";
    let table: Vec<(&str, &str, Vec<u8>, &str, &str)> = vec![
        (
            "PUT",
            path,
            body(json!({})),
            "retention",
            "needs `keep_days`, `keep_last` or both",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_days": 0})),
            "retention",
            "`keep_days` must be at least 1",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_days": -1})),
            "keep_days",
            "invalid value",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_days": 1e99})),
            "keep_days",
            "expected a whole number",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_days": 1.5})),
            "keep_days",
            "expected a whole number",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_last": "all"})),
            "keep_last",
            "invalid type",
        ),
        (
            "PUT",
            path,
            body(json!({"keep_last": 1, "keep_forever": true})),
            "keep_forever",
            "unknown field",
        ),
        (
            "PUT",
            path,
            body(json!([1, 2])),
            "",
            "the body must be a JSON object",
        ),
        (
            "PUT",
            path,
            b"{\"keep_last\": 1, \"keep_last\": 2}".to_vec(),
            "keep_last",
            "the key appears twice",
        ),
        (
            "POST",
            "/v1/threads",
            body(json!({"id": "u", "retention": {"keep_days": 0}})),
            "retention",
            "`keep_days` must be at least 1",
        ),
    ];
    for (method, path, sent, param, words) in table {
        refused(&server, &key, (method, path, sent), param, words).await;
    }
    // The thread's policy is as it was; the refused thread was not created.
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["retention"], json!({"keep_last": 5}), "{thread}");
    let (status, _) = send(&server, &key, "GET", "/v1/threads/u", None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(
        &server,
        &key,
        "PUT",
        "/v1/threads/nope/retention",
        json,
        body(json!({"keep_last": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn bad_thread_policies_are_refused_naming_the_field_and_change_nothing() {
    let dir = TempDir::new("contexture-hostile-policy");
    let (server, key) = hostile_server(&dir).await;
    let json = Some("application/json");
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    let policy = json!({"context": {"window": 8000, "hysteresis": {"high": 0.9, "low": 0.6}}});
    let (status, _) = send(
        &server,
        &key,
        "POST",
        "/v1/threads",
        json,
        body(json!({"id": "t", "policy": policy})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let path = "/v1/threads/t/policy";
    let put = |value: Value| ("PUT", path, body(value));
    // (the request: method, path, body), the field named, words of the message.
    type Case<'a> = ((&'a str, &'a str, Vec<u8>), &'a str, &'a str);
    let table: Vec<Case> = vec![
        (
            put(json!({"context": {"hysteresis": {"high": 0.6, "low": 0.9}}})),
            "policy.context.hysteresis.low",
            "must be below high",
        ),
        (
            put(json!({"context": {"window": 0}})),
            "policy.context.window",
            "at least 1 token",
        ),
        (
            put(json!({"context": {"window": 1000, "reserve": 1000}})),
            "policy.context.reserve",
            "leaves nothing",
        ),
        (
            put(json!({"context": {"budget_ratio": 0}})),
            "policy.context.budget_ratio",
            "greater than 0",
        ),
        (
            put(
                json!({"context": {"window": 4000, "clear_tool_results": {"trigger_tokens": 5000}}}),
            ),
            "policy.context.clear_tool_results.trigger_tokens",
            "not below the window",
        ),
        (
            put(json!({"context": {"truncate_tool_results": {"max_tokens": 3}}})),
            "policy.context.truncate_tool_results.max_tokens",
            "must be at least",
        ),
        (
            put(
                json!({"context": {"window": 4000, "clear_tool_results": {"trigger_tokens": 3000, "keep": 5}, "truncate_tool_results": {"max_tokens": 2000}}}),
            ),
            "policy.context.clear_tool_results.keep",
            "more than the",
        ),
        (
            put(json!({"context": {"strategy": "middle"}})),
            "context.strategy",
            "unknown strategy",
        ),
        (
            put(json!({"context": {"window": -5}})),
            "context.window",
            "invalid value",
        ),
        (
            put(json!({"context": {"window": 1e99}})),
            "context.window",
            "invalid type: floating point",
        ),
        (
            put(json!({"context": {"windw": 4000}})),
            "context.windw",
            "unknown field",
        ),
        (
            put(json!({"context": {"reserve": 10, "reserve_output": 20}})),
            "context",
            "duplicate field `reserve`",
        ),
        (
            put(json!({"compaction": {"trigger": {"window_share": 7}}})),
            "policy.compaction.trigger.window_share",
            "at most 1, not 7",
        ),
        (
            put(json!({"compaction": {"max_retries": 6}})),
            "policy.compaction.max_retries",
            "at most 5",
        ),
        (
            // One below the type's end: once a count of attempts that overflowed to none.
            put(json!({"compaction": {"max_retries": 4294967295u64}})),
            "policy.compaction.max_retries",
            "not 4294967295",
        ),
        (
            put(json!({"compaction": {"max_retries": 4294967296u64}})),
            "compaction.max_retries",
            "invalid value",
        ),
        (
            put(json!({"command": "rm -rf /"})),
            "command",
            "unknown field",
        ),
        (put(json!("last")), "", "the body must be a JSON object"),
        (
            put(json!({"context": ["last", 100]})),
            "context",
            "expected a map",
        ),
        (
            put(json!({"context": {"hysteresis": [0.9, 0.6]}})),
            "context.hysteresis",
            "expected a map",
        ),
        (
            put(json!({"compaction": {"keep": [100]}})),
            "compaction.keep",
            "expected a map",
        ),
        (
            (
                "POST",
                "/v1/threads",
                body(json!({"id": "v", "policy": [null, null]})),
            ),
            "policy",
            "expected a map",
        ),
        (
            (
                "POST",
                "/v1/threads",
                body(json!({"id": "v", "retention": [5, 10]})),
            ),
            "retention",
            "expected a map",
        ),
        (
            ("PUT", path, b"{\"context\": {}, \"context\": {}}".to_vec()),
            "context",
            "the key appears twice",
        ),
        (
            (
                "POST",
                "/v1/threads",
                body(json!({"id": "u", "policy": {"context": {"window": 0}}})),
            ),
            "policy.context.window",
            "at least 1 token",
        ),
    ];
    for (request, param, words) in table {
        refused(&server, &key, request, param, words).await;
    }
    // The thread's policy is as it was, and no event was added; the refused thread was not
    // created; a thread that does not exist has no policy to set.
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["policy"]["context"]["window"], 8000, "{thread}");
    assert_eq!(
        thread["policy"]["context"]["hysteresis"], policy["context"]["hysteresis"],
        "{thread}"
    );
    assert_eq!(thread["last_seq"], 2, "{thread}");
    let (status, _) = send(&server, &key, "GET", "/v1/threads/u", None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(
        &server,
        &key,
        "PUT",
        "/v1/threads/nope/policy",
        json,
        body(json!({"context": {"window": 4000}})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn a_restore_names_a_replace_event_of_the_thread_or_changes_nothing() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    append_one(&server, &key, "t", "one").await;
    let restore = "/v1/threads/t/restore";
    let table: Vec<(Vec<u8>, StatusCode, &str, &str)> = vec![
        (
            body(json!({})),
            StatusCode::BAD_REQUEST,
            "body",
            "missing field `before`",
        ),
        (
            body(json!({"before": -1})),
            StatusCode::BAD_REQUEST,
            "before",
            "invalid value",
        ),
        (
            body(json!({"before": "1"})),
            StatusCode::BAD_REQUEST,
            "before",
            "invalid type",
        ),
        (
            body(json!({"before": 1, "after": 2})),
            StatusCode::BAD_REQUEST,
            "after",
            "unknown field",
        ),
        (
            body(json!({"before": 99})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "before",
            "99",
        ),
        (
            body(json!({"before": 1})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "before",
            "not a",
        ),
    ];
    for (request, status, param, words) in table {
        let shown = String::from_utf8_lossy(&request).into_owned();
        let (got, error) = send(
            &server,
            &key,
            "POST",
            restore,
            Some("application/json"),
            request,
        )
        .await;
        assert_eq!(got, status, "{shown}: {error}");
        assert_eq!(error["error"]["param"], param, "{shown}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{shown}: {message}");
    }
    // Nothing was appended.
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["last_seq"], 1, "{thread}");
    server.shutdown().await;
}

#[tokio::test]
async fn bad_numbers_ids_and_methods_are_refused_and_labels_stay_fixed() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    for query in [
        "after=-1",
        "after=99999999999999999999999",
        "after=1e3",
        "limit=-5",
        "after=%00",
    ] {
        let path = format!("/v1/threads/t/events?{query}");
        let (status, error) = send(&server, &key, "GET", &path, None, vec![]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        assert_eq!(error["error"]["param"], "query", "{query}: {error}");
    }
    for id in ["a%E2%80%8Bb", "%E2%80%AEfdp.exe", "a%0Ab"] {
        let path = format!("/v1/threads/{id}/messages");
        let body =
            serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
        let (status, error) =
            send(&server, &key, "POST", &path, Some("application/json"), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id}: {error}");
    }
    for method in ["FOOBAR", "X-MADE-UP-1", "X-MADE-UP-2"] {
        let (status, _) = send(&server, &key, method, "/v1/threads", None, vec![]).await;
        assert!(status.is_client_error(), "{method}: {status}");
    }
    let metrics = server.metrics().await;
    assert!(!metrics.contains("FOOBAR"), "{metrics}");
    assert!(!metrics.contains("MADE-UP"), "{metrics}");
    assert!(metrics.contains(r#"method="other""#), "{metrics}");
    healthy(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn slow_clients_lose_their_connection_or_get_a_408() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let address = server.base.trim_start_matches("http://").to_owned();

    // Headers that never finish: the connection is closed after the header timeout.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "the connection stayed open");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A body that never finishes: a 408 after the body timeout.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/threads/t/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"messages\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut buffer = vec![0; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buffer))
        .await
        .expect("an answer within the body timeout")
        .unwrap();
    let answer = String::from_utf8_lossy(&buffer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 0.5 s"), "{answer}");
    healthy(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn an_event_stream_resumed_at_or_past_the_end_of_a_finished_run_ends_at_once() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let workflow = "states:\n  - {id: s, transform: {a: b}, next: {state_id: end}}\n";
    let body = serde_json::to_vec(&json!({"workflow_yaml": workflow, "id": "run-1"})).unwrap();
    let (status, started) = send(
        &server,
        &key,
        "POST",
        "/v1/executions",
        Some("application/json"),
        body,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let (_, report) = send(&server, &key, "GET", "/v1/executions/run-1", None, vec![]).await;
        if report["status"] == "completed" {
            let (_, page) = send(
                &server,
                &key,
                "GET",
                "/v1/threads/run-1/events",
                None,
                vec![],
            )
            .await;
            break page["events"].as_array().unwrap().last().unwrap()["seq"]
                .as_u64()
                .unwrap();
        }
        assert!(Instant::now() < deadline, "{report}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for resume_at in [last, last + 1, u64::MAX] {
        let started = Instant::now();
        let response = client()
            .get(server.url("/v1/executions/run-1/events"))
            .bearer_auth(&key)
            .header("Last-Event-ID", resume_at.to_string())
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.expect("the stream ends");
        assert!(!text.contains("event:"), "{resume_at}: {text}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    let response = client()
        .get(server.url("/v1/executions/run-1/events"))
        .bearer_auth(&key)
        .header("Last-Event-ID", "-1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["param"], "Last-Event-ID");
    server.shutdown().await;
}

#[tokio::test]
async fn a_tenant_runs_at_most_its_share_of_executions_and_holds_its_share_of_event_streams() {
    let dir = TempDir::new("contexture-hostile");
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.extend([Reply::hang(), Reply::hang()]);
    let mut config = config(Some(&base));
    config.llm = "openai:gpt-4o-mini".into();
    config.executions.max_running = 1;
    config.limits.max_event_streams = 1;
    let store = SqliteStore::open(dir.join("quota.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;
    let workflow = "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: s, assistant_id: a, task: go, next: {state_id: end}}\n";
    let start = |key: String, id: &'static str| {
        let server_url = server.url("/v1/executions");
        async move {
            let response = client()
                .post(server_url)
                .bearer_auth(key)
                .json(&json!({"workflow_yaml": workflow, "id": id}))
                .send()
                .await
                .unwrap();
            (
                response.status(),
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let status_of = |key: String, id: &'static str| {
        let server_url = server.url(&format!("/v1/executions/{id}"));
        async move {
            client()
                .get(server_url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let (status, started) = start(acme.clone(), "run-1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    assert_eq!(started["status"], "queued");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(acme.clone(), "run-1").await["status"] != "running" {
        assert!(Instant::now() < deadline, "run-1 was never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the tenant's limit a run waits in the queue: accepted, not run.
    let (status, queued) = start(acme.clone(), "run-2").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    // Another tenant is not held back.
    assert_eq!(start(globex.clone(), "run-1").await.0, StatusCode::ACCEPTED);
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(globex.clone(), "run-1").await["status"] != "running" {
        assert!(Instant::now() < deadline, "globex's run was never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiting = status_of(acme.clone(), "run-2").await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert_eq!(waiting["queue"]["state"], "queued", "{waiting}");
    assert_eq!(waiting["steps"], json!([]), "{waiting}");
    // The queue shows in the metrics: two runs going, one waiting, both held here.
    let metrics = server.metrics().await;
    for line in [
        r#"contexture_execution_queue{state="queued"} 1"#,
        r#"contexture_execution_queue{state="running"} 2"#,
        r#"contexture_execution_queue{state="finished"} 0"#,
        "contexture_executions_held 2",
        r#"contexture_executions_taken_total{outcome="queued"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    // A queued run cancelled ends at once: no server ever takes it.
    let (status, _) = start(acme.clone(), "run-3").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let cancel = client()
        .post(server.url("/v1/executions/run-3/cancel"))
        .bearer_auth(&acme)
        .json(&json!({"reason": "not needed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    let cancelled = status_of(acme.clone(), "run-3").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["error"], "cancelled: not needed", "{cancelled}");
    assert_eq!(cancelled["queue"]["state"], "finished", "{cancelled}");
    assert_eq!(cancelled["queue"]["outcome"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["queue"]["attempts"], 0, "{cancelled}");

    // One open stream per tenant; a closed one gives its slot back.
    let events = |key: &str| {
        client()
            .get(server.url("/v1/executions/run-1/events"))
            .bearer_auth(key)
            .send()
    };
    let open = events(&acme).await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    let refused = events(&acme).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = events(&acme).await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed stream's slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A cancelled run gives its place back: the queued run is taken.
    let cancel = client()
        .post(server.url("/v1/executions/run-1/cancel"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting = status_of(acme.clone(), "run-2").await;
        if waiting["queue"]["state"] != "queued" {
            assert_eq!(waiting["queue"]["attempts"], 1, "{waiting}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled run's place never came back: {waiting}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cancelled = status_of(acme.clone(), "run-1").await;
    assert_eq!(cancelled["queue"]["state"], "finished", "{cancelled}");
    assert_eq!(cancelled["queue"]["outcome"], "cancelled", "{cancelled}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_finished_runs_queue_row_is_pruned_in_the_background_and_its_log_stays() {
    let dir = TempDir::new("contexture-hostile");
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::text("done"));
    let mut config = config(Some(&base));
    config.llm = "openai:gpt-4o-mini".into();
    config.retention.interval_secs = 1;
    // About a fifth of a second.
    config.executions.queue_keep_finished_days = 0.2 / 86_400.0;
    let store = SqliteStore::open(dir.join("queue-pruning.db"))
        .await
        .unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;
    let workflow = "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: s, assistant_id: a, task: go, next: {state_id: end}}\n";
    let started = client()
        .post(server.url("/v1/executions"))
        .bearer_auth(&acme)
        .json(&json!({"workflow_yaml": workflow, "id": "run-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), StatusCode::ACCEPTED);
    let status_of = |key: &str| {
        client()
            .get(server.url("/v1/executions/run-1"))
            .bearer_auth(key)
            .send()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut saw_finished = false;
    let pruned = loop {
        let status: Value = status_of(&acme).await.unwrap().json().await.unwrap();
        match status.get("queue") {
            Some(queue) => saw_finished |= queue["state"] == "finished",
            None if saw_finished => break status,
            None => {}
        }
        assert!(
            Instant::now() < deadline,
            "the finished run's queue row was never pruned: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Only the queue's row went: the run's status and output are read from its log.
    assert_eq!(pruned["status"], "completed", "{pruned}");
    assert_eq!(pruned["output"], "done", "{pruned}");
    // Another tenant sees no such run, before pruning as after.
    assert_eq!(
        status_of(&globex).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_running_executions_log_is_read_only_through_the_thread_routes() {
    let dir = TempDir::new("contexture-hostile");
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::hang());
    let mut config = config(Some(&base));
    config.llm = "openai:gpt-4o-mini".into();
    let store = SqliteStore::open(dir.join("readonly.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let workflow = "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: s, assistant_id: a, task: go, next: {state_id: end}}\n";
    let json_body = |value: Value| serde_json::to_vec(&value).unwrap();
    let (status, _) = send(
        &server,
        &key,
        "POST",
        "/v1/executions",
        Some("application/json"),
        json_body(json!({"workflow_yaml": workflow, "id": "run-1"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, before) = send(&server, &key, "GET", "/v1/threads/run-1", None, vec![]).await;
    let user = json!({"messages": [{"role": "user", "content": "injected"}]});
    let writes = [
        (
            "POST",
            "/v1/threads/run-1/messages",
            json_body(user.clone()),
        ),
        (
            "POST",
            "/v1/threads/run-1/fork",
            json_body(json!({"id": "phantom"})),
        ),
        ("POST", "/v1/threads/run-1/compact", json_body(json!({}))),
        (
            "POST",
            "/v1/threads/run-1/restore",
            json_body(json!({"before": 1})),
        ),
        ("DELETE", "/v1/threads/run-1", vec![]),
        (
            "PUT",
            "/v1/threads/run-1/retention",
            json_body(json!({"keep_days": 1})),
        ),
        ("DELETE", "/v1/threads/run-1/retention", vec![]),
        (
            "POST",
            "/v1/chat/completions",
            json_body(
                json!({"model": "gpt-4o-mini", "messages": user["messages"], "metadata": {"contexture_thread": "run-1"}}),
            ),
        ),
    ];
    for (method, path, body) in writes {
        let (status, error) =
            send(&server, &key, method, path, Some("application/json"), body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{method} {path}: {error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("is the log of a running execution"),
            "{error}"
        );
    }
    let (_, after) = send(&server, &key, "GET", "/v1/threads/run-1", None, vec![]).await;
    assert_eq!(before["messages"], after["messages"]);
    let (status, _) = send(&server, &key, "GET", "/v1/threads/phantom", None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn a_full_thread_answers_413_naming_the_limit_and_stores_nothing_more() {
    let dir = TempDir::new("contexture-hostile");
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let mut config = config(Some(&base));
    config.limits.max_thread_events = 3;
    let store = SqliteStore::open(dir.join("full.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let append = |n: usize| {
        let messages: Vec<Value> = (0..n)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        serde_json::to_vec(&json!({ "messages": messages })).unwrap()
    };
    let json = Some("application/json");
    let path = "/v1/threads/t/messages";
    assert_eq!(
        send(&server, &key, "POST", path, json, append(2)).await.0,
        StatusCode::OK
    );
    let (status, error) = send(&server, &key, "POST", path, json, append(2)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`limits.max_thread_events` = 3") && !message.contains("acme/"),
        "{message}"
    );
    let chat = serde_json::to_vec(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], "metadata": {"contexture_thread": "t"}})).unwrap();
    let (status, _) = send(&server, &key, "POST", "/v1/chat/completions", json, chat).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(upstream.bodies().is_empty());
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["messages"], 2, "{thread}");
    healthy(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_thread_past_its_bytes_answers_413_naming_the_limit_and_stores_nothing_more() {
    let dir = TempDir::new("contexture-hostile");
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let mut config = config(Some(&base));
    config.limits.max_thread_bytes = 2_000;
    let store = SqliteStore::open(dir.join("large.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let text = "x".repeat(1_200);
    let append =
        serde_json::to_vec(&json!({"messages": [{"role": "user", "content": text}]})).unwrap();
    let json = Some("application/json");
    let path = "/v1/threads/t/messages";
    let (status, body) = send(&server, &key, "POST", path, json, append.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, error) = send(&server, &key, "POST", path, json, append).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`limits.max_thread_bytes` = 2000") && !message.contains("acme/"),
        "{message}"
    );
    let other = "y".repeat(1_200);
    let chat = serde_json::to_vec(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": other}], "metadata": {"contexture_thread": "t"}})).unwrap();
    let (status, _) = send(&server, &key, "POST", "/v1/chat/completions", json, chat).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(upstream.bodies().is_empty());
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["messages"], 1, "{thread}");
    healthy(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_thread_list_comes_a_page_at_a_time_and_only_the_callers() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let other = server.key("globex").await;
    let body =
        serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
    for n in 0..5 {
        let path = format!("/v1/threads/t{n}/messages");
        send(
            &server,
            &key,
            "POST",
            &path,
            Some("application/json"),
            body.clone(),
        )
        .await;
        send(
            &server,
            &other,
            "POST",
            &path,
            Some("application/json"),
            body.clone(),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(after) => format!("/v1/threads?limit=2&after={after}"),
            None => "/v1/threads?limit=2".to_owned(),
        };
        let (status, page) = send(&server, &key, "GET", &path, None, vec![]).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let threads = page["threads"].as_array().unwrap();
        assert!(threads.len() <= 2);
        seen.extend(threads.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["t0", "t1", "t2", "t3", "t4"]);
    for bad in ["limit=0", "limit=1001", "limit=-1", "colour=red"] {
        let (status, _) = send(
            &server,
            &key,
            "GET",
            &format!("/v1/threads?{bad}"),
            None,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    server.shutdown().await;
}

/// A merge's `keys` is a list of names or the word `"all"`: anything else is a 400 naming
/// `keys`, and nothing is merged.
#[tokio::test]
async fn bad_merge_keys_are_refused_naming_the_field() {
    let dir = TempDir::new("contexture-hostile-merge-keys");
    let (server, key) = hostile_server(&dir).await;
    let json = Some("application/json");
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    append_one(&server, &key, "t", "hi").await;
    let (status, forked) = send(
        &server,
        &key,
        "POST",
        "/v1/threads/t/fork",
        json,
        body(json!({"id": "f"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let path = "/v1/threads/t/merge";
    let expected = "expected a list of key names, or \"all\"";
    for (keys, param, words) in [
        (json!("some"), "keys", expected),
        (json!(7), "keys", expected),
        (json!([1, 2]), "keys[0]", "expected a string"),
        (json!({"all": true}), "keys", expected),
    ] {
        let sent = body(json!({"from": "f", "keys": keys}));
        refused(&server, &key, ("POST", path, sent), param, words).await;
    }
    let (status, events) = send(&server, &key, "GET", "/v1/threads/t/events", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|event| event["type"] != "merged"),
        "{events}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bad_searches_are_refused_naming_the_parameter_and_odd_ones_find_nothing() {
    let dir = TempDir::new("contexture-hostile-search");
    let (server, key) = hostile_server(&dir).await;
    append_one(&server, &key, "t", "The launch code is TULIP-7.").await;
    for (path, param, words) in [
        ("/v1/threads/t/search?query=", "query", "empty"),
        ("/v1/threads/t/search", "", "query"),
        ("/v1/threads/t/search?query=x&limit=0", "limit", "1 to 1000"),
        (
            "/v1/threads/t/search?query=x&limit=1001",
            "limit",
            "1 to 1000",
        ),
        ("/v1/threads/t/search?query=x&limit=-1", "", "limit"),
        ("/v1/threads/t/search?query=x&page=2", "", "page"),
    ] {
        refused(&server, &key, ("GET", path, Vec::new()), param, words).await;
    }
    // A long query, one of control characters, one that looks like a pattern: no hit, no
    // error; and the text itself is still found whatever its case.
    let long = "x".repeat(20_000);
    for query in [long.as_str(), "%00%07%1B", ".*", "%25", "TULIP-7.%20"] {
        let path = format!("/v1/threads/t/search?query={query}");
        let (status, answer) = send(&server, &key, "GET", &path, None, vec![]).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(
            answer["hits"].as_array().unwrap().len(),
            0,
            "{query}: {answer}"
        );
    }
    let (status, answer) = send(
        &server,
        &key,
        "GET",
        "/v1/threads/t/search?query=tulip-7",
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["hits"][0]["seq"], 1, "{answer}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_thread_has_at_most_its_share_of_named_contexts_and_errors_name_a_few() {
    let dir = TempDir::new("contexture-hostile-contexts");
    let mut config = config(None);
    config.limits.max_contexts_per_thread = 25;
    let store = SqliteStore::open(dir.join("hostile.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let json = Some("application/json");
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    append_one(&server, &key, "t", "hello").await;
    let switch = |context: String| {
        let body = body(json!({"context": context, "create": true}));
        send(&server, &key, "POST", "/v1/threads/t/switch", json, body)
    };
    // `main` and 24 more: the most this server allows.
    for i in 0..24 {
        let (status, answer) = switch(format!("ctx-{i:02}")).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (_, before) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    let (status, answer) = switch("one-more".into()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["param"], "context", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("limits.max_contexts_per_thread") && message.contains("25"),
        "{message}"
    );
    assert!(!message.contains("acme/"), "{message}");
    let (_, after) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(before["last_seq"], after["last_seq"], "nothing was stored");
    // A context the thread has may still be switched to, `create` or not.
    let (status, answer) = switch("ctx-03".into()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // An unknown context is named with at most 20 of the thread's and their count.
    let (status, answer) = send(
        &server,
        &key,
        "GET",
        "/v1/threads/t/messages?context=nope",
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("it has 25 contexts; the first 20"),
        "{message}"
    );
    assert!(!message.contains("ctx-23"), "{message}");
    assert!(message.len() < 600, "{} bytes: {message}", message.len());
    healthy(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_pop_and_a_clear_take_what_they_say_and_refuse_bad_bodies() {
    let dir = TempDir::new("contexture-hostile");
    let (server, key) = hostile_server(&dir).await;
    let body = |value: Value| serde_json::to_vec(&value).unwrap();
    let post = |path: &'static str, value: Value| {
        let server = &server;
        let key = &key;
        async move {
            send(
                server,
                key,
                "POST",
                path,
                Some("application/json"),
                body(value),
            )
            .await
        }
    };
    // Bad bodies name the field and change nothing.
    append_one(&server, &key, "t", "one").await;
    for (request, param, words) in [
        (json!({"format": "xml"}), "format", "unknown variant"),
        (json!({"format": 7}), "format", "expected"),
        (json!({"items": 2}), "items", "unknown field"),
    ] {
        let (status, error) = post("/v1/threads/t/pop", request.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {error}");
        assert_eq!(error["error"]["param"], param, "{request}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{request}: {message}");
    }
    let (status, error) = post("/v1/threads/t/clear", json!({"all": true})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let (_, thread) = send(&server, &key, "GET", "/v1/threads/t", None, vec![]).await;
    assert_eq!(thread["last_seq"], 1, "{thread}");
    // A missing thread is not found.
    for path in ["/v1/threads/ghost/pop", "/v1/threads/ghost/clear"] {
        let (status, error) = post(path, json!({})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {error}");
    }
    // A pop takes the newest message; a Responses pop one item of the last turn.
    let (status, _) = send(
        &server,
        &key,
        "POST",
        "/v1/threads/t/messages",
        Some("application/json"),
        body(
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
            ]}]}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, popped) = post("/v1/threads/t/pop", json!({"format": "responses"})).await;
    assert_eq!(status, StatusCode::OK, "{popped}");
    assert_eq!(popped["item"]["type"], "function_call", "{popped}");
    assert_eq!(popped["item"]["call_id"], "b", "{popped}");
    let (_, messages) = send(&server, &key, "GET", "/v1/threads/t/messages", None, vec![]).await;
    let calls = &messages["messages"][1]["tool_calls"];
    assert_eq!(calls.as_array().map(Vec::len), Some(1), "{messages}");
    assert_eq!(calls[0]["id"], "a", "{messages}");
    let (_, popped) = post("/v1/threads/t/pop", json!({})).await;
    assert_eq!(popped["item"]["role"], "assistant", "{popped}");
    // Clearing, then nothing left to clear or pop; a restore brings the message back.
    let (_, cleared) = post("/v1/threads/t/clear", json!({})).await;
    let clear_seq = cleared["seq"].as_u64().expect("a seq");
    let (_, again) = post("/v1/threads/t/clear", json!({})).await;
    assert_eq!(again["seq"], Value::Null, "{again}");
    let (_, empty) = post("/v1/threads/t/pop", json!({})).await;
    assert_eq!(empty["item"], Value::Null, "{empty}");
    let (status, _) = send(
        &server,
        &key,
        "POST",
        "/v1/threads/t/restore",
        Some("application/json"),
        body(json!({"before": clear_seq})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, messages) = send(&server, &key, "GET", "/v1/threads/t/messages", None, vec![]).await;
    assert_eq!(messages["messages"][0]["content"], "one", "{messages}");
    server.shutdown().await;
}
