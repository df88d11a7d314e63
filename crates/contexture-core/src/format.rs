//! Provider wire formats: lossless import and export of OpenAI chat and
//! Anthropic messages.
//!
//! - [`openai`]: OpenAI chat-completions messages, one wire message per [`Message`];
//!   [`openai_completion`] writes an answer as a `chat.completion` and its chunks.
//! - [`anthropic`]: an Anthropic Messages API request body (`system` plus `messages`), where
//!   one wire turn may become several neutral messages (tool results) and the system prompt
//!   is lifted into a leading system message; [`anthropic_answer`] writes an answer as
//!   Anthropic's `message` object and its stream of events.
//! - [`responses`]: OpenAI Responses API items, where one assistant turn is several items
//!   (reasoning, message, function calls) and one neutral message; [`responses_request`]
//!   reads a Responses request body as a door needs it, [`responses_answer`] writes the
//!   `response` object and [`responses_stream`] its stream of events.
//! - [`WireFormat`]: either of them chosen by name (`openai`, `anthropic`), for callers that
//!   take the format as a setting.
//!
//! Both directions are pure functions over [`serde_json::Value`]. Reading never panics: bad
//! input is a [`FormatError`] naming the place in the input (for example
//! `messages[3].tool_calls[0].function.arguments: expected a string, found a number`).
//!
//! Fields and parts the neutral model has no place for are kept (in the `extra` maps, or as
//! [`Part::Other`]) and written back by the same format, so that a realistic message survives
//! a round trip unchanged. Each module documents what does not carry over to the other
//! format.
//!
//! [`Message`]: crate::message::Message
//! [`Part::Other`]: crate::message::Part::Other

pub mod anthropic;
pub mod anthropic_answer;
pub mod anthropic_edits;
pub mod anthropic_request;
pub mod openai;
pub mod openai_completion;
pub mod openai_raw;
pub mod openai_request;
pub mod responses;
pub mod responses_answer;
pub mod responses_request;
pub mod responses_stream;

use serde_json::{Map, Value};

use crate::message::Message;

/// A writer of an answer's stream in one API's format, fed the answer's pieces as they
/// arrive (whatever format they came in): [`responses_stream::ResponseStream`],
/// [`openai_completion::CompletionStream`], [`anthropic_answer::MessageStream`]. Each
/// returns the text of the events the piece becomes.
pub trait AnswerPieces {
    /// A piece of the answer's text.
    fn text(&mut self, delta: &str) -> String;

    /// A piece of its reasoning.
    fn reasoning(&mut self, delta: &str) -> String;

    /// A piece of the tool call at `index` (`index` orders the turn's calls; `id` and
    /// `name` come with its first piece, `arguments` is the new piece of its JSON
    /// arguments).
    fn tool_call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> String;
}

/// A provider wire format, by the name used on command lines and in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// OpenAI chat completions ([`openai`]).
    OpenAi,
    /// Anthropic Messages API ([`anthropic`]).
    Anthropic,
}

/// A wire format name that is not one of the known formats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown message format `{name}` (known formats: openai, anthropic)")]
pub struct UnknownFormat {
    /// The name that was asked for.
    pub name: String,
}

impl WireFormat {
    /// Every format.
    pub const ALL: [WireFormat; 2] = [WireFormat::OpenAi, WireFormat::Anthropic];

    /// The format's name: `openai` or `anthropic`.
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::OpenAi => "openai",
            WireFormat::Anthropic => "anthropic",
        }
    }

    /// Looks a format up by its name.
    pub fn from_name(name: &str) -> Result<WireFormat, UnknownFormat> {
        WireFormat::ALL
            .into_iter()
            .find(|format| format.name() == name)
            .ok_or_else(|| UnknownFormat {
                name: name.to_owned(),
            })
    }

    /// Reads neutral messages: for OpenAI a JSON array of messages or a request body with
    /// `messages` ([`openai::parse_request`]); for Anthropic a request body with `system` and
    /// `messages` ([`anthropic::parse_request`]).
    pub fn parse(self, value: &Value) -> Result<Vec<Message>, FormatError> {
        match self {
            WireFormat::OpenAi if value.is_array() => openai::parse_messages(value),
            WireFormat::OpenAi => openai::parse_request(value),
            WireFormat::Anthropic => anthropic::parse_request(value),
        }
    }

    /// Writes neutral messages: for OpenAI a JSON array of messages (never fails); for
    /// Anthropic `{"system": ..., "messages": [...]}`, which fails for what the format cannot
    /// express (see [`anthropic`]).
    pub fn write(self, messages: &[Message]) -> Result<Value, FormatError> {
        match self {
            WireFormat::OpenAi => Ok(openai::to_values(messages)),
            WireFormat::Anthropic => anthropic::to_request(messages),
        }
    }
}

