//! A state run on a fork of the execution's thread (`fork`): its call and exchange are
//! recorded on the fork, and one `merged` event with the step's end brings back what the
//! settings say (the answer only, the whole exchange, or keys only; keys resolved by the
//! conflict policy), its usage and cost counted once. A merge that cannot be made fails the
//! step; settings that cannot work are refused with their key.

use crate::common;

use common::{events, executor, script, sqlite, start, texts};
use contexture_core::thread::{EventKind, StepFailure};
use contexture_store::Store;
use serde_json::json;

fn workflow(fork: &str) -> String {
    format!(
        r#"
assistants: [{{id: a, model: gpt-4o-mini}}]
states:
  - {{id: one, assistant_id: a, task: Task one, next: {{state_id: explore}}}}
  - id: explore
    assistant_id: a
    task: Explore
    fork: {fork}
    next: {{state_id: two, output_key: idea}}
  - {{id: two, assistant_id: a, task: 'Use {{{{ idea }}}}', next: {{state_id: end}}}}
"#
    )
}

const REPLIES: &str = "[{content: out one, usage: {prompt_tokens: 10, completion_tokens: 2}}, {content: the idea, usage: {prompt_tokens: 20, completion_tokens: 3}}, {content: done, usage: {prompt_tokens: 30, completion_tokens: 4}}]";

#[tokio::test]
async fn a_forked_state_comes_back_as_its_merge_says() {
    for (fork, seen_by_two) in [
        (
            "{merge: summary-only, keys: [idea]}",
            vec!["hello", "Task one", "out one", "the idea", "Use the idea"],
        ),
        (
            "{}",
            vec![
                "hello",
                "Task one",
                "out one",
                "Explore",
                "the idea",
                "Use the idea",
            ],
        ),
        (
            "{merge: output-keys, keys: [idea]}",
            vec!["hello", "Task one", "out one", "Use the idea"],
        ),
    ] {
        let (_dir, store) = sqlite().await;
        let provider = script(REPLIES);
        let exec = executor(store.clone(), provider.clone());
        let out = start(&exec, &workflow(fork), "hello").await.unwrap();
        assert_eq!(out.output, "done", "{fork}");
        let sent = provider.requests();
        assert_eq!(
            texts(&sent[1].messages),
            ["hello", "Task one", "out one", "Explore"],
            "{fork}: the fork sees the execution's history"
        );
        assert_eq!(texts(&sent[2].messages), seen_by_two, "{fork}");
        assert_eq!(out.store.get("idea"), Some(&json!("the idea")), "{fork}");
        // Each call counted once: the fork's through the merge.
        assert_eq!(
            (out.usage.input_tokens, out.usage.output_tokens),
            (60, 9),
            "{fork}"
        );

        let log = events(&store, "run-1").await;
        let fork_id = "run-1~explore.fork.2";
        let step_two_started = log.iter().any(|event| {
            matches!(&event.kind, EventKind::StepStarted(start)
                if start.step == 2 && start.fork_thread.as_deref() == Some(fork_id))
        });
        assert!(step_two_started, "{fork}: the start names the fork");
        let merged_at = log
            .iter()
            .position(|event| matches!(&event.kind, EventKind::Merged(m) if m.child == fork_id))
            .expect("a merge");
        assert!(
            matches!(&log[merged_at + 1].kind, EventKind::StepFinished(end)
                if end.step == 2 && end.next.as_deref() == Some("two")),
            "{fork}: the step ends with its merge"
        );
        // The fork's call is recorded on the fork, not in the execution's log.
        let calls_here = log
            .iter()
            .filter(|event| matches!(event.kind, EventKind::RequestStarted(_)))
            .count();
        assert_eq!(calls_here, 2, "{fork}");
        // Reported as the execution's: its calls (the fork's among them, in step order)
        // and its usage, each call counted once.
        let report = contexture_engine::report::read_report(
            &store,
            "run-1",
            contexture_engine::report::CallsKept::All,
            1 << 20,
        )
        .await
        .unwrap()
        .expect("an execution")
        .report;
        let steps: Vec<Option<u64>> = report.calls.iter().map(|c| c.request.step).collect();
        assert_eq!(steps, [Some(1), Some(2), Some(3)], "{fork}");
        assert_eq!(report.calls[1].state_id.as_deref(), Some("explore"));
        assert_eq!(
            (report.usage.input_tokens, report.usage.output_tokens),
            (60, 9),
            "{fork}"
        );
        let on_fork = events(&store, fork_id).await;
        assert!(
            on_fork.iter().any(|event| matches!(&event.kind,
                EventKind::RequestStarted(record) if record.step == Some(2))),
            "{fork}"
        );
    }
}

