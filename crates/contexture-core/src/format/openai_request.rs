//! OpenAI chat-completions request bodies, read as a door needs them to run one as a turn:
//! the model, the messages, the tools and structured-output schema the provider counts, the
//! reply budget asked for, and the shape of every other field a door acts on, each checked
//! so a malformed request is refused naming the field rather than sent to an upstream.

use serde_json::{Map, Value};

use super::openai;
use crate::message::Message;

/// A chat-completions body, read.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatBody {
    /// The model named.
    pub model: String,
    /// The messages.
    pub messages: Vec<Message>,
    /// The tool schemas.
    pub tools: Vec<Value>,
    /// The structured-output schema (`response_format`), when there is one.
    pub response_format: Option<Value>,
    /// True when the client asked for a stream.
    pub stream: bool,
    /// The choices asked for (`n`), when given.
    pub choices: Option<u64>,
    /// The reply budget asked for (`max_completion_tokens`, else `max_tokens`), with the
    /// field that gave it.
    pub reply_budget: Option<(&'static str, u64)>,
}

/// A field of a body that is not as the API defines it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BodyError {
    /// The field (`model`, `messages[2].content`, ...).
    pub field: String,
    /// What is wrong, naming the field.
    pub message: String,
}

impl BodyError {
    /// An error about `field`.
    pub(super) fn new(field: &str, message: impl Into<String>) -> BodyError {
        BodyError {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// Reads a chat-completions body.
pub fn read_chat_body(body: &Map<String, Value>) -> Result<ChatBody, BodyError> {
    let model = read_model(body)?;
    let messages = openai::parse_messages(body.get("messages").unwrap_or(&Value::Null))
        .map_err(|error| BodyError::new("messages", error.to_string()))?;
    let tools: Vec<Value> = match body.get("tools") {
        Some(Value::Array(tools)) => tools.clone(),
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(BodyError::new("tools", "tools: must be an array")),
    };
    let positive = |value: &Value| value.as_u64().is_some_and(|n| n >= 1);
    for (field, expected, fits) in [
        (
            "stream",
            "a boolean",
            &Value::is_boolean as &dyn Fn(&Value) -> bool,
        ),
        ("metadata", "an object", &Value::is_object),
        ("response_format", "an object", &Value::is_object),
        ("n", "a whole number above 0", &positive),
        ("max_tokens", "a whole number above 0", &positive),
        ("max_completion_tokens", "a whole number above 0", &positive),
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
    let reply_budget = ["max_completion_tokens", "max_tokens"]
        .into_iter()
        .find_map(|field| Some((field, present(body, field)?.as_u64()?)));
    Ok(ChatBody {
        model,
        messages,
        tools,
        response_format: present(body, "response_format").cloned(),
        stream: present(body, "stream") == Some(&Value::Bool(true)),
        choices: present(body, "n").and_then(Value::as_u64),
        reply_budget,
    })
}

/// The `model` a body names: a string that is not empty.
pub(super) fn read_model(body: &Map<String, Value>) -> Result<String, BodyError> {
    match body.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model.clone()),
        Some(Value::String(_)) => Err(BodyError::new("model", "model: is empty")),
        Some(_) => Err(BodyError::new("model", "model: must be a string")),
        None => Err(BodyError::new("model", "model: missing")),
    }
}

/// `field` of `body`, unless absent or `null`.
pub(super) fn present<'a>(body: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    body.get(field).filter(|value| !value.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<ChatBody, BodyError> {
        read_chat_body(body.as_object().unwrap())
    }

    #[test]
    fn a_body_is_read_with_what_a_turn_needs() {
        let body = read(json!({
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "response_format": {"type": "json_object"}, "stream": true, "n": 1,
            "max_tokens": 50, "max_completion_tokens": 40, "temperature": 0.2,
        }))
        .unwrap();
        assert_eq!(body.model, "gpt-4o-mini");
        assert_eq!(body.messages, vec![Message::user("Hi")]);
        assert_eq!(body.tools.len(), 1);
        assert!(body.response_format.is_some() && body.stream);
        assert_eq!(body.choices, Some(1));
        assert_eq!(body.reply_budget, Some(("max_completion_tokens", 40)));
    }

    #[test]
    fn each_malformed_field_is_named() {
        for (body, field, text) in [
            (json!({"messages": []}), "model", "model: missing"),
            (
                json!({"model": "", "messages": []}),
                "model",
                "model: is empty",
            ),
            (
                json!({"model": 3, "messages": []}),
                "model",
                "model: must be a string",
            ),
            (
                json!({"model": "m", "messages": {}}),
                "messages",
                "messages",
            ),
            (
                json!({"model": "m", "messages": [], "tools": {}}),
                "tools",
                "tools: must be an array",
            ),
            (
                json!({"model": "m", "messages": [], "stream": "yes"}),
                "stream",
                "stream: must be a boolean",
            ),
            (
                json!({"model": "m", "messages": [], "n": 0}),
                "n",
                "n: must be a whole number above 0",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": -1}),
                "max_tokens",
                "max_tokens: must be",
            ),
            (
                json!({"model": "m", "messages": [], "metadata": []}),
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
