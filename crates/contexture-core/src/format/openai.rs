//! OpenAI chat-completions messages.
//!
//! One wire message is one [`Message`]:
//!
//! | wire | neutral |
//! |---|---|
//! | `role` (`system`, `developer`, `user`, `assistant`, `tool`) | [`Message::role`] |
//! | `content`: string / array of parts / `null` / absent | `Some(Content::Text)` / `Some(Content::Parts)` / `None` / `None` with [`Message::content_omitted`] |
//! | `{"type": "text", "text"}` part | [`Part::Text`] |
//! | `{"type": "image_url", "image_url": {"url", "detail"}}` part | [`Part::Image`] |
//! | `{"type": "reasoning", "text", "signature", "redacted"}` part | [`Part::Reasoning`] |
//! | any other part (`input_audio`, `file`, ...) | [`Part::Other`], verbatim |
//! | `name` | [`Message::name`] |
//! | `tool_calls`: `[{"id", "type": "function", "function": {"name", "arguments"}}]` | [`Message::tool_calls`] |
//! | `tool_call_id` | [`Message::tool_call_id`] |
//! | anything else (`refusal`, `annotations`, `audio`, `reasoning_content`, ...) | [`Message::extra`] |
//!
//! Unknown fields of a part, of a tool call and of its `function` object are kept too (in the
//! part's `extra`, the call's `extra`, and the call's `extra["function"]` respectively). A
//! known field whose value the model cannot tell from absence (`name: null`,
//! `tool_call_id: null`, `tool_calls: null` or `[]`) is kept verbatim in [`Message::extra`].
//! An `image_url` part with fields beyond `url` and `detail` is kept whole as
//! [`Part::Other`].
//!
//! Chat completions has no reasoning input; the `reasoning` part is Contexture's own, so that
//! reasoning read from another format (Anthropic thinking) survives a trip through this one.
//! OpenAI's API rejects it: drop [`Part::Reasoning`] parts before sending to OpenAI.
//! [`Message::metadata`] is Contexture's own and is never written.
//!
//! Written messages put their keys in the order `role`, `tool_call_id`, `name`, `content`,
//! `tool_calls`, then the extra fields in the order they were read; parts write `type` first.
//! This is the order of OpenAI's own examples, cookbook and responses, so messages in that
//! order come back byte for byte; other orders come back as equal JSON values.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, json};

use super::{
    FormatError, append_extra, expect_array, expect_object, extra_fields, optional_str,
    required_str, wrong_type,
};
use crate::message::{Content, Message, Part, Role, ToolCall};

const ROLES: &str = "one of system, developer, user, assistant, tool";
const MESSAGE_FIELDS: &[&str] = &["role", "content", "name", "tool_calls", "tool_call_id"];

/// Reads one chat-completions message. Errors name the place as `message.<field>`.
pub fn parse_message(value: &Value) -> Result<Message, FormatError> {
    parse_message_at(value, "message")
}

/// Reads a JSON array of chat-completions messages. Errors name the place as
/// `messages[<index>].<field>`.
pub fn parse_messages(value: &Value) -> Result<Vec<Message>, FormatError> {
    expect_array(value, "messages")?
        .iter()
        .enumerate()
        .map(|(index, message)| parse_message_at(message, &format!("messages[{index}]")))
        .collect()
}

/// Reads the `messages` of a chat-completions request body (other fields, such as `model`
/// and `tools`, are not read). Errors name the place as `messages[<index>].<field>`.
pub fn parse_request(body: &Value) -> Result<Vec<Message>, FormatError> {
    match expect_object(body, "request")?.get("messages") {
        Some(messages) => parse_messages(messages),
        None => Err(FormatError::MissingField {
            path: "messages".into(),
        }),
    }
}

/// Writes one message in the chat-completions format.
pub fn to_value(message: &Message) -> Value {
    // Serializing into a `Value` fails only on map keys that are not strings; every key
    // written here is a string.
    serde_json::to_value(WireMessage(message)).unwrap_or_default()
}

/// Writes messages as a JSON array in the chat-completions format.
pub fn to_values(messages: &[Message]) -> Value {
    Value::Array(messages.iter().map(to_value).collect())
}

/// A message in the chat-completions format as a [`Serialize`] value: what [`to_value`]
/// builds, written straight to the output (a long history is answered without building a
/// tree of `Value`s first).
#[derive(Debug, Clone, Copy)]
pub struct WireMessage<'a>(pub &'a Message);

/// Messages in the chat-completions format, as a JSON array; see [`WireMessage`].
#[derive(Debug, Clone, Copy)]
pub struct WireMessages<'a>(pub &'a [Message]);

