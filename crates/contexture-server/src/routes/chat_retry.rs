//! A chat turn sent again with its `Idempotency-Key`. The first attempt's request record
//! carries the key (`KEY:request`) and the digest of the body it came with, and its answer the
//! key `KEY:answer`. A retry with the same body gets the stored answer back, without calling
//! the upstream or storing anything; a retry of an attempt that failed calls the upstream
//! again (its messages are stored once, by their own keys); the same key with another body is
//! refused before anything is stored. A retry while the first attempt is still being answered
//! answers 409; an attempt that never ended (its server stopped) is taken over once it is
//! older than `upstream.abandon_after_secs`.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use contexture_core::Message;
use contexture_core::format::openai;
use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, Usage};
use contexture_store::{KeyedEvent, NewEvent, Store};
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::keyed_turns::TurnClaim;
use crate::routes::threads::store_error;
use crate::tenancy::Tenant;

/// The header a replayed answer carries.
pub const REPLAYED_HEADER: &str = "x-contexture-replayed";

/// Where a keyed request stands.
pub enum Attempt {
    /// The key is new: this is the first attempt.
    First(TurnClaim),
    /// An earlier attempt with this body failed (or was abandoned): call the upstream again.
    Again(TurnClaim),
    /// An earlier attempt with this body was answered: this is its answer.
    Answered(Response),
}

/// The idempotency key of the request record of a keyed turn.
pub fn request_key(key: &str) -> String {
    format!("{key}:request")
}

/// The idempotency key of the answer of a keyed turn.
pub fn answer_key(key: &str) -> String {
    format!("{key}:answer")
}

/// The digest of a request body (after the thread's name was taken out of it, so the header
/// and the metadata spelling of one request agree).
pub fn digest(body: &Map<String, Value>) -> String {
    crate::auth::sha256_hex(&serde_json::to_vec(body).unwrap_or_default())
}

/// Where the turn keyed `key` with body digest `digest` stands in `thread`. A turn that is
/// answered here next comes with this server's claim on it, which the caller holds until
/// the answer is recorded.
pub async fn previous(
    state: &AppState,
    tenant: &Tenant,
    thread: &str,
    key: &str,
    digest: &str,
    stream: bool,
) -> ApiResult<Attempt> {
    let in_flight = || {
        ApiError::conflict(format!(
            "the request with Idempotency-Key `{key}` is still being answered; retry when it has ended"
        ))
    };
    let Some(claim) = state.keyed_turns.claim(thread, key) else {
        return Err(in_flight());
    };
    let first = state
        .store
        .keyed_event(thread, &request_key(key))
        .await
        .map_err(|error| store_error(tenant, error))?;
    let Some(KeyedEvent {
        event: first,
        appended_at_ms,
    }) = first
    else {
        return Ok(Attempt::First(claim));
    };
    let EventKind::RequestStarted(record) = &first.kind else {
        return Err(ApiError::conflict(format!(
            "Idempotency-Key `{key}` was used for something else in this thread; send a new key"
        )));
    };
    if record.client_digest.as_deref() != Some(digest) {
        return Err(ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "idempotency_key_reused",
            message: format!(
                "Idempotency-Key `{key}` was already used for another request in this thread; a retry must send the same body, a new request a new key"
            ),
            param: Some("Idempotency-Key".into()),
        });
    }
    let answer = state
        .store
        .keyed_event(thread, &answer_key(key))
        .await
        .map_err(|error| store_error(tenant, error))?;
    let later = state
        .store
        .events_after(thread, first.seq)
        .await
        .map_err(|error| store_error(tenant, error))?;
    let end = later.iter().find_map(|event| match &event.kind {
        EventKind::RequestEnded(end) if end.request_id == record.request_id => Some(end),
        _ => None,
    });
    match (answer, end) {
        (Some(answer), end) => {
            let EventKind::MessageAppended { message } = &answer.event.kind else {
                return Err(ApiError::conflict(format!(
                    "Idempotency-Key `{key}` was used for something else in this thread; send a new key"
                )));
            };
            let model = record.model.clone().unwrap_or_default();
            Ok(Attempt::Answered(replayed(message, end, &model, stream)))
        }
        (None, Some(end)) if end.outcome != RequestOutcome::Completed => Ok(Attempt::Again(claim)),
        (None, Some(_)) => Err(in_flight()),
        (None, None) => {
            // No server of this process answers it (the claim was free); another server
            // of a shared database may, until the attempt is too old for that.
            let abandon_after = state.config.upstream.abandon_after_secs;
            let age_secs = (now_ms() - appended_at_ms) as f64 / 1000.0;
            if age_secs < abandon_after {
                return Err(in_flight());
            }
            let mut end =
                RequestEnd::new(&record.request_id, RequestOutcome::Failed, Usage::default());
            end.error = Some(format!(
                "abandoned: no end was recorded within {abandon_after} s of its start (the server answering it stopped); a retry with its Idempotency-Key called again"
            ));
            state
                .store
                .append_one(thread, NewEvent::new(EventKind::RequestEnded(end)))
                .await
                .map_err(|error| store_error(tenant, error))?;
            Ok(Attempt::Again(claim))
        }
    }
}

/// This machine's clock, in milliseconds since the Unix epoch (as the stores record).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// The stored answer as the upstream would have sent it: a `chat.completion`, or for a
/// streaming client the same as one chunk and `[DONE]`.
fn replayed(message: &Message, end: Option<&RequestEnd>, model: &str, stream: bool) -> Response {
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
