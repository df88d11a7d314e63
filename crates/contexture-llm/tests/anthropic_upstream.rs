//! The pass-through client speaking Anthropic's messages format to the fake upstream over
//! real HTTP: a wire-neutral call from an OpenAI-format client is written as a messages
//! request (key as `x-api-key`, the API version header), and the answer, whole or streamed,
//! folds into the same assistant message an OpenAI-compatible upstream's would.

use std::time::Duration;

use contexture_core::{Content, Message, Part, ToolCall};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{
    AnswerAccumulator, ChatCall, ChatUpstream, ClientFormat, ClientRequest, Passthrough,
    PassthroughError, UpstreamBody, UpstreamConfig, WireFormat, record_stream,
};
use serde_json::{Value, json};

const KEY: &str = "sk-ant-secret-456";

fn anthropic(upstream: &FakeUpstream) -> Passthrough {
    let mut config = UpstreamConfig::speaking(
        WireFormat::AnthropicMessages,
        upstream.origin(),
        Some(KEY.to_owned()),
    );
    config.timeout = Duration::from_secs(10);
    config.retries = 0;
    Passthrough::new(config).unwrap()
}

/// A call as the chat-completions door reads one.
fn openai_call(stream: bool) -> ChatCall {
    let body = json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "ignored: the engine's messages are sent"}],
        "max_tokens": 256,
        "temperature": 0.3,
        "stream": stream,
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    });
    let Value::Object(body) = body else {
        unreachable!()
    };
    ChatCall {
        model: "claude-sonnet-4-5".to_owned(),
        tools: vec![body["tools"][0].clone()],
        response_format: None,
        max_tokens: Some(256),
        stream,
        client: ClientRequest {
            format: ClientFormat::OPENAI_CHAT,
            body,
        },
    }
}

fn messages() -> Vec<Message> {
    vec![
        Message::system("Be brief."),
        Message::user("Weather in Porto?"),
    ]
}

/// An assistant answer of one text block.
fn blocks(text: &str) -> Message {
    let mut message = Message::assistant(text);
    message.content = Some(Content::Parts(vec![Part::text(text)]));
    message
}

#[tokio::test]
async fn a_call_is_written_as_a_messages_request_and_its_answer_read() {
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Rainy, 14 °C.").usage(30, 6));
    let client = anthropic(&upstream);
    assert_eq!(client.format(), WireFormat::AnthropicMessages);
    let response = client.send(&openai_call(false), &messages()).await.unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.format, WireFormat::AnthropicMessages);
    let UpstreamBody::Full(body) = response.body else {
        panic!("a whole answer")
    };
    let answer = AnswerAccumulator::from_body(WireFormat::AnthropicMessages, &body).unwrap();
    // Read as the format writes it: a list of content blocks.
    assert_eq!(answer.message, blocks("Rainy, 14 °C."));
    assert_eq!(answer.usage.map(|usage| usage.input_tokens), Some(30));

    let calls = upstream.calls();
    assert_eq!(calls.len(), 1);
    let sent = &calls[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.authorization(), None, "the key goes in x-api-key only");
    assert_eq!(
        sent.json,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Weather in Porto?"}],
            "temperature": 0.3,
            "tools": [{"name": "weather", "input_schema": {"type": "object"}}]
        })
    );
    // The key shows in no debug output.
    assert!(!format!("{client:?}").contains(KEY));
}

#[tokio::test]
async fn a_streamed_answer_passes_through_and_is_recorded_from_its_events() {
    let upstream = FakeUpstream::start().await;
    upstream.push(
        Reply::text_in_pieces(["Let me ", "check."])
            .with_tool_call("toolu_1", "weather", json!({"city": "Porto"}))
            .usage(41, 12),
    );
    let response = anthropic(&upstream)
        .send(&openai_call(true), &messages())
        .await
        .unwrap();
    assert_eq!(upstream.calls()[0].json["stream"], true);
    let UpstreamBody::Stream(stream) = response.body else {
        panic!("a stream")
    };
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let recorded = record_stream(stream, response.format, move |outcome| {
        let _ = sender.send(outcome);
    });
    let passed = UpstreamBody::Stream(recorded).collect().await.unwrap();
    let text = String::from_utf8(passed.to_vec()).unwrap();
    assert!(text.contains("event: message_start"), "{text}");
    let answer = receiver.await.unwrap().unwrap();
    let mut expected = blocks("Let me check.");
    expected.tool_calls = vec![ToolCall::new(
        "toolu_1",
        "weather",
        json!({"city": "Porto"}).to_string(),
    )];
    assert_eq!(answer.message, expected);
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_use"));
    assert_eq!(answer.usage.map(|usage| usage.output_tokens), Some(12));
}

#[test]
fn a_stream_cut_before_its_stop_keeps_what_arrived() {
    let events = [
        json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Half"}}),
    ];
    let mut accumulator = AnswerAccumulator::for_format(WireFormat::AnthropicMessages);
    for event in &events {
        let kind = event["type"].as_str().unwrap();
        accumulator.push_sse_bytes(format!("event: {kind}\ndata: {event}\n\n").as_bytes());
    }
    match accumulator.finish() {
        Err(PassthroughError::Truncated { partial }) => {
            assert_eq!(partial.map(|message| *message), Some(blocks("Half")));
        }
        other => panic!("expected a truncated answer, got {other:?}"),
    }
    let mut errored = AnswerAccumulator::for_format(WireFormat::AnthropicMessages);
    errored.push_sse_bytes(
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    assert!(matches!(
        errored.finish(),
        Err(PassthroughError::Reported { detail }) if detail.contains("overloaded_error")
    ));
    assert!(matches!(
        AnswerAccumulator::from_body(
            WireFormat::AnthropicMessages,
            b"{\"type\":\"error\",\"error\":{\"message\":\"bad\"}}"
        ),
        Err(PassthroughError::Reported { .. })
    ));
}

#[tokio::test]
async fn a_chat_completions_body_is_not_sent_to_an_anthropic_upstream() {
    let upstream = FakeUpstream::start().await;
    let error = anthropic(&upstream)
        .chat_completions(&json!({"model": "m", "messages": []}))
        .await
        .unwrap_err();
    assert!(
        matches!(error, PassthroughError::Unsupported { .. }),
        "{error}"
    );
    assert!(upstream.calls().is_empty());
}
