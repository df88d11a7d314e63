//! The HTTP providers against a local test server over real HTTP: request shape, usage,
//! retries with `Retry-After`, timeouts, streaming.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use contexture_core::{Message, ToolCall};
use contexture_llm::{
    AnthropicProvider, ChatRequest, LlmError, OpenAiProvider, Provider, RetryPolicy, StreamDelta,
    Usage,
};
use serde_json::{Value, json};

/// A canned answer of the test server.
#[derive(Clone)]
struct Canned {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
    delay: Duration,
}

impl Canned {
    fn json(status: u16, body: Value) -> Canned {
        Canned {
            status,
            headers: vec![("content-type", "application/json")],
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    /// A 200 `text/event-stream` answer with this body, as it is.
    fn event_stream(body: String) -> Canned {
        Canned {
            status: 200,
            headers: vec![("content-type", "text/event-stream")],
            body,
            delay: Duration::ZERO,
        }
    }

    /// Anthropic's stream: each event named by its type.
    fn anthropic_sse(events: &[Value]) -> Canned {
        Canned::event_stream(
            events
                .iter()
                .map(|event| {
                    format!(
                        "event: {}\ndata: {event}\n\n",
                        event["type"].as_str().unwrap()
                    )
                })
                .collect(),
        )
    }

    fn sse(events: &[Value]) -> Canned {
        Canned::event_stream(
            events
                .iter()
                .map(|event| format!("data: {event}\n\n"))
                .chain(["data: [DONE]\n\n".to_owned()])
                .collect(),
        )
    }
}

#[derive(Default)]
struct Server {
    answers: Mutex<VecDeque<Canned>>,
    received: Mutex<Vec<(HeaderMap, Value)>>,
}

async fn answer(State(server): State<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).expect("the client sends JSON");
    server.received.lock().unwrap().push((headers, body));
    let canned = server
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Canned::json(500, json!({"error": "no canned answer left"})));
    tokio::time::sleep(canned.delay).await;
    let mut response = (StatusCode::from_u16(canned.status).unwrap(), canned.body).into_response();
    for (name, value) in canned.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// Starts a server on a free loopback port; returns its base URL and its state.
async fn serve(answers: Vec<Canned>) -> (String, Arc<Server>) {
    let server = Arc::new(Server {
        answers: Mutex::new(answers.into()),
        received: Mutex::default(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .route("/v1/messages", post(answer))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), server)
}

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
    let (base, server) = serve(vec![Canned::json(200, openai_answer("Sunny."))]).await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), Some("sk-test-secret".into()));
    let response = provider.complete(&request()).await.unwrap();
    assert_eq!(response.message.text(), "Sunny.");
    assert_eq!(response.usage, Some(Usage::new(21, 5)));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.attempts, 1);

    let received = server.received.lock().unwrap();
    let (headers, body) = &received[0];
    assert_eq!(headers["authorization"], "Bearer sk-test-secret");
    assert_eq!(
        body,
        &json!({
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
    let mut limited = Canned::json(429, json!({"error": {"message": "rate limited"}}));
    limited.headers.push(("retry-after", "0.05"));
    let (base, server) = serve(vec![
        limited.clone(),
        Canned::json(503, json!({"error": "overloaded"})),
        Canned::json(200, openai_answer("Finally.")),
    ])
    .await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None).with_retry(fast_retries(3));
    let started = std::time::Instant::now();
    let response = provider.complete(&request()).await.unwrap();
    assert_eq!(response.message.text(), "Finally.");
    assert_eq!(response.attempts, 3);
    assert_eq!(server.received.lock().unwrap().len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "Retry-After was not honoured"
    );
}

#[tokio::test]
async fn server_errors_exhaust_the_retries() {
    let failing = Canned::json(500, json!({"error": "boom"}));
    let (base, server) = serve(vec![failing.clone(), failing.clone(), failing]).await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None).with_retry(fast_retries(2));
    let error = provider.complete(&request()).await.unwrap_err();
    match &error {
        LlmError::RetriesExhausted { attempts, last } => {
            assert_eq!(*attempts, 3);
            assert!(matches!(**last, LlmError::Status { status: 500, .. }));
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(server.received.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let (base, server) = serve(vec![Canned::json(
        400,
        json!({"error": {"message": "messages[1].content: bad"}}),
    )])
    .await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None).with_retry(fast_retries(3));
    let error = provider.complete(&request()).await.unwrap_err();
    assert!(
        matches!(error, LlmError::Status { status: 400, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("messages[1].content: bad"),
        "{error}"
    );
    assert_eq!(server.received.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn slow_answers_time_out() {
    let mut slow = Canned::json(200, openai_answer("late"));
    slow.delay = Duration::from_secs(3);
    let (base, _server) = serve(vec![slow]).await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None)
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
    let (base, server) = serve(vec![Canned::sse(&events)]).await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None);
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
    let received = server.received.lock().unwrap();
    assert_eq!(received[0].1["stream"], json!(true));
    assert_eq!(
        received[0].1["stream_options"],
        json!({"include_usage": true})
    );
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
    let (base, server) = serve(vec![Canned::json(200, answer)]).await;
    let provider = AnthropicProvider::new(base, "ant-secret");
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

    let received = server.received.lock().unwrap();
    let (headers, body) = &received[0];
    assert_eq!(headers["x-api-key"], "ant-secret");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
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
    let canned = Canned::anthropic_sse(&events);
    let (base, _server) = serve(vec![canned]).await;
    let provider = AnthropicProvider::new(base, "key");
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
    let (base, _server) = serve(vec![Canned::event_stream(format!(
        "data: {openai_cut}\n\n"
    ))])
    .await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None);
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
    let (base, _server) = serve(vec![Canned::sse(&[openai_cut])]).await;
    let provider = OpenAiProvider::new(format!("{base}/v1"), None);
    let response = provider.stream(&request(), &mut |_| {}).await.unwrap();
    assert_eq!(response.message.text(), "Half an ans");

    let anthropic_cut = [
        json!({"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Sun"}}),
    ];
    let (base, _server) = serve(vec![Canned::anthropic_sse(&anthropic_cut)]).await;
    let provider = AnthropicProvider::new(base, "key");
    let error = provider.stream(&request(), &mut |_| {}).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "anthropic: unexpected answer: the stream ended before the answer did (no stop reason, no message_stop)"
    );
}
