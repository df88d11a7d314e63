//! Scripted replies: what the fake answers, and when.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::render::{Completion, Usage};
use crate::{Endpoint, MODEL};

/// One scripted answer: a status, headers and a body, and when each part is sent.
///
/// A completion ([`Reply::text`], [`Reply::text_in_pieces`], [`Reply::tool_call`]) takes the
/// shape the call asks for: OpenAI's or Anthropic's format by route, whole or as server-sent
/// events by the request's `stream`. Every other reply is sent as it is given.
#[derive(Debug, Clone)]
#[must_use]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: ReplyBody,
    /// How long before the status and headers are sent.
    delay: Duration,
    /// How long between two chunks of the body.
    gap: Duration,
    /// After this many chunks, a wait this long.
    pause: Option<(usize, Duration)>,
}

#[derive(Debug, Clone)]
enum ReplyBody {
    Completion(Completion),
    /// A body sent as it is, in these chunks.
    Chunks {
        content_type: String,
        chunks: Vec<Bytes>,
    },
    Hang,
}

impl Reply {
    fn new(status: u16, body: ReplyBody) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body,
            delay: Duration::ZERO,
            gap: Duration::ZERO,
            pause: None,
        }
    }

    /// A completion whose answer is `text`, with usage (10 tokens in, 2 out), finished with
    /// `stop`. Streamed, it comes a word at a time (each piece ends with its space).
    pub fn text(text: impl Into<String>) -> Reply {
        let text = text.into();
        let mut pieces: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
        if pieces.is_empty() {
            pieces.push(String::new());
        }
        Reply::text_in_pieces(pieces)
    }

    /// A completion whose answer is `pieces` joined; streamed, one piece per event.
    pub fn text_in_pieces<S: Into<String>>(pieces: impl IntoIterator<Item = S>) -> Reply {
        Reply::completion_of(Some(pieces.into_iter().map(Into::into).collect()))
    }

    /// A completion with no text that calls one tool, finished with `tool_calls` (OpenAI) or
    /// `tool_use` (Anthropic), with usage (10 tokens in, 2 out).
    pub fn tool_call(id: &str, name: &str, arguments: Value) -> Reply {
        Reply::completion_of(None).with_tool_call(id, name, arguments)
    }

    fn completion_of(pieces: Option<Vec<String>>) -> Reply {
        Reply::new(
            200,
            ReplyBody::Completion(Completion {
                pieces,
                tool_calls: Vec::new(),
                usage: Some(Usage {
                    input: 10,
                    output: 2,
                }),
                model: MODEL.to_owned(),
            }),
        )
    }

    /// The same completion calling one more tool, after its text and earlier calls.
    ///
    /// # Panics
    ///
    /// When the reply is not a completion.
    pub fn with_tool_call(mut self, id: &str, name: &str, arguments: Value) -> Reply {
        self.completion("with_tool_call").tool_calls.push((
            id.to_owned(),
            name.to_owned(),
            arguments,
        ));
        self
    }

    /// The same completion reporting this usage.
    ///
    /// # Panics
    ///
    /// When the reply is not a completion.
    pub fn usage(mut self, input_tokens: u64, output_tokens: u64) -> Reply {
        self.completion("usage").usage = Some(Usage {
            input: input_tokens,
            output: output_tokens,
        });
        self
    }

    /// The same completion reporting no usage at all, as servers that do not count (or a
    /// stream not asked to) answer.
    ///
    /// # Panics
    ///
    /// When the reply is not a completion.
    pub fn no_usage(mut self) -> Reply {
        self.completion("no_usage").usage = None;
        self
    }

    /// The same completion naming `model` as the model that answered.
    ///
    /// # Panics
    ///
    /// When the reply is not a completion.
    pub fn model(mut self, model: &str) -> Reply {
        self.completion("model").model = model.to_owned();
        self
    }

    /// An error in OpenAI's shape, `{"error": {"message": ..., "type": ...}}`, with `status`.
    pub fn error(status: u16, message: &str) -> Reply {
        let kind = if status < 500 {
            "invalid_request_error"
        } else {
            "server_error"
        };
        Reply::json(status, json!({"error": {"message": message, "type": kind}}))
    }

    /// `body` as JSON, with `status`.
    pub fn json(status: u16, body: Value) -> Reply {
        Reply::raw(status, "application/json", body.to_string())
    }

    /// `body` byte for byte, with `status` and `content_type`: for answers a re-serialization
    /// would change, and for garbage.
    pub fn raw(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
        Reply::new(
            status,
            ReplyBody::Chunks {
                content_type: content_type.to_owned(),
                chunks: vec![body.into()],
            },
        )
    }

    /// A 200 with `content_type` whose body is `chunks`, each sent on its own (see
    /// [`Reply::gap`] and [`Reply::pause_after`] for the time between them).
    pub fn chunks(content_type: &str, chunks: impl IntoIterator<Item = Bytes>) -> Reply {
        Reply::new(
            200,
            ReplyBody::Chunks {
                content_type: content_type.to_owned(),
                chunks: chunks.into_iter().collect(),
            },
        )
    }

    /// A 200 OpenAI event stream: each of `events` as a `data:` event, then `data: [DONE]`.
    pub fn event_stream(events: &[Value]) -> Reply {
        let mut chunks: Vec<Bytes> = events
            .iter()
            .map(|event| Bytes::from(format!("data: {event}\n\n")))
            .collect();
        chunks.push(Bytes::from_static(b"data: [DONE]\n\n"));
        Reply::chunks("text/event-stream", chunks)
    }

    /// A 200 Anthropic event stream: each of `events` named by its `type`.
    ///
    /// # Panics
    ///
    /// When an event has no string `type`.
    pub fn anthropic_event_stream(events: &[Value]) -> Reply {
        Reply::chunks(
            "text/event-stream",
            events.iter().map(|event| {
                let kind = event["type"]
                    .as_str()
                    .unwrap_or_else(|| panic!("an Anthropic event without a type: {event}"));
                Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
            }),
        )
    }

    /// No answer at all: the connection stays open, silent, until the client gives up or
    /// the test's runtime ends.
    pub fn hang() -> Reply {
        Reply::new(200, ReplyBody::Hang)
    }

    /// The same reply with one more header (replacing one of that name).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The same reply, its status and headers sent only after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// The same reply with `gap` between two chunks of its body.
    pub fn gap(mut self, gap: Duration) -> Reply {
        self.gap = gap;
        self
    }

    /// The same reply, silent for `pause` once `chunks` chunks of its body are sent: a
    /// stream that stalls midway, or (with `chunks` at least the number of chunks) one
    /// that stays open that long after its last byte.
    pub fn pause_after(mut self, chunks: usize, pause: Duration) -> Reply {
        self.pause = Some((chunks, pause));
        self
    }

    #[track_caller]
    fn completion(&mut self, method: &str) -> &mut Completion {
        match &mut self.body {
            ReplyBody::Completion(completion) => completion,
            other => panic!("Reply::{method} applies to a completion, not to {other:?}"),
        }
    }

    /// The response to call number `number` (0 for other routes) on `endpoint`.
    pub(crate) async fn respond(self, endpoint: Endpoint, number: usize, stream: bool) -> Response {
        tokio::time::sleep(self.delay).await;
        let (content_type, chunks) = match self.body {
            ReplyBody::Hang => std::future::pending().await,
            ReplyBody::Chunks {
                content_type,
                chunks,
            } => (content_type, chunks),
            ReplyBody::Completion(completion) => {
                let chunks = match (endpoint == Endpoint::AnthropicMessages, stream) {
                    (false, false) => vec![Bytes::from(completion.openai(number).to_string())],
                    (false, true) => completion.openai_events(number),
                    (true, false) => vec![Bytes::from(completion.anthropic(number).to_string())],
                    (true, true) => completion.anthropic_events(number),
                };
                let content_type = if stream {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                (content_type.to_owned(), chunks)
            }
        };
        let mut response = Response::new(body(chunks, self.gap, self.pause));
        *response.status_mut() = StatusCode::from_u16(self.status).expect("a valid status");
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(&content_type).expect("a valid content type"),
        );
        for (name, value) in self.headers {
            headers.insert(
                HeaderName::try_from(name).expect("a valid header name"),
                HeaderValue::from_str(&value).expect("a valid header value"),
            );
        }
        response
    }
}

