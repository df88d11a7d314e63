//! Forwarding chat calls to an upstream provider, OpenAI-compatible or Anthropic's, and
//! reading its answer on the way.
//!
//! A server's chat turn hands a wire-neutral call and the messages it chose to
//! [`Passthrough::send`] (which writes the upstream's format, see [`crate::wire`]), or a
//! body already in that format to [`ChatUpstream::forward`], and returns the
//! [`UpstreamResponse`] to its own client as it is: the status, the content type and the
//! body, a streamed body chunk by chunk. Failed attempts (connection errors, timeouts, 408,
//! 409, 429 and 5xx answers) are retried with the crate's backoff ([`RetryPolicy`],
//! honouring `Retry-After`), but only before anything was handed to the caller; an error
//! status that is final (not retryable, or retries used up) is an ordinary response, so the
//! server passes it through.
//!
//! [`AnswerAccumulator`] folds the same body into the assistant's [`Answer`] (content, tool
//! calls, usage), from a whole `chat.completion` or from the server-sent events of a stream
//! fed in arbitrary pieces; [`record_stream`] does this on a stream that passes through.
//!
//! The upstream API key is sent as `Authorization: Bearer` (as `x-api-key` to Anthropic) and
//! appears in no error and no `Debug` output.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use contexture_core::Message;
use futures_core::Stream;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Map, Value};

use crate::error::retryable_status;
use crate::http::join_url;
use crate::openai::{ChunkProblem, CompletionProblem, StreamAssembly, parse_completion};
use crate::provider::{StreamDelta, Usage};
use crate::retry::{RetryPolicy, parse_retry_after};
use crate::sse::{SseDecoder, SseEvent};
use crate::wire::{ChatCall, RequestBody, WireFormat};

/// Where the upstream provider is, which wire format it speaks, and how patiently it is
/// called.
#[derive(Clone, PartialEq)]
pub struct UpstreamConfig {
    /// The provider's base URL. For [`WireFormat::OpenAiChat`] an OpenAI-compatible one,
    /// e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`, to which
    /// `chat/completions` and `models` are appended; for [`WireFormat::AnthropicMessages`]
    /// Anthropic's, e.g. `https://api.anthropic.com`, to which `v1/messages` and `v1/models`
    /// are.
    pub base_url: String,
    /// The wire format it speaks.
    pub format: WireFormat,
    /// The key: sent as `Authorization: Bearer` to an OpenAI-compatible provider, as
    /// `x-api-key` to Anthropic's; `None` (or an empty key) sends none.
    pub api_key: Option<String>,
    /// The longest wait for connecting and for the response headers, and the longest pause
    /// between two chunks of a response body.
    pub timeout: Duration,
    /// Retries after the first attempt (so `retries + 1` attempts at most).
    pub retries: u32,
    /// The delay before the first retry; it doubles for each further one.
    pub initial_backoff: Duration,
    /// The longest delay between two attempts, whatever the backoff or `Retry-After` says.
    pub max_backoff: Duration,
}

impl UpstreamConfig {
    /// A configuration for the OpenAI-compatible provider at `base_url` with an optional
    /// key, a 60 s timeout, and the crate's default retries (3, from 500 ms doubling, at
    /// most 30 s apart).
    pub fn new(base_url: impl Into<String>, api_key: Option<String>) -> UpstreamConfig {
        UpstreamConfig::speaking(WireFormat::OpenAiChat, base_url, api_key)
    }

    /// [`UpstreamConfig::new`] for a provider that speaks `format`.
    pub fn speaking(
        format: WireFormat,
        base_url: impl Into<String>,
        api_key: Option<String>,
    ) -> UpstreamConfig {
        let retry = RetryPolicy::default();
        UpstreamConfig {
            base_url: base_url.into(),
            format,
            api_key,
            timeout: Duration::from_secs(60),
            retries: retry.max_retries,
            initial_backoff: retry.initial_delay,
            max_backoff: retry.max_delay,
        }
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_retries: self.retries,
            initial_delay: self.initial_backoff,
            max_delay: self.max_backoff,
        }
    }
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("base_url", &redact_url(&self.base_url))
            .field("format", &self.format)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

