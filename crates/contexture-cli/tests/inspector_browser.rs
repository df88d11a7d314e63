//! The inspector page of `contexture serve` (`/ui`) in a real browser: Debian's Chromium,
//! driven by the Python `playwright` package (both pinned and installed by `.ci/run`),
//! through `tests/python/inspector_browser.py`. The server's executions call the fake
//! upstream, which answers slowly for the runs the browser follows live or cancels.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::RunToEnd;
use common::python;
use common::serving::{Server, create_key, under_ci};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use serde_json::json;

/// A message that would run script if it were shown as HTML.
const HOSTILE: &str = r#"<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">"#;

/// Two steps; the first's task holds the hostile topic.
const DONE_WORKFLOW: &str = r#"
name: notes
assistants: [{id: writer, model: gpt-4o-mini, system_prompt: Be brief.}]
states:
  - {id: outline, assistant_id: writer, task: 'Outline notes on {{topic}}', next: {state_id: write}}
  - {id: write, assistant_id: writer, task: Write them, next: {end: true}}
"#;

/// Three steps whose calls the upstream answers after a second each.
const LIVE_WORKFLOW: &str = r#"
name: live
assistants: [{id: slow, model: gpt-4o-mini, system_prompt: 'Answer slowly.'}]
states:
  - {id: one, assistant_id: slow, task: First, next: {state_id: two}}
  - {id: two, assistant_id: slow, task: Second, next: {state_id: three}}
  - {id: three, assistant_id: slow, task: Third, next: {end: true}}
"#;

/// Ten slow steps: cancelled long before its end.
const CANCEL_WORKFLOW: &str = r#"
name: long
assistants: [{id: slow, model: gpt-4o-mini, system_prompt: 'Answer slowly.'}]
states:
  - {id: s1, assistant_id: slow, task: One, next: {state_id: s2}}
  - {id: s2, assistant_id: slow, task: Two, next: {state_id: s3}}
  - {id: s3, assistant_id: slow, task: Three, next: {state_id: s4}}
  - {id: s4, assistant_id: slow, task: Four, next: {state_id: s5}}
  - {id: s5, assistant_id: slow, task: Five, next: {state_id: s6}}
  - {id: s6, assistant_id: slow, task: Six, next: {state_id: s7}}
  - {id: s7, assistant_id: slow, task: Seven, next: {state_id: s8}}
  - {id: s8, assistant_id: slow, task: Eight, next: {state_id: s9}}
  - {id: s9, assistant_id: slow, task: Nine, next: {state_id: s10}}
  - {id: s10, assistant_id: slow, task: Ten, next: {end: true}}
"#;

/// One step per item of a list (500 of them: 500 calls).
const BIG_WORKFLOW: &str = r#"
name: big
assistants: [{id: a, model: gpt-4o-mini, system_prompt: Be brief.}]
states:
  - {id: plan, transform: {count: '{{ items | length }}'}, next: {state_id: each, iter_key: items}}
  - {id: each, assistant_id: a, task: 'Item {{ n }}', next: {state_id: end}}
"#;

/// True when Debian's Chromium is installed; under CI its absence fails the test.
fn has_chromium(test: &str) -> bool {
    if Path::new("/usr/bin/chromium").exists() {
        return true;
    }
    assert!(
        !under_ci(),
        "{test}: /usr/bin/chromium is missing under CI; install Debian's `chromium` (as .ci/run does)"
    );
    eprintln!(
        "\n\n*** SKIPPED {test}: /usr/bin/chromium is missing; install Debian's `chromium` ***\n\n"
    );
    false
}

