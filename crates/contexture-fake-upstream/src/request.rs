//! What the fake records of each request it receives.

use axum::body::Bytes;
use axum::http::HeaderMap;
use serde_json::Value;

use crate::Endpoint;

/// One request the fake received, as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method, such as `POST`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Every header.
    pub headers: HeaderMap,
    /// The body, byte for byte.
    pub body: Bytes,
    /// The body parsed as JSON; `Null` when it is empty or not JSON.
    pub json: Value,
    endpoint: Endpoint,
}

impl Request {
    pub(crate) fn new(
        method: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
        endpoint: Endpoint,
    ) -> Request {
        Request {
            method: method.to_owned(),
            path: path.to_owned(),
            json: serde_json::from_slice(&body).unwrap_or(Value::Null),
            headers,
            body,
            endpoint,
        }
    }

    /// Whether it is a call to a model (chat completions or Anthropic messages).
    pub fn is_call(&self) -> bool {
        matches!(
            self.endpoint,
            Endpoint::ChatCompletions | Endpoint::AnthropicMessages
        )
    }

    /// The value of header `name` (any case); `None` when absent or not visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// The `Authorization` header.
    pub fn authorization(&self) -> Option<&str> {
        self.header("authorization")
    }

    /// Whether the body asks for a streamed answer (`"stream": true`).
    pub fn wants_stream(&self) -> bool {
        self.json["stream"] == Value::Bool(true)
    }

    /// The body's `messages` as (role, text) pairs; a message whose content is not a string
    /// has the text `""`.
    ///
    /// # Panics
    ///
    /// When the body has no `messages` array.
    #[track_caller]
    pub fn messages(&self) -> Vec<(String, String)> {
        self.json["messages"]
            .as_array()
            .unwrap_or_else(|| {
                panic!(
                    "no messages in {} {}: {}",
                    self.method, self.path, self.json
                )
            })
            .iter()
            .map(|message| {
                (
                    message["role"].as_str().unwrap_or_default().to_owned(),
                    message["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}
