//! `contexture thread`: append, messages (plain, limited and fitted), events, fork, list,
//! delete and prune against an SQLite file, and the same round trip on PostgreSQL.

use crate::common;

use common::{Outcome, RunToEnd, contexture, sqlite_url};
use contexture_core::Message;
use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, RequestRecord, Usage};
use contexture_store::testing::{TempDir, in_ci, pg_url, unique};
use contexture_store::{NewEvent, Store};

/// `contexture thread ARGS --db DB` with `input` on its standard input.
fn thread(db: &str, args: &[&str], input: &str) -> Outcome {
    contexture(["thread"])
        .args(args)
        .args(["--db", db])
        .run_with_input(input.as_bytes())
}

fn ok(db: &str, args: &[&str], input: &str) -> String {
    thread(db, args, input).expect_success()
}

fn fail(db: &str, args: &[&str], input: &str) -> String {
    thread(db, args, input).expect_failure()
}

const HISTORY: &str = r#"[
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "What is the capital of France?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"France\"}"}}]},
  {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
  {"role": "assistant", "content": "Paris."}
]"#;

/// The whole command set on one store.
fn round_trip(db: &str) {
    assert_eq!(
        ok(db, &["append", "--thread", "t1"], HISTORY),
        "1\n2\n3\n4\n5\n"
    );
    assert_eq!(
        ok(
            db,
            &["append", "--thread", "t1", "--key", "retry-1"],
            r#"{"role": "user", "content": "And Spain?"}"#
        ),
        "6\n"
    );
    // A retry with the same key stores nothing and prints the first seq.
    assert_eq!(
        ok(
            db,
            &["append", "--thread", "t1", "--key", "retry-1"],
            r#"{"role": "user", "content": "And Spain?"}"#
        ),
        "6\n"
    );
    insta::assert_snapshot!(
        "thread_messages",
        ok(db, &["messages", "--thread", "t1"], "")
    );
    insta::assert_snapshot!(
        "thread_messages_limit_2",
        ok(db, &["messages", "--thread", "t1", "--limit", "2"], "")
    );
    // A limit counts whole units: the third unit from the end is the turn that called
    // `lookup` with its result, never the result alone.
    let limited: serde_json::Value =
        serde_json::from_str(&ok(db, &["messages", "--thread", "t1", "--limit", "3"], "")).unwrap();
    let roles: Vec<&str> = limited
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "assistant", "tool", "assistant", "user"]);
    // A context the thread does not have is named, with those it has.
    let error = fail(
        db,
        &["messages", "--thread", "t1", "--context", "drafts"],
        "",
    );
    assert!(
        error.contains("thread `t1` has no context `drafts` (its contexts: main)"),
        "{error}"
    );
    insta::assert_snapshot!("thread_events", ok(db, &["events", "--thread", "t1"], ""));

    // Fitted: a tight budget keeps the system prompt and the most recent turns.
    let fitted = ok(
        db,
        &[
            "messages",
            "--thread",
            "t1",
            "--model",
            "gpt-4o",
            "--max-tokens",
            "40",
        ],
        "",
    );
    let fitted: serde_json::Value = serde_json::from_str(&fitted).expect("JSON array");
    let fitted = fitted.as_array().expect("array");
    assert!(fitted.len() < 6, "fitting dropped messages: {fitted:?}");
    assert_eq!(fitted[0]["role"], "system");
    assert_eq!(fitted.last().expect("a message")["content"], "And Spain?");

    assert_eq!(
        ok(
            db,
            &["fork", "--thread", "t1", "--at", "2", "--new", "t1-fork"],
            ""
        ),
        "3\n"
    );
    assert_eq!(
        ok(
            db,
            &["append", "--thread", "t1-fork"],
            r#"{"role": "assistant", "content": "Lyon?"}"#
        ),
        "4\n"
    );
    insta::assert_snapshot!(
        "thread_fork_messages",
        ok(db, &["messages", "--thread", "t1-fork"], "")
    );
    assert_eq!(
        ok(db, &["list"], ""),
        "t1\t6\nt1-fork\t4\tfork of t1 at 2\n"
    );
    // Sizes: a thread of messages only takes its messages' bytes; the fork's own event
    // is not a message.
    let listed: Vec<serde_json::Value> = ok(db, &["list", "--json"], "")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(listed[0]["bytes"], listed[0]["message_bytes"], "{listed:?}");
    assert!(
        listed[1]["bytes"].as_u64() > listed[1]["message_bytes"].as_u64(),
        "{listed:?}"
    );
    let sized = ok(db, &["list", "--sizes"], "");
    let lines: Vec<&str> = sized.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "t1\t6\t{} bytes, {} in messages (1.0x)",
            listed[0]["bytes"], listed[0]["message_bytes"]
        )
    );
    assert!(
        lines[1].starts_with(&format!(
            "t1-fork\t4\tfork of t1 at 2\t{} bytes, {} in messages (",
            listed[1]["bytes"], listed[1]["message_bytes"]
        )),
        "{sized}"
    );

    // A thread's own policy: set from a file (here standard input), shown, followed by a read
    // for a model, refused when it cannot work, cleared.
    let capped = ok(
        db,
        &[
            "messages",
            "--thread",
            "t1",
            "--model",
            "gpt-4o",
            "--max-tokens",
            "50",
        ],
        "",
    );
    let whole = ok(db, &["messages", "--thread", "t1", "--model", "gpt-4o"], "");
    assert_ne!(capped, whole);
    assert_eq!(ok(db, &["policy", "--thread", "t1"], ""), "null\n");
    let set = ok(
        db,
        &["policy", "--thread", "t1", "--set", "-"],
        "context: {window: 60, reserve: 10}\n",
    );
    assert!(set.contains("\"window\":60"), "{set}");
    assert_eq!(
        ok(db, &["messages", "--thread", "t1", "--model", "gpt-4o"], ""),
        capped
    );
    let error = fail(
        db,
        &["policy", "--thread", "t1", "--set", "-"],
        "context: {hysteresis: {high: 0.5, low: 0.9}}\n",
    );
    assert!(
        error.contains("context.hysteresis.low: low (0.9) must be below high (0.5)"),
        "{error}"
    );
    let error = fail(
        db,
        &["policy", "--thread", "t1", "--set", "-"],
        "contxt: {}\n",
    );
    assert!(
        error.contains("standard input:1:1: unknown field `contxt`"),
        "{error}"
    );
    assert_eq!(ok(db, &["policy", "--thread", "t1"], ""), set);
    assert_eq!(
        ok(db, &["policy", "--thread", "t1", "--clear"], ""),
        "null\n"
    );
    assert_eq!(
        ok(db, &["messages", "--thread", "t1", "--model", "gpt-4o"], ""),
        whole
    );
    let error = fail(db, &["policy", "--thread", "missing"], "");
    assert!(error.contains("thread `missing` not found"), "{error}");

    let refused = fail(db, &["delete", "--thread", "t1"], "");
    assert!(
        refused.contains("thread `t1` has forks (t1-fork)"),
        "{refused}"
    );
    ok(db, &["delete", "--thread", "t1-fork"], "");
    let report = ok(db, &["prune", "--idle-secs", "0"], "");
    let report: serde_json::Value = serde_json::from_str(&report).expect("JSON report");
    assert_eq!(report["deleted"], serde_json::json!(["t1"]));
    assert_eq!(ok(db, &["list"], ""), "");
}