/// A body of `chunks`, each its own frame when there is more than one or a pause to make.
fn body(chunks: Vec<Bytes>, gap: Duration, pause: Option<(usize, Duration)>) -> Body {
    if chunks.len() <= 1 && pause.is_none() {
        return chunks
            .into_iter()
            .next()
            .map_or_else(Body::empty, Body::from);
    }
    let count = chunks.len();
    let pause_before = |index: usize| match pause {
        Some((after, pause)) if after == index => pause,
        _ => Duration::ZERO,
    };
    // Each step waits, then sends its chunk; a pause after the last chunk is a step with
    // nothing to send, so the body ends only when it is over.
    let mut steps: Vec<(Duration, Option<Bytes>)> = chunks
        .into_iter()
        .enumerate()
        .map(|(index, chunk)| {
            let gap = if index == 0 { Duration::ZERO } else { gap };
            (gap + pause_before(index), Some(chunk))
        })
        .collect();
    if let Some((after, pause)) = pause
        && after >= count
    {
        steps.push((pause, None));
    }
    let frames = futures_util::stream::iter(steps)
        .then(|(wait, chunk)| async move {
            tokio::time::sleep(wait).await;
            chunk
        })
        .filter_map(|chunk| std::future::ready(chunk.map(Ok::<_, Infallible>)));
    Body::from_stream(frames)
}
