//! Anthropic Messages API request bodies (`system` plus `messages`).
//!
//! Reading ([`parse_request`]):
//! - `system` (a string, or an array of text blocks) becomes one leading [`Role::System`]
//!   message (`Content::Text` or `Content::Parts`).
//! - An assistant turn becomes one assistant [`Message`]: its `tool_use` blocks become
//!   [`ToolCall`]s (`arguments` is the JSON text of `input`), every other block a [`Part`].
//! - A user turn without `tool_result` blocks becomes one user message. A user turn with
//!   `tool_result` blocks is split in order: each `tool_result` becomes a [`Role::Tool`]
//!   message (`tool_call_id` from `tool_use_id`; `is_error`, `cache_control` and other block
//!   fields in its `extra`), and each run of other blocks between them a user message.
//! - Blocks: `text` → [`Part::Text`]; `image` with a `base64` source → [`Part::Image`] with a
//!   `data:` URL, with a `url` source → [`Part::Image`] with that URL; `thinking` →
//!   [`Part::Reasoning`] (text and signature); `redacted_thinking` → [`Part::Reasoning`] with
//!   `redacted` set; anything else (`document`, `search_result`, `server_tool_use`, an image
//!   with a `file` source, ...) → [`Part::Other`], verbatim. Unknown fields of blocks and turns
//!   go to the `extra` maps.
//!
//! Writing ([`to_request`]) reverses this: the leading system and developer messages become
//! `system`; every run of consecutive tool and user messages that holds a tool result is
//! regrouped into one user turn, in order; tool calls become `tool_use` blocks after the
//! turn's other blocks. A request read by [`parse_request`] is written back exactly (key order
//! included), with two exceptions: consecutive user turns of which one holds tool results
//! come back as one turn (the API merges them anyway), and `tool_use` blocks that preceded
//! other blocks in an assistant turn come back after them.
//!
//! What does not carry over from OpenAI messages:
//! - `name` (the format has no participant names), an image's `detail` and a `tool_call_id`
//!   on anything but a tool message are dropped; tool calls on anything but an assistant
//!   message are a [`FormatError::Unmappable`].
//! - Fields of system messages other than their content are dropped; a system or developer
//!   message after the first other message is a [`FormatError::Unmappable`].
//! - Tool call arguments must be a JSON value (an empty string is read as `{}`); a tool result
//!   needs a `tool_call_id`; a user message that is merged into a tool-result turn cannot keep
//!   message-level extra fields. Each is a [`FormatError::Unmappable`].
//! - `extra` fields are written as they are, whichever format they came from; clear
//!   [`Message::extra`] first if the target API rejects foreign fields (OpenAI's `refusal`,
//!   `annotations`, ...).
//! - An assistant turn with neither content nor tool calls is written with `content: ""`.

use serde_json::{Map, Value, json};

use super::{
    FormatError, append_extra, expect_array, expect_object, extra_fields, optional_str,
    required_str, wrong_type,
};
use crate::message::{Content, Message, Part, Role, ToolCall};

const FORMAT: &str = "anthropic";
const ROLES: &str = "user or assistant";

/// Reads the `system` and `messages` of a Messages API request body into neutral messages,
/// the system prompt first. Other top-level fields (`model`, `tools`, ...) are not read.
pub fn parse_request(body: &Value) -> Result<Vec<Message>, FormatError> {
    let object = expect_object(body, "request")?;
    let mut messages = Vec::new();
    match object.get("system") {
        None => {}
        Some(Value::String(text)) => messages.push(Message::system(text.as_str())),
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .enumerate()
                .map(|(index, block)| {
                    let path = format!("system[{index}]");
                    match parse_block(block, &path)? {
                        Block::Part(part) => Ok(part),
                        Block::ToolUse(_) | Block::ToolResult(_) => Err(FormatError::Invalid {
                            path,
                            reason: "tool blocks are not allowed in the system prompt".into(),
                        }),
                    }
                })
                .collect::<Result<_, _>>()?;
            let mut system = Message::system("");
            system.content = Some(Content::Parts(parts));
            messages.push(system);
        }
        Some(other) => {
            return Err(wrong_type(
                "system",
                "a string or an array of blocks",
                other,
            ));
        }
    }
    let turns = match object.get("messages") {
        Some(turns) => expect_array(turns, "messages")?,
        None => {
            return Err(FormatError::MissingField {
                path: "messages".into(),
            });
        }
    };
    for (index, turn) in turns.iter().enumerate() {
        parse_turn(turn, &format!("messages[{index}]"), &mut messages)?;
    }
    Ok(messages)
}

