//! The HTTP providers against the fake upstream over real HTTP: request shape, usage,
//! retries with `Retry-After`, timeouts, streaming.

use std::time::Duration;

use contexture_core::{Message, ToolCall};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{
    AnthropicProvider, ChatRequest, LlmError, OpenAiProvider, Provider, RetryPolicy, StreamDelta,
    Usage,
};
use serde_json::{Value, json};

fn fast_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(200),
    }
}

fn openai_answer(text: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}
    })
}

fn request() -> ChatRequest {
    let mut request = ChatRequest::new(
        "gpt-4o",
        vec![
            Message::system("Be brief."),
            Message::user("Weather in Lisbon?"),
        ],
    );
    request.max_tokens = Some(64);
    request
}

#[tokio::test]
async fn openai_call_sends_the_wire_format_and_reads_usage() {
    let upstream = FakeUpstream::scripted([Reply::json(200, openai_answer("Sunny."))]).await;
    let provider = OpenAiProvider::new(upstream.base_url(), Some("sk-test-secret".into()));
    let response = provider.complete(&request()).await.unwrap();
    assert_eq!(response.message.text(), "Sunny.");
    assert_eq!(response.usage, Some(Usage::new(21, 5)));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.attempts, 1);

    let call = upstream.call(0);
    assert_eq!(call.authorization(), Some("Bearer sk-test-secret"));
    assert_eq!(
        call.json,
        json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Lisbon?"}
            ],
            "max_tokens": 64
        })
    );
    assert!(!format!("{provider:?}").contains("sk-test-secret"));
}

