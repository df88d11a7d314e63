//! OpenAI Responses streams: an answer arriving piece by piece (reply text, reasoning, tool
//! call fragments) written as the API's server-sent events, each with its `type` and
//! `sequence_number`, in the documented order: `response.created`, `response.in_progress`;
//! per output item `response.output_item.added`, for a message `response.content_part.added`,
//! `response.output_text.delta`... `.done`, `response.content_part.done`, for a function call
//! `response.function_call_arguments.delta`... `.done`, then `response.output_item.done`; and
//! last `response.completed` (or `response.incomplete`, `response.failed`) with the whole
//! response object, whose output items are the ones streamed.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::AnswerPieces;
use super::responses_answer::{ResponseHeader, ResponseStatus, response_object};
use crate::thread::Usage;

/// One output item being streamed.
#[derive(Debug, Clone)]
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// An item that arrives whole (a compaction item).
    Whole(Value),
}

/// The events of one streamed response (see the module documentation).
#[derive(Debug, Clone)]
pub struct ResponseStream {
    id_seed: String,
    sequence: u64,
    items: Vec<Item>,
    /// The item still receiving pieces, if any.
    open: Option<usize>,
    /// Where each tool call (by its index among the turn's calls) is among the items.
    calls: BTreeMap<usize, usize>,
}

impl ResponseStream {
    /// A stream whose item ids are made from `id_seed` (`msg_<seed>_<n>`, `fc_...`, `rs_...`,
    /// as [`super::responses_answer::output_items`] makes them).
    pub fn new(id_seed: impl Into<String>) -> ResponseStream {
        ResponseStream {
            id_seed: id_seed.into(),
            sequence: 0,
            items: Vec::new(),
            open: None,
            calls: BTreeMap::new(),
        }
    }

    /// `response.created` and `response.in_progress`, for the response as it starts.
    pub fn start(&mut self, header: &ResponseHeader<'_>) -> String {
        let mut response = response_object(header, &ResponseStatus::Completed, Vec::new(), None);
        response["status"] = json!("in_progress");
        let mut out = self.event("response.created", json!({"response": response.clone()}));
        out.push_str(&self.event("response.in_progress", json!({"response": response})));
        out
    }

    /// An item that arrives whole (the compaction item a compacted turn's output begins
    /// with): `response.output_item.added` and `.done`.
    pub fn whole_item(&mut self, item: Value) -> String {
        let mut out = self.close();
        let index = self.items.len();
        out.push_str(&self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item.clone()}),
        ));
        out.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item.clone()}),
        ));
        self.items.push(Item::Whole(item));
        out
    }

    /// The end: the open item closed, then `response.completed` (or `.incomplete`,
    /// `.failed`) with the whole response, its output the items streamed.
    pub fn finish(
        &mut self,
        header: &ResponseHeader<'_>,
        status: &ResponseStatus,
        usage: Option<Usage>,
    ) -> String {
        let mut out = self.close();
        let output = (0..self.items.len())
            .map(|index| self.item_value(index))
            .collect();
        let response = response_object(header, status, output, usage);
        let kind = match status {
            ResponseStatus::Completed => "response.completed",
            ResponseStatus::Incomplete { .. } => "response.incomplete",
            ResponseStatus::Failed { .. } => "response.failed",
        };
        out.push_str(&self.event(kind, json!({"response": response})));
        out
    }

    /// The events that end the open item, if any.
    fn close(&mut self) -> String {
        let Some(index) = self.open.take() else {
            return String::new();
        };
        let mut out = String::new();
        match self.items[index].clone() {
            Item::Message { id, text } => {
                out.push_str(&self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                ));
                out.push_str(&self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": {"type": "output_text", "text": text, "annotations": []}}),
                ));
            }
            Item::Call { id, arguments, .. } => {
                out.push_str(&self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                ));
            }
            Item::Reasoning { .. } | Item::Whole(_) => {}
        }
        let item = self.item_value(index);
        out.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        out
    }

    /// Item `index` as the finished response holds it.
    fn item_value(&self, index: usize) -> Value {
        match &self.items[index] {
            Item::Reasoning { id, text } => json!({"id": id, "type": "reasoning",
                "summary": [{"type": "summary_text", "text": text}]}),
            Item::Message { id, text } => json!({"id": id, "type": "message",
                "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({"id": id, "type": "function_call", "status": "completed",
                "call_id": call_id, "name": name, "arguments": arguments}),
            Item::Whole(item) => item.clone(),
        }
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.id_seed, self.items.len())
    }

    /// One event: its `event:` line and its data with `type` and `sequence_number` first.
    fn event(&mut self, kind: &str, fields: Value) -> String {
        let mut data = serde_json::Map::new();
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.sequence));
        if let Value::Object(fields) = fields {
            data.extend(fields);
        }
        self.sequence += 1;
        format!("event: {kind}\ndata: {}\n\n", Value::Object(data))
    }
}

