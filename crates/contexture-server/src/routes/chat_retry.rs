//! A chat turn sent again with its `Idempotency-Key` (the engine's
//! `contexture_engine::chat::previous_attempt` tells where it stands): the digest a retry's
//! body must match, and the stored answer as the upstream would have sent it. A retry with
//! the same body gets the stored answer back, without calling the upstream or storing
//! anything; the same key with another body is refused before anything is stored.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use contexture_core::format::openai;
use contexture_engine::chat::StoredAnswer;
use serde_json::{Map, Value, json};

/// The header a replayed answer carries.
pub const REPLAYED_HEADER: &str = "x-contexture-replayed";

/// The digest of a request body (after the thread's name was taken out of it, so the header
/// and the metadata spelling of one request agree).
pub fn chat_request_digest(body: &Map<String, Value>) -> String {
    crate::auth::sha256_hex(&serde_json::to_vec(body).unwrap_or_default())
}

/// The stored answer as the upstream would have sent it: a `chat.completion`, or for a
/// streaming client the same as one chunk and `[DONE]`.
pub fn replayed(answer: &StoredAnswer, stream: bool) -> Response {
    let (message, end, model) = (&answer.message, answer.end.as_ref(), answer.model.as_str());
    let finish = end
        .and_then(|end| end.finish_reason.clone())
        .unwrap_or_else(|| {
            if message.tool_calls.is_empty() {
                "stop".into()
            } else {
                "tool_calls".into()
            }
        });
    let id = end.map_or_else(
        || "chatcmpl-replayed".to_owned(),
        |end| end.request_id.clone(),
    );
    let wire = openai::to_value(message);
    let mut response = if stream {
        let mut delta = wire.clone();
        if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (index, call) in calls.iter_mut().enumerate() {
                call["index"] = json!(index);
            }
        }
        let chunk = |delta: Value, finish: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let text = format!(
            "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            chunk(delta, Value::Null),
            chunk(json!({}), json!(finish))
        );
        (
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from(text),
        )
            .into_response()
    } else {
        let usage = end.map(|end| {
            json!({"prompt_tokens": end.usage.input_tokens, "completion_tokens": end.usage.output_tokens,
                   "total_tokens": end.usage.input_tokens + end.usage.output_tokens})
        });
        axum::Json(json!({
            "id": id, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": wire, "finish_reason": finish}],
            "usage": usage,
        }))
        .into_response()
    };
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}