/// Why a pass-through call failed, a streamed body broke off, or an answer could not be
/// read. None of them carries the API key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PassthroughError {
    /// The configuration cannot be used (a bad base URL or key, a zero timeout).
    #[error("upstream configuration: {detail}")]
    InvalidConfig {
        /// What is wrong (the key itself is never quoted).
        detail: String,
    },
    /// The connection failed or broke.
    #[error("upstream: connection failed: {detail}")]
    Connection {
        /// What the HTTP client said (without the URL, which may embed credentials).
        detail: String,
    },
    /// No response headers within the timeout (connecting included).
    #[error("upstream: no response within {timeout:?}")]
    Timeout {
        /// The timeout that was exceeded.
        timeout: Duration,
    },
    /// The response body paused for longer than the timeout between two chunks.
    #[error("upstream: the response stalled for more than {timeout:?}")]
    Stalled {
        /// The timeout that was exceeded.
        timeout: Duration,
    },
    /// Every attempt failed before a response could be handed over.
    #[error("upstream: gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<PassthroughError>,
    },
    /// A recorded stream ([`record_stream`]) was dropped before its end, e.g. because the
    /// client went away. `partial` is the answer as far as it had come, when any of it had.
    #[error("upstream: the stream was dropped before its end")]
    Interrupted {
        /// What had arrived of the answer.
        partial: Option<Box<Message>>,
    },
    /// The upstream ended a stream before the answer ended: no chunk gave a finish reason
    /// and no `[DONE]` came. `partial` is what had arrived.
    #[error("upstream: the stream ended before the answer did (no finish reason, no [DONE])")]
    Truncated {
        /// What had arrived of the answer.
        partial: Option<Box<Message>>,
    },
    /// The answer has no choice with index 0 (a stream without one, or an empty
    /// `choices`).
    #[error("upstream answer: no `choices[0]`")]
    NoChoice,
    /// The answer could not be understood: not JSON, a stream chunk that is not JSON, a
    /// choice without a well-formed message.
    #[error("upstream answer: {detail}")]
    Malformed {
        /// What was wrong, and where.
        detail: String,
    },
    /// The call cannot be written in the upstream's wire format: a setting of the client's
    /// format with no counterpart there, or messages the format cannot express.
    #[error("the upstream cannot take this request: {detail}")]
    Unsupported {
        /// What cannot be sent, and why.
        detail: String,
    },
    /// The answer is an error object (`{"error": ...}`), in a body or in a stream chunk.
    #[error("upstream answer: the upstream reported an error: {detail}")]
    Reported {
        /// The error object, as JSON text.
        detail: String,
    },
}

/// A forwarding client for one upstream OpenAI-compatible provider. Cheap to clone: clones
/// share the connection pool.
#[derive(Clone)]
pub struct Passthrough {
    client: reqwest::Client,
    base_url: String,
    format: WireFormat,
    /// The key's header (`Authorization: Bearer <key>` or `x-api-key: <key>`), its value
    /// marked sensitive.
    authorization: Option<(HeaderName, HeaderValue)>,
    timeout: Duration,
    retry: RetryPolicy,
}

/// What an upstream call returns: its response as it came, or why none came.
pub type UpstreamCall<'a> =
    Pin<Box<dyn Future<Output = Result<UpstreamResponse, PassthroughError>> + Send + 'a>>;

/// Where a chat turn's request goes: a provider of one wire format. The engine's chat turns
/// call it with a wire-neutral [`ChatCall`] and the messages chosen for it; each
/// implementation writes its own format ([`ChatCall::body_for`]). [`Passthrough`] is the
/// HTTP one, for OpenAI-compatible and Anthropic providers alike.
pub trait ChatUpstream: Send + Sync {
    /// The wire format it speaks, which its responses are in.
    fn format(&self) -> WireFormat;

    /// Sends `call` with `messages` and returns the response as it came (see
    /// [`Passthrough::send`]).
    fn send<'a>(&'a self, call: &'a ChatCall, messages: &'a [Message]) -> UpstreamCall<'a>;

    /// Sends `body`, a request already in the upstream's own format, as it is (a request
    /// that keeps no thread, passed through).
    fn forward<'a>(&'a self, body: &'a Map<String, Value>) -> UpstreamCall<'a>;

    /// Its list of models, as it answered (see [`Passthrough::models`]).
    fn models(&self) -> UpstreamCall<'_>;
}

