//! The OpenAI Agents SDK (PyPI `openai-agents`, pinned and installed by `.ci/run`) with its
//! default Responses model against `contexture serve`: a 30-iteration tool loop whose log
//! parts do not fit the model's 16,000-token window, once sending its whole input each turn
//! (the SDK's default) and once chained with `auto_previous_response_id`. Every request the
//! upstream gets fits the window, passes the provider's rules, and keeps the task and the
//! newest result whole.
//!
//! The client is `tests/python/agents_loop.py`. Under CI (`CI=true`) a missing package fails
//! the test; elsewhere the test says loudly that it skipped.

use crate::common;

use common::python;
use common::serving::{Server, create_key};
use contexture_core::fit::{Rules, validate};
use contexture_core::format::openai;
use contexture_core::tokens::{Encoding, message_tokens};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use serde_json::json;

const MODEL: &str = "agent-16k";
const WINDOW: u32 = 16_000;
const ITERATIONS: usize = 30;
const TASK: &str = "TASK: find out why node-7 fails. Read parts 1 to 30.";
const FINAL: &str = "Node-7 fails on disk pressure.";

fn run_agent(mode: &str) {
    if !python::has_package("serve_agents_sdk", "agents", "openai-agents==0.24.0") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    upstream.otherwise(|number, _| {
        if number <= ITERATIONS {
            Reply::tool_call(
                &format!("call_{number}"),
                "read_log",
                json!({"part": number}),
            )
        } else {
            Reply::text(FINAL)
        }
    });
    let dir = TempDir::new("contexture-serve-agents");
    let models = dir.join("models.toml");
    std::fs::write(
        &models,
        format!(
            "[models.\"{MODEL}\"]\ncontext_window = {WINDOW}\nmax_output_tokens = 1000\nencoding = \"o200k_base\"\n"
        ),
    )
    .unwrap();
    // An agent's task opens its history: the operator keeps it (`head-tail`) and the
    // newest history that fits.
    let config = dir.join("contexture.toml");
    std::fs::write(&config, "[context]\nstrategy = \"head-tail\"\n").unwrap();
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let key = create_key(&db, "acme");
    let models = models.display().to_string();
    let config = config.display().to_string();
    let mut server = Server::start_with(
        &db,
        &upstream.base_url(),
        "sk-upstream-secret",
        &[
            ("CONTEXTURE_MODELS", models.as_str()),
            ("CONTEXTURE_CONFIG", config.as_str()),
        ],
    );

    let seen = python::run_script(
        "agents_loop.py",
        &server,
        &key,
        &[("CONTEXTURE_MODEL", MODEL), ("AGENT_MODE", mode)],
    );
    assert_eq!(seen["final"], FINAL, "{seen}");
    assert_eq!(
        seen["tool_calls"],
        json!((1..=ITERATIONS).collect::<Vec<_>>()),
        "{seen}"
    );

    let calls = upstream.calls();
    assert_eq!(calls.len(), ITERATIONS + 1);
    let mut trimmed = 0;
    for (index, call) in calls.iter().enumerate() {
        let messages = openai::parse_messages(&call.json["messages"])
            .unwrap_or_else(|error| panic!("call {index}: {error}"));
        let tokens: u32 = messages
            .iter()
            .map(|message| message_tokens(message, Encoding::O200kBase))
            .sum();
        assert!(
            tokens < WINDOW,
            "call {index} ({mode}) sent {tokens} tokens to a {WINDOW}-token window"
        );
        let problems = validate(&messages, Rules::OpenAi);
        assert!(problems.is_empty(), "call {index} ({mode}): {problems:?}");
        let texts: Vec<String> = messages.iter().map(|message| message.text()).collect();
        assert!(
            texts.iter().any(|text| text == TASK),
            "call {index} ({mode}) lost the task: {texts:?}"
        );
        if index > 0 {
            let newest = texts.last().unwrap();
            assert!(
                newest.starts_with(&format!("LOG PART {index} BEGINS"))
                    && newest.ends_with(&format!("LOG PART {index} ENDS.")),
                "call {index} ({mode}): the newest result is not whole: {newest:.80}"
            );
        }
        if texts
            .iter()
            .filter(|text| text.starts_with("LOG PART"))
            .count()
            < index
        {
            trimmed += 1;
        }
    }
    assert!(trimmed > 0, "the log never overflowed the window ({mode})");

    // Whichever way the client sends its history, the loop is one thread holding each
    // message once: the task, thirty calls with their results, the answer. A client that
    // sends its whole input continues the response whose output items it sends back.
    let threads = server.get_json("/v1/threads", &key);
    let threads = threads["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "({mode}) {threads:#?}");
    let thread = threads[0]["id"].as_str().unwrap();
    let messages = server.get_json(&format!("/v1/threads/{thread}/messages"), &key);
    let messages = messages["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2 * ITERATIONS + 2, "({mode})");
    let text_bytes: usize = messages
        .iter()
        .map(|message| message.to_string().len())
        .sum();
    let stored = threads[0]["message_bytes"].as_u64().unwrap();
    assert!(
        stored < 2 * text_bytes as u64,
        "({mode}) the thread stores {stored} bytes of messages for {text_bytes} bytes of them"
    );
    eprintln!(
        "{mode}: one thread, {} messages, {stored} message bytes stored for {text_bytes} bytes of messages as read, {} bytes in all",
        messages.len(),
        threads[0]["bytes"]
    );
    server.stop();
}

#[test]
fn the_agents_sdk_runs_a_long_tool_loop_sending_its_whole_input() {
    run_agent("whole");
}

#[test]
fn the_agents_sdk_runs_a_long_tool_loop_chained_by_previous_response_id() {
    run_agent("chained");
}
