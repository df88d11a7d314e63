//! The OpenAI Responses door: `POST /v1/responses` is read into the engine's chat turn
//! ([`ChatService::turn`]) and its answer written as a `response` object (or its stream of
//! events); `GET /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` read a stored
//! response back from its thread.
//!
//! State lives in threads. A request that names neither `previous_response_id` nor
//! `conversation` starts a new thread; `previous_response_id` continues from the response it
//! names (on a branch of its thread when the thread went on past it); `conversation` names a
//! thread. `instructions` are the call's own; `store: false` keeps nothing.
//!
//! [`ChatService::turn`]: contexture_engine::chat_service::ChatService::turn

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use contexture_core::Message;
use contexture_core::format::responses_answer::{ResponseStatus, listed_item};
use contexture_core::format::responses_stream::ResponseStream;
use contexture_core::format::{AnswerPieces, responses};
use contexture_core::thread::RequestOutcome;
use contexture_engine::chat::{ChatError, RecordedTurn, TurnInput};
use contexture_engine::chat_service::{TurnAnswer, TurnError, TurnPlace, TurnRequest};
use contexture_engine::fitting::FitError;
use contexture_llm::passthrough::{
    AnswerAccumulator, PassthroughError, UpstreamBody, UpstreamResponse, UpstreamStream,
};
use serde_json::{Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::{JsonBody, QueryParams};
use crate::error::{ApiError, ApiResult};
use crate::routes::chat::{REPLAYED_HEADER, chat_request_digest, turn_error};
use crate::routes::conversations::{ItemsQuery, items_page};
use crate::routes::responses_call::{
    ResponseFacts, ResponseId, ResponsesCall, continued_by_items, id_seed, new_token, no_response,
};
use crate::routes::translation::{answer_to_write, translated_stream};
use crate::tenant_store::TenantStore;

/// `POST /v1/responses`: read, run as the engine's chat turn, written as a response.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let key = crate::body::idempotency_key(&headers)?;
    let tenant = &caller.tenant;
    let threads = state.tenant_store(tenant);
    let mut request = ResponsesCall::parse(body, now_secs())?;
    let (thread, continues) = match (&request.previous, &request.read.conversation) {
        (Some(previous), _) => (previous.thread.clone(), Some(previous.request_seq)),
        (None, Some(conversation)) => {
            if !threads.exists(conversation).await? {
                return Err(ApiError::not_found("conversation", conversation));
            }
            (conversation.clone(), None)
        }
        (None, None) => match implicitly_continued(&threads, &request.read.input).await? {
            Some((at, previous)) => {
                request.read.input = after_continued(std::mem::take(&mut request.read.input), at);
                (previous.thread, Some(previous.request_seq))
            }
            None => (new_chain(key.as_deref()), None),
        },
    };
    if request.read.store {
        threads.refuse_writes(&thread)?;
    }
    let digest = chat_request_digest(&request.call.client.body);
    let stream = request.read.stream;
    let refuses_overflow = request.refuses_overflow();
    let previous_id = request.read.previous_response_id.clone();
    let echo = request.echo;
    let mut turn = TurnRequest::new(tenant.clone(), thread, request.read.input, request.call);
    turn.reply_budget = request
        .read
        .max_output_tokens
        .map(|tokens| ("max_output_tokens", tokens));
    turn.key = key.map(|key| (key, digest));
    turn.continues = continues;
    turn.instructions = request.read.instructions;
    turn.store = request.read.store;
    turn.compact_threshold = request.read.compact_threshold;
    if refuses_overflow {
        turn.overrides.enabled = Some(false);
    }
    turn.client_record = Some(echo.clone());
    let answer = state.chat.turn(turn).await.map_err(|error| {
        responses_error(
            &state,
            tenant,
            error,
            previous_id.as_deref(),
            refuses_overflow,
        )
    })?;
    match answer {
        TurnAnswer::Replayed { answer, thread } => {
            let id = ResponseId::encode(&thread, answer.request_seq);
            let end = answer.end.as_ref();
            let status = ResponseStatus::from_finish_reason(
                end.and_then(|end| end.finish_reason.as_deref()),
            );
            let facts = ResponseFacts { id, echo };
            let object = facts.object(
                &status,
                None,
                Some(&answer.message),
                end.map(|end| end.usage),
            );
            let mut response = if stream {
                event_stream(Body::from(whole_stream(&facts, &object)))
            } else {
                Json(object).into_response()
            };
            response
                .headers_mut()
                .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
            Ok(response)
        }
        TurnAnswer::Upstream { response, place } => {
            let id = match place.request_seq {
                Some(seq) => ResponseId::encode(&place.thread, seq),
                None => ResponseId::unstored(),
            };
            let facts = ResponseFacts { id, echo };
            answer_response(facts, response, place, stream).await
        }
        // This door never asks a turn to stop after compacting.
        TurnAnswer::Compacted { .. } => Err(ApiError::internal(
            "a Responses turn stopped after compacting, which this door never asks for",
        )),
    }
}

