//! Test servers over real sockets: `contexture serve`'s app on 127.0.0.1, a fake
//! OpenAI-compatible upstream that records what it receives, and API keys.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use contexture_server::issue_key;
use contexture_server::{AppState, ServerConfig, serve};
use contexture_store::AnyStore;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its state (store, metrics).
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Serves `store` with `config` on a free port.
    pub async fn start(config: ServerConfig, store: AnyStore) -> TestServer {
        let state = AppState::with_store(config, store).expect("server state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(state.clone(), listener, async move {
            let _ = stopped.await;
        }));
        TestServer {
            base,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A key for `tenant`.
    pub async fn key(&self, tenant: &str) -> String {
        issue_key(&self.state.store, tenant, "test")
            .await
            .unwrap()
            .key
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stops accepting, waits for requests in flight, and returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A configuration for tests: no rate limit, upstream at `upstream` (if any), clients'
/// templates rendered by the `contexture` binary's template workers, as `contexture serve`
/// renders them.
pub fn config(upstream: Option<&str>) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.limits.requests_per_second = 0.0;
    config.executions.template_worker = Some(vec![
        contexture_binary().display().to_string(),
        "template-worker".to_owned(),
    ]);
    if let Some(url) = upstream {
        config.upstream.base_url = url.to_owned();
        config.upstream.api_key = Some("sk-upstream-secret".into());
        config.upstream.timeout_secs = 10.0;
        config.upstream.retries = 0;
    }
    config
}

/// The `contexture` binary of this build, beside the test binaries (`cargo test
/// --workspace` builds it; `cargo build -p contexture-cli` does too).
pub fn contexture_binary() -> std::path::PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(std::path::Path::parent)
        .expect("test binaries live in target/PROFILE/deps");
    let binary = profile_dir.join(format!("contexture{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "the server tests start template workers from the contexture binary, which is not \
         built at {}: run `cargo build -p contexture-cli` (or test the whole workspace)",
        binary.display()
    );
    binary
}

/// An authenticated client call.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// What the fake upstream answers next.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A chat.completion with this text (or, for a `stream: true` request, its chunks).
    Text(String),
    /// This status and body.
    Status(u16, Value),
    /// Never answers (until the test ends).
    Hang,
    /// This text after this long: a whole answer sent late, or a stream whose first chunk
    /// comes at once and the rest late.
    Delayed(Duration, String),
    /// This status, content type and body, as they are (garbage, a cut stream).
    Raw(u16, &'static str, &'static str),
}

/// A fake OpenAI-compatible upstream.
#[derive(Default)]
pub struct Upstream {
    /// Replies in order; when empty, `reply N` for the N-th request.
    pub replies: Mutex<VecDeque<Reply>>,
    /// Each request body received.
    pub received: Mutex<Vec<Value>>,
    /// Each request's Authorization header.
    pub authorizations: Mutex<Vec<Option<String>>>,
}

impl Upstream {
    /// Starts it; returns it and its base URL (`http://.../v1`).
    pub async fn start() -> (Arc<Upstream>, String) {
        let upstream = Arc::new(Upstream::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/models", get(models))
            .with_state(upstream.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (upstream, base)
    }

    /// The bodies received so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    /// The messages of the `n`-th request, as (role, content) pairs.
    pub fn messages(&self, n: usize) -> Vec<(String, String)> {
        self.bodies()[n]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]}))
        .into_response()
}

async fn complete(
    State(upstream): State<Arc<Upstream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut received = upstream.received.lock().unwrap();
        received.push(body.clone());
        received.len()
    };
    upstream.authorizations.lock().unwrap().push(
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let reply = upstream
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Reply::Text(format!("reply {n}")));
    let mut pause = Duration::ZERO;
    let reply = match reply {
        Reply::Delayed(delay, text) if body["stream"] == json!(true) => {
            pause = delay;
            Reply::Text(text)
        }
        Reply::Delayed(delay, text) => {
            tokio::time::sleep(delay).await;
            Reply::Text(text)
        }
        other => other,
    };
    match reply {
        Reply::Delayed(..) => unreachable!("turned into a text above"),
        Reply::Raw(status, content_type, body) => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap(),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(600)).await;
            axum::http::StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Reply::Status(status, body) => (
            axum::http::StatusCode::from_u16(status).unwrap(),
            axum::Json(body),
        )
            .into_response(),
        Reply::Text(text) if body["stream"] == json!(true) => {
            let mut events = Vec::new();
            let words: Vec<&str> = text.split_inclusive(' ').collect();
            for (i, word) in words.iter().enumerate() {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": word})
                } else {
                    json!({"content": word})
                };
                events.push(format!(
                    "data: {}\n\n",
                    json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
                ));
            }
            events.push(format!(
                "data: {}\n\n",
                json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})
            ));
            events.push("data: [DONE]\n\n".to_owned());
            let stream = futures_util::stream::iter(events.into_iter().enumerate()).then(
                move |(i, event)| async move {
                    if i == 1 {
                        tokio::time::sleep(pause).await;
                    }
                    Ok::<_, std::io::Error>(Bytes::from(event))
                },
            );
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        Reply::Text(text) => axum::Json(json!({
            "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        }))
        .into_response(),
    }
}
