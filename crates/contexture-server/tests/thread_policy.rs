//! A thread's own policy through the API: set at creation or later, shown with the policy its
//! requests get, cleared; and honoured by another server on the same database, for a
//! client-side agent loop sent through the OpenAI-compatible endpoint (the client sends the
//! whole conversation each time, the upstream answers with tool calls): every request the
//! upstream receives fits the thread's window, passes OpenAI's and Anthropic's rules, keeps
//! the task and the newest results, clears and truncates the rest, while the thread keeps
//! every result whole; with hysteresis, most requests repeat the previous one at their start.

use crate::common;

use common::{TestServer, client, config};
use contexture_core::fit::{Rules, is_cleared_placeholder, validate};
use contexture_core::format::openai;
use contexture_core::tokens::{Encoding, TokenCounter};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{TempDir, pg_store};
use contexture_store::{AnyStore, PgStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The policy of the loop's thread: an 8,000-token window (gpt-4o-mini's is 128,000), old
/// results cleared past 5,000 tokens but the newest 2, results cut to 1,500 tokens.
fn loop_policy(hysteresis: bool) -> Value {
    let mut context = json!({
        "window": 8000,
        "reserve": 1000,
        "clear_tool_results": {"trigger_tokens": 5000, "keep": 2, "clear_at_least": 1000},
        "truncate_tool_results": {"max_tokens": 1500},
    });
    if hysteresis {
        context["hysteresis"] = json!({"high": 0.9, "low": 0.5});
    }
    json!({ "context": context })
}

/// A search result of about `tokens` tokens.
fn result_text(call: usize, tokens: usize) -> String {
    (0..tokens / 8)
        .map(|line| format!("result {call} line {line} says ok\n"))
        .collect()
}

const CALLS: usize = 24;

/// Runs the loop on `thread` through `server` (whose upstream answers every call with a
/// tool call); returns the share of requests that began with the whole previous request.
async fn agent_loop(server: &TestServer, key: &str, thread: &str, upstream: &FakeUpstream) -> f64 {
    let counter = TokenCounter::Exact {
        encoding: Encoding::O200kBase,
    };
    let task = "Find every mention of the outage in the search index.";
    let mut conversation = vec![json!({"role": "user", "content": task})];
    let first_call = upstream.call_count();
    let mut stable = 0;
    let mut previous: Option<Vec<Value>> = None;
    for round in 0..CALLS {
        let response = client()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("X-Contexture-Thread", thread)
            .json(&json!({"model": "gpt-4o-mini", "messages": conversation, "tools": [
                {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
            ]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "round {round}");
        let answer: Value = response.json().await.unwrap();
        let message = answer["choices"][0]["message"].clone();
        let id = message["tool_calls"][0]["id"].as_str().unwrap().to_owned();
        conversation.push(message);
        // Every fifth result is too large and is cut to its start and end.
        let tokens = if round % 5 == 4 { 2_600 } else { 1_100 };
        conversation.push(
            json!({"role": "tool", "tool_call_id": id, "content": result_text(round, tokens)}),
        );

        let sent = upstream.calls()[first_call + round].json["messages"]
            .as_array()
            .unwrap()
            .clone();
        let messages = openai::parse_messages(&Value::Array(sent.clone())).unwrap();
        assert_eq!(validate(&messages, Rules::OpenAi), vec![], "round {round}");
        assert_eq!(
            validate(&messages, Rules::Anthropic),
            vec![],
            "round {round}"
        );
        let tools = [
            json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}),
        ];
        let tokens = counter.count_request(&messages, &tools).total;
        assert!(tokens <= 7_000, "round {round}: {tokens} tokens");
        assert!(
            messages.iter().any(|message| message.text() == task),
            "round {round}: the task is kept"
        );
        // The newest two results the request holds are whole (or cut, never cleared).
        let results: Vec<_> = messages
            .iter()
            .filter(|message| message.tool_call_id.is_some())
            .collect();
        for result in results.iter().rev().take(2) {
            assert!(!is_cleared_placeholder(&result.text()), "round {round}");
        }
        if round >= 8 {
            assert!(
                results
                    .iter()
                    .any(|result| is_cleared_placeholder(&result.text())),
                "round {round}: older results are cleared"
            );
        }
        if let Some(previous) = &previous
            && sent.starts_with(previous)
        {
            stable += 1;
        }
        previous = Some(sent);
    }
    // The thread keeps every result whole, whatever its requests were sent.
    let (_, events) = server
        .call(
            key,
            "GET",
            &format!("/v1/threads/{thread}/events?limit=1000"),
            None,
        )
        .await;
    let stored_results: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["type"] == "message_appended" && event["message"]["role"] == "tool")
        .map(|event| event["message"]["content"].as_str().unwrap())
        .collect();
    // The last result was never sent (the loop stops before it).
    assert_eq!(stored_results.len(), CALLS - 1);
    for (round, text) in stored_results.iter().enumerate() {
        let tokens = if round % 5 == 4 { 2_600 } else { 1_100 };
        assert_eq!(
            *text,
            result_text(round, tokens),
            "result {round} stored whole"
        );
    }
    stable as f64 / (CALLS - 1) as f64
}

