//! OpenAI Responses request bodies (`POST /v1/responses`), read as a door needs them to run
//! one as a chat turn: the model, the input items as messages, the instructions, where the
//! state lives (`previous_response_id` or `conversation`), the function tools and the
//! structured-output schema in chat completions' shape (what the provider counts and an
//! OpenAI-compatible upstream takes), the reply budget, and the context-management settings.
//! Each field is checked, so a malformed request is refused naming the field (as OpenAI's own
//! API does, unknown fields included) rather than sent to an upstream.

use serde_json::{Map, Value, json};

use super::openai_request::{BodyError, present, read_model};
use super::responses;
use crate::message::Message;

/// How an input that does not fit the model's window is treated (`truncation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Fitted: the older history is left out, compacted or cleared (the default).
    Auto,
    /// Refused before the upstream is called.
    Disabled,
}

/// A Responses body, read.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesBody {
    /// The model named.
    pub model: String,
    /// The input items, as messages (a string input is one user message).
    pub input: Vec<Message>,
    /// The system prompt of this call only (not carried to the next).
    pub instructions: Option<String>,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// The conversation this response joins.
    pub conversation: Option<String>,
    /// False keeps nothing of the turn.
    pub store: bool,
    /// True when the client asked for a stream of events.
    pub stream: bool,
    /// The function tools, in chat completions' shape
    /// (`{"type": "function", "function": {"name", "description", "parameters", "strict"}}`).
    pub tools: Vec<Value>,
    /// The structured-output schema in chat completions' shape (`response_format`), from
    /// `text.format`, when it asks for JSON.
    pub response_format: Option<Value>,
    /// The most tokens the reply may take.
    pub max_output_tokens: Option<u64>,
    /// What happens to an input over the window.
    pub truncation: Truncation,
    /// Compact the older history once the input passes this many tokens
    /// (`context_management: [{"type": "compaction", "compact_threshold": N}]`).
    pub compact_threshold: Option<u64>,
    /// The client's metadata, echoed in the response.
    pub metadata: Map<String, Value>,
}

/// Every top-level field of a Responses body: any other is refused, as OpenAI refuses it.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "store",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "max_tool_calls",
    "temperature",
    "top_p",
    "top_logprobs",
    "metadata",
    "text",
    "truncation",
    "context_management",
    "reasoning",
    "include",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "background",
    "prompt",
];

