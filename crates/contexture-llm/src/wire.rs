//! What a chat call sends, whatever wire format its client spoke and whichever format its
//! upstream speaks.
//!
//! A door reads its client's request into a [`ChatCall`]: the parameters every upstream
//! understands (the model, the tool schemas, a structured-output schema, the reply's token
//! limit, whether to stream) and the request itself as the client sent it
//! ([`ClientRequest`]). The engine chooses the messages. Then:
//!
//! - an upstream of the client's own format is sent the client's request with the chosen
//!   messages written over its own, everything else as it came (fields this crate does not
//!   know included, key order kept);
//! - an upstream of another format is sent a request written from the call's parameters,
//!   with the client's settings that have a counterpart translated (temperature, `top_p`,
//!   stop sequences, the tool choice, the end user's id); a setting that would change what
//!   the answer is and has no counterpart (log probabilities, audio, a structured-output
//!   schema Anthropic's API cannot take, ...) is refused ([`PassthroughError::Unsupported`]),
//!   and one that only tunes sampling or bookkeeping (`seed`, `top_k`, `store`, ...) is left
//!   out. Message fields of the client's format (`Message::extra`) are left out too: the other
//!   API would reject them.

use contexture_core::Message;
use contexture_core::format::{anthropic, openai};
use contexture_core::message::{Content, Part};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, json};

use crate::passthrough::PassthroughError;

/// `max_tokens` is required by Anthropic's API; this is sent when the call sets none.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u64 = 4096;

/// A wire format of chat calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// OpenAI's chat completions (`POST /v1/chat/completions`), which OpenAI-compatible
    /// servers (vLLM, llama.cpp, Ollama, ...) speak too.
    OpenAiChat,
    /// Anthropic's messages (`POST /v1/messages`).
    AnthropicMessages,
}

impl WireFormat {
    /// The format's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::OpenAiChat => "OpenAI chat completions",
            WireFormat::AnthropicMessages => "Anthropic messages",
        }
    }
}

impl std::fmt::Display for WireFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The format a client's request came in: one an upstream speaks too, or OpenAI's
/// Responses, which only clients speak here (its state lives in Contexture's threads, and
/// its calls go upstream as chat calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientFormat {
    /// A format upstreams speak too.
    Wire(WireFormat),
    /// OpenAI's Responses (`POST /v1/responses`).
    OpenAiResponses,
}

impl ClientFormat {
    /// OpenAI's chat completions.
    pub const OPENAI_CHAT: ClientFormat = ClientFormat::Wire(WireFormat::OpenAiChat);
    /// Anthropic's messages.
    pub const ANTHROPIC_MESSAGES: ClientFormat = ClientFormat::Wire(WireFormat::AnthropicMessages);

    /// The format's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            ClientFormat::Wire(format) => format.name(),
            ClientFormat::OpenAiResponses => "OpenAI Responses",
        }
    }

    /// True when an upstream of `format` can be sent the client's own request.
    pub fn is(self, format: WireFormat) -> bool {
        self == ClientFormat::Wire(format)
    }
}

impl std::fmt::Display for ClientFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A client's request as it sent it, in its wire format.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRequest {
    /// The format it came in.
    pub format: ClientFormat,
    /// Its body (without what only Contexture reads, such as the thread's name).
    pub body: Map<String, Value>,
}

/// A chat call's parameters apart from its messages, as every upstream reads them (see the
/// module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatCall {
    /// The model asked for.
    pub model: String,
    /// The tool schemas, in OpenAI's function-tool shape
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    pub tools: Vec<Value>,
    /// The structured-output schema (OpenAI's `response_format`), when there is one.
    pub response_format: Option<Value>,
    /// The most tokens the reply may take, when the client said.
    pub max_tokens: Option<u64>,
    /// Whether the answer is streamed.
    pub stream: bool,
    /// The request as the client sent it.
    pub client: ClientRequest,
}

/// A request body ready to be serialized: the client's own with some fields written over
/// it, serialized in place (nothing of the client's body, a stateless client's whole
/// history included, is copied), or one written from a call's parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestBody<'a> {
    /// The client's body: each field of `over` in the place of the client's (after the
    /// client's fields when it has none), the fields named in `dropped` left out.
    Client {
        /// The client's body.
        body: &'a Map<String, Value>,
        /// The fields written over it.
        over: Map<String, Value>,
        /// The messages, already written as JSON, in the place of the client's `messages`.
        messages: Option<WrittenMessages>,
        /// The client's fields left out (unless `over` writes them).
        dropped: &'static [&'static str],
    },
    /// A body of its own.
    Written(Map<String, Value>),
}