async fn a_threads_policy_is_honoured_by_every_server(first: AnyStore, second: AnyStore) {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|number, _| {
        Reply::tool_call(&format!("call_{number}"), "search", json!({"q": number}))
    });
    let base = upstream.base_url();
    let one = TestServer::start(config(Some(&base)), first).await;
    let two = TestServer::start(config(Some(&base)), second).await;
    let key = one.key("acme").await;

    // Set at creation on one server, shown by the other with what its requests get.
    let (status, created) = one
        .call(
            &key,
            "POST",
            "/v1/threads",
            Some(json!({"id": "steady", "system": "You search.", "policy": loop_policy(true)})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, shown) = two.call(&key, "GET", "/v1/threads/steady", None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["policy"]["context"]["window"], 8000, "{shown}");
    assert_eq!(
        shown["applied_policy"]["context"]["window"], 8000,
        "{shown}"
    );
    assert_eq!(
        shown["applied_policy"]["compaction"],
        Value::Null,
        "{shown}"
    );
    // Set later, on a thread that had none; the fitted view follows it.
    one.call(
        &key,
        "POST",
        "/v1/threads",
        Some(json!({"id": "jumpy", "system": "You search."})),
    )
    .await;
    let (status, set) = one
        .call(
            &key,
            "PUT",
            "/v1/threads/jumpy/policy",
            Some(loop_policy(false)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["policy"]["context"]["hysteresis"], Value::Null, "{set}");

    let steady = agent_loop(&two, &key, "steady", &upstream).await;
    let jumpy = agent_loop(&two, &key, "jumpy", &upstream).await;
    eprintln!(
        "requests repeating the previous one at their start: {:.0}% with hysteresis, {:.0}% without",
        steady * 100.0,
        jumpy * 100.0
    );
    assert!(
        steady >= jumpy + 0.2,
        "hysteresis keeps prefixes: {steady} against {jumpy}"
    );

    // The fitted view of the thread follows its policy too, then the defaults once cleared.
    let (_, fitted) = two
        .call(
            &key,
            "GET",
            "/v1/threads/jumpy/context?model=gpt-4o-mini",
            None,
        )
        .await;
    assert_eq!(fitted["budget"]["context_window"], 8000, "{fitted}");
    let (status, cleared) = two
        .call(&key, "DELETE", "/v1/threads/jumpy/policy", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    assert_eq!(cleared["policy"], Value::Null);
    assert_eq!(cleared["applied_policy"]["context"]["window"], Value::Null);
    let (_, fitted) = one
        .call(
            &key,
            "GET",
            "/v1/threads/jumpy/context?model=gpt-4o-mini",
            None,
        )
        .await;
    assert_eq!(fitted["budget"]["context_window"], 128000, "{fitted}");
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn a_threads_policy_is_honoured_by_every_server_on_sqlite() {
    let dir = TempDir::new("contexture-thread-policy");
    let path = dir.join("policy.db");
    let first = SqliteStore::open(&path).await.unwrap();
    let second = SqliteStore::open(&path).await.unwrap();
    a_threads_policy_is_honoured_by_every_server(AnyStore::Sqlite(first), AnyStore::Sqlite(second))
        .await;
}

#[tokio::test]
async fn a_threads_policy_is_honoured_by_every_server_on_postgres() {
    let Some((first, schema)) = pg_store("thread_policy").await else {
        return;
    };
    let second = PgStore::open_in_schema(&contexture_store::testing::pg_url(), &schema)
        .await
        .unwrap();
    a_threads_policy_is_honoured_by_every_server(
        AnyStore::Postgres(first),
        AnyStore::Postgres(second),
    )
    .await;
}

/// A thread whose upstream ignores the system role: its policy's `system_role: user` sends
/// the thread's system prompt as the first user message on every turn (never stored, so
/// never twice); an unknown value is a 400 naming the field, and nothing is stored.
#[tokio::test]
async fn a_threads_policy_may_send_its_system_prompt_as_a_user_message() {
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|_, request| {
        if request.json["messages"]
            .as_array()
            .is_some_and(|messages| messages.iter().any(|m| m["role"] == "system"))
        {
            Reply::error(400, "the system role is not supported")
        } else {
            Reply::text("fine")
        }
    });
    let dir = TempDir::new("contexture-system-role");
    let store = AnyStore::Sqlite(SqliteStore::open(dir.join("t.db")).await.unwrap());
    let server = TestServer::start(config(Some(&upstream.base_url())), store).await;
    let key = server.key("acme").await;
    let (status, created) = server
        .call(
            &key,
            "POST",
            "/v1/threads",
            Some(json!({"id": "t", "system": "Be brief.", "policy": {"context": {"system_role": "user"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let mut conversation = Vec::new();
    for turn in ["Hi", "And again"] {
        conversation.push(json!({"role": "user", "content": turn}));
        let response = client()
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .header("X-Contexture-Thread", "t")
            .json(&json!({"model": "gpt-4o-mini", "messages": conversation}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{turn}");
        let answer: Value = response.json().await.unwrap();
        conversation.push(answer["choices"][0]["message"].clone());
    }
    for call in upstream.calls() {
        let messages = call.json["messages"].as_array().unwrap().clone();
        assert_eq!(messages[0], json!({"role": "user", "content": "Be brief."}));
        let prompts = messages
            .iter()
            .filter(|m| m["content"] == "Be brief.")
            .count();
        assert_eq!(prompts, 1, "{messages:?}");
    }
    let (status, error) = server
        .call(
            &key,
            "PUT",
            "/v1/threads/t/policy",
            Some(json!({"context": {"system_role": "human"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("unknown variant `human`"), "{message}");
    let (_, shown) = server.call(&key, "GET", "/v1/threads/t", None).await;
    assert_eq!(shown["policy"]["context"]["system_role"], "user", "{shown}");
    server.shutdown().await;
}