/// `thread switch`: to a context the thread lacks only with --create; a retry with the same
/// op id has no second effect; the projection follows the active context.
#[test]
fn switching_the_active_context() {
    let dir = TempDir::new("contexture-cli-switch");
    let db = &sqlite_url(&dir, "threads.db");
    ok(db, &["append", "--thread", "t1"], HISTORY);
    let error = fail(db, &["switch", "--thread", "t1", "--context", "drafts"], "");
    assert!(
        error.contains(
            "thread `t1` has no context `drafts` (its contexts: main); a switch with `create` starts a new one"
        ),
        "{error}"
    );
    let error = fail(db, &["switch", "--thread", "t1", "--context", " "], "");
    assert!(
        error.contains("invalid context name \" \": it is empty"),
        "{error}"
    );
    let error = fail(
        db,
        &["switch", "--thread", "nowhere", "--context", "main"],
        "",
    );
    assert!(error.contains("nowhere"), "{error}");
    let switch = |context: &str, op: &str, create: bool| {
        let mut args = vec![
            "switch",
            "--thread",
            "t1",
            "--context",
            context,
            "--op-id",
            op,
        ];
        if create {
            args.push("--create");
        }
        ok(db, &args, "")
    };
    let first = switch("drafts", "op-1", true);
    assert!(
        ok(
            db,
            &["messages", "--thread", "t1", "--context", "drafts"],
            ""
        )
        .contains("Paris"),
        "a new context shows the whole history"
    );
    switch("main", "op-2", false);
    // A retry records nothing and answers as the first did.
    assert_eq!(switch("drafts", "op-1", false), first);
    let events = ok(db, &["events", "--thread", "t1"], "");
    assert_eq!(events.matches("context_switched").count(), 2, "{events}");
    let error = fail(
        db,
        &[
            "switch",
            "--thread",
            "t1",
            "--context",
            "main",
            "--op-id",
            "op-1",
        ],
        "",
    );
    assert!(
        error.contains("op_id `op-1` already switched this thread to context `drafts`, not `main`"),
        "{error}"
    );

    // An append in a context switches to it first (main is active after op-2), once.
    let note = r#"{"role": "user", "content": "a draft note"}"#;
    let keyed = [
        "append",
        "--thread",
        "t1",
        "--context",
        "drafts",
        "--key",
        "k1",
    ];
    let seqs = ok(db, &keyed, note);
    let again = ok(db, &keyed, note);
    assert_eq!(seqs, again, "a retry with the same key stores nothing");
    let events = ok(db, &["events", "--thread", "t1"], "");
    assert_eq!(events.matches("context_switched").count(), 3, "{events}");
    ok(
        db,
        &["append", "--thread", "t1", "--context", "drafts"],
        note,
    );
    let events = ok(db, &["events", "--thread", "t1"], "");
    assert_eq!(
        events.matches("context_switched").count(),
        3,
        "no switch to the active context"
    );
    let error = fail(
        db,
        &["append", "--thread", "t1", "--context", "nowhere"],
        note,
    );
    assert!(
        error.contains("cannot append to thread t1 in context nowhere")
            && error.contains("has no context `nowhere`"),
        "{error}"
    );
    assert_eq!(
        ok(db, &["events", "--thread", "t1"], ""),
        events,
        "nothing written"
    );
}

