//! The OpenAI-compatible endpoint. `POST /v1/chat/completions` with a thread (header
//! `X-Contexture-Thread`, or `metadata.contexture_thread` in the body) keeps the history for
//! the client: the turn is the engine's ([`ChatTurn`]: new messages stored, compaction, fit,
//! the request and its end recorded), and the fitted request is sent upstream in place of
//! the request's messages. The upstream's response (streamed chunk by chunk) goes back
//! unchanged. Without a thread the endpoint is a transparent proxy. `GET /v1/models` is the
//! upstream's list.

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use contexture_core::Message;
use contexture_core::format::openai;
use contexture_core::registry::ModelInfo;
use contexture_engine::chat::{
    Attempt, ChatError, ChatTurn, CompletionRecord, SHUT_DOWN, TurnRecorder, previous_attempt,
};
use contexture_llm::passthrough::{
    PassthroughError, UpstreamBody, UpstreamResponse, record_stream,
};
use contexture_store::{AnyStore, StoreError};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::fitting;
use crate::keyed_turns::TurnClaim;
use crate::routes::chat_retry;
use crate::routes::fresh_id;
use crate::routes::threads::{parse_messages, store_error};
use crate::tenancy::{Tenant, check_id};

/// The header that names the thread.
pub const THREAD_HEADER: &str = "x-contexture-thread";
/// The `metadata` key that names the thread.
pub const THREAD_METADATA_KEY: &str = "contexture_thread";

/// `POST /v1/chat/completions`.
pub async fn completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let key = crate::body::idempotency_key(&headers)?;
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    let (model, requested, tools) = parse_request(&body)?;
    let Some(thread) = thread_name(&headers, &mut body)? else {
        let response = forward(&state, &Value::Object(body)).await?;
        return Ok(passthrough_response(response, None));
    };
    check_id("the thread", &thread).map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
    check_one_choice(&body)?;
    let mut settings = fitting::settings(&state, &model, None, None, None)?;
    if let Some(tokens) = reply_budget(&body, &settings.model)? {
        settings.budget.reserve_output = Some(tokens);
    }
    let tenant = &caller.tenant;
    let scoped = tenant.scope(&thread);
    state.active_runs.refuse_writes(&scoped, &thread)?;

    // A retry of a keyed turn is answered from the thread, before anything is compared
    // with what the thread holds now (its first attempt is in there).
    let digest = key.as_ref().map(|_| chat_retry::chat_request_digest(&body));
    let (first_attempt, claim) = match (&key, &digest) {
        (Some(key), Some(digest)) => {
            let Some(claim) = state.keyed_turns.claim(&scoped, key) else {
                return Err(chat_error(tenant, ChatError::InFlight { key: key.clone() }));
            };
            let abandon_after = state.config.upstream.abandon_after_secs;
            let attempt =
                previous_attempt(&state.store, &scoped, key, digest, abandon_after, now_ms())
                    .await
                    .map_err(|error| chat_error(tenant, error))?;
            match attempt {
                Attempt::Answered(answer) => {
                    let stream = body.get("stream") == Some(&Value::Bool(true));
                    let response = chat_retry::replayed(&answer, stream);
                    return Ok(with_thread(response, &thread));
                }
                Attempt::First => (true, Some(claim)),
                Attempt::Again => (false, Some(claim)),
            }
        }
        _ => (false, None),
    };

    // The turn runs apart from the client's connection from here on: a client that goes
    // away does not cancel it halfway (its messages stored but never sent), nor the call and
    // its recording (the answer is stored, and a retry with the same Idempotency-Key gets
    // it); a shutdown waits for it.
    let tenant = tenant.clone();
    let guard = state.in_flight.enter();
    let call = tokio::spawn(async move {
        let _guard = guard;
        let turn = ChatTurn {
            store: &state.store,
            thread: &scoped,
            settings,
            tools,
            compaction: state
                .config
                .context
                .compaction
                .as_ref()
                .map(|policy| (policy, state.compactor.as_ref())),
            key: key.as_deref(),
            first_attempt,
            client_digest: digest,
        };
        let request_id = format!("{scoped}/chat-{}", fresh_id());
        let prepared = turn
            .prepare(requested, request_id)
            .await
            .map_err(|error| chat_error(&tenant, error))?;
        match &prepared.compaction {
            Some(Ok(outcome)) => state.metrics.compaction(outcome),
            Some(Err(error)) => {
                state.metrics.compaction_error();
                tracing::warn!(thread = %scoped, %error, "compaction failed; trimming instead");
            }
            None => {}
        }
        fitting::metered(&state, &prepared.fitted);
        body.insert(
            "messages".into(),
            openai::to_values(&prepared.fitted.messages),
        );
        let recorder = Recorder {
            turn: turn.recorder(&prepared),
            tenant,
            _claim: claim,
        };
        forward_and_record(state.clone(), body, recorder, thread).await
    });
    call.await
        .map_err(|error| ApiError::upstream(format!("the upstream call stopped: {error}")))?
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

