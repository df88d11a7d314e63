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
use contexture_core::format::openai;
use contexture_engine::chat::{
    Attempt, ChatError, ChatTurn, CompletionRecord, SHUT_DOWN, TurnRecorder, previous_attempt,
};
use contexture_engine::fitting::{FitSettings, ReplyReserveError};
use contexture_engine::turns::TurnLease;
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
use crate::quota::Slot;
use crate::routes::chat_request::{ChatRequest, THREAD_HEADER, ThreadedRequest, reply_budget};
use crate::routes::chat_retry;
use crate::routes::fresh_id;
use crate::tenancy::Tenant;
use crate::tenant_store::TenantStore;

/// `POST /v1/chat/completions`.
pub async fn completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let key = crate::body::idempotency_key(&headers)?;
    let request = ChatRequest::parse(&headers, body)?;
    // Held until the completion ends (its answer recorded, its stream passed through): a
    // tenant's completions in flight are bounded, so one tenant cannot hold every upstream
    // connection and every waiting place.
    let slot = state.chat_turns.take(caller.tenant.name())?;
    let request = match request {
        ChatRequest::Passthrough(body) => {
            let response = forward(&state, &body).await?;
            return Ok(passthrough_response(holding(response, slot), None));
        }
        ChatRequest::Threaded(request) => request,
    };
    let mut settings = fitting::settings(
        &state,
        &caller.tenant,
        &request.model,
        None,
        None,
        None,
        None,
    )
    .await?;
    if let Some((field, tokens)) = reply_budget(&request.body)? {
        settings
            .reserve_for_reply(tokens)
            .map_err(|error| match error {
                ReplyReserveError::OutOfRange { .. } => {
                    ApiError::invalid(field, format!("{field}: {error}"))
                }
                ReplyReserveError::Budget(error) => ApiError::invalid(field, error.to_string()),
            })?;
    }
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&request.thread)?;
    // A retry of a keyed turn this server is answering is refused at once, not queued
    // behind itself.
    let claim = match &key {
        Some(key) => Some(claim_keyed(&state, threads, &request, key)?),
        None => None,
    };
    // Turns on one thread run one at a time, in the order they arrived; a turn that waits
    // too long is refused with nothing stored. Waiting writes nothing to the thread, so a
    // client that leaves meanwhile only gives up its place.
    let lease = threads
        .wait_for_turn(
            &state.turns,
            &request.thread,
            state.config.limits.thread_turn_wait(),
        )
        .await?;
    let keyed = match (key, claim) {
        (Some(key), Some(claim)) => {
            match keyed_attempt(&state, threads, &request, key, claim).await? {
                KeyedAttempt::Answered(response) => return Ok(response),
                KeyedAttempt::Claimed(claimed) => Some(claimed),
            }
        }
        _ => None,
    };
    // The turn runs apart from the client's connection from here on: a client that goes
    // away does not cancel it halfway (its messages stored but never sent), nor the call and
    // its recording (the answer is stored, and a retry with the same Idempotency-Key gets
    // it); a shutdown waits for it.
    let guard = state.in_flight.enter();
    let turn = tokio::spawn(async move {
        let _guard = guard;
        run_turn(state, caller.tenant, request, settings, keyed, lease, slot).await
    });
    turn.await
        .map_err(|error| ApiError::upstream(format!("the upstream call stopped: {error}")))?
}

/// Where a keyed turn stands.
enum KeyedAttempt {
    /// Its answer is stored: the response replays it.
    Answered(Response),
    /// This server answers it now.
    Claimed(KeyedClaim),
}

/// This server's claim on a keyed turn, and what the turn records of its key.
struct KeyedClaim {
    key: String,
    digest: String,
    first_attempt: bool,
    claim: TurnClaim,
}

/// This server's claim on the keyed turn `key`: refused while this server answers it.
fn claim_keyed(
    state: &AppState,
    threads: TenantStore<'_>,
    request: &ThreadedRequest,
    key: &str,
) -> ApiResult<TurnClaim> {
    let scoped = threads.stored_id(&request.thread);
    state.keyed_turns.claim(&scoped, key).ok_or_else(|| {
        chat_error(
            threads,
            ChatError::InFlight {
                key: key.to_owned(),
            },
        )
    })
}