#[test]
fn thread_commands_on_sqlite() {
    let dir = TempDir::new("contexture-cli-round-trip");
    round_trip(&sqlite_url(&dir, "threads.db"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = runtime
        .block_on(contexture_store::SqliteStore::open(dir.join("records.db")))
        .expect("open the store");
    retention(&sqlite_url(&dir, "records.db"), &store, &runtime);
}

/// `thread retention` sets, shows and clears a thread's policy; `thread prune` applies it
/// (and the default it is given) to request records the library wrote.
fn retention(db: &str, store: &impl Store, runtime: &tokio::runtime::Runtime) {
    for thread in ["own", "other"] {
        for turn in 0..4 {
            let record = RequestRecord {
                request_id: format!("{thread}-{turn}"),
                messages: vec![Message::user(format!("question {turn}"))],
                ..RequestRecord::default()
            };
            let events = vec![
                NewEvent::new(EventKind::MessageAppended {
                    message: Message::user(format!("question {turn}")),
                }),
                NewEvent::new(EventKind::RequestStarted(record)),
                NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                    format!("{thread}-{turn}"),
                    RequestOutcome::Completed,
                    Usage::new(1, 1),
                ))),
            ];
            runtime
                .block_on(store.append(thread, events))
                .expect("append");
        }
    }
    assert_eq!(ok(db, &["retention", "--thread", "own"], ""), "null\n");
    assert_eq!(
        ok(
            db,
            &["retention", "--thread", "own", "--keep-last", "1"],
            ""
        ),
        "{\"keep_last\":1}\n"
    );
    let listed = ok(db, &["list"], "");
    assert!(
        listed.contains("own\t12\tkeeps request records: the last 1 records"),
        "{listed}"
    );
    let report = ok(db, &["prune", "--keep-last", "3"], "");
    let report: serde_json::Value = serde_json::from_str(&report).expect("JSON report");
    assert_eq!(report["requests"]["records"], 3 + 1, "{report}");
    assert_eq!(
        report["requests"]["by_thread"]["own"]["records"], 3,
        "{report}"
    );
    assert!(
        report.get("deleted").is_none(),
        "no thread was deleted: {report}"
    );
    let events = ok(db, &["events", "--thread", "own"], "");
    assert_eq!(
        events.matches("\"pruned\":{\"messages\":1").count(),
        3,
        "{events}"
    );
    assert_eq!(events.matches("question 3").count(), 2, "{events}");
    assert_eq!(
        ok(db, &["retention", "--thread", "own", "--clear"], ""),
        "null\n"
    );
    let error = fail(
        db,
        &["retention", "--thread", "own", "--keep-days", "0"],
        "",
    );
    assert!(error.contains("`keep_days` must be at least 1"), "{error}");
    let error = fail(
        db,
        &[
            "retention",
            "--thread",
            "own",
            "--clear",
            "--keep-last",
            "2",
        ],
        "",
    );
    assert!(error.contains("cannot be used with"), "{error}");
    let error = fail(
        db,
        &["retention", "--thread", "missing", "--keep-last", "2"],
        "",
    );
    assert!(error.contains("thread `missing` not found"), "{error}");
}

