//! The inspector page, `/ui`, over HTTP: its shell, script and style are open and hold no
//! data; every view is behind the same keys as the API; every `/ui` answer carries a
//! Content-Security-Policy that allows only the page's own script; hostile ids and queries
//! get a 4xx that names what was wrong, and a view shows recorded markup as text.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::json;

const WORKFLOW: &str = r#"
name: notes
assistants: [{id: writer, model: gpt-4o-mini, system_prompt: Be brief.}]
states:
  - {id: outline, assistant_id: writer, task: 'Outline notes on {{topic}}', next: {end: true}}
"#;

const HOSTILE: &str = r#"<script>alert(1)</script><img src=x onerror=alert(2)>"#;

async fn server(dir: &TempDir) -> TestServer {
    let replies = dir.join("replies.yaml");
    std::fs::write(&replies, "- content: '<b>bold</b> answer'\n").unwrap();
    let mut config = config(None);
    config.llm = format!("scripted:{}", replies.display());
    let store = SqliteStore::open(dir.join("ui.db")).await.unwrap();
    TestServer::start(config, AnyStore::Sqlite(store)).await
}

async fn get(server: &TestServer, key: Option<&str>, path: &str) -> reqwest::Response {
    let mut request = client().get(server.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
}

#[tokio::test]
async fn the_page_is_open_its_views_are_behind_keys_and_every_answer_has_a_strict_policy() {
    let dir = TempDir::new("contexture-ui");
    let server = server(&dir).await;
    let acme = server.key("acme").await;
    let globex = server.key("globex").await;
    let (status, started) = server
        .call(
            &acme,
            "POST",
            "/v1/executions",
            Some(json!({"workflow_yaml": WORKFLOW, "input": {"topic": HOSTILE}, "id": "run-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while matches!(
        server
            .call(&acme, "GET", "/v1/executions/run-1", None)
            .await
            .1["status"]
            .as_str(),
        Some("running" | "queued")
    ) {
        assert!(Instant::now() < deadline, "run-1 never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The shell and its files: open, no inline script, a policy that allows none.
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/inspector.js", "text/javascript"),
        ("/ui/inspector.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        let response = get(&server, None, path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert!(
            header(&response, "content-type").starts_with(kind),
            "{path}"
        );
        let policy = header(&response, "content-security-policy").to_owned();
        assert!(
            policy.contains("default-src 'none'") && policy.contains("script-src 'self'"),
            "{path}: {policy}"
        );
        assert!(
            !policy.contains("unsafe-inline") && !policy.contains("http"),
            "{path}: {policy}"
        );
        assert_eq!(header(&response, "x-content-type-options"), "nosniff");
        let body = response.text().await.unwrap();
        if kind == "text/html" {
            // Every script is a file of this server's; no handler in an attribute.
            for script in body.split("<script").skip(1) {
                assert!(script.starts_with(" src=\"/ui/"), "{path}: <script{script}");
            }
            assert!(
                !body.contains(" on") || !body.contains("onclick="),
                "{path}"
            );
        }
    }

    // A view: with the owner's key only; another tenant's key and no key find nothing.
    let view = "/ui/views/executions/run-1";
    let response = get(&server, Some(&acme), view).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(header(&response, "content-type").starts_with("text/html"));
    assert_eq!(header(&response, "cache-control"), "no-store");
    assert!(header(&response, "content-security-policy").contains("default-src 'none'"));
    let html = response.text().await.unwrap();
    assert!(html.contains("data-view=\"execution\""), "{html}");
    // Recorded markup (the task and the model's answer) shows as text.
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
        "{html}"
    );
    assert!(
        html.contains("&lt;b&gt;bold&lt;&#x2f;b&gt; answer"),
        "{html}"
    );
    for markup in ["<script", "<img", "<b>"] {
        assert!(!html.contains(markup), "{markup} in the view");
    }
    let response = get(&server, Some(&globex), view).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let text = response.text().await.unwrap();
    assert!(!text.contains("acme"), "{text}");
    assert_eq!(
        get(&server, None, view).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // A thread that is not an execution is not found as one.
    server
        .call(
            &acme,
            "POST",
            "/v1/threads/plain/messages",
            Some(json!({"messages": [{"role": "user", "content": "hi"}]})),
        )
        .await;
    let response = get(&server, Some(&acme), "/ui/views/executions/plain").await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn hostile_view_requests_get_errors_that_name_what_was_wrong() {
    let dir = TempDir::new("contexture-ui-hostile");
    let server = server(&dir).await;
    let acme = server.key("acme").await;
    for (path, status, says) in [
        (
            "/ui/views/executions/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            StatusCode::NOT_FOUND,
            "execution",
        ),
        (
            "/ui/views/executions/run-1?after=-1",
            StatusCode::BAD_REQUEST,
            "after",
        ),
        (
            "/ui/views/executions/run-1?after=x",
            StatusCode::BAD_REQUEST,
            "after",
        ),
        (
            "/ui/views/executions/run-1?key=secret",
            StatusCode::BAD_REQUEST,
            "key",
        ),
        ("/ui/views/nothing/run-1", StatusCode::NOT_FOUND, "no route"),
        (
            "/ui/views/threads/%3Cimg%20src%3Dx%3E",
            StatusCode::NOT_FOUND,
            "thread",
        ),
        (
            "/ui/views/threads/t?after=x",
            StatusCode::BAD_REQUEST,
            "after",
        ),
        (
            "/ui/views/threads/t?model=",
            StatusCode::NOT_FOUND,
            "thread",
        ),
        (
            "/ui/views/threads/t?token=1",
            StatusCode::BAD_REQUEST,
            "token",
        ),
        (
            "/ui/views/home?before=yesterday",
            StatusCode::BAD_REQUEST,
            "before",
        ),
        ("/ui/views/home?limit=5", StatusCode::BAD_REQUEST, "limit"),
        (
            "/ui/views/executions/%00",
            StatusCode::NOT_FOUND,
            "execution",
        ),
    ] {
        let response = get(&server, Some(&acme), path).await;
        assert_eq!(response.status(), status, "{path}");
        // An error is JSON, never HTML a browser would render (the page shows it as text).
        assert!(
            header(&response, "content-type").starts_with("application/json"),
            "{path}"
        );
        assert_eq!(header(&response, "x-content-type-options"), "nosniff");
        let text = response.text().await.unwrap();
        assert!(text.to_lowercase().contains(says), "{path}: {text}");
    }
    // A search longer than the limit is refused, naming it; markup searched for is shown
    // as text.
    let long = format!("/ui/views/home?q={}", "a".repeat(201));
    let response = get(&server, Some(&acme), &long).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.text().await.unwrap().contains("q:"));
    let response = get(&server, Some(&acme), "/ui/views/home?q=%3Cscript%3E").await;
    assert_eq!(response.status(), StatusCode::OK);
    let html = response.text().await.unwrap();
    assert!(
        html.contains("&lt;script&gt;") && !html.contains("<script"),
        "{html}"
    );
    // A thread fitted for a model the registry does not know still shows, saying why its
    // context cannot be fitted.
    server
        .call(
            &acme,
            "POST",
            "/v1/threads/t/messages",
            Some(json!({"messages": [{"role": "user", "content": "hi"}]})),
        )
        .await;
    let response = get(
        &server,
        Some(&acme),
        "/ui/views/threads/t?model=no-such-model%3Cb%3E",
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let html = response.text().await.unwrap();
    assert!(html.contains("data-field=\"context-error\""), "{html}");
    assert!(!html.contains("<b>"), "{html}");
    // The server is still well.
    assert_eq!(
        get(&server, None, "/healthz").await.status(),
        StatusCode::OK
    );
}
