//! The Responses door over real sockets, against a fake OpenAI-compatible upstream: chained
//! responses keep their history in a thread, an older response continues on a branch,
//! instructions stay with their call, `store: false` keeps nothing, a stream is the documented
//! events, truncation disabled refuses an input over the window, a compaction threshold puts
//! a readable compaction item first; another tenant's ids are 404 and hostile bodies are
//! refused naming the field.

use crate::common;

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub(crate) async fn server(upstream: &FakeUpstream) -> (TempDir, TestServer, String) {
    let dir = TempDir::new("contexture-responses");
    let store = SqliteStore::open(dir.join("responses.db")).await.unwrap();
    let server =
        TestServer::start(config(Some(&upstream.base_url())), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (dir, server, key)
}

pub(crate) async fn respond(server: &TestServer, key: &str, body: Value) -> (StatusCode, Value) {
    server.call(key, "POST", "/v1/responses", Some(body)).await
}

/// The answer's text: the text of its message items.
pub(crate) fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap_or_else(|| panic!("no output: {response}"))
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect()
}

/// The (role, content) of each message the upstream's `index`th call was sent.
pub(crate) fn sent(upstream: &FakeUpstream, index: usize) -> Vec<(String, Value)> {
    upstream.call(index).json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| {
            (
                message["role"].as_str().unwrap().to_owned(),
                message["content"].clone(),
            )
        })
        .collect()
}

pub(crate) fn said(pairs: &[(&str, &str)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(role, text)| ((*role).to_owned(), json!(text)))
        .collect()
}