/// Messages written in the chat-completions format as JSON text, serialized in place: a long
/// history goes to the upstream without a tree of `Value`s built for it first.
#[derive(Debug, Clone)]
pub struct WrittenMessages(Box<serde_json::value::RawValue>);

impl WrittenMessages {
    /// `messages` written in the chat-completions format.
    pub fn openai(messages: &[Message]) -> Result<WrittenMessages, PassthroughError> {
        serde_json::value::to_raw_value(&openai::WireMessages(messages))
            .map(WrittenMessages)
            .map_err(|error| PassthroughError::Unsupported {
                detail: format!("the messages cannot be written as JSON: {error}"),
            })
    }
}

impl PartialEq for WrittenMessages {
    fn eq(&self, other: &WrittenMessages) -> bool {
        self.0.get() == other.0.get()
    }
}

impl<'a> RequestBody<'a> {
    /// The client's body as it came.
    pub fn as_sent(body: &'a Map<String, Value>) -> RequestBody<'a> {
        RequestBody::Client {
            body,
            over: Map::new(),
            messages: None,
            dropped: &[],
        }
    }

    /// The value of the body's field `key`, as it is serialized; `None` for `messages`
    /// written as JSON text ([`WrittenMessages`]), which is no `Value`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            RequestBody::Client {
                messages: Some(_), ..
            } if key == "messages" => None,
            RequestBody::Client {
                body,
                over,
                dropped,
                ..
            } => over
                .get(key)
                .or_else(|| body.get(key).filter(|_| !dropped.contains(&key))),
            RequestBody::Written(body) => body.get(key),
        }
    }

    /// True when the body asks for a stream (`"stream": true`).
    pub fn streams(&self) -> bool {
        self.get("stream").and_then(Value::as_bool) == Some(true)
    }
}

impl Serialize for RequestBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestBody::Written(body) => body.serialize(serializer),
            RequestBody::Client {
                body,
                over,
                messages,
                dropped,
            } => {
                let mut map = serializer.serialize_map(None)?;
                for (key, value) in body.iter() {
                    match (over.get(key), messages) {
                        (_, Some(written)) if key == "messages" => {
                            map.serialize_entry(key, &written.0)?
                        }
                        (Some(over), _) => map.serialize_entry(key, over)?,
                        (None, _) if dropped.contains(&key.as_str()) => {}
                        (None, _) => map.serialize_entry(key, value)?,
                    }
                }
                for (key, value) in over.iter().filter(|(key, _)| !body.contains_key(*key)) {
                    map.serialize_entry(key, value)?;
                }
                if let Some(written) = messages
                    && !body.contains_key("messages")
                {
                    map.serialize_entry("messages", &written.0)?;
                }
                map.end()
            }
        }
    }
}

impl ChatCall {
    /// True when a body for an upstream of `format` carries the reasoning parts of the
    /// messages it sends: the client's format is the upstream's own, or (an Anthropic
    /// upstream) the client's reasoning is in a format Anthropic takes. Chat completions has
    /// no reasoning input, and reasoning from a Responses client (signed or encrypted by
    /// another provider) is refused by Anthropic, so those bodies leave it out.
    pub fn sends_reasoning_to(&self, format: WireFormat) -> bool {
        !drops_reasoning(self.client.format, format)
    }

