//! The OpenAI-compatible endpoint over real sockets, against a fake upstream: the thread
//! keeps the history, requests are fitted to the model's window, streaming is passed through,
//! answers are stored, upstream errors come back as they were, keys stay secret.

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn server(
    upstream: &str,
    tweak: impl FnOnce(&mut contexture_server::ServerConfig),
) -> (TempDir, TestServer, String) {
    let dir = TempDir::new("contexture-chat");
    let store = SqliteStore::open(dir.join("chat.db")).await.unwrap();
    let mut config = config(Some(upstream));
    tweak(&mut config);
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (dir, server, key)
}

/// A chat-completions call to the server, naming `thread` when given.
pub(crate) async fn chat(
    server: &TestServer,
    key: &str,
    thread: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut request = client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body);
    if let Some(thread) = thread {
        request = request.header("X-Contexture-Thread", thread);
    }
    request.send().await.unwrap()
}

/// `GET path` with `key`: the JSON answer (an error body too; null when it is not JSON).
async fn get_json(server: &TestServer, key: &str, path: &str) -> Value {
    client()
        .get(server.url(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or(Value::Null)
}

/// The first 1,000 events of `thread` as the API answers them (an error body when it does not
/// exist).
async fn events_page(server: &TestServer, key: &str, thread: &str) -> Value {
    get_json(
        server,
        key,
        &format!("/v1/threads/{thread}/events?limit=1000"),
    )
    .await
}

/// The events of `thread` (its first 1,000) whose type is `kind`, as the API shows them.
async fn events_of_type(server: &TestServer, key: &str, thread: &str, kind: &str) -> Vec<Value> {
    let page = events_page(server, key, thread).await;
    page["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events page: {page}"))
        .iter()
        .filter(|event| event["type"] == kind)
        .cloned()
        .collect()
}

async fn stored_messages(server: &TestServer, key: &str, thread: &str) -> Vec<(String, String)> {
    events_of_type(server, key, thread, "message_appended")
        .await
        .iter()
        .map(|event| {
            (
                event["message"]["role"].as_str().unwrap().to_owned(),
                event["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(r, c)| (r.to_string(), c.to_string()))
        .collect()
}

#[tokio::test]
async fn the_thread_keeps_the_history_for_a_client_that_sends_only_new_turns() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    for (turn, question) in ["What is Rust?", "Who made it?", "When?"]
        .iter()
        .enumerate()
    {
        let mut body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}], "temperature": 0});
        if turn == 0 {
            body["messages"] = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]);
        }
        let response = chat(&server, &key, Some("conv-1"), body).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-contexture-thread"], "conv-1");
        let answer: Value = response.json().await.unwrap();
        // The upstream's response, unchanged.
        assert_eq!(answer["id"], format!("chatcmpl-{}", turn + 1));
        assert_eq!(
            answer["choices"][0]["message"]["content"],
            format!("reply {}", turn + 1)
        );
    }
    let expected = pairs(&[
        ("system", "Be brief."),
        ("user", "What is Rust?"),
        ("assistant", "reply 1"),
        ("user", "Who made it?"),
        ("assistant", "reply 2"),
        ("user", "When?"),
    ]);
    assert_eq!(
        upstream.call(2).messages(),
        expected,
        "the third request carries the history"
    );
    assert_eq!(
        upstream.bodies()[2]["temperature"],
        0,
        "other fields are forwarded"
    );
    let mut all = expected.clone();
    all.push(("assistant".into(), "reply 3".into()));
    assert_eq!(stored_messages(&server, &key, "conv-1").await, all);
    // The upstream got the server's key, never the client's.
    for call in upstream.calls() {
        assert_eq!(call.authorization(), Some("Bearer sk-upstream-secret"));
    }

    // A client that resends the whole conversation adds only what is new.
    let mut resent = all
        .iter()
        .map(|(r, c)| json!({"role": r, "content": c}))
        .collect::<Vec<_>>();
    resent.push(json!({"role": "user", "content": "Thanks!"}));
    let response = chat(&server, &key, None, json!({"model": "gpt-4o-mini", "messages": resent, "metadata": {"contexture_thread": "conv-1"}})).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        upstream.bodies()[3].get("metadata").is_none(),
        "our key is taken out of metadata"
    );
    let stored = stored_messages(&server, &key, "conv-1").await;
    assert_eq!(stored.len(), 9, "{stored:?}");
    assert_eq!(stored[7], ("user".to_owned(), "Thanks!".to_owned()));
    // The header and the metadata must not name two threads; the metadata's other keys are
    // the upstream's.
    let response = chat(&server, &key, Some("conv-1"), json!({"model": "gpt-4o-mini", "messages": resent, "metadata": {"contexture_thread": "conv-2", "user": "u"}})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["param"], "x-contexture-thread", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`conv-1`"),
        "{error}"
    );
    let unknown = chat(&server, &key, Some("conv-9"), json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "metadata": {"contexture_thread": "conv-9", "user": "u"}})).await;
    assert_eq!(unknown.status(), StatusCode::OK);
    assert_eq!(
        upstream.bodies()[4]["metadata"],
        json!({"user": "u"}),
        "the rest of metadata is forwarded"
    );

    // The chat requests are recorded with exactly what was sent.
    let started = events_of_type(&server, &key, "conv-1", "request_started").await;
    assert_eq!(started.len(), 4);
    assert_eq!(started[2]["messages"].as_array().unwrap().len(), 6);
    assert!(started[2]["breakdown"]["used"].as_u64().unwrap() > 0);
    server.shutdown().await;
}

