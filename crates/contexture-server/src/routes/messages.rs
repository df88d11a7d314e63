//! The Anthropic Messages door: `POST /v1/messages` is read into the engine's chat turn
//! ([`ChatService::turn`]) and its answer written as Anthropic's `message` object (or its
//! stream of named events).
//!
//! A request is stateless unless it names a thread (`X-Contexture-Thread`, or
//! `metadata.contexture_thread`): its history, as the client sent it, is fitted for the model
//! and sent, and nothing is stored. Naming a thread makes it a turn of that thread as on the
//! chat endpoint (the new messages found and stored, the call recorded, retries with an
//! `Idempotency-Key` answered from the record). An Anthropic upstream's answer comes back as
//! it was written; an OpenAI-compatible upstream's is written again in Anthropic's shape.
//! Errors have Anthropic's shape ([`crate::error::anthropic_errors`]).
//!
//! [`ChatService::turn`]: contexture_engine::chat_service::ChatService::turn

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use contexture_core::format::anthropic_answer::{
    AdditionsInserter, AnswerAdditions, MessageAnswer, MessageStream, anthropic_stop_reason,
    message_object, message_stream, with_additions,
};
use contexture_core::format::anthropic_edits::{
    COMPACT, ContextEdits, applied_edits, compaction_block,
};
use contexture_core::format::anthropic_request::read_messages_body;
use contexture_core::message::Message;
use contexture_engine::chat::StoredAnswer;
use contexture_engine::chat_service::{TurnAnswer, TurnPlace, TurnRequest};
use contexture_engine::fitting::RequestEdits;
use contexture_llm::passthrough::{Answer, AnswerAccumulator, UpstreamBody, UpstreamResponse};
use contexture_llm::wire::{ChatCall, ClientFormat, ClientRequest, WireFormat};
use futures_util::StreamExt;
use serde_json::Value;

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::routes::chat::{
    REPLAYED_HEADER, chat_request_digest, finish_reason, passthrough_response, turn_error,
    with_thread_if,
};
use crate::routes::chat_request::{THREAD_HEADER, thread_name};
use crate::routes::responses_call::new_token;
use crate::routes::translation::{answer_to_write, translated_stream};
use crate::tenancy::check_id;

/// `POST /v1/messages`: read, run as the engine's chat turn, written as a message.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let key = crate::body::idempotency_key(&headers)?;
    let tenant = &caller.tenant;
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    let thread = thread_name(&headers, &mut body)?;
    if let Some(thread) = &thread {
        check_id("the thread", thread)
            .map_err(|problem| ApiError::invalid(THREAD_HEADER, problem))?;
    }
    let read = read_messages_body(&body, false)
        .map_err(|error| ApiError::invalid(error.field, error.message))?;
    let edits = read.edits.clone();
    let compact = edits.as_ref().and_then(|edits| edits.compact.clone());
    if compact
        .as_ref()
        .is_some_and(|compact| compact.pause_after_compaction)
        && thread.is_some()
    {
        return Err(ApiError::invalid(
            "context_management.edits",
            format!(
                "context_management.edits: `{COMPACT}` with pause_after_compaction compacts the history a request carries and stops; a named thread's turn compacts the stored thread and goes on: leave pause_after_compaction or the thread out"
            ),
        ));
    }
    // A retry with the same key must ask for the same edits.
    let digest = chat_request_digest(&body);
    // Anthropic's context management is carried out here, whatever the upstream: an
    // Anthropic upstream never sees the field.
    body.remove("context_management");
    let model = read.model.clone();
    let stream = read.stream;
    let call = ChatCall {
        model: read.model,
        tools: read.tools,
        response_format: None,
        max_tokens: Some(read.max_tokens),
        stream,
        client: ClientRequest {
            format: ClientFormat::Wire(WireFormat::AnthropicMessages),
            body,
        },
    };
    let threads = state.tenant_store(tenant);
    let stored = thread.is_some();
    let thread = match thread {
        Some(thread) => {
            threads.refuse_writes(&thread)?;
            thread
        }
        // A turn that stores nothing reads no thread: this name is never written.
        None => format!("messages-{}", new_token()),
    };
    let mut turn = TurnRequest::new(tenant.clone(), thread.clone(), read.messages, call);
    turn.overrides.edits = edits.as_ref().map(request_edits);
    if let Some(compact) = compact {
        turn.compact_threshold = Some(compact.trigger_tokens);
        turn.compacts_request = true;
        turn.compact_instructions = compact.instructions;
        turn.pause_after_compaction = compact.pause_after_compaction;
    }
    turn.reply_budget = Some(("max_tokens", read.max_tokens));
    turn.store = stored;
    turn.key = key.map(|key| (key, digest));
    let named = stored.then_some(thread.as_str());
    match state.chat.turn(turn).await {
        Ok(TurnAnswer::Replayed { answer, .. }) => Ok(replayed(&answer, stream, named)),
        Ok(TurnAnswer::Upstream { response, place }) => {
            let additions = additions(edits.as_ref(), &place);
            answer_response(response, &model, stream, named, additions).await
        }
        Ok(TurnAnswer::Compacted { place }) => {
            let additions = additions(edits.as_ref(), &place);
            Ok(compaction_alone(&model, stream, additions))
        }
        Err(error) => Err(turn_error(threads, error)),
    }
}

