//! A Responses request as the Responses door reads it, and what the door writes back: the
//! body read by the core (a malformed field is a 400 naming it), the thread and point it
//! continues (a response id names a request of a thread: `resp_<seq>_<thread in URL-safe
//! base64>`, read back without any table, so another tenant's id names a thread the tenant's
//! view does not have), and the fields a response object echoes, kept with the request's
//! record so that a stored response reads back as it was answered.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use contexture_core::format::responses_answer::{
    ResponseHeader, ResponseStatus, compaction_item, output_items, response_object,
};
use contexture_core::format::responses_request::{ResponsesBody, Truncation, read_responses_body};
use contexture_core::thread::Usage;
use contexture_core::{Content, Message, Part};
use contexture_llm::wire::{ChatCall, ClientFormat, ClientRequest};
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::tenancy::check_id;

/// The fields of a request a response object echoes.
const ECHOED: &[&str] = &[
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "metadata",
    "store",
    "truncation",
    "text",
    "reasoning",
];

/// What names a stored response: its thread and the seq of its request's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseId {
    /// The thread, as the tenant names it.
    pub thread: String,
    /// The seq of the request's record.
    pub request_seq: u64,
}

impl ResponseId {
    /// The id of the response whose request `thread` recorded at `request_seq`.
    pub fn encode(thread: &str, request_seq: u64) -> String {
        format!("resp_{request_seq}_{}", URL_SAFE_NO_PAD.encode(thread))
    }

    /// The response an id names, when it is one this door made for a stored response.
    pub fn decode(id: &str) -> Option<ResponseId> {
        ResponseId::from_seed(id.strip_prefix("resp_")?)
    }

    /// The response `id` names: 404 (naming the response) for an id this door did not make.
    pub fn named(id: &str) -> ApiResult<ResponseId> {
        ResponseId::decode(id).ok_or_else(|| no_response(id))
    }

    /// The stored response whose output held the item `item_id` (`msg_…`, `fc_…`, `rs_…`:
    /// see [`output_items`]), when a stored response of this door wrote it.
    pub fn of_output_item(item_id: &str) -> Option<ResponseId> {
        let (kind, rest) = item_id.split_once('_')?;
        if !matches!(kind, "msg" | "fc" | "rs") {
            return None;
        }
        let (seed, place) = rest.rsplit_once('_')?;
        if place.is_empty() || !place.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        ResponseId::from_seed(seed)
    }

    /// The response whose item seed (see [`id_seed`]) is `seed`.
    fn from_seed(seed: &str) -> Option<ResponseId> {
        let (seq, thread) = seed.split_once('_')?;
        let request_seq = seq.parse().ok().filter(|seq| *seq > 0)?;
        let thread = String::from_utf8(URL_SAFE_NO_PAD.decode(thread).ok()?).ok()?;
        check_id("the thread", &thread).ok()?;
        Some(ResponseId {
            thread,
            request_seq,
        })
    }

    /// The id of a response nothing was stored of: no [`ResponseId::decode`] reads it.
    pub fn unstored() -> String {
        format!("resp_n{}", new_token())
    }
}

/// A new random token of letters and digits.
pub(crate) fn new_token() -> String {
    contexture_engine::system::new_id(&contexture_engine::system::RandomIds::default())
        .replace('-', "")
}

/// A `POST /v1/responses` request, read.
pub(crate) struct ResponsesCall {
    /// The body as the core read it.
    pub read: ResponsesBody,
    /// The call: the parameters every upstream reads, and the body as it came.
    pub call: ChatCall,
    /// The response it continues, when it names one.
    pub previous: Option<ResponseId>,
    /// What a response object echoes of it, kept with its record.
    pub echo: Value,
}

