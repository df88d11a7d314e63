//! A fake OpenAI-compatible provider on 127.0.0.1 that records what it receives.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// The model the fake says it is.
pub const MODEL: &str = "gpt-4o-mini";

/// Starts the fake on `runtime`; its base URL (`http://127.0.0.1:PORT/v1`).
pub fn start(runtime: &tokio::runtime::Runtime) -> (Arc<Upstream>, String) {
    let upstream = Arc::new(Upstream::default());
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/v1/chat/completions", post(complete))
        .route("/v1/models", get(models))
        .with_state(upstream.clone());
    runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (upstream, url)
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
        .into_response()
}

/// One request the fake upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Value,
    pub authorization: Option<String>,
    /// Every header, `name: value` per line.
    pub headers: String,
}

/// A fake OpenAI-compatible provider: the Nth request is answered `reply N`, or, when it
/// asks for a stream, `streamed reply N` in several `chat.completion.chunk` events.
#[derive(Default)]
pub struct Upstream {
    /// Each request, in order.
    pub received: Mutex<Vec<Received>>,
    /// The text of each answer, in the order of the requests.
    pub answers: Mutex<Vec<String>>,
}

async fn complete(
    State(upstream): State<Arc<Upstream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = body["stream"] == json!(true);
    let n = {
        let mut received = upstream.received.lock().unwrap();
        received.push(Received {
            body,
            authorization: headers
                .get(header::AUTHORIZATION)
                .map(|value| value.to_str().unwrap_or("<not ASCII>").to_owned()),
            headers: headers
                .iter()
                .map(|(name, value)| {
                    format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes()))
                })
                .collect(),
        });
        received.len()
    };
    let id = format!("chatcmpl-{n}");
    if !stream {
        let text = format!("reply {n}");
        upstream.answers.lock().unwrap().push(text.clone());
        return axum::Json(json!({
            "id": id, "object": "chat.completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        }))
        .into_response();
    }
    let pieces = ["streamed".to_owned(), " reply".to_owned(), format!(" {n}")];
    upstream.answers.lock().unwrap().push(pieces.concat());
    let chunk = |delta: Value, finish: Value| {
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {chunk}\n\n")
    };
    let mut sse = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for piece in &pieces {
        sse.push_str(&chunk(json!({"content": piece}), Value::Null));
    }
    sse.push_str(&chunk(json!({}), json!("stop")));
    sse.push_str("data: [DONE]\n\n");
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from(sse),
    )
        .into_response()
}