impl Serialize for WireMessages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireMessage))
    }
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let extra = &message.extra;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", message.role.as_str())?;
        // Each known field: its value, or else the `extra` entry of that name (a wire value
        // the model keeps there, such as `name: null`), at the field's own place.
        let mut written = vec!["role"];
        let mut known = |key: &'static str, value: Option<Field<'_>>| {
            match (value, extra.get(key)) {
                (Some(value), _) => map.serialize_entry(key, &value)?,
                (None, Some(kept)) => map.serialize_entry(key, kept)?,
                (None, None) => return Ok(()),
            }
            written.push(key);
            Ok::<(), S::Error>(())
        };
        known(
            "tool_call_id",
            message.tool_call_id.as_deref().map(Field::Text),
        )?;
        known("name", message.name.as_deref().map(Field::Text))?;
        let parts;
        let content = match &message.content {
            Some(Content::Text(text)) => Some(Field::Text(text)),
            Some(Content::Parts(list)) => {
                parts = Value::Array(list.iter().map(part_to_value).collect());
                Some(Field::Json(&parts))
            }
            None if message.content_omitted => None,
            None => Some(Field::Json(&Value::Null)),
        };
        known("content", content)?;
        let calls;
        let tool_calls = if message.tool_calls.is_empty() {
            None
        } else {
            calls = Value::Array(message.tool_calls.iter().map(tool_call_to_value).collect());
            Some(Field::Json(&calls))
        };
        known("tool_calls", tool_calls)?;
        for (key, value) in extra {
            if !written.contains(&key.as_str()) {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// A known field's value as [`WireMessage`] writes it.
#[derive(Clone, Copy)]
enum Field<'a> {
    Text(&'a str),
    Json(&'a Value),
}

impl Serialize for Field<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Text(text) => serializer.serialize_str(text),
            Field::Json(value) => value.serialize(serializer),
        }
    }
}

/// Reads one chat-completions message found at `path` (errors name the place as
/// `<path>.<field>`, such as `messages[7].role`).
pub fn parse_message_at(value: &Value, path: &str) -> Result<Message, FormatError> {
    let object = expect_object(value, path)?;
    let role_name = required_str(object, "role", path)?;
    let role = Role::parse(role_name).ok_or_else(|| FormatError::UnknownRole {
        path: format!("{path}.role"),
        role: role_name.to_owned(),
        expected: ROLES,
    })?;
    let mut message = Message::new(role, "");
    message.extra = extra_fields(object, MESSAGE_FIELDS);
    match object.get("content") {
        None => {
            message.content = None;
            message.content_omitted = true;
        }
        Some(Value::Null) => message.content = None,
        Some(Value::String(text)) => message.content = Some(Content::Text(text.as_str().into())),
        Some(Value::Array(parts)) => {
            let parts = parts
                .iter()
                .enumerate()
                .map(|(index, part)| parse_part(part, &format!("{path}.content[{index}]")))
                .collect::<Result<_, _>>()?;
            message.content = Some(Content::Parts(parts));
        }
        Some(other) => {
            return Err(wrong_type(
                format!("{path}.content"),
                "a string, an array of parts or null",
                other,
            ));
        }
    }
    message.name = nullable_str(object, "name", path, &mut message.extra)?;
    message.tool_call_id =
        nullable_str(object, "tool_call_id", path, &mut message.extra)?.map(Arc::from);
    match object.get("tool_calls") {
        None => {}
        Some(Value::Array(calls)) if !calls.is_empty() => {
            message.tool_calls = calls
                .iter()
                .enumerate()
                .map(|(index, call)| parse_tool_call(call, &format!("{path}.tool_calls[{index}]")))
                .collect::<Result<_, _>>()?;
        }
        Some(kept @ (Value::Array(_) | Value::Null)) => {
            message.extra.insert("tool_calls".into(), kept.clone());
        }
        Some(other) => return Err(wrong_type(format!("{path}.tool_calls"), "an array", other)),
    }
    Ok(message)
}

/// A string field that may also be `null` (kept in `extra`) or absent.
fn nullable_str(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
    extra: &mut Map<String, Value>,
) -> Result<Option<String>, FormatError> {
    match object.get(key) {
        Some(Value::Null) => {
            extra.insert(key.to_owned(), Value::Null);
            Ok(None)
        }
        _ => optional_str(object, key, path),
    }
}