    /// The request body for an upstream of `format`, sending `messages` (see the module
    /// documentation).
    pub fn body_for(
        &self,
        format: WireFormat,
        messages: &[Message],
    ) -> Result<RequestBody<'_>, PassthroughError> {
        match format {
            WireFormat::OpenAiChat => self.openai_body(messages),
            WireFormat::AnthropicMessages => self.anthropic_body(messages),
        }
    }

    fn openai_body(&self, messages: &[Message]) -> Result<RequestBody<'_>, PassthroughError> {
        if self.client.format.is(WireFormat::OpenAiChat) {
            return Ok(RequestBody::Client {
                body: &self.client.body,
                over: Map::new(),
                messages: Some(WrittenMessages::openai(messages)?),
                dropped: &[],
            });
        }
        let client = &self.client.body;
        let responses = self.client.format == ClientFormat::OpenAiResponses;
        if responses {
            refuse(self.client.format, client, &["top_logprobs"])?;
        } else {
            refuse(self.client.format, client, &["mcp_servers", "container"])?;
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert(
            "messages".into(),
            openai::to_values(&for_another_format(
                messages,
                drops_reasoning(self.client.format, WireFormat::OpenAiChat),
            )),
        );
        if let Some(tokens) = self.max_tokens {
            body.insert("max_tokens".into(), json!(tokens));
        }
        copy(client, &mut body, &["temperature", "top_p"]);
        if let Some(stop) = client.get("stop_sequences") {
            body.insert("stop".into(), stop.clone());
        }
        if !self.tools.is_empty() {
            body.insert("tools".into(), Value::Array(self.tools.clone()));
        }
        if responses {
            if let Some(choice) = client.get("tool_choice").filter(|c| !c.is_null()) {
                body.insert("tool_choice".into(), chat_tool_choice(choice)?);
            }
            if !self.tools.is_empty() {
                copy(client, &mut body, &["parallel_tool_calls"]);
            }
            if let Some(effort) = client
                .get("reasoning")
                .and_then(|reasoning| reasoning.get("effort"))
                .filter(|effort| !effort.is_null())
            {
                body.insert("reasoning_effort".into(), effort.clone());
            }
        } else if let Some(choice) = client.get("tool_choice") {
            let (choice, parallel) = openai_tool_choice(choice)?;
            body.insert("tool_choice".into(), choice);
            if parallel == Some(false) {
                body.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        if let Some(format) = &self.response_format {
            body.insert("response_format".into(), format.clone());
        }
        if let Some(user) = end_user(&self.client) {
            body.insert("user".into(), user.clone());
        }
        if self.stream {
            body.insert("stream".into(), json!(true));
            // The usage is recorded with the answer.
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Ok(RequestBody::Written(body))
    }

    fn anthropic_body(&self, messages: &[Message]) -> Result<RequestBody<'_>, PassthroughError> {
        let same = self.client.format.is(WireFormat::AnthropicMessages);
        let written = if same {
            anthropic::to_request(messages)
        } else {
            anthropic::to_request(&for_another_format(
                messages,
                drops_reasoning(self.client.format, WireFormat::AnthropicMessages),
            ))
        }
        .map_err(|error| PassthroughError::Unsupported {
            detail: format!("the messages cannot be written for Anthropic's API: {error}"),
        })?;
        let Value::Object(written) = written else {
            unreachable!("a request body is an object");
        };
        if same {
            // The client's system prompt, when the chosen messages have none, goes too.
            return Ok(RequestBody::Client {
                body: &self.client.body,
                over: written,
                messages: None,
                dropped: &["system"],
            });
        }
        let client = &self.client.body;
        refuse(
            self.client.format,
            client,
            &[
                "logprobs",
                "top_logprobs",
                "modalities",
                "audio",
                "prediction",
                "functions",
                "function_call",
                "web_search_options",
                "top_logprobs",
            ],
        )?;
        if let Some(format) = &self.response_format
            && format.get("type").and_then(Value::as_str) != Some("text")
        {
            return Err(PassthroughError::Unsupported {
                detail: "response_format: Anthropic's messages API has no structured-output schema; ask without one".to_owned(),
            });
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert(
            "max_tokens".into(),
            json!(self.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS)),
        );
        body.extend(written);
        copy(client, &mut body, &["temperature", "top_p"]);
        match client.get("stop") {
            Some(Value::String(stop)) => {
                body.insert("stop_sequences".into(), json!([stop]));
            }
            Some(stop @ Value::Array(_)) => {
                body.insert("stop_sequences".into(), stop.clone());
            }
            _ => {}
        }
        if !self.tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(self.tools.iter().map(anthropic_tool).collect()),
            );
        }
        let parallel = client.get("parallel_tool_calls").and_then(Value::as_bool);
        match client.get("tool_choice").filter(|choice| !choice.is_null()) {
            Some(choice) => {
                let mut choice = anthropic_tool_choice(choice)?;
                if parallel == Some(false) {
                    choice.insert("disable_parallel_tool_use".into(), json!(true));
                }
                body.insert("tool_choice".into(), Value::Object(choice));
            }
            None if parallel == Some(false) && !self.tools.is_empty() => {
                body.insert(
                    "tool_choice".into(),
                    json!({"type": "auto", "disable_parallel_tool_use": true}),
                );
            }
            None => {}
        }
        if let Some(user) = end_user(&self.client) {
            body.insert("metadata".into(), json!({"user_id": user}));
        }
        if self.stream {
            body.insert("stream".into(), json!(true));
        }
        Ok(RequestBody::Written(body))
    }
}