/// A retry of a keyed turn is answered from the thread, before anything is compared with
/// what the thread holds now (its first attempt is in there). Called holding the thread,
/// so an attempt answered by another server while this one waited is found answered.
async fn keyed_attempt(
    state: &AppState,
    threads: TenantStore<'_>,
    request: &ThreadedRequest,
    key: String,
    claim: TurnClaim,
) -> ApiResult<KeyedAttempt> {
    let scoped = threads.stored_id(&request.thread);
    let digest = chat_retry::chat_request_digest(&request.body);
    let abandon_after = state.config.upstream.abandon_after_secs;
    let attempt = previous_attempt(
        threads.store(),
        &scoped,
        &key,
        &digest,
        abandon_after,
        now_ms(),
    )
    .await
    .map_err(|error| chat_error(threads, error))?;
    let first_attempt = match attempt {
        Attempt::Answered(answer) => {
            let response = chat_retry::replayed(&answer, request.stream());
            return Ok(KeyedAttempt::Answered(with_thread(
                response,
                &request.thread,
            )));
        }
        Attempt::First => true,
        Attempt::Again => false,
    };
    Ok(KeyedAttempt::Claimed(KeyedClaim {
        key,
        digest,
        first_attempt,
        claim,
    }))
}

/// The engine's chat turn for a checked request: its request prepared and recorded, sent
/// upstream, and its end recorded.
async fn run_turn(
    state: AppState,
    tenant: Tenant,
    request: ThreadedRequest,
    settings: FitSettings,
    keyed: Option<KeyedClaim>,
    lease: TurnLease,
    slot: Slot,
) -> ApiResult<Response> {
    let threads = state.tenant_store(&tenant);
    let scoped = threads.stored_id(&request.thread);
    let ThreadedRequest {
        thread,
        requested,
        tools,
        response_format,
        mut body,
        ..
    } = request;
    let (key, digest, first_attempt, claim) = match keyed {
        Some(keyed) => (
            Some(keyed.key),
            Some(keyed.digest),
            keyed.first_attempt,
            Some(keyed.claim),
        ),
        None => (None, None, false, None),
    };
    let turn = ChatTurn {
        store: threads.store(),
        thread: &scoped,
        settings,
        tools,
        response_format,
        compaction: state.config.compaction.as_ref(),
        compactor: state.compactor.as_ref(),
        key: key.as_deref(),
        first_attempt,
        client_digest: digest,
        learner: fitting::learner(&tenant),
        cpu: Some((state.cpu.as_ref(), tenant.name().to_owned())),
    };
    let request_id = format!("{scoped}/chat-{}", fresh_id());
    // A shutdown past its grace stops the turn here too (a compaction's calls included);
    // what it left in flight is ended by the thread's next turn.
    let prepared = tokio::select! {
        prepared = turn.prepare(requested, request_id, lease) => prepared,
        () = state.in_flight.stopped() => return Err(ApiError::unavailable(SHUT_DOWN)),
    };
    let prepared = prepared.map_err(|error| chat_error(threads, error))?;
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
        tenant: tenant.clone(),
        _claim: claim,
        _slot: slot,
    };
    forward_and_record(state.clone(), body, recorder, thread).await
}

/// A chat turn's refusal as the API answers it.
fn chat_error(threads: TenantStore<'_>, error: ChatError) -> ApiError {
    match error {
        ChatError::Invalid { field, message } => ApiError::invalid(field, message),
        ChatError::Fit(error) => fitting::fit_error(error),
        ChatError::Store(error) => threads.error(error),
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
                    .map_err(|error| state.tenant_store(&recorder.tenant).error(error))?;
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
/// turn and the tenant's slot until its end is recorded.
struct Recorder {
    turn: TurnRecorder<AnyStore>,
    tenant: Tenant,
    _claim: Option<TurnClaim>,
    _slot: Slot,
}

/// `response` holding `slot` until its body has been sent (or dropped).
fn holding(response: UpstreamResponse, slot: Slot) -> UpstreamResponse {
    match response.body {
        UpstreamBody::Stream(stream) => UpstreamResponse {
            body: UpstreamBody::Stream(Box::pin(stream.map(move |chunk| {
                let _held = &slot;
                chunk
            }))),
            ..response
        },
        body @ UpstreamBody::Full(_) => UpstreamResponse { body, ..response },
    }
}

impl Recorder {
    /// Logs a recording that failed: the call's response goes on regardless.
    fn logged(&self, recorded: Result<(), StoreError>) {
        if let Err(error) = recorded {
            tracing::error!(%error, tenant = %self.tenant.name(), "cannot record how a chat request ended");
        }
    }
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
