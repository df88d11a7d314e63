//! The Anthropic Messages door over real sockets: stateless turns fitted and forwarded to an
//! OpenAI-compatible upstream (answers written as Anthropic messages and named events) or to
//! an Anthropic one (answers as written); turns of a named thread stored and replayed;
//! errors in Anthropic's shape, from the body's check to the key's; tenancy and hostile
//! bodies.

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_server::{RoutedUpstream, UpstreamKind};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::responses::events;

/// A server over `openai`, its `claude-*` models routed to `anthropic` when given.
pub(crate) async fn server(
    openai: &FakeUpstream,
    anthropic: Option<&FakeUpstream>,
) -> (TempDir, TestServer, String) {
    let mut config = config(Some(&openai.base_url()));
    if let Some(anthropic) = anthropic {
        config.upstreams.push(RoutedUpstream {
            models: vec!["claude-*".into()],
            kind: UpstreamKind::Anthropic,
            base_url: Some(anthropic.origin().to_owned()),
            api_key: Some("sk-ant-server".into()),
            timeout_secs: 10.0,
            retries: 0,
        });
    }
    let dir = TempDir::new("contexture-messages");
    let store = SqliteStore::open(dir.join("messages.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (dir, server, key)
}

/// A `POST /v1/messages` with the key as `x-api-key`, as Anthropic's SDKs send it.
pub(crate) async fn post(
    server: &TestServer,
    key: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> reqwest::Response {
    let mut request = client()
        .post(server.url("/v1/messages"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

pub(crate) async fn message(server: &TestServer, key: &str, body: Value) -> (StatusCode, Value) {
    let response = post(server, key, &[], body).await;
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The text of a message's text blocks.
pub(crate) fn text(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content: {message}"))
        .iter()
        .filter(|block| block["type"] == "text")
        .filter_map(|block| block["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_stateless_turn_to_an_openai_upstream_is_answered_as_a_message() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::text("Sunny.").usage(25, 2));
    openai.push(Reply::tool_call(
        "call_1",
        "weather",
        json!({"city": "Lisbon"}),
    ));
    let (_dir, server, key) = server(&openai, None).await;
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "system": [{"type": "text", "text": "Be brief."}],
               "messages": [{"role": "user", "content": "Weather in Lisbon?"}],
               "temperature": 0.3, "some_future_field": {"ignored": true}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert!(answer["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(text(&answer), "Sunny.");
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["usage"]["input_tokens"], 25);
    assert_eq!(answer["usage"]["output_tokens"], 2);
    let sent = openai.call(0).json;
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": [{"type": "text", "text": "Be brief."}]})
    );
    assert_eq!(sent["max_tokens"], 300);
    assert_eq!(sent["temperature"], 0.3);
    assert!(sent.get("some_future_field").is_none());
    assert_eq!(
        openai.call(0).authorization(),
        Some("Bearer sk-upstream-secret")
    );

    // A tool call comes back as a tool_use block.
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "tools": [{"name": "weather", "description": "Look it up.",
                          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
               "messages": [{"role": "user", "content": "Weather in Lisbon?"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["stop_reason"], "tool_use");
    let block = &answer["content"][0];
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["id"], "call_1");
    assert_eq!(block["input"], json!({"city": "Lisbon"}));
    assert_eq!(
        openai.call(1).json["tools"][0]["function"]["name"],
        "weather"
    );

    // Nothing was stored.
    let (_, threads) = server.call(&key, "GET", "/v1/threads", None).await;
    assert_eq!(threads["threads"], json!([]), "{threads}");
}

#[tokio::test]
async fn a_stream_from_an_openai_upstream_is_written_as_anthropics_named_events() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::text_in_pieces(["Sun", "ny."]).usage(9, 2));
    let (_dir, server, key) = server(&openai, None).await;
    let response = post(
        &server,
        &key,
        &[],
        json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
               "messages": [{"role": "user", "content": "Weather?"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.text().await.unwrap();
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{body}"
    );
    let text: String = events
        .iter()
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Sunny.");
    let (_, delta) = &events[6];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn an_anthropic_upstreams_answer_comes_back_as_it_was_written() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text("Claude here.").usage(11, 3));
    let (_dir, server, key) = server(&openai, Some(&anthropic)).await;
    let thinking = json!({"type": "thinking", "thinking": "Earlier thought.",
                          "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk"});
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 200,
               "thinking": {"type": "enabled", "budget_tokens": 1024},
               "messages": [
                   {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": [thinking.clone(), {"type": "text", "text": "Hello."}]},
                   {"role": "user", "content": "Who are you?"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(text(&answer), "Claude here.");
    assert_eq!(openai.call_count(), 0);
    let call = anthropic.call(0);
    assert_eq!(call.path, "/v1/messages");
    assert_eq!(call.header("x-api-key"), Some("sk-ant-server"));
    assert_eq!(call.json["thinking"]["budget_tokens"], 1024);
    // The thinking block and its signature reach the upstream byte for byte.
    assert_eq!(call.json["messages"][1]["content"][0], thinking);
}

#[tokio::test]
async fn a_named_thread_keeps_the_turns_and_a_keyed_retry_is_replayed() {
    let openai = FakeUpstream::start().await;
    let (_dir, server, key) = server(&openai, None).await;
    let headers = [
        ("x-contexture-thread", "support"),
        ("idempotency-key", "turn-1"),
    ];
    let first = json!({"model": "gpt-4o-mini", "max_tokens": 100,
                       "messages": [{"role": "user", "content": "My name is Ada."}]});
    let response = post(&server, &key, &headers, first.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-contexture-thread"], "support");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(text(&answer), "reply 1");

    // The same key and body: the stored answer, not another call.
    let response = post(&server, &key, &headers, first).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-contexture-replayed"], "true");
    let again: Value = response.json().await.unwrap();
    assert_eq!(text(&again), "reply 1");
    assert_eq!(openai.call_count(), 1);

    // The next turn sends only what is new; the thread brings the rest.
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 100,
               "metadata": {"contexture_thread": "support"},
               "messages": [{"role": "user", "content": "What is my name?"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let sent: Vec<String> = openai.call(1).json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(sent, ["My name is Ada.", "reply 1", "What is my name?"]);
    assert!(openai.call(1).json.get("metadata").is_none());

    // Another tenant's thread of the same name is its own.
    let other = server.key("globex").await;
    let (status, _) = message(
        &server,
        &other,
        json!({"model": "gpt-4o-mini", "max_tokens": 100,
               "metadata": {"contexture_thread": "support"},
               "messages": [{"role": "user", "content": "Hello?"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let sent = openai.call(2).json["messages"].clone();
    assert_eq!(sent.as_array().unwrap().len(), 1, "{sent}");
}

#[tokio::test]
async fn errors_have_anthropics_shape_and_name_the_field() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::error(429, "slow down"));
    let (_dir, server, key) = server(&openai, None).await;
    let table = [
        (json!([1, 2]), "body"),
        (json!({"model": "m", "messages": []}), "max_tokens: missing"),
        (
            json!({"model": "m", "max_tokens": 0, "messages": []}),
            "max_tokens: must be a whole number above 0",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [],
                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type: `web_search_20250305`",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [],
                   "context_management": {"edits": [{"type": "clear_everything"}]}}),
            "context_management.edits[0].type: `clear_everything` is not a context edit",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [],
                   "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
                                                     "keep": {"type": "tool_uses", "value": "3"}}]}}),
            "context_management.edits[0].keep.value",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [],
                   "metadata": {"contexture_thread": 7}}),
            "metadata.contexture_thread",
        ),
    ];
    for (body, expected) in table {
        let (status, error) = message(&server, &key, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    // A method the path does not take.
    let response = client()
        .get(server.url("/v1/messages"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["error"]["type"], "not_found_error", "{error}");
    assert_eq!(error["error"]["message"], "/v1/messages does not take GET");
    // A body nested past any sense, and one that is not JSON.
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let response = client()
        .post(server.url("/v1/messages"))
        .header("x-api-key", &key)
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    // Without a key, and with a key that is not one.
    for key in [None, Some("ctx_not_a_key")] {
        let mut request = client()
            .post(server.url("/v1/messages"))
            .json(&json!({"model": "m", "max_tokens": 5, "messages": []}));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "authentication_error", "{error}");
    }
    // The upstream's refusal keeps its status.
    let (status, error) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("slow down")
    );
    // Other paths keep OpenAI's shape.
    let (status, error) = server
        .call(
            &key,
            "POST",
            "/v1/chat/completions",
            Some(json!({"messages": []})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"]["code"].is_string(), "{error}");
}

#[tokio::test]
async fn count_tokens_is_the_count_the_door_fits_with() {
    let openai = FakeUpstream::start().await;
    let (_dir, server, key) = server(&openai, None).await;
    let request = json!({
        "model": "gpt-4o-mini", "max_tokens": 100,
        "system": "You answer questions about the weather.",
        "tools": [{"name": "weather", "description": "Look the weather up.",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "Weather in Lisbon tomorrow?"}],
    });
    let count = |body: Value| {
        let server = &server;
        let key = key.clone();
        async move {
            let response = client()
                .post(server.url("/v1/messages/count_tokens"))
                .header("x-api-key", key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, counted) = count(request.clone()).await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    let tokens = counted["input_tokens"].as_u64().unwrap();
    assert!(tokens > 20, "{counted}");

    // The same request as a thread's turn: its record's input tokens are that count.
    let response = post(
        &server,
        &key,
        &[("x-contexture-thread", "counted")],
        request.clone(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let (_, page) = server
        .call(&key, "GET", "/v1/threads/counted/events", None)
        .await;
    let record = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["type"] == "request_started")
        .unwrap_or_else(|| panic!("no request record: {page}"))
        .clone();
    assert_eq!(record["budget"]["input_tokens"], tokens, "{record}");

    // Without the tools it is less; max_tokens may be left out; a bad body is named.
    let mut bare = request.clone();
    bare.as_object_mut().unwrap().remove("tools");
    bare.as_object_mut().unwrap().remove("max_tokens");
    let (status, fewer) = count(bare).await;
    assert_eq!(status, StatusCode::OK, "{fewer}");
    assert!(fewer["input_tokens"].as_u64().unwrap() < tokens);
    let (status, error) = count(json!({"model": "no-such-model", "messages": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    let (status, error) = count(json!({"model": "gpt-4o-mini"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages: missing"),
        "{error}"
    );
    assert_eq!(openai.call_count(), 1, "counting calls no upstream");
}

#[tokio::test]
async fn a_stream_asked_of_an_upstream_that_answers_whole_is_still_written_as_events() {
    let openai = FakeUpstream::start().await;
    // Some OpenAI-compatible servers ignore `stream` and answer with the whole completion.
    openai.push(Reply::json(
        200,
        json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "Whole."}}],
               "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}),
    ));
    let (_dir, server, key) = server(&openai, None).await;
    let response = post(
        &server,
        &key,
        &[],
        json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
               "messages": [{"role": "user", "content": "Weather?"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "the client asked for a stream"
    );
    let body = response.text().await.unwrap();
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{body}");
    assert_eq!(names.last(), Some(&"message_stop"), "{body}");
    let text: String = events
        .iter()
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Whole.");
}
