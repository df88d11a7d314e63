//! A scripted completion in the wire formats: OpenAI's chat completion and its
//! `chat.completion.chunk` events, Anthropic's message and its named events.

use axum::body::Bytes;
use serde_json::{Map, Value, json};

/// The `created` time of every OpenAI answer, fixed so that answers are reproducible.
const CREATED: u64 = 1_700_000_000;

/// What a completion says; the wire format is chosen when it is sent.
#[derive(Debug, Clone)]
pub(crate) struct Completion {
    /// The text, in the pieces a stream sends; `None` for no text at all (a tool call's
    /// `content: null`).
    pub pieces: Option<Vec<String>>,
    /// (id, name, arguments) of each tool call.
    pub tool_calls: Vec<(String, String, Value)>,
    pub usage: Option<Usage>,
    pub model: String,
}

/// Tokens in and out, as the answer reports them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub input: u64,
    pub output: u64,
}

impl Completion {
    fn text(&self) -> Option<String> {
        self.pieces.as_ref().map(|pieces| pieces.concat())
    }

    fn calls_tools(&self) -> bool {
        !self.tool_calls.is_empty()
    }

    /// A whole `chat.completion`, the `number`-th call's.
    pub fn openai(&self, number: usize) -> Value {
        let mut message = json!({"role": "assistant", "content": self.text()});
        if self.calls_tools() {
            message["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments.to_string()}})
                })
                .collect();
        }
        let mut answer = json!({
            "id": format!("chatcmpl-{number}"), "object": "chat.completion", "created": CREATED,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.openai_finish()}]
        });
        if let Some(usage) = self.usage {
            answer["usage"] = openai_usage(usage);
        }
        answer
    }

    /// The `chat.completion.chunk` events of a stream: one per text piece, one per tool
    /// call, the finish (with usage, if any), then `[DONE]`.
    pub fn openai_events(&self, number: usize) -> Vec<Bytes> {
        let mut deltas: Vec<Value> = Vec::new();
        for piece in self.pieces.iter().flatten() {
            deltas.push(json!({"content": piece}));
        }
        for (index, (id, name, arguments)) in self.tool_calls.iter().enumerate() {
            deltas.push(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}}]}),
            );
        }
        if deltas.is_empty() {
            deltas.push(json!({}));
        }
        // As OpenAI does, the first delta names the role.
        let mut first = Map::from_iter([("role".to_owned(), json!("assistant"))]);
        first.extend(deltas[0].as_object().cloned().unwrap_or_default());
        deltas[0] = Value::Object(first);

        let chunk = |delta: Value, finish: Value| {
            json!({
                "id": format!("chatcmpl-{number}"), "object": "chat.completion.chunk",
                "created": CREATED, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
            })
        };
        let mut events: Vec<Value> = deltas
            .into_iter()
            .map(|delta| chunk(delta, Value::Null))
            .collect();
        let mut finish = chunk(json!({}), json!(self.openai_finish()));
        if let Some(usage) = self.usage {
            finish["usage"] = openai_usage(usage);
        }
        events.push(finish);
        let mut chunks: Vec<Bytes> = events
            .iter()
            .map(|event| Bytes::from(format!("data: {event}\n\n")))
            .collect();
        chunks.push(Bytes::from_static(b"data: [DONE]\n\n"));
        chunks
    }

    fn openai_finish(&self) -> &'static str {
        if self.calls_tools() {
            "tool_calls"
        } else {
            "stop"
        }
    }

    /// A whole Anthropic `message`, the `number`-th call's.
    pub fn anthropic(&self, number: usize) -> Value {
        let mut content: Vec<Value> = Vec::new();
        if let Some(text) = self.text() {
            content.push(json!({"type": "text", "text": text}));
        }
        for (id, name, arguments) in &self.tool_calls {
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": arguments}));
        }
        let mut answer = json!({
            "id": format!("msg_{number}"), "type": "message", "role": "assistant",
            "model": self.model, "content": content,
            "stop_reason": self.anthropic_stop(), "stop_sequence": null
        });
        if let Some(usage) = self.usage {
            answer["usage"] = json!({"input_tokens": usage.input, "output_tokens": usage.output});
        }
        answer
    }

    /// Anthropic's named events: `message_start`, a content block per text and per tool
    /// call, `message_delta` with the stop reason (and output tokens), `message_stop`.
    pub fn anthropic_events(&self, number: usize) -> Vec<Bytes> {
        let mut message = json!({
            "id": format!("msg_{number}"), "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null
        });
        if let Some(usage) = self.usage {
            message["usage"] = json!({"input_tokens": usage.input, "output_tokens": 1});
        }
        let mut events = vec![json!({"type": "message_start", "message": message})];
        let mut index = 0;
        if let Some(pieces) = &self.pieces {
            events.push(json!({"type": "content_block_start", "index": index,
                               "content_block": {"type": "text", "text": ""}}));
            for piece in pieces {
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "text_delta", "text": piece}}));
            }
            events.push(json!({"type": "content_block_stop", "index": index}));
            index += 1;
        }
        for (id, name, arguments) in &self.tool_calls {
            events.push(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}));
            events.push(json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": arguments.to_string()}}));
            events.push(json!({"type": "content_block_stop", "index": index}));
            index += 1;
        }
        let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": self.anthropic_stop(), "stop_sequence": null}});
        if let Some(usage) = self.usage {
            delta["usage"] = json!({"output_tokens": usage.output});
        }
        events.push(delta);
        events.push(json!({"type": "message_stop"}));
        events
            .iter()
            .map(|event| {
                Bytes::from(format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap_or_default()
                ))
            })
            .collect()
    }

    fn anthropic_stop(&self) -> &'static str {
        if self.calls_tools() {
            "tool_use"
        } else {
            "end_turn"
        }
    }
}

fn openai_usage(usage: Usage) -> Value {
    json!({"prompt_tokens": usage.input, "completion_tokens": usage.output,
           "total_tokens": usage.input + usage.output})
}
