//! The official OpenAI Python SDK (PyPI `openai`, installed by `.ci/run`) as a client of
//! `contexture serve`, whose upstream is a local fake: a three-turn conversation that sends
//! only each new message gets the thread's history sent upstream and all its turns stored;
//! a streamed answer reaches the client delta by delta and is stored too; the upstream sees
//! the server's key, never the client's, and the server's log never shows the upstream key.
//!
//! The client is `tests/python/three_turns.py`. Under CI (`CI=true`) a missing `openai`
//! package fails the test; elsewhere the test says loudly that it skipped.

use crate::common;

use std::time::Instant;

use common::python;
use common::serving::{Server, create_key, start_upstream};
use common::{RunToEnd, contexture};
use contexture_fake_upstream::MODEL;
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

const UPSTREAM_KEY: &str = "sk-upstream-secret";
const CHAT_THREAD: &str = "sdk-chat";
const STREAM_THREAD: &str = "sdk-stream";

/// A message as (role, text).
fn turn(message: &Value) -> (String, String) {
    (
        message["role"].as_str().unwrap_or_default().to_owned(),
        message["content"].as_str().unwrap_or_default().to_owned(),
    )
}

fn turns(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(role, text)| (role.to_string(), text.to_string()))
        .collect()
}

/// The thread's `message_appended` events, with the counts of its other event types.
fn stored(server: &Server, key: &str, thread: &str) -> (Vec<(String, String)>, Vec<Value>) {
    let page = server.get_json(&format!("/v1/threads/{thread}/events?limit=1000"), key);
    assert_eq!(page["next_after"], Value::Null, "one page holds them all");
    let events = page["events"].as_array().unwrap().clone();
    let messages = events
        .iter()
        .filter(|event| event["type"] == "message_appended")
        .map(|event| turn(&event["message"]))
        .collect();
    (messages, events)
}

#[test]
fn the_openai_python_sdk_talks_to_contexture_serve() {
    if !python::has_package("serve_sdk", "openai", "openai==3.57.0") {
        return;
    }
    let started = Instant::now();

    // The fake upstream.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = start_upstream(&runtime);
    let upstream_url = upstream.base_url();

    // A key for tenant acme, then the server.
    let dir = TempDir::new("contexture-serve-sdk");
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let key = create_key(&db, "acme");
    let mut server = Server::start(&db, &upstream_url, UPSTREAM_KEY);

    // The SDK's conversation.
    let summary = python::run_script(
        "three_turns.py",
        &server,
        &key,
        &[
            ("CONTEXTURE_MODEL", MODEL),
            ("THREAD_CHAT", CHAT_THREAD),
            ("THREAD_STREAM", STREAM_THREAD),
        ],
    );
    eprintln!("openai SDK {}", summary["sdk_version"]);

    // The client got the upstream's answers, and the thread named in metadata.
    assert_eq!(
        summary["answers"],
        json!(["reply 1", "reply 2", "reply 3"]),
        "{summary}"
    );
    assert_eq!(
        summary["response_threads"],
        json!([CHAT_THREAD, CHAT_THREAD]),
        "the thread from the header (turn 2) and from metadata (turn 3)"
    );

    // Upstream: each request carried the thread's history, although the client sent only
    // its new message.
    let received = upstream.calls();
    assert_eq!(received.len(), 5, "{received:#?}");
    let system = ("system", "You are terse.");
    assert_eq!(received[0].messages(), turns(&[system, ("user", "user 1")]));
    assert_eq!(
        received[1].messages(),
        turns(&[
            system,
            ("user", "user 1"),
            ("assistant", "reply 1"),
            ("user", "user 2")
        ])
    );
    let full_history = turns(&[
        system,
        ("user", "user 1"),
        ("assistant", "reply 1"),
        ("user", "user 2"),
        ("assistant", "reply 2"),
        ("user", "user 3"),
    ]);
    assert_eq!(received[2].messages(), full_history);
    for request in &received[..3] {
        assert_eq!(request.json["model"], MODEL);
        assert!(
            request.json.get("metadata").is_none(),
            "metadata.contexture_thread is not forwarded: {}",
            request.json
        );
    }

    // The streamed turn, and the turn after it, whose history holds the streamed answer.
    assert_eq!(received[3].json["stream"], true);
    assert_eq!(received[3].messages(), turns(&[("user", "stream please")]));
    // What the fake streams for the fourth call.
    let streamed = "streamed reply 4";
    assert_eq!(
        summary["stream"]["text"], streamed,
        "the deltas, joined, are the upstream's answer: {summary}"
    );
    assert_eq!(
        summary["stream"]["deltas"],
        json!(["streamed", " reply", " 4"])
    );
    assert_eq!(summary["stream"]["finish_reason"], "stop");
    assert_eq!(
        received[4].messages(),
        turns(&[
            ("user", "stream please"),
            ("assistant", "streamed reply 4"),
            ("user", "after the stream")
        ]),
        "the next turn's history holds the streamed answer"
    );
    assert_eq!(summary["follow_up"], "reply 5");

    // Keys: the upstream got the server's, never the client's.
    for (i, request) in received.iter().enumerate() {
        assert_eq!(
            request.authorization(),
            Some("Bearer sk-upstream-secret"),
            "request {i}"
        );
        let headers = format!("{:?}", request.headers);
        assert!(
            !headers.contains("ctx_") && !request.json.to_string().contains("ctx_"),
            "the client's key reached the upstream in request {i}:\n{headers}\n{}",
            request.json
        );
    }

    // The threads hold every turn.
    let (messages, events) = stored(&server, &key, CHAT_THREAD);
    let mut all_turns = full_history.clone();
    all_turns.push(("assistant".into(), "reply 3".into()));
    assert_eq!(messages, all_turns, "{events:#?}");
    for (kind, count) in [("request_started", 3), ("request_ended", 3)] {
        assert_eq!(
            events.iter().filter(|event| event["type"] == kind).count(),
            count,
            "{kind}: {events:#?}"
        );
    }
    // What the thread would send now, fitted to the model: the third request's history,
    // then the third answer.
    let context = server.get_json(
        &format!("/v1/threads/{CHAT_THREAD}/context?model={MODEL}"),
        &key,
    );
    let fitted: Vec<_> = context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(turn)
        .collect();
    assert_eq!(fitted, all_turns, "{context}");
    assert_eq!(received[2].messages(), fitted[..fitted.len() - 1]);
    let (messages, events) = stored(&server, &key, STREAM_THREAD);
    assert_eq!(
        messages,
        turns(&[
            ("user", "stream please"),
            ("assistant", "streamed reply 4"),
            ("user", "after the stream"),
            ("assistant", "reply 5"),
        ]),
        "{events:#?}"
    );

    // The server's log never shows the upstream key (nor the client's).
    let log = server.stop();
    assert!(
        !log.contains(UPSTREAM_KEY),
        "the upstream key is in the server's log:\n{log}"
    );
    let secret = key.rsplit('_').next().unwrap();
    assert!(
        !log.contains(secret),
        "the client's key is in the server's log:\n{log}"
    );

    // Stored durably, under the tenant's scope: the CLI reads `acme/ID` from the database.
    let listed = contexture([
        "thread",
        "messages",
        "--thread",
        &format!("acme/{CHAT_THREAD}"),
        "--db",
        &db,
    ])
    .run()
    .expect_json();
    let listed: Vec<_> = listed.as_array().unwrap().iter().map(turn).collect();
    assert_eq!(listed, all_turns);
    eprintln!("serve_sdk took {:?}", started.elapsed());
}
