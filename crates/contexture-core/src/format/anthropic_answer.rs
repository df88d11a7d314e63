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
    /// What the request's context edits did (`{"applied_edits": [...]}`), when it named
    /// any.
    pub context_management: Option<&'a Value>,
    /// A content block before the message's own (a compaction's).
    pub leading_block: Option<&'a Value>,
}

impl MessageAnswer<'_> {
    /// The answer's content blocks: the leading one, then the message's.
    fn blocks(&self) -> Vec<Value> {
        let mut blocks: Vec<Value> = self.leading_block.into_iter().cloned().collect();
        blocks.extend(content_blocks(self.message));
        blocks
    }
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
    let mut object = json!({
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": answer.blocks(),
        "stop_reason": answer.stop_reason,
        "stop_sequence": null,
        "usage": usage_value(answer.usage),
    });
    if let Some(management) = answer.context_management {
        object["context_management"] = management.clone();
    }
    object
}

/// The answer as the text of an event stream, its blocks each whole (a stored answer
/// written for a streaming client).
pub fn message_stream(answer: &MessageAnswer<'_>) -> String {
    let mut stream = MessageStream::new(answer.id, answer.model);
    let mut out = stream.start(answer.usage.map(|usage| usage.input_tokens));
    for block in answer.blocks() {
        out.push_str(&stream.whole_block(block));
    }
    out.push_str(&stream.finish(answer.stop_reason, answer.usage, answer.context_management));
    out
}

/// The block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Text,
    Thinking,
}

/// A tool call whose pieces have come so far.
#[derive(Debug, Clone, Default)]
struct PendingCall {
    id: String,
    name: String,
    arguments: String,
}

/// A stream of Anthropic's named events written while an answer arrives piece by piece:
/// `message_start` and a `ping`, then for each content block `content_block_start`, its
/// `content_block_delta`s and `content_block_stop`, then `message_delta` with the stop
/// reason and `message_stop`. Text and thinking are written as they come; tool calls are
/// written whole once the answer ends, after them: the pieces of several calls may come in
/// any order (an OpenAI-compatible stream names each piece's call by index), and a block,
/// once stopped, takes no more.
#[derive(Debug, Clone)]
pub struct MessageStream {
    id: String,
    model: String,
    /// The index the next block gets.
    next_index: usize,
    open: Option<OpenBlock>,
    /// The tool calls so far, by their index in the answer.
    calls: std::collections::BTreeMap<usize, PendingCall>,
}

