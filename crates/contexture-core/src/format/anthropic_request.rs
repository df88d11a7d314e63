//! Anthropic Messages request bodies, read as a door needs them to run one as a turn: the
//! model, the system prompt and messages ([`super::anthropic::parse_request`]), the tools
//! (in the OpenAI function shape every count and every upstream reads), the reply budget
//! (`max_tokens`, which the API requires), and the shape of every other field a door acts
//! on, each checked so a malformed request is refused naming the field. A `compaction`
//! block the client sends back is read as what it stands for
//! ([`super::anthropic_edits::resume_after_compaction`]).
//!
//! Anthropic's server tools (`web_search_*`, `code_execution_*`, `bash_*`, ...) run on
//! Anthropic's side and have no place in a turn Contexture fits and may send to any model:
//! a body naming one is refused, naming its type.

use serde_json::{Map, Value, json};

use super::anthropic;
use super::anthropic_edits::{ContextEdits, read_context_management, resume_after_compaction};
use super::openai_request::{BodyError, present, read_model};
use crate::message::Message;

/// A Messages body, read.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesBody {
    /// The model named.
    pub model: String,
    /// The system prompt (a leading system message) and the turns.
    pub messages: Vec<Message>,
    /// The tool schemas, in OpenAI's function shape
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    pub tools: Vec<Value>,
    /// The reply budget (`max_tokens`).
    pub max_tokens: u64,
    /// True when the client asked for a stream.
    pub stream: bool,
    /// The context edits it named (`context_management`), when it named any.
    pub edits: Option<ContextEdits>,
}

/// Reads a Messages body. `max_tokens` is required unless `counting` (a token count has
/// no reply).
pub fn read_messages_body(
    body: &Map<String, Value>,
    counting: bool,
) -> Result<MessagesBody, BodyError> {
    let model = read_model(body)?;
    match body.get("messages") {
        Some(Value::Array(_)) => {}
        Some(_) => return Err(BodyError::new("messages", "messages: must be an array")),
        None => return Err(BodyError::new("messages", "messages: missing")),
    }
    let messages = anthropic::parse_request(&Value::Object(body.clone())).map_err(|error| {
        let field = error.to_string();
        let field = field.split(':').next().unwrap_or("messages").to_owned();
        BodyError {
            field,
            message: error.to_string(),
        }
    })?;
    // A compaction block sent back stands for what it covered.
    let messages = resume_after_compaction(messages);
    let max_tokens = match present(body, "max_tokens") {
        Some(value) => value
            .as_u64()
            .filter(|tokens| *tokens >= 1)
            .ok_or_else(|| {
                BodyError::new("max_tokens", "max_tokens: must be a whole number above 0")
            })?,
        None if counting => 0,
        None => return Err(BodyError::new("max_tokens", "max_tokens: missing")),
    };
    for (field, expected, fits) in [
        (
            "stream",
            "a boolean",
            &Value::is_boolean as &dyn Fn(&Value) -> bool,
        ),
        ("metadata", "an object", &Value::is_object),
        ("tool_choice", "an object", &Value::is_object),
        ("thinking", "an object", &Value::is_object),
        ("stop_sequences", "an array", &Value::is_array),
        ("temperature", "a number", &Value::is_number),
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
    let tools = match present(body, "tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools
            .iter()
            .enumerate()
            .map(|(index, tool)| openai_tool(tool, &format!("tools[{index}]")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(BodyError::new("tools", "tools: must be an array")),
    };
    Ok(MessagesBody {
        model,
        messages,
        tools,
        max_tokens,
        stream: present(body, "stream") == Some(&Value::Bool(true)),
        edits: read_context_management(body)?,
    })
}

/// An Anthropic client tool (`name`, `description`, `input_schema`) in OpenAI's function
/// shape; a server tool is refused naming its type.
fn openai_tool(tool: &Value, path: &str) -> Result<Value, BodyError> {
    let Value::Object(tool) = tool else {
        return Err(BodyError::new(path, format!("{path}: must be an object")));
    };
    if let Some(kind) = tool.get("type").and_then(Value::as_str)
        && kind != "custom"
    {
        return Err(BodyError::new(
            &format!("{path}.type"),
            format!(
                "{path}.type: `{kind}` is a tool Anthropic's servers run, which a turn sent to any model cannot use; give client tools (name, description, input_schema)"
            ),
        ));
    }
    let name = match tool.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name,
        _ => {
            return Err(BodyError::new(
                &format!("{path}.name"),
                format!("{path}.name: must be a string that is not empty"),
            ));
        }
    };
    let schema = match tool.get("input_schema") {
        Some(Value::Object(schema)) => Value::Object(schema.clone()),
        _ => {
            return Err(BodyError::new(
                &format!("{path}.input_schema"),
                format!("{path}.input_schema: must be a JSON schema object"),
            ));
        }
    };
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    if let Some(description) = tool.get("description").filter(|d| !d.is_null()) {
        function.insert("description".into(), description.clone());
    }
    function.insert("parameters".into(), schema);
    Ok(json!({"type": "function", "function": function}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<MessagesBody, BodyError> {
        read_messages_body(body.as_object().unwrap(), false)
    }

    #[test]
    fn a_body_is_read_with_what_a_turn_needs() {
        let body = read(json!({
            "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [{"name": "weather", "description": "Look it up.",
                       "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 2000},
            "unknown_field": "ignored",
        }))
        .unwrap();
        assert_eq!(body.model, "claude-sonnet-4-5");
        assert_eq!(body.max_tokens, 1024);
        assert!(body.stream);
        assert_eq!(body.messages.len(), 2);
        assert_eq!(
            body.tools,
            vec![json!({"type": "function", "function": {"name": "weather",
                        "description": "Look it up.",
                        "parameters": {"type": "object", "properties": {}}}})]
        );
        let counted = read_messages_body(
            json!({"model": "m", "messages": []}).as_object().unwrap(),
            true,
        )
        .unwrap();
        assert_eq!(counted.max_tokens, 0);
    }

    #[test]
    fn each_malformed_field_is_named() {
        for (body, field, text) in [
            (
                json!({"messages": [], "max_tokens": 1}),
                "model",
                "model: missing",
            ),
            (
                json!({"model": "m", "max_tokens": 1}),
                "messages",
                "messages: missing",
            ),
            (
                json!({"model": "m", "messages": {}, "max_tokens": 1}),
                "messages",
                "messages: must be an array",
            ),
            (
                json!({"model": "m", "messages": []}),
                "max_tokens",
                "max_tokens: missing",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": 0}),
                "max_tokens",
                "max_tokens: must be a whole number above 0",
            ),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}], "max_tokens": 1}),
                "messages[0].role",
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": 1, "stream": "yes"}),
                "stream",
                "stream: must be a boolean",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": 1, "tools": [
                    {"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
                "`web_search_20250305` is a tool Anthropic's servers run",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": 1, "tools": [
                    {"name": "f"}]}),
                "tools[0].input_schema",
                "tools[0].input_schema: must be a JSON schema object",
            ),
            (
                json!({"model": "m", "messages": [], "max_tokens": 1, "tools": [
                    {"input_schema": {}}]}),
                "tools[0].name",
                "tools[0].name",
            ),
        ] {
            let error = read(body.clone()).expect_err(&body.to_string());
            assert_eq!(error.field, field, "{body}: {}", error.message);
            assert!(error.message.contains(text), "{body}: {}", error.message);
        }
    }
}