/// Reads a Responses body.
pub fn read_responses_body(body: &Map<String, Value>) -> Result<ResponsesBody, BodyError> {
    if let Some(unknown) = body.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(BodyError::new(
            unknown,
            format!("{unknown}: unknown parameter of a Responses request"),
        ));
    }
    let model = read_model(body)?;
    let input = match present(body, "input") {
        None => Vec::new(),
        Some(input) => responses::parse_input(input).map_err(|problem| {
            let field = problem
                .path()
                .split('.')
                .next()
                .unwrap_or("input")
                .to_owned();
            BodyError {
                field,
                message: problem.to_string(),
            }
        })?,
    };
    let text_field = |field: &str| -> Result<Option<String>, BodyError> {
        match present(body, field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(BodyError::new(field, format!("{field}: must be a string"))),
        }
    };
    let instructions = text_field("instructions")?;
    let previous_response_id = text_field("previous_response_id")?;
    let conversation = match present(body, "conversation") {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(object)) => match object.get("id") {
            Some(Value::String(id)) => Some(id.clone()),
            _ => {
                return Err(BodyError::new(
                    "conversation",
                    "conversation: must be an id or an object with a string `id`",
                ));
            }
        },
        Some(_) => {
            return Err(BodyError::new(
                "conversation",
                "conversation: must be an id or an object with a string `id`",
            ));
        }
    };
    if previous_response_id.is_some() && conversation.is_some() {
        return Err(BodyError::new(
            "conversation",
            "conversation: cannot be used together with previous_response_id",
        ));
    }
    let flag = |field: &str, default: bool| -> Result<bool, BodyError> {
        match present(body, field) {
            None => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(BodyError::new(field, format!("{field}: must be a boolean"))),
        }
    };
    let store = flag("store", true)?;
    let stream = flag("stream", false)?;
    if flag("background", false)? {
        return Err(BodyError::new(
            "background",
            "background: responses are answered while the request waits; background mode is not supported",
        ));
    }
    if present(body, "prompt").is_some() {
        return Err(BodyError::new(
            "prompt",
            "prompt: stored prompt templates are OpenAI's own; send `instructions` and `input`",
        ));
    }
    for (field, expected, fits) in [
        (
            "metadata",
            "an object",
            &Value::is_object as &dyn Fn(&Value) -> bool,
        ),
        ("parallel_tool_calls", "a boolean", &Value::is_boolean),
        ("temperature", "a number", &Value::is_number),
        ("top_p", "a number", &Value::is_number),
        ("text", "an object", &Value::is_object),
        ("reasoning", "an object", &Value::is_object),
        ("include", "an array", &Value::is_array),
    ] {
        if let Some(value) = present(body, field)
            && !fits(value)
        {
            return Err(BodyError::new(
                field,
                format!("{field}: must be {expected}"),
            ));
        }
    }
    let max_output_tokens = match present(body, "max_output_tokens") {
        None => None,
        Some(value) => Some(value.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
            BodyError::new(
                "max_output_tokens",
                "max_output_tokens: must be a whole number above 0",
            )
        })?),
    };
    let truncation = match present(body, "truncation") {
        None => Truncation::Auto,
        Some(Value::String(mode)) if mode == "auto" => Truncation::Auto,
        Some(Value::String(mode)) if mode == "disabled" => Truncation::Disabled,
        Some(_) => {
            return Err(BodyError::new(
                "truncation",
                "truncation: must be \"auto\" or \"disabled\"",
            ));
        }
    };
    Ok(ResponsesBody {
        model,
        input,
        instructions,
        previous_response_id,
        conversation,
        store,
        stream,
        tools: tools(present(body, "tools"))?,
        response_format: response_format(present(body, "text"))?,
        max_output_tokens,
        truncation,
        compact_threshold: compact_threshold(present(body, "context_management"))?,
        metadata: present(body, "metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    })
}

/// The function tools in chat completions' shape; a hosted tool is refused naming its type.
fn tools(value: Option<&Value>) -> Result<Vec<Value>, BodyError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Value::Array(list) = value else {
        return Err(BodyError::new("tools", "tools: must be an array"));
    };
    list.iter()
        .enumerate()
        .map(|(index, tool)| {
            let at = format!("tools[{index}]");
            let Value::Object(tool) = tool else {
                return Err(BodyError::new(&at, format!("{at}: must be an object")));
            };
            match tool.get("type") {
                Some(Value::String(kind)) if kind == "function" => {}
                Some(Value::String(kind)) => {
                    return Err(BodyError::new(
                        &format!("{at}.type"),
                        format!(
                            "{at}.type: `{kind}` is a tool OpenAI hosts; only function tools run here"
                        ),
                    ));
                }
                _ => {
                    return Err(BodyError::new(
                        &format!("{at}.type"),
                        format!("{at}.type: must be \"function\""),
                    ));
                }
            }
            let name = match tool.get("name") {
                Some(Value::String(name)) if !name.is_empty() => name.clone(),
                _ => {
                    return Err(BodyError::new(
                        &format!("{at}.name"),
                        format!("{at}.name: must be a non-empty string"),
                    ));
                }
            };
            let mut function = Map::new();
            function.insert("name".into(), json!(name));
            for field in ["description", "parameters", "strict"] {
                if let Some(value) = tool.get(field).filter(|value| !value.is_null()) {
                    function.insert(field.into(), value.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `text.format` as chat completions' `response_format`; `None` for plain text.
fn response_format(text: Option<&Value>) -> Result<Option<Value>, BodyError> {
    let Some(format) = text.and_then(|text| text.get("format")) else {
        return Ok(None);
    };
    let bad = || {
        BodyError::new(
            "text.format",
            "text.format: must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"name\", \"schema\"}",
        )
    };
    let Value::Object(format) = format else {
        return Err(bad());
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            match format.get("name") {
                Some(Value::String(name)) => {
                    schema.insert("name".into(), json!(name));
                }
                _ => {
                    return Err(BodyError::new(
                        "text.format.name",
                        "text.format.name: a json_schema format needs a string name",
                    ));
                }
            }
            for field in ["description", "schema", "strict"] {
                if let Some(value) = format.get(field).filter(|value| !value.is_null()) {
                    schema.insert(field.into(), value.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(bad()),
    }
}

/// The compaction threshold of `context_management`, when it asks for compaction.
fn compact_threshold(value: Option<&Value>) -> Result<Option<u64>, BodyError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Value::Array(entries) = value else {
        return Err(BodyError::new(
            "context_management",
            "context_management: must be an array",
        ));
    };
    let mut threshold = None;
    for (index, entry) in entries.iter().enumerate() {
        let at = format!("context_management[{index}]");
        match entry.get("type").and_then(Value::as_str) {
            Some("compaction") => {}
            Some(other) => {
                return Err(BodyError::new(
                    &format!("{at}.type"),
                    format!("{at}.type: `{other}` is not supported (only `compaction`)"),
                ));
            }
            None => {
                return Err(BodyError::new(
                    &format!("{at}.type"),
                    format!("{at}.type: must be \"compaction\""),
                ));
            }
        }
        threshold = match entry.get("compact_threshold") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                BodyError::new(
                    &format!("{at}.compact_threshold"),
                    format!("{at}.compact_threshold: must be a whole number above 0"),
                )
            })?),
        };
    }
    Ok(threshold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    fn read(body: Value) -> Result<ResponsesBody, BodyError> {
        read_responses_body(body.as_object().unwrap())
    }

    #[test]
    fn a_body_is_read_with_what_a_turn_needs() {
        let body = read(json!({
            "model": "gpt-4o-mini",
            "input": [{"role": "user", "content": "Weather?"}],
            "instructions": "Be brief.",
            "previous_response_id": "resp_1",
            "tools": [{"type": "function", "name": "weather", "description": "Looks it up",
                       "parameters": {"type": "object", "properties": {}}, "strict": true}],
            "tool_choice": "auto", "parallel_tool_calls": false,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "max_output_tokens": 300, "store": false, "stream": true, "truncation": "disabled",
            "context_management": [{"type": "compaction", "compact_threshold": 5000}],
            "metadata": {"team": "ops"}, "include": [], "temperature": 0.3,
        }))
        .unwrap();
        assert_eq!(body.model, "gpt-4o-mini");
        assert_eq!(body.input.len(), 1);
        assert_eq!(body.input[0].role, Role::User);
        assert_eq!(body.instructions.as_deref(), Some("Be brief."));
        assert_eq!(body.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(
            body.tools,
            vec![json!({"type": "function", "function": {"name": "weather",
                "description": "Looks it up", "parameters": {"type": "object", "properties": {}},
                "strict": true}})]
        );
        assert_eq!(
            body.response_format,
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}})
            )
        );
        assert_eq!(body.max_output_tokens, Some(300));
        assert!(!body.store && body.stream);
        assert_eq!(body.truncation, Truncation::Disabled);
        assert_eq!(body.compact_threshold, Some(5000));
        assert_eq!(body.metadata["team"], "ops");
        // The defaults: stored, not streamed, fitted.
        let body =
            read(json!({"model": "m", "input": "Hi", "conversation": {"id": "conv_1"}})).unwrap();
        assert!(body.store && !body.stream);
        assert_eq!(body.truncation, Truncation::Auto);
        assert_eq!(body.conversation.as_deref(), Some("conv_1"));
        assert_eq!(body.input, vec![Message::user("Hi")]);
    }

    #[test]
    fn each_malformed_field_is_named() {
        for (body, field, text) in [
            (json!({"input": "x"}), "model", "model: missing"),
            (
                json!({"model": "m", "input": 3}),
                "input",
                "input: expected a string or an array of items",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call", "call_id": "c"}]}),
                "input[0]",
                "input[0].name: missing required field",
            ),
            (
                json!({"model": "m", "frequency": 1}),
                "frequency",
                "frequency: unknown parameter",
            ),
            (
                json!({"model": "m", "previous_response_id": "r", "conversation": "c"}),
                "conversation",
                "cannot be used together with previous_response_id",
            ),
            (
                json!({"model": "m", "conversation": 5}),
                "conversation",
                "must be an id",
            ),
            (
                json!({"model": "m", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
                "`web_search` is a tool OpenAI hosts",
            ),
            (
                json!({"model": "m", "tools": [{"type": "function"}]}),
                "tools[0].name",
                "non-empty string",
            ),
            (
                json!({"model": "m", "store": "no"}),
                "store",
                "store: must be a boolean",
            ),
            (
                json!({"model": "m", "background": true}),
                "background",
                "not supported",
            ),
            (
                json!({"model": "m", "max_output_tokens": 0}),
                "max_output_tokens",
                "above 0",
            ),
            (
                json!({"model": "m", "truncation": "smart"}),
                "truncation",
                "\"auto\" or \"disabled\"",
            ),
            (
                json!({"model": "m", "text": {"format": {"type": "xml"}}}),
                "text.format",
                "text.format: must be",
            ),
            (
                json!({"model": "m", "text": {"format": {"type": "json_schema", "schema": {}}}}),
                "text.format.name",
                "needs a string name",
            ),
            (
                json!({"model": "m", "context_management": [{"type": "clear"}]}),
                "context_management[0].type",
                "only `compaction`",
            ),
            (
                json!({"model": "m", "context_management": [{"type": "compaction", "compact_threshold": -5}]}),
                "context_management[0].compact_threshold",
                "above 0",
            ),
            (
                json!({"model": "m", "metadata": []}),
                "metadata",
                "metadata: must be an object",
            ),
        ] {
            let error = read(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.field, field, "{body}");
            assert!(error.message.contains(text), "{body}: {}", error.message);
        }
    }
}