/// Refuses a request that sets one of `fields`: settings of `format` that change what the
/// answer is and have no counterpart in the upstream's format.
fn refuse(
    format: ClientFormat,
    client: &Map<String, Value>,
    fields: &[&str],
) -> Result<(), PassthroughError> {
    match fields
        .iter()
        .find(|field| client.get(**field).is_some_and(|value| !is_unset(value)))
    {
        Some(field) => Err(PassthroughError::Unsupported {
            detail: format!(
                "{field}: a setting of the {format} format that the upstream's format has no counterpart for"
            ),
        }),
        None => Ok(()),
    }
}

/// True for a value that sets nothing (`null`, `false`, an empty list or object).
fn is_unset(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

/// Copies the `fields` `from` has into `to`, under the same names.
fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, fields: &[&str]) {
    for field in fields {
        if let Some(value) = from.get(*field) {
            to.insert((*field).to_owned(), value.clone());
        }
    }
}

/// True when a body for an upstream of format `upstream` leaves out the reasoning of a
/// client of format `client` (see [`ChatCall::sends_reasoning_to`]).
fn drops_reasoning(client: ClientFormat, upstream: WireFormat) -> bool {
    match upstream {
        WireFormat::OpenAiChat => !client.is(WireFormat::OpenAiChat),
        WireFormat::AnthropicMessages => client == ClientFormat::OpenAiResponses,
    }
}

/// The messages as another format takes them: without the fields of the client's format
/// that their `extra` holds (the other API would reject them), their parts' fields of it
/// (Responses' part types and annotations) included, without reasoning when
/// `drop_reasoning` (chat completions has no reasoning input, and reasoning another
/// provider signed or encrypted is refused by the next), and a content of text parts only
/// written as one text, which every server reads.
fn for_another_format(messages: &[Message], drop_reasoning: bool) -> Vec<Message> {
    messages
        .iter()
        .map(|message| {
            let rewritten_parts = match &message.content {
                Some(Content::Parts(parts)) => parts.iter().any(|part| match part {
                    Part::Reasoning { .. } if drop_reasoning => true,
                    Part::Text { extra, .. }
                    | Part::Image { extra, .. }
                    | Part::Reasoning { extra, .. } => !extra.is_empty(),
                    Part::Other { .. } => false,
                }),
                _ => false,
            };
            if message.extra.is_empty() && !rewritten_parts {
                return message.clone();
            }
            let mut message = message.clone();
            message.extra.clear();
            if let Some(Content::Parts(parts)) = &mut message.content {
                if drop_reasoning {
                    parts.retain(|part| !matches!(part, Part::Reasoning { .. }));
                }
                for part in parts.iter_mut() {
                    match part {
                        Part::Text { extra, .. }
                        | Part::Image { extra, .. }
                        | Part::Reasoning { extra, .. } => extra.clear(),
                        Part::Other { .. } => {}
                    }
                }
                let texts: Option<Vec<&str>> = parts
                    .iter()
                    .map(|part| match part {
                        Part::Text { text, .. } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                if let Some(texts) = texts {
                    message.content = Some(Content::Text(texts.concat().into()));
                }
            }
            message
        })
        .collect()
}

/// The end user's id the client gave (`user`, Responses' `safety_identifier`, Anthropic's
/// `metadata.user_id`).
fn end_user(client: &ClientRequest) -> Option<&Value> {
    let body = &client.body;
    let user = match client.format {
        ClientFormat::Wire(WireFormat::AnthropicMessages) => body
            .get("metadata")
            .and_then(|metadata| metadata.get("user_id")),
        ClientFormat::Wire(WireFormat::OpenAiChat) => body.get("user"),
        ClientFormat::OpenAiResponses => body.get("safety_identifier").or_else(|| body.get("user")),
    };
    user.filter(|user| !user.is_null())
}

/// An OpenAI function tool in Anthropic's shape (`name`, `description`, `input_schema`); a
/// tool already in Anthropic's shape passes through.
pub(crate) fn anthropic_tool(tool: &Value) -> Value {
    let Some(function) = tool.get("function") else {
        return tool.clone();
    };
    let mut schema = Map::new();
    for (from, to) in [
        ("name", "name"),
        ("description", "description"),
        ("parameters", "input_schema"),
    ] {
        if let Some(value) = function.get(from) {
            schema.insert(to.into(), value.clone());
        }
    }
    schema
        .entry("input_schema")
        .or_insert_with(|| json!({"type": "object", "properties": {}}));
    Value::Object(schema)
}

/// An OpenAI `tool_choice` in Anthropic's shape.
fn anthropic_tool_choice(choice: &Value) -> Result<Map<String, Value>, PassthroughError> {
    let shaped = match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => json!({"type": "auto"}),
            "required" => json!({"type": "any"}),
            "none" => json!({"type": "none"}),
            _ => return Err(bad_tool_choice(choice)),
        },
        // Chat completions' `{"type": "function", "function": {"name"}}`, or Responses'
        // flat `{"type": "function", "name"}`.
        Value::Object(choice) => match choice
            .get("function")
            .and_then(|function| function.get("name"))
            .or_else(|| choice.get("name"))
        {
            Some(name) => json!({"type": "tool", "name": name}),
            None => return Err(bad_tool_choice(&Value::Object(choice.clone()))),
        },
        _ => return Err(bad_tool_choice(choice)),
    };
    match shaped {
        Value::Object(map) => Ok(map),
        _ => unreachable!("built as an object"),
    }
}

