//! OpenAI chat-completion answers: an assistant message as the `chat.completion` object an
//! OpenAI-compatible upstream returns, or as the stream of `chat.completion.chunk` events it
//! sends to a streaming client. What a door answers with when the answer comes from the
//! thread (a keyed turn sent again) rather than from the upstream.

use serde_json::{Value, json};

use super::openai;
use crate::message::Message;
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

/// The answer as a `chat.completion` object.
pub fn completion(answer: &CompletionAnswer<'_>) -> Value {
    let usage = answer.usage.map(|usage| {
        json!({"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
               "total_tokens": usage.input_tokens + usage.output_tokens})
    });
    json!({
        "id": answer.id, "object": "chat.completion", "created": 0, "model": answer.model,
        "choices": [{"index": 0, "message": openai::to_value(answer.message),
                     "finish_reason": answer.finish_reason}],
        "usage": usage,
    })
}

/// The answer as the text of a server-sent event stream: one chunk holding the whole
/// message (its tool calls numbered), one with the finish reason, then `[DONE]`.
pub fn completion_stream(answer: &CompletionAnswer<'_>) -> String {
    let mut delta = openai::to_value(answer.message);
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
}
