//! End to end against a real small model (SmolLM2-135M-Instruct, 8,192-token window) behind a
//! local OpenAI-compatible endpoint: a workflow run and a compaction, an agent loop, an MCP
//! tool, and the Responses door of `contexture serve`, over real HTTP, with the model's own
//! usage. `.ci/run` starts the model (`tests/local-llm/start.sh`) and sets
//! `CONTEXTURE_TEST_LLM_URL`; under `CI=true` a missing model fails these tests, elsewhere they
//! say loudly that they skipped.
//!
//! A 135M model repeats rather than summarises, so these tests check the plumbing (requests
//! within the real window, usage, recording, all-or-nothing compaction) and print how many
//! facts a summary kept, as a measurement, never as a pass/fail condition.

use crate::common;

use common::{Outcome, RunToEnd, sqlite_url};
use contexture_store::testing::{TempDir, in_ci};
use serde_json::Value;

fn base_url() -> Option<String> {
    match std::env::var("CONTEXTURE_TEST_LLM_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if in_ci() => panic!(
            "CI=true and CONTEXTURE_TEST_LLM_URL is not set: .ci/run starts the local model with tests/local-llm/start.sh"
        ),
        _ => {
            eprintln!(
                "\n!!! SKIPPING a real-model test: set CONTEXTURE_TEST_LLM_URL (tests/local-llm/start.sh prints it).\n"
            );
            None
        }
    }
}

const MODELS: &str = r#"
[models.smollm2]
provider = "huggingface"
context_window = 8192
max_output_tokens = 96
encoding = "cl100k_base"
estimate_ratio = 1.1
"#;

/// Runs `contexture ARGS --db ...` and checks that it succeeded; with `base`, the model
/// options too.
fn contexture(dir: &TempDir, base: Option<&str>, args: &[&str]) -> Outcome {
    let mut command = common::contexture(args);
    command.args(["--db", &sqlite_url(dir, "runs.db")]);
    if let Some(base) = base {
        command
            .args(["--models", dir.join("models.toml").to_str().unwrap()])
            .args(["--llm", "openai:smollm2", "--openai-base-url", base])
            .args(["--llm-timeout", "120"]);
    }
    let outcome = command
        .env("OPENAI_API_KEY", "unused-by-the-local-server")
        .run();
    outcome.expect_success();
    outcome
}

