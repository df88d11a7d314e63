//! A provider that replays replies from a YAML script: deterministic runs for tests and demos.
//!
//! ```yaml
//! replies:                      # used in order, one per call
//!   - content: "Let me look that up."
//!     tool_calls:
//!       - name: search          # id defaults to call_<reply>_<call>
//!         arguments: {q: "weather Lisbon"}
//!   - content: "Clear skies, 22°C."
//!     usage: {prompt_tokens: 120, completion_tokens: 9}   # else counted with o200k_base
//!   - error: {status: 429, message: "slow down"}         # this call fails
//! ```
//!
//! A bare list of replies is accepted too. Every request received is kept, so a test can
//! check exactly what the model was sent. Like a provider, a text reply longer than the
//! request's `max_tokens` is cut there (finish reason `length`), unless its `usage` is given.

use std::sync::Mutex;

use contexture_core::{Encoding, Message, TokenCounter, ToolCall};
use serde::Deserialize;
use serde_json::Value;

use crate::error::LlmError;
use crate::provider::{BoxFuture, ChatRequest, ChatResponse, Provider, StreamDelta, Usage};

/// A script that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}{}: {message}", location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct ScriptError {
    /// Where the script came from (a file name).
    pub source_name: String,
    /// Line and column of the problem, when known.
    pub location: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    replies: Vec<ScriptedReply>,
}

/// One scripted reply.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedReply {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    error: Option<ScriptedError>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedError {
    status: u16,
    #[serde(default)]
    message: String,
}

/// Replays a script of replies.
#[derive(Debug)]
pub struct ScriptedProvider {
    replies: Vec<ScriptedReply>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: usize,
    requests: Vec<ChatRequest>,
}

impl ScriptedProvider {
    /// Reads a script; `source_name` names it in errors.
    pub fn from_yaml(text: &str, source_name: &str) -> Result<ScriptedProvider, ScriptError> {
        let located = |error: yaml_serde::Error| ScriptError {
            source_name: source_name.to_owned(),
            location: error.location().map(|l| (l.line(), l.column())),
            message: error.to_string(),
        };
        // Parsing straight into the target type (rather than an untagged either-or) keeps
        // serde's precise messages and locations for misspelt fields.
        let document: yaml_serde::Value = yaml_serde::from_str(text).map_err(located)?;
        let replies = if document.is_sequence() {
            yaml_serde::from_str::<Vec<ScriptedReply>>(text).map_err(located)?
        } else {
            yaml_serde::from_str::<ScriptFile>(text)
                .map_err(located)?
                .replies
        };
        for (index, reply) in replies.iter().enumerate() {
            if reply.error.is_some() && (reply.content.is_some() || !reply.tool_calls.is_empty()) {
                return Err(ScriptError {
                    source_name: source_name.to_owned(),
                    location: None,
                    message: format!(
                        "replies[{index}]: an `error` reply cannot also have content or tool_calls"
                    ),
                });
            }
        }
        Ok(ScriptedProvider {
            replies,
            state: Mutex::new(State::default()),
        })
    }

    /// A script of plain text replies.
    pub fn texts<I: IntoIterator<Item = S>, S: Into<String>>(texts: I) -> ScriptedProvider {
        ScriptedProvider {
            replies: texts
                .into_iter()
                .map(|text| ScriptedReply {
                    content: Some(text.into()),
                    tool_calls: Vec::new(),
                    usage: None,
                    finish_reason: None,
                    error: None,
                })
                .collect(),
            state: Mutex::new(State::default()),
        }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.lock().requests.clone()
    }

    /// Marks the next `count` replies as used, as if that many calls had been made: a run
    /// resumed from its log continues the script where the interrupted run stopped. Skipping
    /// past the end leaves no reply.
    pub fn skip(&self, count: usize) {
        let mut state = self.lock();
        state.next = (state.next + count).min(self.replies.len());
    }

    /// How many replies have not been used yet.
    pub fn remaining(&self) -> usize {
        self.replies.len() - self.lock().next
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated (each update is
        // one push and one increment), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn reply(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let index = {
            let mut state = self.lock();
            state.requests.push(request.clone());
            let index = state.next;
            if index >= self.replies.len() {
                return Err(LlmError::ScriptExhausted {
                    replies: self.replies.len(),
                });
            }
            state.next += 1;
            index
        };
        let reply = &self.replies[index];
        if let Some(error) = &reply.error {
            return Err(LlmError::Status {
                provider: "scripted".into(),
                status: error.status,
                body: error.message.clone(),
                retry_after: None,
            });
        }
        let calls = reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(n, call)| {
                let arguments = match &call.arguments {
                    None => "{}".to_owned(),
                    Some(Value::String(text)) => text.clone(),
                    Some(value) => value.to_string(),
                };
                let id = call
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{index}_{n}"));
                ToolCall::new(id, call.name.clone(), arguments)
            })
            .collect::<Vec<_>>();
        let has_calls = !calls.is_empty();
        let mut message = Message::assistant_tool_calls(calls);
        if let Some(text) = &reply.content {
            message.set_text(text.clone());
        } else if !has_calls {
            message.set_text("");
        }
        let counter = TokenCounter::exact(Encoding::O200kBase);
        // A provider stops at the request's `max_tokens`: a scripted text reply longer than
        // that is cut to the tokens allowed and ends with `length` (a script that gives its
        // own usage says what happened, and is left as written).
        let cap = request.max_tokens.map(u64::from);
        if let (Some(cap), None, false) = (cap, &reply.usage, has_calls)
            && u64::from(counter.count_message(&message)) > cap
        {
            let text = message.text();
            let kept = longest_prefix_within(&text, cap, &counter);
            message.set_text(kept);
            return Ok(ChatResponse {
                finish_reason: Some("length".to_owned()),
                message,
                usage: Some(Usage {
                    input_tokens: u64::from(
                        counter
                            .count_request(&request.messages, &request.tools)
                            .total,
                    ),
                    output_tokens: cap,
                }),
                model: Some(request.model.clone()),
                attempts: 1,
            });
        }
        let usage = reply.usage.unwrap_or_else(|| Usage {
            input_tokens: u64::from(
                counter
                    .count_request(&request.messages, &request.tools)
                    .total,
            ),
            output_tokens: u64::from(counter.count_message(&message)),
        });
        Ok(ChatResponse {
            finish_reason: Some(
                reply
                    .finish_reason
                    .clone()
                    .unwrap_or_else(|| if has_calls { "tool_calls" } else { "stop" }.to_owned()),
            ),
            message,
            usage: Some(usage),
            model: Some(request.model.clone()),
            attempts: 1,
        })
    }
}

