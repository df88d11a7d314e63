//! OpenAI-compatible chat completions: OpenAI itself, and the servers that speak its format
//! (Ollama, vLLM, llama.cpp server, LM Studio, ...).

use std::time::Duration;

use contexture_core::format::openai;
use contexture_core::{Content, Message, Part, ToolCall};
use serde_json::{Map, Value, json};

use crate::error::LlmError;
use crate::http::{HttpClient, join_url};
use crate::provider::{BoxFuture, ChatRequest, ChatResponse, Provider, StreamDelta, Usage};
use crate::retry::RetryPolicy;
use crate::sse::SseDecoder;

/// OpenAI's own endpoint, used when no base URL is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A client for an OpenAI-compatible `/chat/completions` endpoint.
#[derive(Clone)]
pub struct OpenAiProvider {
    base_url: String,
    api_key: Option<String>,
    http: HttpClient,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("http", &self.http)
            .finish()
    }
}

impl OpenAiProvider {
    /// A client for `base_url` (e.g. `http://127.0.0.1:11434/v1` for Ollama), with an
    /// optional bearer key, a 60 s timeout and the default retry policy.
    pub fn new(base_url: impl Into<String>, api_key: Option<String>) -> OpenAiProvider {
        OpenAiProvider {
            base_url: base_url.into(),
            api_key: api_key.filter(|key| !key.is_empty()),
            http: HttpClient::new("openai", Duration::from_secs(60), RetryPolicy::default()),
        }
    }

    /// A client configured from `OPENAI_BASE_URL` (default: OpenAI's endpoint) and
    /// `OPENAI_API_KEY`.
    pub fn from_env() -> OpenAiProvider {
        OpenAiProvider::new(
            std::env::var("OPENAI_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_owned()),
            std::env::var("OPENAI_API_KEY").ok(),
        )
    }

    /// Sets the timeout of a whole call (and of any pause in a stream).
    pub fn with_timeout(mut self, timeout: Duration) -> OpenAiProvider {
        self.http.timeout = timeout;
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> OpenAiProvider {
        self.http.retry = retry;
        self
    }

    /// The base URL calls go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        self.api_key
            .iter()
            .map(|key| ("authorization", format!("Bearer {key}")))
            .collect()
    }

    fn url(&self) -> String {
        join_url(&self.base_url, "chat/completions")
    }

    async fn complete_inner(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = request_body(request, false);
        let (answer, attempts) = self
            .http
            .post_json(&self.url(), &self.headers(), &body, request.timeout)
            .await?;
        let completion = parse_completion(&answer)
            .map_err(|problem| self.http.decode_error(problem.to_string()))?;
        Ok(ChatResponse {
            message: completion.message,
            finish_reason: completion.finish_reason,
            usage: completion.usage,
            model: completion.model,
            attempts,
        })
    }

    async fn stream_inner(
        &self,
        request: &ChatRequest,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let body = request_body(request, true);
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
                assembly
                    .absorb_data(&event.data, on_delta)
                    .map_err(|problem| self.http.decode_error(problem.to_string()))?;
            }
        }
        if !assembly.ended() {
            return Err(self.http.decode_error(
                "the stream ended before the answer did (no finish reason, no [DONE])",
            ));
        }
        let completion = assembly.finish();
        Ok(ChatResponse {
            message: completion.message,
            finish_reason: completion.finish_reason,
            usage: completion.usage,
            model: completion.model,
            attempts,
        })
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
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

/// The JSON body of a chat-completions call.
fn request_body(request: &ChatRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), openai::to_values(&request.messages));
    if !request.tools.is_empty() {
        body.insert("tools".into(), Value::Array(request.tools.clone()));
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), json!(max_tokens));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    for (key, value) in &request.extra {
        body.insert(key.clone(), value.clone());
    }
    Value::Object(body)
}

/// A chat completion's assistant message and what came with it: the pieces shared by
/// [`OpenAiProvider`] and the pass-through's answer accumulator.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Completion {
    pub message: Message,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub model: Option<String>,
}

/// Why a `chat.completion` object could not be read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CompletionProblem {
    /// It has no choice with index 0.
    NoChoice,
    /// Its choice 0 has no message, or the message is malformed.
    Message(String),
}

impl std::fmt::Display for CompletionProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompletionProblem::NoChoice => write!(f, "no `choices[0]` in the answer"),
            CompletionProblem::Message(detail) => write!(f, "{detail}"),
        }
    }
}

