//! Anthropic's messages API.

use std::time::Duration;

use contexture_core::Message;
use contexture_core::format::anthropic;
use serde_json::{Map, Value, json};

use crate::error::LlmError;
use crate::http::{HttpClient, join_url};
use crate::provider::{BoxFuture, ChatRequest, ChatResponse, Provider, StreamDelta, Usage};
use crate::retry::RetryPolicy;
use crate::sse::SseDecoder;
use crate::wire::anthropic_tool;

/// Anthropic's endpoint, used when no base URL is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; this is sent when the request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A client for Anthropic's `/v1/messages`.
#[derive(Clone)]
pub struct AnthropicProvider {
    base_url: String,
    api_key: String,
    http: HttpClient,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("http", &self.http)
            .finish()
    }
}

impl AnthropicProvider {
    /// A client for `base_url` with `api_key`, a 60 s timeout and the default retry policy.
    pub fn new(base_url: impl Into<String>, api_key: impl Into<String>) -> AnthropicProvider {
        AnthropicProvider {
            base_url: base_url.into(),
            api_key: api_key.into(),
            http: HttpClient::new("anthropic", Duration::from_secs(60), RetryPolicy::default()),
        }
    }

    /// A client configured from `ANTHROPIC_BASE_URL` (default: Anthropic's endpoint) and
    /// `ANTHROPIC_API_KEY`.
    pub fn from_env() -> AnthropicProvider {
        AnthropicProvider::new(
            std::env::var("ANTHROPIC_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_owned()),
            std::env::var("ANTHROPIC_API_KEY").unwrap_or_default(),
        )
    }

    /// Sets the timeout of a whole call (and of any pause in a stream).
    pub fn with_timeout(mut self, timeout: Duration) -> AnthropicProvider {
        self.http.timeout = timeout;
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> AnthropicProvider {
        self.http.retry = retry;
        self
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("x-api-key", self.api_key.clone()),
            ("anthropic-version", API_VERSION.to_owned()),
        ]
    }

    fn url(&self) -> String {
        join_url(&self.base_url, "v1/messages")
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Result<Value, LlmError> {
        let converted =
            anthropic::to_request(&request.messages).map_err(|e| LlmError::InvalidRequest {
                provider: "anthropic".into(),
                detail: e.to_string(),
            })?;
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert(
            "max_tokens".into(),
            json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
        );
        if let Value::Object(converted) = converted {
            body.extend(converted);
        }
        if !request.tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(request.tools.iter().map(anthropic_tool).collect()),
            );
        }
        if let Some(temperature) = request.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if stream {
            body.insert("stream".into(), json!(true));
        }
        for (key, value) in &request.extra {
            body.insert(key.clone(), value.clone());
        }
        Ok(Value::Object(body))
    }

    fn response(&self, answer: &Value, attempts: u32) -> Result<ChatResponse, LlmError> {
        let read = read_answer(answer).map_err(|detail| self.http.decode_error(detail))?;
        Ok(ChatResponse {
            message: read.message,
            finish_reason: read.stop_reason,
            usage: read.usage,
            model: read.model,
            attempts,
        })
    }

    async fn complete_inner(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = self.body(request, false)?;
        let (answer, attempts) = self
            .http
            .post_json(&self.url(), &self.headers(), &body, request.timeout)
            .await?;
        self.response(&answer, attempts)
    }

    async fn stream_inner(
        &self,
        request: &ChatRequest,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let body = self.body(request, true)?;
        let (mut response, attempts) = self
            .http
            .post_stream(&self.url(), &self.headers(), &body, request.timeout)
            .await?;
        let mut decoder = SseDecoder::default();
        let mut assembly = StreamAssembly::default();
        while let Some(events) = self
            .http
            .events(&mut response, &mut decoder, request.timeout)
            .await?
        {
            for event in events {
                let data: Value = serde_json::from_str(&event.data).map_err(|e| {
                    self.http
                        .decode_error(format!("a stream event is not JSON ({e}): {}", event.data))
                })?;
                if data.get("type").and_then(Value::as_str) == Some("error") {
                    return Err(self.http.decode_error(format!(
                        "the stream reported an error: {}",
                        data.get("error").unwrap_or(&data)
                    )));
                }
                assembly.absorb(&data, on_delta);
            }
        }
        // A stream cut before its stop reason or `message_stop` holds only part of the answer.
        if !assembly.ended() {
            return Err(self.http.decode_error(
                "the stream ended before the answer did (no stop reason, no message_stop)",
            ));
        }
        let answer = assembly.into_answer();
        self.response(&answer, attempts)
    }
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(self.complete_inner(request))
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_delta: &'a mut (dyn FnMut(StreamDelta) + Send),
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(self.stream_inner(request, on_delta))
    }
}

/// An answer of the messages API, read.
pub(crate) struct ReadAnswer {
    /// The assistant message.
    pub message: Message,
    /// What the provider reported it used.
    pub usage: Option<Usage>,
    /// The model that answered.
    pub model: Option<String>,
    /// Why it stopped (`end_turn`, `tool_use`, `max_tokens`, ...).
    pub stop_reason: Option<String>,
}

/// Reads a whole messages-API answer (or one a [`StreamAssembly`] put back together).
pub(crate) fn read_answer(answer: &Value) -> Result<ReadAnswer, String> {
    let content = answer
        .get("content")
        .ok_or_else(|| "no `content` in the answer".to_owned())?;
    let mut messages =
        anthropic::parse_request(&json!({"messages": [{"role": "assistant", "content": content}]}))
            .map_err(|e| format!("content: {e}"))?;
    let message = messages
        .pop()
        .ok_or_else(|| "the answer holds no message".to_owned())?;
    let usage = answer.get("usage").and_then(|usage| {
        Some(Usage::new(
            usage.get("input_tokens")?.as_u64()?,
            usage.get("output_tokens")?.as_u64()?,
        ))
    });
    let text = |key: &str| answer.get(key).and_then(Value::as_str).map(str::to_owned);
    Ok(ReadAnswer {
        message,
        usage,
        model: text("model"),
        stop_reason: text("stop_reason"),
    })
}

