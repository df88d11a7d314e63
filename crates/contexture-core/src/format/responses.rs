//! OpenAI Responses API items: a conversation as a list of items rather than messages.
//!
//! | item | neutral |
//! |---|---|
//! | `{"type": "message", "role", "content"}` (also without `type`) | a [`Message`] of that role (`system`, `developer`, `user`, `assistant`) |
//! | `input_text` / `output_text` part `{"text", ...}` | [`Part::Text`] (other fields, such as `annotations`, in its `extra`) |
//! | `input_image` part `{"image_url", "detail"}` | [`Part::Image`] |
//! | any other part (`input_file`, `refusal`, ...) | [`Part::Other`], verbatim |
//! | `{"type": "function_call", "call_id", "name", "arguments"}` | a [`ToolCall`] of the assistant turn it follows (or of a new one) |
//! | `{"type": "function_call_output", "call_id", "output"}` | a [`Role::Tool`] message |
//! | `{"type": "reasoning", "summary", "encrypted_content", ...}` | a [`Part::Reasoning`] of the assistant turn it opens |
//! | `{"type": "compaction", "encrypted_content", ...}` | a user message of that text (Contexture's compaction items hold their summary as readable text) |
//!
//! One assistant turn is several items in this API (its reasoning, its message, its function
//! calls) and one [`Message`] here: consecutive assistant items are read into one message and
//! written back in the order reasoning, message, function calls. Fields of an item the model
//! has no place for (`id`, `status`, ...) are kept in the message's `extra` (a function call's
//! in the call's `extra`) and written back, so items come back as they were read, with two
//! exceptions: an item without `type` is written with `type: "message"`, and a part's type
//! follows its role (`output_text` for the assistant, `input_text` for the others) unless
//! it was read as the other one.
//!
//! The reasoning summary's text becomes the part's text, so reasoning reads the same in
//! every format; the item's own fields (`id`, a `summary` of several entries, ...) are kept in
//! the part's `extra`, and `encrypted_content` in its `redacted`, for an upstream that takes
//! them back. A signature read from another format (Anthropic's) has no place here and is not
//! written.

use serde_json::{Map, Value, json};

use super::{FormatError, expect_array, expect_object, extra_fields, required_str, wrong_type};
use crate::message::{Content, Message, Part, Role, ToolCall};

const MESSAGE_ROLES: &str = "one of system, developer, user, assistant";
const MESSAGE_FIELDS: &[&str] = &["type", "role", "content"];
const CALL_FIELDS: &[&str] = &["type", "call_id", "name", "arguments"];
const OUTPUT_FIELDS: &[&str] = &["type", "call_id", "output"];
const REASONING_FIELDS: &[&str] = &["type", "encrypted_content"];

/// The item types this module reads, for error messages.
const ITEM_TYPES: &str = "message, function_call, function_call_output, reasoning, compaction";

/// `message` as its items with the last one taken off: what stays of it (the rest of its
/// turn, read back as messages: its reasoning, its text, its other calls) and that item
/// (`None` for a message of no item). One assistant turn is several items in this API, and
/// an item is what a client of it removes one at a time.
pub fn split_last_item(message: &Message) -> Result<(Vec<Message>, Option<Value>), FormatError> {
    let mut items = to_items(std::slice::from_ref(message));
    let Some(last) = items.pop() else {
        return Ok((Vec::new(), None));
    };
    Ok((parse_items(&Value::Array(items), "items")?, Some(last)))
}

/// Reads a request's `input`: a string (one user message) or a list of items. Errors name
/// the place as `input[<index>].<field>`.
pub fn parse_input(input: &Value) -> Result<Vec<Message>, FormatError> {
    match input {
        Value::String(text) => Ok(vec![Message::user(text.as_str())]),
        Value::Array(_) => parse_items(input, "input"),
        other => Err(wrong_type("input", "a string or an array of items", other)),
    }
}

