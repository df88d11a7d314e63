//! OpenAI Responses answers: an assistant turn written as a `response` object's output items
//! (each with its id and status) and the object around them, as a Responses door sends it.

use serde_json::{Map, Value, json};

use super::responses;
use crate::message::Message;
use crate::thread::Usage;

/// How a response ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseStatus {
    /// Its answer is whole.
    Completed,
    /// Cut short (`reason`: `max_output_tokens`, `content_filter`).
    Incomplete {
        /// Why.
        reason: String,
    },
    /// No answer (`code`, `message` as OpenAI's error object has them).
    Failed {
        /// The error's code.
        code: String,
        /// What went wrong.
        message: String,
    },
}

impl ResponseStatus {
    /// The status a chat completion's finish reason gives: `length` is incomplete
    /// (`max_output_tokens`), `content_filter` incomplete too, anything else completed.
    pub fn from_finish_reason(reason: Option<&str>) -> ResponseStatus {
        // An Anthropic upstream's stop reasons read as OpenAI's.
        match reason.map(super::anthropic::openai_finish_reason) {
            Some("length") => ResponseStatus::Incomplete {
                reason: "max_output_tokens".to_owned(),
            },
            Some("content_filter") => ResponseStatus::Incomplete {
                reason: "content_filter".to_owned(),
            },
            _ => ResponseStatus::Completed,
        }
    }

    /// The status's name in the object.
    pub fn name(&self) -> &'static str {
        match self {
            ResponseStatus::Completed => "completed",
            ResponseStatus::Incomplete { .. } => "incomplete",
            ResponseStatus::Failed { .. } => "failed",
        }
    }
}

/// What a response object says besides its output.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseHeader<'a> {
    /// Its id (`resp_...`).
    pub id: &'a str,
    /// When it was made, in seconds since the epoch.
    pub created_at: u64,
    /// The model that answered.
    pub model: &'a str,
    /// The response it continued.
    pub previous_response_id: Option<&'a str>,
    /// The conversation it joined.
    pub conversation: Option<&'a str>,
    /// The instructions it was given.
    pub instructions: Option<&'a str>,
    /// The request's fields echoed as they came (`tools`, `tool_choice`,
    /// `parallel_tool_calls`, `temperature`, `top_p`, `max_output_tokens`, `metadata`,
    /// `store`, `truncation`, `text`), absent ones given OpenAI's defaults.
    pub request: &'a Map<String, Value>,
}

/// An assistant turn as output items: its reasoning, its message (text as `output_text`
/// parts) and its function calls, each with an id made from `id_seed` and its place
/// (`msg_…`, `fc_…`, `rs_…`, unless it has one) and status `completed`.
pub fn output_items(message: &Message, id_seed: &str) -> Vec<Value> {
    responses::to_items(std::slice::from_ref(message))
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let Value::Object(mut item) = item else {
                return item;
            };
            let kind = item
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let prefix = match kind.as_str() {
                "reasoning" => "rs",
                "function_call" => "fc",
                _ => "msg",
            };
            let mut written = Map::new();
            written.insert(
                "id".into(),
                item.remove("id")
                    .unwrap_or_else(|| json!(format!("{prefix}_{id_seed}_{index}"))),
            );
            written.insert("type".into(), json!(kind));
            if kind != "reasoning" {
                written.insert(
                    "status".into(),
                    item.remove("status").unwrap_or_else(|| json!("completed")),
                );
            }
            if kind == "message" {
                item.insert("content".into(), output_content(item.get("content")));
            }
            for (key, value) in item {
                written.entry(key).or_insert(value);
            }
            Value::Object(written)
        })
        .collect()
}

/// A message item's content as output parts: a string becomes one `output_text` part, and
/// every `output_text` part has its `annotations`.
fn output_content(content: Option<&Value>) -> Value {
    let parts = match content {
        Some(Value::String(text)) => vec![json!({"type": "output_text", "text": text})],
        Some(Value::Array(parts)) => parts.clone(),
        _ => Vec::new(),
    };
    Value::Array(
        parts
            .into_iter()
            .map(|mut part| {
                if part.get("type").and_then(Value::as_str) == Some("output_text")
                    && let Value::Object(object) = &mut part
                {
                    object.entry("annotations").or_insert_with(|| json!([]));
                }
                part
            })
            .collect(),
    )
}

/// An item as a list of stored items shows it (`input_items`, a conversation's items):
/// with its `id` (`id` when it has none), `status: completed`, and a message's text as a
/// list of parts (`input_text`, or `output_text` for the assistant) as OpenAI lists them.
pub fn listed_item(mut item: Value, id: &str) -> Value {
    let Value::Object(fields) = &mut item else {
        return item;
    };
    fields
        .entry("id")
        .or_insert_with(|| Value::String(id.to_owned()));
    let is_message = fields.get("type").and_then(Value::as_str) == Some("message");
    if is_message || fields.get("type").and_then(Value::as_str) == Some("function_call") {
        fields.entry("status").or_insert_with(|| json!("completed"));
    }
    if is_message && let Some(Value::String(text)) = fields.get("content") {
        let kind = match fields.get("role").and_then(Value::as_str) {
            Some("assistant") => "output_text",
            _ => "input_text",
        };
        let mut part = json!({"type": kind, "text": text});
        if kind == "output_text" {
            part["annotations"] = json!([]);
        }
        fields.insert("content".into(), json!([part]));
    }
    item
}