/// A chat turn's refusal as the API answers it.
fn chat_error(tenant: &Tenant, error: ChatError) -> ApiError {
    match error {
        ChatError::Invalid { field, message } => ApiError::invalid(field, message),
        ChatError::Fit(error) => fitting::fit_error(error),
        ChatError::Store(error) => store_error(tenant, error),
        error @ ChatError::KeyReused { .. } => ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "idempotency_key_reused",
            message: error.to_string(),
            param: Some("Idempotency-Key".into()),
        },
        error @ (ChatError::KeyTaken { .. } | ChatError::InFlight { .. }) => {
            ApiError::conflict(error.to_string())
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

/// `response` with the thread's name in its header.
fn with_thread(mut response: Response, thread: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(thread) {
        response.headers_mut().insert(THREAD_HEADER, value);
    }
    response
}

/// Forwards a fitted chat request and records how it ended (for a stream, once it has
/// been passed through).
async fn forward_and_record(
    state: AppState,
    body: Map<String, Value>,
    recorder: Recorder,
    thread: String,
) -> ApiResult<Response> {
    let body = Value::Object(body);
    let forwarded = tokio::select! {
        forwarded = forward(&state, &body) => forwarded,
        () = state.in_flight.stopped() => {
            recorder.logged(recorder.turn.stopped().await);
            return Err(ApiError::unavailable(SHUT_DOWN));
        }
    };
    let response = match forwarded {
        Ok(response) => response,
        Err(error) => {
            recorder.logged(recorder.turn.failed(error.message.clone()).await);
            return Err(error);
        }
    };
    let ok = (200..300).contains(&response.status);
    let response = match response.body {
        UpstreamBody::Full(bytes) => {
            if ok {
                let record = recorder
                    .turn
                    .completion(&bytes)
                    .await
                    .map_err(|error| store_error(&recorder.tenant, error))?;
                if let CompletionRecord::Unreadable { recorded } = record {
                    recorder.logged(recorded);
                }
            } else {
                let error = format!("upstream answered {}", response.status);
                recorder.logged(recorder.turn.failed(error).await);
            }
            UpstreamResponse {
                body: UpstreamBody::Full(bytes),
                ..response
            }
        }
        UpstreamBody::Stream(stream) if ok => {
            let guard = state.in_flight.enter();
            // The response ends only once the answer is stored, so a client's next turn
            // always finds it in the thread.
            let (stored_tx, stored_rx) = tokio::sync::oneshot::channel::<()>();
            // A shutdown that stops waiting cuts the stream; its recording says so.
            let in_flight = state.in_flight.clone();
            let stream = stream.take_until(async move { in_flight.stopped().await });
            let stopping = state.in_flight.clone();
            let stream = record_stream(Box::pin(stream), move |outcome| {
                tokio::spawn(async move {
                    let _guard = guard;
                    let _stored = stored_tx;
                    let recorded = recorder
                        .turn
                        .stream_ended(outcome, stopping.is_stopping())
                        .await;
                    recorder.logged(recorded);
                });
            });
            let stored = futures_util::stream::once(async move {
                // Resolves when the recording task ends (its sender is dropped).
                let _ = stored_rx.await;
            })
            .filter_map(|()| async { None });
            UpstreamResponse {
                body: UpstreamBody::Stream(Box::pin(stream.chain(stored))),
                ..response
            }
        }
        UpstreamBody::Stream(stream) => {
            let error = format!("upstream answered {}", response.status);
            recorder.logged(recorder.turn.failed(error).await);
            UpstreamResponse {
                body: UpstreamBody::Stream(stream),
                ..response
            }
        }
    };
    Ok(passthrough_response(response, Some(&thread)))
}

/// Records how a chat request ended in its thread, holding this server's claim on a keyed
/// turn until its end is recorded.
struct Recorder {
    turn: TurnRecorder<AnyStore>,
    tenant: Tenant,
    _claim: Option<TurnClaim>,
}

impl Recorder {
    /// Logs a recording that failed: the call's response goes on regardless.
    fn logged(&self, recorded: Result<(), StoreError>) {
        if let Err(error) = recorded {
            tracing::error!(%error, tenant = %self.tenant.name(), "cannot record how a chat request ended");
        }
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

/// The reply budget the client asked for (`max_completion_tokens`, else `max_tokens`): it
/// is reserved when fitting, and a value the model cannot give is refused.
fn reply_budget(body: &Map<String, Value>, model: &ModelInfo) -> ApiResult<Option<u32>> {
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
        let most = u64::from(
            model
                .max_output_tokens
                .min(model.context_window.saturating_sub(1)),
        );
        if tokens > most {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{field}: {tokens} is more than model `{}` can answer with (at most {most} tokens)",
                    model.id
                ),
            ));
        }
        return Ok(Some(tokens as u32));
    }
    Ok(None)
}

async fn forward(state: &AppState, body: &Value) -> ApiResult<UpstreamResponse> {
    state
        .upstream
        .chat_completions(body)
        .await
        .map_err(|error| upstream_error(&error))
}

fn upstream_error(error: &PassthroughError) -> ApiError {
    // The error texts never hold the upstream key.
    tracing::warn!(%error, "upstream call failed");
    match error {
        PassthroughError::Timeout { .. } => ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            code: "upstream_timeout",
            message: error.to_string(),
            param: None,
        },
        _ => ApiError::upstream(error.to_string()),
    }
}

/// The upstream's response as it came (status, content type, body), plus the thread.
fn passthrough_response(response: UpstreamResponse, thread: Option<&str>) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = match response.body {
        UpstreamBody::Full(bytes) => Body::from(bytes),
        UpstreamBody::Stream(stream) => Body::from_stream(stream),
    };
    let mut out = (status, body).into_response();
    if let Some(content_type) = response
        .content_type
        .and_then(|value| HeaderValue::from_str(&value).ok())
    {
        out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    if let Some(thread) = thread.and_then(|thread| HeaderValue::from_str(thread).ok()) {
        out.headers_mut().insert(THREAD_HEADER, thread);
    }
    out
}

/// `GET /v1/models`: the upstream's list, as it answered.
pub async fn models(State(state): State<AppState>) -> ApiResult<Response> {
    let response = state
        .upstream
        .models()
        .await
        .map_err(|error| upstream_error(&error))?;
    Ok(passthrough_response(response, None))
}

#[cfg(test)]
mod tests {
    use super::*;

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
