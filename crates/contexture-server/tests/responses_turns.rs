//! Responses turns as clients stress them, over real sockets against a fake upstream: several
//! turns continuing one response at once (a client fanning out), a client that leaves before
//! its answer (whole and streamed), and retries with an `Idempotency-Key` (whole, streamed,
//! and on a branch).

use crate::common;
use crate::responses::{
    events, output_text, respond, server, thread_messages, thread_of, thread_part, threads,
};

use std::time::{Duration, Instant};

use common::{TestServer, client};
use contexture_fake_upstream::{FakeUpstream, Reply, Request};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The text of the last message an upstream call was sent.
fn last_text(request: &Request) -> String {
    let messages = request.json["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    messages
        .last()
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The (role, text) of each message of the upstream call whose last message is `last`.
fn call_ending_with(upstream: &FakeUpstream, last: &str) -> Vec<(String, String)> {
    let call = upstream
        .calls()
        .into_iter()
        .find(|call| last_text(call) == last)
        .unwrap_or_else(|| panic!("no upstream call ends with {last:?}"));
    call.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| {
            (
                message["role"].as_str().unwrap().to_owned(),
                message["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(role, text)| ((*role).to_owned(), (*text).to_owned()))
        .collect()
}

/// An upstream that answers each call after a moment with `answer to <its last message>`.
async fn echoing_upstream() -> FakeUpstream {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|_, request| {
        Reply::text(format!("answer to {}", last_text(request))).after(Duration::from_millis(50))
    });
    upstream
}

/// `POST /v1/responses` with an `Idempotency-Key`: the status, the replay header, the body.
async fn keyed(
    server: &TestServer,
    key: &str,
    idempotency: &str,
    body: Value,
) -> (StatusCode, bool, String) {
    let response = client()
        .post(server.url("/v1/responses"))
        .bearer_auth(key)
        .header("Idempotency-Key", idempotency)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let replayed = response.headers().get("x-contexture-replayed").is_some();
    (status, replayed, response.text().await.unwrap())
}

/// The events of the tenant's thread `thread` of type `kind`, once `ready` holds for them
/// (waiting up to 20 s: a turn a client left goes on without it).
async fn events_when(
    server: &TestServer,
    key: &str,
    thread: &str,
    kind: &str,
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, page) = server
            .call(key, "GET", &format!("/v1/threads/{thread}/events"), None)
            .await;
        let found: Vec<Value> = page["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter(|event| event["type"] == kind)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if ready(&found) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{thread}: {kind} never came: {page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn several_turns_continuing_one_response_at_once_are_each_answered_and_go_on() {
    let upstream = echoing_upstream().await;
    let (_dir, server, key) = server(&upstream).await;
    let (_, first) = respond(&server, &key, json!({"model": "gpt-4o-mini", "input": "Q"})).await;
    let first_id = first["id"].clone();
    const FAN: usize = 5;
    let server = std::sync::Arc::new(server);
    let mut turns = Vec::new();
    for branch in 0..FAN {
        let (server, key, first_id) = (server.clone(), key.clone(), first_id.clone());
        turns.push(tokio::spawn(async move {
            respond(
                &server,
                &key,
                json!({"model": "gpt-4o-mini", "input": format!("A{branch}"),
                       "previous_response_id": first_id}),
            )
            .await
        }));
    }
    let mut answers = Vec::new();
    for (branch, turn) in turns.into_iter().enumerate() {
        let (status, answer) = turn.await.unwrap();
        assert_eq!(status, StatusCode::OK, "A{branch}: {answer}");
        assert_eq!(output_text(&answer), format!("answer to A{branch}"));
        assert_eq!(answer["previous_response_id"], first_id);
        answers.push(answer);
    }
    // One joined the thread; the others run on branches of their own, in arrival order.
    let places: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|answer| thread_part(&answer["id"]))
        .collect();
    assert_eq!(
        places.len(),
        FAN,
        "each turn has a place of its own: {places:?}"
    );
    assert_eq!(
        answers
            .iter()
            .filter(|answer| thread_part(&answer["id"]) == thread_part(&first_id))
            .count(),
        1
    );
    for branch in 0..FAN {
        let a = format!("A{branch}");
        assert_eq!(
            call_ending_with(&upstream, &a),
            pairs(&[("user", "Q"), ("assistant", "answer to Q"), ("user", &a)]),
            "a turn sees the response it continues, nothing of the others"
        );
    }
    // Each can be continued, and its next turn sees its own branch only.
    for (branch, answer) in answers.iter().enumerate() {
        let (a, b) = (format!("A{branch}"), format!("B{branch}"));
        let (status, next) = respond(
            &server,
            &key,
            json!({"model": "gpt-4o-mini", "input": b, "previous_response_id": answer["id"]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{next}");
        assert_eq!(thread_part(&next["id"]), thread_part(&answer["id"]));
        assert_eq!(
            call_ending_with(&upstream, &b),
            pairs(&[
                ("user", "Q"),
                ("assistant", "answer to Q"),
                ("user", &a),
                ("assistant", &format!("answer to {a}")),
                ("user", &b),
            ])
        );
        // Every thread a race left behind reads whole.
        let thread = thread_of(&next["id"]);
        let messages = thread_messages(&server, &key, &thread).await;
        assert_eq!(messages.len(), 6, "{messages:?}");
        let (status, read) = server
            .call(
                &key,
                "GET",
                &format!("/v1/responses/{}", answer["id"].as_str().unwrap()),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{read}");
        assert_eq!(output_text(&read), format!("answer to {a}"));
    }
}

#[tokio::test]
async fn a_client_that_leaves_loses_nothing_the_turn_records() {
    let upstream = FakeUpstream::start().await;
    upstream.extend([
        // A whole answer sent late.
        Reply::text("late answer").after(Duration::from_millis(800)),
        // A stream whose first chunk comes at once and the rest late.
        Reply::text("streamed late").pause_after(1, Duration::from_secs(3)),
    ]);
    let (_dir, server, key) = server(&upstream).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();

    // A whole answer: the client gives up; the answer is still stored and readable.
    let gone = impatient
        .post(server.url("/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": "gpt-4o-mini", "input": "Hi"}))
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    let thread = threads(&server, &key).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ends = events_when(&server, &key, &thread, "request_ended", |ends| {
        !ends.is_empty()
    })
    .await;
    assert_eq!(ends[0]["outcome"], "completed", "{ends:?}");
    let started = events_when(&server, &key, &thread, "request_started", |s| !s.is_empty()).await;
    let id = format!(
        "resp_{}_{}",
        started[0]["seq"],
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &thread)
    );
    let (status, read) = server
        .call(&key, "GET", &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["status"], "completed", "{read}");
    assert_eq!(output_text(&read), "late answer");

    // A stream: the client leaves after the first event; the request is recorded as
    // cancelled with what had arrived, and no half answer joins the conversation.
    let mut response = client()
        .post(server.url("/v1/responses"))
        .bearer_auth(&key)
        .json(&json!({"model": "gpt-4o-mini", "input": "Hello", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("response.output_text.delta") {
        let chunk = response.chunk().await.unwrap().expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(response);
    let created = events(&seen)
        .into_iter()
        .find(|(name, _)| name == "response.created")
        .unwrap();
    let id = created.1["response"]["id"].clone();
    let thread = thread_of(&id);
    let ends = events_when(&server, &key, &thread, "request_ended", |ends| {
        !ends.is_empty()
    })
    .await;
    assert_eq!(ends[0]["outcome"], "cancelled", "{ends:?}");
    assert_eq!(ends[0]["reply"]["content"], "streamed ", "{ends:?}");
    assert_eq!(
        thread_messages(&server, &key, &thread).await,
        [json!({"role": "user", "content": "Hello"})]
    );
    // The response it left reads as not completed, and the thread goes on from it.
    let (status, read) = server
        .call(
            &key,
            "GET",
            &format!("/v1/responses/{}", id.as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_ne!(read["status"], "completed", "{read}");
    upstream.push(Reply::text("Hello again."));
    let (status, next) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Still there?", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(thread_part(&next["id"]), thread_part(&id));
    assert_eq!(output_text(&next), "Hello again.");
}

#[tokio::test]
async fn a_retry_with_the_same_idempotency_key_gets_the_first_answer() {
    let upstream = echoing_upstream().await;
    let (_dir, server, key) = server(&upstream).await;
    let body = json!({"model": "gpt-4o-mini", "input": "Buy milk"});
    let (status, replayed, first) = keyed(&server, &key, "order-1", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(!replayed);
    let first: Value = serde_json::from_str(&first).unwrap();
    let (status, replayed, again) = keyed(&server, &key, "order-1", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(replayed, "a retry is answered from the record");
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["id"], first["id"]);
    assert_eq!(output_text(&again), "answer to Buy milk");
    assert_eq!(upstream.calls().len(), 1, "the upstream was called once");
    // The key with another request is refused, naming the key.
    let (status, _, refused) = keyed(
        &server,
        &key,
        "order-1",
        json!({"model": "gpt-4o-mini", "input": "Buy bread"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(refused.contains("Idempotency-Key"), "{refused}");

    // A stream retried is the same response's events again.
    let body = json!({"model": "gpt-4o-mini", "input": "Buy eggs", "stream": true});
    let (status, replayed, streamed) = keyed(&server, &key, "order-2", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{streamed}");
    assert!(!replayed);
    let (status, replayed, again) = keyed(&server, &key, "order-2", body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(replayed);
    let completed = |body: &str| {
        events(body)
            .into_iter()
            .find(|(name, _)| name == "response.completed")
            .unwrap_or_else(|| panic!("no response.completed: {body}"))
            .1["response"]
            .clone()
    };
    let (streamed, again) = (completed(&streamed), completed(&again));
    assert_eq!(again["id"], streamed["id"]);
    assert_eq!(output_text(&again), "answer to Buy eggs");
    assert_eq!(output_text(&streamed), output_text(&again));
    assert_eq!(upstream.calls().len(), 2);

    // A keyed turn continuing an older response runs on a branch its retry finds.
    let (_, later) = respond(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "input": "Then?", "previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(thread_part(&later["id"]), thread_part(&first["id"]));
    let body = json!({"model": "gpt-4o-mini", "input": "Instead?",
                      "previous_response_id": first["id"]});
    let (status, _, branched) = keyed(&server, &key, "order-3", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{branched}");
    let branched: Value = serde_json::from_str(&branched).unwrap();
    assert_ne!(thread_part(&branched["id"]), thread_part(&first["id"]));
    let calls = upstream.calls().len();
    let (status, replayed, again) = keyed(&server, &key, "order-3", body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(replayed);
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["id"], branched["id"]);
    assert_eq!(upstream.calls().len(), calls);
}