/// The thread a new chain of responses starts: named after the request's idempotency key
/// when it has one, so that a retry finds the first attempt's record (and a key reused for
/// another request is refused there), else new.
fn new_chain(key: Option<&str>) -> String {
    match key {
        Some(key) => format!(
            "responses-k{}",
            &crate::auth::sha256_hex(key.as_bytes())[..32]
        ),
        None => format!("responses-{}", new_token()),
    }
}

/// The stored response of the tenant's that an input sent whole continues (see
/// [`continued_by_items`]), with the index of the input's last message from it. An id of
/// a response the tenant does not have (deleted, or another tenant's) continues nothing:
/// the input starts a thread as any other.
async fn implicitly_continued(
    threads: &TenantStore<'_>,
    input: &[Message],
) -> ApiResult<Option<(usize, ResponseId)>> {
    let Some((at, previous)) = continued_by_items(input) else {
        return Ok(None);
    };
    Ok(threads
        .has_recorded_turn(&previous.thread, previous.request_seq)
        .await?
        .then_some((at, previous)))
}

/// What an input sent whole brings after the stored response it continues, whose last
/// message is `input[at]`: the messages after it, and its system and developer messages
/// (the thread compares them with its own prompt).
fn after_continued(input: Vec<Message>, at: usize) -> Vec<Message> {
    input
        .into_iter()
        .enumerate()
        .filter(|(index, message)| *index > at || message.role.is_system_like())
        .map(|(_, message)| message)
        .collect()
}

/// A turn's refusal as this door answers it: what the chat door answers, except that an
/// input over the window with truncation disabled is OpenAI's `context_length_exceeded`,
/// and a response id that names nothing is a 404 naming the response.
fn responses_error(
    state: &AppState,
    tenant: &contexture_store::Tenant,
    error: TurnError,
    previous: Option<&str>,
    refuses_overflow: bool,
) -> ApiError {
    match (&error, previous) {
        (TurnError::Chat(ChatError::Fit(fit @ FitError::OverWindow { .. })), _)
            if refuses_overflow =>
        {
            ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "context_length_exceeded",
                message: format!("truncation is disabled and the input does not fit: {fit}"),
                param: Some("input".into()),
            }
        }
        (
            TurnError::Chat(
                ChatError::UnknownPoint { .. }
                | ChatError::Store(contexture_store::StoreError::NotFound { .. }),
            ),
            Some(previous),
        ) => no_response(previous),
        _ => turn_error(state.tenant_store(tenant), error),
    }
}

/// The upstream's answer as a response object or a stream of events.
async fn answer_response(
    facts: ResponseFacts,
    response: UpstreamResponse,
    place: TurnPlace,
    stream: bool,
) -> ApiResult<Response> {
    let (format, body) = answer_to_write(response).await?;
    let summary = place.summary;
    match body {
        UpstreamBody::Full(bytes) => {
            let object = match AnswerAccumulator::from_body(format, &bytes) {
                Ok(answer) => facts.object(
                    &ResponseStatus::from_finish_reason(answer.finish_reason.as_deref()),
                    summary.as_deref(),
                    Some(&answer.message),
                    answer.usage,
                ),
                Err(error) => facts.object(&failed(&error), summary.as_deref(), None, None),
            };
            Ok(if stream {
                event_stream(Body::from(whole_stream(&facts, &object)))
            } else {
                Json(object).into_response()
            })
        }
        UpstreamBody::Stream(upstream) => {
            let events = translated(
                facts,
                upstream,
                AnswerAccumulator::for_format(format),
                summary,
            );
            Ok(event_stream(Body::from_stream(events)))
        }
    }
}

/// A failed call as a response's status.
fn failed(error: &PassthroughError) -> ResponseStatus {
    ResponseStatus::Failed {
        code: "server_error".to_owned(),
        message: error.to_string(),
    }
}