#[tokio::test]
async fn requests_are_fitted_to_the_models_window_and_every_turn_is_stored() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let dir = TempDir::new("contexture-models");
    let models = dir.join("models.toml");
    std::fs::write(&models, "[models.\"tiny-llm\"]\ncontext_window = 400\nmax_output_tokens = 100\nencoding = \"cl100k_base\"\n").unwrap();
    let (_dir, server, key) =
        server(&base, |config| config.models_file = Some(models.clone())).await;
    for i in 0..12 {
        let question = format!(
            "Question number {i}: please describe the state of the shipment to warehouse {i} in detail."
        );
        let response = chat(
            &server,
            &key,
            Some("long"),
            json!({"model": "tiny-llm", "messages": [{"role": "user", "content": question}]}),
        )
        .await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{}",
            response.text().await.unwrap()
        );
    }
    let last = upstream.call(11).messages();
    assert!(
        last.len() < 23,
        "the history was trimmed to fit: {} messages",
        last.len()
    );
    assert_eq!(
        last.last().unwrap().1,
        "Question number 11: please describe the state of the shipment to warehouse 11 in detail."
    );
    let tokens: usize = last.iter().map(|(_, c)| c.split_whitespace().count()).sum();
    assert!(tokens < 300, "{tokens}");
    assert_eq!(
        stored_messages(&server, &key, "long").await.len(),
        24,
        "nothing is lost from the thread"
    );
    // An unknown model cannot be fitted: a 400 naming the field, and nothing sent.
    let sent = upstream.bodies().len();
    let response = chat(
        &server,
        &key,
        Some("long"),
        json!({"model": "mystery-model", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["param"], "model");
    assert_eq!(upstream.bodies().len(), sent);
    let metrics = server.metrics().await;
    let trims = metrics
        .lines()
        .find(|l| l.starts_with("contexture_trims_total"))
        .unwrap();
    assert_ne!(trims, "contexture_trims_total 0", "{metrics}");
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_is_passed_through_and_the_answer_stored() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::text("The answer is forty two."));
    let (_dir, server, key) = server(&base, |_| {}).await;
    let response = chat(&server, &key, Some("s1"), json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Answer?"}]})).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = response.text().await.unwrap();
    let chunks: Vec<&str> = text
        .split("\n\n")
        .filter(|c| c.starts_with("data: {"))
        .collect();
    assert_eq!(chunks.len(), 6, "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let mut content = String::new();
    for chunk in &chunks {
        let value: Value = serde_json::from_str(&chunk["data: ".len()..]).unwrap();
        content.push_str(
            value["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default(),
        );
    }
    assert_eq!(content, "The answer is forty two.");
    // The answer is recorded once the stream has been passed through.
    let mut stored = Vec::new();
    for _ in 0..50 {
        stored = stored_messages(&server, &key, "s1").await;
        if stored.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        stored,
        pairs(&[
            ("user", "Answer?"),
            ("assistant", "The answer is forty two.")
        ])
    );
    server.shutdown().await;
}

#[tokio::test]
async fn without_a_thread_it_is_a_transparent_proxy_and_upstream_errors_pass_through() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    let body = json!({"model": "anything-at-all", "messages": [{"role": "user", "content": "hi"}], "metadata": {"user": "u1"}, "n": 1});
    let response = chat(&server, &key, None, body.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(upstream.bodies()[0], body, "forwarded unchanged");

    upstream.push(Reply::json(
        400,
        json!({"error": {"message": "bad temperature", "type": "invalid_request_error"}}),
    ));
    let response = chat(
        &server,
        &key,
        Some("t-err"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["message"], "bad temperature");
    // The user's message is kept; no answer was added; the failure is recorded.
    assert_eq!(
        stored_messages(&server, &key, "t-err").await,
        pairs(&[("user", "hello")])
    );
    let page: Value = get_json(&server, &key, "/v1/threads/t-err/events").await;
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "request_ended" && e["outcome"] == "failed"),
        "{page}"
    );

    let models: Value = get_json(&server, &key, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "gpt-4o-mini");
    // Malformed: 400 naming the field, nothing forwarded.
    let sent = upstream.bodies().len();
    let response = chat(&server, &key, Some("t-err"), json!({"model": "gpt-4o-mini", "messages": [{"role": "user"}, {"role": "robot", "content": "x"}]})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages[1]"),
        "{error}"
    );
    assert_eq!(upstream.bodies().len(), sent);
    server.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_and_loses_nothing() {
    let (_dir, server, key) = server("http://127.0.0.1:9/v1", |_| {}).await;
    let response = chat(
        &server,
        &key,
        Some("down"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "still there?"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let text = response.text().await.unwrap();
    assert!(!text.contains("sk-upstream-secret"), "{text}");
    assert_eq!(
        stored_messages(&server, &key, "down").await,
        pairs(&[("user", "still there?")])
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_long_chat_thread_is_compacted_by_the_policy() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |config| {
        config.compaction = Some(
            serde_json::from_value(json!({"trigger": {"messages": 6}, "keep": {"messages": 2}}))
                .unwrap(),
        );
    })
    .await;
    for i in 0..5 {
        let question = format!("Turn {i}: the ticket is T-{i}00, please note it.");
        let response = chat(
            &server,
            &key,
            Some("long-chat"),
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let replaced = events_of_type(&server, &key, "long-chat", "context_replaced").await;
    assert!(!replaced.is_empty(), "the thread was never compacted");
    // After the compaction the request holds the summary, not every turn.
    let last = upstream.call(4).messages();
    assert!(last.len() < 9, "{last:?}");
    assert!(
        last.iter().any(|(_, content)| content.contains("T-000")),
        "the summary keeps identifiers: {last:?}"
    );
    assert_eq!(
        last.last().unwrap().1,
        "Turn 4: the ticket is T-400, please note it."
    );
    // Every turn is still in the log.
    assert_eq!(stored_messages(&server, &key, "long-chat").await.len(), 10);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"contexture_compactions_total{outcome="compacted"}"#),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn requests_a_thread_cannot_keep_are_refused_before_anything_is_stored() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    let user = json!({"role": "user", "content": "Hi"});
    let orphan = json!({"role": "tool", "tool_call_id": "call_9", "content": "42"});
    let cases = [
        (
            json!({"model": "gpt-4o-mini", "messages": [user], "n": 3}),
            "n",
            "only n = 1",
        ),
        (
            json!({"model": "gpt-4o-mini", "messages": [user], "n": "2"}),
            "n",
            "whole number above 0",
        ),
        (
            json!({"model": "gpt-4o-mini", "messages": [orphan]}),
            "messages",
            "answers no open tool call",
        ),
        (
            json!({"model": "gpt-4o-mini", "messages": [user, orphan]}),
            "messages",
            "`call_9`",
        ),
        (
            json!({"model": "gpt-4o-mini", "messages": [user], "max_tokens": 60000}),
            "max_tokens",
            "at most 16384 tokens",
        ),
        (
            json!({"model": "gpt-4o-mini", "messages": [user], "max_completion_tokens": -1}),
            "max_completion_tokens",
            "whole number above 0",
        ),
    ];
    for (body, param, words) in cases {
        let response = chat(&server, &key, Some("t"), body.clone()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(words),
            "{body}: {error}"
        );
    }
    assert!(upstream.bodies().is_empty(), "nothing was sent upstream");
    let response = client()
        .get(server.url("/v1/threads/t"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "nothing was stored"
    );

    // A tool result that answers the thread's open call is taken.
    let call = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]});
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "3"});
    let response = chat(
        &server,
        &key,
        Some("t"),
        json!({"model": "gpt-4o-mini", "messages": [user, call]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    // The fake answered with text, so the call stays open in the thread only if the client
    // answers it next: here it does.
    let response = chat(
        &server,
        &key,
        Some("t2"),
        json!({"model": "gpt-4o-mini", "messages": [user, call, result]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    // A second answer to the same call is refused.
    let response = chat(
        &server,
        &key,
        Some("t2"),
        json!({"model": "gpt-4o-mini", "messages": [result]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_reply_budget_the_client_asks_for_is_reserved_when_fitting() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    // gpt-4o-mini: a 128,000-token window, 16,384 tokens of output at most. Six turns of
    // 19,500 tokens each (117,000 in all), then a question asked with a reply budget of
    // 1,000 tokens (everything fits) and again with 16,000 (the oldest turns must go).
    let old = "lorem ipsum dolor sit amet ".repeat(3_900);
    for n in 0..6 {
        let response = chat(
            &server,
            &key,
            Some("long"),
            json!({"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": format!("{n} {old}")}]}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let mut sent = Vec::new();
    for max_tokens in [1_000, 16_000] {
        let response = chat(
            &server,
            &key,
            Some("long"),
            json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "Sum it up."}]}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = upstream.bodies().last().unwrap().clone();
        assert_eq!(body["max_tokens"], max_tokens, "forwarded as sent");
        sent.push(body["messages"].as_array().unwrap().len());
        let record = events_of_type(&server, &key, "long", "request_started")
            .await
            .pop()
            .unwrap();
        assert_eq!(
            record["budget"]["max_output_tokens"], max_tokens,
            "{record}"
        );
        let input = record["budget"]["input_tokens"].as_u64().unwrap();
        assert!(
            input <= 128_000 - max_tokens,
            "{input} tokens leave no room for {max_tokens}"
        );
    }
    // The second request's history holds the first question and its answer too.
    assert_eq!(sent[0], 13, "everything fits under the small reply budget");
    assert!(
        sent[1] < sent[0] + 2,
        "the larger reply budget leaves less room for history: {sent:?}"
    );
}

async fn message_count(server: &TestServer, key: &str, thread: &str) -> u64 {
    let summary: Value = get_json(server, key, &format!("/v1/threads/{thread}")).await;
    summary["messages"].as_u64().unwrap_or(0)
}

async fn keyed(
    server: &TestServer,
    key: &str,
    idempotency: &str,
    body: Value,
) -> reqwest::Response {
    client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("X-Contexture-Thread", "retry")
        .header("Idempotency-Key", idempotency)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_retried_turn_gets_its_stored_answer_and_a_reused_key_is_refused() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    let hello = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]});
    let first = keyed(&server, &key, "k-1", hello.clone()).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["choices"][0]["message"]["content"], "reply 1");
    for _ in 0..2 {
        let again = keyed(&server, &key, "k-1", hello.clone()).await;
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["x-contexture-replayed"], "true");
        let again: Value = again.json().await.unwrap();
        assert_eq!(again["choices"][0]["message"]["content"], "reply 1");
        assert_eq!(again["choices"][0]["finish_reason"], "stop");
    }
    assert_eq!(upstream.bodies().len(), 1, "the upstream was called once");
    assert_eq!(message_count(&server, &key, "retry").await, 2);

    // The same key with another body: refused, nothing stored, nothing sent.
    let other = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Something else"}]});
    let refused = keyed(&server, &key, "k-1", other).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["param"], "Idempotency-Key");
    assert_eq!(upstream.bodies().len(), 1);
    assert_eq!(message_count(&server, &key, "retry").await, 2);

    // A streamed turn is replayed as a stream.
    let streamed = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Stream it"}]});
    let text = keyed(&server, &key, "k-2", streamed.clone())
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("data: [DONE]"), "{text}");
    let again = keyed(&server, &key, "k-2", streamed).await;
    assert_eq!(again.headers()["x-contexture-replayed"], "true");
    assert_eq!(
        again.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let replay = again.text().await.unwrap();
    assert!(replay.contains(r#""content":"reply 2""#), "{replay}");
    assert!(replay.ends_with("data: [DONE]\n\n"), "{replay}");
    assert_eq!(upstream.bodies().len(), 2);
    assert_eq!(message_count(&server, &key, "retry").await, 4);
}

#[tokio::test]
async fn a_retry_after_a_failed_attempt_calls_the_upstream_again_and_stores_each_turn_once() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::json(500, json!({"error": {"message": "busy"}})));
    let (_dir, server, key) = server(&base, |_| {}).await;
    let hello = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]});
    let failed = keyed(&server, &key, "k-1", hello.clone()).await;
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let answered = keyed(&server, &key, "k-1", hello.clone()).await;
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(answered.headers().get("x-contexture-replayed").is_none());
    let replayed = keyed(&server, &key, "k-1", hello).await;
    assert_eq!(replayed.headers()["x-contexture-replayed"], "true");
    assert_eq!(upstream.bodies().len(), 2);
    assert_eq!(
        stored_messages(&server, &key, "retry").await,
        pairs(&[("user", "Hello"), ("assistant", "reply 2")])
    );
}

#[tokio::test]
async fn a_turn_that_cannot_fit_is_refused_and_leaves_nothing_stored() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    let small = chat(
        &server,
        &key,
        Some("fits"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "short"}]}),
    )
    .await;
    assert_eq!(small.status(), StatusCode::OK);
    let huge = "lorem ipsum dolor sit amet ".repeat(30_000);
    let response = chat(
        &server,
        &key,
        Some("fits"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": huge}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.bodies().len(), 1);
    assert_eq!(
        stored_messages(&server, &key, "fits").await,
        pairs(&[("user", "short"), ("assistant", "reply 1")])
    );
}

/// The thread's last request record's end, once there is one.
async fn last_request_end(server: &TestServer, key: &str, thread: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let page = events_page(server, key, thread).await;
        if let Some(end) = page["events"].as_array().and_then(|events| {
            events
                .iter()
                .rev()
                .find(|event| event["type"] == "request_ended")
                .cloned()
        }) {
            return end;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no request ended: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_that_goes_away_leaves_a_finished_record_and_loses_nothing() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.extend([
        // A whole answer sent late.
        Reply::text("late answer").after(std::time::Duration::from_millis(800)),
        // A stream whose first chunk comes at once and the rest late.
        Reply::text("streamed late").pause_after(1, std::time::Duration::from_secs(3)),
    ]);
    let (_dir, server, key) = server(&base, |_| {}).await;
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(200))
        .build()
        .unwrap();

    // A whole answer: the client gives up, the answer is still stored.
    let gone = impatient
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Contexture-Thread", "whole")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    let end = last_request_end(&server, &key, "whole").await;
    assert_eq!(end["outcome"], "completed", "{end}");
    assert_eq!(
        stored_messages(&server, &key, "whole").await,
        pairs(&[("user", "Hi"), ("assistant", "late answer")])
    );

    // A stream: the client leaves after the first chunk; the request is recorded as
    // cancelled with what had arrived, and no half answer joins the conversation.
    let response = client()
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Contexture-Thread", "streamed")
        .json(&json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    let mut response = response;
    let first = response.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("streamed"));
    drop(response);
    let end = last_request_end(&server, &key, "streamed").await;
    assert_eq!(end["outcome"], "cancelled", "{end}");
    assert_eq!(end["reply"]["content"], "streamed ", "{end}");
    // The prompt was sent: its tokens are spent, and so are those that arrived.
    let started = events_of_type(&server, &key, "streamed", "request_started").await;
    let sent = started[0]["budget"]["input_tokens"].as_u64().unwrap();
    assert_eq!(end["usage"]["input_tokens"].as_u64(), Some(sent), "{end}");
    assert!(end["usage"]["output_tokens"].as_u64().unwrap() > 0, "{end}");
    assert_eq!(end["usage_estimated"], true, "{end}");
    assert_eq!(
        stored_messages(&server, &key, "streamed").await,
        pairs(&[("user", "Hi")])
    );
}

#[tokio::test]
async fn an_upstream_that_answers_garbage_or_dies_mid_stream_leaves_a_valid_thread() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let cut = "data: {\"id\": \"c\", \"object\": \"chat.completion.chunk\", \"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"half an ans\"}, \"finish_reason\": null}]}\n\n";
    upstream.extend([
        Reply::raw(200, "application/json", "<html>this is not JSON"),
        Reply::raw(200, "text/event-stream", "data: {not json}\n\n"),
        Reply::raw(200, "text/event-stream", cut),
    ]);
    let (_dir, server, key) = server(&base, |_| {}).await;
    for (n, stream) in [(0, false), (1, true), (2, true)] {
        let response = chat(
            &server,
            &key,
            Some("garbage"),
            json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": format!("q{n}")}]}),
        )
        .await;
        // The upstream's answer is passed on as it came; the server stays up.
        assert_eq!(response.status(), StatusCode::OK);
        let _ = response.text().await;
        let end = last_request_end(&server, &key, "garbage").await;
        assert_ne!(end["outcome"], "completed", "answer {n}: {end}");
    }
    // Nothing but the questions joined the conversation, and the next turn works.
    assert_eq!(
        stored_messages(&server, &key, "garbage").await,
        pairs(&[("user", "q0"), ("user", "q1"), ("user", "q2")])
    );
    let response = chat(
        &server,
        &key,
        Some("garbage"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "again"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let sent = upstream.call(3).messages();
    assert_eq!(
        sent.last().unwrap(),
        &("user".to_owned(), "again".to_owned())
    );
}

#[tokio::test]
async fn a_keyed_turn_in_flight_is_refused_and_one_whose_server_stopped_is_taken_over() {
    use contexture_core::thread::{EventKind, RequestRecord};
    use contexture_store::{NewEvent, Store};

    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::hang());
    let (_dir, server, key) = server(&base, |config| {
        config.upstream.abandon_after_secs = 0.3;
    })
    .await;
    let hello = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]});

    // The first attempt hangs upstream: while this server answers it, a retry is a 409,
    // however old the attempt is.
    let hanging = {
        let (server_url, key, hello) = (server.url(""), key.clone(), hello.clone());
        tokio::spawn(async move {
            let _ = client()
                .post(format!("{server_url}/v1/chat/completions"))
                .bearer_auth(key)
                .header("X-Contexture-Thread", "retry")
                .header("Idempotency-Key", "k-1")
                .json(&hello)
                .send()
                .await;
        })
    };
    upstream
        .wait_for_calls(1, std::time::Duration::from_secs(10))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let refused = keyed(&server, &key, "k-1", hello.clone()).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let error: Value = refused.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is still being answered"),
        "{error}"
    );
    assert_eq!(upstream.bodies().len(), 1, "no second call");
    hanging.abort();

    // An attempt recorded by a server that then stopped: no end, no server answering it.
    let digest = contexture_server::chat_request_digest(hello.as_object().unwrap());
    let record = RequestRecord {
        request_id: "acme/retry/chat-lost".into(),
        model: Some("gpt-4o-mini".into()),
        client_digest: Some(digest),
        ..RequestRecord::default()
    };
    server
        .state
        .store
        .append_one(
            "acme/lost",
            NewEvent::new(EventKind::RequestStarted(record)).with_key("k-2:request"),
        )
        .await
        .unwrap();
    let lost = |key: String, hello: Value, server_url: String| async move {
        client()
            .post(format!("{server_url}/v1/chat/completions"))
            .bearer_auth(key)
            .header("X-Contexture-Thread", "lost")
            .header("Idempotency-Key", "k-2")
            .json(&hello)
            .send()
            .await
            .unwrap()
    };
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let answered = lost(key.clone(), hello.clone(), server.url("")).await;
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(answered.headers().get("x-contexture-replayed").is_none());
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["choices"][0]["message"]["content"], "reply 2");
    let ends = events_of_type(&server, &key, "lost", "request_ended").await;
    assert_eq!(ends.len(), 2, "{ends:?}");
    assert!(
        ends[0]["request_id"]
            .as_str()
            .unwrap()
            .ends_with("/chat-lost"),
        "{}",
        ends[0]
    );
    assert_eq!(ends[0]["outcome"], "failed");
    assert!(
        ends[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("abandoned: no end was recorded within 0.3 s"),
        "{}",
        ends[0]
    );
    assert_eq!(ends[1]["outcome"], "completed");
    // And from then on the key replays the answer.
    let replayed = lost(key.clone(), hello.clone(), server.url("")).await;
    assert_eq!(replayed.headers()["x-contexture-replayed"], "true");
    assert_eq!(upstream.bodies().len(), 2);
}

