//! OpenAI chat-completion answers: an assistant message as the `chat.completion` object an
//! OpenAI-compatible upstream returns, or as the stream of `chat.completion.chunk` events it
//! sends to a streaming client. What a door answers with when the answer comes from the
//! thread (a keyed turn sent again) rather than from the upstream.

use serde_json::{Value, json};

use super::AnswerPieces;
use super::openai;
use crate::message::{Content, Message, Part};
use crate::thread::Usage;

/// An answer to render.
#[derive(Debug, Clone, Copy)]
pub struct CompletionAnswer<'a> {
    /// The completion's id.
    pub id: &'a str,
    /// The model named.
    pub model: &'a str,
    /// The assistant message.
    pub message: &'a Message,
    /// Why it ended (`stop`, `tool_calls`, `length`, ...).
    pub finish_reason: &'a str,
    /// Its tokens, when known.
    pub usage: Option<Usage>,
}

/// Why an answer ended, in OpenAI's words: the reason reported (an Anthropic upstream's read
/// as OpenAI's, see [`super::anthropic::openai_finish_reason`]), else `tool_calls` or `stop`
/// by what the message holds.
pub fn finish_reason<'a>(reported: Option<&'a str>, message: &Message) -> &'a str {
    match reported {
        Some(reason) => super::anthropic::openai_finish_reason(reason),
        None if message.tool_calls.is_empty() => "stop",
        None => "tool_calls",
    }
}

/// An assistant message as a completion's `message` (or a stream's delta), as an
/// OpenAI-compatible server answers: text parts as one string `content` (`null` for a turn
/// of tool calls only), reasoning as `reasoning_content`, tool calls as they are. A message
/// holding other parts (an image, a part of another API) keeps its parts.
fn answer_value(message: &Message) -> Value {
    let mut value = openai::to_value(message);
    let Some(Content::Parts(parts)) = &message.content else {
        return value;
    };
    let (mut text, mut reasoning) = (String::new(), String::new());
    for part in parts {
        match part {
            Part::Text { text: piece, .. } => text.push_str(piece),
            Part::Reasoning { text: piece, .. } => reasoning.push_str(piece),
            _ => return value,
        }
    }
    value["content"] = if text.is_empty() && !message.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    if !reasoning.is_empty() {
        value["reasoning_content"] = Value::String(reasoning);
    }
    value
}

/// The answer as a `chat.completion` object.
pub fn completion(answer: &CompletionAnswer<'_>) -> Value {
    let usage = answer.usage.map(usage_value);
    json!({
        "id": answer.id, "object": "chat.completion", "created": 0, "model": answer.model,
        "choices": [{"index": 0, "message": answer_value(answer.message),
                     "finish_reason": answer.finish_reason}],
        "usage": usage,
    })
}

