//! An agent's execution stores its requests by reference: 200 calls, each sending the
//! rendered system prompt, the task and every tool call and result so far with the same
//! tools, take at most 3 bytes on disk per byte of the execution's messages, on SQLite and
//! on PostgreSQL; and every request reads back exactly as the provider received it.

use crate::common;

use common::{executor, requests, script, start};
use contexture_store::testing::{self, TempDir, message_length, prose};
use contexture_store::{SqliteStore, Store};

/// LLM calls of the agent's step.
const CALLS: usize = 200;

/// A workflow of one agent step whose assistant has a long system prompt and two tools.
fn workflow() -> String {
    format!(
        r#"
assistants:
  - id: agent
    model: gpt-4o-mini
    system_prompt: "You are a careful research agent working for {{{{user}}}}. {}"
    tools: [read, search]
    max_iterations: {}
tools:
  - {{id: read, tool: echo}}
  - {{id: search, tool: echo}}
states:
  - {{id: work, assistant_id: agent, task: "Read every part and summarize them.", next: {{end: true}}}}
"#,
        prose(0, 1_500),
        CALLS + 1
    )
}

/// The provider's script: 199 calls asking for a tool (arguments of 40 to 1,000 bytes,
/// echoed back as the results), then an answer.
fn agent_script() -> String {
    let mut yaml = String::new();
    for call in 1..CALLS {
        let len = message_length(call);
        let tool = if call % 2 == 0 { "read" } else { "search" };
        yaml.push_str(&format!(
            "- tool_calls:\n    - {{id: c{call}, name: {tool}, arguments: {{q: \"{}\"}}}}\n",
            prose(call, len)
        ));
    }
    yaml.push_str("- content: \"Every part is summarized.\"\n");
    yaml
}

/// Runs the agent on `store`; checks its records against what the provider received, and
/// returns the execution's message bytes.
async fn run_agent<S: Store + Clone>(store: S) -> u64 {
    let provider = script(&agent_script());
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, &workflow(), r#"{"user": "ann"}"#)
        .await
        .unwrap();
    assert_eq!(out.output, "Every part is summarized.");
    let received = provider.requests();
    assert_eq!(received.len(), CALLS);
    let recorded = requests(&store.events("run-1").await.unwrap());
    assert_eq!(recorded.len(), CALLS);
    for (call, (record, request)) in recorded.iter().zip(&received).enumerate() {
        assert_eq!(
            record.messages, request.messages,
            "call {call}'s record reads back as sent"
        );
        assert_eq!(record.tools.len(), 2, "call {call}'s tools read back");
    }
    let info = store
        .thread_info("run-1")
        .await
        .unwrap()
        .expect("the execution's thread is listed");
    info.message_bytes
}

fn assert_linear(store: &str, disk: u64, message_bytes: u64) {
    let ratio = disk as f64 / message_bytes as f64;
    eprintln!("{store}: {disk} bytes on disk for {message_bytes} bytes of messages ({ratio:.2}x)");
    assert!(ratio <= 3.0, "{store}: {ratio:.2}x the text on disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_200_calls_take_at_most_three_times_their_text_on_sqlite() {
    let dir = TempDir::new("contexture-agent-storage");
    let path = dir.join("runs.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let message_bytes = run_agent(store.clone()).await;
    drop(store);
    assert_linear("sqlite", testing::sqlite_disk_bytes(&path), message_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_200_calls_take_at_most_three_times_their_text_on_postgres() {
    let Some((store, schema)) = testing::pg_store("ctx_agent_storage").await else {
        return;
    };
    let message_bytes = run_agent(store.clone()).await;
    let disk = testing::pg_disk_bytes(&schema).await;
    store.drop_schema().await.unwrap();
    assert_linear("postgres", disk, message_bytes);
}
