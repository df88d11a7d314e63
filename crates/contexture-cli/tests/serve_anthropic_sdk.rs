//! The official Anthropic Python SDK (PyPI `anthropic`, pinned and installed by `.ci/run`)
//! against `contexture serve`'s Messages door: stateless turns, whole and streamed, to an
//! OpenAI-compatible fake upstream and (for `claude-*` models) to an Anthropic-kind fake,
//! a thinking block sent back byte for byte, turns of a named thread, the token count, the
//! model list, errors as the SDK's own exceptions, and a compaction (Anthropic's context
//! editing) whose block the SDK assembles from the stream and sends back.
//!
//! The client is `tests/python/anthropic_sdk.py`. Under CI (`CI=true`) a missing
//! `anthropic` package fails the test; elsewhere the test says loudly that it skipped.

use crate::common;

use common::python;
use common::serving::{Server, create_key, start_upstream};
use contexture_fake_upstream::{FakeUpstream, MODEL, Reply};
use contexture_store::testing::TempDir;
use serde_json::json;

const CLAUDE: &str = "claude-sonnet-4-5";

#[test]
fn the_anthropic_sdk_talks_to_the_messages_door() {
    if !python::has_package("serve_anthropic_sdk", "anthropic", "anthropic==2.10.0") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let openai = start_upstream(&runtime);
    // Anthropic's API always reports usage, in a stream too: its SDK counts on it.
    let anthropic = FakeUpstream::start_on(&runtime);
    anthropic.otherwise(|number, request| {
        if request.wants_stream() {
            Reply::text_in_pieces(["streamed".to_owned(), format!(" reply {number}")])
        } else {
            Reply::text(format!("reply {number}"))
        }
    });
    let dir = TempDir::new("contexture-serve-anthropic");
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[[upstreams]]\nmodels = [\"claude-*\"]\nkind = \"anthropic\"\nbase_url = \"{}\"\napi_key = \"sk-ant-server-secret\"\nretries = 0\n",
            anthropic.origin()
        ),
    )
    .unwrap();
    let key = create_key(&db, "acme");
    let server = Server::start_with(
        &db,
        &openai.base_url(),
        "sk-upstream-secret",
        &[("CONTEXTURE_CONFIG", &config.display().to_string())],
    );
    let thinking = json!({"type": "thinking", "thinking": "Earlier thought.",
                          "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk"});
    let seen = python::run_script(
        "anthropic_sdk.py",
        &server,
        &key,
        &[
            ("OPENAI_MODEL", MODEL),
            ("CLAUDE_MODEL", CLAUDE),
            ("THINKING_BLOCK", &thinking.to_string()),
        ],
    );
    eprintln!("anthropic SDK {}", seen["sdk_version"]);

    let plain = &seen["plain"];
    assert_eq!(plain["type"], "message", "{seen}");
    assert_eq!(plain["role"], "assistant");
    assert_eq!(plain["text"], "reply 1");
    assert_eq!(plain["stop_reason"], "end_turn");
    assert_eq!(
        seen["stream"]["pieces"],
        json!(["streamed", " reply", " 2"]),
        "{seen}"
    );
    assert_eq!(seen["stream"]["final"]["text"], "streamed reply 2");
    assert_eq!(seen["stream"]["final"]["stop_reason"], "end_turn");
    assert_eq!(seen["claude"]["text"], "reply 1", "{seen}");
    assert_eq!(seen["claude_stream"], "streamed reply 2");
    assert_eq!(seen["thread"], json!(["reply 3", "reply 4"]));
    assert!(
        seen["count_tokens"]
            .as_u64()
            .is_some_and(|tokens| tokens > 5),
        "{seen}"
    );
    assert_eq!(seen["models"], json!([MODEL]), "{seen}");
    assert_eq!(seen["bad_model"]["status"], 400, "{seen}");
    assert_eq!(seen["bad_model"]["type"], "invalid_request_error");
    assert!(
        seen["bad_model"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("no-such-model")),
        "{seen}"
    );
    assert_eq!(seen["bad_key"]["status"], 401);
    assert_eq!(seen["bad_key"]["type"], "authentication_error");

    let compaction = &seen["compaction"];
    assert_eq!(
        compaction["types"],
        json!(["compaction", "text"]),
        "{compaction}"
    );
    let summary = compaction["summary"].as_str().unwrap();
    assert!(
        summary.contains("Summary of the earlier conversation"),
        "{summary}"
    );
    assert_eq!(compaction["text"], "streamed reply 5");
    assert_eq!(compaction["stop_reason"], "end_turn");
    assert_eq!(compaction["after"], json!(["text"]), "no second compaction");

    // What the upstreams were sent.
    let openai_calls = openai.calls();
    assert_eq!(
        openai_calls.len(),
        6,
        "plain, streamed, two thread turns, two compaction turns"
    );
    for call in &openai_calls[4..] {
        let sent = call.json["messages"].as_array().unwrap();
        let texts: Vec<&str> = sent
            .iter()
            .filter_map(|message| message["content"].as_str())
            .collect();
        // The covered turns are not sent, only the summary that stands for them.
        assert!(
            !texts
                .iter()
                .any(|text| text.starts_with("Question 3 about")),
            "{sent:?}"
        );
        assert!(
            texts
                .iter()
                .any(|text| text.contains("Summary of the earlier conversation")),
            "{sent:?}"
        );
    }
    assert!(
        openai_calls[5].json["messages"]
            .to_string()
            .contains("Go on.")
    );
    assert_eq!(openai_calls[0].json["messages"][0]["content"], "Be brief.");
    let thread_turn = &openai_calls[3].json["messages"];
    assert_eq!(thread_turn.as_array().unwrap().len(), 3, "{thread_turn}");
    assert_eq!(thread_turn[1]["content"], "reply 3");
    for call in &openai_calls {
        assert_eq!(call.authorization(), Some("Bearer sk-upstream-secret"));
    }
    let claude_calls = anthropic.calls();
    assert_eq!(claude_calls.len(), 2);
    let first = &claude_calls[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.header("x-api-key"), Some("sk-ant-server-secret"));
    assert_eq!(first.authorization(), None, "the client's key stays here");
    assert_eq!(first.json["thinking"]["budget_tokens"], 1024);
    assert_eq!(
        first.json["messages"][1]["content"][0], thinking,
        "the thinking block reaches the upstream byte for byte"
    );
    assert!(claude_calls[1].wants_stream());
}