/// Writes neutral messages as the `system` and `messages` of a Messages API request body
/// (`{"system": ..., "messages": [...]}`, without `system` when there is no system prompt).
pub fn to_request(messages: &[Message]) -> Result<Value, FormatError> {
    let leading = messages
        .iter()
        .take_while(|message| message.role.is_system_like())
        .count();
    let mut body = Map::new();
    if leading > 0 {
        body.insert("system".into(), system_to_value(&messages[..leading]));
    }
    let mut turns = Vec::new();
    let mut index = leading;
    while index < messages.len() {
        let message = &messages[index];
        let path = format!("messages[{index}]");
        if message.role != Role::Assistant && !message.tool_calls.is_empty() {
            return Err(unmappable(
                format!("{path}.tool_calls"),
                "only assistant messages can carry tool calls",
            ));
        }
        match message.role {
            Role::System | Role::Developer => {
                return Err(unmappable(
                    path,
                    "a system or developer message after the conversation began (the format has only one system prompt, before all turns)",
                ));
            }
            Role::Assistant => {
                turns.push(assistant_to_value(message, &path)?);
                index += 1;
            }
            Role::User | Role::Tool => {
                let end = index
                    + messages[index..]
                        .iter()
                        .take_while(|m| matches!(m.role, Role::User | Role::Tool))
                        .count();
                let run = &messages[index..end];
                if run.iter().any(|m| m.role == Role::Tool) {
                    turns.push(tool_turn_to_value(run, index)?);
                } else {
                    turns.extend(run.iter().map(user_to_value));
                }
                index = end;
            }
        }
    }
    body.insert("messages".into(), Value::Array(turns));
    Ok(Value::Object(body))
}

/// One content block, read.
enum Block {
    Part(Part),
    ToolUse(ToolCall),
    ToolResult(Message),
}