/// The edits a turn makes for the context edits a request named: they take the place of
/// the policy's clearing.
fn request_edits(edits: &ContextEdits) -> RequestEdits {
    RequestEdits {
        clear_tool_results: edits.clear_tool_uses.clone(),
        clear_thinking: edits.clear_thinking.flatten(),
    }
}

/// What the door adds to the answer of a turn recorded at `place` for a request that named
/// `edits`: what they did (when it named any), and the compaction's block first (when it
/// named compaction and the turn compacted: a thread's own policy compacting is not the
/// client's to see).
fn additions(edits: Option<&ContextEdits>, place: &TurnPlace) -> AnswerAdditions {
    let compacting = edits.is_some_and(|edits| edits.compact.is_some());
    AnswerAdditions {
        context_management: edits.map(|edits| {
            let applied = applied_edits(
                edits,
                &place.fit.cleared,
                place.fit.cleared_thinking.as_ref(),
            );
            serde_json::json!({ "applied_edits": applied })
        }),
        leading_block: place
            .summary
            .as_deref()
            .filter(|_| compacting)
            .map(|summary| compaction_block(summary, place.summary_kept)),
    }
}

/// The answer of a turn that compacted and paused there (`pause_after_compaction`): the
/// compaction's block alone, stop reason `compaction`.
fn compaction_alone(model: &str, stream: bool, additions: AnswerAdditions) -> Response {
    let id = format!("msg_{}", new_token());
    let message = Message::assistant("");
    let answer = MessageAnswer {
        id: &id,
        model,
        message: &message,
        stop_reason: "compaction",
        usage: None,
        context_management: additions.context_management.as_ref(),
        leading_block: additions.leading_block.as_ref(),
    };
    written(&answer, stream)
}

/// `answer` as a `message` object, or as its events for a client that asked for a stream.
fn written(answer: &MessageAnswer<'_>, stream: bool) -> Response {
    if stream {
        event_stream(Body::from(message_stream(answer)))
    } else {
        Json(message_object(answer)).into_response()
    }
}

/// A keyed turn's stored answer as a message (or its events), marked as replayed.
fn replayed(answer: &StoredAnswer, stream: bool, thread: Option<&str>) -> Response {
    let completion = answer.completion();
    let id = format!("msg_{}", new_token());
    let answer = MessageAnswer {
        id: &id,
        model: completion.model,
        message: completion.message,
        stop_reason: anthropic_stop_reason(completion.finish_reason),
        usage: completion.usage,
        context_management: None,
        leading_block: None,
    };
    let mut response = written(&answer, stream);
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    with_thread_if(response, thread)
}