#[tokio::test]
async fn chained_responses_keep_their_history_and_an_older_one_continues_on_a_branch() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let (status, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?", "instructions": "Be brief.",
               "metadata": {"team": "docs"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["instructions"], "Be brief.");
    assert_eq!(first["metadata"]["team"], "docs");
    assert_eq!(output_text(&first), "reply 1");
    assert_eq!(first["usage"]["total_tokens"], 12);
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert!(first_id.starts_with("resp_"), "{first_id}");
    assert_eq!(
        sent(&upstream, 0),
        said(&[("system", "Be brief."), ("user", "What is Rust?")])
    );

    let (status, second) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": [{"role": "user", "content": "Who made it?"}],
               "previous_response_id": first_id}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["previous_response_id"], json!(first_id));
    assert_eq!(second["instructions"], Value::Null);
    assert_eq!(
        sent(&upstream, 1),
        said(&[
            ("user", "What is Rust?"),
            ("assistant", "reply 1"),
            ("user", "Who made it?")
        ]),
        "the history came from the thread; the instructions stayed with their call"
    );

    // A retry from the first answer: a branch that does not see the second turn.
    let (status, branch) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "When was it released?",
               "previous_response_id": first_id}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{branch}");
    assert_eq!(
        sent(&upstream, 2),
        said(&[
            ("user", "What is Rust?"),
            ("assistant", "reply 1"),
            ("user", "When was it released?")
        ])
    );
    // Both can be continued, each with its own history.
    let (_, after_second) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "And then?", "previous_response_id": second["id"]}),
    )
    .await;
    assert_eq!(after_second["status"], "completed", "{after_second}");
    assert_eq!(sent(&upstream, 3).len(), 5);
    let (_, after_branch) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "And then?", "previous_response_id": branch["id"]}),
    )
    .await;
    assert_eq!(after_branch["status"], "completed", "{after_branch}");
    assert_eq!(sent(&upstream, 4)[2].1, json!("When was it released?"));

    // Stored responses read back as they were answered, with their input.
    let (status, read) = server
        .call(&key, "GET", &format!("/v1/responses/{first_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    for field in [
        "id",
        "status",
        "output",
        "instructions",
        "metadata",
        "usage",
        "model",
    ] {
        assert_eq!(read[field], first[field], "{field}");
    }
    let second_id = second["id"].as_str().unwrap();
    let (status, items) = server
        .call(
            &key,
            "GET",
            &format!("/v1/responses/{second_id}/input_items"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{items}");
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(items["data"][0]["content"][0]["text"], "Who made it?");
}

#[tokio::test]
async fn a_function_call_and_its_output_make_a_round_trip() {
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::tool_call(
        "call_1",
        "weather",
        json!({"city": "Porto"}),
    ));
    upstream.push(Reply::text("Rainy in Porto."));
    let (_dir, server, key) = server(&upstream).await;
    let tools = json!([{"type": "function", "name": "weather", "description": "Weather",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let (status, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Weather in Porto?", "tools": tools,
               "tool_choice": "auto"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let call = &first["output"][0];
    assert_eq!(call["type"], "function_call", "{first}");
    assert_eq!(call["call_id"], "call_1");
    assert_eq!(call["name"], "weather");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Porto"})
    );
    assert_eq!(
        upstream.call(0).json["tools"][0]["function"]["name"],
        "weather",
        "tools go upstream in chat completions' shape"
    );
    let (status, second) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "previous_response_id": first["id"], "tools": tools,
               "input": [{"type": "function_call_output", "call_id": "call_1", "output": "rain"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(output_text(&second), "Rainy in Porto.");
    let messages = upstream.call(1).json["messages"].clone();
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_1", "{messages}");
    assert_eq!(messages[2]["role"], "tool");
    assert_eq!(messages[2]["tool_call_id"], "call_1");
    assert_eq!(messages[2]["content"], "rain");
}

#[tokio::test]
async fn reasoning_items_stay_with_their_turn_and_the_record_counts_what_was_not_sent() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let input = json!([
        {"role": "user", "content": "Plan the trip."},
        {"type": "reasoning", "id": "rs_a", "summary": [{"type": "summary_text", "text": "Think of trains."}],
         "encrypted_content": "gAAAA-opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Take the train."}]},
        {"role": "user", "content": "And back?"}
    ]);
    let (status, response) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": input}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    // Chat completions has no reasoning input: the upstream gets the turn's text only.
    let sent = upstream.call(0).json["messages"].clone();
    assert_eq!(
        sent[1],
        json!({"role": "assistant", "content": "Take the train."}),
        "{sent}"
    );
    assert!(!sent.to_string().contains("trains"), "{sent}");
    // The thread keeps it beside its turn, and the request's record says it was not sent.
    let thread = thread_of(&response["id"]);
    let (_, events) = server
        .call(&key, "GET", &format!("/v1/threads/{thread}/events"), None)
        .await;
    let events = events["events"].as_array().unwrap();
    let record = events
        .iter()
        .find(|event| event["type"] == "request_started")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(record["reasoning_not_sent"], 1, "{record}");
    assert!(record.to_string().contains("Think of trains."), "{record}");
    // The next turn sends the thread's reasoning no more than the first did.
    let (status, next) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Thanks", "conversation": thread}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    let (_, events) = server
        .call(&key, "GET", &format!("/v1/threads/{thread}/events"), None)
        .await;
    let records: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["type"] == "request_started")
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[1]["reasoning_not_sent"], 1,
        "the thread's reasoning is still left out"
    );
}

/// The named events of a server-sent event stream (the Responses door's, the Messages
/// door's): (event name, data).
pub(crate) fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = value.to_owned();
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(value).unwrap();
                }
            }
            (name, data)
        })
        .collect()
}

#[tokio::test]
async fn a_streamed_response_is_the_documented_events_and_is_stored() {
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text_in_pieces(["Rust is ", "a language."]));
    let (_dir, server, key) = server(&upstream).await;
    let response = client()
        .post(server.url("/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": "gpt-4o-mini", "input": "What is Rust?", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = events(&response.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
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
            "response.completed"
        ]
    );
    for (index, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], json!(name));
        assert_eq!(data["sequence_number"], json!(index));
    }
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(output_text(completed), "Rust is a language.");
    assert!(
        upstream.call(0).json["stream"] == true,
        "the upstream streamed too"
    );
    let id = completed["id"].as_str().unwrap();
    let (status, read) = server
        .call(&key, "GET", &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(output_text(&read), "Rust is a language.");
}

