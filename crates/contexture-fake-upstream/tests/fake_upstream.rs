//! The fake upstream as its clients see it over HTTP: each kind of reply in each wire
//! format, the fallbacks, the timing, and the record of what was received.

use std::time::{Duration, Instant};

use contexture_fake_upstream::{FakeUpstream, MODEL, Reply};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn post(url: String, body: Value) -> reqwest::Response {
    client().post(url).json(&body).send().await.unwrap()
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "Hi"}]})
}

/// The `data:` payloads of an OpenAI event stream, `[DONE]` included.
fn data_lines(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn unscripted_calls_are_answered_reply_n_whole_or_streamed() {
    let upstream = FakeUpstream::start().await;
    let url = format!("{}/chat/completions", upstream.base_url());
    let whole: Value = post(url.clone(), chat(false)).await.json().await.unwrap();
    assert_eq!(whole["id"], "chatcmpl-1");
    assert_eq!(whole["model"], MODEL);
    assert_eq!(whole["choices"][0]["message"]["content"], "reply 1");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        whole["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    );

    let response = post(url, chat(true)).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let lines = data_lines(&response.text().await.unwrap());
    assert_eq!(lines.last().unwrap(), "[DONE]");
    let events: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "two words and the finish: {events:?}");
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": "reply "})
    );
    assert_eq!(events[1]["choices"][0]["delta"], json!({"content": "2"}));
    assert_eq!(events[2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(events[2]["usage"]["total_tokens"], 12);
    assert!(events.iter().all(|event| event["id"] == "chatcmpl-2"));
    assert_eq!(upstream.call_count(), 2);
}

#[tokio::test]
async fn scripted_replies_come_in_order_then_the_fallback() {
    let upstream = FakeUpstream::scripted([
        Reply::text_in_pieces(["Hel", "lo"]).no_usage(),
        Reply::tool_call("call_1", "weather", json!({"city": "Lisbon"})).usage(50, 10),
    ])
    .await;
    let url = format!("{}/chat/completions", upstream.base_url());
    let text = post(url.clone(), chat(true)).await.text().await.unwrap();
    let lines = data_lines(&text);
    let events: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let pieces: Vec<&str> = events
        .iter()
        .filter_map(|event| event["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(pieces, ["Hel", "lo"]);
    assert!(events.iter().all(|event| event.get("usage").is_none()));

    let called: Value = post(url.clone(), chat(false)).await.json().await.unwrap();
    let message = &called["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(
        message["tool_calls"],
        json!([{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Lisbon\"}"}}])
    );
    assert_eq!(called["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(called["usage"]["prompt_tokens"], 50);

    let exhausted = post(url, chat(false)).await;
    assert_eq!(exhausted.status(), 500);
    let error: Value = exhausted.json().await.unwrap();
    assert_eq!(
        error["error"]["message"],
        "the fake upstream has no reply left"
    );
}

#[tokio::test]
async fn the_messages_route_answers_in_anthropic_format() {
    let upstream = FakeUpstream::start().await;
    upstream
        .push(Reply::text("Let me check.").with_tool_call(
            "toolu_1",
            "weather",
            json!({"city": "Lisbon"}),
        ))
        .push(Reply::text("Sunny, 22°C.").usage(25, 7));
    let url = format!("{}/v1/messages", upstream.origin());
    let whole: Value = post(url.clone(), chat(false)).await.json().await.unwrap();
    assert_eq!(whole["type"], "message");
    assert_eq!(
        whole["content"],
        json!([{"type": "text", "text": "Let me check."},
               {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Lisbon"}}])
    );
    assert_eq!(whole["stop_reason"], "tool_use");
    assert_eq!(
        whole["usage"],
        json!({"input_tokens": 10, "output_tokens": 2})
    );

    let text = post(url, chat(true)).await.text().await.unwrap();
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(text.contains(r#""text":"22°C.""#), "{text}");
    assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
    assert!(text.contains(r#""usage":{"output_tokens":7}"#), "{text}");
}

#[tokio::test]
async fn raw_replies_models_and_unknown_routes() {
    let upstream = FakeUpstream::start().await;
    upstream
        .push(
            Reply::raw(429, "application/json; charset=utf-8", "{ \"error\" : 1 }")
                .header("retry-after", "0.5"),
        )
        .push(Reply::event_stream(&[json!({"a": 1})]))
        .push(Reply::anthropic_event_stream(&[json!({"type": "ping"})]))
        .push_models_reply(Reply::json(502, json!({"error": "bad gateway"})));
    let url = format!("{}/chat/completions", upstream.base_url());
    let limited = post(url.clone(), chat(false)).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "0.5");
    assert_eq!(
        limited.headers()["content-type"],
        "application/json; charset=utf-8"
    );
    assert_eq!(limited.text().await.unwrap(), "{ \"error\" : 1 }");
    let events = post(url.clone(), chat(false)).await.text().await.unwrap();
    assert_eq!(events, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    let named = post(url, chat(false)).await.text().await.unwrap();
    assert_eq!(named, "event: ping\ndata: {\"type\":\"ping\"}\n\n");

    let models = format!("{}/models", upstream.base_url());
    let scripted = client().get(&models).send().await.unwrap();
    assert_eq!(scripted.status(), 502);
    let listed: Value = client()
        .get(&models)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["data"][0]["id"], MODEL);

    let unknown = client()
        .delete(format!("{}/v1/files", upstream.origin()))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let paths: Vec<String> = upstream
        .requests()
        .iter()
        .map(|request| format!("{} {}", request.method, request.path))
        .collect();
    assert_eq!(
        paths,
        [
            "POST /v1/chat/completions",
            "POST /v1/chat/completions",
            "POST /v1/chat/completions",
            "GET /v1/models",
            "GET /v1/models",
            "DELETE /v1/files"
        ]
    );
    assert_eq!(upstream.call_count(), 3);
}

#[tokio::test]
async fn requests_are_recorded_as_they_arrived() {
    let upstream = FakeUpstream::start().await;
    upstream
        .otherwise(|number, request| Reply::text(format!("{number}: {}", request.messages()[0].1)));
    let body = r#"{"model":"m",  "messages":[{"role":"user","content":"Hi"}]}"#;
    let answer: Value = client()
        .post(format!("{}/chat/completions", upstream.base_url()))
        .bearer_auth("sk-test")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "1: Hi");
    let call = upstream.call(0);
    assert_eq!(call.body, body.as_bytes());
    assert_eq!(call.json["model"], "m");
    assert_eq!(call.authorization(), Some("Bearer sk-test"));
    assert_eq!(call.header("Content-Type"), Some("application/json"));
    assert_eq!(call.messages(), [("user".to_owned(), "Hi".to_owned())]);
    assert!(!call.wants_stream());
    assert_eq!(upstream.bodies(), [call.json]);
}

#[tokio::test]
async fn delays_pauses_and_hangs() {
    let upstream = FakeUpstream::start().await;
    upstream
        .push(Reply::text("late").after(Duration::from_millis(300)))
        .push(Reply::text("a b c").pause_after(1, Duration::from_millis(300)))
        .push(Reply::hang());
    let url = format!("{}/chat/completions", upstream.base_url());
    let started = Instant::now();
    post(url.clone(), chat(false)).await.text().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));

    let mut stream = post(url.clone(), chat(true)).await;
    let started = Instant::now();
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"a \""));
    assert!(started.elapsed() < Duration::from_millis(250));
    while stream.chunk().await.unwrap().is_some() {}
    assert!(started.elapsed() >= Duration::from_millis(300));

    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let hung = impatient.post(url).json(&chat(false)).send().await;
    assert!(hung.unwrap_err().is_timeout());
    upstream.wait_for_calls(3, Duration::from_secs(5)).await;
}

#[test]
fn a_synchronous_test_starts_it_on_its_own_runtime() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    let url = format!("{}/chat/completions", upstream.base_url());
    let caller = std::thread::spawn(move || {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { post(url, chat(false)).await.json::<Value>().await.unwrap() })
    });
    upstream.wait_for_calls_blocking(1, Duration::from_secs(10));
    let answer = caller.join().unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "reply 1");
}