#[tokio::test]
async fn a_merge_that_cannot_be_made_fails_the_step() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script(REPLIES));
    let error = start(
        &exec,
        &workflow("{conflict: error, keys: [idea]}"),
        r#"{"idea": "an older idea"}"#,
    )
    .await
    .expect_err("the fork's idea conflicts with the execution's");
    assert!(
        error
            .to_string()
            .contains("the fork could not be merged back"),
        "{error}"
    );
    let log = events(&store, "run-1").await;
    let failed: Vec<&StepFailure> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepFailed(failure) => Some(failure),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].step, 2);
    assert!(failed[0].error.contains("idea"), "{}", failed[0].error);
    // Nothing the fork made came back, but what it spent did, counted once.
    let merges: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Merged(merge) => Some(merge),
            _ => None,
        })
        .collect();
    assert_eq!(merges.len(), 1);
    assert!(merges[0].messages.is_empty() && merges[0].store_changes.is_empty());
    assert_eq!(
        (merges[0].usage.input_tokens, merges[0].usage.output_tokens),
        (20, 3)
    );
    let report = contexture_engine::report::report("run-1", &log).unwrap();
    assert_eq!(
        (report.usage.input_tokens, report.usage.output_tokens),
        (30, 5)
    );
}

#[tokio::test]
async fn fork_settings_that_cannot_work_are_refused_with_their_key() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[]"));
    let error = start(&exec, &workflow("{merge: output-keys, keys: []}"), "")
        .await
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("states[1].fork.keys: merge: output-keys brings back only keys"),
        "{error}"
    );
    let iterated = r#"
states:
  - {id: plan, transform: {files: [a, b]}, next: {state_id: each, iter_key: files}}
  - {id: each, transform: {seen: '{{ item }}'}, fork: {keys: all}, next: {state_id: end}}
"#;
    let error = start(&exec, iterated, "").await.expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("states[1].fork: an iteration's items cannot run on a fork"),
        "{error}"
    );
    let clearing = workflow("{}").replace(
        "next: {state_id: two, output_key: idea}",
        "next: {state_id: two, output_key: idea, clear_prior_messages: true}",
    );
    let error = start(&exec, &clearing, "").await.expect_err("refused");
    assert!(
        error.to_string().contains(
            "states[1].next.clear_prior_messages: clear_prior_messages on a state run on a fork would clear the fork only"
        ),
        "{error}"
    );
    let bad_policy = workflow("{merge: everything}");
    let error = start(&exec, &bad_policy, "").await.expect_err("refused");
    assert!(error.to_string().contains("everything"), "{error}");
}

/// A forked step that fails leaves its fork unmerged; the resumed run runs the step again on
/// a fork of its own and merges that one.
#[tokio::test]
async fn a_resumed_forked_step_runs_on_a_new_fork() {
    let (_dir, store) = sqlite().await;
    let first = executor(
        store.clone(),
        script("[{content: out one, usage: {prompt_tokens: 10, completion_tokens: 2}}]"),
    );
    start(&first, &workflow("{}"), "hello")
        .await
        .expect_err("the script has no reply for the forked step");
    let again = executor(
        store.clone(),
        script(&REPLIES.replacen(
            "{content: out one, usage: {prompt_tokens: 10, completion_tokens: 2}}, ",
            "",
            1,
        )),
    );
    let out = again.resume("run-1").await.expect("the rest runs");
    assert_eq!(out.output, "done");
    let log = events(&store, "run-1").await;
    let merged: Vec<&str> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Merged(merge) => Some(merge.child.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(merged, ["run-1~explore.fork.3"]);
    assert!(
        store.exists("run-1~explore.fork.2").await.unwrap(),
        "the failed attempt's fork stays, unmerged"
    );
}