/// The `compaction` item a response's output begins with when its turn compacted the
/// history: `summary`, the messages that stand for the history compacted, as readable text
/// in the item's `encrypted_content` (OpenAI's own is encrypted; this one reads as it is and
/// goes to any model), made by `created_by`.
pub fn compaction_item(summary: &[Message], id_seed: &str) -> Value {
    let text = summary
        .iter()
        .map(Message::text)
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    json!({"id": format!("cmp_{id_seed}"), "type": "compaction",
           "encrypted_content": text, "created_by": "contexture"})
}

/// The `response` object: `header`, the `output` items, `status` and `usage`.
pub fn response_object(
    header: &ResponseHeader<'_>,
    status: &ResponseStatus,
    output: Vec<Value>,
    usage: Option<Usage>,
) -> Value {
    let request = header.request;
    let echo = |field: &str, default: Value| {
        request
            .get(field)
            .filter(|value| !value.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut object = Map::new();
    object.insert("id".into(), json!(header.id));
    object.insert("object".into(), json!("response"));
    object.insert("created_at".into(), json!(header.created_at));
    object.insert("status".into(), json!(status.name()));
    object.insert(
        "error".into(),
        match status {
            ResponseStatus::Failed { code, message } => json!({"code": code, "message": message}),
            _ => Value::Null,
        },
    );
    object.insert(
        "incomplete_details".into(),
        match status {
            ResponseStatus::Incomplete { reason } => json!({"reason": reason}),
            _ => Value::Null,
        },
    );
    object.insert("instructions".into(), json!(header.instructions));
    object.insert(
        "max_output_tokens".into(),
        echo("max_output_tokens", Value::Null),
    );
    object.insert("model".into(), json!(header.model));
    object.insert("output".into(), Value::Array(output));
    object.insert(
        "parallel_tool_calls".into(),
        echo("parallel_tool_calls", json!(true)),
    );
    object.insert(
        "previous_response_id".into(),
        json!(header.previous_response_id),
    );
    if let Some(conversation) = header.conversation {
        object.insert("conversation".into(), json!({"id": conversation}));
    }
    object.insert("store".into(), echo("store", json!(true)));
    object.insert("temperature".into(), echo("temperature", json!(1.0)));
    object.insert(
        "text".into(),
        echo("text", json!({"format": {"type": "text"}})),
    );
    object.insert("tool_choice".into(), echo("tool_choice", json!("auto")));
    object.insert("tools".into(), echo("tools", json!([])));
    object.insert("top_p".into(), echo("top_p", json!(1.0)));
    object.insert("truncation".into(), echo("truncation", json!("auto")));
    object.insert(
        "usage".into(),
        match usage {
            Some(usage) => json!({
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.total(),
            }),
            None => Value::Null,
        },
    );
    object.insert("metadata".into(), echo("metadata", json!({})));
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    #[test]
    fn an_assistant_turn_is_output_items_with_ids_and_status() {
        let mut message = Message::assistant("Checking.");
        message.tool_calls = vec![ToolCall::new("call_a", "weather", "{\"city\":\"Porto\"}")];
        assert_eq!(
            output_items(&message, "r1"),
            vec![
                json!({"id": "msg_r1_0", "type": "message", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}),
                json!({"id": "fc_r1_1", "type": "function_call", "status": "completed",
                       "call_id": "call_a", "name": "weather", "arguments": "{\"city\":\"Porto\"}"}),
            ]
        );
    }

    #[test]
    fn the_object_echoes_the_request_and_says_how_it_ended() {
        let request = json!({"tools": [{"type": "function", "name": "weather"}], "store": false,
                             "metadata": {"team": "ops"}, "temperature": null});
        let header = ResponseHeader {
            id: "resp_1",
            created_at: 1_764_000_000,
            model: "gpt-4o-mini",
            previous_response_id: Some("resp_0"),
            conversation: None,
            instructions: Some("Be brief."),
            request: request.as_object().unwrap(),
        };
        let object = response_object(
            &header,
            &ResponseStatus::from_finish_reason(Some("length")),
            output_items(&Message::assistant("Sunny"), "resp_1"),
            Some(Usage::new(20, 3)),
        );
        assert_eq!(object["object"], "response");
        assert_eq!(object["status"], "incomplete");
        assert_eq!(
            object["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(object["previous_response_id"], "resp_0");
        assert_eq!(object["tools"][0]["name"], "weather");
        assert_eq!(object["store"], false);
        assert_eq!(object["temperature"], 1.0);
        assert_eq!(object["metadata"]["team"], "ops");
        assert_eq!(object["usage"]["total_tokens"], 23);
        assert_eq!(object["output"][0]["content"][0]["text"], "Sunny");
        let failed = response_object(
            &header,
            &ResponseStatus::Failed {
                code: "server_error".into(),
                message: "upstream: 502".into(),
            },
            Vec::new(),
            None,
        );
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"]["code"], "server_error");
        assert_eq!(failed["usage"], Value::Null);
    }
}