impl ChatUpstream for Passthrough {
    fn format(&self) -> WireFormat {
        self.format
    }

    fn send<'a>(&'a self, call: &'a ChatCall, messages: &'a [Message]) -> UpstreamCall<'a> {
        Box::pin(Passthrough::send(self, call, messages))
    }

    fn forward<'a>(&'a self, body: &'a Map<String, Value>) -> UpstreamCall<'a> {
        Box::pin(async move {
            let body = RequestBody::as_sent(body);
            self.post(&body, body.streams()).await
        })
    }

    fn models(&self) -> UpstreamCall<'_> {
        Box::pin(Passthrough::models(self))
    }
}

impl std::fmt::Debug for Passthrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passthrough")
            .field("base_url", &redact_url(&self.base_url))
            .field("format", &self.format)
            .field(
                "api_key",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Passthrough {
    /// A client for `config`. Fails when the base URL is not an http(s) URL, the key cannot
    /// be sent in a header, the timeout is zero, or the HTTP client cannot be built.
    pub fn new(config: UpstreamConfig) -> Result<Passthrough, PassthroughError> {
        let invalid = |detail: String| PassthroughError::InvalidConfig { detail };
        let url = reqwest::Url::parse(config.base_url.trim())
            .map_err(|e| invalid(format!("the base URL is not a valid URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "the base URL must be http or https, not `{}`",
                url.scheme()
            )));
        }
        if config.timeout.is_zero() {
            return Err(invalid("the timeout must be more than zero".to_owned()));
        }
        let authorization = match config.api_key.as_deref().filter(|key| !key.is_empty()) {
            None => None,
            Some(key) => {
                let (name, text) = match config.format {
                    WireFormat::OpenAiChat => (AUTHORIZATION, format!("Bearer {key}")),
                    WireFormat::AnthropicMessages => {
                        (HeaderName::from_static("x-api-key"), key.to_owned())
                    }
                };
                let mut value = HeaderValue::from_str(&text).map_err(|_| {
                    invalid("the API key is not a valid HTTP header value".to_owned())
                })?;
                value.set_sensitive(true);
                Some((name, value))
            }
        };
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .build()
            .map_err(|e| invalid(format!("cannot build the HTTP client: {}", chain(&e))))?;
        Ok(Passthrough {
            client,
            base_url: config.base_url.trim().to_owned(),
            format: config.format,
            authorization,
            timeout: config.timeout,
            retry: config.retry_policy(),
        })
    }

    /// The base URL calls go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Writes `call` with `messages` in the upstream's format ([`ChatCall::body_for`]) and
    /// POSTs it (see [`Passthrough::chat_completions`] for what comes back).
    pub async fn send(
        &self,
        call: &ChatCall,
        messages: &[Message],
    ) -> Result<UpstreamResponse, PassthroughError> {
        let body = call.body_for(self.format, messages)?;
        self.post(&body, body.streams()).await
    }

    /// POSTs `body` as it is (serialized once, its key order kept) to
    /// `{base_url}/chat/completions`; the caller has already put in the messages it chose.
    /// For an upstream that speaks Anthropic's format, use [`Passthrough::send`] or
    /// [`ChatUpstream::forward`].
    ///
    /// When `body["stream"]` is `true` and the upstream answers with a success status, the
    /// body is an [`UpstreamBody::Stream`] of the chunks as they arrive; otherwise it is
    /// read whole ([`UpstreamBody::Full`]). A final error status is returned as a response,
    /// not as an error. Errors are only for calls that got no response at all
    /// ([`PassthroughError::Connection`], [`PassthroughError::Timeout`],
    /// [`PassthroughError::Stalled`] while reading a whole body, or
    /// [`PassthroughError::RetriesExhausted`] around one of them).
    pub async fn chat_completions(
        &self,
        body: &Value,
    ) -> Result<UpstreamResponse, PassthroughError> {
        if self.format != WireFormat::OpenAiChat {
            return Err(PassthroughError::Unsupported {
                detail: format!(
                    "a chat-completions body for an upstream that speaks {}",
                    self.format
                ),
            });
        }
        let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
        self.post(body, stream).await
    }

    /// POSTs `body`, a request in the upstream's own format, serialized once; `stream` when
    /// it asks for a stream.
    async fn post(
        &self,
        body: &impl serde::Serialize,
        stream: bool,
    ) -> Result<UpstreamResponse, PassthroughError> {
        let payload =
            Bytes::from(
                serde_json::to_vec(body).map_err(|error| PassthroughError::Malformed {
                    detail: format!("the request body cannot be written: {error}"),
                })?,
            );
        let path = match self.format {
            WireFormat::OpenAiChat => "chat/completions",
            WireFormat::AnthropicMessages => "v1/messages",
        };
        self.call(reqwest::Method::POST, path, Some(payload), stream)
            .await
    }

    /// GETs the upstream's model list (`{base_url}/models`, or `v1/models` from Anthropic),
    /// returned as received (whole), with the same retries.
    pub async fn models(&self) -> Result<UpstreamResponse, PassthroughError> {
        let path = match self.format {
            WireFormat::OpenAiChat => "models",
            WireFormat::AnthropicMessages => "v1/models",
        };
        self.call(reqwest::Method::GET, path, None, false).await
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        payload: Option<Bytes>,
        stream: bool,
    ) -> Result<UpstreamResponse, PassthroughError> {
        let url = join_url(&self.base_url, path);
        let mut attempts: u32 = 0;
        loop {
            attempts += 1;
            let retries_left = attempts <= self.retry.max_retries;
            let backoff = |retry_after| self.retry.delay_after(attempts - 1, retry_after);
            let failed = |error: PassthroughError| {
                if attempts == 1 {
                    error
                } else {
                    PassthroughError::RetriesExhausted {
                        attempts,
                        last: Box::new(error),
                    }
                }
            };
            let response = match self.attempt(&method, &url, payload.clone()).await {
                Ok(response) => response,
                Err(_) if retries_left => {
                    tokio::time::sleep(backoff(None)).await;
                    continue;
                }
                Err(error) => return Err(failed(error)),
            };
            let status = response.status();
            if retryable_status(status.as_u16()) && retries_left {
                let retry_after = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(parse_retry_after);
                drop(response);
                tokio::time::sleep(backoff(retry_after)).await;
                continue;
            }
            let content_type = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            // A server that cannot stream answers a stream request whole (as JSON): its
            // body is read whole, to be folded as the whole answer it is.
            let answered_whole = is_media_type(content_type.as_deref(), "application/json");
            let body = if stream && status.is_success() && !answered_whole {
                UpstreamBody::Stream(Box::pin(BodyStream::new(response, self.timeout)))
            } else {
                match read_whole(response, self.timeout).await {
                    Ok(bytes) => UpstreamBody::Full(bytes),
                    Err(_) if retries_left => {
                        tokio::time::sleep(backoff(None)).await;
                        continue;
                    }
                    Err(error) => return Err(failed(error)),
                }
            };
            return Ok(UpstreamResponse {
                status: status.as_u16(),
                content_type,
                format: self.format,
                body,
            });
        }
    }

    /// One attempt, up to the response headers.
    async fn attempt(
        &self,
        method: &reqwest::Method,
        url: &str,
        payload: Option<Bytes>,
    ) -> Result<reqwest::Response, PassthroughError> {
        let mut request = self.client.request(method.clone(), url);
        if let Some((name, value)) = &self.authorization {
            request = request.header(name.clone(), value.clone());
        }
        if self.format == WireFormat::AnthropicMessages {
            request = request.header("anthropic-version", crate::anthropic::API_VERSION);
        }
        if let Some(payload) = payload {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(payload);
        }
        match tokio::time::timeout(self.timeout, request.send()).await {
            Err(_) => Err(PassthroughError::Timeout {
                timeout: self.timeout,
            }),
            Ok(Err(error)) => Err(transport(error, self.timeout, false)),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

/// A streamed response body: the chunks as they arrive; an error item ends it.
pub type UpstreamStream = Pin<Box<dyn Stream<Item = Result<Bytes, PassthroughError>> + Send>>;

/// The upstream's answer, to be passed through unchanged.
#[derive(Debug)]
pub struct UpstreamResponse {
    /// The HTTP status, success or not.
    pub status: u16,
    /// The `Content-Type` header, when it was given (and is visible ASCII).
    pub content_type: Option<String>,
    /// The wire format the body is in (the upstream's).
    pub format: WireFormat,
    /// The body.
    pub body: UpstreamBody,
}

impl UpstreamResponse {
    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// True when the content type is `text/event-stream`: fold the body with
    /// [`AnswerAccumulator::push_sse_bytes`] rather than [`AnswerAccumulator::from_completion`].
    pub fn is_event_stream(&self) -> bool {
        is_media_type(self.content_type.as_deref(), "text/event-stream")
    }
}

/// True when the `Content-Type` value `content_type` names the media type `media` (its
/// parameters, such as `charset`, aside; case does not count).
fn is_media_type(content_type: Option<&str>, media: &str) -> bool {
    content_type.is_some_and(|content_type| {
        content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .eq_ignore_ascii_case(media)
    })
}

/// A response body: whole, or streamed chunk by chunk.
pub enum UpstreamBody {
    /// The whole body, byte for byte.
    Full(Bytes),
    /// The chunks as they arrive. A pause longer than the timeout, or a broken connection,
    /// yields one error item ([`PassthroughError::Stalled`], [`PassthroughError::Connection`])
    /// and ends the stream.
    Stream(UpstreamStream),
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamBody::Full(bytes) => write!(f, "Full({} bytes)", bytes.len()),
            UpstreamBody::Stream(_) => f.write_str("Stream(..)"),
        }
    }
}

impl UpstreamBody {
    /// The whole body: a full one as it is, a stream read to its end (its first error item
    /// is the error).
    pub async fn collect(self) -> Result<Bytes, PassthroughError> {
        match self {
            UpstreamBody::Full(bytes) => Ok(bytes),
            UpstreamBody::Stream(mut stream) => {
                let mut whole = Vec::new();
                while let Some(chunk) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx))
                    .await
                    .transpose()?
                {
                    whole.extend_from_slice(&chunk);
                }
                Ok(Bytes::from(whole))
            }
        }
    }
}