fn parse_turn(value: &Value, path: &str, messages: &mut Vec<Message>) -> Result<(), FormatError> {
    let object = expect_object(value, path)?;
    let role_name = required_str(object, "role", path)?;
    let role = match role_name {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => {
            return Err(FormatError::UnknownRole {
                path: format!("{path}.role"),
                role: role_name.to_owned(),
                expected: ROLES,
            });
        }
    };
    let extra = extra_fields(object, &["role", "content"]);
    let blocks = match object.get("content") {
        Some(Value::String(text)) => {
            let mut message = Message::new(role, text.as_str());
            message.extra = extra;
            messages.push(message);
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(other) => {
            return Err(wrong_type(
                format!("{path}.content"),
                "a string or an array of blocks",
                other,
            ));
        }
        None => {
            return Err(FormatError::MissingField {
                path: format!("{path}.content"),
            });
        }
    };
    let blocks = blocks
        .iter()
        .enumerate()
        .map(|(index, block)| {
            let block_path = format!("{path}.content[{index}]");
            parse_block(block, &block_path).map(|block| (block_path, block))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut message = Message::new(role, "");
    message.content = Some(Content::Parts(Vec::new()));
    message.extra = extra;
    let has_results = blocks
        .iter()
        .any(|(_, block)| matches!(block, Block::ToolResult(_)));
    if has_results && !message.extra.is_empty() {
        return Err(FormatError::Invalid {
            path: path.to_owned(),
            reason: "a user turn with tool_result blocks cannot keep turn-level fields other than role and content".into(),
        });
    }
    let mut pending = false;
    for (block_path, block) in blocks {
        match (block, role) {
            (Block::Part(part), _) => {
                if let Some(Content::Parts(parts)) = &mut message.content {
                    parts.push(part);
                }
                pending = true;
            }
            (Block::ToolUse(call), Role::Assistant) => message.tool_calls.push(call),
            (Block::ToolResult(result), Role::User) => {
                if pending {
                    messages.push(std::mem::replace(&mut message, empty_user()));
                    pending = false;
                }
                messages.push(result);
            }
            (Block::ToolUse(_), _) => {
                return Err(FormatError::Invalid {
                    path: block_path,
                    reason: "tool_use blocks belong in an assistant turn".into(),
                });
            }
            (Block::ToolResult(_), _) => {
                return Err(FormatError::Invalid {
                    path: block_path,
                    reason: "tool_result blocks belong in a user turn".into(),
                });
            }
        }
    }
    if pending || !has_results {
        messages.push(message);
    }
    Ok(())
}

fn empty_user() -> Message {
    let mut message = Message::new(Role::User, "");
    message.content = Some(Content::Parts(Vec::new()));
    message
}

fn parse_block(value: &Value, path: &str) -> Result<Block, FormatError> {
    let object = expect_object(value, path)?;
    let kind = required_str(object, "type", path)?;
    let part = match kind {
        "text" => Part::Text {
            text: required_str(object, "text", path)?.to_owned(),
            extra: extra_fields(object, &["type", "text"]),
        },
        "image" => {
            let source_path = format!("{path}.source");
            let source = match object.get("source") {
                Some(source) => expect_object(source, &source_path)?,
                None => return Err(FormatError::MissingField { path: source_path }),
            };
            match image_url(source, &source_path)? {
                Some(url) => Part::Image {
                    url,
                    detail: None,
                    extra: extra_fields(object, &["type", "source"]),
                },
                None => Part::Other {
                    value: value.clone(),
                },
            }
        }
        "thinking" => Part::Reasoning {
            text: required_str(object, "thinking", path)?.to_owned(),
            signature: optional_str(object, "signature", path)?,
            redacted: None,
            extra: extra_fields(object, &["type", "thinking", "signature"]),
        },
        "redacted_thinking" => Part::Reasoning {
            text: String::new(),
            signature: None,
            redacted: Some(required_str(object, "data", path)?.to_owned()),
            extra: extra_fields(object, &["type", "data"]),
        },
        "tool_use" => {
            let input = object
                .get("input")
                .ok_or_else(|| FormatError::MissingField {
                    path: format!("{path}.input"),
                })?;
            let mut call = ToolCall::new(
                required_str(object, "id", path)?,
                required_str(object, "name", path)?,
                input.to_string(),
            );
            call.extra = extra_fields(object, &["type", "id", "name", "input"]);
            return Ok(Block::ToolUse(call));
        }
        "tool_result" => return parse_tool_result(object, path).map(Block::ToolResult),
        _ => Part::Other {
            value: value.clone(),
        },
    };
    Ok(Block::Part(part))
}

/// The URL an image source stands for, or `None` for a source the model cannot hold exactly
/// (a `file` source, extra fields, a media type that would not survive a `data:` URL).
fn image_url(source: &Map<String, Value>, path: &str) -> Result<Option<String>, FormatError> {
    let kind = required_str(source, "type", path)?;
    let only = |keys: &[&str]| source.keys().all(|key| keys.contains(&key.as_str()));
    Ok(match kind {
        "base64" if only(&["type", "media_type", "data"]) => {
            let media_type = required_str(source, "media_type", path)?;
            let data = required_str(source, "data", path)?;
            if media_type.contains([';', ',']) {
                None
            } else {
                Some(format!("data:{media_type};base64,{data}"))
            }
        }
        "url" if only(&["type", "url"]) => {
            let url = required_str(source, "url", path)?;
            (!url.starts_with("data:")).then(|| url.to_owned())
        }
        _ => None,
    })
}

fn parse_tool_result(object: &Map<String, Value>, path: &str) -> Result<Message, FormatError> {
    let mut message = Message::new(Role::Tool, "");
    message.tool_call_id = Some(required_str(object, "tool_use_id", path)?.into());
    message.extra = extra_fields(object, &["type", "tool_use_id", "content"]);
    match object.get("content") {
        None => {
            message.content = None;
            message.content_omitted = true;
        }
        Some(Value::String(text)) => message.content = Some(Content::Text(text.as_str().into())),
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .enumerate()
                .map(|(index, block)| {
                    let block_path = format!("{path}.content[{index}]");
                    match parse_block(block, &block_path)? {
                        Block::Part(part) => Ok(part),
                        Block::ToolUse(_) | Block::ToolResult(_) => Err(FormatError::Invalid {
                            path: block_path,
                            reason: "tool blocks are not allowed inside a tool_result".into(),
                        }),
                    }
                })
                .collect::<Result<_, _>>()?;
            message.content = Some(Content::Parts(parts));
        }
        Some(other) => {
            return Err(wrong_type(
                format!("{path}.content"),
                "a string or an array of blocks",
                other,
            ));
        }
    }
    Ok(message)
}

fn unmappable(path: String, reason: impl Into<String>) -> FormatError {
    FormatError::Unmappable {
        path,
        format: FORMAT,
        reason: reason.into(),
    }
}

fn system_to_value(system: &[Message]) -> Value {
    if let [only] = system
        && let Some(Content::Text(text)) = &only.content
    {
        return Value::from(&**text);
    }
    let mut blocks = Vec::new();
    for message in system {
        match &message.content {
            Some(Content::Text(text)) => blocks.push(json!({ "type": "text", "text": text })),
            Some(Content::Parts(parts)) => blocks.extend(parts.iter().map(part_to_block)),
            None => {}
        }
    }
    Value::Array(blocks)
}

fn turn(role: &str, content: Value, extra: &Map<String, Value>) -> Value {
    let mut object = Map::new();
    object.insert("role".into(), Value::from(role));
    object.insert("content".into(), content);
    append_extra(&mut object, extra);
    Value::Object(object)
}

fn user_to_value(message: &Message) -> Value {
    let content = match &message.content {
        Some(content) => content_to_value(content),
        None => Value::from(""),
    };
    turn("user", content, &message.extra)
}

fn assistant_to_value(message: &Message, path: &str) -> Result<Value, FormatError> {
    let content = if message.tool_calls.is_empty() {
        match &message.content {
            Some(content) => content_to_value(content),
            None => Value::from(""),
        }
    } else {
        let mut blocks = content_blocks(message.content.as_ref());
        for (index, call) in message.tool_calls.iter().enumerate() {
            blocks.push(tool_use_to_block(
                call,
                &format!("{path}.tool_calls[{index}]"),
            )?);
        }
        Value::Array(blocks)
    };
    Ok(turn("assistant", content, &message.extra))
}

/// The blocks of a body that is written as blocks: a non-empty text becomes one text block.
fn content_blocks(content: Option<&Content>) -> Vec<Value> {
    match content {
        Some(Content::Text(text)) if !text.is_empty() => {
            vec![json!({ "type": "text", "text": text })]
        }
        Some(Content::Parts(parts)) => parts.iter().map(part_to_block).collect(),
        _ => Vec::new(),
    }
}

fn tool_turn_to_value(run: &[Message], first_index: usize) -> Result<Value, FormatError> {
    let mut blocks = Vec::new();
    for (offset, message) in run.iter().enumerate() {
        let path = format!("messages[{}]", first_index + offset);
        if message.role == Role::Tool {
            blocks.push(tool_result_to_block(message, &path)?);
            continue;
        }
        if !message.extra.is_empty() {
            return Err(unmappable(
                format!("{path}.extra"),
                "a user message merged into a tool-result turn cannot keep message-level fields",
            ));
        }
        match &message.content {
            Some(Content::Text(text)) => blocks.push(json!({ "type": "text", "text": text })),
            Some(Content::Parts(parts)) => blocks.extend(parts.iter().map(part_to_block)),
            None => {}
        }
    }
    Ok(turn("user", Value::Array(blocks), &Map::new()))
}

fn tool_result_to_block(message: &Message, path: &str) -> Result<Value, FormatError> {
    let id = message.tool_call_id.as_deref().ok_or_else(|| {
        unmappable(
            format!("{path}.tool_call_id"),
            "a tool result needs the id of the call it answers",
        )
    })?;
    let mut object = Map::new();
    object.insert("type".into(), Value::from("tool_result"));
    object.insert("tool_use_id".into(), Value::from(id));
    if let Some(content) = &message.content {
        object.insert("content".into(), content_to_value(content));
    }
    append_extra(&mut object, &message.extra);
    Ok(Value::Object(object))
}

fn tool_use_to_block(call: &ToolCall, path: &str) -> Result<Value, FormatError> {
    let input = if call.arguments.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(&call.arguments).map_err(|error| {
            unmappable(
                format!("{path}.arguments"),
                format!("tool_use input must be JSON, and the arguments are not ({error})"),
            )
        })?
    };
    let mut object = Map::new();
    object.insert("type".into(), Value::from("tool_use"));
    object.insert("id".into(), Value::from(&*call.id));
    object.insert("name".into(), Value::from(&*call.name));
    object.insert("input".into(), input);
    append_extra(&mut object, &call.extra);
    Ok(Value::Object(object))
}

fn content_to_value(content: &Content) -> Value {
    match content {
        Content::Text(text) => Value::from(&**text),
        Content::Parts(parts) => Value::Array(parts.iter().map(part_to_block).collect()),
    }
}

fn part_to_block(part: &Part) -> Value {
    let (mut object, extra) = match part {
        Part::Text { text, extra } => (json!({ "type": "text", "text": text }), extra),
        Part::Image { url, extra, .. } => {
            let source = match split_data_url(url) {
                Some((media_type, data)) => {
                    json!({ "type": "base64", "media_type": media_type, "data": data })
                }
                None => json!({ "type": "url", "url": url }),
            };
            (json!({ "type": "image", "source": source }), extra)
        }
        Part::Reasoning {
            redacted: Some(data),
            extra,
            ..
        } => (json!({ "type": "redacted_thinking", "data": data }), extra),
        Part::Reasoning {
            text,
            signature,
            extra,
            ..
        } => {
            let mut object = json!({ "type": "thinking", "thinking": text });
            if let Some(signature) = signature {
                object["signature"] = Value::from(signature.as_str());
            }
            (object, extra)
        }
        Part::Other { value } => return value.clone(),
    };
    if let Value::Object(object) = &mut object {
        append_extra(object, extra);
    }
    object
}

/// `(media type, base64 data)` of a `data:<media type>;base64,<data>` URL.
fn split_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (media_type, data) = rest.split_once(";base64,")?;
    (!media_type.contains([';', ','])).then_some((media_type, data))
}

