//! Anthropic's context editing carried out by the Messages door for any upstream: old tool
//! uses cleared by tokens or by count (kept, excluded and input-cleared as asked), old
//! thinking left out with the newest kept byte for byte, what was done reported in
//! `context_management.applied_edits` of whole and streamed answers, and the field never
//! sent upstream.

use contexture_fake_upstream::{FakeUpstream, Reply};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::messages::{message, post, server, text};
use crate::responses::events;

/// A tool loop as a client sends it: the task, then `tools.len()` tool uses of the named
/// tools, each answered with a long result, the last one's result last.
fn tool_loop(tools: &[&str]) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "Audit the repository's files."})];
    for (n, tool) in tools.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Reading file {n}.")},
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": tool,
             "input": {"path": format!("src/file_{n}.rs")}}]}));
        let result: String = (0..60)
            .map(|line| format!("fn item_{n}_{line}() {{ /* body of line {line} */ }}\n"))
            .collect();
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{n}"), "content": result}]}));
    }
    messages
}

/// The tool results an OpenAI-compatible upstream was sent, by call id.
fn results(sent: &Value) -> Vec<(String, String)> {
    sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "tool")
        .map(|message| {
            (
                message["tool_call_id"].as_str().unwrap().to_owned(),
                message["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn is_placeholder(text: &str) -> bool {
    text.starts_with("[cleared `") && text.ends_with(" tokens)]")
}

#[tokio::test]
async fn old_tool_uses_are_cleared_past_the_token_trigger_and_the_answer_says_so() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::text("Done.").usage(900, 2));
    openai.push(Reply::text_in_pieces(["Do", "ne."]).usage(900, 2));
    let (_dir, server, key) = server(&openai, None).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 200,
        "messages": tool_loop(&["read_file"; 8]),
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 2000},
            "keep": {"type": "tool_uses", "value": 3}}]}});
    let (status, answer) = message(&server, &key, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(text(&answer), "Done.");
    let sent = openai.call(0).json;
    assert!(sent.get("context_management").is_none(), "{sent}");
    // The task stays; the five oldest results are placeholders, the three newest whole.
    assert_eq!(
        sent["messages"][0]["content"],
        "Audit the repository's files."
    );
    let results = results(&sent);
    assert_eq!(results.len(), 8);
    for (n, (id, content)) in results.iter().enumerate() {
        assert_eq!(id, &format!("toolu_{n}"));
        if n < 5 {
            assert!(is_placeholder(content), "{n}: {content}");
            assert!(content.contains(&format!("toolu_{n}")), "{content}");
        } else {
            assert!(content.starts_with(&format!("fn item_{n}_0()")), "{n}");
        }
    }
    let applied = &answer["context_management"]["applied_edits"];
    assert_eq!(applied.as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(applied[0]["type"], "clear_tool_uses_20250919");
    assert_eq!(applied[0]["cleared_tool_uses"], 5);
    let freed = applied[0]["cleared_input_tokens"].as_u64().unwrap();
    assert!(freed > 5 * 400, "{freed}");

    // Streamed, the same edits are reported in message_delta.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let response = post(&server, &key, &[], streamed).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.text().await.unwrap();
    let events = events(&body);
    let (_, delta) = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(delta["context_management"]["applied_edits"], *applied);
    assert_eq!(openai.call(1).json["messages"], sent["messages"]);
}

#[tokio::test]
async fn a_tool_use_trigger_clears_all_but_the_kept_sparing_excluded_tools_and_clearing_inputs() {
    let openai = FakeUpstream::start().await;
    openai.extend([Reply::text("Done."), Reply::text("Done.")]);
    let (_dir, server, key) = server(&openai, None).await;
    let tools = [
        "read_file",
        "notes",
        "read_file",
        "read_file",
        "search",
        "read_file",
    ];
    let edit = |trigger: u64| {
        json!({"model": "gpt-4o-mini", "max_tokens": 200, "messages": tool_loop(&tools),
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": trigger},
                "keep": {"type": "tool_uses", "value": 2},
                "exclude_tools": ["notes"],
                "clear_tool_inputs": ["read_file"]}]}})
    };
    // Six tool uses are not more than six: nothing is cleared, and nothing is reported.
    let (status, answer) = message(&server, &key, edit(6)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["context_management"], json!({"applied_edits": []}));
    assert!(
        results(&openai.call(0).json)
            .iter()
            .all(|(_, content)| !is_placeholder(content))
    );

    let (status, answer) = message(&server, &key, edit(5)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let sent = openai.call(1).json;
    let cleared: Vec<bool> = results(&sent)
        .iter()
        .map(|(_, content)| is_placeholder(content))
        .collect();
    // The two newest kept, `notes` excluded.
    assert_eq!(cleared, [true, false, true, true, false, false]);
    let applied = &answer["context_management"]["applied_edits"][0];
    assert_eq!(applied["cleared_tool_uses"], 3);
    // The cleared read_file calls lost their inputs; the search call kept its.
    let inputs: Vec<String> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|message| {
            message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|call| call["function"]["arguments"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(inputs[0], "{}");
    assert_eq!(inputs[1], r#"{"path":"src/file_1.rs"}"#);
    assert_eq!(inputs[3], "{}");
    assert_eq!(inputs[4], r#"{"path":"src/file_4.rs"}"#);
    assert_eq!(inputs[5], r#"{"path":"src/file_5.rs"}"#);
}

#[tokio::test]
async fn old_thinking_is_left_out_and_the_newest_reaches_an_anthropic_upstream_unchanged() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text("Claude here.").usage(40, 3));
    anthropic.push(Reply::text_in_pieces(["Claude ", "here."]).usage(40, 3));
    let (_dir, server, key) = server(&openai, Some(&anthropic)).await;
    let thinking = |n: usize| {
        json!({"type": "thinking", "thinking": format!("Thought number {n}, at some length."),
               "signature": format!("EqQBCgIYAhIM{n}gbcDa9GJwZA2b3hGgx+/==")})
    };
    let mut messages = Vec::new();
    for n in 0..3 {
        messages.push(json!({"role": "user", "content": format!("Question {n}")}));
        messages.push(json!({"role": "assistant", "content": [
            thinking(n), {"type": "text", "text": format!("Answer {n}.")}]}));
    }
    messages.push(json!({"role": "user", "content": "And now?"}));
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 2000,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": messages,
        "context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {"type": "clear_tool_uses_20250919"}]}});
    let (status, answer) = message(&server, &key, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(text(&answer), "Claude here.");
    let sent = anthropic.call(0).json;
    assert!(sent.get("context_management").is_none(), "{sent}");
    let turns: Vec<&Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "assistant")
        .collect();
    assert_eq!(turns.len(), 3);
    for turn in &turns[..2] {
        let blocks = turn["content"].as_array().unwrap();
        assert!(blocks.iter().all(|block| block["type"] == "text"), "{turn}");
    }
    assert_eq!(turns[2]["content"][0], thinking(2));
    // Only the edit that did something is reported (no tool use was cleared).
    let applied = answer["context_management"]["applied_edits"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .clone();
    assert_eq!(applied.len(), 1, "{answer}");
    assert_eq!(applied[0]["type"], "clear_thinking_20251015");
    assert_eq!(applied[0]["cleared_thinking_turns"], 2);
    assert!(applied[0]["cleared_input_tokens"].as_u64().unwrap() > 0);

    // Streamed from the Anthropic upstream: its events pass as they came, the edits set in
    // its message_delta.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let response = post(&server, &key, &[], streamed).await;
    assert_eq!(response.status(), StatusCode::OK);
    let stream = response.text().await.unwrap();
    let events = events(&stream);
    let (_, delta) = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap_or_else(|| panic!("{stream}"));
    assert_eq!(delta["context_management"]["applied_edits"], json!(applied));
    let said: String = events
        .iter()
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert_eq!(said, "Claude here.");
    assert!(anthropic.call(1).json.get("context_management").is_none());
}

#[tokio::test]
async fn without_edits_no_context_management_is_answered() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::text("Done."));
    let (_dir, server, key) = server(&openai, None).await;
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 200,
               "messages": tool_loop(&["read_file"; 8])}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.get("context_management").is_none(), "{answer}");
    assert!(
        results(&openai.call(0).json)
            .iter()
            .all(|(_, content)| !is_placeholder(content))
    );
}