/// The longest start of `text` (cut at a character boundary) of at most `tokens` tokens.
fn longest_prefix_within(text: &str, tokens: u64, counter: &TokenCounter) -> String {
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(at, _)| at)
        .chain(std::iter::once(text.len()))
        .collect();
    // Binary search over the boundaries: a longer start never has fewer tokens.
    let (mut low, mut high) = (0, boundaries.len() - 1);
    while low < high {
        let middle = (low + high).div_ceil(2);
        if u64::from(counter.count_text(&text[..boundaries[middle]])) <= tokens {
            low = middle;
        } else {
            high = middle - 1;
        }
    }
    text[..boundaries[low]].to_owned()
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move { self.reply(request) })
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_delta: &'a mut (dyn FnMut(StreamDelta) + Send),
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let response = self.reply(request)?;
            let text = response.message.text();
            // Word by word, spaces kept, so joining the deltas gives the text back.
            for piece in text.split_inclusive(' ') {
                on_delta(StreamDelta::Text(piece.to_owned()));
            }
            for (index, call) in response.message.tool_calls.iter().enumerate() {
                on_delta(StreamDelta::ToolCall {
                    index,
                    id: Some(call.id.to_string()),
                    name: Some(call.name.to_string()),
                    arguments: call.arguments.to_string(),
                });
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = r#"
replies:
  - content: "Let me look that up."
    tool_calls:
      - name: search
        arguments: {q: "weather Lisbon"}
  - content: "Clear skies."
    usage: {prompt_tokens: 120, completion_tokens: 9}
  - error: {status: 429, message: "slow down"}
"#;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn a_reply_past_the_requests_max_tokens_is_cut_there() {
        let script =
            "- content: one two three four five six seven eight nine ten\n- content: short\n";
        let provider = ScriptedProvider::from_yaml(script, "script.yaml").unwrap();
        let mut request = ChatRequest::new("m", vec![Message::user("count")]);
        request.max_tokens = Some(3);
        let cut = block_on(provider.complete(&request)).unwrap();
        assert_eq!(cut.message.text(), "one two three");
        assert_eq!(cut.finish_reason.as_deref(), Some("length"));
        assert_eq!(cut.usage.unwrap().output_tokens, 3);
        // A reply within the cap is sent whole.
        request.max_tokens = Some(100);
        let whole = block_on(provider.complete(&request)).unwrap();
        assert_eq!(whole.message.text(), "short");
        assert_eq!(whole.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn replays_in_order_and_records_requests() {
        let provider = ScriptedProvider::from_yaml(SCRIPT, "script.yaml").unwrap();
        let request = ChatRequest::new("demo", vec![Message::user("weather?")]);
        let first = block_on(provider.complete(&request)).unwrap();
        assert_eq!(first.message.text(), "Let me look that up.");
        assert_eq!(
            first.message.tool_calls,
            vec![ToolCall::new(
                "call_0_0",
                "search",
                r#"{"q":"weather Lisbon"}"#
            )]
        );
        assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
        assert!(first.usage.unwrap().input_tokens > 0);

        let mut deltas = Vec::new();
        let second = block_on(provider.stream(&request, &mut |d| deltas.push(d))).unwrap();
        assert_eq!(second.usage, Some(Usage::new(120, 9)));
        assert_eq!(
            deltas,
            vec![
                StreamDelta::Text("Clear ".into()),
                StreamDelta::Text("skies.".into())
            ]
        );

        let third = block_on(provider.complete(&request)).unwrap_err();
        assert!(matches!(third, LlmError::Status { status: 429, .. }));
        let fourth = block_on(provider.complete(&request)).unwrap_err();
        assert!(matches!(fourth, LlmError::ScriptExhausted { replies: 3 }));
        assert_eq!(provider.requests().len(), 4);
    }

    #[test]
    fn bad_scripts_are_located() {
        let error = ScriptedProvider::from_yaml("replies:\n  - content: [unclosed\n", "s.yaml")
            .unwrap_err();
        assert!(error.to_string().starts_with("s.yaml:"), "{error}");
        assert!(error.location.is_some());

        let error =
            ScriptedProvider::from_yaml("replies:\n  - contnet: hi\n", "s.yaml").unwrap_err();
        assert!(error.to_string().contains("contnet"), "{error}");
        assert_eq!(error.location.map(|(line, _)| line), Some(2), "{error}");

        let error =
            ScriptedProvider::from_yaml("- error: {status: 500}\n  content: hi\n", "s.yaml")
                .unwrap_err();
        assert!(error.to_string().contains("replies[0]"), "{error}");
    }
}