#[tokio::test]
async fn a_keyed_turn_younger_than_the_abandon_time_is_not_taken_over() {
    use contexture_core::thread::{EventKind, RequestRecord};
    use contexture_store::{NewEvent, Store};

    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    let hello = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]});
    // Another server (of a shared database) recorded the attempt moments ago and may be
    // answering it still.
    let record = RequestRecord {
        request_id: "acme/retry/chat-elsewhere".into(),
        client_digest: Some(contexture_server::chat_request_digest(
            hello.as_object().unwrap(),
        )),
        ..RequestRecord::default()
    };
    server
        .state
        .store
        .append_one(
            "acme/retry",
            NewEvent::new(EventKind::RequestStarted(record)).with_key("k-1:request"),
        )
        .await
        .unwrap();
    let refused = keyed(&server, &key, "k-1", hello).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert!(upstream.bodies().is_empty());
}

#[tokio::test]
async fn a_long_threads_turns_read_its_tail_and_fit_as_the_whole_thread_would() {
    use contexture_core::format::openai;
    use contexture_core::thread::EventKind;
    use contexture_engine::fitting::{FitOverrides, FitSettings};
    use contexture_store::{NewEvent, Store};

    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    // 30,000 messages of about 30 tokens: several times what the model's window holds.
    let filler = "the quick brown fox jumps over the lazy dog ".repeat(3);
    server
        .state
        .store
        .append_one(
            "acme/long",
            NewEvent::new(EventKind::MessageAppended {
                message: contexture_core::Message::system("Be brief."),
            }),
        )
        .await
        .unwrap();
    for chunk in 0..30 {
        let batch = (0..1000)
            .map(|i| {
                let text = format!("{} {filler}", chunk * 1000 + i);
                let message = if i % 2 == 0 {
                    contexture_core::Message::user(text)
                } else {
                    contexture_core::Message::assistant(text)
                };
                NewEvent::new(EventKind::MessageAppended { message })
            })
            .collect();
        server.state.store.append("acme/long", batch).await.unwrap();
    }
    let settings = FitSettings::new(
        server.state.registry.get("gpt-4o-mini").unwrap(),
        server.state.config.fit.clone(),
        FitOverrides::default(),
    )
    .unwrap();
    let whole = server
        .state
        .store
        .load_projection("acme/long")
        .await
        .unwrap();
    let expected = settings.fit(whole.clone(), &[], &[]).unwrap();

    let context: Value =
        get_json(&server, &key, "/v1/threads/long/context?model=gpt-4o-mini").await;
    assert_eq!(
        context["messages"],
        openai::to_values(&expected.messages),
        "the same request as from the whole thread"
    );
    let reason = context["fit"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("older messages were not read: the newest fill the window"),
        "{reason}"
    );
    // What was left out still covers the whole history: every message but those sent.
    let left_out: usize = context["fit"]["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|range| (range[1].as_u64().unwrap() - range[0].as_u64().unwrap()) as usize)
        .sum();
    assert_eq!(left_out + expected.messages.len(), 30_001);

    // The thread's summary counts what it does not read.
    let summary: Value = get_json(&server, &key, "/v1/threads/long").await;
    assert_eq!(summary["messages"], 30_001, "{summary}");
    assert_eq!(summary["last_seq"], 30_001, "{summary}");

    // A turn: the request sent upstream is the whole thread's fit with the new turn.
    let question = contexture_core::Message::user("And now?");
    let expected = settings
        .fit(whole, std::slice::from_ref(&question), &[])
        .unwrap();
    let answer = chat(
        &server,
        &key,
        Some("long"),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "And now?"}]}),
    )
    .await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        upstream.bodies()[0]["messages"],
        openai::to_values(&expected.messages)
    );
}