#[tokio::test]
async fn a_response_not_stored_keeps_nothing_and_cannot_be_continued() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let (_, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?"}),
    )
    .await;
    let (status, unstored) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Who made it?", "store": false,
               "previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{unstored}");
    assert_eq!(unstored["store"], false);
    assert_eq!(
        sent(&upstream, 1),
        said(&[
            ("user", "What is Rust?"),
            ("assistant", "reply 1"),
            ("user", "Who made it?")
        ])
    );
    let id = unstored["id"].as_str().unwrap();
    let (status, _) = server
        .call(&key, "GET", &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "And?", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // The first response's thread did not take the unstored turn: continuing it sends
    // only the first exchange.
    respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "When?", "previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(sent(&upstream, 2).len(), 3);
}

#[tokio::test]
async fn truncation_disabled_refuses_an_input_over_the_window_before_calling_upstream() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let long = "node-7 reports disk pressure again. ".repeat(20_000);
    let (status, body) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": long, "truncation": "disabled"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(body["error"]["param"], "input");
    assert_eq!(upstream.calls().len(), 0);
}

#[tokio::test]
async fn a_compaction_threshold_puts_a_readable_compaction_item_first() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let mut previous = Value::Null;
    for question in ["First question about node-7?", "Second one?", "Third one?"] {
        let (_, response) = respond(
            &server,
            &key,
            json!({"model": "gpt-4o-mini", "input": question, "previous_response_id": previous}),
        )
        .await;
        previous = response["id"].clone();
    }
    // The server's summarizer is the offline one: no call for the summary.
    let (status, compacted) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Fourth?", "previous_response_id": previous,
               "context_management": [{"type": "compaction", "compact_threshold": 20}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{compacted}");
    let item = &compacted["output"][0];
    assert_eq!(item["type"], "compaction", "{compacted}");
    let summary = item["encrypted_content"].as_str().unwrap();
    assert!(
        summary.contains("Summary of the earlier conversation") && summary.contains("reply 2"),
        "readable: {summary}"
    );
    assert!(output_text(&compacted).starts_with("reply"), "{compacted}");
    // The turn's request was sent the summary in place of the older turns.
    let last = upstream.calls().len() - 1;
    let sent = sent(&upstream, last);
    assert!(
        sent.iter()
            .any(|(_, content)| content.to_string().contains("Summary of the earlier")),
        "{sent:?}"
    );
    assert!(
        sent.len() < 7,
        "the older turns are not sent whole: {sent:?}"
    );
    // It reads back the same.
    let id = compacted["id"].as_str().unwrap();
    let (_, read) = server
        .call(&key, "GET", &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(read["output"][0], compacted["output"][0]);

    // A response that stores nothing compacts nothing: its input is sent as it came.
    let long: String = "A long question about the thread. ".repeat(20);
    let (status, unstored) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "store": false,
               "input": [{"role": "user", "content": long.clone()},
                         {"role": "assistant", "content": "An answer."},
                         {"role": "user", "content": "And?"}],
               "context_management": [{"type": "compaction", "compact_threshold": 20}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{unstored}");
    assert!(
        unstored["output"]
            .as_array()
            .unwrap()
            .iter()
            .all(|item| item["type"] != "compaction"),
        "{unstored}"
    );
    let last = upstream.calls().len() - 1;
    let sent = self::sent(&upstream, last);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0].1, json!(long));
}