#[test]
fn the_inspector_page_shows_follows_and_cancels_executions_in_a_real_browser() {
    let test = "inspector_browser";
    if !python::has_package(test, "playwright", "playwright==1.64.1") || !has_chromium(test) {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    upstream.otherwise(|number, request| {
        let slow = request.json.to_string().contains("Answer slowly.");
        let reply = Reply::text(format!("reply {number}")).usage(30, 3);
        if slow {
            reply.after(Duration::from_millis(1200))
        } else {
            reply
        }
    });
    let dir = TempDir::new("contexture-inspector-browser");
    let db = format!("sqlite:{}", dir.join("serve.db").display());
    let key = create_key(&db, "acme");
    let other_key = create_key(&db, "zeta");
    let server = Server::start(&db, &upstream.base_url(), "upstream-key");

    // A finished execution whose first task holds markup.
    let body =
        json!({"workflow_yaml": DONE_WORKFLOW, "input": {"topic": HOSTILE}, "id": "notes-run"});
    let (head, answer) = server.request("POST", "/v1/executions", &key, Some(&body.to_string()));
    assert!(head.starts_with("HTTP/1.1 202"), "{head}\n{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while matches!(
        server.get_json("/v1/executions/notes-run", &key)["status"].as_str(),
        Some("running" | "queued")
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "notes-run never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A thread with a compaction and two forks, one forked from the other.
    let thread = "notes-thread";
    let append = |thread: &str, messages: serde_json::Value| {
        let body = json!({ "messages": messages }).to_string();
        let (head, answer) = server.request(
            "POST",
            &format!("/v1/threads/{thread}/messages"),
            &key,
            Some(&body),
        );
        assert!(head.starts_with("HTTP/1.1 20"), "{head}\n{answer}");
    };
    append(
        thread,
        json!([
            {"role": "system", "content": "You keep notes."},
            {"role": "user", "content": HOSTILE},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "And the second point?"},
            {"role": "assistant", "content": "Also noted."},
            {"role": "user", "content": "Summarize."},
        ]),
    );
    let post = |path: &str, body: serde_json::Value| {
        let (head, answer) = server.request("POST", path, &key, Some(&body.to_string()));
        assert!(head.starts_with("HTTP/1.1 20"), "{path}: {head}\n{answer}");
    };
    post(
        &format!("/v1/threads/{thread}/compact"),
        json!({"keep_messages": 2}),
    );
    post(
        &format!("/v1/threads/{thread}/fork"),
        json!({"id": format!("{thread}-branch")}),
    );
    append(
        &format!("{thread}-branch"),
        json!([{"role": "user", "content": "On the branch."}]),
    );
    post(
        &format!("/v1/threads/{thread}-branch/fork"),
        json!({"id": format!("{thread}-branch-2")}),
    );

    // A thread of 100,000 events (the server's most), appended 1,000 messages at a time.
    let big_thread = "big-thread";
    for batch in 0..100 {
        let messages: Vec<serde_json::Value> = (0..1000)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": format!("message {} of batch {batch}: a few words to count", i)})
            })
            .collect();
        append(big_thread, json!(messages));
    }
    let big_events = server.get_json(&format!("/v1/threads/{big_thread}"), &key)["last_seq"]
        .as_u64()
        .unwrap();
    assert_eq!(big_events, 100_000);

    // An execution of 500 calls, run by the CLI as tenant acme on the same database: one
    // step per item of a 500-item list, then a report.
    let big_run = "big-run";
    let items: Vec<serde_json::Value> = (0..500).map(|n| json!({ "n": n })).collect();
    std::fs::write(dir.join("big.yaml"), BIG_WORKFLOW).unwrap();
    let replies: String = (0..500)
        .map(|i| format!("- content: answer {i}\n"))
        .collect();
    std::fs::write(dir.join("big-replies.yaml"), replies).unwrap();
    common::contexture([
        "run",
        dir.join("big.yaml").to_str().unwrap(),
        "--input",
        &json!({ "items": items }).to_string(),
        "--llm",
        &format!("scripted:{}", dir.join("big-replies.yaml").display()),
        "--execution-id",
        big_run,
        "--tenant",
        "acme",
        "--db",
        &db,
    ])
    .run()
    .expect_success();
    let calls = server.get_json(&format!("/v1/executions/{big_run}"), &key);
    assert_eq!(calls["status"], "completed", "{calls}");

    let shots = common::root().join("target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let summary = python::run_script(
        "inspector_browser.py",
        &server,
        &key,
        &[
            ("OTHER_API_KEY", &other_key),
            ("DONE_EXECUTION", "notes-run"),
            ("THREAD", thread),
            ("BIG_THREAD", big_thread),
            ("BIG_EVENTS", &big_events.to_string()),
            ("BIG_EXECUTION", big_run),
            ("LIVE_WORKFLOW", LIVE_WORKFLOW),
            ("CANCEL_WORKFLOW", CANCEL_WORKFLOW),
            ("SCREENSHOT_DIR", shots.to_str().unwrap()),
        ],
    );
    eprintln!("inspector in the browser: {summary}");
    assert_eq!(summary["calls_checked"], 2, "{summary}");
    assert_eq!(summary["console_errors"], json!([]), "{summary}");
    for shot in [
        "execution-1280.png",
        "execution-390.png",
        "cancel-1280.png",
        "list-1280.png",
        "thread-1280.png",
        "thread-390.png",
    ] {
        assert!(shots.join(shot).exists(), "{shot} was not saved");
    }
    // The key never reached the server's log (nor a URL it logged).
    let log = server.stderr();
    let secret = key.rsplit('_').next().unwrap();
    assert!(!log.contains(secret), "the key is in the server's log");
}
