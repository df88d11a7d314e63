//! Anthropic Messages answers: an assistant message as the `message` object Anthropic's API
//! returns ([`message_object`]), or as its stream of named server-sent events written while
//! the answer arrives ([`MessageStream`]). What a door speaking Anthropic's API answers with
//! when the answer came from an upstream of another format, or from the thread.
//!
//! Content blocks are the request format's ([`super::anthropic`]): text, `thinking` with
//! its signature, `redacted_thinking`, `tool_use` with its input parsed from the call's
//! arguments.

use serde_json::{Value, json};

use super::AnswerPieces;
use super::anthropic;
use crate::message::Message;
use crate::thread::Usage;

/// An answer to write.
#[derive(Debug, Clone, Copy)]
pub struct MessageAnswer<'a> {
    /// The message's id (`msg_...`).
    pub id: &'a str,
    /// The model named.
    pub model: &'a str,
    /// The assistant message.
    pub message: &'a Message,
    /// Why it ended, in Anthropic's words (see [`anthropic_stop_reason`]).
    pub stop_reason: &'a str,
    /// Its tokens, when known.
    pub usage: Option<Usage>,
}

/// A finish reason in Anthropic's words (`stop_reason`): OpenAI's `stop` is `end_turn`,
/// `length` is `max_tokens`, `tool_calls` (and the older `function_call`) is `tool_use`,
/// `content_filter` is `refusal`; a reason that is Anthropic's already is kept.
pub fn anthropic_stop_reason(finish_reason: &str) -> &str {
    match finish_reason {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        other => other,
    }
}

/// The content blocks of an assistant message, as an answer holds them (always a list).
pub fn content_blocks(message: &Message) -> Vec<Value> {
    let written = anthropic::to_request(std::slice::from_ref(message))
        .ok()
        .and_then(|body| body["messages"][0].get("content").cloned());
    match written {
        Some(Value::Array(blocks)) => blocks,
        Some(Value::String(text)) if !text.is_empty() => {
            vec![json!({"type": "text", "text": text})]
        }
        _ => Vec::new(),
    }
}

