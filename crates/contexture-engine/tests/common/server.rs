//! A local OpenAI-compatible chat-completions server for tests over real HTTP. It answers
//! from a queue of canned answers (a reply text, a status, a delay) and keeps every request
//! body it received, so a test can check exactly what the engine sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// One canned answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
    /// How long to wait before answering.
    pub delay: Duration,
}

impl Answer {
    /// A completion whose reply is `text`, with usage.
    pub fn text(text: &str) -> Answer {
        Answer {
            status: 200,
            body: json!({
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": "test-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
            }),
            delay: Duration::ZERO,
        }
    }

    /// A completion that calls one tool.
    pub fn tool_call(id: &str, name: &str, arguments: Value) -> Answer {
        Answer {
            status: 200,
            body: json!({
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": "test-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                    "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]},
                    "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
            }),
            delay: Duration::ZERO,
        }
    }

    /// An error status with an OpenAI-style error body.
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            body: json!({"error": {"message": format!("test server says {status}"), "type": "server_error"}}),
            delay: Duration::ZERO,
        }
    }

    /// A streamed completion (server-sent events) whose reply is `pieces` joined.
    pub fn stream(pieces: &[&str]) -> Answer {
        let mut events: Vec<Value> = pieces
            .iter()
            .map(|piece| json!({"choices": [{"index": 0, "delta": {"content": piece}}]}))
            .collect();
        events.push(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}),
        );
        Answer {
            status: 200,
            body: Value::String(
                events
                    .iter()
                    .map(|event| format!("data: {event}\n\n"))
                    .chain(["data: [DONE]\n\n".to_owned()])
                    .collect(),
            ),
            delay: Duration::ZERO,
        }
    }

    /// The same answer after `delay`.
    pub fn after(mut self, delay: Duration) -> Answer {
        self.delay = delay;
        self
    }
}

/// The server's state.
#[derive(Default)]
pub struct Server {
    answers: Mutex<VecDeque<Answer>>,
    received: Mutex<Vec<Value>>,
}

impl Server {
    /// Every request body received, in order.
    pub fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    /// Queues more answers.
    pub fn push(&self, answers: impl IntoIterator<Item = Answer>) {
        self.answers.lock().unwrap().extend(answers);
    }
}

async fn answer(State(server): State<Arc<Server>>, body: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("not JSON: {error}")).into_response();
        }
    };
    server.received.lock().unwrap().push(body);
    let canned = server
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Answer {
            status: 500,
            body: json!({"error": {"message": "the test server has no answer left"}}),
            delay: Duration::ZERO,
        });
    tokio::time::sleep(canned.delay).await;
    // A string body is a prepared event stream; anything else is JSON.
    let (content_type, body) = match canned.body {
        Value::String(events) => ("text/event-stream", events),
        other => ("application/json", other.to_string()),
    };
    (
        StatusCode::from_u16(canned.status).unwrap(),
        [("content-type", content_type)],
        body,
    )
        .into_response()
}

/// Starts a server on a free loopback port with `answers` queued; returns its base URL
/// (ending in `/v1`) and its state.
pub async fn serve(answers: Vec<Answer>) -> (String, Arc<Server>) {
    let server = Arc::new(Server::default());
    server.push(answers);
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/v1"), server)
}