/// Reads a JSON array of items found at `path` (e.g. `input`, `items`). Errors name the place
/// as `<path>[<index>].<field>`.
pub fn parse_items(items: &Value, path: &str) -> Result<Vec<Message>, FormatError> {
    let mut messages: Vec<Message> = Vec::new();
    // True while the last message is an assistant turn that later assistant items join.
    let mut open_turn = false;
    for (index, item) in expect_array(items, path)?.iter().enumerate() {
        let at = format!("{path}[{index}]");
        let object = expect_object(item, &at)?;
        let kind = match object.get("type") {
            None => "message",
            Some(Value::String(kind)) => kind.as_str(),
            Some(other) => return Err(wrong_type(format!("{at}.type"), "a string", other)),
        };
        match kind {
            "message" => {
                let message = parse_message(object, &at)?;
                let assistant = message.role == Role::Assistant;
                match messages.last_mut() {
                    // A message after the turn's reasoning completes it.
                    Some(last) if open_turn && assistant && joins_reasoning(last) => {
                        let Some(Content::Parts(parts)) = &mut last.content else {
                            unreachable!("joins_reasoning checked the parts")
                        };
                        match message.content.clone() {
                            Some(Content::Parts(more)) => parts.extend(more),
                            Some(Content::Text(text)) => parts.push(Part::text(text.to_string())),
                            None => {}
                        }
                        last.extra = message.extra.clone();
                        last.touch();
                    }
                    _ => messages.push(message),
                }
                open_turn = assistant;
            }
            "function_call" => {
                let call = parse_call(object, &at)?;
                match messages.last_mut() {
                    Some(last) if open_turn => {
                        last.tool_calls.push(call);
                        last.touch();
                    }
                    _ => {
                        messages.push(Message::assistant_tool_calls(vec![call]));
                        open_turn = true;
                    }
                }
            }
            "function_call_output" => {
                messages.push(parse_output(object, &at)?);
                open_turn = false;
            }
            "compaction" => {
                messages.push(parse_compaction(object, &at)?);
                open_turn = false;
            }
            "reasoning" => {
                let part = parse_reasoning(object, &at)?;
                match messages.last_mut() {
                    Some(last) if open_turn && last.tool_calls.is_empty() => {
                        push_part(last, part);
                    }
                    _ => {
                        let mut message = Message::assistant("");
                        message.content = Some(Content::Parts(vec![part]));
                        messages.push(message);
                        open_turn = true;
                    }
                }
            }
            other => {
                return Err(FormatError::Invalid {
                    path: format!("{at}.type"),
                    reason: format!(
                        "item type `{other}` is not supported (supported: {ITEM_TYPES})"
                    ),
                });
            }
        }
    }
    Ok(messages)
}

/// True when `message` holds only reasoning so far: the assistant message item that follows
/// belongs to the same turn.
fn joins_reasoning(message: &Message) -> bool {
    message.tool_calls.is_empty()
        && matches!(&message.content, Some(Content::Parts(parts))
            if parts.iter().all(|part| matches!(part, Part::Reasoning { .. })))
}

fn push_part(message: &mut Message, part: Part) {
    match &mut message.content {
        Some(Content::Parts(parts)) => parts.push(part),
        Some(Content::Text(text)) => {
            let text = Part::text(text.to_string());
            message.content = Some(Content::Parts(vec![part, text]));
        }
        None => message.content = Some(Content::Parts(vec![part])),
    }
    message.touch();
}

fn parse_message(object: &Map<String, Value>, path: &str) -> Result<Message, FormatError> {
    let role_name = required_str(object, "role", path)?;
    let role = match role_name {
        "system" => Role::System,
        "developer" => Role::Developer,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(FormatError::UnknownRole {
                path: format!("{path}.role"),
                role: other.to_owned(),
                expected: MESSAGE_ROLES,
            });
        }
    };
    let mut message = Message::new(role, "");
    message.content = Some(parse_content(object, "content", role, path)?);
    message.extra = extra_fields(object, MESSAGE_FIELDS);
    Ok(message)
}

/// The required content field `field` of an item: a string, or parts whose text is `role`'s.
fn parse_content(
    object: &Map<String, Value>,
    field: &str,
    role: Role,
    path: &str,
) -> Result<Content, FormatError> {
    let at = format!("{path}.{field}");
    match object.get(field) {
        Some(Value::String(text)) => Ok(Content::Text(text.as_str().into())),
        Some(Value::Array(parts)) => Ok(Content::Parts(
            parts
                .iter()
                .enumerate()
                .map(|(index, part)| parse_part(part, role, &format!("{at}[{index}]")))
                .collect::<Result<_, _>>()?,
        )),
        Some(other) => Err(wrong_type(at, "a string or an array of parts", other)),
        None => Err(FormatError::MissingField { path: at }),
    }
}

