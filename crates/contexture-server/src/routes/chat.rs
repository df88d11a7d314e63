//! The OpenAI-compatible endpoint. `POST /v1/chat/completions` with a thread (header
//! `X-Contexture-Thread`, or `metadata.contexture_thread` in the body) keeps the history for
//! the client: the request's new messages are appended to the thread, the thread's
//! projection (compacted when the policy's trigger fires) is fitted to the model's window
//! and sent upstream in place of the request's messages, and the answer is appended. The
//! upstream's response (streamed chunk by chunk) goes back unchanged. Without a thread the
//! endpoint is a transparent proxy. `GET /v1/models` is the upstream's list.
//!
//! Which messages are new: the request may carry the whole conversation (as stateless
//! clients do) or only the new turn. Messages up to and including the last one equal to the
//! thread's last message are taken as already stored; the rest are new. A system message
//! that differs from the thread's system prompt replaces it.

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use contexture_core::format::openai;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::{
    EventKind, Projection, RecordedBudget, RequestEnd, RequestOutcome, RequestRecord, Usage,
};
use contexture_core::tokens::message_tokens;
use contexture_core::{Message, Role};
use contexture_engine::compaction::CompactRequest;
use contexture_engine::compaction::{CompactionOutcome, compact_stored};
use contexture_llm::passthrough::{
    Answer, PassthroughError, UpstreamBody, UpstreamResponse, record_stream,
};
use contexture_store::{NewEvent, Store};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::fitting::FitSettings;
use crate::keyed_turns::TurnClaim;
use crate::routes::chat_retry::{self, Attempt};
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
    // The request's shape is checked whatever its route, so a malformed one gets a 400 that
    // names the field here rather than whatever the upstream makes of it.
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
    let thread = thread_name(&headers, &mut body)?;
    let Some(thread) = thread else {
        let response = forward(&state, &Value::Object(body)).await?;
        return Ok(passthrough_response(response, None));
    };
    check_id("the thread", &thread).map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
    check_one_choice(&body)?;
    let mut settings = FitSettings::new(&state, &model, None, None, None)?;
    if let Some(tokens) = reply_budget(&body, &settings.model)? {
        settings.budget.reserve_output = Some(tokens);
    }
    let tenant = &caller.tenant;
    let scoped = tenant.scope(&thread);
    state.active_runs.refuse_writes(&scoped, &thread)?;

    // A retry of a keyed turn is answered from the thread, before anything is compared
    // with what the thread holds now (its first attempt is in there).
    let digest = key.as_ref().map(|_| chat_retry::digest(&body));
    let (first_attempt, claim) = match (&key, &digest) {
        (Some(key), Some(digest)) => {
            let stream = body.get("stream") == Some(&Value::Bool(true));
            match chat_retry::previous(&state, tenant, &scoped, key, digest, stream).await? {
                Attempt::Answered(mut response) => {
                    if let Ok(value) = HeaderValue::from_str(&thread) {
                        response.headers_mut().insert(THREAD_HEADER, value);
                    }
                    return Ok(response);
                }
                Attempt::First(claim) => (true, Some(claim)),
                Attempt::Again(claim) => (false, Some(claim)),
            }
        }
        _ => (false, None),
    };

    // 1. The new messages go into the thread before anything is sent upstream, so a failed
    //    call loses nothing the client said.
    // Only the thread's tail is read when it is long: fitting keeps the newest history, and
    // the new messages are told apart from the stored ones at its end.
    let compaction_tokens = state
        .config
        .context
        .compaction
        .as_ref()
        .and_then(|policy| policy.trigger.tokens)
        .map_or(0, |tokens| tokens.saturating_add(1));
    // The new turns are among the request's messages, and are kept whole.
    let own_tokens = requested
        .iter()
        .map(|message| u64::from(message_tokens(message, settings.model.counter.encoding())))
        .sum::<u64>();
    let stored = match settings
        .load(&state, &scoped, own_tokens, compaction_tokens)
        .await
    {
        Ok(tail) => tail.projection,
        Err(contexture_store::StoreError::NotFound { .. }) => Projection {
            context: "main".into(),
            system: None,
            messages: Vec::new(),
        },
        Err(error) => return Err(store_error(tenant, error)),
    };
    let new = new_messages(&stored, requested);
    check_tool_results(&stored, &new)?;
    // Fitting fails only on what it must keep (the system prompt, the new turns, the tools),
    // which compaction cannot shrink: a request that cannot fit is refused before anything
    // of it is stored.
    let (new_system, new_turns): (Vec<&Message>, Vec<&Message>) = new
        .iter()
        .partition(|message| message.role.is_system_like());
    let preview = Projection {
        context: stored.context.clone(),
        system: new_system
            .last()
            .map(|m| (*m).clone())
            .or_else(|| stored.system.clone()),
        messages: stored.messages.clone(),
    };
    let turns: Vec<Message> = new_turns.into_iter().cloned().collect();
    settings.fit_unmetered(&state, preview, &turns, &tools)?;
    let new_count = new.iter().filter(|m| !m.role.is_system_like()).count();
    if !new.is_empty() {
        let events = new
            .into_iter()
            .enumerate()
            .map(|(i, message)| {
                let event = NewEvent::new(EventKind::MessageAppended { message });
                match &key {
                    Some(key) => event.with_key(format!("{key}:{i}")),
                    None => event,
                }
            })
            .collect();
        state
            .store
            .append(&scoped, events)
            .await
            .map_err(|error| store_error(tenant, error))?;
    }

    // 2. Compaction, when the policy's trigger fires; a failure replaces nothing and the
    //    request is still trimmed to fit.
    let mut tail = settings
        .load(&state, &scoped, own_tokens, compaction_tokens)
        .await
        .map_err(|error| store_error(tenant, error))?;
    if let Some(policy) = &state.config.context.compaction {
        // A cut tail is over every token threshold, as the whole thread is.
        let tokens = u64::from(
            settings
                .model
                .counter
                .count_request(&tail.projection.to_messages(), &tools)
                .total,
        );
        if let Some(reason) = policy.trigger.fires(
            tokens,
            tail.projection.messages.len() + tail.unread,
            settings.model.context_window,
        ) {
            let request = CompactRequest::new(policy.clone(), reason);
            match compact_stored(&state.compactor, &state.store, &scoped, &request).await {
                Ok(report) => {
                    state.metrics.compaction(&report.outcome);
                    if matches!(report.outcome, CompactionOutcome::Compacted { .. }) {
                        tail = settings
                            .load(&state, &scoped, own_tokens, compaction_tokens)
                            .await
                            .map_err(|error| store_error(tenant, error))?;
                    }
                }
                Err(error) => {
                    state.metrics.compaction_error();
                    tracing::warn!(thread = %scoped, %error, "compaction failed; trimming instead");
                }
            }
        }
    }

    // 3. Fit: the request's new turns are kept whole, the rest of the history is trimmed.
    let split = tail.projection.messages.len().saturating_sub(new_count);
    let own = tail.projection.messages.split_off(split);
    let fitted = settings.fit_tail(&state, tail, &own, &tools)?;
    body.insert("messages".into(), openai::to_values(&fitted.messages));
    let request_id = format!("{scoped}/chat-{}", fresh_id());
    let record = RequestRecord {
        request_id: request_id.clone(),
        model: Some(model.clone()),
        messages: fitted.messages.clone(),
        budget: Some(RecordedBudget {
            context_window: fitted.limits.context_window,
            max_output_tokens: fitted.limits.reserve_output,
            input_tokens: fitted.breakdown.used,
        }),
        tools: tools.clone(),
        breakdown: Some(fitted.breakdown.clone()),
        fit: Some(fitted.fit.clone()),
        purpose: Some("chat".into()),
        client_digest: digest,
        ..RequestRecord::default()
    };
    let started = NewEvent::new(EventKind::RequestStarted(record));
    let started = match &key {
        Some(key) if first_attempt => started.with_key(chat_retry::request_key(key)),
        _ => started,
    };
    state
        .store
        .append_one(&scoped, started)
        .await
        .map_err(|error| store_error(tenant, error))?;

    // 4. Forward, then record the answer (for a stream, once it has been passed through).
    let recorder = Recorder {
        state: state.clone(),
        tenant: tenant.clone(),
        thread: scoped.clone(),
        request_id,
        answer_key: key.as_deref().map(chat_retry::answer_key),
        _claim: claim,
    };
    // The call and its recording run apart from the client's connection: a client that goes
    // away does not cancel them (the answer is stored, and a retry with the same
    // Idempotency-Key gets it), and a shutdown waits for them.
    let guard = state.in_flight.enter();
    let call = tokio::spawn(async move {
        let _guard = guard;
        forward_and_record(state, body, recorder, thread).await
    });
    call.await
        .map_err(|error| ApiError::upstream(format!("the upstream call stopped: {error}")))?
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
            recorder.stopped(None).await;
            return Err(ApiError::unavailable(SHUT_DOWN));
        }
    };
    let response = match forwarded {
        Ok(response) => response,
        Err(error) => {
            recorder.failed(error.message.clone()).await;
            return Err(error);
        }
    };
    let response = match response.body {
        UpstreamBody::Full(bytes) => {
            if (200..300).contains(&response.status) {
                match contexture_llm::passthrough::AnswerAccumulator::from_completion(&bytes) {
                    Ok(answer) => recorder.answered(answer).await?,
                    Err(error) => recorder.failed(error.to_string()).await,
                }
            } else {
                recorder
                    .failed(format!("upstream answered {}", response.status))
                    .await;
            }
            UpstreamResponse {
                body: UpstreamBody::Full(bytes),
                ..response
            }
        }
        UpstreamBody::Stream(stream) if (200..300).contains(&response.status) => {
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
                    if stopping.is_stopping() {
                        let partial = match outcome {
                            Ok(answer) => {
                                // It ended as the server stopped: whole, so it is kept.
                                if let Err(error) = recorder.answered(answer).await {
                                    tracing::error!(error = %error.message, "cannot record a streamed answer");
                                }
                                return;
                            }
                            Err(
                                PassthroughError::Interrupted { partial }
                                | PassthroughError::Truncated { partial },
                            ) => partial.map(|message| *message),
                            Err(_) => None,
                        };
                        recorder.stopped(partial).await;
                        return;
                    }
                    match outcome {
                        Ok(answer) => {
                            if let Err(error) = recorder.answered(answer).await {
                                tracing::error!(error = %error.message, "cannot record a streamed answer");
                            }
                        }
                        Err(PassthroughError::Interrupted { partial }) => {
                            recorder.interrupted(partial.map(|message| *message)).await;
                        }
                        Err(error @ PassthroughError::Truncated { .. }) => {
                            let text = error.to_string();
                            let PassthroughError::Truncated { partial } = error else {
                                unreachable!("matched above")
                            };
                            recorder
                                .cut_short(text, partial.map(|message| *message))
                                .await;
                        }
                        Err(error) => recorder.failed(error.to_string()).await,
                    }
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
            recorder
                .failed(format!("upstream answered {}", response.status))
                .await;
            UpstreamResponse {
                body: UpstreamBody::Stream(stream),
                ..response
            }
        }
    };
    Ok(passthrough_response(response, Some(&thread)))
}