/// An Anthropic `tool_choice` in OpenAI's shape, and whether it allows parallel calls
/// (`disable_parallel_tool_use`).
fn openai_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), PassthroughError> {
    let parallel = choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|disabled| !disabled);
    let shaped = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name") {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => return Err(bad_tool_choice(choice)),
        },
        _ => return Err(bad_tool_choice(choice)),
    };
    Ok((shaped, parallel))
}

/// A Responses `tool_choice` (`"auto"`, `"none"`, `"required"`, or
/// `{"type": "function", "name"}`) in chat completions' shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, PassthroughError> {
    match choice {
        Value::String(mode) if ["auto", "none", "required"].contains(&mode.as_str()) => {
            Ok(choice.clone())
        }
        Value::Object(object) if object.get("type").and_then(Value::as_str) == Some("function") => {
            match object.get("name") {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(bad_tool_choice(choice)),
            }
        }
        _ => Err(bad_tool_choice(choice)),
    }
}

fn bad_tool_choice(choice: &Value) -> PassthroughError {
    PassthroughError::Unsupported {
        detail: format!("tool_choice: {choice} has no counterpart in the upstream's format"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(format: WireFormat, body: Value) -> ChatCall {
        client_call(ClientFormat::Wire(format), body)
    }

    fn client_call(format: ClientFormat, body: Value) -> ChatCall {
        let Value::Object(body) = body else {
            panic!("an object")
        };
        ChatCall {
            model: body["model"].as_str().unwrap().to_owned(),
            tools: Vec::new(),
            response_format: None,
            max_tokens: None,
            stream: body.get("stream") == Some(&json!(true)),
            client: ClientRequest { format, body },
        }
    }

    /// A body as it is sent.
    fn value(body: RequestBody<'_>) -> Value {
        serde_json::to_value(&body).unwrap()
    }

    fn chosen() -> Vec<Message> {
        vec![
            Message::system("Be brief."),
            Message::user("Weather in Lisbon?"),
        ]
    }

    #[test]
    fn the_clients_own_format_is_sent_as_it_came_with_the_chosen_messages() {
        let body = json!({
            "zeta": 1,
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "old"}],
            "seed": 7,
            "logprobs": true
        });
        let call = call(WireFormat::OpenAiChat, body.clone());
        let sent = call
            .body_for(WireFormat::OpenAiChat, &chosen())
            .map(value)
            .unwrap();
        let mut expected = body;
        expected["messages"] = openai::to_values(&chosen());
        assert_eq!(sent, expected);
        assert_eq!(
            sent.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["zeta", "model", "messages", "seed", "logprobs"],
            "key order kept"
        );

        let body = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 300,
            "system": "old",
            "messages": [{"role": "user", "content": "old"}],
            "top_k": 5
        });
        let call = call_anthropic(body);
        let sent = call
            .body_for(WireFormat::AnthropicMessages, &chosen())
            .map(value)
            .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 300,
                "top_k": 5,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "Weather in Lisbon?"}]
            })
        );
        assert_eq!(
            sent.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["model", "max_tokens", "system", "messages", "top_k"],
            "the chosen system prompt and messages take the client's places"
        );
        // Chosen messages without a system prompt leave the client's out.
        let sent = call
            .body_for(WireFormat::AnthropicMessages, &chosen()[1..])
            .map(value)
            .unwrap();
        assert_eq!(sent.get("system"), None, "{sent}");
        assert_eq!(sent["messages"][0]["content"], "Weather in Lisbon?");
    }

    fn call_anthropic(body: Value) -> ChatCall {
        call(WireFormat::AnthropicMessages, body)
    }

    #[test]
    fn an_openai_call_is_written_for_anthropic_with_its_settings_translated() {
        let mut call = call(
            WireFormat::OpenAiChat,
            json!({
                "model": "claude-sonnet-4-5",
                "messages": [],
                "temperature": 0.2,
                "stop": "END",
                "seed": 3,
                "user": "alice",
                "tool_choice": {"type": "function", "function": {"name": "lookup"}},
                "parallel_tool_calls": false,
                "stream": true
            }),
        );
        call.tools = vec![json!({"type": "function", "function": {
            "name": "lookup", "description": "Find", "parameters": {"type": "object"}}})];
        let sent = call
            .body_for(WireFormat::AnthropicMessages, &chosen())
            .map(value)
            .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": ANTHROPIC_DEFAULT_MAX_TOKENS,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "Weather in Lisbon?"}],
                "temperature": 0.2,
                "stop_sequences": ["END"],
                "tools": [{"name": "lookup", "description": "Find", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": true},
                "metadata": {"user_id": "alice"},
                "stream": true
            })
        );
    }

    #[test]
    fn an_anthropic_call_is_written_for_openai_with_its_settings_translated() {
        let mut call = call_anthropic(json!({
            "model": "local-llama",
            "max_tokens": 200,
            "messages": [],
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "bob"},
            "stream": true
        }));
        call.max_tokens = Some(200);
        let sent = call
            .body_for(WireFormat::OpenAiChat, &chosen())
            .map(value)
            .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "local-llama",
                "messages": openai::to_values(&chosen()),
                "max_tokens": 200,
                "top_p": 0.9,
                "stop": ["END"],
                "tool_choice": "required",
                "parallel_tool_calls": false,
                "user": "bob",
                "stream": true,
                "stream_options": {"include_usage": true}
            })
        );
    }

    #[test]
    fn settings_that_change_the_answer_without_a_counterpart_are_refused() {
        let table = [
            (json!({"model": "m", "logprobs": true}), Some("logprobs")),
            (json!({"model": "m", "logprobs": false}), None),
            (
                json!({"model": "m", "audio": {"voice": "x"}}),
                Some("audio"),
            ),
            (
                json!({"model": "m", "tool_choice": "sometimes"}),
                Some("tool_choice"),
            ),
            (json!({"model": "m", "seed": 1, "store": true}), None),
        ];
        for (body, refused) in table {
            let outcome = call(WireFormat::OpenAiChat, body.clone())
                .body_for(WireFormat::AnthropicMessages, &chosen())
                .map(value);
            match (refused, outcome) {
                (None, Ok(_)) => {}
                (Some(field), Err(PassthroughError::Unsupported { detail })) => {
                    assert!(detail.starts_with(field), "{body}: {detail}");
                }
                (refused, outcome) => panic!("{body}: expected {refused:?}, got {outcome:?}"),
            }
        }
        let mut with_schema = call(WireFormat::OpenAiChat, json!({"model": "m"}));
        with_schema.response_format = Some(json!({"type": "json_object"}));
        assert!(matches!(
            with_schema.body_for(WireFormat::AnthropicMessages, &chosen()),
            Err(PassthroughError::Unsupported { detail }) if detail.starts_with("response_format")
        ));
        let mut server_tools = call_anthropic(json!({"model": "m", "mcp_servers": [{"url": "x"}]}));
        server_tools.stream = false;
        assert!(matches!(
            server_tools.body_for(WireFormat::OpenAiChat, &chosen()),
            Err(PassthroughError::Unsupported { detail }) if detail.starts_with("mcp_servers")
        ));
    }

    #[test]
    fn message_fields_of_the_clients_format_stay_with_it() {
        let mut answer = Message::assistant("Sunny.");
        answer.extra.insert("refusal".into(), Value::Null);
        let messages = vec![Message::user("Weather?"), answer];
        let foreign = call(WireFormat::OpenAiChat, json!({"model": "m"}))
            .body_for(WireFormat::AnthropicMessages, &messages)
            .map(value)
            .unwrap();
        assert_eq!(
            foreign["messages"][1],
            json!({"role": "assistant", "content": "Sunny."})
        );
        let own = call(WireFormat::OpenAiChat, json!({"model": "m"}))
            .body_for(WireFormat::OpenAiChat, &messages)
            .map(value)
            .unwrap();
        assert_eq!(own["messages"][1]["refusal"], Value::Null);
        assert!(
            own["messages"][1]
                .as_object()
                .unwrap()
                .contains_key("refusal")
        );
    }

    /// A Responses-shaped assistant turn: reasoning, then text parts with their annotations.
    fn responses_turn() -> Vec<Message> {
        let mut answer = Message::assistant("");
        let mut text = Part::text("Sunny.");
        if let Part::Text { extra, .. } = &mut text {
            extra.insert("type".into(), json!("output_text"));
            extra.insert("annotations".into(), json!([]));
        }
        answer.content = Some(Content::Parts(vec![
            Part::Reasoning {
                text: "The user wants weather.".into(),
                signature: None,
                redacted: Some("gAAA-encrypted".into()),
                extra: Map::new(),
            },
            text,
        ]));
        answer.extra.insert("id".into(), json!("msg_1"));
        answer.extra.insert("status".into(), json!("completed"));
        vec![Message::user("Weather?"), answer]
    }

    #[test]
    fn a_responses_call_is_written_as_chat_completions() {
        let mut call = client_call(
            ClientFormat::OpenAiResponses,
            json!({
                "model": "local-llama",
                "input": "ignored: the chosen messages go",
                "temperature": 0.3,
                "top_p": 0.8,
                "tool_choice": {"type": "function", "name": "lookup"},
                "parallel_tool_calls": false,
                "reasoning": {"effort": "low"},
                "safety_identifier": "carol",
                "store": true,
                "metadata": {"team": "ops"},
                "stream": true
            }),
        );
        call.tools = vec![json!({"type": "function", "function": {"name": "lookup"}})];
        call.max_tokens = Some(120);
        let sent = call
            .body_for(WireFormat::OpenAiChat, &responses_turn())
            .map(value)
            .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "local-llama",
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "Sunny."}
                ],
                "max_tokens": 120,
                "temperature": 0.3,
                "top_p": 0.8,
                "tools": [{"type": "function", "function": {"name": "lookup"}}],
                "tool_choice": {"type": "function", "function": {"name": "lookup"}},
                "parallel_tool_calls": false,
                "reasoning_effort": "low",
                "user": "carol",
                "stream": true,
                "stream_options": {"include_usage": true}
            }),
            "reasoning, item ids and part annotations stay with the Responses format"
        );
        for choice in ["auto", "none", "required"] {
            let sent = client_call(
                ClientFormat::OpenAiResponses,
                json!({"model": "m", "tool_choice": choice}),
            )
            .body_for(WireFormat::OpenAiChat, &chosen())
            .map(value)
            .unwrap();
            assert_eq!(sent["tool_choice"], choice);
        }
        for (body, field) in [
            (
                json!({"model": "m", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
            (json!({"model": "m", "top_logprobs": 3}), "top_logprobs"),
        ] {
            let call = client_call(ClientFormat::OpenAiResponses, body.clone());
            let refused = call.body_for(WireFormat::OpenAiChat, &chosen());
            assert!(
                matches!(&refused, Err(PassthroughError::Unsupported { detail }) if detail.starts_with(field)),
                "{body}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_responses_call_is_written_for_anthropic() {
        let mut call = client_call(
            ClientFormat::OpenAiResponses,
            json!({
                "model": "claude-sonnet-4-5",
                "tool_choice": {"type": "function", "name": "lookup"},
                "parallel_tool_calls": false,
                "user": "dave"
            }),
        );
        call.tools = vec![json!({"type": "function", "function": {"name": "lookup"}})];
        let sent = call
            .body_for(WireFormat::AnthropicMessages, &responses_turn())
            .map(value)
            .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": ANTHROPIC_DEFAULT_MAX_TOKENS,
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "Sunny."}
                ],
                "tools": [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}],
                "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": true},
                "metadata": {"user_id": "dave"}
            }),
            "reasoning OpenAI encrypted is not sent to Anthropic"
        );
    }
}

