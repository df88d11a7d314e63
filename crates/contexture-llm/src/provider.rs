//! The provider trait and the plain data of a chat call.

use std::future::Future;
use std::pin::Pin;

use contexture_core::Message;
use serde_json::{Map, Value};

use crate::error::LlmError;

/// A boxed future, so that providers can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One chat call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The model id as the provider names it.
    pub model: String,
    /// The messages, system prompt first. They should have passed the provider-rule
    /// validator (`contexture_core::fit::validate`).
    pub messages: Vec<Message>,
    /// Tool schemas in OpenAI's format (`{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    /// The most tokens the reply may use.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// More body fields, sent as they are (e.g. `top_p`, `seed`, `response_format`).
    pub extra: Map<String, Value>,
    /// The longest this call may take (each attempt, and any pause in a stream), in place of
    /// the provider's own timeout (`None`: the provider's). A compaction's summarizer calls
    /// set their policy's.
    pub timeout: Option<std::time::Duration>,
}

impl ChatRequest {
    /// A request for `model` with `messages` and nothing else set.
    pub fn new(model: impl Into<String>, messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: model.into(),
            messages,
            tools: Vec::new(),
            max_tokens: None,
            temperature: None,
            extra: Map::new(),
            timeout: None,
        }
    }
}

/// Token usage of one call, as the provider reported it (the engine's record of it).
pub use contexture_core::thread::Usage;

/// The answer to a chat call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The assistant message (text, tool calls, reasoning).
    pub message: Message,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, `end_turn`, ...).
    pub finish_reason: Option<String>,
    /// Provider-reported usage; `None` when the provider reported none.
    pub usage: Option<Usage>,
    /// The model that answered, as the provider named it.
    pub model: Option<String>,
    /// How many HTTP attempts the call took (1 when no retry was needed).
    pub attempts: u32,
}

/// A piece of a streamed reply, delivered as it arrives.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamDelta {
    /// More reply text.
    Text(String),
    /// More reasoning text.
    Reasoning(String),
    /// A tool call started or grew: `index` orders parallel calls; `arguments` is the new
    /// fragment of its JSON arguments.
    ToolCall {
        /// The call's position among the turn's calls.
        index: usize,
        /// The call's id, when this fragment carries it.
        id: Option<String>,
        /// The tool's name, when this fragment carries it.
        name: Option<String>,
        /// The new fragment of the arguments' JSON text.
        arguments: String,
    },
}

/// Something that answers chat calls.
pub trait Provider: Send + Sync {
    /// A short name for logs and errors (`openai`, `anthropic`, `scripted`).
    fn name(&self) -> &str;

    /// Sends `request` and waits for the whole reply.
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;

    /// Sends `request` with streaming: `on_delta` sees each piece as it arrives, and the
    /// assembled reply is returned at the end. A retry only happens before the first piece
    /// was delivered, so `on_delta` never sees a piece twice.
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_delta: &'a mut (dyn FnMut(StreamDelta) + Send),
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;
}
