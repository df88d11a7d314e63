//! The pass-through client against the fake upstream over real HTTP: the body and the key
//! forwarded, answers returned byte for byte (whole or streamed chunk by chunk), retries
//! only before anything was handed over, error statuses passed through, stalls; and the
//! answer accumulator on streams split anywhere.

use std::time::{Duration, Instant};

use bytes::Bytes;
use contexture_core::{Content, Message, Part, ToolCall};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{
    Answer, AnswerAccumulator, Passthrough, PassthroughError, UpstreamBody, UpstreamConfig,
    UpstreamResponse, UpstreamStream, Usage, WireFormat, record_stream,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const KEY: &str = "sk-upstream-secret-123";

// ---------------------------------------------------------------------------------------
// Helpers.

/// A 200 event stream sent as `chunks`, with a pause between them so that they arrive apart.
fn sse_chunks(chunks: impl IntoIterator<Item = Bytes>) -> Reply {
    Reply::chunks("text/event-stream", chunks).gap(Duration::from_millis(30))
}

fn config(base_url: &str, retries: u32) -> UpstreamConfig {
    UpstreamConfig {
        base_url: base_url.to_owned(),
        format: WireFormat::OpenAiChat,
        api_key: Some(KEY.to_owned()),
        timeout: Duration::from_secs(10),
        retries,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(2),
    }
}

fn client(base_url: &str, retries: u32) -> Passthrough {
    Passthrough::new(config(base_url, retries)).unwrap()
}

fn request_body(stream: bool) -> Value {
    json!({
        "model": "gpt-4o",
        "temperature": 0.25,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tempo em Lisboa? ☀️"}
        ],
        "stream": stream,
        "stream_options": {"include_usage": true},
        "zeta_unknown_field": {"nested": [1, 2.5, null, "x"]},
        "alpha_unknown_field": true
    })
}

async fn next(stream: &mut UpstreamStream) -> Option<Result<Bytes, PassthroughError>> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

fn full(response: &UpstreamResponse) -> &Bytes {
    match &response.body {
        UpstreamBody::Full(bytes) => bytes,
        UpstreamBody::Stream(_) => panic!("expected a whole body, got a stream"),
    }
}

fn expect_no_secret(text: &str) {
    assert!(!text.contains(KEY), "the key leaked into: {text}");
    assert!(
        !text.contains("upstream-secret"),
        "the key leaked into: {text}"
    );
}

/// The SSE events of a streamed answer: text with multi-byte characters, two parallel tool
/// calls whose arguments come in pieces, a finish reason, usage, `[DONE]`.
fn stream_events() -> Vec<Value> {
    vec![
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Vou ver"}}]}),
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": " o tempo ☀️ — já!"}}]}),
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":"}}]}}]}),
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{\"tz\":\"Europe/"}}]}}]}),
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Lisboa\"}"}}]}}]}),
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "Lisbon\"}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 17, "total_tokens": 48}}),
    ]
}