/// A whole response object written as the events of a stream (a replayed answer, or an
/// upstream that answered whole).
fn whole_stream(facts: &ResponseFacts, object: &Value) -> String {
    let header = facts.header();
    let mut writer = ResponseStream::new(facts.seed());
    let mut out = writer.start(&header);
    let items = object["output"].as_array().cloned().unwrap_or_default();
    let mut calls = 0;
    for item in items {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                out.push_str(&writer.text(text));
            }
            Some("function_call") => {
                out.push_str(
                    &writer.tool_call(
                        calls,
                        item.get("call_id").and_then(Value::as_str),
                        item.get("name").and_then(Value::as_str),
                        item.get("arguments")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    ),
                );
                calls += 1;
            }
            _ => out.push_str(&writer.whole_item(item)),
        }
    }
    let status = match object["status"].as_str() {
        Some("failed") => ResponseStatus::Failed {
            code: object["error"]["code"]
                .as_str()
                .unwrap_or("server_error")
                .to_owned(),
            message: object["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        },
        Some("incomplete") => ResponseStatus::Incomplete {
            reason: object["incomplete_details"]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        },
        _ => ResponseStatus::Completed,
    };
    let usage = object["usage"].as_object().map(|usage| {
        contexture_core::thread::Usage::new(
            usage["input_tokens"].as_u64().unwrap_or_default(),
            usage["output_tokens"].as_u64().unwrap_or_default(),
        )
    });
    out.push_str(&writer.finish(&header, &status, usage));
    out
}

/// A `text/event-stream` response.
fn event_stream(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// The upstream's stream of answer pieces (recorded as it passes) written again as the
/// Responses events of `facts`' response.
fn translated(
    facts: ResponseFacts,
    upstream: UpstreamStream,
    accumulator: AnswerAccumulator,
    summary: Option<Vec<contexture_core::Message>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let mut writer = ResponseStream::new(facts.seed());
    let mut first = writer.start(&facts.header());
    if let Some(summary) = &summary {
        first.push_str(&writer.whole_item(
            contexture_core::format::responses_answer::compaction_item(summary, facts.seed()),
        ));
    }
    translated_stream(
        upstream,
        accumulator,
        writer,
        first,
        move |writer, answer| {
            let header = facts.header();
            match answer {
                Ok(answer) => writer.finish(
                    &header,
                    &ResponseStatus::from_finish_reason(answer.finish_reason.as_deref()),
                    answer.usage,
                ),
                Err(error) => writer.finish(&header, &failed(&error), None),
            }
        },
    )
}

/// `GET /v1/responses/{id}`: a stored response as it was answered (or, while its call is
/// in flight, `in_progress`).
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let (turn, input) = stored_response(&threads, &ResponseId::named(&id)?, &id).await?;
    let echo = turn.record.client.clone().unwrap_or_default();
    let facts = ResponseFacts { id, echo };
    let usage = turn.end.as_ref().map(|end| end.usage);
    let mut object = match &turn.end {
        Some(end) if end.outcome == RequestOutcome::Completed => facts.object(
            &ResponseStatus::from_finish_reason(end.finish_reason.as_deref()),
            input.summary.as_deref(),
            turn.answer.as_ref(),
            usage,
        ),
        Some(end) => facts.object(
            &ResponseStatus::Failed {
                code: "server_error".to_owned(),
                message: end
                    .error
                    .clone()
                    .unwrap_or_else(|| "the call failed".to_owned()),
            },
            input.summary.as_deref(),
            None,
            usage,
        ),
        None => {
            let mut object = facts.object(
                &ResponseStatus::Completed,
                input.summary.as_deref(),
                None,
                None,
            );
            object["status"] = json!("in_progress");
            object
        }
    };
    if object["model"] == "" {
        object["model"] = json!(turn.record.model);
    }
    Ok(Json(object))
}

/// `DELETE /v1/responses/{id}`: the response is deleted (it reads as not found and cannot
/// be continued); its thread keeps the conversation.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let found = ResponseId::named(&id)?;
    if !threads.exists(&found.thread).await? {
        return Err(no_response(&id));
    }
    threads.refuse_writes(&found.thread)?;
    // Not while a turn of the thread is in flight: its answer is being recorded.
    let _turn = threads
        .wait_for_turn(
            &state.turns,
            &found.thread,
            state.config.limits.thread_turn_wait(),
        )
        .await?;
    stored_response(&threads, &found, &id).await?;
    if !threads
        .delete_recorded_turn(&found.thread, found.request_seq)
        .await?
    {
        return Err(no_response(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}

/// `GET /v1/responses/{id}/input_items`: the items the response's request brought, as its
/// thread holds them.
pub async fn input_items(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ItemsQuery>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let (_, input) = stored_response(&threads, &ResponseId::named(&id)?, &id).await?;
    let items: Vec<Value> = responses::to_items(&input.messages)
        .into_iter()
        .enumerate()
        .map(|(index, item)| listed_item(item, &format!("in_{}_{index}", id_seed(&id))))
        .collect();
    Ok(Json(items_page(items, &query)?))
}

/// The stored response at `found` (named `id`) among the tenant's: its turn and what the
/// turn brought. 404 when it names nothing, or a turn of another door (not a response).
async fn stored_response(
    threads: &TenantStore<'_>,
    found: &ResponseId,
    id: &str,
) -> ApiResult<(RecordedTurn, TurnInput)> {
    match threads
        .recorded_turn(&found.thread, found.request_seq)
        .await?
    {
        Some((turn, input)) if turn.record.client.is_some() => Ok((turn, input)),
        _ => Err(no_response(id)),
    }
}

/// Now, in seconds since the Unix epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