fn usage_value(usage: Option<Usage>) -> Value {
    let usage = usage.unwrap_or_default();
    json!({"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens})
}

/// The answer as a `message` object.
pub fn message_object(answer: &MessageAnswer<'_>) -> Value {
    json!({
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content_blocks(answer.message),
        "stop_reason": answer.stop_reason,
        "stop_sequence": null,
        "usage": usage_value(answer.usage),
    })
}

/// The answer as the text of an event stream, its blocks each whole (a stored answer
/// written for a streaming client).
pub fn message_stream(answer: &MessageAnswer<'_>) -> String {
    let mut stream = MessageStream::new(answer.id, answer.model);
    let mut out = stream.start(answer.usage.map(|usage| usage.input_tokens));
    for block in content_blocks(answer.message) {
        out.push_str(&stream.whole_block(block));
    }
    out.push_str(&stream.finish(answer.stop_reason, answer.usage));
    out
}

/// The block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Text,
    Thinking,
    /// A tool call's, by the call's index.
    ToolUse(usize),
}

/// A stream of Anthropic's named events written while an answer arrives piece by piece:
/// `message_start` and a `ping`, then for each content block `content_block_start`, its
/// `content_block_delta`s and `content_block_stop`, then `message_delta` with the stop
/// reason and `message_stop`.
#[derive(Debug, Clone)]
pub struct MessageStream {
    id: String,
    model: String,
    /// The index the next block gets.
    next_index: usize,
    open: Option<OpenBlock>,
}

impl MessageStream {
    /// A stream of the message `id` answered by `model`.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> MessageStream {
        MessageStream {
            id: id.into(),
            model: model.into(),
            next_index: 0,
            open: None,
        }
    }

    fn event(name: &str, data: &Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    /// The first events: the message without content (its input tokens when known), then a
    /// `ping`, as Anthropic's API starts a stream.
    pub fn start(&mut self, input_tokens: Option<u64>) -> String {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens.unwrap_or(0), "output_tokens": 0},
        });
        let mut out = Self::event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        out.push_str(&Self::event("ping", &json!({"type": "ping"})));
        out
    }

    /// Closes the open block, if any.
    fn close(&mut self) -> String {
        match self.open.take() {
            Some(_) => Self::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.next_index - 1}),
            ),
            None => String::new(),
        }
    }

    /// Opens `block` (closing the open one) unless it is the open one.
    fn open(&mut self, block: OpenBlock, start: Value) -> String {
        if self.open == Some(block) {
            return String::new();
        }
        let mut out = self.close();
        out.push_str(&Self::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.next_index,
                    "content_block": start}),
        ));
        self.next_index += 1;
        self.open = Some(block);
        out
    }

    fn delta(&self, delta: Value) -> String {
        Self::event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next_index - 1,
                    "delta": delta}),
        )
    }

    /// A whole content block (of a stored answer): started, given in one delta, stopped.
    pub fn whole_block(&mut self, block: Value) -> String {
        let mut out = self.close();
        let index = self.next_index;
        self.next_index += 1;
        let (start, delta) = match block.get("type").and_then(Value::as_str) {
            Some("text") => (
                json!({"type": "text", "text": ""}),
                Some(json!({"type": "text_delta", "text": block["text"]})),
            ),
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"],
                       "input": {}}),
                Some(json!({"type": "input_json_delta",
                            "partial_json": block["input"].to_string()})),
            ),
            _ => (block, None),
        };
        out.push_str(&Self::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        if let Some(delta) = delta {
            out.push_str(&Self::event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        out.push_str(&Self::event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
        out
    }

    /// The last events: the open block's stop, `message_delta` with the stop reason (in
    /// Anthropic's words) and the output tokens, `message_stop`.
    pub fn finish(&mut self, stop_reason: &str, usage: Option<Usage>) -> String {
        let mut out = self.close();
        out.push_str(&Self::event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": usage.map_or(0, |usage| usage.output_tokens)}}),
        ));
        out.push_str(&Self::event(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
        out
    }

    /// An error that ended the answer, as Anthropic streams one, after which the stream
    /// ends.
    pub fn fail(&mut self, message: &str) -> String {
        Self::event(
            "error",
            &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        )
    }
}

impl AnswerPieces for MessageStream {
    /// A piece of the answer's text.
    fn text(&mut self, delta: &str) -> String {
        let mut out = self.open(OpenBlock::Text, json!({"type": "text", "text": ""}));
        out.push_str(&self.delta(json!({"type": "text_delta", "text": delta})));
        out
    }

    /// A piece of its reasoning (a `thinking` block).
    fn reasoning(&mut self, delta: &str) -> String {
        let mut out = self.open(
            OpenBlock::Thinking,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
        );
        out.push_str(&self.delta(json!({"type": "thinking_delta", "thinking": delta})));
        out
    }

    /// A piece of the tool call at `index`: the first opens its `tool_use` block (with its
    /// id and name), each carries the new piece of its JSON input.
    fn tool_call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> String {
        let mut out = self.open(
            OpenBlock::ToolUse(index),
            json!({"type": "tool_use", "id": id.unwrap_or_default(),
                   "name": name.unwrap_or_default(), "input": {}}),
        );
        if !arguments.is_empty() {
            out.push_str(&self.delta(json!({"type": "input_json_delta",
                                              "partial_json": arguments})));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Content, Part, ToolCall};

    fn answer_message() -> Message {
        let mut message = Message::assistant("");
        message.content = Some(Content::Parts(vec![
            Part::Reasoning {
                text: "The user wants the weather.".into(),
                signature: Some("sig-1".into()),
                redacted: None,
                extra: Default::default(),
            },
            Part::Text {
                text: "Looking it up.".into(),
                extra: Default::default(),
            },
        ]));
        message.tool_calls = vec![ToolCall::new("toolu_1", "weather", r#"{"city":"Lisbon"}"#)];
        message
    }

    #[test]
    fn an_answer_is_written_as_a_message_and_as_its_events() {
        let message = answer_message();
        let answer = MessageAnswer {
            id: "msg_1",
            model: "claude-sonnet-4-5",
            message: &message,
            stop_reason: "tool_use",
            usage: Some(Usage::new(40, 12)),
        };
        insta::assert_snapshot!(
            "message_object",
            serde_json::to_string_pretty(&message_object(&answer)).unwrap()
        );
        insta::assert_snapshot!("message_stream", message_stream(&answer));
    }

    #[test]
    fn pieces_open_and_close_their_blocks_in_order() {
        let mut stream = MessageStream::new("msg_2", "local-llama");
        let mut out = stream.start(None);
        out.push_str(&stream.reasoning("Hmm."));
        out.push_str(&stream.text("Sun"));
        out.push_str(&stream.text("ny."));
        out.push_str(&stream.tool_call(0, Some("call_1"), Some("weather"), ""));
        out.push_str(&stream.tool_call(0, None, None, r#"{"city":"#));
        out.push_str(&stream.tool_call(1, Some("call_2"), Some("time"), "{}"));
        out.push_str(&stream.finish("tool_use", Some(Usage::new(5, 7))));
        insta::assert_snapshot!("message_stream_in_pieces", out);
        assert!(stream.fail("gone").starts_with("event: error\n"));
    }

    #[test]
    fn finish_reasons_read_in_anthropics_words() {
        let table = [
            ("stop", "end_turn"),
            ("length", "max_tokens"),
            ("tool_calls", "tool_use"),
            ("function_call", "tool_use"),
            ("content_filter", "refusal"),
            ("end_turn", "end_turn"),
            ("pause_turn", "pause_turn"),
        ];
        for (finish_reason, stop_reason) in table {
            assert_eq!(anthropic_stop_reason(finish_reason), stop_reason);
            assert_eq!(
                anthropic::openai_finish_reason(stop_reason),
                match finish_reason {
                    "function_call" => "tool_calls",
                    "end_turn" => "stop",
                    other => other,
                },
                "{stop_reason}"
            );
        }
    }
}
