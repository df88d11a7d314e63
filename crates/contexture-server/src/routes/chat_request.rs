//! The shape of an OpenAI-style chat request as the chat endpoint reads it: the model, the
//! messages and tools, the thread it names (header or metadata), and the fields the server
//! acts on, each checked so a malformed request gets a 400 that names the field here rather
//! than whatever the upstream makes of it.

use axum::http::HeaderMap;
use contexture_core::Message;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::routes::threads::parse_messages;
use crate::tenancy::check_id;

/// The header that names the thread.
pub const THREAD_HEADER: &str = "x-contexture-thread";
/// The `metadata` key that names the thread.
pub const THREAD_METADATA_KEY: &str = "contexture_thread";

/// A chat request, checked.
pub(crate) enum ChatRequest {
    /// No thread: forwarded as it came.
    Passthrough(Value),
    /// A turn of a thread.
    Threaded(ThreadedRequest),
}

/// A chat request that names a thread.
pub(crate) struct ThreadedRequest {
    /// The client's thread id.
    pub thread: String,
    /// The model asked for.
    pub model: String,
    /// The messages the client sent (the thread's history and the new ones).
    pub requested: Vec<Message>,
    /// The tool schemas sent with the request.
    pub tools: Vec<Value>,
    /// The structured-output schema sent with the request (`response_format`), which the
    /// provider counts in the request's tokens.
    pub response_format: Option<Value>,
    /// The body to forward (without the thread's name; its messages are replaced by the
    /// fitted request's).
    pub body: Map<String, Value>,
}

impl ThreadedRequest {
    /// True when the client asked for a stream.
    pub fn stream(&self) -> bool {
        self.body.get("stream") == Some(&Value::Bool(true))
    }
}

impl ChatRequest {
    /// Checks a request body; `headers` may name the thread.
    pub fn parse(headers: &HeaderMap, body: Value) -> ApiResult<ChatRequest> {
        let Value::Object(mut body) = body else {
            return Err(ApiError::invalid("body", "the body must be a JSON object"));
        };
        let (model, requested, tools) = parse_request(&body)?;
        let Some(thread) = thread_name(headers, &mut body)? else {
            return Ok(ChatRequest::Passthrough(Value::Object(body)));
        };
        check_id("the thread", &thread)
            .map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
        check_one_choice(&body)?;
        let response_format = body
            .get("response_format")
            .filter(|v| !v.is_null())
            .cloned();
        Ok(ChatRequest::Threaded(ThreadedRequest {
            thread,
            model,
            requested,
            tools,
            response_format,
            body,
        }))
    }
}

/// The request's model, messages and tools, and the shape of the fields the server reads,
/// checked whatever the route, so a malformed request gets a 400 that names the field here
/// rather than whatever the upstream makes of it.
fn parse_request(body: &Map<String, Value>) -> ApiResult<(String, Vec<Message>, Vec<Value>)> {
    let model = match body.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        Some(Value::String(_)) => return Err(ApiError::invalid("model", "model: is empty")),
        Some(_) => return Err(ApiError::invalid("model", "model: must be a string")),
        None => return Err(ApiError::invalid("model", "model: missing")),
    };
    let requested = parse_messages(body.get("messages").unwrap_or(&Value::Null), "messages")?;
    let tools: Vec<Value> = match body.get("tools") {
        Some(Value::Array(tools)) => tools.clone(),
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(ApiError::invalid("tools", "tools: must be an array")),
    };
    let positive = |value: &Value| value.as_u64().is_some_and(|n| n >= 1);
    for (field, expected, fits) in [
        (
            "stream",
            "a boolean",
            &Value::is_boolean as &dyn Fn(&Value) -> bool,
        ),
        ("metadata", "an object", &Value::is_object),
        ("response_format", "an object", &Value::is_object),
        ("n", "a whole number above 0", &positive),
        ("max_tokens", "a whole number above 0", &positive),
        ("max_completion_tokens", "a whole number above 0", &positive),
    ] {
        if let Some(value) = body.get(field)
            && !value.is_null()
            && !fits(value)
        {
            return Err(ApiError::invalid(
                field,
                format!("{field}: must be {expected}"),
            ));
        }
    }
    Ok((model, requested, tools))
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

/// A thread keeps one answer per turn, so a request for several choices is refused rather
/// than keeping one of them silently (a client that went on with another would find a
/// history it never saw).
fn check_one_choice(body: &Map<String, Value>) -> ApiResult<()> {
    match body.get("n") {
        None | Some(Value::Null) => Ok(()),
        Some(n) if n.as_u64() == Some(1) => Ok(()),
        Some(n) => Err(ApiError::invalid(
            "n",
            format!(
                "n: a thread keeps one answer per turn, so only n = 1 is accepted with a thread (not {n}); ask for several choices without a thread"
            ),
        )),
    }
}

/// The reply budget the client asked for (`max_completion_tokens`, else `max_tokens`) and
/// the field that gave it: a whole number above 0. (Whether the model can answer with that
/// many is the fit settings' rule.)
pub(crate) fn reply_budget(body: &Map<String, Value>) -> ApiResult<Option<(&'static str, u64)>> {
    for field in ["max_completion_tokens", "max_tokens"] {
        let Some(value) = body.get(field).filter(|value| !value.is_null()) else {
            continue;
        };
        let tokens = value
            .as_u64()
            .filter(|tokens| *tokens >= 1)
            .ok_or_else(|| {
                ApiError::invalid(
                    field,
                    format!("{field}: must be a whole number above 0, not {value}"),
                )
            })?;
        return Ok(Some((field, tokens)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    #[test]
    fn the_thread_comes_from_the_header_or_the_metadata() {
        let mut headers = HeaderMap::new();
        let mut body: Map<String, Value> =
            serde_json::from_str(r#"{"metadata": {"contexture_thread": "t1"}, "model": "m"}"#)
                .unwrap();
        assert_eq!(
            thread_name(&headers, &mut body).unwrap().as_deref(),
            Some("t1")
        );
        assert!(!body.contains_key("metadata"), "forwarded without our key");
        headers.insert(THREAD_HEADER, HeaderValue::from_static("t2"));
        let mut body: Map<String, Value> =
            serde_json::from_str(r#"{"metadata": {"contexture_thread": "t1", "user": "u"}}"#)
                .unwrap();
        let error = thread_name(&headers, &mut body).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        let mut body = Map::new();
        assert_eq!(
            thread_name(&headers, &mut body).unwrap().as_deref(),
            Some("t2")
        );
    }
}