/// The assistant's answer folded from an upstream response.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The assistant message, built as [`crate::OpenAiProvider`] builds it: text content
    /// (reasoning, when the provider sends `reasoning_content`, as a reasoning part before
    /// it) and/or tool calls; content is `None` for a turn of tool calls only.
    pub message: Message,
    /// Provider-reported usage; a stream reports it only when the request asked
    /// (`stream_options.include_usage`).
    pub usage: Option<Usage>,
    /// The model that answered, as the upstream named it.
    pub model: Option<String>,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
}

/// Folds an upstream answer into an [`Answer`]: a whole one
/// ([`AnswerAccumulator::from_body`]: a `chat.completion`, or a message of Anthropic's API),
/// or the server-sent events of a streamed one fed in pieces split anywhere, even inside a
/// line or a UTF-8 character ([`AnswerAccumulator::push_sse_bytes`], then
/// [`AnswerAccumulator::finish`]). Only choice 0 is kept when the request asked for several.
#[derive(Debug, Default)]
pub struct AnswerAccumulator {
    decoder: SseDecoder,
    assembly: Assembly,
    /// The first problem met; later bytes are ignored.
    problem: Option<PassthroughError>,
}

/// A streamed answer being put back together, in its wire format.
#[derive(Debug)]
enum Assembly {
    OpenAi(StreamAssembly),
    Anthropic(crate::anthropic::StreamAssembly),
}