/// An answer's stop reason in OpenAI's words (`finish_reason`): Anthropic's `end_turn` and
/// `stop_sequence` are `stop`, `max_tokens` and `model_context_window_exceeded` are
/// `length`, `tool_use` is `tool_calls`, `refusal` is `content_filter`; a reason that is
/// OpenAI's already, or that OpenAI has no word for (`pause_turn`), is kept as it is.
pub fn openai_finish_reason(stop_reason: &str) -> &str {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_read_in_openais_words() {
        let table = [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("model_context_window_exceeded", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
            ("pause_turn", "pause_turn"),
            ("stop", "stop"),
            ("tool_calls", "tool_calls"),
            ("length", "length"),
        ];
        for (stop_reason, finish_reason) in table {
            assert_eq!(
                openai_finish_reason(stop_reason),
                finish_reason,
                "{stop_reason}"
            );
        }
    }

    #[test]
    fn data_urls_split_only_when_plain() {
        assert_eq!(
            split_data_url("data:image/png;base64,AAAA"),
            Some(("image/png", "AAAA"))
        );
        assert_eq!(split_data_url("https://example.com/a.png"), None);
        assert_eq!(split_data_url("data:image/png;charset=x;base64,AAAA"), None);
    }

    #[test]
    fn tool_results_and_text_of_one_turn_split_in_order() {
        let body = json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "before"},
                {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                {"type": "tool_result", "tool_use_id": "b", "content": "2"},
                {"type": "text", "text": "after"}
            ]}
        ]});
        let messages = parse_request(&body).unwrap();
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Tool, Role::Tool, Role::User]);
        assert_eq!(to_request(&messages).unwrap(), body);
    }
}