impl AnswerPieces for ResponseStream {
    /// More reply text.
    fn text(&mut self, delta: &str) -> String {
        let mut out = String::new();
        let index = match self.open {
            Some(index) if matches!(self.items[index], Item::Message { .. }) => index,
            _ => {
                out.push_str(&self.close());
                let id = self.item_id("msg");
                out.push_str(&self.event(
                    "response.output_item.added",
                    json!({"output_index": self.items.len(), "item": {
                        "id": id, "type": "message", "status": "in_progress",
                        "role": "assistant", "content": []}}),
                ));
                out.push_str(&self.event(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": self.items.len(), "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
                self.items.push(Item::Message {
                    id,
                    text: String::new(),
                });
                self.open = Some(self.items.len() - 1);
                self.items.len() - 1
            }
        };
        if let Item::Message { id, text } = &mut self.items[index] {
            text.push_str(delta);
            let id = id.clone();
            out.push_str(&self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
            ));
        }
        out
    }

    /// More reasoning text: one reasoning item, whose summary is written when it ends.
    fn reasoning(&mut self, delta: &str) -> String {
        let mut out = String::new();
        let index = match self.open {
            Some(index) if matches!(self.items[index], Item::Reasoning { .. }) => index,
            _ => {
                out.push_str(&self.close());
                let id = self.item_id("rs");
                out.push_str(&self.event(
                    "response.output_item.added",
                    json!({"output_index": self.items.len(),
                           "item": {"id": id, "type": "reasoning", "summary": []}}),
                ));
                self.items.push(Item::Reasoning {
                    id,
                    text: String::new(),
                });
                self.open = Some(self.items.len() - 1);
                self.items.len() - 1
            }
        };
        if let Item::Reasoning { text, .. } = &mut self.items[index] {
            text.push_str(delta);
        }
        out
    }

    /// A tool call started or grew: `index` orders the turn's calls; `id` and `name` come
    /// with its first fragment, `arguments` is the new fragment of its JSON arguments.
    fn tool_call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> String {
        let mut out = String::new();
        let position = match self.calls.get(&index) {
            Some(&position) => {
                if self.open != Some(position) {
                    out.push_str(&self.close());
                    self.open = Some(position);
                }
                position
            }
            None => {
                out.push_str(&self.close());
                let item_id = self.item_id("fc");
                let call_id = id.unwrap_or_default().to_owned();
                let name = name.unwrap_or_default().to_owned();
                out.push_str(&self.event(
                    "response.output_item.added",
                    json!({"output_index": self.items.len(), "item": {
                        "id": item_id, "type": "function_call", "status": "in_progress",
                        "call_id": call_id, "name": name, "arguments": ""}}),
                ));
                self.items.push(Item::Call {
                    id: item_id,
                    call_id,
                    name,
                    arguments: String::new(),
                });
                let position = self.items.len() - 1;
                self.calls.insert(index, position);
                self.open = Some(position);
                position
            }
        };
        if let Item::Call {
            id: item_id,
            arguments: so_far,
            ..
        } = &mut self.items[position]
        {
            if arguments.is_empty() {
                return out;
            }
            so_far.push_str(arguments);
            let item_id = item_id.clone();
            out.push_str(&self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": position, "delta": arguments}),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::responses_answer::output_items;
    use crate::message::{Message, ToolCall};

    fn events(stream: &str) -> Vec<Value> {
        stream
            .split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let mut lines = event.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data: Value =
                    serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap())
                        .unwrap();
                assert_eq!(data["type"], name);
                data
            })
            .collect()
    }

    /// The header of response `id` to a request with nothing set.
    fn header<'a>(id: &'a str, request: &'a serde_json::Map<String, Value>) -> ResponseHeader<'a> {
        ResponseHeader {
            id,
            created_at: 0,
            model: "gpt-4o-mini",
            previous_response_id: None,
            conversation: None,
            instructions: None,
            request,
        }
    }

    #[test]
    fn text_and_calls_stream_in_the_documented_order_and_end_as_the_whole_answer_would() {
        let request = serde_json::Map::new();
        let header = header("resp_1", &request);
        let mut stream = ResponseStream::new("resp_1");
        let mut text = stream.start(&header);
        text += &stream.text("Check");
        text += &stream.text("ing.");
        text += &stream.tool_call(0, Some("call_a"), Some("weather"), "");
        text += &stream.tool_call(0, None, None, "{\"city\":");
        text += &stream.tool_call(0, None, None, "\"Porto\"}");
        text += &stream.finish(&header, &ResponseStatus::Completed, Some(Usage::new(9, 4)));
        let events = events(&text);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..15).collect::<Vec<_>>());
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(events[6]["text"], "Checking.");
        assert_eq!(events[12]["arguments"], "{\"city\":\"Porto\"}");
        // The streamed items are the ones the whole answer has.
        let mut message = Message::assistant("Checking.");
        message.tool_calls = vec![ToolCall::new("call_a", "weather", "{\"city\":\"Porto\"}")];
        assert_eq!(
            events[14]["response"]["output"],
            Value::Array(output_items(&message, "resp_1"))
        );
        assert_eq!(events[14]["response"]["usage"]["total_tokens"], 13);
    }

    #[test]
    fn a_cut_answer_ends_incomplete() {
        let request = serde_json::Map::new();
        let header = header("resp_2", &request);
        let mut stream = ResponseStream::new("resp_2");
        let mut text = stream.start(&header);
        text += &stream.reasoning("Thinking");
        text += &stream.text("Part");
        text += &stream.finish(
            &header,
            &ResponseStatus::from_finish_reason(Some("length")),
            None,
        );
        let events = events(&text);
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(last["response"]["output"][0]["type"], "reasoning");
        assert_eq!(
            last["response"]["output"][0]["summary"][0]["text"],
            "Thinking"
        );
        assert_eq!(last["response"]["output"][1]["content"][0]["text"], "Part");
    }
}