impl Default for Assembly {
    fn default() -> Assembly {
        Assembly::OpenAi(StreamAssembly::default())
    }
}

impl AnswerAccumulator {
    /// An empty accumulator, for a streamed chat completion.
    pub fn new() -> AnswerAccumulator {
        AnswerAccumulator::default()
    }

    /// An empty accumulator, for a streamed answer in `format`.
    pub fn for_format(format: WireFormat) -> AnswerAccumulator {
        AnswerAccumulator {
            assembly: match format {
                WireFormat::OpenAiChat => Assembly::OpenAi(StreamAssembly::default()),
                WireFormat::AnthropicMessages => {
                    Assembly::Anthropic(crate::anthropic::StreamAssembly::default())
                }
            },
            ..AnswerAccumulator::default()
        }
    }

    /// Reads a whole (non-streamed) answer in `format`.
    pub fn from_body(format: WireFormat, body: &[u8]) -> Result<Answer, PassthroughError> {
        match format {
            WireFormat::OpenAiChat => AnswerAccumulator::from_completion(body),
            WireFormat::AnthropicMessages => anthropic_answer(&answer_object(body)?),
        }
    }

    /// Feeds the next bytes of a `text/event-stream` body, split at any point. Never fails:
    /// a malformed chunk, or an error chunk, is reported by [`AnswerAccumulator::finish`].
    pub fn push_sse_bytes(&mut self, chunk: &[u8]) {
        self.push_sse_bytes_telling(chunk, &mut |_| {});
    }

