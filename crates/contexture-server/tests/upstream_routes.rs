//! Upstreams chosen by model: `[[upstreams]]` entries take the models their patterns match
//! (here `claude-*` to an Anthropic-kind fake), every other model goes to `[upstream]`; each
//! gets the server's own key in its own header, never the client's; `GET /v1/models` lists
//! every upstream's models in one list.

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_server::{RoutedUpstream, ServerConfig, UpstreamKind};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::chat::chat;
use crate::responses::{events, output_text, respond};

/// A server whose default upstream is `openai` and whose `claude-*` models go to
/// `anthropic`, speaking Anthropic's messages.
async fn routed_server(
    openai: &FakeUpstream,
    anthropic: &FakeUpstream,
) -> (TempDir, TestServer, String) {
    let mut config: ServerConfig = config(Some(&openai.base_url()));
    config.upstreams.push(RoutedUpstream {
        models: vec!["claude-*".into()],
        kind: UpstreamKind::Anthropic,
        base_url: Some(anthropic.origin().to_owned()),
        api_key: Some("sk-ant-server-secret".into()),
        timeout_secs: 10.0,
        retries: 0,
    });
    let dir = TempDir::new("contexture-upstream-routes");
    let store = SqliteStore::open(dir.join("routes.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (dir, server, key)
}

#[tokio::test]
async fn each_model_goes_to_its_upstream_with_the_servers_key_in_its_header() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text("Claude here.").usage(30, 4));
    anthropic.push(Reply::text("Still Claude."));
    let (_dir, server, key) = routed_server(&openai, &anthropic).await;

    let (status, first) = respond(
        &server,
        &key,
        json!({"model": "claude-sonnet-4-5", "input": "Who are you?", "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(output_text(&first), "Claude here.");
    assert_eq!(first["usage"]["input_tokens"], 30);
    assert_eq!(
        openai.call_count(),
        0,
        "a claude model never reaches the default"
    );
    let call = anthropic.call(0);
    assert_eq!(call.path, "/v1/messages");
    assert_eq!(call.header("x-api-key"), Some("sk-ant-server-secret"));
    assert!(call.header("anthropic-version").is_some());
    assert_eq!(call.authorization(), None, "the client's key stays here");
    assert_eq!(call.json["model"], "claude-sonnet-4-5");
    assert_eq!(call.json["system"], "Be brief.");
    assert_eq!(call.json["messages"][0]["role"], "user");

    // The chain goes on against the same upstream, its history in Anthropic's format.
    let (status, second) = respond(
        &server,
        &key,
        json!({"model": "claude-sonnet-4-5", "input": "And now?",
               "previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(output_text(&second), "Still Claude.");
    let messages = anthropic.call(1).json["messages"].clone();
    assert_eq!(messages.as_array().unwrap().len(), 3, "{messages}");
    assert_eq!(messages[1]["role"], "assistant");

    // Any other model goes to the default upstream, with its key as a bearer token.
    let (status, other) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "And you?"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{other}");
    let call = openai.call(0);
    assert_eq!(call.path, "/v1/chat/completions");
    assert_eq!(call.authorization(), Some("Bearer sk-upstream-secret"));
    assert_eq!(call.header("x-api-key"), None);
    assert_eq!(anthropic.call_count(), 2);
}

#[tokio::test]
async fn a_stream_from_an_anthropic_upstream_is_written_as_the_doors_events() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text_in_pieces(["Claude ", "streams."]));
    let (_dir, server, key) = routed_server(&openai, &anthropic).await;
    let response = client()
        .post(server.url("/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": "claude-haiku-4-5", "input": "Stream, please.", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.text().await.unwrap();
    let events = events(&body);
    let deltas: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "Claude streams.");
    let (last, completed) = events.last().unwrap();
    assert_eq!(last, "response.completed", "{body}");
    assert_eq!(output_text(&completed["response"]), "Claude streams.");
    assert!(anthropic.call(0).wants_stream());
    assert_eq!(openai.call_count(), 0);
}

#[tokio::test]
async fn the_model_list_holds_every_upstreams_models_once() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push_models_reply(Reply::json(
        200,
        json!({"data": [
            {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
             "created_at": "2025-09-29T00:00:00Z"},
            {"type": "model", "id": "gpt-4o-mini", "display_name": "listed twice",
             "created_at": "2025-01-01T00:00:00Z"}],
         "has_more": false, "first_id": "claude-sonnet-4-5", "last_id": "gpt-4o-mini"}),
    ));
    anthropic.push_models_reply(Reply::error(503, "overloaded"));
    let (_dir, server, key) = routed_server(&openai, &anthropic).await;
    let (status, list) = server.call(&key, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["claude-sonnet-4-5", "gpt-4o-mini"]);
    assert_eq!(list["data"][0]["object"], "model");
    assert_eq!(list["data"][0]["created"], 1_759_104_000);
    let models_call = anthropic.requests()[0].clone();
    assert_eq!(models_call.path, "/v1/models");
    assert_eq!(
        models_call.header("x-api-key"),
        Some("sk-ant-server-secret")
    );

    // An upstream that cannot list its models fails the list, naming it.
    let (status, error) = server.call(&key, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("upstream 1 (Anthropic messages): answered 503"),
        "{message}"
    );
}

#[tokio::test]
async fn a_server_with_one_upstream_lists_its_models_as_it_answered() {
    let openai = FakeUpstream::start().await;
    let listed = json!({"object": "list", "data": [{"id": "local-model", "object": "model",
                        "created": 7, "owned_by": "me", "extra": true}]});
    openai.push_models_reply(Reply::json(200, listed.clone()));
    let dir = TempDir::new("contexture-one-upstream");
    let store = SqliteStore::open(dir.join("one.db")).await.unwrap();
    let server = TestServer::start(config(Some(&openai.base_url())), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let (status, list) = server.call(&key, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list, listed);
}

#[tokio::test]
async fn the_chat_endpoint_writes_an_anthropic_upstreams_answers_as_completions() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text("Claude here.").usage(30, 4));
    anthropic.push(Reply::tool_call("toolu_1", "lookup", json!({"q": "rust"})));
    anthropic.push(Reply::text("Without a thread."));
    let (_dir, server, key) = routed_server(&openai, &anthropic).await;

    let response = chat(
        &server,
        &key,
        Some("talk"),
        json!({"model": "claude-sonnet-4-5",
               "messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Who are you?"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-contexture-thread"], "talk");
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "Claude here."
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert_eq!(completion["usage"]["prompt_tokens"], 30);
    assert_eq!(completion["usage"]["total_tokens"], 34);
    assert_eq!(anthropic.call(0).json["system"], "Be brief.");

    // The thread goes on: the history reaches the upstream in its own format.
    let response = chat(
        &server,
        &key,
        Some("talk"),
        json!({"model": "claude-sonnet-4-5",
               "messages": [{"role": "user", "content": "Look up rust."}]}),
    )
    .await;
    let completion: Value = response.json().await.unwrap();
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{completion}");
    assert_eq!(choice["message"]["tool_calls"][0]["id"], "toolu_1");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "lookup"
    );
    let sent = anthropic.call(1).json["messages"].clone();
    assert_eq!(sent.as_array().unwrap().len(), 3, "{sent}");
    assert_eq!(sent[1]["content"][0]["text"], "Claude here.");

    // Without a thread the call is fitted and forwarded, and written back all the same.
    let response = chat(
        &server,
        &key,
        None,
        json!({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    let completion: Value = response.json().await.unwrap();
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "Without a thread."
    );
    assert_eq!(openai.call_count(), 0);
}

#[tokio::test]
async fn a_streamed_chat_turn_from_an_anthropic_upstream_is_written_as_chunks() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text_in_pieces(["Claude ", "streams."]).usage(12, 3));
    anthropic.push(Reply::error(400, "max_tokens: too large"));
    let (_dir, server, key) = routed_server(&openai, &anthropic).await;
    let response = chat(
        &server,
        &key,
        Some("streamed"),
        json!({"model": "claude-sonnet-4-5", "stream": true,
               "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "Stream, please."}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let body = response.text().await.unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let chunks: Vec<Value> = body
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Claude streams.");
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|chunk| &chunk["choices"][0]["finish_reason"])
        .filter(|reason| !reason.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")]);
    assert_eq!(chunks.last().unwrap()["usage"]["prompt_tokens"], 12);
    assert!(anthropic.call(0).wants_stream());

    // The answer was recorded: the next turn sends it back.
    let response = chat(
        &server,
        &key,
        Some("streamed"),
        json!({"model": "claude-sonnet-4-5",
               "messages": [{"role": "user", "content": "Again."}]}),
    )
    .await;
    // The upstream's refusal keeps its status and says what the upstream said.
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_tokens: too large"), "{message}");
    let sent = anthropic.call(1).json["messages"].clone();
    assert_eq!(sent[1]["content"][0]["text"], "Claude streams.", "{sent}");
}
