//! The official OpenAI Python SDK's Responses client (PyPI `openai`, pinned and installed by
//! `.ci/run`) against `contexture serve`, whose upstream is a local fake speaking chat
//! completions: chained responses, a branch, retrieve, input items, a stream, `store=False`,
//! truncation disabled, compaction and a conversation, as the SDK sends and reads them.
//!
//! The client is `tests/python/responses_sdk.py`. Under CI (`CI=true`) a missing `openai`
//! package fails the test; elsewhere the test says loudly that it skipped.

use crate::common;

use common::python;
use common::serving::{Server, create_key, start_upstream};
use contexture_fake_upstream::MODEL;
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

const CONVERSATION: &str = "sdk-conversation";

#[test]
fn the_openai_sdks_responses_client_talks_to_contexture_serve() {
    if !python::has_package("serve_responses_sdk", "openai", "openai==3.57.0") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = start_upstream(&runtime);
    let dir = TempDir::new("contexture-serve-responses");
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let key = create_key(&db, "acme");
    let mut server = Server::start(&db, &upstream.base_url(), "sk-upstream-secret");
    let (head, body) = server.request(
        "POST",
        "/v1/threads",
        &key,
        Some(&json!({"id": CONVERSATION}).to_string()),
    );
    assert!(head.starts_with("HTTP/1.1 201"), "{head}\n{body}");

    let seen = python::run_script(
        "responses_sdk.py",
        &server,
        &key,
        &[("CONTEXTURE_MODEL", MODEL), ("CONVERSATION", CONVERSATION)],
    );
    eprintln!("openai SDK {}", seen["sdk_version"]);

    assert_eq!(
        seen["chain"],
        json!(["reply 1", "reply 2", "reply 3"]),
        "{seen}"
    );
    assert_eq!(seen["chain_previous"], json!([true, true]));
    assert_eq!(seen["instructions"], json!(["You are terse.", null]));
    assert_eq!(seen["branch"], "reply 4");
    assert_eq!(seen["retrieved_same"], true);
    assert_eq!(seen["input_items"], json!(["user 2"]));
    let types: Vec<&str> = seen["stream"]["types"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(types.first(), Some(&"response.created"), "{types:?}");
    assert_eq!(types.last(), Some(&"response.completed"), "{types:?}");
    for kind in [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(types.contains(&kind), "{kind} in {types:?}");
    }
    assert_eq!(seen["stream"]["text"], "streamed reply 5");
    assert_eq!(seen["stream"]["completed_text"], "streamed reply 5");
    assert_eq!(seen["after_stream"], "reply 6");
    assert_eq!(seen["compact_object"], "response.compaction");
    assert_eq!(seen["compact_first_item"], "compaction");
    assert_eq!(seen["unstored_text"], "reply 7");
    assert_eq!(seen["unstored_retrieve"], "not found");
    assert_eq!(seen["unstored_continue"], "not found");
    assert_eq!(seen["truncation_disabled"], "context_length_exceeded");
    assert_eq!(seen["compaction_first_item"], "compaction");
    assert!(
        seen["compaction_text"]
            .as_str()
            .is_some_and(|text| text.contains("reply 2")),
        "the compaction item reads as text: {seen}"
    );
    assert_eq!(seen["conversation_answer"], "reply 9", "{seen}");

    // What the upstream was sent: each turn's history from its thread or branch.
    let calls = upstream.calls();
    let messages = |index: usize| -> Vec<(String, String)> {
        calls[index].json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| {
                (
                    message["role"].as_str().unwrap_or_default().to_owned(),
                    message["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let pairs = |items: &[(&str, &str)]| -> Vec<(String, String)> {
        items
            .iter()
            .map(|(role, text)| ((*role).to_owned(), (*text).to_owned()))
            .collect()
    };
    assert_eq!(
        messages(0),
        pairs(&[("system", "You are terse."), ("user", "user 1")])
    );
    assert_eq!(
        messages(2),
        pairs(&[
            ("user", "user 1"),
            ("assistant", "reply 1"),
            ("user", "user 2"),
            ("assistant", "reply 2"),
            ("user", "user 3")
        ])
    );
    assert_eq!(
        messages(3),
        pairs(&[
            ("user", "user 1"),
            ("assistant", "reply 1"),
            ("user", "branch question")
        ]),
        "the branch continues from the first answer"
    );
    assert_eq!(calls.len(), 9, "truncation disabled sent nothing upstream");
    for call in &calls {
        assert_eq!(
            call.authorization(),
            Some("Bearer sk-upstream-secret"),
            "the server's key goes upstream"
        );
    }
    server.stop();
}