impl std::fmt::Display for WireFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WireFormat {
    type Err = UnknownFormat;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        WireFormat::from_name(name)
    }
}

/// A wire message that cannot be read, or a neutral message that cannot be written in a
/// format. Every variant names the place it is about (`path`), in the wire form's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A field holds a value of the wrong JSON type.
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        /// Where the value is, e.g. `messages[3].tool_calls[0].function.arguments`.
        path: String,
        /// What the format wants there, e.g. `a string`.
        expected: &'static str,
        /// The JSON type that was found, e.g. `a number`.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("{path}: missing required field")]
    MissingField {
        /// The field that is missing, e.g. `messages[0].role`.
        path: String,
    },
    /// A role name the format does not have.
    #[error("{path}: unknown role `{role}` (expected {expected})")]
    UnknownRole {
        /// Where the role is.
        path: String,
        /// The role name that was found.
        role: String,
        /// The roles the format accepts.
        expected: &'static str,
    },
    /// A value of the right type whose content is not allowed there.
    #[error("{path}: {reason}")]
    Invalid {
        /// Where the value is.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A neutral message that the target format has no way to express.
    #[error("{path}: cannot be written in the {format} format: {reason}")]
    Unmappable {
        /// The neutral message (and field) concerned, e.g. `messages[4].tool_call_id`.
        path: String,
        /// The target format, `openai` or `anthropic`.
        format: &'static str,
        /// Why it cannot be written.
        reason: String,
    },
}

impl FormatError {
    /// The place in the input the error is about.
    pub fn path(&self) -> &str {
        match self {
            FormatError::WrongType { path, .. }
            | FormatError::MissingField { path }
            | FormatError::UnknownRole { path, .. }
            | FormatError::Invalid { path, .. }
            | FormatError::Unmappable { path, .. } => path,
        }
    }
}

/// The format a client takes items off a conversation in, one at a time (a session that
/// rewinds a turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemFormat {
    /// Chat completions: an item is a message.
    #[default]
    Openai,
    /// The Responses API: an item is one of a turn's items (its reasoning, its text, each
    /// function call).
    Responses,
}

impl ItemFormat {
    /// `message` split into what stays of it and its last item in this format (`None` for a
    /// message of no item): in the chat format the message is one item and nothing stays.
    pub fn split_last_item(
        self,
        message: &Message,
    ) -> Result<(Vec<Message>, Option<Value>), FormatError> {
        match self {
            ItemFormat::Openai => Ok((Vec::new(), Some(openai::to_value(message)))),
            ItemFormat::Responses => responses::split_last_item(message),
        }
    }
}

/// The JSON type of `value`, with an article ("a string", "an object"), for error messages.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A [`FormatError::WrongType`] for `value` at `path`.
fn wrong_type(path: impl Into<String>, expected: &'static str, value: &Value) -> FormatError {
    FormatError::WrongType {
        path: path.into(),
        expected,
        found: json_type(value),
    }
}

/// `value` as an object, or a [`FormatError::WrongType`].
fn expect_object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, FormatError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(path, "an object", value))
}

/// `value` as an array, or a [`FormatError::WrongType`].
fn expect_array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, FormatError> {
    value
        .as_array()
        .ok_or_else(|| wrong_type(path, "an array", value))
}

/// The string field `key` of `object`, or an error when it is absent or not a string.
fn required_str<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, FormatError> {
    match object.get(key) {
        Some(Value::String(text)) => Ok(text),
        Some(other) => Err(wrong_type(format!("{path}.{key}"), "a string", other)),
        None => Err(FormatError::MissingField {
            path: format!("{path}.{key}"),
        }),
    }
}

/// The string field `key` of `object` if present, or an error when it is not a string.
fn optional_str(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, FormatError> {
    match object.get(key) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(wrong_type(format!("{path}.{key}"), "a string", other)),
    }
}

/// The entries of `object` whose keys are not in `known`, in their original order.
fn extra_fields(object: &Map<String, Value>, known: &[&str]) -> Map<String, Value> {
    object
        .iter()
        .filter(|(key, _)| !known.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// Appends the `extra` entries to `object`, skipping keys the format already wrote (a
/// format's own fields always win over an `extra` entry of the same name).
fn append_extra(object: &mut Map<String, Value>, extra: &Map<String, Value>) {
    for (key, value) in extra {
        if !object.contains_key(key) {
            object.insert(key.clone(), value.clone());
        }
    }
}