impl ResponsesCall {
    /// Reads a body; `created_at` is when the response is made (seconds since the epoch).
    pub fn parse(body: Value, created_at: u64) -> ApiResult<ResponsesCall> {
        let Value::Object(body) = body else {
            return Err(ApiError::invalid("body", "the body must be a JSON object"));
        };
        let read = read_responses_body(&body)
            .map_err(|error| ApiError::invalid(error.field, error.message))?;
        let previous = match &read.previous_response_id {
            Some(id) => Some(ResponseId::named(id)?),
            None => None,
        };
        if let Some(conversation) = &read.conversation {
            check_id("the conversation", conversation)
                .map_err(|problem| ApiError::invalid("conversation", problem))?;
        }
        let mut request = Map::new();
        for field in ECHOED {
            if let Some(value) = body.get(*field) {
                request.insert((*field).to_owned(), value.clone());
            }
        }
        let echo = json!({
            "created_at": created_at,
            "model": read.model,
            "instructions": read.instructions,
            "previous_response_id": read.previous_response_id,
            "conversation": read.conversation,
            "request": request,
        });
        let call = ChatCall {
            model: read.model.clone(),
            tools: read.tools.clone(),
            response_format: read.response_format.clone(),
            max_tokens: read.max_output_tokens,
            stream: read.stream,
            client: ClientRequest {
                format: ClientFormat::OpenAiResponses,
                body,
            },
        };
        Ok(ResponsesCall {
            read,
            call,
            previous,
            echo,
        })
    }

    /// True when an input over the model's window is refused rather than fitted.
    pub fn refuses_overflow(&self) -> bool {
        self.read.truncation == Truncation::Disabled
    }
}

/// Where an input sent whole continues a stored response: the index of its last message
/// holding an output item a stored response of this door wrote (a client that keeps its
/// own history sends the earlier responses' items back as they came), and that response.
/// The messages after it are what the request brings.
pub(crate) fn continued_by_items(input: &[Message]) -> Option<(usize, ResponseId)> {
    input.iter().enumerate().rev().find_map(|(index, message)| {
        item_ids(message)
            .filter_map(ResponseId::of_output_item)
            .last()
            .map(|id| (index, id))
    })
}

/// The output item ids a message read from Responses items keeps: its own (a message
/// item's), its reasoning's and its function calls', in item order.
fn item_ids(message: &Message) -> impl Iterator<Item = &str> {
    let reasoning = match &message.content {
        Some(Content::Parts(parts)) => parts.as_slice(),
        _ => &[],
    }
    .iter()
    .filter_map(|part| match part {
        Part::Reasoning { extra, .. } => extra.get("id"),
        _ => None,
    });
    reasoning
        .chain(message.extra.get("id"))
        .chain(
            message
                .tool_calls
                .iter()
                .filter_map(|call| call.extra.get("id")),
        )
        .filter_map(Value::as_str)
}

/// The seed the ids of the items of response `id` are made from: the id without `resp_`.
pub(crate) fn id_seed(id: &str) -> &str {
    id.strip_prefix("resp_").unwrap_or(id)
}

/// 404 for a response id the tenant has no response under.
pub(crate) fn no_response(id: &str) -> ApiError {
    ApiError::not_found("response", id)
}

/// A response object's header fields, owned: what the door echoes (see
/// [`ResponsesCall::echo`]) and the response's id.
#[derive(Debug, Clone)]
pub(crate) struct ResponseFacts {
    /// The response's id.
    pub id: String,
    /// What the request's record keeps for the door.
    pub echo: Value,
}

impl ResponseFacts {
    fn text(&self, field: &str) -> Option<&str> {
        self.echo.get(field).and_then(Value::as_str)
    }

    /// The header of the response object.
    pub fn header(&self) -> ResponseHeader<'_> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        ResponseHeader {
            id: &self.id,
            created_at: self
                .echo
                .get("created_at")
                .and_then(Value::as_u64)
                .unwrap_or_default(),
            model: self.text("model").unwrap_or_default(),
            previous_response_id: self.text("previous_response_id"),
            conversation: self.text("conversation"),
            instructions: self.text("instructions"),
            request: match self.echo.get("request") {
                Some(Value::Object(request)) => request,
                _ => EMPTY.get_or_init(Map::new),
            },
        }
    }

    /// The seed the ids of the response's output items are made from.
    pub fn seed(&self) -> &str {
        id_seed(&self.id)
    }

    /// The whole response object for an answer: a compaction item first when `summary`
    /// stands for compacted history, then the answer's items.
    pub fn object(
        &self,
        status: &ResponseStatus,
        summary: Option<&[Message]>,
        answer: Option<&Message>,
        usage: Option<Usage>,
    ) -> Value {
        let mut output = Vec::new();
        if let Some(summary) = summary {
            output.push(compaction_item(summary, self.seed()));
        }
        if let Some(answer) = answer {
            output.extend(output_items(answer, self.seed()));
        }
        response_object(&self.header(), status, output, usage)
    }
}
