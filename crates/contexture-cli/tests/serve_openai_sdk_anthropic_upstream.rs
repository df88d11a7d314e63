//! The official OpenAI Python SDK (PyPI `openai`, pinned and installed by `.ci/run`) against
//! `contexture serve` for a model routed to an Anthropic-kind upstream (a fake speaking
//! Anthropic's Messages API): the chat endpoint and the Responses door, whole and streamed,
//! a tool call among them. Each request reaches the upstream in Anthropic's shape with the
//! server's own key, and each answer reaches the SDK in its own format.
//!
//! The client is `tests/python/openai_to_anthropic.py`. Under CI (`CI=true`) a missing
//! `openai` package fails the test; elsewhere the test says loudly that it skipped.

use crate::common;

use common::python;
use common::serving::{Server, create_key, start_upstream};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use serde_json::json;

const CLAUDE: &str = "claude-sonnet-4-5";

#[test]
fn the_openai_sdk_reaches_an_anthropic_upstream_through_both_doors() {
    if !python::has_package(
        "serve_openai_sdk_anthropic_upstream",
        "openai",
        "openai==3.57.0",
    ) {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let openai = start_upstream(&runtime);
    let anthropic = FakeUpstream::start_on(&runtime);
    anthropic.otherwise(|number, request| {
        let asks_weather = request.json.to_string().contains("Weather in Lisbon");
        let reply = if asks_weather {
            Reply::tool_call("toolu_1", "weather", json!({"city": "Lisbon"}))
        } else if request.wants_stream() {
            Reply::text_in_pieces(["claude".to_owned(), format!(" streamed {number}")])
        } else {
            Reply::text(format!("claude reply {number}"))
        };
        reply.usage(30, 4)
    });
    let dir = TempDir::new("contexture-serve-openai-to-anthropic");
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
    let seen = python::run_script(
        "openai_to_anthropic.py",
        &server,
        &key,
        &[("CLAUDE_MODEL", CLAUDE)],
    );

    assert_eq!(seen["chat"]["text"], "claude reply 1", "{seen}");
    assert_eq!(seen["chat"]["finish_reason"], "stop");
    assert_eq!(seen["chat"]["usage"], json!([30, 4]));
    assert_eq!(seen["chat_tool"]["name"], "weather");
    assert_eq!(seen["chat_tool"]["arguments"], json!({"city": "Lisbon"}));
    assert_eq!(seen["chat_tool"]["finish_reason"], "tool_calls");
    assert_eq!(seen["chat_stream"], "claude streamed 3");
    assert_eq!(seen["responses"]["text"], "claude reply 4");
    assert_eq!(seen["responses"]["status"], "completed");
    assert_eq!(seen["responses_chained"], "claude reply 5");
    assert_eq!(seen["responses_stream"]["deltas"], "claude streamed 6");
    assert_eq!(seen["responses_stream"]["completed"], "claude streamed 6");

    assert_eq!(
        openai.call_count(),
        0,
        "every call went to the Anthropic upstream"
    );
    let calls = anthropic.calls();
    assert_eq!(calls.len(), 6);
    for call in &calls {
        assert_eq!(call.path, "/v1/messages");
        assert_eq!(call.header("x-api-key"), Some("sk-ant-server-secret"));
        assert!(call.header("anthropic-version").is_some());
        assert_eq!(call.authorization(), None, "the client's key stays here");
        assert!(call.json["max_tokens"].as_u64().is_some(), "{}", call.json);
    }
    // The system prompt in Anthropic's place, the tool in Anthropic's shape.
    assert_eq!(calls[0].json["system"], "Be brief.");
    assert_eq!(calls[1].json["tools"][0]["name"], "weather");
    assert!(calls[1].json["tools"][0]["input_schema"].is_object());
    // The chained response sent the first turn's question and answer again.
    let chained = calls[4].json["messages"].to_string();
    assert!(chained.contains("Hello from Responses?"), "{chained}");
    assert!(chained.contains("claude reply 4"), "{chained}");
}