/// The answer as the text of a server-sent event stream: one chunk holding the whole
/// message (its tool calls numbered), one with the finish reason, then `[DONE]`.
pub fn completion_stream(answer: &CompletionAnswer<'_>) -> String {
    let mut delta = answer_value(answer.message);
    if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (index, call) in calls.iter_mut().enumerate() {
            call["index"] = json!(index);
        }
    }
    let chunk = |delta: Value, finish: Value| {
        json!({"id": answer.id, "object": "chat.completion.chunk", "created": 0,
               "model": answer.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        chunk(delta, Value::Null),
        chunk(json!({}), json!(answer.finish_reason))
    )
}

/// A `chat.completion.chunk` stream written while an answer arrives piece by piece (an
/// answer of an upstream that speaks another format, translated as it comes): the role
/// first, then each piece of text, reasoning or tool call as a chunk, then the finish
/// reason, the usage when the client asked for it, and `[DONE]`.
#[derive(Debug, Clone)]
pub struct CompletionStream {
    id: String,
    model: String,
    /// The tool calls whose first chunk (id, type, name) was written.
    calls_started: Vec<usize>,
}

impl CompletionStream {
    /// A stream of the completion `id` answered by `model`.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> CompletionStream {
        CompletionStream {
            id: id.into(),
            model: model.into(),
            calls_started: Vec::new(),
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut chunk = json!({"id": self.id, "object": "chat.completion.chunk", "created": 0,
                               "model": self.model, "choices": choices});
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        format!("data: {chunk}\n\n")
    }

    fn delta(&self, delta: Value) -> String {
        self.chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            None,
        )
    }

    /// The first chunk: the assistant's role.
    pub fn start(&mut self) -> String {
        self.delta(json!({"role": "assistant", "content": ""}))
    }

    /// The last chunks: the finish reason, then the usage when `include_usage` (the client
    /// asked with `stream_options.include_usage`) and it is known, then `[DONE]`.
    pub fn finish(
        &mut self,
        finish_reason: &str,
        usage: Option<Usage>,
        include_usage: bool,
    ) -> String {
        let mut out = self.chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": finish_reason}]),
            None,
        );
        if let Some(usage) = usage.filter(|_| include_usage) {
            out.push_str(&self.chunk(json!([]), Some(usage_value(usage))));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    /// An error that ended the answer, as OpenAI streams one (an `error` object), after
    /// which the stream ends.
    pub fn fail(&mut self, message: &str) -> String {
        let error = json!({"error": {"message": message, "type": "upstream_error",
                                     "code": "upstream_error"}});
        format!("data: {error}\n\n")
    }
}

/// Usage as a completion reports it.
fn usage_value(usage: Usage) -> Value {
    json!({"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
           "total_tokens": usage.input_tokens + usage.output_tokens})
}

impl AnswerPieces for CompletionStream {
    /// A piece of the answer's text.
    fn text(&mut self, delta: &str) -> String {
        self.delta(json!({"content": delta}))
    }

    /// A piece of its reasoning (as `reasoning_content`, the field OpenAI-compatible
    /// servers stream reasoning in).
    fn reasoning(&mut self, delta: &str) -> String {
        self.delta(json!({"reasoning_content": delta}))
    }

    /// A piece of the tool call at `index`: its first chunk names its id and function,
    /// every chunk carries the new piece of its arguments.
    fn tool_call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> String {
        let call = if self.calls_started.contains(&index) {
            json!({"index": index, "function": {"arguments": arguments}})
        } else {
            self.calls_started.push(index);
            json!({"index": index, "id": id, "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        };
        self.delta(json!({"tool_calls": [call]}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    fn answer_with_a_call() -> Message {
        let mut message = Message::assistant("Looking it up.");
        message.tool_calls = vec![ToolCall::new("call_1", "lookup", r#"{"q":"rust"}"#)];
        message
    }

    #[test]
    fn an_answer_renders_as_a_completion_and_as_a_stream() {
        let message = answer_with_a_call();
        let answer = CompletionAnswer {
            id: "chatcmpl-1",
            model: "gpt-4o-mini",
            message: &message,
            finish_reason: "tool_calls",
            usage: Some(Usage::new(21, 5)),
        };
        insta::assert_snapshot!(
            "completion",
            serde_json::to_string_pretty(&completion(&answer)).unwrap()
        );
        insta::assert_snapshot!("completion_stream", completion_stream(&answer));
    }

    #[test]
    fn an_answer_of_text_and_reasoning_parts_reads_as_a_completion_would() {
        let mut message = Message::assistant("");
        message.content = Some(Content::Parts(vec![
            Part::Reasoning {
                text: "Think.".into(),
                signature: Some("sig".into()),
                redacted: None,
                extra: Default::default(),
            },
            Part::Text {
                text: "Sunny".into(),
                extra: Default::default(),
            },
            Part::Text {
                text: " today.".into(),
                extra: Default::default(),
            },
        ]));
        let value = answer_value(&message);
        assert_eq!(value["content"], "Sunny today.");
        assert_eq!(value["reasoning_content"], "Think.");
        let mut calls_only = answer_with_a_call();
        calls_only.content = Some(Content::Parts(Vec::new()));
        assert_eq!(answer_value(&calls_only)["content"], Value::Null);
        let mut with_image = Message::user("");
        with_image.content = Some(Content::Parts(vec![Part::Image {
            url: "https://example.com/a.png".into(),
            detail: None,
            extra: Default::default(),
        }]));
        assert!(answer_value(&with_image)["content"].is_array());
    }

    #[test]
    fn an_answer_arriving_in_pieces_streams_as_chunks() {
        let mut stream = CompletionStream::new("chatcmpl-2", "claude-sonnet-4-5");
        let mut out = stream.start();
        out.push_str(&stream.reasoning("Think."));
        out.push_str(&stream.text("Looking "));
        out.push_str(&stream.text("it up."));
        out.push_str(&stream.tool_call(0, Some("toolu_1"), Some("lookup"), ""));
        out.push_str(&stream.tool_call(0, None, None, r#"{"q":"#));
        out.push_str(&stream.tool_call(0, None, None, r#""rust"}"#));
        out.push_str(&stream.finish("tool_calls", Some(Usage::new(21, 5)), true));
        insta::assert_snapshot!("completion_stream_in_pieces", out);
        let without_usage = stream.finish("stop", Some(Usage::new(1, 1)), false);
        assert!(!without_usage.contains("usage"), "{without_usage}");
        assert!(stream.fail("gone").starts_with(r#"data: {"error":"#));
    }
}
