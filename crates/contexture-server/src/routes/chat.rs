//! The OpenAI-compatible endpoint. `POST /v1/chat/completions` with a thread (header
//! `X-Contexture-Thread`, or `metadata.contexture_thread` in the body) keeps the history for
//! the client: the request is parsed into the engine's turn request and run as its chat
//! turn ([`ChatService::turn`]: new messages stored, compaction, fit, the fitted request
//! sent upstream in place of the request's messages, its end recorded), and the answer
//! goes back as the upstream sent it (streamed chunk by chunk) or, for a keyed turn sent
//! again, as the core renders the stored answer. Without a thread the endpoint is a
//! transparent proxy. `GET /v1/models` is the upstream's list.
//!
//! [`ChatService::turn`]: contexture_engine::chat_service::ChatService::turn

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use contexture_core::format::openai_completion::{self, CompletionAnswer, CompletionStream};
use contexture_engine::chat::{ChatError, SHUT_DOWN, StoredAnswer};
use contexture_engine::chat_service::{TurnAnswer, TurnError, TurnRequest};
use contexture_llm::passthrough::{
    Answer, AnswerAccumulator, PassthroughError, UpstreamBody, UpstreamResponse,
};
use contexture_llm::wire::ChatCall;
use contexture_llm::wire::WireFormat;
use contexture_llm::{ModelList, ModelListError, ModelListShape};
use serde_json::{Map, Value};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::fit_settings;
use crate::routes::chat_request::{ChatCompletionsCall, THREAD_HEADER};
use crate::routes::responses_call::new_token;
use crate::routes::translation::{answer_to_write, translated_stream};
use crate::tenant_store::TenantStore;

/// The header a replayed answer carries.
pub const REPLAYED_HEADER: &str = "x-contexture-replayed";

/// `POST /v1/chat/completions`: parsed, run as the engine's chat turn, written back.
pub async fn completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> ApiResult<Response> {
    let key = crate::body::idempotency_key(&headers)?;
    let tenant = &caller.tenant;
    let request = ChatCompletionsCall::parse(&headers, body)?;
    let writing = AnswerWriting::of(&request.call);
    let Some(thread) = request.thread else {
        let response = state
            .chat
            .pass_through(tenant, &request.call, &request.messages)
            .await
            .map_err(|error| turn_error(state.tenant_store(tenant), error))?;
        return answer_response(response, &writing, None).await;
    };
    let threads = state.tenant_store(tenant);
    threads.refuse_writes(&thread)?;
    let stream = request.call.stream;
    let digest = chat_request_digest(&request.call.client.body);
    let mut turn = TurnRequest::new(
        tenant.clone(),
        thread.clone(),
        request.messages,
        request.call,
    );
    turn.reply_budget = request.reply_budget;
    turn.choices = request.choices;
    turn.key = key.map(|key| (key, digest));
    match state.chat.turn(turn).await {
        Ok(TurnAnswer::Replayed { answer, .. }) => {
            Ok(with_thread(replayed(&answer, stream), &thread))
        }
        Ok(TurnAnswer::Upstream { response, .. }) => {
            answer_response(response, &writing, Some(&thread)).await
        }
        // This door never asks a turn to stop after compacting.
        Ok(TurnAnswer::Compacted { .. }) => Err(ApiError::internal(
            "a chat turn stopped after compacting, which this endpoint never asks for",
        )),
        Err(error) => Err(turn_error(threads, error)),
    }
}

/// What writing an answer of an upstream of another format as a completion needs of the
/// request.
struct AnswerWriting {
    /// The model asked for (an answer that names none is this model's).
    model: String,
    /// True when the client asked for the usage chunk of a stream.
    include_usage: bool,
}