fn parse_part(value: &Value, path: &str) -> Result<Part, FormatError> {
    let object = expect_object(value, path)?;
    let kind = required_str(object, "type", path)?;
    Ok(match kind {
        "text" => Part::Text {
            text: required_str(object, "text", path)?.to_owned(),
            extra: extra_fields(object, &["type", "text"]),
        },
        "image_url" => {
            let image_path = format!("{path}.image_url");
            let image = match object.get("image_url") {
                Some(image) => expect_object(image, &image_path)?,
                None => return Err(FormatError::MissingField { path: image_path }),
            };
            let url = required_str(image, "url", &image_path)?;
            let detail = image.get("detail");
            let plain = image.keys().all(|key| key == "url" || key == "detail")
                && detail.is_none_or(Value::is_string);
            if !plain {
                return Ok(Part::Other {
                    value: value.clone(),
                });
            }
            Part::Image {
                url: url.to_owned(),
                detail: detail.and_then(Value::as_str).map(str::to_owned),
                extra: extra_fields(object, &["type", "image_url"]),
            }
        }
        "reasoning" => Part::Reasoning {
            text: required_str(object, "text", path)?.to_owned(),
            signature: optional_str(object, "signature", path)?,
            redacted: optional_str(object, "redacted", path)?,
            extra: extra_fields(object, &["type", "text", "signature", "redacted"]),
        },
        _ => Part::Other {
            value: value.clone(),
        },
    })
}

fn parse_tool_call(value: &Value, path: &str) -> Result<ToolCall, FormatError> {
    let object = expect_object(value, path)?;
    let id = required_str(object, "id", path)?;
    let kind = required_str(object, "type", path)?;
    if kind != "function" {
        return Err(FormatError::Invalid {
            path: format!("{path}.type"),
            reason: format!(
                "unsupported tool call type `{kind}` (only `function` calls are supported)"
            ),
        });
    }
    let function_path = format!("{path}.function");
    let function = match object.get("function") {
        Some(function) => expect_object(function, &function_path)?,
        None => {
            return Err(FormatError::MissingField {
                path: function_path,
            });
        }
    };
    let mut call = ToolCall::new(
        id,
        required_str(function, "name", &function_path)?,
        required_str(function, "arguments", &function_path)?,
    );
    call.extra = extra_fields(object, &["id", "type", "function"]);
    let function_extra = extra_fields(function, &["name", "arguments"]);
    if !function_extra.is_empty() {
        call.extra
            .insert("function".into(), Value::Object(function_extra));
    }
    Ok(call)
}

fn part_to_value(part: &Part) -> Value {
    let (mut object, extra) = match part {
        Part::Text { text, extra } => (json!({ "type": "text", "text": text }), extra),
        Part::Image { url, detail, extra } => {
            let mut image = Map::new();
            image.insert("url".into(), Value::from(url.as_str()));
            if let Some(detail) = detail {
                image.insert("detail".into(), Value::from(detail.as_str()));
            }
            (json!({ "type": "image_url", "image_url": image }), extra)
        }
        Part::Reasoning {
            text,
            signature,
            redacted,
            extra,
        } => {
            let mut object = json!({ "type": "reasoning", "text": text });
            if let Some(signature) = signature {
                object["signature"] = Value::from(signature.as_str());
            }
            if let Some(redacted) = redacted {
                object["redacted"] = Value::from(redacted.as_str());
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

fn tool_call_to_value(call: &ToolCall) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), Value::from(&*call.name));
    function.insert("arguments".into(), Value::from(&*call.arguments));
    if let Some(Value::Object(function_extra)) = call.extra.get("function") {
        append_extra(&mut function, function_extra);
    }
    let mut object = Map::new();
    object.insert("id".into(), Value::from(&*call.id));
    object.insert("type".into(), Value::from("function"));
    object.insert("function".into(), Value::Object(function));
    append_extra(&mut object, &call.extra);
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_null_content_stay_apart() {
        let null = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]});
        let missing = json!({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]});
        let from_null = parse_message(&null).unwrap();
        let from_missing = parse_message(&missing).unwrap();
        assert!(!from_null.content_omitted);
        assert!(from_missing.content_omitted);
        assert_eq!(to_value(&from_null), null);
        assert_eq!(to_value(&from_missing), missing);
    }

    #[test]
    fn constructed_tool_call_turn_writes_null_content() {
        let message = Message::assistant_tool_calls(vec![ToolCall::new("c1", "f", "{}")]);
        assert_eq!(
            serde_json::to_string(&to_value(&message)).unwrap(),
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#
        );
    }

    #[test]
    fn nulls_of_known_fields_are_kept_in_place() {
        let wire = json!({"role": "user", "name": null, "content": "hi", "tool_calls": []});
        let message = parse_message(&wire).unwrap();
        assert_eq!(message.name, None);
        assert!(message.tool_calls.is_empty());
        let back = to_value(&message);
        assert_eq!(
            serde_json::to_string(&back).unwrap(),
            serde_json::to_string(&wire).unwrap()
        );
    }
}