/// Why a call the server's shutdown stopped ended.
const SHUT_DOWN: &str = "the server shut down before the answer ended";

/// Records how a chat request ended in its thread.
struct Recorder {
    state: AppState,
    tenant: Tenant,
    thread: String,
    request_id: String,
    /// The answer's idempotency key, for a turn sent with one.
    answer_key: Option<String>,
    /// This server's claim on a keyed turn, released once its end is recorded.
    _claim: Option<TurnClaim>,
}

impl Recorder {
    /// The answer: the request's end and the assistant message, in one transaction.
    async fn answered(&self, answer: Answer) -> ApiResult<()> {
        let usage = answer
            .usage
            .map(|usage| Usage::new(usage.prompt_tokens, usage.completion_tokens))
            .unwrap_or_default();
        let mut end = RequestEnd::new(&self.request_id, RequestOutcome::Completed, usage);
        end.usage_estimated = answer.usage.is_none();
        end.finish_reason = answer.finish_reason.clone();
        let answer = NewEvent::new(EventKind::MessageAppended {
            message: answer.message,
        });
        let answer = match &self.answer_key {
            Some(key) => answer.with_key(key.clone()),
            None => answer,
        };
        let events = vec![NewEvent::new(EventKind::RequestEnded(end)), answer];
        self.state
            .store
            .append(&self.thread, events)
            .await
            .map(|_| ())
            .map_err(|error| store_error(&self.tenant, error))
    }