fn sse_bytes(events: &[Value]) -> Vec<u8> {
    let mut body: String = events
        .iter()
        .map(|event| format!("data: {event}\n\n"))
        .collect();
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

fn expected_stream_answer() -> Answer {
    let mut message = Message::assistant_tool_calls(vec![
        ToolCall::new("call_1", "weather", "{\"city\":\"Lisboa\"}"),
        ToolCall::new("call_2", "time", "{\"tz\":\"Europe/Lisbon\"}"),
    ]);
    message.content = Some(Content::Text("Vou ver o tempo ☀️ — já!".into()));
    Answer {
        message,
        usage: Some(Usage::new(31, 17)),
        model: Some("gpt-4o-2024-08-06".to_owned()),
        finish_reason: Some("tool_calls".to_owned()),
    }
}

/// Splits `bytes` at the given offsets (sorted, deduplicated, clamped).
fn split_at(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|&cut| cut.min(bytes.len())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for cut in cuts {
        pieces.push(bytes[start..cut].to_vec());
        start = cut;
    }
    pieces.push(bytes[start..].to_vec());
    pieces
}

fn fold<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Result<Answer, PassthroughError> {
    let mut accumulator = AnswerAccumulator::new();
    for piece in pieces {
        accumulator.push_sse_bytes(piece);
    }
    accumulator.finish()
}

// ---------------------------------------------------------------------------------------
// Over HTTP.

#[tokio::test]
async fn the_body_is_forwarded_unchanged_with_the_key_as_bearer() {
    let upstream = FakeUpstream::scripted([Reply::json(200, json!({"choices": []}))]).await;
    let base = upstream.base_url();
    let body = request_body(false);
    let response = client(&base, 0).chat_completions(&body).await.unwrap();
    assert_eq!(response.status, 200);

    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(request.headers["content-type"], "application/json");
    // Byte for byte what serializing the value gives (key order kept), and the same value.
    assert_eq!(request.body, Bytes::from(body.to_string()));
    assert_eq!(
        serde_json::from_slice::<Value>(&request.body).unwrap(),
        body
    );
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let sent: Value = serde_json::from_slice(&request.body).unwrap();
    let sent_keys: Vec<&str> = sent
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(sent_keys, keys);
}

#[tokio::test]
async fn no_key_sends_no_authorization() {
    let upstream = FakeUpstream::scripted([Reply::json(200, json!({"choices": []}))]).await;
    let base = upstream.base_url();
    let mut config = config(&base, 0);
    config.api_key = Some(String::new());
    let passthrough = Passthrough::new(config).unwrap();
    passthrough
        .chat_completions(&request_body(false))
        .await
        .unwrap();
    assert!(!upstream.requests()[0].headers.contains_key("authorization"));
}

#[tokio::test]
async fn a_whole_answer_is_returned_byte_for_byte_and_folds_into_an_answer() {
    // Spacing and key order a re-serialization would not keep.
    let raw = "{\n  \"id\": \"chatcmpl-9\",  \"object\": \"chat.completion\", \"model\": \"gpt-4o-2024-08-06\",\n  \"choices\": [ {\"index\": 0, \"message\": {\"role\": \"assistant\", \"content\": \"Sol, 24 °C.\"}, \"finish_reason\": \"stop\"} ],\n  \"usage\": {\"total_tokens\": 26, \"prompt_tokens\": 21, \"completion_tokens\": 5},\n  \"system_fingerprint\": \"fp_x\"\n}\n";
    let upstream =
        FakeUpstream::scripted([Reply::raw(200, "application/json; charset=utf-8", raw)]).await;
    let base = upstream.base_url();
    let response = client(&base, 0)
        .chat_completions(&request_body(false))
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert!(response.is_success());
    assert!(!response.is_event_stream());
    assert_eq!(
        response.content_type.as_deref(),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(full(&response).as_ref(), raw.as_bytes());

    let answer = AnswerAccumulator::from_completion(full(&response)).unwrap();
    assert_eq!(answer.message, Message::assistant("Sol, 24 °C."));
    assert_eq!(answer.usage, Some(Usage::new(21, 5)));
    assert_eq!(answer.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn a_stream_request_answered_whole_is_read_whole() {
    // A server that cannot stream (llama.cpp-style servers with streaming off, small local
    // servers) answers a stream request with a whole completion.
    let raw = r#"{"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Whole."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}"#;
    let upstream = FakeUpstream::scripted([Reply::raw(200, "application/json", raw)]).await;
    let base = upstream.base_url();
    let response = client(&base, 0)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    assert!(!response.is_event_stream());
    let UpstreamBody::Full(bytes) = &response.body else {
        panic!("expected a whole body: {:?}", response.body);
    };
    let answer = AnswerAccumulator::from_completion(bytes).unwrap();
    assert_eq!(answer.message, Message::assistant("Whole."));
    assert_eq!(answer.usage, Some(Usage::new(3, 1)));
}

#[tokio::test]
async fn a_streamed_answer_arrives_in_chunks_in_order_and_folds_at_any_split() {
    let bytes = sse_bytes(&stream_events());
    // Cut inside a `data:` line, inside the multi-byte `☀️`, and between `\n\n`.
    let sun = bytes
        .windows("☀".len())
        .position(|window| window == "☀".as_bytes())
        .unwrap();
    let blank = bytes.windows(2).position(|w| w == b"\n\n").unwrap();
    let sent = split_at(&bytes, &[7, blank + 1, sun + 1, sun + 2, bytes.len() - 3]);
    let upstream =
        FakeUpstream::scripted([sse_chunks(sent.iter().cloned().map(Bytes::from))]).await;
    let base = upstream.base_url();

    let response = client(&base, 2)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert!(response.is_event_stream());
    let UpstreamBody::Stream(mut stream) = response.body else {
        panic!("expected a stream");
    };
    let mut received = Vec::new();
    while let Some(chunk) = next(&mut stream).await {
        received.push(chunk.unwrap());
    }
    assert!(
        received.len() >= 3,
        "expected several chunks, got {}",
        received.len()
    );
    assert_eq!(
        received.concat(),
        bytes,
        "the chunks are the body, in order"
    );
    assert_eq!(upstream.requests().len(), 1);

    let expected = expected_stream_answer();
    assert_eq!(
        fold(received.iter().map(|chunk| chunk.as_ref())),
        Ok(expected.clone())
    );
    assert_eq!(fold([bytes.as_slice()]), Ok(expected.clone()));
    assert_eq!(fold(bytes.chunks(1)), Ok(expected.clone()));
    assert_eq!(fold(bytes.chunks(2)), Ok(expected.clone()));
    assert_eq!(fold(bytes.chunks(7)), Ok(expected));
}

#[tokio::test]
async fn a_server_error_then_success_is_retried() {
    let raw = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).to_string();
    let upstream = FakeUpstream::scripted([
        Reply::json(500, json!({"error": {"message": "boom"}})),
        Reply::raw(200, "application/json", raw.clone()),
    ])
    .await;
    let base = upstream.base_url();
    let response = client(&base, 3)
        .chat_completions(&request_body(false))
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(full(&response).as_ref(), raw.as_bytes());
    assert_eq!(upstream.requests().len(), 2);
    let received = upstream.requests();
    assert_eq!(
        received[0].body, received[1].body,
        "the retry sends the same body"
    );
}

#[tokio::test]
async fn a_streamed_call_is_retried_before_its_first_byte() {
    let bytes = sse_bytes(&stream_events());
    let upstream = FakeUpstream::scripted([
        Reply::json(503, json!({"error": "overloaded"})),
        sse_chunks(split_at(&bytes, &[40]).into_iter().map(Bytes::from)),
    ])
    .await;
    let base = upstream.base_url();
    let response = client(&base, 1)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.body.collect().await.unwrap(), bytes);
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn a_client_error_is_returned_as_is_without_retry() {
    let raw = "{\"error\": {\"message\": \"messages[1].content: bad\", \"type\": \"invalid_request_error\"}}";
    for stream in [false, true] {
        let upstream = FakeUpstream::scripted([Reply::raw(400, "application/json", raw)]).await;
        let base = upstream.base_url();
        let response = client(&base, 3)
            .chat_completions(&request_body(stream))
            .await
            .unwrap();
        assert_eq!(response.status, 400, "stream: {stream}");
        assert!(!response.is_success());
        assert_eq!(response.content_type.as_deref(), Some("application/json"));
        assert_eq!(full(&response).as_ref(), raw.as_bytes(), "stream: {stream}");
        assert_eq!(upstream.requests().len(), 1, "stream: {stream}");
        assert!(matches!(
            AnswerAccumulator::from_completion(full(&response)),
            Err(PassthroughError::Reported { .. })
        ));
    }
}

#[tokio::test]
async fn a_rate_limit_is_retried_honouring_retry_after() {
    let upstream = FakeUpstream::scripted([
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("retry-after", "0.4"),
        Reply::json(200, json!({"choices": []})),
    ])
    .await;
    let base = upstream.base_url();
    let started = Instant::now();
    let response = client(&base, 2)
        .chat_completions(&request_body(false))
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(upstream.requests().len(), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "Retry-After was not honoured: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_last_error_status_is_returned_when_retries_run_out() {
    let upstream = FakeUpstream::scripted([
        Reply::json(503, json!({"error": "first"})),
        Reply::json(503, json!({"error": "second"})),
        Reply::json(503, json!({"error": "third"})).header("retry-after", "1"),
    ])
    .await;
    let base = upstream.base_url();
    let response = client(&base, 2)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    assert_eq!(response.status, 503);
    assert_eq!(full(&response).as_ref(), br#"{"error":"third"}"#);
    assert_eq!(upstream.requests().len(), 3);
}

#[tokio::test]
async fn a_stalled_stream_ends_with_an_error_item() {
    let stalling = sse_chunks([
        Bytes::from_static(
            b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hel\"}}]}\n\n",
        ),
        Bytes::from_static(
            b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"lo\"}}]}\n\n",
        ),
    ])
    .pause_after(2, Duration::from_secs(5));
    let upstream = FakeUpstream::scripted([stalling]).await;
    let base = upstream.base_url();
    let mut config = config(&base, 3);
    config.timeout = Duration::from_millis(400);
    let response = Passthrough::new(config)
        .unwrap()
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    let UpstreamBody::Stream(mut stream) = response.body else {
        panic!("expected a stream");
    };
    let mut chunks = Vec::new();
    let error = loop {
        match next(&mut stream).await {
            Some(Ok(chunk)) => chunks.push(chunk),
            Some(Err(error)) => break error,
            None => panic!("the stream ended without an error"),
        }
    };
    assert_eq!(
        error,
        PassthroughError::Stalled {
            timeout: Duration::from_millis(400)
        }
    );
    assert!(
        next(&mut stream).await.is_none(),
        "the error ends the stream"
    );
    assert_eq!(chunks.len(), 2);
    // What arrived is an answer cut short, not a whole one.
    match fold(chunks.iter().map(|chunk| chunk.as_ref())) {
        Err(PassthroughError::Truncated { partial }) => {
            assert_eq!(partial.map(|m| *m), Some(Message::assistant("Hello")));
        }
        other => panic!("not a truncated answer: {other:?}"),
    }
    assert_eq!(
        upstream.requests().len(),
        1,
        "no retry once bytes were handed over"
    );
}

#[tokio::test]
async fn slow_headers_time_out_and_are_retried() {
    let slow = Reply::json(200, json!({"choices": []})).after(Duration::from_secs(3));
    let upstream = FakeUpstream::scripted([slow.clone(), Reply::json(200, json!({"ok": 1}))]).await;
    let base = upstream.base_url();
    let mut retrying = config(&base, 1);
    retrying.timeout = Duration::from_millis(300);
    let response = Passthrough::new(retrying)
        .unwrap()
        .chat_completions(&request_body(false))
        .await
        .unwrap();
    assert_eq!(full(&response).as_ref(), br#"{"ok":1}"#);
    assert_eq!(upstream.requests().len(), 2);

    let upstream = FakeUpstream::scripted([slow]).await;
    let base = upstream.base_url();
    let mut once = config(&base, 0);
    once.timeout = Duration::from_millis(300);
    let error = Passthrough::new(once)
        .unwrap()
        .chat_completions(&request_body(false))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        PassthroughError::Timeout {
            timeout: Duration::from_millis(300)
        }
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_connection_error_after_retries() {
    // Bind and drop a listener so the port is (almost certainly) closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let error = client(&format!("http://{address}/v1"), 1)
        .chat_completions(&request_body(false))
        .await
        .unwrap_err();
    match &error {
        PassthroughError::RetriesExhausted { attempts, last } => {
            assert_eq!(*attempts, 2);
            assert!(
                matches!(**last, PassthroughError::Connection { .. }),
                "{last}"
            );
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(
        error.to_string().to_lowercase().contains("connect"),
        "the cause is named: {error}"
    );
    expect_no_secret(&error.to_string());
    expect_no_secret(&format!("{error:?}"));
}

#[tokio::test]
async fn models_are_returned_as_received() {
    let raw = "{\"object\":\"list\",\"data\":[{\"id\":\"gpt-4o\",\"object\":\"model\"}]}";
    let upstream = FakeUpstream::start().await;
    upstream
        .push_models_reply(Reply::json(502, json!({"error": "bad gateway"})))
        .push_models_reply(Reply::raw(200, "application/json", raw));
    let base = upstream.base_url();
    let response = client(&format!("{base}/"), 1).models().await.unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(full(&response).as_ref(), raw.as_bytes());
    let received = upstream.requests();
    assert_eq!(received.len(), 2);
    assert_eq!(received[1].method, "GET");
    assert_eq!(received[1].path, "/v1/models");
    assert_eq!(
        received[1].headers["authorization"],
        format!("Bearer {KEY}")
    );
    assert!(received[1].body.is_empty());
}

#[tokio::test]
async fn a_recorded_stream_passes_chunks_through_and_reports_the_answer() {
    let bytes = sse_bytes(&stream_events());
    let upstream = FakeUpstream::scripted([sse_chunks(
        split_at(&bytes, &[3, 100, 101, 250])
            .into_iter()
            .map(Bytes::from),
    )])
    .await;
    let base = upstream.base_url();
    let response = client(&base, 0)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    let UpstreamBody::Stream(stream) = response.body else {
        panic!("expected a stream");
    };
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let recorded = record_stream(stream, WireFormat::OpenAiChat, move |answer| {
        sender.send(answer).unwrap();
    });
    let passed = UpstreamBody::Stream(recorded).collect().await.unwrap();
    assert_eq!(passed, bytes);
    assert_eq!(receiver.await.unwrap(), Ok(expected_stream_answer()));
}

#[tokio::test]
async fn a_recorded_stream_dropped_early_reports_the_interruption() {
    let stalling = sse_chunks([Bytes::from_static(
        b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"Hel\"}}]}\n\n",
    )])
    .pause_after(1, Duration::from_secs(5));
    let upstream = FakeUpstream::scripted([stalling]).await;
    let base = upstream.base_url();
    let response = client(&base, 0)
        .chat_completions(&request_body(true))
        .await
        .unwrap();
    let UpstreamBody::Stream(stream) = response.body else {
        panic!("expected a stream");
    };
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let mut recorded = record_stream(stream, WireFormat::OpenAiChat, move |answer| {
        sender.send(answer).unwrap();
    });
    assert!(next(&mut recorded).await.unwrap().is_ok());
    drop(recorded);
    // What had arrived of the answer comes with the interruption.
    match receiver.await.unwrap() {
        Err(PassthroughError::Interrupted { partial }) => {
            let partial = partial.expect("the first chunk's text");
            assert_eq!(partial.text(), "Hel");
        }
        other => panic!("not an interruption: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Secrets, configuration, answers without HTTP.

#[test]
fn secrets_stay_out_of_debug_and_errors() {
    let config = config("https://user:pa55word@upstream.example/v1", 2);
    expect_no_secret(&format!("{config:?}"));
    assert!(!format!("{config:?}").contains("pa55word"));
    let passthrough = Passthrough::new(config.clone()).unwrap();
    let debug = format!("{passthrough:?}");
    expect_no_secret(&debug);
    assert!(!debug.contains("pa55word"), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(debug.contains("upstream.example"), "{debug}");

    // A key that cannot go in a header is refused without being quoted.
    let mut bad = config.clone();
    bad.api_key = Some(format!("{KEY}\n"));
    let error = Passthrough::new(bad).unwrap_err();
    assert!(
        matches!(error, PassthroughError::InvalidConfig { .. }),
        "{error}"
    );
    expect_no_secret(&error.to_string());
    expect_no_secret(&format!("{error:?}"));

    // Every error variant's text, as built by the client, holds no key.
    let errors = [
        PassthroughError::Timeout {
            timeout: Duration::from_secs(1),
        },
        PassthroughError::Stalled {
            timeout: Duration::from_secs(1),
        },
        PassthroughError::RetriesExhausted {
            attempts: 2,
            last: Box::new(PassthroughError::Connection {
                detail: "refused".into(),
            }),
        },
        PassthroughError::Interrupted { partial: None },
        PassthroughError::Truncated { partial: None },
        PassthroughError::NoChoice,
    ];
    for error in errors {
        expect_no_secret(&error.to_string());
        expect_no_secret(&format!("{error:?}"));
    }
}

#[test]
fn bad_configurations_are_refused() {
    for (base_url, timeout) in [
        ("not a url", Duration::from_secs(1)),
        ("ftp://h/v1", Duration::from_secs(1)),
        ("http://h/v1", Duration::ZERO),
    ] {
        let mut config = UpstreamConfig::new(base_url, None);
        config.timeout = timeout;
        assert!(
            matches!(
                Passthrough::new(config),
                Err(PassthroughError::InvalidConfig { .. })
            ),
            "{base_url} {timeout:?}"
        );
    }
    let defaults = UpstreamConfig::new("http://h/v1", None);
    assert_eq!(defaults.timeout, Duration::from_secs(60));
    assert_eq!(defaults.retries, 3);
}

#[test]
fn answers_that_cannot_be_folded_are_errors() {
    // Whole answers.
    assert_eq!(
        AnswerAccumulator::from_completion(br#"{"choices": []}"#),
        Err(PassthroughError::NoChoice)
    );
    assert!(matches!(
        AnswerAccumulator::from_completion(b"<html>"),
        Err(PassthroughError::Malformed { .. })
    ));
    assert!(matches!(
        AnswerAccumulator::from_completion(br#"{"choices": [{"index": 0}]}"#),
        Err(PassthroughError::Malformed { .. })
    ));
    // Streams.
    assert_eq!(fold([b"".as_slice()]), Err(PassthroughError::NoChoice));
    assert_eq!(
        fold([sse_bytes(&[
            json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0}})
        ])
        .as_slice()]),
        Err(PassthroughError::NoChoice)
    );
    assert!(matches!(
        fold([
            b"data: {\"choices\": [{\"index\": 0, \"delta\": {}}]}\n\ndata: {oops\n\n".as_slice()
        ]),
        Err(PassthroughError::Malformed { .. })
    ));
    assert!(matches!(
        fold([b"data: {\"error\": {\"message\": \"overloaded\"}}\n\n".as_slice()]),
        Err(PassthroughError::Reported { .. })
    ));
}

#[test]
fn whole_answers_keep_tool_calls_and_reasoning() {
    let body = json!({
        "model": "m",
        "choices": [
            {"index": 1, "message": {"role": "assistant", "content": "other choice"}},
            {"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}
            ]}, "finish_reason": "tool_calls"}
        ]
    });
    let answer = AnswerAccumulator::from_completion(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        answer.message.tool_calls,
        vec![ToolCall::new("call_9", "search", "{\"q\":\"x\"}")]
    );
    assert_eq!(answer.usage, None);
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));

    // A stream with reasoning, CRLF line ends and a second choice that is ignored.
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}]}\r\n\r\n\
                  data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"ignored\"}}]}\r\n\r\n\
                  data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"said\"},\"finish_reason\":\"stop\"}]}\r\n\r\n\
                  data: [DONE]\r\n\r\n";
    let answer = fold(stream.as_bytes().chunks(1)).unwrap();
    assert_eq!(
        answer.message.content,
        Some(Content::Parts(vec![
            Part::reasoning("think"),
            Part::text("said")
        ]))
    );
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
}

// ---------------------------------------------------------------------------------------
// Property: any split of a valid stream folds into the same answer.

/// A random streamed answer: text pieces (any Unicode), tool calls whose arguments come in
/// pieces, optional usage; and the line end used.
fn arb_stream() -> impl Strategy<Value = (Vec<u8>, String, Vec<ToolCall>)> {
    let texts = prop::collection::vec("\\PC{0,8}", 0..6);
    let calls = prop::collection::vec(
        ("[a-z_]{1,8}", prop::collection::vec("\\PC{0,6}", 1..4)),
        0..3,
    );
    (texts, calls, any::<bool>(), any::<bool>()).prop_map(|(texts, calls, crlf, usage)| {
        let mut events = Vec::new();
        for text in &texts {
            events.push(json!({"model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}));
        }
        let mut expected_calls = Vec::new();
        for (index, (name, pieces)) in calls.iter().enumerate() {
            let id = format!("call_{index}");
            for (n, piece) in pieces.iter().enumerate() {
                let call = if n == 0 {
                    json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": piece}})
                } else {
                    json!({"index": index, "function": {"arguments": piece}})
                };
                events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}));
            }
            expected_calls.push(ToolCall::new(id, name.clone(), pieces.concat()));
        }
        events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        if usage {
            events.push(json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}));
        }
        let mut bytes = sse_bytes(&events);
        if crlf {
            bytes = String::from_utf8(bytes).unwrap().replace('\n', "\r\n").into_bytes();
        }
        (bytes, texts.concat(), expected_calls)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_split_of_a_stream_folds_into_the_same_answer(
        (bytes, text, calls) in arb_stream(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let whole = fold([bytes.as_slice()]).unwrap();
        prop_assert_eq!(&whole.message.tool_calls, &calls);
        if calls.is_empty() || !text.is_empty() {
            prop_assert_eq!(whole.message.text(), text);
        }
        let cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
        let pieces = split_at(&bytes, &cuts);
        let split = fold(pieces.iter().map(Vec::as_slice)).unwrap();
        prop_assert_eq!(&split, &whole);
    }
}