impl MessageStream {
    /// A stream of the message `id` answered by `model`.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> MessageStream {
        MessageStream {
            id: id.into(),
            model: model.into(),
            next_index: 0,
            open: None,
            calls: std::collections::BTreeMap::new(),
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
            Some("compaction") => (
                json!({"type": "compaction", "content": null, "encrypted_content": null}),
                Some(
                    json!({"type": "compaction_delta", "content": block["content"],
                            "encrypted_content": block["encrypted_content"]}),
                ),
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

    /// The last events: the open block's stop, each tool call's `tool_use` block, whole,
    /// `message_delta` with the stop reason (in Anthropic's words), the output tokens and
    /// what the request's context edits did (when it named any), `message_stop`.
    pub fn finish(
        &mut self,
        stop_reason: &str,
        usage: Option<Usage>,
        context_management: Option<&Value>,
    ) -> String {
        let mut out = self.close();
        for call in std::mem::take(&mut self.calls).into_values() {
            let block = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
            let index = self.next_index;
            self.next_index += 1;
            out.push_str(&Self::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            ));
            if !call.arguments.is_empty() {
                out.push_str(&Self::event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                ));
            }
            out.push_str(&Self::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        let mut delta = json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": usage.map_or(0, |usage| usage.output_tokens)}});
        if let Some(management) = context_management {
            delta["context_management"] = management.clone();
        }
        out.push_str(&Self::event("message_delta", &delta));
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

/// What a door adds to an Anthropic upstream's answer: what the request's context edits did
/// (`context_management`), and a content block before the answer's own (a compaction's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnswerAdditions {
    /// Set as the answer's `context_management`.
    pub context_management: Option<Value>,
    /// Put first among the answer's content blocks.
    pub leading_block: Option<Value>,
}

impl AnswerAdditions {
    /// True when there is nothing to add.
    pub fn is_empty(&self) -> bool {
        self.context_management.is_none() && self.leading_block.is_none()
    }
}

/// `body`, a whole `message` object as an Anthropic upstream wrote it, with `additions`;
/// every other field as it came. `None` when the body is not a JSON object.
pub fn with_additions(body: &[u8], additions: &AnswerAdditions) -> Option<Vec<u8>> {
    let mut object: serde_json::Map<String, Value> = serde_json::from_slice(body).ok()?;
    if let Some(block) = &additions.leading_block {
        match object.get_mut("content") {
            Some(Value::Array(content)) => content.insert(0, block.clone()),
            _ => {
                object.insert("content".into(), json!([block]));
            }
        }
    }
    if let Some(management) = &additions.context_management {
        object.insert("context_management".into(), management.clone());
    }
    serde_json::to_vec(&object).ok()
}

/// Makes [`AnswerAdditions`] to an Anthropic upstream's event stream as it passes: the
/// leading block's events before the first block's (the later blocks' indexes one up), and
/// `context_management` in the `message_delta` event; every other line is kept byte for
/// byte (a thinking block's signature among them). Fed the stream's chunks however they are
/// cut.
#[derive(Debug, Clone)]
pub struct AdditionsInserter {
    additions: AnswerAdditions,
    /// True once the leading block's events were written (or when there is none).
    block_written: bool,
    /// The start of a line whose end has not come yet.
    pending: Vec<u8>,
}

impl AdditionsInserter {
    /// An inserter of `additions`.
    pub fn new(additions: AnswerAdditions) -> AdditionsInserter {
        AdditionsInserter {
            block_written: additions.leading_block.is_none(),
            additions,
            pending: Vec::new(),
        }
    }

    /// The bytes of `chunk` to pass on: its whole lines (a line whose end has not come
    /// yet waits for the next chunk).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let Some(last_newline) = self.pending.iter().rposition(|&byte| byte == b'\n') else {
            return Vec::new();
        };
        let rest = self.pending.split_off(last_newline + 1);
        let lines = std::mem::replace(&mut self.pending, rest);
        let mut out = Vec::with_capacity(lines.len());
        for line in lines.split_inclusive(|&byte| byte == b'\n') {
            self.line(line, &mut out);
        }
        out
    }

    /// What is left at the stream's end (a last line without its newline).
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        self.line(&rest, &mut out);
        out
    }

    /// Writes `line` to `out` as it goes on, the leading block's events before it when it
    /// starts the first block's event (or the message's end).
    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        const STARTS: [&[u8]; 2] = [b"content_block_start", b"message_delta"];
        if !self.block_written {
            let opens = line
                .strip_prefix(b"event:")
                .or_else(|| line.strip_prefix(b"data:"))
                .is_some_and(|rest| {
                    STARTS
                        .iter()
                        .any(|name| rest.windows(name.len()).any(|window| window == *name))
                });
            if opens && let Some(block) = &self.additions.leading_block {
                let mut stream = MessageStream::new("", "");
                out.extend_from_slice(stream.whole_block(block.clone()).as_bytes());
                self.block_written = true;
            }
        }
        let Some(data) = line.strip_prefix(b"data:") else {
            out.extend_from_slice(line);
            return;
        };
        let shifts = self.additions.leading_block.is_some()
            && data.windows(13).any(|window| window == b"content_block");
        let annotates = self.additions.context_management.is_some()
            && data.windows(13).any(|window| window == b"message_delta");
        if !shifts && !annotates {
            out.extend_from_slice(line);
            return;
        }
        let text = String::from_utf8_lossy(data);
        let trimmed = text.trim_end_matches(['\r', '\n']);
        let end = &text[trimmed.len()..];
        let Ok(Value::Object(mut event)) = serde_json::from_str::<Value>(trimmed.trim_start())
        else {
            out.extend_from_slice(line);
            return;
        };
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if kind == "message_delta"
            && let Some(management) = &self.additions.context_management
        {
            event.insert("context_management".into(), management.clone());
        } else if kind.starts_with("content_block_")
            && self.additions.leading_block.is_some()
            && let Some(index) = event.get("index").and_then(Value::as_u64)
        {
            event.insert("index".into(), json!(index + 1));
        } else {
            out.extend_from_slice(line);
            return;
        }
        out.extend_from_slice(format!("data: {}{end}", Value::Object(event)).as_bytes());
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