/// The entries of a model list an upstream speaking `format` answered (`GET models`), in
/// OpenAI's shape (`{"id", "object": "model", "created", "owned_by"}`): an OpenAI-compatible
/// list's as they are, an Anthropic list's read into it (`created` from its `created_at`,
/// `display_name` kept). Entries without an id are left out: nothing could call them.
pub fn openai_model_entries(format: WireFormat, list: &Value) -> Vec<Value> {
    let entries = list
        .get("data")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    entries
        .iter()
        .filter(|entry| entry.get("id").is_some_and(Value::is_string))
        .map(|entry| match format {
            WireFormat::OpenAiChat => entry.clone(),
            WireFormat::AnthropicMessages => {
                let created = entry
                    .get("created_at")
                    .and_then(Value::as_str)
                    .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                    .map_or(0, |at| at.timestamp());
                let mut model = serde_json::json!({
                    "id": entry["id"],
                    "object": "model",
                    "created": created,
                    "owned_by": "anthropic",
                });
                if let Some(name) = entry.get("display_name") {
                    model["display_name"] = name.clone();
                }
                model
            }
        })
        .collect()
}

/// Model entries in OpenAI's shape ([`openai_model_entries`]) as an Anthropic list holds
/// them: `{"type": "model", "id", "display_name", "created_at"}` (`created_at` in RFC 3339
/// from `created`; `display_name` kept, else the id).
pub fn anthropic_model_entries(entries: &[Value]) -> Vec<Value> {
    entries
        .iter()
        .map(|entry| {
            let created = entry
                .get("created")
                .and_then(Value::as_i64)
                .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
                .unwrap_or_default();
            serde_json::json!({
                "type": "model",
                "id": entry["id"],
                "display_name": entry.get("display_name").unwrap_or(&entry["id"]),
                "created_at": created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            })
        })
        .collect()
}