impl AnswerWriting {
    fn of(call: &ChatCall) -> AnswerWriting {
        AnswerWriting {
            model: call.model.clone(),
            include_usage: call
                .client
                .body
                .get("stream_options")
                .and_then(|options| options.get("include_usage"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }
}

/// The upstream's answer as this endpoint writes it: as it came from an OpenAI-compatible
/// upstream (status, body, a stream chunk by chunk), else read and written again as a
/// `chat.completion` or its chunks (a refusal as an error of this API's shape).
async fn answer_response(
    response: UpstreamResponse,
    writing: &AnswerWriting,
    thread: Option<&str>,
) -> ApiResult<Response> {
    if response.format == WireFormat::OpenAiChat {
        return Ok(passthrough_response(response, thread));
    }
    let (format, body) = answer_to_write(response).await?;
    let id = format!("chatcmpl-{}", new_token());
    let out = match body {
        UpstreamBody::Full(bytes) => {
            let answer = AnswerAccumulator::from_body(format, &bytes)
                .map_err(|error| upstream_error(&error))?;
            let model = answer.model.as_deref().unwrap_or(&writing.model);
            let completion = openai_completion::completion(&CompletionAnswer {
                id: &id,
                model,
                message: &answer.message,
                finish_reason: finish_reason(&answer),
                usage: answer.usage,
            });
            Json(completion).into_response()
        }
        UpstreamBody::Stream(upstream) => {
            let mut writer = CompletionStream::new(id, writing.model.clone());
            let first = writer.start();
            let include_usage = writing.include_usage;
            let chunks = translated_stream(
                upstream,
                AnswerAccumulator::for_format(format),
                writer,
                first,
                move |writer, answer| match answer {
                    Ok(answer) => {
                        writer.finish(finish_reason(&answer), answer.usage, include_usage)
                    }
                    Err(error) => writer.fail(&error.to_string()),
                },
            );
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(chunks),
            )
                .into_response()
        }
    };
    Ok(with_thread_if(out, thread))
}

/// An answer's finish reason in OpenAI's words.
pub(crate) fn finish_reason(answer: &Answer) -> &str {
    openai_completion::finish_reason(answer.finish_reason.as_deref(), &answer.message)
}

/// The digest of a request body (after the thread's name was taken out of it, so the header
/// and the metadata spelling of one request agree): a keyed turn sent again must match it.
pub fn chat_request_digest(body: &Map<String, Value>) -> String {
    crate::auth::sha256_hex(&serde_json::to_vec(body).unwrap_or_default())
}

/// A keyed turn's stored answer as the upstream would have sent it (a `chat.completion`,
/// or for a streaming client the same as one chunk and `[DONE]`), marked as replayed.
fn replayed(answer: &StoredAnswer, stream: bool) -> Response {
    let answer = answer.completion();
    let mut response = if stream {
        let text = openai_completion::completion_stream(&answer);
        ([(header::CONTENT_TYPE, "text/event-stream")], text).into_response()
    } else {
        Json(openai_completion::completion(&answer)).into_response()
    };
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// A turn's refusal as the API answers it.
pub(crate) fn turn_error(threads: TenantStore<'_>, error: TurnError) -> ApiError {
    match error {
        TurnError::Chat(error) => chat_error(threads, error),
        TurnError::Busy(full) => full.into(),
        TurnError::Wait(error) => threads.turn_wait_error(error),
        TurnError::Settings(error) => fit_settings::settings_error(error),
        TurnError::ShutDown => ApiError::unavailable(SHUT_DOWN),
        TurnError::Upstream(error) => upstream_error(&error),
        TurnError::Stopped(message) => ApiError::upstream(message),
    }
}

/// A chat turn's refusal as the API answers it.
fn chat_error(threads: TenantStore<'_>, error: ChatError) -> ApiError {
    match error {
        ChatError::Invalid { field, message } => ApiError::invalid(field, message),
        ChatError::Fit(error) => fit_settings::fit_error(error),
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
        error @ ChatError::UnknownPoint { .. } => ApiError {
            message: error.to_string(),
            ..ApiError::not_found("request", "")
        },
    }
}

/// `response` with the thread's name in its header, when there is a thread.
pub(crate) fn with_thread_if(response: Response, thread: Option<&str>) -> Response {
    match thread {
        Some(thread) => with_thread(response, thread),
        None => response,
    }
}

/// `response` with the thread's name in its header.
pub(crate) fn with_thread(mut response: Response, thread: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(thread) {
        response.headers_mut().insert(THREAD_HEADER, value);
    }
    response
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
pub(crate) fn passthrough_response(response: UpstreamResponse, thread: Option<&str>) -> Response {
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
    with_thread_if(out, thread)
}

/// `GET /v1/models`: every upstream's models ([`Upstreams::model_list`]), in Anthropic's
/// shape for a client of Anthropic's API (one that sends `anthropic-version`).
///
/// [`Upstreams::model_list`]: contexture_llm::Upstreams::model_list
pub async fn models(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let shape = if headers.contains_key("anthropic-version") {
        ModelListShape::Anthropic
    } else {
        ModelListShape::OpenAi
    };
    match state.chat.upstreams().model_list(shape).await {
        Ok(ModelList::AsAnswered(response)) => Ok(passthrough_response(response, None)),
        Ok(ModelList::Merged(list)) => Ok(Json(list).into_response()),
        Err(ModelListError::Upstream(error)) => Err(upstream_error(&error)),
        Err(error @ ModelListError::Listing { .. }) => Err(ApiError::upstream(error.to_string())),
    }
}