    /// [`AnswerAccumulator::push_sse_bytes`], telling `on_delta` each piece of the answer
    /// as it arrives (text, reasoning, tool call fragments), for a door that writes the
    /// stream again in its client's format.
    pub fn push_sse_bytes_telling(
        &mut self,
        chunk: &[u8],
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) {
        if self.problem.is_some() {
            return;
        }
        let events = self.decoder.feed(chunk);
        self.absorb(events, on_delta);
    }

    /// Reads a whole (non-streamed) `chat.completion` body.
    pub fn from_completion(body: &[u8]) -> Result<Answer, PassthroughError> {
        let answer = answer_object(body)?;
        let completion = parse_completion(&answer).map_err(|problem| match problem {
            CompletionProblem::NoChoice => PassthroughError::NoChoice,
            CompletionProblem::Message(detail) => PassthroughError::Malformed { detail },
        })?;
        Ok(Answer {
            message: completion.message,
            usage: completion.usage,
            model: completion.model,
            finish_reason: completion.finish_reason,
        })
    }

    /// Ends the stream and returns the answer: an error when a chunk was not JSON or was
    /// an error object, or when no chunk carried choice 0.
    pub fn finish(mut self) -> Result<Answer, PassthroughError> {
        if self.problem.is_none() {
            let last = self.decoder.finish();
            self.absorb(last, &mut |_| {});
        }
        if let Some(problem) = self.problem {
            return Err(problem);
        }
        let assembly = match self.assembly {
            Assembly::OpenAi(assembly) => assembly,
            Assembly::Anthropic(assembly) => {
                if !assembly.started() {
                    return Err(PassthroughError::Malformed {
                        detail: "the stream has no `message_start` event".to_owned(),
                    });
                }
                let ended = assembly.ended();
                let answer = anthropic_answer(&assembly.into_answer())?;
                if !ended {
                    return Err(PassthroughError::Truncated {
                        partial: Some(Box::new(answer.message)),
                    });
                }
                return Ok(answer);
            }
        };
        if !assembly.saw_choice() {
            return Err(PassthroughError::NoChoice);
        }
        let ended = assembly.ended();
        let completion = assembly.finish();
        if !ended {
            return Err(PassthroughError::Truncated {
                partial: Some(Box::new(completion.message)),
            });
        }
        Ok(Answer {
            message: completion.message,
            usage: completion.usage,
            model: completion.model,
            finish_reason: completion.finish_reason,
        })
    }

    /// What has arrived of the answer, whether or not it ended (`None` when nothing usable
    /// did).
    pub fn arrived(self) -> Option<Message> {
        match self.finish() {
            Ok(answer) => Some(answer.message),
            Err(PassthroughError::Truncated { partial }) => partial.map(|message| *message),
            Err(_) => None,
        }
    }