#[tokio::test]
async fn another_tenants_responses_and_conversations_are_not_found() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let other = server.key("globex").await;
    let (_, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Secret plans?"}),
    )
    .await;
    let id = first["id"].as_str().unwrap();
    for path in [
        format!("/v1/responses/{id}"),
        format!("/v1/responses/{id}/input_items"),
    ] {
        let (status, body) = server.call(&other, "GET", &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(!body.to_string().contains("Secret"), "{body}");
    }
    let calls = upstream.calls().len();
    let (status, body) = respond(
        &server,
        &other,
        json!({"model": "gpt-4o-mini", "input": "More?", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(upstream.calls().len(), calls, "nothing was sent");
    // A thread of the tenant named as a conversation is found; another tenant's is not.
    server
        .call(&key, "POST", "/v1/threads", Some(json!({"id": "plans"})))
        .await;
    let (status, body) = respond(
        &server,
        &other,
        json!({"model": "gpt-4o-mini", "input": "More?", "conversation": "plans"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "More?", "conversation": "plans"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The messages of the tenant's thread `thread` (`GET /v1/threads/{id}/messages`, a 200).
pub(crate) async fn thread_messages(server: &TestServer, key: &str, thread: &str) -> Vec<Value> {
    let (status, body) = server
        .call(key, "GET", &format!("/v1/threads/{thread}/messages"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{thread}: {body}");
    body["messages"].as_array().unwrap().clone()
}

/// The tenant's threads (`GET /v1/threads`).
pub(crate) async fn threads(server: &TestServer, key: &str) -> Vec<Value> {
    let (status, body) = server.call(key, "GET", "/v1/threads", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["threads"].as_array().unwrap().clone()
}

/// The thread a stored response's id names, as it is written in the id (the part after
/// `resp_<seq>_`).
pub(crate) fn thread_part(id: &Value) -> String {
    let id = id.as_str().unwrap_or_else(|| panic!("not an id: {id}"));
    id.splitn(3, '_').nth(2).unwrap().to_owned()
}

/// The thread a stored response's id names.
pub(crate) fn thread_of(id: &Value) -> String {
    let written = thread_part(id);
    let bytes =
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, written).unwrap();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn an_input_sent_whole_continues_the_response_whose_items_it_sends_back() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let (_, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?"}),
    )
    .await;
    let mut input = vec![json!({"role": "user", "content": "What is Rust?"})];
    input.extend(first["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"role": "user", "content": "And Go?"}));
    let (status, second) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": input}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["previous_response_id"], Value::Null, "{second}");
    assert_eq!(thread_part(&second["id"]), thread_part(&first["id"]));
    assert_eq!(
        sent(&upstream, 1),
        said(&[
            ("user", "What is Rust?"),
            ("assistant", "reply 1"),
            ("user", "And Go?")
        ])
    );
    // The thread holds each message once, and the second response brought one item.
    let listed = threads(&server, &key).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let id = second["id"].as_str().unwrap();
    let (_, items) = server
        .call(
            &key,
            "GET",
            &format!("/v1/responses/{id}/input_items"),
            None,
        )
        .await;
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    let thread = listed[0]["id"].as_str().unwrap();
    let messages = thread_messages(&server, &key, thread).await;
    assert_eq!(messages.len(), 4, "{messages:?}");

    // Another tenant sending the same items back continues nothing of this tenant's: its
    // input starts a thread of its own, and its upstream call holds only what it sent.
    let other = server.key("globex").await;
    input.truncate(2);
    input[0] = json!({"role": "user", "content": "Hello"});
    input.push(json!({"role": "user", "content": "Next?"}));
    let (status, body) = respond(
        &server,
        &other,
        json!({"model": "gpt-4o-mini", "input": input}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_ne!(thread_part(&body["id"]), thread_part(&first["id"]));
    assert_eq!(
        sent(&upstream, 2),
        said(&[
            ("user", "Hello"),
            ("assistant", "reply 1"),
            ("user", "Next?")
        ])
    );
    let theirs = threads(&server, &other).await;
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    let ours = thread_messages(&server, &key, thread).await;
    assert_eq!(ours.len(), 4, "{ours:?}");

    // Item ids that name no response of the tenant's (made up, or of a deleted response)
    // start a thread too.
    for made_up in ["msg_99_bm9uZQ_0", "fc_1_%%%_0", "msg_1_", "rs_x_y_z"] {
        let (status, body) = respond(
            &server,
            &key,
            json!({"model": "gpt-4o-mini", "input": [
                {"role": "user", "content": "Hi"},
                {"type": "message", "role": "assistant", "id": made_up,
                 "content": [{"type": "output_text", "text": "Hello"}]},
                {"role": "user", "content": "Again"}]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{made_up}: {body}");
        let calls = upstream.calls();
        let last = &calls.last().unwrap().json;
        assert_eq!(last["messages"].as_array().unwrap().len(), 3, "{made_up}");
    }
    let (status, _) = server
        .call(&key, "DELETE", &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut input = vec![json!({"role": "user", "content": "What is Rust?"})];
    input.extend(second["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"role": "user", "content": "And C?"}));
    let (status, third) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": input}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{third}");
    assert_ne!(thread_part(&third["id"]), thread_part(&first["id"]));
}

#[tokio::test]
async fn hostile_requests_are_refused_naming_what_is_wrong() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let table = [
        (json!([1, 2]), StatusCode::BAD_REQUEST, "body"),
        (json!({"input": "hi"}), StatusCode::BAD_REQUEST, "model"),
        (
            json!({"model": "gpt-4o-mini", "input": 7}),
            StatusCode::BAD_REQUEST,
            "input",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "web_search"}]}),
            StatusCode::BAD_REQUEST,
            "tools",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "background": true}),
            StatusCode::BAD_REQUEST,
            "background",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "surprise": 1}),
            StatusCode::BAD_REQUEST,
            "surprise",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "previous_response_id": "resp_1_x",
                   "conversation": "c"}),
            StatusCode::BAD_REQUEST,
            "conversation",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "previous_response_id": "resp_../../etc"}),
            StatusCode::NOT_FOUND,
            "",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "previous_response_id": "resp_99_bm93aGVyZQ"}),
            StatusCode::NOT_FOUND,
            "",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "conversation": "no-such-thread"}),
            StatusCode::NOT_FOUND,
            "",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}),
            StatusCode::BAD_REQUEST,
            "messages",
        ),
    ];
    for (body, expected, param) in table {
        let (status, answer) = respond(&server, &key, body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
        if !param.is_empty() {
            let named = answer["error"]["param"].as_str().unwrap_or_default();
            assert!(named.starts_with(param), "{body}: {answer}");
        }
    }
    for path in [
        "/v1/responses/resp_1",
        "/v1/responses/not-an-id",
        "/v1/responses/resp_1_%00%01/input_items",
    ] {
        let (status, body) = server.call(&key, "GET", path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (_, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?"}),
    )
    .await;
    let id = first["id"].as_str().unwrap();
    for query in ["limit=0", "limit=101", "order=sideways", "after=nope"] {
        let (status, body) = server
            .call(
                &key,
                "GET",
                &format!("/v1/responses/{id}/input_items?{query}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
    }
    assert_eq!(upstream.calls().len(), 1, "only the good request was sent");
}

#[tokio::test]
async fn a_deleted_response_reads_as_gone_and_its_thread_goes_on() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let other = server.key("globex").await;
    let (_, first) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?"}),
    )
    .await;
    let (_, second) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Who made it?", "previous_response_id": first["id"]}),
    )
    .await;
    let first_id = first["id"].as_str().unwrap();
    let path = format!("/v1/responses/{first_id}");
    let (status, _) = server.call(&other, "DELETE", &path, None).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another tenant cannot delete it"
    );
    let (status, deleted) = server.call(&key, "DELETE", &path, None).await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": first_id, "object": "response.deleted", "deleted": true})
    );
    for (method, path) in [
        ("GET", path.clone()),
        ("GET", format!("{path}/input_items")),
        ("DELETE", path.clone()),
    ] {
        let (status, body) = server.call(&key, method, &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
    }
    let (status, _) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "And?", "previous_response_id": first_id}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The thread keeps the conversation: the second response goes on with it, on the
    // thread itself (the deletion's mark is not a turn).
    let (status, third) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "When?", "previous_response_id": second["id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{third}");
    let last = upstream.calls().len() - 1;
    assert_eq!(
        sent(&upstream, last),
        said(&[
            ("user", "What is Rust?"),
            ("assistant", "reply 1"),
            ("user", "Who made it?"),
            ("assistant", "reply 2"),
            ("user", "When?")
        ])
    );
    let third_thread = ResponseIdThread::of(&third);
    assert_eq!(
        third_thread,
        ResponseIdThread::of(&second),
        "no branch was made"
    );
}