/// The part type a role's text is written with.
fn text_type(role: Role) -> &'static str {
    if role == Role::Assistant {
        "output_text"
    } else {
        "input_text"
    }
}

fn parse_part(value: &Value, role: Role, path: &str) -> Result<Part, FormatError> {
    let object = expect_object(value, path)?;
    let kind = required_str(object, "type", path)?;
    match kind {
        "input_text" | "output_text" => {
            let text = required_str(object, "text", path)?.to_owned();
            let mut extra = extra_fields(object, &["type", "text"]);
            if kind != text_type(role) {
                // Written back as read, not as the role's default.
                extra.insert("type".into(), Value::String(kind.to_owned()));
            }
            Ok(Part::Text { text, extra })
        }
        "input_image"
            if object
                .keys()
                .all(|key| matches!(key.as_str(), "type" | "image_url" | "detail"))
                && object.get("image_url").is_some_and(Value::is_string) =>
        {
            let url = required_str(object, "image_url", path)?.to_owned();
            let detail = match object.get("detail") {
                None => None,
                Some(Value::String(detail)) => Some(detail.clone()),
                Some(other) => return Err(wrong_type(format!("{path}.detail"), "a string", other)),
            };
            Ok(Part::Image {
                url,
                detail,
                extra: Map::new(),
            })
        }
        _ => Ok(Part::Other {
            value: value.clone(),
        }),
    }
}

fn parse_call(object: &Map<String, Value>, path: &str) -> Result<ToolCall, FormatError> {
    let mut call = ToolCall::new(
        required_str(object, "call_id", path)?,
        required_str(object, "name", path)?,
        required_str(object, "arguments", path)?,
    );
    call.extra = extra_fields(object, CALL_FIELDS);
    Ok(call)
}

fn parse_output(object: &Map<String, Value>, path: &str) -> Result<Message, FormatError> {
    let call_id = required_str(object, "call_id", path)?;
    let mut message = Message::tool_result(call_id, "");
    message.content = Some(parse_content(object, "output", Role::User, path)?);
    message.extra = extra_fields(object, OUTPUT_FIELDS);
    Ok(message)
}

fn parse_reasoning(object: &Map<String, Value>, path: &str) -> Result<Part, FormatError> {
    let mut texts = Vec::new();
    if let Some(summary) = object.get("summary") {
        for (index, entry) in expect_array(summary, &format!("{path}.summary"))?
            .iter()
            .enumerate()
        {
            let at = format!("{path}.summary[{index}]");
            texts.push(required_str(expect_object(entry, &at)?, "text", &at)?.to_owned());
        }
    }
    let redacted = match object.get("encrypted_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(content)) => Some(content.clone()),
        Some(other) => {
            return Err(wrong_type(
                format!("{path}.encrypted_content"),
                "a string",
                other,
            ));
        }
    };
    let text = texts.join("\n\n");
    let mut extra = extra_fields(object, REASONING_FIELDS);
    // The summary the text is written back as is not kept twice.
    if extra.get("summary") == Some(&summary_value(&text)) {
        extra.remove("summary");
    }
    Ok(Part::Reasoning {
        text,
        signature: None,
        redacted,
        extra,
    })
}

/// Writes messages as Responses items (see the module's table): an assistant turn becomes
/// its reasoning items, its message item (when it has text or other content) and its
/// function calls, in that order.
pub fn to_items(messages: &[Message]) -> Vec<Value> {
    let mut items = Vec::new();
    for message in messages {
        write_message(message, &mut items);
    }
    items
}

/// A `compaction` item: a user message whose text is the item's content (Contexture writes
/// its summary there as readable text), the item's other fields kept to write it back.
fn parse_compaction(object: &Map<String, Value>, path: &str) -> Result<Message, FormatError> {
    let text = required_str(object, "encrypted_content", path)?;
    let mut message = Message::user(text);
    message.extra = extra_fields(object, &["encrypted_content"]);
    Ok(message)
}