    fn absorb(
        &mut self,
        events: impl IntoIterator<Item = SseEvent>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) {
        let assembly = match &mut self.assembly {
            Assembly::OpenAi(assembly) => assembly,
            Assembly::Anthropic(assembly) => {
                for event in events {
                    let data: Value = match serde_json::from_str(&event.data) {
                        Ok(data) => data,
                        Err(error) => {
                            self.problem = Some(PassthroughError::Malformed {
                                detail: format!(
                                    "a stream event is not JSON ({error}): {}",
                                    event.data
                                ),
                            });
                            return;
                        }
                    };
                    if data.get("type").and_then(Value::as_str) == Some("error") {
                        self.problem = Some(PassthroughError::Reported {
                            detail: data.get("error").unwrap_or(&data).to_string(),
                        });
                        return;
                    }
                    assembly.absorb(&data, on_delta);
                }
                return;
            }
        };
        for event in events {
            if let Err(problem) = assembly.absorb_data(&event.data, on_delta) {
                self.problem = Some(match problem {
                    ChunkProblem::NotJson { .. } => PassthroughError::Malformed {
                        detail: problem.to_string(),
                    },
                    ChunkProblem::Reported(detail) => PassthroughError::Reported { detail },
                });
                return;
            }
        }
    }
}

/// A whole answer's body as JSON, unless it is not JSON or is an error object (both formats
/// answer errors with an `error` field).
fn answer_object(body: &[u8]) -> Result<Value, PassthroughError> {
    let answer: Value = serde_json::from_slice(body).map_err(|e| PassthroughError::Malformed {
        detail: format!("the body is not JSON ({e})"),
    })?;
    match answer.get("error") {
        Some(error) => Err(PassthroughError::Reported {
            detail: error.to_string(),
        }),
        None => Ok(answer),
    }
}

/// An Anthropic answer (whole, or put back together from its stream) as an [`Answer`].
fn anthropic_answer(answer: &Value) -> Result<Answer, PassthroughError> {
    let read = crate::anthropic::read_answer(answer)
        .map_err(|detail| PassthroughError::Malformed { detail })?;
    Ok(Answer {
        message: read.message,
        usage: read.usage,
        model: read.model,
        finish_reason: read.stop_reason,
    })
}

/// Passes a streamed body through unchanged while folding it into an [`Answer`]. `on_end`
/// is called exactly once: with [`AnswerAccumulator::finish`]'s result when the stream
/// ends, with the error when it yields an error item, and with
/// [`PassthroughError::Interrupted`] when it is dropped before either (the client went
/// away), carrying the answer as far as it had come.
/// The stream is read as `format`'s events.
pub fn record_stream<F>(stream: UpstreamStream, format: WireFormat, on_end: F) -> UpstreamStream
where
    F: FnOnce(Result<Answer, PassthroughError>) + Send + 'static,
{
    Box::pin(RecordedStream {
        inner: stream,
        accumulator: Some(AnswerAccumulator::for_format(format)),
        on_end: Some(Box::new(on_end)),
    })
}

type OnEnd = Box<dyn FnOnce(Result<Answer, PassthroughError>) + Send>;

struct RecordedStream {
    inner: UpstreamStream,
    /// `None` once the stream has ended.
    accumulator: Option<AnswerAccumulator>,
    on_end: Option<OnEnd>,
}

impl RecordedStream {
    fn end(&mut self, outcome: impl FnOnce(AnswerAccumulator) -> Result<Answer, PassthroughError>) {
        if let (Some(accumulator), Some(on_end)) = (self.accumulator.take(), self.on_end.take()) {
            on_end(outcome(accumulator));
        }
    }
}

impl Stream for RecordedStream {
    type Item = Result<Bytes, PassthroughError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.accumulator.is_none() {
            return Poll::Ready(None);
        }
        let item = std::task::ready!(self.inner.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(accumulator) = self.accumulator.as_mut() {
                    accumulator.push_sse_bytes(chunk);
                }
            }
            Some(Err(error)) => {
                let error = error.clone();
                self.end(|_| Err(error));
            }
            None => self.end(AnswerAccumulator::finish),
        }
        Poll::Ready(item)
    }
}

impl Drop for RecordedStream {
    fn drop(&mut self) {
        self.end(|accumulator| {
            Err(PassthroughError::Interrupted {
                partial: accumulator.arrived().map(Box::new),
            })
        });
    }
}

/// What one step of a [`BodyStream`] gives: the item and the response to read on from, or
/// `None` at the end of the body.
type Step = Option<(Result<Bytes, PassthroughError>, Option<reqwest::Response>)>;