#[test]
fn a_workflow_and_a_compaction_against_a_real_model() {
    let Some(base) = base_url() else { return };
    let dir = TempDir::new("contexture-real-model");
    std::fs::write(dir.join("models.toml"), MODELS).unwrap();
    let workflow = dir.join("wf.yaml");
    std::fs::write(
        &workflow,
        r#"
assistants:
  - id: helper
    model: smollm2
    system_prompt: You are a concise assistant. Answer in one or two sentences.
states:
  - {id: capital, assistant_id: helper, task: 'What is the capital of {{country}}?', next: {state_id: river, output_key: capital}}
  - {id: river, assistant_id: helper, task: 'Name a river in {{country}}.', next: {end: true}}
"#,
    )
    .unwrap();
    let output = contexture(
        &dir,
        Some(&base),
        &[
            "run",
            workflow.to_str().unwrap(),
            "--input",
            r#"{"country": "France"}"#,
            "--execution-id",
            "real",
        ],
    );
    let answer = String::from_utf8(output.stdout).unwrap();
    assert!(!answer.trim().is_empty());
    let report: Value =
        serde_json::from_slice(&contexture(&dir, None, &["inspect", "real", "--json"]).stdout)
            .unwrap();
    assert_eq!(report["status"], "completed");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    for call in calls {
        let budget = &call["request"]["breakdown"];
        assert_eq!(budget["context_window"], 8192);
        assert!(budget["remaining"].as_i64().unwrap() >= 0);
        let end = &call["end"];
        assert_eq!(end["outcome"], "completed");
        assert!(
            end["usage_estimated"].is_null(),
            "the server reported usage"
        );
        assert!(end["usage"]["input_tokens"].as_u64().unwrap() > 0);
    }
    eprintln!("real model answer: {}", answer.trim());

    // A conversation with facts, compacted by the real model.
    let facts = [
        ("ORD-4471", "The order id is ORD-4471."),
        ("Lisbon", "The parcel ships from Lisbon."),
        ("12 kg", "It weighs 12 kg."),
        ("Friday", "Delivery is due on Friday."),
        ("Maria", "The customer is Maria."),
    ];
    let mut conversation =
        vec![serde_json::json!({"role": "user", "content": "Track my parcel, please."})];
    for (_, fact) in facts {
        conversation.push(serde_json::json!({"role": "assistant", "content": fact}));
        conversation.push(serde_json::json!({"role": "user", "content": "Thanks. What else?"}));
    }
    conversation.push(serde_json::json!({"role": "assistant", "content": "That is all I know."}));
    std::fs::write(
        dir.join("conversation.json"),
        serde_json::to_string(&conversation).unwrap(),
    )
    .unwrap();
    let db = sqlite_url(&dir, "runs.db");
    common::contexture(["thread", "append", "--thread", "parcel", "--db", &db])
        .arg(dir.join("conversation.json"))
        .run()
        .expect_success();
    let output = contexture(
        &dir,
        Some(&base),
        &[
            "thread",
            "compact",
            "--thread",
            "parcel",
            "--model",
            "smollm2",
            "--keep-messages",
            "2",
            "--summary-tokens",
            "96",
            "--json",
        ],
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    // All or nothing: compacted with a summary, or failed with nothing replaced.
    match report["outcome"].as_str().unwrap() {
        "compacted" => {
            let summary = report["summary"].as_str().unwrap();
            assert!(!summary.trim().is_empty());
            let kept = facts
                .iter()
                .filter(|(key, _)| summary.contains(key))
                .count();
            eprintln!(
                "real-model summary kept {kept} of {} facts ({} calls, tokens {} -> {}): {summary}",
                facts.len(),
                report["calls"],
                report["tokens_before"],
                report["tokens_after"]
            );
        }
        other => panic!("unexpected outcome {other}: {report}"),
    }
}

/// Runs the agent workflow `workflow` as execution `id` against the real model (with
/// `extra` arguments) and reads its report: the model either answered or called its tools on
/// every allowed call, so the run completed or stopped at `max_iterations`. Returns the run,
/// the report and its status.
fn run_agent(
    dir: &TempDir,
    base: &str,
    workflow: &std::path::Path,
    id: &str,
    extra: &[&str],
) -> (Outcome, Value, String) {
    let run = common::contexture(["run", workflow.to_str().unwrap()])
        .args(["--execution-id", id])
        .args(extra)
        .args(["--db", &sqlite_url(dir, "runs.db")])
        .args(["--models", dir.join("models.toml").to_str().unwrap()])
        .args(["--llm", "openai:smollm2", "--openai-base-url", base])
        .args(["--llm-timeout", "120"])
        .env("OPENAI_API_KEY", "unused-by-the-local-server")
        .run();
    let report: Value =
        serde_json::from_slice(&contexture(dir, None, &["inspect", id, "--json"]).stdout).unwrap();
    let status = report["status"].as_str().unwrap().to_owned();
    if status == "failed" {
        let error = report["error"].as_str().unwrap_or_default();
        assert!(error.contains("max_iterations"), "{error}\n{}", run.stderr);
    } else {
        assert_eq!(status, "completed", "{}", run.stderr);
    }
    (run, report, status)
}

/// A small looping agent against the real model: the local server offers tools through a
/// JSON grammar, and the 135M model keeps calling its search tool, so the loop runs until
/// `max_iterations` (or the model answers). Its results (about 700 tokens each) are cut to
/// 400 and the older ones cleared past 1,200 tokens, on a 2,048-token window: every call must
/// fit the window as counted and as the model's own tokenizer reported, and keep the task.
#[test]
fn a_looping_agent_against_a_real_model_is_fitted_on_every_call() {
    let Some(base) = base_url() else { return };
    let dir = TempDir::new("contexture-real-model-loop");
    std::fs::write(dir.join("models.toml"), MODELS).unwrap();
    let workflow = dir.join("agent.yaml");
    std::fs::write(
        &workflow,
        r#"
assistants:
  - id: researcher
    model: smollm2
    system_prompt: You answer questions. Use the search tool to look things up.
    tools: [search]
    max_iterations: 5
    context:
      window: 2048
      reserve: 96
      truncate_tool_results: {max_tokens: 400}
      clear_tool_results: {trigger_tokens: 1200, keep: 1, clear_at_least: 200}
tools:
  - id: search
    description: Search the web.
    parameters: {type: object, properties: {q: {type: string}}, required: [q]}
    response: '{% for i in range(100) %}row {{ i }} about {{ arguments.q }}
      {% endfor %}'
states:
  - {id: ask, assistant_id: researcher, task: 'What is the population of Paris? Search first.', next: {end: true}}
"#,
    )
    .unwrap();
    let (_, report, status) = run_agent(&dir, &base, &workflow, "loop", &[]);
    let calls = report["calls"].as_array().unwrap();
    let (mut cleared, mut cut, mut largest) = (0, 0, 0);
    for (n, call) in calls.iter().enumerate() {
        let request = &call["request"];
        let fit = &request["fit"];
        let limit = fit["limit"].as_u64().unwrap();
        assert!(
            fit["tokens_after"].as_u64().unwrap() <= limit,
            "call {n}: {fit}"
        );
        assert_eq!(request["breakdown"]["context_window"], 2048, "call {n}");
        let texts: Vec<&str> = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect();
        assert!(
            texts.iter().any(|t| t.contains("population of Paris")),
            "call {n} kept its task"
        );
        let end = &call["end"];
        assert_eq!(end["outcome"], "completed", "call {n}: {end}");
        let reported = end["usage"]["input_tokens"].as_u64().unwrap();
        assert!(
            reported <= 2048,
            "call {n}: the model read {reported} tokens"
        );
        largest = largest.max(reported);
        cleared += fit["cleared"].as_array().map_or(0, Vec::len);
        cut += fit["truncated"].as_array().map_or(0, Vec::len);
    }
    eprintln!(
        "real-model loop: {} calls ({status}), {cut} results cut, {cleared} cleared, the largest request {largest} tokens as the model counted it",
        calls.len()
    );
    if calls.len() >= 4 {
        assert!(cut > 0 && cleared > 0, "cut {cut}, cleared {cleared}");
    }
}

/// The real model with a real MCP tool: the Python `mcp` package's server over stdio, its
/// `search` offered as `files__search` (the local server's grammar lets the model call it or
/// answer). Every call offers the tool, counts it and fits the window; whatever the model
/// asked the tool reached the server and its answer came back; the server is started once
/// and closed with the run.
#[test]
fn an_mcp_tool_against_a_real_model() {
    let Some(base) = base_url() else { return };
    if !contexture_mcp::testing::python_mcp() {
        return;
    }
    let dir = TempDir::new("contexture-real-model-mcp");
    std::fs::write(dir.join("models.toml"), MODELS).unwrap();
    let workflow = dir.join("mcp.yaml");
    let server = contexture_mcp::testing::fixture("tools_server.py");
    std::fs::write(
        &workflow,
        format!(
            r#"
mcp_servers:
  - name: files
    config: {{command: python3, args: ['{server}', '--name', files, '--tools', search]}}
assistants:
  - id: researcher
    model: smollm2
    system_prompt: You answer questions. Use the files__search tool to look things up.
    mcp_servers: [files]
    max_iterations: 3
    context: {{window: 2048, reserve: 96}}
states:
  - {{id: ask, assistant_id: researcher, task: 'Which city is the capital of France? Search first.', next: {{end: true}}}}
"#
        ),
    )
    .unwrap();
    let (run, report, status) = run_agent(&dir, &base, &workflow, "mcp", &["--trace"]);
    assert_eq!(
        run.stderr.matches("MCP server `files`: ready").count(),
        1,
        "{}",
        run.stderr
    );
    let calls = report["calls"].as_array().unwrap();
    let mut tool_results = 0;
    for (n, call) in calls.iter().enumerate() {
        let request = &call["request"];
        assert!(
            request["breakdown"]["tools"].as_u64().unwrap() > 0,
            "call {n} counted the MCP tool's schema"
        );
        assert!(
            request["fit"]["tokens_after"].as_u64().unwrap()
                <= request["fit"]["limit"].as_u64().unwrap(),
            "call {n}"
        );
        assert_eq!(call["end"]["outcome"], "completed", "call {n}");
        for message in request["messages"].as_array().unwrap() {
            if message["role"] == "tool" {
                let text = message["content"].as_str().unwrap_or_default();
                assert!(text.starts_with("files found: "), "call {n}: {text}");
                tool_results += 1;
            }
        }
    }
    eprintln!(
        "real-model MCP run: {} calls ({status}), {tool_results} tool results read back by later calls",
        calls.len()
    );
}

/// The Responses door of `contexture serve` in front of the real model: a response, one
/// continuing it (streamed: the local server answers whole, and the door writes the
/// documented events), and one continuing the first again, which runs on a branch. Each is
/// answered by the model with its own usage, and each request sent the history of its own
/// branch only.
#[test]
fn the_responses_door_against_a_real_model() {
    use common::serving::{Server, create_key};
    let Some(base) = base_url() else { return };
    let dir = TempDir::new("contexture-real-model-responses");
    let models = dir.join("models.toml");
    std::fs::write(&models, MODELS).unwrap();
    let db = sqlite_url(&dir, "serve.db");
    let key = create_key(&db, "acme");
    let mut server = Server::start_with(
        &db,
        &base,
        "unused-by-the-local-server",
        &[("CONTEXTURE_MODELS", models.to_str().unwrap())],
    );
    let respond = |body: Value| -> (String, String) {
        let (head, body) = server.request("POST", "/v1/responses", &key, Some(&body.to_string()));
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{head}\n{body}\n{}",
            server.stderr()
        );
        (head, body)
    };
    let answered = |response: &Value| {
        let status = response["status"].as_str().unwrap();
        // `incomplete` when the model used all of `max_output_tokens`.
        assert!(["completed", "incomplete"].contains(&status), "{response}");
        assert!(
            response["usage"]["input_tokens"].as_u64().unwrap() > 0,
            "{response}"
        );
        let text: String = response["output"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|part| part["text"].as_str().map(str::to_owned))
            .collect();
        assert!(!text.trim().is_empty(), "{response}");
        text
    };

    let (_, first) = respond(serde_json::json!({
        "model": "smollm2", "input": "What is the capital of France?",
        "instructions": "Answer in one sentence.", "max_output_tokens": 48}));
    let first: Value = serde_json::from_str(&first).unwrap();
    let first_text = answered(&first);

    let (head, streamed) = respond(serde_json::json!({
        "model": "smollm2", "input": "And of Italy?", "stream": true, "max_output_tokens": 48,
        "previous_response_id": first["id"]}));
    assert!(head.contains("text/event-stream"), "{head}");
    let events: Vec<Value> = streamed
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let numbers: Vec<u64> = events
        .iter()
        .map(|event| event["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["type"], "response.created");
    let last = events.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&last["type"].as_str().unwrap()),
        "{last}"
    );
    let second = &last["response"];
    let second_text = answered(second);

    let (_, third) = respond(serde_json::json!({
        "model": "smollm2", "input": "And of Spain?", "max_output_tokens": 48,
        "previous_response_id": first["id"]}));
    let third: Value = serde_json::from_str(&third).unwrap();
    let third_text = answered(&third);

    // The first two are one thread; the third is a branch after the first.
    let place = |response: &Value| {
        let id = response["id"].as_str().unwrap().to_owned();
        id.splitn(3, '_').nth(2).unwrap().to_owned()
    };
    assert_eq!(place(second), place(&first));
    assert_ne!(place(&third), place(&first));
    let threads = server.get_json("/v1/threads", &key);
    let threads = threads["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2, "{threads:?}");
    let branch = threads
        .iter()
        .find(|thread| thread["parent"].is_string())
        .unwrap_or_else(|| panic!("no branch: {threads:?}"));
    let events = server.get_json(
        &format!("/v1/threads/{}/events", branch["id"].as_str().unwrap()),
        &key,
    );
    let sent = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|event| event["type"] == "request_started")
        .unwrap()["messages"]
        .to_string();
    assert!(
        sent.contains("capital of France") && sent.contains("Spain"),
        "{sent}"
    );
    assert!(
        !sent.contains("Italy"),
        "the branch does not see the thread's second turn: {sent}"
    );
    eprintln!(
        "real-model Responses: {:?} / {:?} / {:?}; input tokens as the model counted them: {}, {}, {}",
        first_text,
        second_text,
        third_text,
        first["usage"]["input_tokens"],
        second["usage"]["input_tokens"],
        third["usage"]["input_tokens"]
    );
    server.stop();
}