#[tokio::test]
async fn on_a_named_thread_the_edits_shape_the_request_and_the_thread_keeps_every_result() {
    let openai = FakeUpstream::start().await;
    openai.extend([Reply::text("Done."), Reply::text("Hello.")]);
    let (_dir, server, key) = server(&openai, None).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 200,
        "metadata": {"contexture_thread": "audit"},
        "messages": tool_loop(&["read_file"; 6]),
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1}}]}});
    let (status, answer) = message(&server, &key, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["context_management"]["applied_edits"][0]["cleared_tool_uses"],
        5
    );
    let cleared = results(&openai.call(0).json)
        .iter()
        .filter(|(_, content)| is_placeholder(content))
        .count();
    assert_eq!(cleared, 5);
    // The thread holds every result whole: editing shaped the request, not the history.
    let stored: Value = crate::common::client()
        .get(server.url("/v1/threads/audit/messages"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stored_results: Vec<&Value> = stored["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{stored}"))
        .iter()
        .filter(|message| message["role"] == "tool")
        .collect();
    assert_eq!(stored_results.len(), 6, "{stored}");
    for result in stored_results {
        assert!(
            !is_placeholder(result["content"].as_str().unwrap()),
            "{result}"
        );
    }
    // Another tenant's thread of that name is not this one, and its turn is its own.
    let other = server.key("globex").await;
    let (status, _) = message(
        &server,
        &other,
        json!({"model": "gpt-4o-mini", "max_tokens": 100,
               "metadata": {"contexture_thread": "audit"},
               "messages": [{"role": "user", "content": "Hello?"}],
               "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(openai.call(1).json["messages"].as_array().unwrap().len(), 1);
}

/// A long conversation as a client sends it: `turns` questions and answers about distinct
/// topics, then the newest question.
fn long_conversation(turns: usize) -> Vec<Value> {
    let mut messages = Vec::new();
    for n in 0..turns {
        messages.push(json!({"role": "user", "content": format!(
            "Question {n}: tell me about topic-{n}. {}", "Some context for it. ".repeat(20))}));
        messages.push(json!({"role": "assistant", "content": format!(
            "Topic-{n} answer. {}", "A detailed explanation follows. ".repeat(20))}));
    }
    messages.push(json!({"role": "user", "content": "Now compare the last two topics."}));
    messages
}

/// The text of every message an OpenAI-compatible upstream was sent.
fn sent_texts(sent: &Value) -> Vec<String> {
    sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| match &message["content"] {
            Value::String(text) => text.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|part| part["text"].as_str())
                .collect(),
            other => other.to_string(),
        })
        .collect()
}

#[tokio::test]
async fn compaction_answers_a_block_that_a_later_request_sends_back_in_place_of_what_it_covered() {
    let openai = FakeUpstream::start().await;
    openai.extend([
        Reply::text("Topics 18 and 19 differ."),
        Reply::text("You're welcome."),
    ]);
    let (_dir, server, key) = server(&openai, None).await;
    let mut history = long_conversation(20);
    let edits = json!({"edits": [{"type": "compact_20260112",
                                  "trigger": {"type": "input_tokens", "value": 3000}}]});
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300, "system": "Be precise.",
               "messages": history, "context_management": edits}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let content = answer["content"].as_array().unwrap();
    let block = &content[0];
    assert_eq!(block["type"], "compaction", "{answer}");
    let summary = block["content"].as_str().unwrap();
    assert!(
        summary.contains("Summary of the earlier conversation"),
        "{summary}"
    );
    let kept: usize = block["encrypted_content"]
        .as_str()
        .unwrap()
        .strip_prefix("contexture-compaction:kept=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(kept >= 1);
    assert_eq!(content[1]["text"], "Topics 18 and 19 differ.");
    // Upstream: the system prompt, what stands for the covered part, the kept messages.
    let first = sent_texts(&openai.call(0).json);
    assert_eq!(first[0], "Be precise.");
    assert!(
        first
            .iter()
            .any(|text| text.contains(summary.lines().last().unwrap()))
    );
    assert!(
        !first.iter().any(|text| text.starts_with("Question 3:")),
        "{first:?}"
    );
    assert_eq!(first.last().unwrap(), "Now compare the last two topics.");
    let kept_sent = &first[first.len() - kept..];

    // The client sends its history with the answer (the block first) and a new question.
    history.push(json!({"role": "assistant", "content": content}));
    history.push(json!({"role": "user", "content": "Thanks!"}));
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300, "system": "Be precise.",
               "messages": history, "context_management": edits}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["content"][0]["text"], "You're welcome.",
        "no new compaction"
    );
    let second = sent_texts(&openai.call(1).json);
    // What preceded the block is not sent: the summary, the kept messages, the answer, the
    // new question.
    assert!(
        !second.iter().any(|text| text.starts_with("Question 3:")),
        "{second:?}"
    );
    assert_eq!(second[0], "Be precise.");
    assert!(
        second[1].contains(summary.lines().last().unwrap()),
        "{second:?}"
    );
    assert_eq!(
        &second[second.len() - 2 - kept..second.len() - 2],
        kept_sent
    );
    assert_eq!(second[second.len() - 2], "Topics 18 and 19 differ.");
    assert_eq!(second[second.len() - 1], "Thanks!");
}