/// A streamed answer put back together into the shape of a non-streamed one.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembly {
    model: Option<String>,
    blocks: Vec<Value>,
    /// The partial JSON of each tool_use block's input, by block index.
    partial_inputs: Vec<String>,
    stop_reason: Option<String>,
    /// Whether the `message_stop` event came.
    stopped: bool,
    /// Whether the `message_start` event came.
    started: bool,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl StreamAssembly {
    /// True once the stream's `message_start` came.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// True once the answer ended: a stop reason or `message_stop` came.
    pub(crate) fn ended(&self) -> bool {
        self.stopped || self.stop_reason.is_some()
    }

    /// Takes in one event of the stream, telling `on_delta` what it added.
    pub(crate) fn absorb(&mut self, event: &Value, on_delta: &mut (dyn FnMut(StreamDelta) + Send)) {
        let index = event
            .get("index")
            .and_then(Value::as_u64)
            .map(|i| i as usize);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                self.started = true;
                let message = event.get("message");
                self.model = message
                    .and_then(|m| m.get("model"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.input_tokens = message
                    .and_then(|m| m.get("usage"))
                    .and_then(|u| u.get("input_tokens"))
                    .and_then(Value::as_u64);
            }
            Some("content_block_start") => {
                if let (Some(index), Some(block)) = (index, event.get("content_block")) {
                    if self.blocks.len() <= index {
                        self.blocks.resize(index + 1, Value::Null);
                        self.partial_inputs.resize(index + 1, String::new());
                    }
                    self.blocks[index] = block.clone();
                    if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                        on_delta(StreamDelta::ToolCall {
                            index: self.tool_index(index),
                            id: block.get("id").and_then(Value::as_str).map(str::to_owned),
                            name: block.get("name").and_then(Value::as_str).map(str::to_owned),
                            arguments: String::new(),
                        });
                    }
                }
            }
            Some("content_block_delta") => {
                let (Some(index), Some(delta)) = (index, event.get("delta")) else {
                    return;
                };
                if index >= self.blocks.len() {
                    return;
                }
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        append(&mut self.blocks[index], "text", text("text"));
                        on_delta(StreamDelta::Text(text("text").to_owned()));
                    }
                    Some("thinking_delta") => {
                        append(&mut self.blocks[index], "thinking", text("thinking"));
                        on_delta(StreamDelta::Reasoning(text("thinking").to_owned()));
                    }
                    Some("signature_delta") => {
                        append(&mut self.blocks[index], "signature", text("signature"));
                    }
                    Some("input_json_delta") => {
                        self.partial_inputs[index].push_str(text("partial_json"));
                        on_delta(StreamDelta::ToolCall {
                            index: self.tool_index(index),
                            id: None,
                            name: None,
                            arguments: text("partial_json").to_owned(),
                        });
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(tokens) = event
                    .get("usage")
                    .and_then(|u| u.get("output_tokens"))
                    .and_then(Value::as_u64)
                {
                    self.output_tokens = Some(tokens);
                }
            }
            Some("message_stop") => self.stopped = true,
            _ => {}
        }
    }

    /// The position of block `index` among the turn's tool_use blocks.
    fn tool_index(&self, index: usize) -> usize {
        self.blocks[..index]
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool_use"))
            .count()
    }

    /// The answer as far as it came, in the shape of a non-streamed one.
    pub(crate) fn into_answer(mut self) -> Value {
        for (block, partial) in self.blocks.iter_mut().zip(&self.partial_inputs) {
            if !partial.is_empty()
                && let Some(object) = block.as_object_mut()
            {
                // Invalid JSON from the model is kept as a string rather than dropped.
                let input = serde_json::from_str(partial).unwrap_or_else(|_| json!(partial));
                object.insert("input".into(), input);
            }
        }
        let blocks: Vec<Value> = self.blocks.into_iter().filter(|b| !b.is_null()).collect();
        let mut answer =
            json!({"content": blocks, "model": self.model, "stop_reason": self.stop_reason});
        if let (Some(input), Some(output)) = (self.input_tokens, self.output_tokens) {
            answer["usage"] = json!({"input_tokens": input, "output_tokens": output});
        }
        answer
    }
}

fn append(block: &mut Value, key: &str, text: &str) {
    if let Some(object) = block.as_object_mut() {
        let current = object.get(key).and_then(Value::as_str).unwrap_or("");
        let joined = format!("{current}{text}");
        object.insert(key.to_owned(), Value::String(joined));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_tool_schemas_are_converted() {
        let tool = json!({"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
        assert_eq!(
            anthropic_tool(&tool),
            json!({"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}})
        );
    }

    #[test]
    fn stream_assembly_rebuilds_the_answer() {
        let events = [
            json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "tu_1", "name": "search", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"rust\"}"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
        ];
        let mut assembly = StreamAssembly::default();
        let mut deltas = Vec::new();
        for event in &events {
            assembly.absorb(event, &mut |d| deltas.push(d));
        }
        let answer = assembly.into_answer();
        assert_eq!(
            answer,
            json!({
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "tu_1", "name": "search", "input": {"q": "rust"}}
                ],
                "model": "claude-x",
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 12, "output_tokens": 20}
            })
        );
        assert_eq!(deltas[0], StreamDelta::Text("Let me ".into()));
        assert_eq!(deltas.len(), 5);
    }
}
