//! An OpenAI-style chat request as the chat endpoint reads it: the body as the core reads
//! it (a malformed field is a 400 naming it, rather than whatever the upstream makes of it)
//! and the thread it names (header or metadata).

use axum::http::HeaderMap;
use contexture_core::Message;
use contexture_core::format::openai_request::{ChatBody, read_chat_body};
use contexture_llm::wire::{ChatCall, ClientFormat, ClientRequest};
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::tenancy::check_id;

/// The header that names the thread.
pub const THREAD_HEADER: &str = "x-contexture-thread";
/// The `metadata` key that names the thread.
pub const THREAD_METADATA_KEY: &str = "contexture_thread";

/// A `/v1/chat/completions` request, checked and read into the engine's wire-neutral call.
pub(crate) struct ChatCompletionsCall {
    /// The thread it names, when it names one (without one it is passed through).
    pub thread: Option<String>,
    /// Its messages.
    pub messages: Vec<Message>,
    /// The call: the parameters every upstream reads, and the body as it came (without the
    /// thread's name).
    pub call: ChatCall,
    /// The reply budget asked for, with the field that gave it.
    pub reply_budget: Option<(&'static str, u64)>,
    /// The choices asked for (`n`), when given.
    pub choices: Option<u64>,
}

impl ChatCompletionsCall {
    /// Checks a request body; `headers` may name the thread.
    pub fn parse(headers: &HeaderMap, body: Value) -> ApiResult<ChatCompletionsCall> {
        let Value::Object(mut body) = body else {
            return Err(ApiError::invalid("body", "the body must be a JSON object"));
        };
        let read: ChatBody =
            read_chat_body(&body).map_err(|error| ApiError::invalid(error.field, error.message))?;
        let thread = thread_name(headers, &mut body)?;
        if let Some(thread) = &thread {
            check_id("the thread", thread)
                .map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
        }
        Ok(ChatCompletionsCall {
            thread,
            messages: read.messages,
            call: ChatCall {
                model: read.model,
                tools: read.tools,
                response_format: read.response_format,
                max_tokens: read.reply_budget.map(|(_, tokens)| tokens),
                stream: read.stream,
                client: ClientRequest {
                    format: ClientFormat::OPENAI_CHAT,
                    body,
                },
            },
            reply_budget: read.reply_budget,
            choices: read.choices,
        })
    }
}

/// The thread a request names, taken out of `metadata` (which is forwarded without it).
pub(crate) fn thread_name(
    headers: &HeaderMap,
    body: &mut Map<String, Value>,
) -> ApiResult<Option<String>> {
    let from_metadata = match body.get_mut("metadata") {
        Some(Value::Object(metadata)) => {
            let name = metadata.remove(THREAD_METADATA_KEY);
            let empty = metadata.is_empty();
            if empty {
                body.remove("metadata");
            }
            match name {
                Some(Value::String(name)) => Some(name),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "metadata.contexture_thread",
                        "metadata.contexture_thread: must be a string",
                    ));
                }
                None => None,
            }
        }
        _ => None,
    };
    let from_header = match headers.get(THREAD_HEADER) {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| {
                    ApiError::invalid(THREAD_HEADER, "X-Contexture-Thread must be visible ASCII")
                })?
                .to_owned(),
        ),
        None => None,
    };
    match (from_header, from_metadata) {
        (Some(a), Some(b)) if a != b => Err(ApiError::invalid(
            THREAD_HEADER,
            format!("the header names thread `{a}` and metadata.contexture_thread `{b}`"),
        )),
        (Some(name), _) | (None, Some(name)) => Ok(Some(name)),
        (None, None) => Ok(None),
    }
}