/// Reads a (non-streamed) `chat.completion` object.
pub(crate) fn parse_completion(answer: &Value) -> Result<Completion, CompletionProblem> {
    let choice = first_choice(answer).ok_or(CompletionProblem::NoChoice)?;
    let message = choice.get("message").ok_or_else(|| {
        CompletionProblem::Message("no `choices[0].message` in the answer".to_owned())
    })?;
    let message = openai::parse_message(message)
        .map_err(|e| CompletionProblem::Message(format!("choices[0].message: {e}")))?;
    Ok(Completion {
        message,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        usage: answer.get("usage").and_then(parse_usage),
        model: answer
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// The choice with index 0 of a completion or a stream chunk (the only one unless the
/// request asked for `n > 1`); a choice without an `index` counts as index 0.
fn first_choice(object: &Value) -> Option<&Value> {
    object
        .get("choices")?
        .as_array()?
        .iter()
        .find(|choice| choice.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}

fn parse_usage(usage: &Value) -> Option<Usage> {
    Some(Usage::new(
        usage.get("prompt_tokens")?.as_u64()?,
        usage.get("completion_tokens")?.as_u64()?,
    ))
}

/// Why the `data` of a stream event could not be absorbed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ChunkProblem {
    /// The data is not JSON.
    NotJson { error: String, data: String },
    /// The chunk is an `{"error": ...}` object.
    Reported(String),
}

impl std::fmt::Display for ChunkProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkProblem::NotJson { error, data } => {
                write!(f, "a stream chunk is not JSON ({error}): {data}")
            }
            ChunkProblem::Reported(error) => write!(f, "the stream reported an error: {error}"),
        }
    }
}

/// A streamed reply put back together.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembly {
    text: String,
    reasoning: String,
    /// (id, name, arguments) by the index the stream gave.
    calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
    /// Whether any chunk carried choice 0.
    saw_choice: bool,
    /// Whether the `[DONE]` event came.
    done: bool,
}

impl StreamAssembly {
    /// Absorbs the `data` of one server-sent event: skips `[DONE]`, parses the chunk, and
    /// reports an `{"error": ...}` chunk as a problem.
    pub(crate) fn absorb_data(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), ChunkProblem> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| ChunkProblem::NotJson {
            error: e.to_string(),
            data: data.to_owned(),
        })?;
        if let Some(error) = chunk.get("error") {
            return Err(ChunkProblem::Reported(error.to_string()));
        }
        self.absorb(&chunk, on_delta);
        Ok(())
    }

    /// Whether the stream said its answer is complete: a finish reason or `[DONE]` came. A
    /// stream that stops before either was cut off, and what arrived is only part of the
    /// answer.
    pub(crate) fn ended(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    /// Whether any chunk carried choice 0 (a stream without one has no answer).
    pub(crate) fn saw_choice(&self) -> bool {
        self.saw_choice
    }

    fn absorb(&mut self, chunk: &Value, on_delta: &mut (dyn FnMut(StreamDelta) + Send)) {
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_owned());
        }
        if let Some(usage) = chunk.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        let Some(choice) = first_choice(chunk) else {
            return;
        };
        self.saw_choice = true;
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return;
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            self.text.push_str(text);
            on_delta(StreamDelta::Text(text.to_owned()));
        }
        for key in ["reasoning_content", "reasoning"] {
            if let Some(text) = delta.get(key).and_then(Value::as_str)
                && !text.is_empty()
            {
                self.reasoning.push_str(text);
                on_delta(StreamDelta::Reasoning(text.to_owned()));
            }
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .map_or(self.calls.len().saturating_sub(1), |i| i as usize);
            if self.calls.len() <= index {
                self.calls.resize(index + 1, Default::default());
            }
            let slot = &mut self.calls[index];
            let id = call.get("id").and_then(Value::as_str).map(str::to_owned);
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let arguments = function
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Some(id) = &id {
                slot.0 = id.clone();
            }
            if let Some(name) = &name {
                slot.1.push_str(name);
            }
            slot.2.push_str(&arguments);
            on_delta(StreamDelta::ToolCall {
                index,
                id,
                name,
                arguments,
            });
        }
    }

    /// The assembled reply.
    pub(crate) fn finish(self) -> Completion {
        let calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|(id, name, arguments)| ToolCall::new(id, name, arguments))
            .collect();
        let mut message = Message::assistant_tool_calls(calls);
        message.content = match (self.reasoning.is_empty(), self.text.is_empty()) {
            (true, true) if !message.tool_calls.is_empty() => None,
            (true, _) => Some(Content::Text(self.text.into())),
            (false, _) => Some(Content::Parts(vec![
                Part::reasoning(self.reasoning),
                Part::text(self.text),
            ])),
        };
        Completion {
            message,
            finish_reason: self.finish_reason,
            usage: self.usage,
            model: self.model,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_carries_every_setting() {
        let mut request = ChatRequest::new("gpt-4o", vec![Message::user("hi")]);
        request.max_tokens = Some(50);
        request.temperature = Some(0.0);
        request.extra.insert("seed".into(), json!(7));
        let body = request_body(&request, true);
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 50,
                "temperature": 0.0,
                "stream": true,
                "stream_options": {"include_usage": true},
                "seed": 7
            })
        );
    }

    #[test]
    fn stream_assembly_joins_parallel_tool_calls() {
        let chunks = [
            json!({"model": "m", "choices": [{"delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "search", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "fetch", "arguments": "{\"u"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":1}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": "\":2}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
        ];
        let mut assembly = StreamAssembly::default();
        let mut deltas = Vec::new();
        for chunk in &chunks {
            assembly.absorb(chunk, &mut |d| deltas.push(d));
        }
        let response = assembly.finish();
        assert_eq!(deltas.len(), 4);
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall::new("c1", "search", "{\"q\":1}"),
                ToolCall::new("c2", "fetch", "{\"u\":2}")
            ]
        );
        assert_eq!(response.message.content, None);
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(response.usage, Some(Usage::new(9, 4)));
    }
}