/// The thread a response id names (its part after the seq), to compare two responses'.
#[derive(Debug, PartialEq)]
struct ResponseIdThread(String);

impl ResponseIdThread {
    fn of(response: &Value) -> ResponseIdThread {
        let id = response["id"].as_str().unwrap();
        let (_, thread) = id.strip_prefix("resp_").unwrap().split_once('_').unwrap();
        ResponseIdThread(thread.to_owned())
    }
}

#[tokio::test]
async fn conversations_are_threads_with_items() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let other = server.key("globex").await;
    let (status, created) = server
        .call(
            &key,
            "POST",
            "/v1/conversations",
            Some(json!({"metadata": {"topic": "rust"},
                        "items": [{"type": "message", "role": "user", "content": "Hello"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(created["object"], "conversation");
    assert_eq!(created["metadata"], json!({"topic": "rust"}));
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("conv_"), "{id}");

    let (status, read) = server
        .call(&key, "GET", &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!((status, &read), (StatusCode::OK, &created));

    let (status, response) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "What is Rust?", "conversation": id}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    assert_eq!(response["conversation"]["id"], json!(id));
    assert_eq!(
        sent(&upstream, 0),
        said(&[("user", "Hello"), ("user", "What is Rust?")])
    );
    let (status, added) = server
        .call(
            &key,
            "POST",
            &format!("/v1/conversations/{id}/items"),
            Some(json!({"items": [{"role": "user", "content": "Noted."}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{added}");
    assert_eq!(added["data"].as_array().unwrap().len(), 1);

    let (status, items) = server
        .call(
            &key,
            "GET",
            &format!("/v1/conversations/{id}/items?order=asc"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{items}");
    let texts: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["Hello", "What is Rust?", "reply 1", "Noted."]);
    let first = items["data"][0]["id"].as_str().unwrap();
    let (_, page) = server
        .call(
            &key,
            "GET",
            &format!("/v1/conversations/{id}/items?order=asc&limit=2&after={first}"),
            None,
        )
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 2, "{page}");
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["content"][0]["text"], "What is Rust?");

    // Another tenant finds none of it.
    for (method, path, body) in [
        ("GET", format!("/v1/conversations/{id}"), None),
        ("GET", format!("/v1/conversations/{id}/items"), None),
        (
            "POST",
            format!("/v1/conversations/{id}/items"),
            Some(json!({"items": [{"role": "user", "content": "x"}]})),
        ),
        ("DELETE", format!("/v1/conversations/{id}"), None),
    ] {
        let (status, answer) = server.call(&other, method, &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
    }
    // Hostile bodies are refused naming the field.
    for (body, param) in [
        (json!({"items": "nope"}), "items"),
        (
            json!({"items": [{"type": "message", "role": "pirate", "content": "x"}]}),
            "items[0]",
        ),
        (json!({"metadata": {"n": 1}}), "metadata.n"),
        (json!({"surprise": true}), ""),
    ] {
        let (status, answer) = server
            .call(&key, "POST", "/v1/conversations", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let named = answer["error"]["param"].as_str().unwrap_or_default();
        assert!(named.starts_with(param), "{body}: {answer}");
    }
    let (status, _) = server
        .call(
            &key,
            "POST",
            &format!("/v1/conversations/{id}/items"),
            Some(json!({"items": []})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, deleted) = server
        .call(&key, "DELETE", &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["deleted"], true);
    let (status, _) = server
        .call(&key, "GET", &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_long_conversations_items_page_in_both_orders() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let (status, conversation) = server
        .call(&key, "POST", "/v1/conversations", Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{conversation}");
    let id = conversation["id"].as_str().unwrap();
    // 130 items, one with an id of its own.
    for batch in 0..2 {
        let items: Vec<Value> = (0..65)
            .map(|n| {
                let n = batch * 65 + n;
                if n == 70 {
                    json!({"type": "message", "role": "user", "id": "msg_own", "content": format!("item {n}")})
                } else {
                    json!({"role": "user", "content": format!("item {n}")})
                }
            })
            .collect();
        let (status, body) = server
            .call(
                &key,
                "POST",
                &format!("/v1/conversations/{id}/items"),
                Some(json!({"items": items})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let texts = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["content"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    };
    for order in ["asc", "desc"] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut path = format!("/v1/conversations/{id}/items?order={order}&limit=40");
            if let Some(after) = &after {
                path.push_str(&format!("&after={after}"));
            }
            let (status, page) = server.call(&key, "GET", &path, None).await;
            assert_eq!(status, StatusCode::OK, "{path}: {page}");
            seen.extend(texts(&page));
            if page["has_more"] == false {
                break;
            }
            after = Some(page["last_id"].as_str().unwrap().to_owned());
        }
        let mut expected: Vec<String> = (0..130).map(|n| format!("item {n}")).collect();
        if order == "desc" {
            expected.reverse();
        }
        assert_eq!(seen, expected, "{order}");
    }
    // After an item's own id, as after any other.
    for (order, next) in [("asc", "item 71"), ("desc", "item 69")] {
        let (status, page) = server
            .call(
                &key,
                "GET",
                &format!("/v1/conversations/{id}/items?order={order}&limit=1&after=msg_own"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(texts(&page), [next], "{order}");
    }
    let (status, page) = server
        .call(
            &key,
            "GET",
            &format!("/v1/conversations/{id}/items?after=item_9999_0"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert_eq!(page["error"]["param"], "after", "{page}");
}

#[tokio::test]
async fn compact_on_demand_compacts_a_thread_or_items_and_answers_the_window() {
    let upstream = FakeUpstream::start().await;
    let (_dir, server, key) = server(&upstream).await;
    let other = server.key("globex").await;
    let mut previous = Value::Null;
    let mut ids = Vec::new();
    for question in [
        "First question about node-7?",
        "Second one?",
        "Third one?",
        "Fourth one?",
    ] {
        let (_, response) = respond(
            &server,
            &key,
            json!({"model": "gpt-4o-mini", "input": question, "previous_response_id": previous}),
        )
        .await;
        previous = response["id"].clone();
        ids.push(previous.clone());
    }
    let compact = |body: Value| server.call(&key, "POST", "/v1/responses/compact", Some(body));

    // Not the newest response: the thread went on after it.
    let (status, body) =
        compact(json!({"model": "gpt-4o-mini", "previous_response_id": ids[1]})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Another tenant's response is not found.
    let (status, body) = server
        .call(
            &other,
            "POST",
            "/v1/responses/compact",
            Some(json!({"model": "gpt-4o-mini", "previous_response_id": previous})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    let (status, window) =
        compact(json!({"model": "gpt-4o-mini", "previous_response_id": previous})).await;
    assert_eq!(status, StatusCode::OK, "{window}");
    assert_eq!(window["object"], "response.compaction");
    let output = window["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "compaction", "{window}");
    assert!(
        output[0]["encrypted_content"]
            .as_str()
            .unwrap()
            .contains("Summary of the earlier conversation"),
        "{window}"
    );
    let usage = &window["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()),
        "the window's tokens before and after: {usage}"
    );
    // The next turn continues the compacted thread, on the thread itself.
    let calls = upstream.calls().len();
    let (status, next) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Fifth?", "previous_response_id": previous}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(
        ResponseIdThread::of(&next),
        ResponseIdThread::of(&json!({"id": previous}))
    );
    let sent_now = sent(&upstream, calls);
    assert!(
        sent_now
            .iter()
            .any(|(_, content)| content.to_string().contains("Summary of the earlier")),
        "{sent_now:?}"
    );
    assert!(sent_now.len() < 9, "{sent_now:?}");

    // Items alone: compacted in memory, nothing stored.
    let (_, before) = server.call(&key, "GET", "/v1/threads", None).await;
    let mut items = Vec::new();
    for n in 1..=6 {
        items.push(json!({"role": "user", "content": format!("question {n} about node-7")}));
        items.push(json!({"role": "assistant", "content": format!("answer {n}")}));
    }
    let (status, window) = compact(json!({"model": "gpt-4o-mini", "input": items})).await;
    assert_eq!(status, StatusCode::OK, "{window}");
    let output = window["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "compaction", "{window}");
    assert!(output.len() < 12, "{window}");
    let (_, after) = server.call(&key, "GET", "/v1/threads", None).await;
    assert_eq!(before, after, "nothing was stored");
    // Its output is a next request's input.
    let (status, answer) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": window["output"], "store": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    for (body, expected) in [
        (json!({"model": "gpt-4o-mini"}), StatusCode::BAD_REQUEST),
        (
            json!({"model": "gpt-4o-mini", "input": "x", "surprise": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"model": "gpt-4o-mini", "input": 3}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"model": "gpt-4o-mini", "previous_response_id": "resp_nope"}),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({"model": "gpt-4o-mini", "conversation": "no-such-thread"}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (status, answer) = compact(body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
    }
}