    /// A failed call: recorded, and nothing appended to the conversation.
    async fn failed(&self, error: String) {
        let mut end = RequestEnd::new(&self.request_id, RequestOutcome::Failed, Usage::default());
        end.error = Some(error);
        self.end(end).await;
    }

    /// A streamed answer whose client went away before it ended: recorded as cancelled with
    /// what had arrived of it, and nothing appended to the conversation (the client never
    /// saw the whole answer).
    async fn interrupted(&self, partial: Option<Message>) {
        let mut end = RequestEnd::new(
            &self.request_id,
            RequestOutcome::Cancelled,
            Usage::default(),
        );
        end.error = Some("the client went away before the streamed answer ended".into());
        end.reply = partial;
        self.end(end).await;
    }

    /// A call the server's shutdown stopped: recorded as cancelled with what had arrived,
    /// and nothing appended to the conversation.
    async fn stopped(&self, partial: Option<Message>) {
        let mut end = RequestEnd::new(
            &self.request_id,
            RequestOutcome::Cancelled,
            Usage::default(),
        );
        end.error = Some(SHUT_DOWN.into());
        end.reply = partial;
        self.end(end).await;
    }

    /// A streamed answer the upstream ended early: recorded as failed with what had
    /// arrived, and nothing appended to the conversation.
    async fn cut_short(&self, error: String, partial: Option<Message>) {
        let mut end = RequestEnd::new(&self.request_id, RequestOutcome::Failed, Usage::default());
        end.error = Some(error);
        end.reply = partial;
        self.end(end).await;
    }

