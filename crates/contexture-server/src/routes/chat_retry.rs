//! A chat turn sent again with its `Idempotency-Key` (the engine's
//! `contexture_engine::chat::previous_attempt` tells where it stands): the digest a retry's
//! body must match, and the stored answer as the upstream would have sent it. A retry with
//! the same body gets the stored answer back, without calling the upstream or storing
//! anything; the same key with another body is refused before anything is stored.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use contexture_core::format::openai_completion;
use contexture_engine::chat::StoredAnswer;
use serde_json::{Map, Value};

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
    let answer = answer.completion();
    let mut response = if stream {
        (
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from(openai_completion::completion_stream(&answer)),
        )
            .into_response()
    } else {
        axum::Json(openai_completion::completion(&answer)).into_response()
    };
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}