/// A response body as a stream of its chunks, each awaited at most `timeout`.
struct BodyStream {
    next: Option<Pin<Box<dyn Future<Output = Step> + Send>>>,
    timeout: Duration,
}

impl BodyStream {
    fn new(response: reqwest::Response, timeout: Duration) -> BodyStream {
        BodyStream {
            next: Some(Box::pin(step(response, timeout))),
            timeout,
        }
    }
}

async fn step(mut response: reqwest::Response, timeout: Duration) -> Step {
    match next_chunk(&mut response, timeout).await {
        Ok(Some(chunk)) => Some((Ok(chunk), Some(response))),
        Ok(None) => None,
        Err(error) => Some((Err(error), None)),
    }
}

impl Stream for BodyStream {
    type Item = Result<Bytes, PassthroughError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(next) = self.next.as_mut() else {
            return Poll::Ready(None);
        };
        let step_result = std::task::ready!(next.as_mut().poll(cx));
        match step_result {
            None => {
                self.next = None;
                Poll::Ready(None)
            }
            Some((item, response)) => {
                let timeout = self.timeout;
                self.next = response.map(|response| {
                    Box::pin(step(response, timeout)) as Pin<Box<dyn Future<Output = Step> + Send>>
                });
                Poll::Ready(Some(item))
            }
        }
    }
}

/// The next non-empty chunk of a body, `None` at its end.
async fn next_chunk(
    response: &mut reqwest::Response,
    timeout: Duration,
) -> Result<Option<Bytes>, PassthroughError> {
    loop {
        match tokio::time::timeout(timeout, response.chunk()).await {
            Err(_) => return Err(PassthroughError::Stalled { timeout }),
            Ok(Err(error)) => return Err(transport(error, timeout, true)),
            Ok(Ok(Some(chunk))) if chunk.is_empty() => continue,
            Ok(Ok(chunk)) => return Ok(chunk),
        }
    }
}

/// Reads a whole body, each chunk awaited at most `timeout`.
async fn read_whole(
    mut response: reqwest::Response,
    timeout: Duration,
) -> Result<Bytes, PassthroughError> {
    let Some(first) = next_chunk(&mut response, timeout).await? else {
        return Ok(Bytes::new());
    };
    let Some(second) = next_chunk(&mut response, timeout).await? else {
        return Ok(first);
    };
    let mut whole = Vec::with_capacity(first.len() + second.len());
    whole.extend_from_slice(&first);
    whole.extend_from_slice(&second);
    while let Some(chunk) = next_chunk(&mut response, timeout).await? {
        whole.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(whole))
}

/// Maps an HTTP client error; `reading` tells whether a body was being read (a timeout
/// there is a stall).
fn transport(error: reqwest::Error, timeout: Duration, reading: bool) -> PassthroughError {
    if error.is_timeout() {
        return if reading {
            PassthroughError::Stalled { timeout }
        } else {
            PassthroughError::Timeout { timeout }
        };
    }
    PassthroughError::Connection {
        detail: chain(&error.without_url()),
    }
}

/// An error and its sources, joined by `: `.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A URL with any password in it replaced, for `Debug` output.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("redacted"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Not a URL: it may still hold a secret, so it is not shown.
        Err(_) => "<invalid URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_stream_content_types() {
        let response = |content_type: Option<&str>| UpstreamResponse {
            status: 200,
            content_type: content_type.map(str::to_owned),
            format: WireFormat::OpenAiChat,
            body: UpstreamBody::Full(Bytes::new()),
        };
        assert!(response(Some("text/event-stream")).is_event_stream());
        assert!(response(Some("Text/Event-Stream; charset=utf-8")).is_event_stream());
        assert!(!response(Some("application/json")).is_event_stream());
        assert!(!response(None).is_event_stream());
    }

    #[test]
    fn urls_are_redacted_for_debug() {
        assert_eq!(
            redact_url("https://user:hunter2@h.example/v1"),
            "https://user:redacted@h.example/v1"
        );
        assert_eq!(redact_url("http://h/v1"), "http://h/v1");
        assert_eq!(redact_url("not a url sk-123"), "<invalid URL>");
    }

    #[test]
    fn error_chains_skip_repeated_text() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "request failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&error), "request failed: connection refused");
    }
}
