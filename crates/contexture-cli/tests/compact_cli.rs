//! `contexture thread compact` and `thread restore` on an SQLite file: what they print, what
//! the log holds afterwards, and a failing summarizer that replaces nothing.

use crate::common;

use common::{Outcome, RunToEnd, contexture, sqlite_url};
use contexture_store::testing::TempDir;
use serde_json::Value;

fn thread(dir: &TempDir, args: &[&str]) -> Outcome {
    contexture(["thread"])
        .args(args)
        .args(["--db", &sqlite_url(dir, "t.db")])
        .run()
}

fn ok(dir: &TempDir, args: &[&str]) -> String {
    thread(dir, args).expect_success()
}

fn messages(dir: &TempDir) -> Vec<Value> {
    serde_json::from_str(&ok(dir, &["messages", "--thread", "demo"])).unwrap()
}

#[test]
fn compact_prints_what_it_covered_and_restore_puts_it_back() {
    let dir = TempDir::new("contexture-compact-cli");
    ok(
        &dir,
        &["append", "--thread", "demo", "examples/conversation.json"],
    );
    let before = messages(&dir);
    let printed = ok(
        &dir,
        &[
            "compact",
            "--thread",
            "demo",
            "--keep-messages",
            "2",
            "--notes",
            "Customer Maria, ticket T-1042",
        ],
    );
    insta::assert_snapshot!("compact_extractive", printed);
    let after = messages(&dir);
    assert_eq!(
        after[1]["content"], before[1]["content"],
        "the original request"
    );
    assert_eq!(
        after[2]["content"],
        "Notes (kept verbatim):\nCustomer Maria, ticket T-1042"
    );
    assert!(
        after[3]["content"]
            .as_str()
            .unwrap()
            .starts_with("Summary of the earlier conversation:")
    );
    assert_eq!(after[4..], before[before.len() - 2..]);

    // The events show both the original messages and the compaction.
    let events: Vec<Value> = ok(&dir, &["events", "--thread", "demo"])
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let replace = events
        .iter()
        .find(|e| e["type"] == "context_replaced")
        .unwrap();
    assert_eq!(replace["reason"], "compaction");
    assert_eq!(replace["from_seq"], 2);
    assert_eq!(replace["to_seq"], 5);
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "message_appended")
            .count(),
        before.len()
    );
    let seq = replace["seq"].as_u64().unwrap().to_string();
    ok(&dir, &["restore", "--thread", "demo", "--before", &seq]);
    assert_eq!(messages(&dir), before);

    // Nothing older than the kept tail: nothing to do, said plainly.
    let printed = ok(
        &dir,
        &["compact", "--thread", "demo", "--keep-messages", "100"],
    );
    assert_eq!(
        printed,
        "nothing compacted in thread demo: nothing older than the kept tail to summarize\n"
    );
}

#[test]
fn a_failing_summarizer_exits_non_zero_and_replaces_nothing() {
    let dir = TempDir::new("contexture-compact-cli");
    ok(
        &dir,
        &["append", "--thread", "demo", "examples/conversation.json"],
    );
    let before = messages(&dir);
    let script = dir.join("fail.yaml");
    std::fs::write(
        &script,
        "[{error: {status: 500, message: down}}, {content: ''}]",
    )
    .unwrap();
    let output = thread(
        &dir,
        &[
            "compact",
            "--thread",
            "demo",
            "--keep-messages",
            "2",
            "--model",
            "gpt-4o-mini",
            "--retries",
            "1",
            "--llm",
            &format!("scripted:{}", script.display()),
        ],
    );
    let stderr = output.expect_failure();
    assert!(
        stderr.contains("compaction of thread demo failed and replaced nothing: the summarizer returned an empty text (after 2 attempts)"),
        "{stderr}"
    );
    assert_eq!(messages(&dir), before);

    // With a summary, it reports the calls and the summarizer.
    std::fs::write(&script, "[{content: 'Maria lands in Lisbon Friday 9pm.'}]").unwrap();
    let printed = ok(
        &dir,
        &[
            "compact",
            "--thread",
            "demo",
            "--keep-messages",
            "2",
            "--model",
            "gpt-4o-mini",
            "--llm",
            &format!("scripted:{}", script.display()),
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(report["outcome"], "compacted");
    assert_eq!(report["summarizer"], "gpt-4o-mini");
    assert_eq!(report["calls"], 1);
    assert_eq!(report["summary"], "Maria lands in Lisbon Friday 9pm.");
}

/// While a request is in flight on the thread, a compaction is recorded but queued: the
/// command says so, the messages stay as they were until the request ends, then the
/// compaction applies.
#[test]
fn a_compaction_during_a_request_says_it_is_queued() {
    use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, RequestRecord, Usage};
    use contexture_store::{NewEvent, SqliteStore, Store};

    let dir = TempDir::new("contexture-compact-cli-queued");
    ok(
        &dir,
        &["append", "--thread", "demo", "examples/conversation.json"],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime
        .block_on(SqliteStore::open(dir.join("t.db")))
        .unwrap();
    let record = RequestRecord {
        request_id: "turn-1".into(),
        ..RequestRecord::default()
    };
    runtime
        .block_on(store.append(
            "demo",
            vec![NewEvent::new(EventKind::RequestStarted(record))],
        ))
        .unwrap();
    let before = messages(&dir);
    let printed = ok(
        &dir,
        &["compact", "--thread", "demo", "--keep-messages", "2"],
    );
    assert!(
        printed.starts_with(
            "queued a compaction of thread demo: a request is in flight, and seqs 2.."
        ),
        "{printed}"
    );
    assert_eq!(
        messages(&dir),
        before,
        "nothing applies while the request runs"
    );
    runtime
        .block_on(store.append(
            "demo",
            vec![NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                "turn-1".to_owned(),
                RequestOutcome::Completed,
                Usage::new(1, 1),
            )))],
        ))
        .unwrap();
    let after = messages(&dir);
    assert!(after.len() < before.len(), "{after:?}");
}