/// The Messages door of `contexture serve` in front of the real model (an OpenAI-compatible
/// upstream): a stateless turn sending a client's tool loop with Anthropic's context editing,
/// answered as an Anthropic message with the clearing reported, then the same streamed,
/// written as Anthropic's named events.
#[test]
fn the_messages_door_against_a_real_model() {
    use common::serving::{Server, create_key};
    let Some(base) = base_url() else { return };
    let dir = TempDir::new("contexture-real-model-messages");
    let models = dir.join("models.toml");
    std::fs::write(&models, MODELS).unwrap();
    let db = sqlite_url(&dir, "serve.db");
    let key = create_key(&db, "acme");
    let server = Server::start_with(
        &db,
        &base,
        "unused-by-the-local-server",
        &[("CONTEXTURE_MODELS", models.to_str().unwrap())],
    );
    let mut messages =
        vec![serde_json::json!({"role": "user", "content": "List the cities you looked up."})];
    for (n, city) in ["Paris", "Rome", "Madrid", "Lisbon", "Berlin"]
        .iter()
        .enumerate()
    {
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": "lookup", "input": {"city": city}}]}));
        messages.push(serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{n}"),
             "content": format!("{city}: {}", "a long description of the city. ".repeat(40))}]}));
    }
    let body = serde_json::json!({"model": "smollm2", "max_tokens": 48,
        "system": "Answer in one sentence.",
        "tools": [{"name": "lookup", "description": "Looks a city up.",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": messages,
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 600},
            "keep": {"type": "tool_uses", "value": 1}}]}});
    let (head, answer) = server.request("POST", "/v1/messages", &key, Some(&body.to_string()));
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{head}\n{answer}\n{}",
        server.stderr()
    );
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["type"], "message", "{answer}");
    assert!(
        ["end_turn", "max_tokens", "tool_use"].contains(&answer["stop_reason"].as_str().unwrap()),
        "{answer}"
    );
    assert!(
        answer["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    assert!(
        !answer["content"].as_array().unwrap().is_empty(),
        "{answer}"
    );
    let applied = &answer["context_management"]["applied_edits"][0];
    assert_eq!(applied["type"], "clear_tool_uses_20250919", "{answer}");
    assert_eq!(applied["cleared_tool_uses"], 4, "{answer}");

    let mut streamed = body;
    streamed["stream"] = serde_json::json!(true);
    let (head, events) = server.request("POST", "/v1/messages", &key, Some(&streamed.to_string()));
    assert!(head.contains("text/event-stream"), "{head}\n{events}");
    let names: Vec<&str> = events
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"), "{events}");
    assert_eq!(names.last(), Some(&"message_stop"), "{events}");
    assert!(names.contains(&"content_block_delta"), "{events}");
    let delta = events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .find(|event| event["type"] == "message_delta")
        .unwrap_or_else(|| panic!("{events}"));
    assert_eq!(
        delta["context_management"]["applied_edits"][0]["cleared_tool_uses"], 4,
        "{delta}"
    );
}
