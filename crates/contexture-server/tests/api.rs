//! The REST API end to end over real sockets: threads, tenant isolation, bad input, keys,
//! limits, metrics, and the OpenAPI document against the router.

use crate::common;

use std::collections::BTreeSet;

use common::{TestServer, client, config};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, ApiKeyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn sqlite() -> (TempDir, AnyStore) {
    let dir = TempDir::new("contexture-server");
    let store = SqliteStore::open(dir.join("api.db")).await.unwrap();
    (dir, AnyStore::Sqlite(store))
}

async fn call(
    method: reqwest::Method,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client().request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn threads_end_to_end() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store).await;
    let key = server.key("acme").await;
    use reqwest::Method as M;

    let (status, body) = call(
        M::POST,
        server.url("/v1/threads"),
        &key,
        Some(json!({"id": "t1", "system": "Be brief.", "metadata": {"customer": "Maria"}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body, json!({"id": "t1", "last_seq": 2}));
    let (status, _) = call(
        M::POST,
        server.url("/v1/threads"),
        &key,
        Some(json!({"id": "t1"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);

    // An append retried with the same Idempotency-Key lands once.
    let turns = json!({"messages": [
        {"role": "user", "content": "My order 1042 is late."},
        {"role": "assistant", "content": "Sorry! Checking order 1042."}
    ]});
    let mut seqs = Vec::new();
    for _ in 0..2 {
        let response = client()
            .post(server.url("/v1/threads/t1/messages"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "append-1")
            .json(&turns)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        seqs.push(response.json::<Value>().await.unwrap());
    }
    assert_eq!(seqs[0], json!({"seqs": [3, 4]}));
    assert_eq!(seqs[0], seqs[1]);
    for i in 0..10 {
        let (status, _) = call(
            M::POST,
            server.url("/v1/threads/t1/messages"),
            &key,
            Some(json!({"messages": [
                {"role": "user", "content": format!("Question {i} about the delivery window and the carrier.")},
                {"role": "assistant", "content": format!("Answer {i}: the carrier says Tuesday between 9 and 12.")}
            ]})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }

    // The projection fitted to a small budget: the newest turns, with the budget.
    let (status, context) = call(
        M::GET,
        server.url("/v1/threads/t1/context?model=gpt-4o-mini&max_tokens=120"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{context}");
    let messages = context["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert!(messages.len() < 23, "trimmed: {}", messages.len());
    assert_eq!(
        messages.last().unwrap()["content"],
        "Answer 9: the carrier says Tuesday between 9 and 12."
    );
    assert!(context["budget"]["used"].as_u64().unwrap() <= 120);
    assert_eq!(context["budget"]["limit"], 120);
    assert!(!context["fit"]["dropped"].as_array().unwrap().is_empty());

    // Events paged by seq.
    let (_, page) = call(
        M::GET,
        server.url("/v1/threads/t1/events?limit=5"),
        &key,
        None,
    )
    .await;
    assert_eq!(page["events"].as_array().unwrap().len(), 5);
    assert_eq!(page["next_after"], 5);
    let (_, rest) = call(
        M::GET,
        server.url("/v1/threads/t1/events?after=5&limit=1000"),
        &key,
        None,
    )
    .await;
    assert_eq!(rest["events"][0]["seq"], 6);
    assert_eq!(rest["next_after"], Value::Null);
    assert_eq!(rest["events"].as_array().unwrap().len(), 19);

    // Fork, work in the fork, merge back.
    let (status, fork) = call(
        M::POST,
        server.url("/v1/threads/t1/fork"),
        &key,
        Some(json!({"id": "t1-try", "at_seq": 4})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{fork}");
    assert_eq!(fork["forked_seq"], 5);
    call(
        M::POST,
        server.url("/v1/threads/t1-try/messages"),
        &key,
        Some(json!({"messages": [{"role": "user", "content": "Try a refund?"}, {"role": "assistant", "content": "Refund issued."}]})),
    )
    .await;
    let (_, shown) = call(M::GET, server.url("/v1/threads/t1-try"), &key, None).await;
    assert_eq!(shown["parent"], "t1", "ids are shown without the tenant");
    assert_eq!(shown["fork_seq"], 4);
    let (status, merged) = call(
        M::POST,
        server.url("/v1/threads/t1/merge"),
        &key,
        Some(json!({"from": "t1-try", "policy": "summary-only"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    let (_, events) = call(
        M::GET,
        server.url(&format!(
            "/v1/threads/t1/events?after={}",
            merged["seq"].as_u64().unwrap() - 1
        )),
        &key,
        None,
    )
    .await;
    assert_eq!(events["events"][0]["type"], "merged");
    assert_eq!(events["events"][0]["child"], "t1-try");
    // Merges that cannot be made: each a 4xx naming the field at fault, nothing written.
    let (_, before) = call(M::GET, server.url("/v1/threads/t1"), &key, None).await;
    call(
        M::POST,
        server.url("/v1/threads/other/messages"),
        &key,
        Some(json!({"messages": [{"role": "user", "content": "unrelated"}]})),
    )
    .await;
    for (body, status, param, words) in [
        (
            json!({"from": "other"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "from",
            "thread `other` is not a fork of `t1`",
        ),
        (
            json!({"from": "t1-try"}),
            StatusCode::CONFLICT,
            "from",
            "nothing new",
        ),
        (
            json!({"from": "t1-try", "policy": "output-keys", "keys": []}),
            StatusCode::BAD_REQUEST,
            "keys",
            "needs at least one key",
        ),
        (
            json!({"from": "t1-try", "keys": ["nope"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "keys",
            "has no output key `nope`",
        ),
    ] {
        if param == "keys" && body["keys"] == json!([]) {
            // The fork has something new again, so the merge gets as far as its keys.
            call(
                M::POST,
                server.url("/v1/threads/t1-try/messages"),
                &key,
                Some(json!({"messages": [{"role": "user", "content": "And a voucher?"}]})),
            )
            .await;
        }
        let (got, error) = call(
            M::POST,
            server.url("/v1/threads/t1/merge"),
            &key,
            Some(body.clone()),
        )
        .await;
        assert_eq!(got, status, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{body}: {error}");
        assert!(!message.contains("acme"), "{body}: {error}");
    }
    let (_, after) = call(M::GET, server.url("/v1/threads/t1"), &key, None).await;
    assert_eq!(after["last_seq"], before["last_seq"], "nothing was written");

    // Compaction with the offline summarizer; the covered events stay in the log.
    let (status, report) = call(
        M::POST,
        server.url("/v1/threads/t1/compact"),
        &key,
        Some(json!({"keep_messages": 2, "notes": "Customer Maria, order 1042"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["outcome"], "compacted", "{report}");
    assert_eq!(
        report["covered"],
        json!([3, 23]),
        "all but the last two messages"
    );
    assert_eq!(report["covered_messages"], 21);
    let (_, context) = call(
        M::GET,
        server.url("/v1/threads/t1/context?model=gpt-4o-mini"),
        &key,
        None,
    )
    .await;
    let texts: Vec<&str> = context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Customer Maria, order 1042")),
        "{texts:?}"
    );
    let (_, all) = call(
        M::GET,
        server.url("/v1/threads/t1/events?limit=1000"),
        &key,
        None,
    )
    .await;
    assert!(
        all["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "context_replaced")
    );

    // Delete: refused while a fork reads the thread.
    let (status, body) = call(M::DELETE, server.url("/v1/threads/t1"), &key, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        !body["error"]["message"].as_str().unwrap().contains("acme/"),
        "{body}"
    );
    assert_eq!(
        call(M::DELETE, server.url("/v1/threads/t1-try"), &key, None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(M::DELETE, server.url("/v1/threads/t1"), &key, None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(M::GET, server.url("/v1/threads/t1"), &key, None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_tenant_cannot_see_or_touch_another_tenants_threads() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;
    use reqwest::Method as M;
    call(
        M::POST,
        server.url("/v1/threads"),
        &acme,
        Some(json!({"id": "secret", "system": "acme only"})),
    )
    .await;
    call(
        M::POST,
        server.url("/v1/threads/secret/fork"),
        &acme,
        Some(json!({"id": "secret-fork"})),
    )
    .await;

    for (method, path, body) in [
        (M::GET, "/v1/threads/secret", None),
        (M::GET, "/v1/threads/secret/events", None),
        (M::GET, "/v1/threads/secret/context?model=gpt-4o", None),
        (M::POST, "/v1/threads/secret/fork", Some(json!({}))),
        (M::POST, "/v1/threads/secret/compact", Some(json!({}))),
        (
            M::POST,
            "/v1/threads/secret/merge",
            Some(json!({"from": "secret-fork"})),
        ),
        (M::DELETE, "/v1/threads/secret", None),
        (M::GET, "/v1/executions/secret", None),
        (M::POST, "/v1/executions/secret/cancel", None),
    ] {
        let (status, body) = call(method.clone(), server.url(path), &globex, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        assert!(!body.to_string().contains("acme"), "{body}");
    }
    // The same name is another thread for another tenant.
    call(
        M::POST,
        server.url("/v1/threads/secret/messages"),
        &globex,
        Some(json!({"messages": [{"role": "user", "content": "globex"}]})),
    )
    .await;
    let (_, listed) = call(M::GET, server.url("/v1/threads"), &globex, None).await;
    assert_eq!(listed["threads"].as_array().unwrap().len(), 1);
    assert_eq!(listed["threads"][0]["id"], "secret");
    let (_, events) = call(M::GET, server.url("/v1/threads/secret/events"), &acme, None).await;
    assert_eq!(
        events["events"].as_array().unwrap().len(),
        2,
        "acme's thread is untouched"
    );
    let (_, listed) = call(M::GET, server.url("/v1/threads"), &acme, None).await;
    let ids: BTreeSet<&str> = listed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from(["secret", "secret-fork"]));
    server.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_json_errors_that_name_the_field() {
    let (_dir, store) = sqlite().await;
    let mut config = config(None);
    config.limits.max_body_bytes = 2048;
    config.auth.key_cache_secs = 0.5;
    let server = TestServer::start(config, store).await;
    let key = server.key("acme").await;
    use reqwest::Method as M;
    let send_raw = |body: &'static str| {
        client()
            .post(server.url("/v1/threads/t/messages"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let response = send_raw("{\"messages\": [").await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["param"], "messages", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 1 column 14"),
        "{body}"
    );

    let table = [
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "usr", "content": "x"}]}),
            "messages",
        ),
        (json!({"messages": [], "extra": 1}), "extra"),
        (json!({}), "body"),
    ];
    for (body, param) in table {
        let (status, answer) = call(
            M::POST,
            server.url("/v1/threads/t/messages"),
            &key,
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert!(
            answer["error"]["param"].as_str().unwrap().contains(param)
                || answer["error"]["message"].as_str().unwrap().contains(param),
            "{body} -> {answer}"
        );
    }
    let (status, answer) = call(
        M::GET,
        server.url("/v1/threads/t/context?model=no-such-model"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "model");
    let (status, answer) = call(
        M::GET,
        server.url("/v1/threads/t/events?limit=0"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (status, answer["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("limit"))
    );
    let (status, answer) = call(
        M::POST,
        server.url("/v1/executions"),
        &key,
        Some(json!({"workflow": "../etc/passwd"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, answer) = call(
        M::POST,
        server.url("/v1/executions"),
        &key,
        Some(json!({"workflow_yaml": "states:\n  - id: a\n    assistant_id: nobody\n"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request.yaml:3:"),
        "{answer}"
    );

    // Too large: 413, as JSON.
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(4000)}]});
    let (status, answer) = call(
        M::POST,
        server.url("/v1/threads/t/messages"),
        &key,
        Some(big),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(answer["error"]["type"], "body_too_large");

    // No key, an unknown key, a revoked key: 401. An unknown route: 404 as JSON.
    let response = client()
        .get(server.url("/v1/threads"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        call(M::GET, server.url("/v1/threads"), "ctx_nope", None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    let keys = server
        .state
        .store
        .list_api_keys(Some("acme"))
        .await
        .unwrap();
    server
        .state
        .store
        .revoke_api_key(&keys[0].id)
        .await
        .unwrap();
    // A verified key is trusted for `auth.key_cache_secs`, then asked for again.
    let revoked_at = std::time::Instant::now();
    let mut status = StatusCode::OK;
    while status != StatusCode::UNAUTHORIZED {
        assert!(
            revoked_at.elapsed() < std::time::Duration::from_secs(10),
            "a revoked key still works after the key cache time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        status = call(M::GET, server.url("/v1/threads"), &key, None).await.0;
    }
    assert!(
        revoked_at.elapsed() <= std::time::Duration::from_secs(3),
        "refused only after {:?}",
        revoked_at.elapsed()
    );
    let (status, answer) = call(M::GET, server.url("/v2/nothing"), &key, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(answer["error"]["type"], "not_found");

    // The metrics counted it all, by route pattern (never by raw id).
    let metrics = server.metrics().await;
    assert!(metrics.contains(r#"contexture_http_requests_total{method="POST",route="/v1/threads/{id}/messages",status="400"}"#), "{metrics}");
    assert!(
        metrics.contains("contexture_tokens_counted_total"),
        "{metrics}"
    );
    assert!(!metrics.contains("/v1/threads/t/"), "{metrics}");
    server.shutdown().await;
}

#[tokio::test]
async fn each_key_has_its_rate_limit() {
    let (_dir, store) = sqlite().await;
    let mut config = config(None);
    config.limits.requests_per_second = 1.0;
    config.limits.burst = 3;
    let server = TestServer::start(config, store).await;
    let (a, b) = (server.key("acme").await, server.key("acme").await);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            call(reqwest::Method::GET, server.url("/v1/threads"), &a, None)
                .await
                .0,
        );
    }
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    let response = client()
        .get(server.url("/v1/threads"))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().get("retry-after").is_some());
    assert_eq!(
        call(reqwest::Method::GET, server.url("/v1/threads"), &b, None)
            .await
            .0,
        StatusCode::OK
    );
    server.shutdown().await;
}

#[tokio::test]
async fn servers_sharing_a_redis_share_each_key_s_rate_limit() {
    let Some(redis) = contexture_store::testing::redis_url() else {
        return;
    };
    let dir = TempDir::new("contexture-server-redis-limits");
    let mut config = config(None);
    config.limits.requests_per_second = 1.0;
    config.limits.burst = 4;
    config.limits.rate_limit_redis = Some(redis);
    // Two servers that share nothing but the Redis server: a database file each.
    let open = |name: &str| {
        let mut config = config.clone();
        config.database = format!("sqlite:{}", dir.join(name).display());
        TestServer::open(config)
    };
    let (a, b) = (open("a.db").await, open("b.db").await);
    // The same key on both (as one database would give them).
    let issued = contexture_server::issue_key(&a.state.store, "acme", "shared")
        .await
        .unwrap();
    b.state
        .store
        .create_api_key(
            &issued.record.id,
            "acme",
            "shared",
            &contexture_server::hash_key(&issued.key),
        )
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for server in [&a, &b, &a, &b] {
        statuses.push(server.call(&issued.key, "GET", "/v1/threads", None).await.0);
    }
    assert_eq!(statuses, [StatusCode::OK; 4], "the burst of 4, over both");
    // Each server alone would still admit this key; together they do not.
    for server in [&a, &b] {
        let response = client()
            .get(server.url("/v1/threads"))
            .bearer_auth(&issued.key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(response.headers().get("retry-after").is_some());
    }
    // Another key, of the same tenant or another, has a bucket of its own.
    for tenant in ["acme", "globex"] {
        let other = b.key(tenant).await;
        assert_eq!(
            b.call(&other, "GET", "/v1/threads", None).await.0,
            StatusCode::OK
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A Redis server of the test's own on a free port, stopped when dropped.
struct OwnRedis {
    port: u16,
    child: std::process::Child,
}

impl OwnRedis {
    async fn start(port: u16) -> OwnRedis {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package) runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server never listened"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        OwnRedis { port, child }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn shared_rate_limit_misses(server: &TestServer) -> u64 {
    let metrics = server.metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("contexture_shared_rate_limit_misses_total "))
        .expect("the counter is exported")
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_server_that_loses_its_redis_judges_by_its_own_bucket_then_shares_again() {
    // Redis must be on this machine (CI installs it); this test runs one of its own, which
    // it stops and starts again.
    if contexture_store::testing::redis_url().is_none() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = OwnRedis::start(port).await;
    let dir = TempDir::new("contexture-server-lost-redis");
    let mut config = config(None);
    config.database = format!("sqlite:{}", dir.join("a.db").display());
    config.limits.requests_per_second = 0.5;
    config.limits.burst = 2;
    config.limits.rate_limit_redis = Some(format!("redis://127.0.0.1:{}", redis.port));
    let server = TestServer::open(config).await;
    let key = server.key("acme").await;
    let threads = |server: &TestServer| {
        let key = key.clone();
        let url = server.url("/v1/threads");
        async move { call(reqwest::Method::GET, url, &key, None).await.0 }
    };
    assert_eq!(threads(&server).await, StatusCode::OK);
    assert_eq!(threads(&server).await, StatusCode::OK);
    assert_eq!(threads(&server).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(shared_rate_limit_misses(&server).await, 0);

    // Redis gone: the server's own bucket (full) judges, and each such request is counted.
    redis.stop();
    assert_eq!(threads(&server).await, StatusCode::OK);
    assert_eq!(threads(&server).await, StatusCode::OK);
    assert_eq!(threads(&server).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(shared_rate_limit_misses(&server).await, 3);

    // Redis back (empty): the server reconnects by itself and shares again.
    let _redis = OwnRedis::start(port).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let before = shared_rate_limit_misses(&server).await;
        let status = threads(&server).await;
        if shared_rate_limit_misses(&server).await == before {
            // Judged by Redis, whose bucket for the key is new.
            assert_eq!(status, StatusCode::OK);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never used Redis again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_whose_redis_does_not_answer_does_not_start() {
    let dir = TempDir::new("contexture-server-no-redis");
    let mut config = config(None);
    config.database = format!("sqlite:{}", dir.join("a.db").display());
    // A port nothing listens on, with a password that must not be shown.
    config.limits.rate_limit_redis = Some("redis://:hunter2@127.0.0.1:9".into());
    let error = contexture_server::AppState::new(config.clone())
        .await
        .err()
        .expect("no server without its Redis")
        .to_string();
    assert!(error.contains("redis://:***@127.0.0.1:9"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
    // A state built over a store it did not open cannot connect to Redis: refused, not
    // run with limits of its own.
    let (_dir, store) = sqlite().await;
    let error = contexture_server::AppState::with_store(config, store)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("limits.rate_limit_redis"), "{error}");
}

#[tokio::test]
async fn every_operation_the_openapi_document_describes_is_served() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store).await;
    let key = server.key("acme").await;
    let doc: Value = client()
        .get(server.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    // Every documented operation is answered by its handler, not the fallback (that the
    // document lists every route served is the router's own test).
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            let url = server.url(&path.replace("{id}", "probe"));
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = client()
                .request(method.clone(), url)
                .bearer_auth(&key)
                .timeout(std::time::Duration::from_secs(2))
                .send()
                .await;
            let Ok(response) = response else { continue }; // an event stream or an upstream call that waits
            assert_ne!(
                response.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
            let text = response.text().await.unwrap_or_default();
            assert!(!text.contains("no route"), "{method} {path}: {text}");
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_shutdown_finishes_the_appends_in_flight_and_loses_no_acknowledged_one() {
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store.clone()).await;
    let key = server.key("acme").await;
    let acks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..60u64 {
        let url = server.url("/v1/threads/busy/messages");
        let key = key.clone();
        let acks = acks.clone();
        tasks.push(tokio::spawn(async move {
            // Staggered, so that some arrive before the shutdown and some during it.
            tokio::time::sleep(std::time::Duration::from_millis(n * 3)).await;
            let response = client()
                .post(url)
                .bearer_auth(key)
                .json(&json!({"messages": [{"role": "user", "content": format!("m{n}")}]}))
                .send()
                .await;
            match response {
                Ok(response) if response.status() == StatusCode::OK => {
                    acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Some(n)
                }
                _ => None,
            }
        }));
    }
    while acks.load(std::sync::atomic::Ordering::SeqCst) < 10 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let shutdown = tokio::spawn(server.shutdown());
    let mut acknowledged = Vec::new();
    for task in tasks {
        if let Some(n) = task.await.unwrap() {
            acknowledged.push(format!("m{n}"));
        }
    }
    shutdown.await.unwrap();
    assert!(!acknowledged.is_empty());
    let thread = contexture_store::Store::load(&store, "acme/busy")
        .await
        .unwrap();
    let stored: BTreeSet<String> = thread
        .projection()
        .messages
        .iter()
        .map(|m| m.text().to_owned())
        .collect();
    for message in &acknowledged {
        assert!(
            stored.contains(message),
            "acknowledged {message} is not stored"
        );
    }
}

/// `GET /v1/threads/{id}/messages`: the projection, its last units only with `limit` (a tool
/// result always comes with its call), a named context with `context`; an unknown context
/// or a limit out of range is a 400 naming the parameter.
#[tokio::test]
async fn a_threads_messages_are_read_by_whole_units() {
    use reqwest::Method as M;
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store).await;
    let key = server.key("acme").await;
    let (status, body) = call(
        M::POST,
        server.url("/v1/threads"),
        &key,
        Some(json!({"id": "t", "system": "You search.", "messages": [
            {"role": "user", "content": "Find it"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"}
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let roles = |body: &Value| -> Vec<String> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, all) = call(M::GET, server.url("/v1/threads/t/messages"), &key, None).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(roles(&all), ["system", "user", "assistant", "tool", "tool"]);
    // One unit: the assistant turn with both its results, never a result alone.
    let (status, last) = call(
        M::GET,
        server.url("/v1/threads/t/messages?limit=1"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{last}");
    assert_eq!(roles(&last), ["system", "assistant", "tool", "tool"]);
    let (status, named) = call(
        M::GET,
        server.url("/v1/threads/t/messages?context=main&limit=2"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{named}");
    assert_eq!(named["context"], "main");
    assert_eq!(
        roles(&named),
        ["system", "user", "assistant", "tool", "tool"]
    );

    for (query, param, words) in [
        ("limit=0", "limit", "limit must be 1 to 100000"),
        ("limit=100001", "limit", "limit must be 1 to 100000"),
        ("context=%01x", "context", "control characters"),
        ("lmit=2", "", "lmit"),
    ] {
        let (status, error) = call(
            M::GET,
            server.url(&format!("/v1/threads/t/messages?{query}")),
            &key,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{query}: {error}");
        if !param.is_empty() {
            assert_eq!(error["error"]["param"], param, "{query}: {error}");
        }
    }
    // A context the thread does not have is not found, like a thread.
    let (status, error) = call(
        M::GET,
        server.url("/v1/threads/t/messages?context=nowhere"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(
        error["error"]["message"],
        "thread `t` has no context `nowhere` (its contexts: main)"
    );
    assert_eq!(error["error"]["param"], "context");
    let (status, _) = call(M::GET, server.url("/v1/threads/none/messages"), &key, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

/// Named contexts through the API: `POST /v1/threads/{id}/switch` makes one active (an
/// unknown one is a 404 naming `context` unless `create`; a repeated `op_id` has no second
/// effect), and `?context=` on an append switches to it in the same transaction (a retry with
/// the same `Idempotency-Key` stores nothing). Bad bodies are 400s naming the field, and
/// nothing is written by a refused request.
#[tokio::test]
async fn named_contexts_are_switched_to_and_appended_in_through_the_api() {
    use reqwest::Method as M;
    let (_dir, store) = sqlite().await;
    let server = TestServer::start(config(None), store).await;
    let key = server.key("acme").await;
    let (status, body) = call(
        M::POST,
        server.url("/v1/threads"),
        &key,
        Some(json!({"id": "t", "messages": [{"role": "user", "content": "hello"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let last_seq = |server: &TestServer, key: &str| {
        let url = server.url("/v1/threads/t");
        let key = key.to_owned();
        async move {
            let (_, thread) = call(M::GET, url, &key, None).await;
            (
                thread["last_seq"].as_u64().unwrap(),
                thread["context"].clone(),
            )
        }
    };
    let (base, _) = last_seq(&server, &key).await;
    let switch = |body: Value| {
        call(
            M::POST,
            server.url("/v1/threads/t/switch"),
            &key,
            Some(body),
        )
    };

    let (status, error) = switch(json!({"context": "research"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"]["code"], "unknown_context");
    assert_eq!(error["error"]["param"], "context");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("thread `t` has no context `research` (its contexts: main)"),
        "{error}"
    );
    assert_eq!(last_seq(&server, &key).await, (base, json!("main")));

    let (status, switched) =
        switch(json!({"context": "research", "create": true, "op_id": "op-1"})).await;
    assert_eq!(status, StatusCode::OK, "{switched}");
    assert_eq!(
        switched,
        json!({"seq": base + 1, "context": "research", "queued": false})
    );
    assert_eq!(last_seq(&server, &key).await, (base + 1, json!("research")));
    let (status, _) = switch(json!({"context": "main", "op_id": "op-2"})).await;
    assert_eq!(status, StatusCode::OK);
    // The first switch sent again: nothing recorded, answered as the first was.
    let (status, again) = switch(json!({"context": "research", "op_id": "op-1"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        again,
        json!({"seq": base + 1, "context": "research", "queued": false})
    );
    assert_eq!(last_seq(&server, &key).await, (base + 2, json!("main")));
    let (status, reused) = switch(json!({"context": "main", "op_id": "op-1"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reused}");
    assert_eq!(reused["error"]["param"], "op_id");

    // An append in a context switches to it first, in the same transaction.
    let append = |query: &str, idempotency: Option<&str>, content: &str| {
        let mut request = client()
            .post(server.url(&format!("/v1/threads/t/messages{query}")))
            .bearer_auth(&key)
            .json(&json!({"messages": [{"role": "user", "content": content}]}));
        if let Some(idempotency) = idempotency {
            request = request.header("Idempotency-Key", idempotency);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, appended) = append("?context=research", Some("k1"), "a finding").await;
    assert_eq!(status, StatusCode::OK, "{appended}");
    assert_eq!(
        appended,
        json!({"seqs": [base + 4], "switch_seq": base + 3})
    );
    let (status, again) = append("?context=research", Some("k1"), "a finding").await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["seqs"], json!([base + 4]), "a retry stores nothing");
    assert_eq!(last_seq(&server, &key).await, (base + 4, json!("research")));
    // Already active: no switch is recorded.
    let (_, appended) = append("?context=research", None, "another").await;
    assert_eq!(appended, json!({"seqs": [base + 5]}));

    // Refused: an unknown context, bad names and bodies; nothing is written.
    let (status, error) = append("?context=nowhere", None, "lost?").await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"]["code"], "unknown_context");
    assert_eq!(error["error"]["param"], "context");
    for (body, param, words) in [
        (json!({"context": ""}), "context", "1 to 200 characters"),
        (
            json!({"context": "a\u{1}b"}),
            "context",
            "control characters",
        ),
        (json!({"context": "a\u{200b}b"}), "context", "invisible"),
        (json!({"context": 7}), "", "context"),
        (
            json!({"context": "main", "op_id": ""}),
            "op_id",
            "1 to 200 characters",
        ),
        (json!({"context": "main", "create": "yes"}), "", "create"),
        (json!({"context": "main", "swtich": 1}), "", "swtich"),
        (json!({}), "", "context"),
    ] {
        let (status, error) = switch(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{body}: {error}");
        if !param.is_empty() {
            assert_eq!(error["error"]["param"], param, "{body}: {error}");
        }
    }
    let (status, error) = append("?context=%01", None, "lost?").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["param"], "context");
    let (status, _) = call(
        M::POST,
        server.url("/v1/threads/none/switch"),
        &key,
        Some(json!({"context": "main"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(last_seq(&server, &key).await, (base + 5, json!("research")));
    server.shutdown().await;
}