#[tokio::test]
async fn a_paused_compaction_answers_the_block_alone_and_sends_nothing_upstream() {
    let openai = FakeUpstream::start().await;
    let (_dir, server, key) = server(&openai, None).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 300,
        "messages": long_conversation(20),
        "context_management": {"edits": [{"type": "compact_20260112",
            "trigger": {"type": "input_tokens", "value": 3000},
            "pause_after_compaction": true}]}});
    let (status, answer) = message(&server, &key, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["stop_reason"], "compaction");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{answer}");
    assert_eq!(content[0]["type"], "compaction");
    // Streamed: the block's start, its delta, its stop, then the end.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let response = post(&server, &key, &[], streamed).await;
    let text = response.text().await.unwrap();
    let events = events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    assert_eq!(events[3].1["delta"]["type"], "compaction_delta");
    assert_eq!(events[3].1["delta"]["content"], content[0]["content"]);
    assert_eq!(events[5].1["delta"]["stop_reason"], "compaction");
    assert_eq!(openai.call_count(), 0);

    // Under the trigger nothing is compacted and the turn goes on.
    openai.push(Reply::text("Short."));
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "messages": [{"role": "user", "content": "Hi"}],
               "context_management": {"edits": [{"type": "compact_20260112",
                   "pause_after_compaction": true}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": "Short."}])
    );
}