fn write_message(message: &Message, items: &mut Vec<Value>) {
    if message.extra.get("type").and_then(Value::as_str) == Some("compaction") {
        let mut item = message.extra.clone();
        item.insert("encrypted_content".into(), json!(message.text()));
        items.push(Value::Object(item));
        return;
    }
    match message.role {
        Role::Tool => {
            let mut item = Map::new();
            item.insert("type".into(), json!("function_call_output"));
            item.insert(
                "call_id".into(),
                json!(message.tool_call_id.as_deref().unwrap_or_default()),
            );
            item.insert(
                "output".into(),
                content_value(message.content.as_ref(), Role::User).unwrap_or(json!("")),
            );
            append(&mut item, &message.extra);
            items.push(Value::Object(item));
        }
        role => {
            let (reasoning, content) = split_reasoning(message.content.as_ref());
            let has_reasoning = !reasoning.is_empty();
            items.extend(reasoning.into_iter().map(reasoning_item));
            // A turn of reasoning alone is its reasoning items: no empty message is made up.
            if content.is_some() || (message.tool_calls.is_empty() && !has_reasoning) {
                let mut item = Map::new();
                item.insert("type".into(), json!("message"));
                item.insert("role".into(), json!(role_name(role)));
                item.insert(
                    "content".into(),
                    content_value(content.as_ref(), role).unwrap_or(json!("")),
                );
                append(&mut item, &message.extra);
                items.push(Value::Object(item));
            }
            for call in &message.tool_calls {
                let mut item = Map::new();
                item.insert("type".into(), json!("function_call"));
                item.insert("call_id".into(), json!(&*call.id));
                item.insert("name".into(), json!(&*call.name));
                item.insert("arguments".into(), json!(&*call.arguments));
                append(&mut item, &call.extra);
                items.push(Value::Object(item));
            }
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::Developer => "developer",
        Role::User | Role::Tool => "user",
        Role::Assistant => "assistant",
    }
}

/// The reasoning parts of a content, and the rest of it (`None` when nothing is left).
fn split_reasoning(content: Option<&Content>) -> (Vec<&Part>, Option<Content>) {
    match content {
        Some(Content::Parts(parts)) => {
            let (reasoning, rest): (Vec<&Part>, Vec<&Part>) = parts
                .iter()
                .partition(|part| matches!(part, Part::Reasoning { .. }));
            let rest = (!rest.is_empty() || reasoning.is_empty())
                .then(|| Content::Parts(rest.into_iter().cloned().collect()));
            (reasoning, rest)
        }
        Some(Content::Text(text)) if text.is_empty() => (Vec::new(), None),
        other => (Vec::new(), other.cloned()),
    }
}

fn content_value(content: Option<&Content>, role: Role) -> Option<Value> {
    Some(match content? {
        Content::Text(text) => json!(&**text),
        Content::Parts(parts) => {
            Value::Array(parts.iter().map(|part| part_value(part, role)).collect())
        }
    })
}

fn part_value(part: &Part, role: Role) -> Value {
    match part {
        Part::Text { text, extra } => {
            let mut object = Map::new();
            let kind = extra
                .get("type")
                .cloned()
                .unwrap_or_else(|| json!(text_type(role)));
            object.insert("type".into(), kind);
            object.insert("text".into(), json!(text));
            append(&mut object, extra);
            Value::Object(object)
        }
        Part::Image { url, detail, extra } => {
            let mut object = Map::new();
            object.insert("type".into(), json!("input_image"));
            object.insert("image_url".into(), json!(url));
            if let Some(detail) = detail {
                object.insert("detail".into(), json!(detail));
            }
            append(&mut object, extra);
            Value::Object(object)
        }
        // Reasoning inside a message's content (from another format) reads as text.
        Part::Reasoning { text, .. } => json!({"type": text_type(role), "text": text}),
        Part::Other { value } => value.clone(),
    }
}

fn reasoning_item(part: &Part) -> Value {
    let Part::Reasoning {
        text,
        redacted,
        extra,
        ..
    } = part
    else {
        return Value::Null;
    };
    let mut item = Map::new();
    item.insert("type".into(), json!("reasoning"));
    if !extra.contains_key("summary") {
        item.insert("summary".into(), summary_value(text));
    }
    append(&mut item, extra);
    if let Some(content) = redacted {
        item.insert("encrypted_content".into(), json!(content));
    }
    Value::Object(item)
}

/// A reasoning item's `summary` for `text`: one `summary_text` entry, none for no text.
fn summary_value(text: &str) -> Value {
    if text.is_empty() {
        json!([])
    } else {
        json!([{"type": "summary_text", "text": text}])
    }
}

/// Adds the `extra` entries the item does not have yet.
fn append(object: &mut Map<String, Value>, extra: &Map<String, Value>) {
    for (key, value) in extra {
        if !object.contains_key(key) {
            object.insert(key.clone(), value.clone());
        }
    }
}