/// The upstream's answer as this door writes it, with the door's `additions`: as it came
/// from an Anthropic upstream (the additions made in it), else read and written again as a
/// message or, for a client that asked for a `stream`, its events (a whole answer too).
async fn answer_response(
    response: UpstreamResponse,
    model: &str,
    stream: bool,
    thread: Option<&str>,
    additions: AnswerAdditions,
) -> ApiResult<Response> {
    if response.format == WireFormat::AnthropicMessages {
        let response = if response.is_success() && !additions.is_empty() {
            with_additions_made(response, additions)
        } else {
            response
        };
        return Ok(passthrough_response(response, thread));
    }
    let AnswerAdditions {
        context_management: management,
        leading_block,
    } = additions;
    let (format, body) = answer_to_write(response).await?;
    let id = format!("msg_{}", new_token());
    let out = match body {
        UpstreamBody::Full(bytes) => {
            let answer = AnswerAccumulator::from_body(format, &bytes)
                .map_err(|error| ApiError::upstream(error.to_string()))?;
            written(
                &MessageAnswer {
                    id: &id,
                    model: answer.model.as_deref().unwrap_or(model),
                    message: &answer.message,
                    stop_reason: stop_reason(&answer),
                    usage: answer.usage,
                    context_management: management.as_ref(),
                    leading_block: leading_block.as_ref(),
                },
                stream,
            )
        }
        UpstreamBody::Stream(upstream) => {
            let mut writer = MessageStream::new(id, model);
            let mut first = writer.start(None);
            if let Some(block) = leading_block {
                first.push_str(&writer.whole_block(block));
            }
            let events = translated_stream(
                upstream,
                AnswerAccumulator::for_format(format),
                writer,
                first,
                move |writer, answer| match answer {
                    Ok(answer) => {
                        writer.finish(stop_reason(&answer), answer.usage, management.as_ref())
                    }
                    Err(error) => writer.fail(&error.to_string()),
                },
            );
            event_stream(Body::from_stream(events))
        }
    };
    Ok(with_thread_if(out, thread))
}

/// An Anthropic upstream's answer with `additions` made in it: in the message, or in its
/// stream's events, everything else as it came.
fn with_additions_made(
    mut response: UpstreamResponse,
    additions: AnswerAdditions,
) -> UpstreamResponse {
    response.body = match response.body {
        UpstreamBody::Full(bytes) => UpstreamBody::Full(
            with_additions(&bytes, &additions)
                .map(Bytes::from)
                .unwrap_or(bytes),
        ),
        UpstreamBody::Stream(upstream) => {
            let inserter = AdditionsInserter::new(additions);
            let chunks =
                futures_util::stream::unfold(Some((upstream, inserter)), |state| async move {
                    let (mut upstream, mut inserter) = state?;
                    match upstream.next().await {
                        Some(Ok(chunk)) => {
                            let out = Bytes::from(inserter.feed(&chunk));
                            Some((Ok(out), Some((upstream, inserter))))
                        }
                        Some(Err(error)) => Some((Err(error), None)),
                        None => Some((Ok(Bytes::from(inserter.finish())), None)),
                    }
                });
            UpstreamBody::Stream(Box::pin(chunks))
        }
    };
    response
}

/// An answer's stop reason in Anthropic's words.
fn stop_reason(answer: &Answer) -> &str {
    anthropic_stop_reason(finish_reason(answer))
}

/// A `text/event-stream` response.
fn event_stream(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// `POST /v1/messages/count_tokens`: the tokens of the request's system prompt, messages
/// and tools as this door counts them when it fits the request for the model; with context
/// edits, once they are made (`context_management.original_input_tokens` the count before).
pub async fn count_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Json<Value>> {
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    };
    // A thread's name is the turn's, not something to count.
    thread_name(&headers, &mut body)?;
    let read = read_messages_body(&body, true)
        .map_err(|error| ApiError::invalid(error.field, error.message))?;
    let edits = read.edits.as_ref().map(request_edits);
    let count = state
        .chat
        .count_request(
            &caller.tenant,
            &read.model,
            &read.messages,
            &read.tools,
            edits.as_ref(),
        )
        .await
        .map_err(|error| turn_error(state.tenant_store(&caller.tenant), error))?;
    let mut answer = serde_json::json!({ "input_tokens": count.tokens });
    if let Some(before) = count.before_edits {
        answer["context_management"] = serde_json::json!({ "original_input_tokens": before });
    }
    Ok(Json(answer))
}