#[tokio::test]
async fn an_anthropic_upstreams_stream_gets_the_compaction_block_first() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    anthropic.push(Reply::text_in_pieces(["Compared", "."]).usage(500, 2));
    let (_dir, server, key) = server(&openai, Some(&anthropic)).await;
    let response = post(
        &server,
        &key,
        &[],
        json!({"model": "claude-sonnet-4-5", "max_tokens": 300, "stream": true,
               "messages": long_conversation(20),
               "context_management": {"edits": [{"type": "compact_20260112",
                   "trigger": {"type": "input_tokens", "value": 3000}}]}}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    let events = events(&text);
    let blocks: Vec<(u64, String)> = events
        .iter()
        .filter(|(name, _)| name == "content_block_start")
        .map(|(_, data)| {
            (
                data["index"].as_u64().unwrap(),
                data["content_block"]["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        blocks,
        [(0, "compaction".to_owned()), (1, "text".to_owned())],
        "{text}"
    );
    let said: String = events
        .iter()
        .filter(|(_, data)| data["index"] == 1)
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert_eq!(said, "Compared.");
    let sent = anthropic.call(0).json;
    assert!(sent.get("context_management").is_none());
    assert!(
        sent["messages"][0]["content"]
            .to_string()
            .contains("Summary of the earlier conversation"),
        "{sent}"
    );
}

#[tokio::test]
async fn on_a_named_thread_compaction_compacts_the_stored_thread_and_the_block_sent_back_adds_nothing()
 {
    let openai = FakeUpstream::start().await;
    openai.extend([
        Reply::text("Topics 18 and 19 differ."),
        Reply::text("You're welcome."),
    ]);
    let (_dir, server, key) = server(&openai, None).await;
    let edits = json!({"edits": [{"type": "compact_20260112",
                                  "trigger": {"type": "input_tokens", "value": 3000}}]});
    let mut history = long_conversation(20);
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "metadata": {"contexture_thread": "long"},
               "messages": history, "context_management": edits}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let content = answer["content"].as_array().unwrap().clone();
    assert_eq!(content[0]["type"], "compaction", "{answer}");
    assert_eq!(content[1]["text"], "Topics 18 and 19 differ.");
    let first = sent_texts(&openai.call(0).json);
    assert!(
        !first.iter().any(|text| text.starts_with("Question 3:")),
        "{first:?}"
    );
    let stored = |page: Value| page["messages"].as_array().unwrap().len();
    let (_, page) = server
        .call(&key, "GET", "/v1/threads/long/messages", None)
        .await;
    let after_first = stored(page);

    // The client sends its whole history back with the block: only the new question is
    // new to the thread (a higher trigger, so that the thread is not compacted again).
    let later_edits = json!({"edits": [{"type": "compact_20260112"}]});
    history.push(json!({"role": "assistant", "content": content}));
    history.push(json!({"role": "user", "content": "Thanks!"}));
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "metadata": {"contexture_thread": "long"},
               "messages": history, "context_management": later_edits}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["content"][0]["text"], "You're welcome.", "{answer}");
    let (_, page) = server
        .call(&key, "GET", "/v1/threads/long/messages", None)
        .await;
    assert_eq!(stored(page), after_first + 2, "the question and its answer");
    let second = sent_texts(&openai.call(1).json);
    assert!(
        !second.iter().any(|text| text.starts_with("Question 3:")),
        "{second:?}"
    );
    assert_eq!(second.last().unwrap(), "Thanks!");
    assert_eq!(
        second
            .iter()
            .filter(|text| text.contains("Topics 18 and 19 differ."))
            .count(),
        1,
        "{second:?}"
    );

    // Pausing after compaction is for requests that carry their history.
    let (status, error) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "metadata": {"contexture_thread": "long"},
               "messages": [{"role": "user", "content": "Hi"}],
               "context_management": {"edits": [{"type": "compact_20260112",
                                                 "pause_after_compaction": true}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "context_management.edits: `compact_20260112` with pause_after_compaction"
        ),
        "{message}"
    );
    assert_eq!(openai.call_count(), 2);
}

#[tokio::test]
async fn a_summarizer_model_gets_the_edits_instructions_and_writes_the_blocks_summary() {
    use contexture_store::{AnyStore, SqliteStore};
    let openai = FakeUpstream::start().await;
    openai.extend([
        Reply::text("Goal: compare topics. Facts: topic-18, topic-19."),
        Reply::text("They differ."),
    ]);
    let mut config = crate::common::config(Some(&openai.base_url()));
    config.compaction = Some(contexture_core::compact::CompactionPolicy {
        summarizer: Some("gpt-4o-mini".into()),
        ..Default::default()
    });
    let dir = contexture_store::testing::TempDir::new("contexture-compaction-summarizer");
    let store = SqliteStore::open(dir.join("c.db")).await.unwrap();
    let server = crate::common::TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let (status, answer) = message(
        &server,
        &key,
        json!({"model": "gpt-4o-mini", "max_tokens": 300,
               "messages": long_conversation(20),
               "context_management": {"edits": [{"type": "compact_20260112",
                   "trigger": {"type": "input_tokens", "value": 3000},
                   "instructions": "Keep every topic number."}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let prompt = openai.call(0).json["messages"].to_string();
    assert!(
        prompt.contains("Additional instructions for this summary: Keep every topic number."),
        "{prompt}"
    );
    let summary = answer["content"][0]["content"].as_str().unwrap();
    assert!(
        summary.contains("Goal: compare topics. Facts: topic-18, topic-19."),
        "{summary}"
    );
    assert_eq!(answer["content"][1]["text"], "They differ.");
}

#[tokio::test]
async fn count_tokens_counts_the_request_as_its_edits_leave_it_the_number_a_turn_fits_with() {
    let openai = FakeUpstream::start().await;
    openai.push(Reply::text("Done."));
    let (_dir, server, key) = server(&openai, None).await;
    let request = json!({"model": "gpt-4o-mini", "max_tokens": 200,
        "messages": tool_loop(&["read_file"; 8]),
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 2000}}]}});
    let counted: Value = crate::common::client()
        .post(server.url("/v1/messages/count_tokens"))
        .header("x-api-key", &key)
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tokens = counted["input_tokens"].as_u64().unwrap();
    let original = counted["context_management"]["original_input_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{counted}"));
    assert!(tokens < original / 2, "{counted}");
    // Without edits, the count is the whole request's and nothing else is said.
    let mut unedited = request.clone();
    unedited
        .as_object_mut()
        .unwrap()
        .remove("context_management");
    let plain: Value = crate::common::client()
        .post(server.url("/v1/messages/count_tokens"))
        .header("x-api-key", &key)
        .json(&unedited)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(plain, json!({"input_tokens": original}));
    // The same request as a thread's turn: its record's input tokens are the edited count.
    let response = post(
        &server,
        &key,
        &[("x-contexture-thread", "counted")],
        request,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let (_, page) = server
        .call(&key, "GET", "/v1/threads/counted/events", None)
        .await;
    let record = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["type"] == "request_started")
        .unwrap_or_else(|| panic!("no request record: {page}"))
        .clone();
    assert_eq!(record["budget"]["input_tokens"], tokens, "{record}");
}