#[test]
fn thread_commands_on_postgres() {
    let url = pg_url();
    let schema = unique("ctx_cli");
    // The CLI takes a plain URL; the test isolates itself in a fresh schema, created here
    // through the store library and named in the URL's `options`.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = match runtime.block_on(contexture_store::PgStore::open_in_schema(&url, &schema)) {
        Ok(store) => store,
        Err(error) => {
            if in_ci() {
                panic!("CI=true and PostgreSQL at {url} is unreachable: {error}");
            }
            eprintln!("\n!!! SKIPPING the PostgreSQL CLI test: {url} is unreachable ({error}).\n");
            return;
        }
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let db = format!("{url}{separator}options=-csearch_path%3D{schema}");
    round_trip(&db);
    retention(&db, &store, &runtime);
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

#[test]
fn bad_input_and_bad_urls_are_reported() {
    let dir = TempDir::new("contexture-cli-errors");
    let db = sqlite_url(&dir, "threads.db");
    let error = fail(
        &db,
        &["append", "--thread", "t"],
        r#"{"role": "wizard", "content": "x"}"#,
    );
    assert!(error.contains("not a chat message"), "{error}");
    let error = fail(&db, &["append", "--thread", "t"], "[]");
    assert!(error.contains("holds no message"), "{error}");
    let error = fail(&db, &["messages", "--thread", "missing"], "");
    assert!(error.contains("thread `missing` not found"), "{error}");
    let error = fail(
        &db,
        &["fork", "--thread", "missing", "--at", "0", "--new", "x"],
        "",
    );
    assert!(error.contains("thread `missing` not found"), "{error}");
    let error = fail("mysql://nope", &["list"], "");
    assert!(
        error.contains("invalid database URL `mysql://nope`"),
        "{error}"
    );
}

/// `thread search`: the messages that hold a text, case-insensitively, with their seq (a
/// tool call's arguments included), oldest first, up to `--limit`; a fork finds its
/// parent's; an empty query is refused.
#[test]
fn searching_a_threads_messages() {
    let dir = TempDir::new("contexture-cli-search");
    let db = &sqlite_url(&dir, "threads.db");
    ok(db, &["append", "--thread", "t1"], HISTORY);
    let hits: Vec<serde_json::Value> = ok(db, &["search", "--thread", "t1", "PARIS"], "")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        hits,
        [
            serde_json::json!({"seq": 4, "type": "message_appended", "index": 0, "role": "tool", "excerpt": "Paris"}),
            serde_json::json!({"seq": 5, "type": "message_appended", "index": 0, "role": "assistant", "excerpt": "Paris."}),
        ]
    );
    let france = ok(
        db,
        &["search", "--thread", "t1", "france", "--limit", "5"],
        "",
    );
    let seqs: Vec<u64> = france
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [2, 3], "the question and the call's arguments");
    assert_eq!(
        ok(
            db,
            &["search", "--thread", "t1", "france", "--limit", "1"],
            ""
        )
        .lines()
        .count(),
        1
    );
    ok(db, &["fork", "--thread", "t1", "--new", "t2"], "");
    assert!(ok(db, &["search", "--thread", "t2", "Paris."], "").contains("\"seq\":5"));
    let error = fail(db, &["search", "--thread", "t1", " "], "");
    assert!(error.contains("the query is empty"), "{error}");
    let error = fail(db, &["search", "--thread", "nowhere", "x"], "");
    assert!(error.contains("nowhere"), "{error}");
}