    /// A piece of the tool call at `index` (its id and name with its first piece), kept for
    /// its `tool_use` block, written whole when the answer ends.
    fn tool_call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> String {
        // Kept until the answer ends (see the type's documentation).
        let call = self.calls.entry(index).or_default();
        if let Some(id) = id.filter(|id| !id.is_empty()) {
            call.id = id.to_owned();
        }
        if let Some(name) = name.filter(|name| !name.is_empty()) {
            call.name = name.to_owned();
        }
        call.arguments.push_str(arguments);
        String::new()
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
            context_management: None,
            leading_block: None,
        };
        insta::assert_snapshot!(
            "message_object",
            serde_json::to_string_pretty(&message_object(&answer)).unwrap()
        );
        insta::assert_snapshot!("message_stream", message_stream(&answer));
    }

    /// Feeds `stream` to an inserter of `additions` cut at `cut`.
    fn inserted(stream: &str, additions: &AnswerAdditions, cut: usize) -> String {
        let mut inserter = AdditionsInserter::new(additions.clone());
        let mut out = inserter.feed(&stream.as_bytes()[..cut]);
        out.extend(inserter.feed(&stream.as_bytes()[cut..]));
        out.extend(inserter.finish());
        String::from_utf8(out).unwrap()
    }

    const UPSTREAM_STREAM: &str = concat!(
        "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{}}\r\n\r\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"Eq  /+=message_delta\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}",
    );

    #[test]
    fn context_management_is_set_in_the_message_delta_however_the_stream_is_cut() {
        let management = json!({"applied_edits": [{"type": "clear_tool_uses_20250919"}]});
        let additions = AnswerAdditions {
            context_management: Some(management.clone()),
            leading_block: None,
        };
        let expected = UPSTREAM_STREAM.replace(
            "\"usage\":{\"output_tokens\":3}}",
            "\"usage\":{\"output_tokens\":3},\"context_management\":{\"applied_edits\":[{\"type\":\"clear_tool_uses_20250919\"}]}}",
        );
        for cut in 0..UPSTREAM_STREAM.len() {
            assert_eq!(
                inserted(UPSTREAM_STREAM, &additions, cut),
                expected,
                "cut at {cut}"
            );
        }
        let body =
            br#"{"id":"msg_1","content":[{"type":"thinking","thinking":"t","signature":"s=="}]}"#;
        let written: Value =
            serde_json::from_slice(&with_additions(body, &additions).unwrap()).unwrap();
        assert_eq!(written["context_management"], management);
        assert_eq!(written["content"][0]["signature"], "s==");
        assert_eq!(with_additions(b"[1]", &additions), None);
    }

    #[test]
    fn a_leading_block_comes_first_and_the_upstreams_blocks_move_up_one() {
        let block =
            json!({"type": "compaction", "content": "Summary.", "encrypted_content": "k=1"});
        let additions = AnswerAdditions {
            context_management: None,
            leading_block: Some(block.clone()),
        };
        let whole = inserted(UPSTREAM_STREAM, &additions, UPSTREAM_STREAM.len());
        for cut in 0..UPSTREAM_STREAM.len() {
            assert_eq!(
                inserted(UPSTREAM_STREAM, &additions, cut),
                whole,
                "cut at {cut}"
            );
        }
        insta::assert_snapshot!("stream_with_a_leading_block", whole);
        let body = br#"{"id":"msg_1","content":[{"type":"text","text":"Hi"}]}"#;
        let written: Value =
            serde_json::from_slice(&with_additions(body, &additions).unwrap()).unwrap();
        assert_eq!(
            written["content"],
            json!([block, {"type": "text", "text": "Hi"}])
        );
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
        // A piece of the first call after the second's: still the first call's.
        out.push_str(&stream.tool_call(0, None, None, r#""Lisbon"}"#));
        out.push_str(&stream.finish("tool_use", Some(Usage::new(5, 7)), None));
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
