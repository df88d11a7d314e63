//! An OpenAI-style chat request as the chat endpoint reads it: the body as the core reads
//! it (a malformed field is a 400 naming it, rather than whatever the upstream makes of it)
//! and the thread it names (header or metadata).

use axum::http::HeaderMap;
use contexture_core::format::openai_request::{ChatBody, read_chat_body};
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::tenancy::check_id;

/// The header that names the thread.
pub const THREAD_HEADER: &str = "x-contexture-thread";
/// The `metadata` key that names the thread.
pub const THREAD_METADATA_KEY: &str = "contexture_thread";

/// A `/v1/chat/completions` request, checked: forwarded as it is, or a turn of a thread.
pub(crate) enum ChatCompletionsCall {
    /// No thread: forwarded as it came.
    Passthrough(Value),
    /// A turn of a thread.
    Threaded(Box<ThreadedRequest>),
}

/// A chat request that names a thread.
pub(crate) struct ThreadedRequest {
    /// The client's thread id.
    pub thread: String,
    /// The body, read.
    pub read: ChatBody,
    /// The body to forward (without the thread's name; its messages are replaced by the
    /// fitted request's).
    pub body: Map<String, Value>,
}

impl ChatCompletionsCall {
    /// Checks a request body; `headers` may name the thread.
    pub fn parse(headers: &HeaderMap, body: Value) -> ApiResult<ChatCompletionsCall> {
        let Value::Object(mut body) = body else {
            return Err(ApiError::invalid("body", "the body must be a JSON object"));
        };
        let read =
            read_chat_body(&body).map_err(|error| ApiError::invalid(error.field, error.message))?;
        let Some(thread) = thread_name(headers, &mut body)? else {
            return Ok(ChatCompletionsCall::Passthrough(Value::Object(body)));
        };
        check_id("the thread", &thread)
            .map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
        Ok(ChatCompletionsCall::Threaded(Box::new(ThreadedRequest {
            thread,
            read,
            body,
        })))
    }
}

/// The thread a request names, taken out of `metadata` (which is forwarded without it).
fn thread_name(headers: &HeaderMap, body: &mut Map<String, Value>) -> ApiResult<Option<String>> {
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