/// The request records of `thread` (stored id) that ended, straight from the store.
async fn request_ends(
    store: &contexture_store::AnyStore,
    thread: &str,
) -> Vec<contexture_core::thread::RequestEnd> {
    use contexture_store::Store;
    store
        .events(thread)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|event| match event.kind {
            contexture_core::thread::EventKind::RequestEnded(end) => Some(end),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_shutdown_records_the_calls_it_stops_with_what_had_arrived() {
    use contexture_core::thread::RequestOutcome;

    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.push(Reply::hang()).push(
        Reply::text("Half of it, then the rest").pause_after(1, std::time::Duration::from_secs(60)),
    );
    let (_dir, server, key) = server(&base, |config| {
        config.shutdown_grace_secs = 1;
        // Longer than a loaded machine may take to get here: the hanging call must still be
        // waiting when the shutdown stops it.
        config.upstream.timeout_secs = 300.0;
    })
    .await;
    let state = server.state.clone();
    let whole = {
        let (url, key) = (server.url("/v1/chat/completions"), key.clone());
        tokio::spawn(async move {
            let _ = client()
                .post(url)
                .bearer_auth(key)
                .header("X-Contexture-Thread", "waiting")
                .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}))
                .send()
                .await;
        })
    };
    // The upstream answers in the order calls arrive: the hanging one must be first.
    upstream
        .wait_for_calls(1, std::time::Duration::from_secs(10))
        .await;
    // The client of the stream says when its first chunk came: by then the server has seen
    // it too (a chunk is recorded as it passes through).
    let (first_chunk, first_chunk_came) = tokio::sync::oneshot::channel::<()>();
    let streamed = {
        let (url, key) = (server.url("/v1/chat/completions"), key.clone());
        tokio::spawn(async move {
            let mut response = client()
                .post(url)
                .bearer_auth(key)
                .header("X-Contexture-Thread", "streaming")
                .json(&json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Hello"}]}))
                .send()
                .await
                .unwrap();
            if let Ok(Some(_)) = response.chunk().await {
                let _ = first_chunk.send(());
            }
            while let Ok(Some(_)) = response.chunk().await {}
        })
    };
    upstream
        .wait_for_calls(2, std::time::Duration::from_secs(10))
        .await;
    tokio::time::timeout(std::time::Duration::from_secs(10), first_chunk_came)
        .await
        .expect("the stream's first chunk never came")
        .unwrap();
    let started = std::time::Instant::now();
    server.shutdown().await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "the shutdown hung"
    );
    whole.abort();
    streamed.abort();

    let ends = request_ends(&state.store, "acme/waiting").await;
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].outcome, RequestOutcome::Cancelled);
    assert_eq!(
        ends[0].error.as_deref(),
        Some("the server shut down before the answer ended")
    );
    let ends = request_ends(&state.store, "acme/streaming").await;
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].outcome, RequestOutcome::Cancelled);
    let partial = ends[0].reply.as_ref().expect("what had arrived").text();
    assert!(
        !partial.is_empty() && "Half of it, then the rest".starts_with(&partial),
        "{partial:?}"
    );
    // Nothing of either joined the conversation.
    for thread in ["acme/waiting", "acme/streaming"] {
        let projection = contexture_store::Store::load_projection(&state.store, thread)
            .await
            .unwrap();
        assert_eq!(projection.messages.len(), 1, "{thread}: only the question");
    }
}