#[tokio::test]
async fn rate_limits_are_retried_honouring_retry_after() {
    let limited = Reply::json(429, json!({"error": {"message": "rate limited"}}))
        .header("retry-after", "0.05");
    let upstream = FakeUpstream::scripted([
        limited,
        Reply::json(503, json!({"error": "overloaded"})),
        Reply::json(200, openai_answer("Finally.")),
    ])
    .await;
    let provider = OpenAiProvider::new(upstream.base_url(), None).with_retry(fast_retries(3));
    let started = std::time::Instant::now();
    let response = provider.complete(&request()).await.unwrap();
    assert_eq!(response.message.text(), "Finally.");
    assert_eq!(response.attempts, 3);
    assert_eq!(upstream.call_count(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "Retry-After was not honoured"
    );
}

#[tokio::test]
async fn server_errors_exhaust_the_retries() {
    let failing = Reply::json(500, json!({"error": "boom"}));
    let upstream = FakeUpstream::scripted([failing.clone(), failing.clone(), failing]).await;
    let provider = OpenAiProvider::new(upstream.base_url(), None).with_retry(fast_retries(2));
    let error = provider.complete(&request()).await.unwrap_err();
    match &error {
        LlmError::RetriesExhausted { attempts, last } => {
            assert_eq!(*attempts, 3);
            assert!(matches!(**last, LlmError::Status { status: 500, .. }));
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(upstream.call_count(), 3);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let upstream = FakeUpstream::scripted([Reply::json(
        400,
        json!({"error": {"message": "messages[1].content: bad"}}),
    )])
    .await;
    let provider = OpenAiProvider::new(upstream.base_url(), None).with_retry(fast_retries(3));
    let error = provider.complete(&request()).await.unwrap_err();
    assert!(
        matches!(error, LlmError::Status { status: 400, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("messages[1].content: bad"),
        "{error}"
    );
    assert_eq!(upstream.call_count(), 1);
}

#[tokio::test]
async fn slow_answers_time_out() {
    let slow = Reply::json(200, openai_answer("late")).after(Duration::from_secs(3));
    let upstream = FakeUpstream::scripted([slow]).await;
    let provider = OpenAiProvider::new(upstream.base_url(), None)
        .with_retry(RetryPolicy::none())
        .with_timeout(Duration::from_millis(200));
    let error = provider.complete(&request()).await.unwrap_err();
    assert!(matches!(error, LlmError::Timeout { .. }), "{error}");
}

#[tokio::test]
async fn unreachable_servers_are_connection_errors() {
    // Bind and drop a listener so the port is (almost certainly) closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let provider =
        OpenAiProvider::new(format!("http://{address}/v1"), None).with_retry(RetryPolicy::none());
    let error = provider.complete(&request()).await.unwrap_err();
    assert!(matches!(error, LlmError::Connection { .. }), "{error}");
}

#[tokio::test]
async fn openai_streams_text_and_tool_calls() {
    let events = [
        json!({"model": "gpt-4o", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Checking"}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": " now."}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Lisbon\"}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}),
    ];
    let upstream = FakeUpstream::scripted([Reply::event_stream(&events)]).await;
    let provider = OpenAiProvider::new(upstream.base_url(), None);
    let mut deltas = Vec::new();
    let response = provider
        .stream(&request(), &mut |delta| deltas.push(delta))
        .await
        .unwrap();
    assert_eq!(response.message.text(), "Checking now.");
    assert_eq!(
        response.message.tool_calls,
        vec![ToolCall::new("call_1", "weather", "{\"city\":\"Lisbon\"}")]
    );
    assert_eq!(response.usage, Some(Usage::new(30, 12)));
    assert_eq!(deltas[0], StreamDelta::Text("Checking".into()));
    assert_eq!(deltas.len(), 4);
    let sent = upstream.call(0).json;
    assert_eq!(sent["stream"], json!(true));
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn anthropic_call_lifts_the_system_prompt() {
    let answer = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Lisbon"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 40, "output_tokens": 18}
    });
    let upstream = FakeUpstream::scripted([Reply::json(200, answer)]).await;
    let provider = AnthropicProvider::new(upstream.origin(), "ant-secret");
    let mut request = request();
    request.tools = vec![
        json!({"type": "function", "function": {"name": "weather", "description": "Weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
    ];
    let response = provider.complete(&request).await.unwrap();
    assert_eq!(response.message.text(), "Let me check.");
    assert_eq!(
        response.message.tool_calls,
        vec![ToolCall::new("toolu_1", "weather", "{\"city\":\"Lisbon\"}")]
    );
    assert_eq!(response.usage, Some(Usage::new(40, 18)));

    let call = upstream.call(0);
    assert_eq!(call.path, "/v1/messages");
    assert_eq!(call.header("x-api-key"), Some("ant-secret"));
    assert_eq!(call.header("anthropic-version"), Some("2023-06-01"));
    let body = &call.json;
    assert_eq!(body["system"], json!("Be brief."));
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Weather in Lisbon?"}])
    );
    assert_eq!(body["max_tokens"], json!(64));
    assert_eq!(
        body["tools"][0]["input_schema"]["properties"]["city"]["type"],
        json!("string")
    );
    assert!(!format!("{provider:?}").contains("ant-secret"));
}

#[tokio::test]
async fn anthropic_streams() {
    let events = [
        json!({"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Sunny"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ", 22°C."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
        json!({"type": "message_stop"}),
    ];
    let upstream = FakeUpstream::scripted([Reply::anthropic_event_stream(&events)]).await;
    let provider = AnthropicProvider::new(upstream.origin(), "key");
    let mut text = String::new();
    let response = provider
        .stream(&request(), &mut |delta| {
            if let StreamDelta::Text(piece) = delta {
                text.push_str(&piece);
            }
        })
        .await
        .unwrap();
    assert_eq!(text, "Sunny, 22°C.");
    assert_eq!(response.message.text(), "Sunny, 22°C.");
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(response.usage, Some(Usage::new(25, 7)));
}

#[tokio::test]
async fn a_stream_cut_before_its_end_is_an_error_not_a_short_answer() {
    // Text arrives, then the body ends with no finish reason and no [DONE].
    let openai_cut =
        json!({"model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": "Half an ans"}}]});
    let upstream = FakeUpstream::scripted([Reply::raw(
        200,
        "text/event-stream",
        format!("data: {openai_cut}\n\n"),
    )])
    .await;
    let provider = OpenAiProvider::new(upstream.base_url(), None);
    let mut deltas = Vec::new();
    let error = provider
        .stream(&request(), &mut |delta| deltas.push(delta))
        .await
        .unwrap_err();
    assert!(matches!(error, LlmError::Decode { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "openai: unexpected answer: the stream ended before the answer did (no finish reason, no [DONE])"
    );
    assert_eq!(deltas, [StreamDelta::Text("Half an ans".into())]);

    // An answer that ends with [DONE] but no finish reason is whole (some servers omit it).
    let upstream = FakeUpstream::scripted([Reply::event_stream(&[openai_cut])]).await;
    let provider = OpenAiProvider::new(upstream.base_url(), None);
    let response = provider.stream(&request(), &mut |_| {}).await.unwrap();
    assert_eq!(response.message.text(), "Half an ans");

    let anthropic_cut = [
        json!({"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Sun"}}),
    ];
    let upstream = FakeUpstream::scripted([Reply::anthropic_event_stream(&anthropic_cut)]).await;
    let provider = AnthropicProvider::new(upstream.origin(), "key");
    let error = provider.stream(&request(), &mut |_| {}).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "anthropic: unexpected answer: the stream ended before the answer did (no stop reason, no message_stop)"
    );
}
