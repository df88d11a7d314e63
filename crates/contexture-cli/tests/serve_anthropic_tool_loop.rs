//! A 30-step tool loop the official Anthropic Python SDK drives through `contexture serve`'s
//! Messages door with Anthropic's context editing (`clear_tool_uses_20250919`) on a
//! 16,000-token window: the client sends its whole history every step, each of its 30
//! results about 1,200 tokens (three windows' worth in all), and the door clears the old
//! ones. Every request the upstream received fits the window and keeps the provider's rules,
//! the task and the three newest results reach it whole, and `applied_edits` reports each
//! clearing as the upstream saw it.
//!
//! The client is `tests/python/anthropic_tool_loop.py`. Under CI (`CI=true`) a missing
//! `anthropic` package fails the test; elsewhere the test says loudly that it skipped.

use crate::common;

use common::python;
use common::serving::{Server, create_key};
use contexture_core::fit::{Rules, is_cleared_placeholder, validate};
use contexture_core::format::openai::parse_request;
use contexture_core::{Encoding, Role, TokenCounter};
use contexture_fake_upstream::{FakeUpstream, MODEL, Reply};
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

const STEPS: usize = 30;
const WINDOW: u64 = 16_000;
const REPLY: u64 = 1_000;
const TASK: &str = "Audit every part of the parser and report what is unsafe.";

#[test]
fn a_thirty_step_tool_loop_stays_in_a_small_window_by_clearing_old_tool_uses() {
    if !python::has_package(
        "serve_anthropic_tool_loop",
        "anthropic",
        "anthropic==2.10.0",
    ) {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    upstream.otherwise(|number, _| {
        if number <= STEPS {
            Reply::tool_call(
                &format!("call_{number}"),
                "read_file",
                json!({"path": format!("src/parser/part_{number}.rs")}),
            )
        } else {
            Reply::text("Audit complete: nothing unsafe.")
        }
    });
    let dir = TempDir::new("contexture-serve-tool-loop");
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let config = dir.join("serve.toml");
    std::fs::write(&config, format!("[context]\nwindow = {WINDOW}\n")).unwrap();
    let key = create_key(&db, "acme");
    let server = Server::start_with(
        &db,
        &upstream.base_url(),
        "sk-upstream-secret",
        &[("CONTEXTURE_CONFIG", &config.display().to_string())],
    );
    let seen = python::run_script(
        "anthropic_tool_loop.py",
        &server,
        &key,
        &[
            ("MODEL", MODEL),
            ("TASK", TASK),
            ("TRIGGER_TOKENS", "10000"),
        ],
    );
    eprintln!("anthropic SDK {}", seen["sdk_version"]);
    let calls = seen["calls"].as_array().unwrap();
    assert_eq!(calls.len(), STEPS + 1, "{seen}");
    assert_eq!(seen["final"], "Audit complete: nothing unsafe.");
    let results = seen["results"].as_object().unwrap();
    assert_eq!(results.len(), STEPS);

    let counter = TokenCounter::exact(Encoding::O200kBase);
    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), STEPS + 1);
    let mut cleared_at_end = 0;
    for (step, (body, call)) in bodies.iter().zip(calls).enumerate() {
        assert!(body.get("context_management").is_none());
        let messages = parse_request(body).unwrap();
        assert_eq!(validate(&messages, Rules::OpenAi), vec![], "step {step}");
        let tools = body["tools"].as_array().cloned().unwrap_or_default();
        let tokens = u64::from(counter.count_request(&messages, &tools).total);
        assert!(
            tokens + REPLY <= WINDOW,
            "step {step}: {tokens} tokens and the reply's {REPLY} do not fit {WINDOW}"
        );
        // The task is the first message, whole.
        assert_eq!(messages[0].role, Role::User);
        assert_eq!(messages[0].text(), TASK, "step {step}");
        // Every call made so far keeps its result: the newest three whole, the others
        // whole or a placeholder naming the call.
        let sent: Vec<(String, String)> = messages
            .iter()
            .filter(|message| message.role == Role::Tool)
            .map(|message| {
                (
                    message.tool_call_id.as_deref().unwrap().to_owned(),
                    message.text(),
                )
            })
            .collect();
        assert_eq!(sent.len(), step, "step {step}: every result is there");
        let placeholders = sent
            .iter()
            .filter(|(_, text)| is_cleared_placeholder(text))
            .count();
        for (n, (id, text)) in sent.iter().enumerate() {
            let original = results[id].as_str().unwrap();
            if n + 3 >= sent.len() {
                assert_eq!(
                    text, original,
                    "step {step}: result {n} is among the newest"
                );
            } else if is_cleared_placeholder(text) {
                assert!(text.contains(id.as_str()), "{text}");
            } else {
                assert_eq!(text, original);
            }
        }
        // What the answer reports is what the upstream was sent.
        let applied = call["applied_edits"].as_array().unwrap();
        if placeholders == 0 {
            assert_eq!(applied, &Vec::<Value>::new(), "step {step}");
        } else {
            assert_eq!(applied.len(), 1, "step {step}: {applied:?}");
            assert_eq!(applied[0]["type"], "clear_tool_uses_20250919");
            assert_eq!(applied[0]["cleared_tool_uses"], placeholders, "step {step}");
            assert!(
                applied[0]["cleared_input_tokens"].as_u64().unwrap() > 1_000 * placeholders as u64
            );
        }
        let stop = if step < STEPS { "tool_use" } else { "end_turn" };
        assert_eq!(call["stop_reason"], stop, "step {step}");
        cleared_at_end = placeholders;
    }
    // By the end, all but the three newest results were cleared: the whole history, sent
    // unedited, would have been more than twice the window.
    assert_eq!(cleared_at_end, STEPS - 3);
    let unedited: usize = results
        .values()
        .map(|text| text.as_str().unwrap().len())
        .sum();
    assert!(
        unedited / 4 > 2 * WINDOW as usize,
        "{unedited} bytes of results"
    );
}