    async fn end(&self, end: RequestEnd) {
        if let Err(error) = self
            .state
            .store
            .append_one(&self.thread, NewEvent::new(EventKind::RequestEnded(end)))
            .await
        {
            tracing::error!(%error, thread = %self.thread, "cannot record how a chat request ended");
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

/// Every tool result among the new messages answers a tool call that is still open: one the
/// thread's messages or an earlier new message made and nothing answered yet. A result that
/// answers nothing would be stored and then left out of every request.
fn check_tool_results(stored: &Projection, new: &[Message]) -> ApiResult<()> {
    let mut open: Vec<&str> = Vec::new();
    for message in &stored.messages {
        open.extend(message.tool_calls.iter().map(|call| call.id.as_str()));
        if let Some(id) = &message.tool_call_id {
            open.retain(|open| open != id);
        }
    }
    for message in new {
        open.extend(message.tool_calls.iter().map(|call| call.id.as_str()));
        if message.role != Role::Tool {
            continue;
        }
        let Some(id) = message.tool_call_id.as_deref() else {
            return Err(ApiError::invalid(
                "messages",
                "messages: a tool message needs `tool_call_id`, the id of the call it answers",
            ));
        };
        match open.iter().position(|open| *open == id) {
            Some(at) => {
                open.remove(at);
            }
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "messages: the tool message for call `{id}` answers no open tool call: no assistant message in the thread or the request made it, or it was answered already"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Two messages are the same turn when they serialize alike in the OpenAI format.
fn same_turn(a: &Message, b: &Message) -> bool {
    a.role == b.role && openai::to_value(a) == openai::to_value(b)
}

/// The request's messages that the thread does not hold yet (see the module docs).
fn new_messages(stored: &Projection, requested: Vec<Message>) -> Vec<Message> {
    let (system, turns): (Vec<Message>, Vec<Message>) = requested
        .into_iter()
        .partition(|message| message.role.is_system_like());
    let mut new = Vec::new();
    if let Some(system) = system.into_iter().last()
        && !stored
            .system
            .as_ref()
            .is_some_and(|current| same_turn(current, &system))
    {
        new.push(system);
    }
    let start = match stored.messages.last() {
        Some(last) => turns
            .iter()
            .rposition(|message| same_turn(message, last))
            .map_or(0, |at| at + 1),
        None => 0,
    };
    new.extend(turns.into_iter().skip(start));
    new
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

    fn projection(system: Option<&str>, messages: Vec<Message>) -> Projection {
        Projection {
            context: "main".into(),
            system: system.map(Message::system),
            messages,
        }
    }

    #[test]
    fn a_resent_history_adds_only_its_new_turns() {
        let stored = projection(
            Some("Be brief."),
            vec![Message::user("Hi"), Message::assistant("Hello!")],
        );
        let full = vec![
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("What is 2+2?"),
        ];
        let new = new_messages(&stored, full);
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].text(), "What is 2+2?");
        // Only the new turn: all of it is new.
        let new = new_messages(&stored, vec![Message::user("And 3+3?")]);
        assert_eq!(new.len(), 1);
        // A different system prompt replaces the thread's.
        let new = new_messages(
            &stored,
            vec![Message::system("Be verbose."), Message::user("Hi again")],
        );
        assert_eq!(new.len(), 2);
        assert!(new[0].role.is_system_like());
        // An empty thread takes everything.
        assert_eq!(
            new_messages(
                &projection(None, vec![]),
                vec![Message::user("a"), Message::assistant("b")]
            )
            .len(),
            2
        );
    }

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