#[cfg(test)]
mod model_list_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_anthropic_model_list_reads_into_openais_shape() {
        let list = json!({
            "data": [
                {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
                 "created_at": "2025-09-29T00:00:00Z"},
                {"type": "model", "display_name": "no id"},
                {"type": "model", "id": "claude-haiku", "created_at": "not a date"},
            ],
            "has_more": false,
        });
        assert_eq!(
            openai_model_entries(WireFormat::AnthropicMessages, &list),
            vec![
                json!({"id": "claude-sonnet-4-5", "object": "model", "created": 1_759_104_000,
                       "owned_by": "anthropic", "display_name": "Claude Sonnet 4.5"}),
                json!({"id": "claude-haiku", "object": "model", "created": 0,
                       "owned_by": "anthropic"}),
            ]
        );
        let openai = json!({"object": "list", "data": [
            {"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "openai"}]});
        assert_eq!(
            openai_model_entries(WireFormat::OpenAiChat, &openai),
            vec![openai["data"][0].clone()]
        );
        assert!(openai_model_entries(WireFormat::OpenAiChat, &json!("nothing")).is_empty());
        // And back into Anthropic's shape.
        let read = openai_model_entries(WireFormat::AnthropicMessages, &list);
        assert_eq!(
            anthropic_model_entries(&read)[0],
            json!({"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
                   "created_at": "2025-09-29T00:00:00Z"})
        );
        assert_eq!(
            anthropic_model_entries(&openai["data"].as_array().unwrap().clone()),
            vec![
                json!({"type": "model", "id": "gpt-4o", "display_name": "gpt-4o",
                        "created_at": "1970-01-01T00:00:01Z"})
            ]
        );
    }
}