#[tokio::test]
async fn a_turn_is_counted_and_priced_as_every_call_is_when_the_upstream_reports_no_usage() {
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    let (_dir, server, key) = server(&base, |_| {}).await;
    // A whole answer without `usage`, then a streamed one without it (a stream reports
    // usage only when asked to).
    upstream.push(Reply::raw(
        200,
        "application/json",
        r#"{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Four, as it always was."},"finish_reason":"stop"}]}"#,
    ));
    upstream.push(Reply::raw(
        200,
        "text/event-stream",
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Six, \"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"of course.\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    ));
    for (turn, stream) in [("What is 2+2?", false), ("And 3+3?", true)] {
        let response = chat(
            &server,
            &key,
            Some("counted"),
            json!({"model": "gpt-4o-mini", "stream": stream,
                   "messages": [{"role": "user", "content": turn}]}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
        response.bytes().await.unwrap();
        let started = events_of_type(&server, &key, "counted", "request_started").await;
        let sent = started.last().unwrap()["budget"]["input_tokens"]
            .as_u64()
            .unwrap();
        let end = last_request_end(&server, &key, "counted").await;
        assert_eq!(end["outcome"], "completed", "{end}");
        assert_eq!(end["usage_estimated"], true, "{end}");
        assert_eq!(end["usage"]["input_tokens"].as_u64(), Some(sent), "{end}");
        let output = end["usage"]["output_tokens"].as_u64().unwrap();
        assert!(output > 0, "the reply is counted: {end}");
        // gpt-4o-mini's list price: $0.15 in and $0.60 out per million tokens.
        let cost = end["cost_usd"].as_f64().expect("a cost");
        let expected = (sent as f64 * 0.15 + output as f64 * 0.6) / 1e6;
        assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
        // The answer is the message stored after it, not a second copy in the record.
        assert!(end.get("reply").is_none_or(Value::is_null), "{end}");
    }
}

/// A chat turn to a model whose tokens are estimated feeds its family's calibration with the
/// usage the upstream reported; once learnt, the next turn is measured with it (its record's
/// input tokens at least what was reported for the same request). A model counted exactly
/// learns nothing.
#[tokio::test]
async fn chat_turns_calibrate_the_estimates_of_their_model() {
    use contexture_store::Store;
    let upstream = FakeUpstream::start().await;
    let (dir, server, key) = server(&upstream.base_url(), |_| {}).await;
    let question = "Summarize the quarterly report: revenue of 4.2 million, up 12 percent, the northern region led by Ana Ruiz growing fastest, the southern region under Tom Becker flat.";
    let turn = |thread: &'static str, model: &'static str| {
        chat(
            &server,
            &key,
            Some(thread),
            json!({"model": model, "messages": [{"role": "user", "content": question}]}),
        )
    };
    // The first turn's record says what the request was estimated at.
    upstream.push(Reply::text("ok").usage(10, 2));
    assert_eq!(
        turn("t0", "claude-sonnet-4-5").await.status(),
        StatusCode::OK
    );
    let started = events_of_type(&server, &key, "t0", "request_started").await;
    let estimate = started[0]["budget"]["input_tokens"].as_u64().unwrap();
    // The upstream counts half as much again (beyond the 3 tokens of reply priming).
    let reported = (estimate - 3) * 3 / 2 + 3;
    for thread in ["t1", "t2", "t3"] {
        upstream.push(Reply::text("ok").usage(reported, 2));
        assert_eq!(
            turn(thread, "claude-sonnet-4-5").await.status(),
            StatusCode::OK
        );
    }
    let store = SqliteStore::open(dir.join("chat.db")).await.unwrap();
    // Learnt for this tenant: its own calibration of the family.
    let calibration = store
        .calibration("tenant:acme:claude-sonnet-4-5")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.calibration("claude-sonnet-4-5").await.unwrap(), None);
    assert_eq!((calibration.kept, calibration.outliers), (3, 1));
    upstream.push(Reply::text("ok").usage(reported, 2));
    assert_eq!(
        turn("t4", "claude-sonnet-4-5").await.status(),
        StatusCode::OK
    );
    let started = events_of_type(&server, &key, "t4", "request_started").await;
    let measured = started[0]["budget"]["input_tokens"].as_u64().unwrap();
    assert!(measured >= reported, "{measured} < {reported}");

    upstream.push(Reply::text("ok").usage(reported * 2, 2));
    assert_eq!(turn("t5", "gpt-4o-mini").await.status(), StatusCode::OK);
    assert_eq!(store.calibration("gpt-4o-mini").await.unwrap(), None);
    assert_eq!(
        store.calibration("tenant:acme:gpt-4o-mini").await.unwrap(),
        None
    );
    server.shutdown().await;
}

/// The tokens `tenant`'s requests would be measured at for `thread` under `model`.
async fn measured_context(server: &TestServer, key: &str, thread: &str, model: &str) -> u64 {
    let context = get_json(
        server,
        key,
        &format!("/v1/threads/{thread}/context?model={model}"),
    )
    .await;
    context["budget"]["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("no budget: {context}"))
}

/// A hostile tenant's campaign against the shared estimates (a run of `=` the provider
/// counts far more of, a structured-output schema the estimate once left out, CJK text it
/// counts fewer of), sent through the chat endpoint with the provider's reports, leaves
/// another tenant's measured context where it was; that tenant's own honest traffic still
/// calibrates it.
#[tokio::test]
async fn one_tenants_reports_never_move_another_tenants_estimates() {
    const MODEL: &str = "claude-sonnet-4-5";
    let upstream = FakeUpstream::start().await;
    let (_dir, server, attacker) = server(&upstream.base_url(), |_| {}).await;
    let victim = server.key("zeta").await;
    let question = "Summarize the quarterly report: revenue of 4.2 million, up 12 percent, the northern region led by Ana Ruiz growing fastest, the southern region under Tom Becker flat.";
    let turn = |key: String, thread: String, body: Value| {
        let server = &server;
        async move {
            let response = chat(server, &key, Some(&thread), body).await;
            assert_eq!(response.status(), StatusCode::OK);
        }
    };
    let ask = |text: &str| json!({"model": MODEL, "messages": [{"role": "user", "content": text}]});
    // The victim's estimate of its question, then three honest reports of 1.08 times it.
    upstream.push(Reply::text("ok").usage(10, 2));
    turn(victim.clone(), "v0".into(), ask(question)).await;
    let started = events_of_type(&server, &victim, "v0", "request_started").await;
    let estimate = started[0]["budget"]["input_tokens"].as_u64().unwrap();
    let honest = |factor: f64| ((estimate - 3) as f64 * factor) as u64 + 3;
    for n in 1..=3 {
        upstream.push(Reply::text("ok").usage(honest(1.08), 2));
        turn(victim.clone(), format!("v{n}"), ask(question)).await;
    }
    let history = json!({"messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "Revenue grew 12 percent to 4.2 million."},
        {"role": "user", "content": "Which region grew fastest, and who leads it?"},
    ]});
    let (status, _) = server
        .call(&victim, "POST", "/v1/threads/kept/messages", Some(history))
        .await;
    assert!(status.is_success());
    let before = measured_context(&server, &victim, "kept", MODEL).await;

    // The campaign: each vector twenty times, each reported far from the estimate.
    let equals = format!("{question} {}", "=".repeat(340));
    let schema = json!({"type": "json_schema", "json_schema": {"name": "report", "schema": {
        "type": "object",
        "properties": (0..40).map(|i| (format!("field_{i}"), json!({"type": "string", "description": "a field of the report, as long as it needs to be"}))).collect::<serde_json::Map<String, Value>>(),
    }}});
    let cjk = "季度报告摘要：收入四百二十万，增长百分之十二，北方地区增长最快。".repeat(6);
    for n in 0..20 {
        upstream.push(Reply::text("ok").usage(honest(1.0) * 3, 2));
        turn(attacker.clone(), format!("a-eq-{n}"), ask(&equals)).await;
        upstream.push(Reply::text("ok").usage(honest(1.0) * 2, 2));
        let mut structured = ask(question);
        structured["response_format"] = schema.clone();
        turn(attacker.clone(), format!("a-rf-{n}"), structured).await;
        upstream.push(Reply::text("ok").usage(40, 2));
        turn(attacker.clone(), format!("a-cjk-{n}"), ask(&cjk)).await;
    }
    let after = measured_context(&server, &victim, "kept", MODEL).await;
    let moved = (after as f64 - before as f64).abs() / before as f64;
    assert!(
        moved <= 0.02,
        "the victim's context went {before} -> {after}"
    );
    // The campaign had teeth: the attacker's own estimates moved.
    let (status, _) = server
        .call(
            &attacker,
            "POST",
            "/v1/threads/kept/messages",
            Some(json!({"messages": [{"role": "user", "content": question}]})),
        )
        .await;
    assert!(status.is_success());
    let attackers = measured_context(&server, &attacker, "kept", MODEL).await;
    let victims_same = measured_context(&server, &victim, "kept", MODEL).await;
    assert!(attackers > 0 && victims_same == after);

    // The victim's own honest traffic still calibrates it.
    for n in 4..=9 {
        upstream.push(Reply::text("ok").usage(honest(1.3), 2));
        turn(victim.clone(), format!("v{n}"), ask(question)).await;
    }
    let recalibrated = measured_context(&server, &victim, "kept", MODEL).await;
    assert!(
        recalibrated as f64 > after as f64 * 1.1,
        "{after} -> {recalibrated}"
    );
    server.shutdown().await;
}
