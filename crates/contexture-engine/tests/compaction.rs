//! Compaction on stored threads and inside runs, with the scripted provider
//! and with the fake upstream: what is covered, what stays verbatim, what the
//! summarizer sees, and that a failed summary replaces nothing.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{events, executor, requests, script, sqlite, start, texts};
use contexture_core::budget::SUMMARY_TAG;
use contexture_core::compact::{
    CompactionPolicy, Keep, NOTES_TAG, ORIGINAL_REQUEST_TAG, Trigger, restore_before,
};
use contexture_core::fit::{Rules, validate};
use contexture_core::registry::Registry;
use contexture_core::thread::{EventKind, ReplaceReason};
use contexture_core::{Message, ToolCall};
use contexture_engine::compaction::{
    CompactRequest, CompactionOutcome, CompactionReport, Compactor, compact_stored,
};
use contexture_engine::hooks::{CompactionInfo, Hook, HookError};
use contexture_engine::llm::{FixedRouter, Router};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{OpenAiProvider, Provider, RetryPolicy, ScriptedProvider};
use contexture_store::{NewEvent, SqliteStore, Store};

fn registry() -> Arc<Registry> {
    Arc::new(common::small_models())
}

fn compactor(provider: Arc<dyn Provider>) -> Compactor {
    Compactor::new(
        Arc::new(FixedRouter::new(provider)) as Arc<dyn Router>,
        registry(),
    )
}

fn policy(summarizer: Option<&str>, keep_messages: usize) -> CompactionPolicy {
    CompactionPolicy {
        keep: Keep {
            tokens: None,
            messages: Some(keep_messages),
        },
        summarizer: summarizer.map(str::to_owned),
        ..CompactionPolicy::default()
    }
}

/// A conversation: the request, then `turns` question/answer pairs, one with a tool call.
async fn conversation(store: &SqliteStore, thread: &str, turns: usize) {
    let mut messages = vec![Message::user(
        "Plan the migration of service billing-api to Postgres 16 by 2026-12-01.",
    )];
    for n in 0..turns {
        messages.push(Message::user(format!(
            "Question {n}: what about table t_{n}?"
        )));
        if n == 1 {
            messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                "c1",
                "inspect_table",
                r#"{"table": "t_1"}"#,
            )]));
            messages.push(Message::tool_result("c1", "t_1 has 4200 rows"));
        }
        messages.push(Message::assistant(format!(
            "Answer {n}: t_{n} moves in wave {n}."
        )));
    }
    store
        .append(thread, NewEvent::messages(messages, None))
        .await
        .unwrap();
}

#[test]
fn triggers_fire_when_exceeded_and_not_at_the_threshold() {
    let trigger = Trigger {
        tokens: Some(1000),
        window_share: Some(0.5),
        messages: Some(10),
    };
    let table = [
        (1000, 10, 4000, None),
        (
            1001,
            10,
            4000,
            Some("the request has 1001 tokens, over 1000"),
        ),
        (900, 11, 4000, Some("the history has 11 messages, over 10")),
        (900, 10, 1800, None),
        (
            901,
            10,
            1800,
            Some("the request has 901 tokens, over 0.5 of the 1800-token window (900)"),
        ),
    ];
    for (tokens, messages, window, expected) in table {
        assert_eq!(
            trigger.fires(tokens, messages, window).as_deref(),
            expected,
            "{tokens} tokens, {messages} messages, window {window}"
        );
    }
    assert_eq!(Trigger::default().fires(u64::MAX, usize::MAX, 1), None);
}

#[tokio::test]
async fn the_covered_range_is_exact_and_the_tail_is_kept_whole() {
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 4).await;
    let before = store.load("t").await.unwrap().projected_messages();
    assert_eq!(before.len(), 11);
    let provider = script("[{content: '## Goal\\nMigrate billing-api.'}]");
    let report = compact_stored(
        &compactor(provider.clone()),
        &store,
        "t",
        &CompactRequest::new(policy(Some("gpt-4o-mini"), 3), "manual"),
    )
    .await
    .unwrap();
    // Seqs 1..=11; the tail is the last three messages (answer 2, question 3, answer 3), so
    // seqs 1..=8 are covered.
    assert_eq!(report.covered, Some((1, 8)));
    assert_eq!(report.covered_messages, 8);
    let log = events(&store, "t").await;
    let replace = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ContextReplaced(op) => Some(op.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((replace.from_seq, replace.to_seq), (1, 8));
    assert_eq!(replace.reason, ReplaceReason::Compaction);
    let provenance = replace.provenance.unwrap();
    assert_eq!(provenance.summarizer_model.as_deref(), Some("gpt-4o-mini"));
    assert!(provenance.prompt_hash.unwrap().starts_with("fnv1a64:"));
    let after = store.load("t").await.unwrap().projection().messages;
    assert_eq!(
        texts(&after[2..]),
        texts(
            &before[8..]
                .iter()
                .map(|m| m.message.clone())
                .collect::<Vec<_>>()
        ),
        "the kept tail follows the replacement unchanged"
    );
    // The original request is first, verbatim and pinned; the summary follows.
    assert_eq!(after[0].text(), before[0].message.text());
    assert!(after[0].is_pinned());
    assert!(
        after[0]
            .metadata
            .tags
            .contains(&ORIGINAL_REQUEST_TAG.to_owned())
    );
    assert!(after[1].metadata.tags.contains(&SUMMARY_TAG.to_owned()));
    assert!(after[1].text().contains("Migrate billing-api."));
    // The original events are all still in the log.
    assert_eq!(
        log.iter()
            .filter(|e| matches!(e.kind, EventKind::MessageAppended { .. }))
            .count(),
        11
    );
}

#[tokio::test]
async fn tool_call_units_are_never_split_at_the_boundary() {
    // Seqs: 1 request, 2-3 turn 0, 4 question 1, 5 the tool call, 6 its result, 7 answer 1,
    // 8-9 turn 2. No keep may put the cut between the call and its result.
    for keep in 1..=8 {
        let (_dir, store) = sqlite().await;
        conversation(&store, "t", 3).await;
        let report = compact_stored(
            &compactor(Arc::new(ScriptedProvider::texts(["summary"]))),
            &store,
            "t",
            &CompactRequest::new(policy(None, keep), "manual"),
        )
        .await
        .unwrap();
        let projection = store.load("t").await.unwrap().projection().messages;
        for rules in [Rules::OpenAi, Rules::Anthropic] {
            let (repaired, _) = contexture_core::fit::repair(projection.clone(), rules);
            assert_eq!(validate(&repaired, rules), vec![], "keep {keep} {rules}");
        }
        assert_eq!(
            validate(&projection, Rules::OpenAi),
            vec![],
            "keep {keep}: no orphan result, no unanswered call"
        );
        if let Some((_, to_seq)) = report.covered {
            assert_ne!(
                to_seq, 5,
                "keep {keep}: the cut fell between a call and its result"
            );
        }
    }
}

#[tokio::test]
async fn a_failing_or_empty_summarizer_replaces_nothing_and_records_why() {
    let table = [
        (
            "[{error: {status: 500, message: down}}, {error: {status: 500, message: down}}, {error: {status: 503, message: busy}}]",
            "scripted: HTTP 503: busy (after 3 attempts)",
        ),
        (
            "[{content: ''}, {content: '   '}, {content: ''}]",
            "the summarizer returned an empty text (after 3 attempts)",
        ),
    ];
    for (replies, expected) in table {
        let (_dir, store) = sqlite().await;
        conversation(&store, "t", 4).await;
        let before = store.load("t").await.unwrap().projection();
        let report = compact_stored(
            &compactor(script(replies)),
            &store,
            "t",
            &CompactRequest::new(policy(Some("gpt-4o-mini"), 2), "manual"),
        )
        .await
        .unwrap();
        assert_eq!(
            report.outcome,
            CompactionOutcome::Failed {
                error: expected.to_owned()
            }
        );
        assert_eq!(report.calls, 3);
        assert_eq!(store.load("t").await.unwrap().projection(), before);
        let log = events(&store, "t").await;
        assert!(
            !log.iter()
                .any(|e| matches!(e.kind, EventKind::ContextReplaced(_)))
        );
        let failure = log
            .iter()
            .find_map(|e| match &e.kind {
                EventKind::CompactionFailed(failure) => Some(failure.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(failure.error, expected);
        assert_eq!(failure.attempts, 3);
        assert_eq!(
            requests(&log)
                .iter()
                .filter(|r| r.purpose.as_deref() == Some("compaction"))
                .count(),
            3
        );
    }
}

#[tokio::test]
async fn a_summarizer_that_times_out_over_http_replaces_nothing() {
    let upstream = FakeUpstream::scripted([
        Reply::text("late").after(Duration::from_secs(3)),
        Reply::text("late").after(Duration::from_secs(3)),
    ])
    .await;
    let base = upstream.base_url();
    let provider = Arc::new(
        OpenAiProvider::new(base, None)
            .with_timeout(Duration::from_millis(200))
            .with_retry(RetryPolicy::none()),
    );
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 3).await;
    let before = store.load("t").await.unwrap().projection();
    let mut policy = policy(Some("gpt-4o-mini"), 2);
    policy.max_retries = 1;
    // The summarizer's own timeout, not the provider's, bounds its calls.
    policy.timeout_secs = 1;
    let report = compact_stored(
        &compactor(provider),
        &store,
        "t",
        &CompactRequest::new(policy, "manual"),
    )
    .await
    .unwrap();
    assert!(
        matches!(&report.outcome, CompactionOutcome::Failed { error } if error.contains("no answer within 1s")),
        "{report:?}"
    );
    assert_eq!(upstream.bodies().len(), 2);
    assert_eq!(store.load("t").await.unwrap().projection(), before);
}

#[tokio::test]
async fn notes_are_kept_verbatim_and_never_reach_the_summarizer() {
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 4).await;
    let provider = script("[{content: 'the summary'}]");
    let mut request = CompactRequest::new(policy(Some("gpt-4o-mini"), 2), "manual");
    request.notes = Some("Keep ticket SECRET-NOTE-77 open.".into());
    compact_stored(&compactor(provider.clone()), &store, "t", &request)
        .await
        .unwrap();
    let prompts: Vec<String> = provider
        .requests()
        .iter()
        .map(|r| r.messages[0].text())
        .collect();
    assert_eq!(prompts.len(), 1);
    assert!(!prompts[0].contains("SECRET-NOTE-77"));
    assert!(
        prompts[0].contains("Question 1"),
        "the covered part is summarized"
    );
    assert!(
        !prompts[0].contains("Question 3"),
        "the kept tail is not summarized"
    );
    let after = store.load("t").await.unwrap().projection().messages;
    let notes = after
        .iter()
        .position(|m| m.metadata.tags.contains(&NOTES_TAG.to_owned()))
        .unwrap();
    let summary = after
        .iter()
        .position(|m| m.metadata.tags.contains(&SUMMARY_TAG.to_owned()))
        .unwrap();
    assert!(notes < summary, "notes come before the summary");
    assert!(
        after[notes]
            .text()
            .ends_with("Keep ticket SECRET-NOTE-77 open.")
    );
    assert!(after[notes].is_pinned());

    // Without history, only the notes are kept.
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 4).await;
    let provider = script("[]");
    let mut request = CompactRequest::new(policy(Some("gpt-4o-mini"), 2), "manual");
    request.notes = Some("only this".into());
    request.preserve_history = false;
    compact_stored(&compactor(provider.clone()), &store, "t", &request)
        .await
        .unwrap();
    assert!(provider.requests().is_empty());
    let after = store.load("t").await.unwrap().projection().messages;
    assert_eq!(after[0].text(), "Notes (kept verbatim):\nonly this");
    assert_eq!(after.len(), 3);
}

#[tokio::test]
async fn a_later_compaction_extends_the_running_summary() {
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 3).await;
    let provider = script("[{content: FIRST-SUMMARY}, {content: SECOND-SUMMARY}]");
    let compactor = compactor(provider.clone());
    let request = CompactRequest::new(policy(Some("gpt-4o-mini"), 2), "manual");
    compact_stored(&compactor, &store, "t", &request)
        .await
        .unwrap();
    let more: Vec<NewEvent> = (10..14)
        .map(|n| {
            NewEvent::new(EventKind::MessageAppended {
                message: if n % 2 == 0 {
                    Message::user(format!("Later question {n}"))
                } else {
                    Message::assistant(format!("Later answer {n}"))
                },
            })
        })
        .collect();
    store.append("t", more).await.unwrap();
    compact_stored(&compactor, &store, "t", &request)
        .await
        .unwrap();
    let second = provider.requests()[1].messages[0].text();
    assert!(second.contains("FIRST-SUMMARY"), "{second}");
    assert!(second.contains("Extend it with the new messages"));
    assert!(second.contains("Later question 10"));
    assert!(
        !second.contains("Question 0"),
        "messages the first summary covers are not summarized again"
    );
    let after = store.load("t").await.unwrap().projection().messages;
    // The original request survives both compactions, once.
    assert_eq!(
        after
            .iter()
            .filter(|m| m.text().starts_with("Plan the migration"))
            .count(),
        1
    );
    assert!(after[1].text().ends_with("SECOND-SUMMARY"));
    assert_eq!(texts(&after[2..]), ["Later question 12", "Later answer 13"]);
}

#[tokio::test]
async fn map_reduce_splits_what_exceeds_the_summarizers_window() {
    let (_dir, store) = sqlite().await;
    let mut messages = vec![Message::user("Review the incident log.")];
    for n in 0..12 {
        messages.push(Message::user(format!(
            "Log part {n}: {}",
            "disk latency rose on node-7 while the queue backed up. ".repeat(6)
        )));
        messages.push(Message::assistant(format!("Noted part {n}.")));
    }
    messages.push(Message::user(format!(
        "HUGE-START {} HUGE-END",
        "a very long stack trace line ".repeat(400)
    )));
    messages.push(Message::assistant("ok"));
    messages.push(Message::user("What now?"));
    store
        .append("t", NewEvent::messages(messages, None))
        .await
        .unwrap();
    let replies: Vec<String> = (0..40).map(|n| format!("partial-{n}")).collect();
    let provider = Arc::new(ScriptedProvider::texts(replies));
    let mut policy = policy(Some("small-summarizer"), 1);
    policy.summary_tokens = 100;
    let report = compact_stored(
        &compactor(provider.clone()),
        &store,
        "t",
        &CompactRequest::new(policy, "manual"),
    )
    .await
    .unwrap();
    assert!(matches!(
        report.outcome,
        CompactionOutcome::Compacted { .. }
    ));
    let sent = provider.requests();
    assert!(sent.len() >= 3, "{} calls", sent.len());
    let model = registry().resolve("small-summarizer");
    for request in &sent {
        let tokens = model.counter.count_request(&request.messages, &[]).total;
        assert!(tokens + 100 <= 700, "a call of {tokens} tokens");
    }
    let prompts: Vec<String> = sent.iter().map(|r| r.messages[0].text()).collect();
    assert!(prompts.iter().any(
        |p| p.contains("HUGE-START") && p.contains("tokens cut to fit the summarizer's window")
    ));
    let merges = prompts
        .iter()
        .filter(|p| p.starts_with("These are summaries of consecutive parts"))
        .count();
    assert!(merges >= 1);
    let last = sent.len() - 1;
    let after = store.load("t").await.unwrap().projection().messages;
    assert!(after[1].text().ends_with(&format!("partial-{last}")));
}

#[tokio::test]
async fn a_compaction_can_be_restored() {
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 4).await;
    let before = store.load("t").await.unwrap().projection();
    let report = compact_stored(
        &compactor(script("[]")),
        &store,
        "t",
        &CompactRequest::new(policy(None, 2), "manual"),
    )
    .await
    .unwrap();
    let CompactionOutcome::Compacted { replace_seq, .. } = report.outcome else {
        panic!("{report:?}");
    };
    store
        .append_one(
            "t",
            NewEvent::new(EventKind::MessageAppended {
                message: Message::user("after the compaction"),
            }),
        )
        .await
        .unwrap();
    let log = events(&store, "t").await;
    let restore = restore_before(&log, replace_seq, "restore-1").unwrap();
    store
        .append_one("t", NewEvent::new(EventKind::ContextReplaced(restore)))
        .await
        .unwrap();
    let restored = store.load("t").await.unwrap().projection();
    let mut expected = before.messages.clone();
    expected.push(Message::user("after the compaction"));
    assert_eq!(texts(&restored.messages), texts(&expected));
    // The compaction event itself is still in the log.
    assert!(
        events(&store, "t")
            .await
            .iter()
            .any(|e| e.seq == replace_seq && matches!(e.kind, EventKind::ContextReplaced(_)))
    );
}

#[tokio::test]
async fn the_extractive_summarizer_needs_no_model() {
    let (_dir, store) = sqlite().await;
    conversation(&store, "t", 5).await;
    let provider = script("[]");
    let report = compact_stored(
        &compactor(provider.clone()),
        &store,
        "t",
        &CompactRequest::new(policy(None, 2), "manual"),
    )
    .await
    .unwrap();
    assert_eq!(report.calls, 0);
    assert_eq!(report.summarizer, "extractive");
    let summary = report.summary.unwrap();
    for fact in ["t_1", "4200", "inspect_table"] {
        assert!(summary.contains(fact), "{fact} in {summary}");
    }
    assert!(provider.requests().is_empty());
}

/// Says no to compactions, and counts the reports it is told about.
#[derive(Default)]
struct Gate {
    allow: bool,
    seen: Mutex<Vec<String>>,
}

impl Hook for Gate {
    fn before_compaction(&self, compaction: &CompactionInfo) -> Result<bool, HookError> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("before {}", compaction.reason));
        Ok(self.allow)
    }
    fn after_compaction(
        &self,
        _: &CompactionInfo,
        report: &CompactionReport,
    ) -> Result<(), HookError> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("after {:?}", report.covered));
        Ok(())
    }
}

#[tokio::test]
async fn hooks_see_compactions_and_may_skip_them() {
    for allow in [false, true] {
        let (_dir, store) = sqlite().await;
        conversation(&store, "t", 4).await;
        let gate = Arc::new(Gate {
            allow,
            ..Gate::default()
        });
        let compactor = compactor(script("[]")).with_hooks(vec![gate.clone()]);
        let report = compact_stored(
            &compactor,
            &store,
            "t",
            &CompactRequest::new(policy(None, 2), "manual"),
        )
        .await
        .unwrap();
        let seen = gate.seen.lock().unwrap().clone();
        if allow {
            assert_eq!(seen, ["before manual", "after Some((1, 9))"]);
            assert!(matches!(
                report.outcome,
                CompactionOutcome::Compacted { .. }
            ));
        } else {
            assert_eq!(seen, ["before manual"]);
            assert!(matches!(report.outcome, CompactionOutcome::Skipped { .. }));
        }
    }
}

/// A hook program decides too: `{"skip": true}` skips the compaction, an empty answer lets
/// it run, and one that fails stops it with the program named (nothing is replaced).
#[tokio::test]
async fn a_hook_program_may_skip_a_compaction_and_its_failure_stops_it() {
    use contexture_engine::hooks::{HookPoint, HookProgramSpec, ProgramHook};
    let program = |script: &str| {
        Arc::new(
            ProgramHook::new(HookProgramSpec {
                command: vec!["sh".into(), "-c".into(), script.into()],
                points: vec![HookPoint::BeforeCompaction],
                timeout_seconds: Some(10.0),
                environment: None,
            })
            .unwrap(),
        ) as Arc<dyn Hook>
    };
    for (shell, outcome) in [
        (r#"cat > /dev/null; echo '{"skip": true}'"#, "skipped"),
        ("cat > /dev/null", "compacted"),
        ("cat > /dev/null; echo 'locked' >&2; exit 2", "failed"),
    ] {
        let (_dir, store) = sqlite().await;
        conversation(&store, "t", 4).await;
        let before = store.events("t").await.unwrap().len();
        let compactor = compactor(script("[]")).with_hooks(vec![program(shell)]);
        let result = compact_stored(
            &compactor,
            &store,
            "t",
            &CompactRequest::new(policy(None, 2), "manual"),
        )
        .await;
        match (outcome, result) {
            ("skipped", Ok(report)) => {
                assert!(matches!(report.outcome, CompactionOutcome::Skipped { .. }));
                assert_eq!(store.events("t").await.unwrap().len(), before);
            }
            ("compacted", Ok(report)) => {
                assert!(matches!(
                    report.outcome,
                    CompactionOutcome::Compacted { .. }
                ));
            }
            ("failed", Err(error)) => {
                let text = error.to_string();
                assert!(
                    text.contains("failed at before_compaction")
                        && text.contains("exited with exit status: 2: locked"),
                    "{text}"
                );
                assert_eq!(store.events("t").await.unwrap().len(), before);
            }
            (outcome, other) => panic!("{outcome}: {other:?}"),
        }
    }
}

const LONG_RUN: &str = r#"
assistants:
  - id: a
    model: small-window
    system_prompt: You analyse incidents.
    compaction:
      trigger: {window_share: 0.35}
      keep: {messages: 2}
      summarizer: gpt-4o-mini
STATES"#;

fn long_run(steps: usize) -> String {
    let mut states = String::from("states:\n");
    for n in 0..steps {
        let next = if n + 1 == steps {
            "end".to_owned()
        } else {
            format!("s{}", n + 1)
        };
        states += &format!(
            "  - {{id: s{n}, assistant_id: a, task: 'Analyse part {n}', next: {{state_id: {next}}}}}\n"
        );
    }
    LONG_RUN.replace("STATES", &states)
}

#[tokio::test]
async fn in_a_run_the_trigger_compacts_and_every_request_fits_and_validates() {
    let steps = 8;
    let answer = |n: usize| {
        format!(
            "Part {n}: {}",
            "the error rate stayed at 2% on node-3. ".repeat(12)
        )
    };
    // Replies in order: each step's answer, with a summary wherever a compaction runs.
    let upstream = FakeUpstream::scripted((0..steps * 2).map(|n| Reply::text(answer(n)))).await;
    let base = upstream.base_url();
    let provider =
        Arc::new(OpenAiProvider::new(base.clone(), None).with_retry(RetryPolicy::none()));
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), provider).with_registry(registry());
    let out = start(&exec, &long_run(steps), "Incident 4711: analyse the logs.")
        .await
        .unwrap();
    assert!(out.output.starts_with("Part"));
    let log = events(&store, "run-1").await;
    let compactions = log
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::ContextReplaced(op) if op.reason == ReplaceReason::Compaction))
        .count();
    assert!(compactions >= 2, "{compactions} compactions");
    let model = registry().resolve("small-window");
    for (n, body) in upstream.bodies().iter().enumerate() {
        let messages = contexture_core::format::openai::parse_request(body).unwrap();
        assert_eq!(validate(&messages, Rules::OpenAi), vec![], "request {n}");
        let tokens = model.counter.count_request(&messages, &[]).total;
        assert!(tokens <= 1500 - 200, "request {n}: {tokens} tokens");
    }
    // After a compaction, the step's request starts with the original request and the summary.
    let step_requests: Vec<_> = requests(&log)
        .into_iter()
        .filter(|r| r.purpose.is_none())
        .collect();
    let last = step_requests.last().unwrap();
    assert_eq!(last.messages[1].text(), "Incident 4711: analyse the logs.");
    assert!(
        last.messages[2]
            .metadata
            .tags
            .contains(&SUMMARY_TAG.to_owned())
    );
}

#[tokio::test]
async fn the_context_manager_tool_compacts_through_the_same_path() {
    let workflow = r#"
assistants:
  - id: a
    model: gpt-4o-mini
    tools: [compact]
    compaction: {keep: {messages: 1}, summarizer: gpt-4o-mini}
tools:
  - {id: compact, tool: context_manager}
states:
  - {id: one, assistant_id: a, task: Gather facts about ACME-9, next: {state_id: two}}
  - {id: two, assistant_id: a, task: More facts, next: {state_id: three}}
  - {id: three, assistant_id: a, task: Tidy up and go on, next: {state_id: four}}
  - {id: four, assistant_id: a, task: Final answer, next: {end: true}}
"#;
    let provider = script(
        r#"
- content: fact one
- content: fact two
- tool_calls: [{id: k1, name: compact, arguments: {notes: 'Order id ORD-555 must be refunded.'}}]
- content: the summary of facts
- content: tidied
- content: done
"#,
    );
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, workflow, "Investigate ACME-9").await.unwrap();
    assert_eq!(out.output, "done");
    let sent = provider.requests();
    // Call 4 is the summarizer: it never sees the notes.
    let prompt = sent[3].messages[0].text();
    assert!(prompt.contains("fact one"), "{prompt}");
    assert!(!prompt.contains("ORD-555"));
    // The tool's result tells the model what happened.
    let result = sent[4].messages.last().unwrap().text();
    assert!(result.starts_with("Context compacted:"), "{result}");
    // The last step sees the notes and the summary instead of the early exchanges.
    let last = texts(&sent[5].messages);
    assert!(
        last.iter()
            .any(|t| t.ends_with("Order id ORD-555 must be refunded."))
    );
    assert!(last.iter().any(|t| t.ends_with("the summary of facts")));
    assert!(!last.iter().any(|t| t == "fact one"));
}

#[tokio::test]
async fn in_a_run_a_failed_compaction_replaces_nothing_and_the_run_goes_on_trimmed() {
    // History over 3 messages fires; the summarizer always fails (no retry). Calls, in order:
    // step 0, step 1, then per step a failed summary and the step's answer.
    let steps = 8;
    let long = |n: usize| {
        format!(
            "Part {n}: {}",
            "the error rate stayed at 2% on node-3. ".repeat(14)
        )
    };
    let mut replies = format!("- content: '{}'\n- content: '{}'\n", long(0), long(1));
    for n in 2..steps {
        replies += &format!(
            "- error: {{status: 500, message: summarizer down}}\n- content: '{}'\n",
            long(n)
        );
    }
    let workflow = long_run(steps).replace(
        "      trigger: {window_share: 0.35}\n      keep: {messages: 2}\n      summarizer: gpt-4o-mini",
        "      trigger: {messages: 3}\n      keep: {messages: 2}\n      summarizer: gpt-4o-mini\n      max_retries: 0",
    );
    let (_dir, store) = sqlite().await;
    let provider = script(&replies);
    let exec = executor(store.clone(), provider.clone()).with_registry(registry());
    let out = start(&exec, &workflow, "Incident 4711.").await.unwrap();
    assert!(out.output.starts_with(&format!("Part {}", steps - 1)));
    let log = events(&store, "run-1").await;
    let failures = log
        .iter()
        .filter(|e| matches!(e.kind, EventKind::CompactionFailed(_)))
        .count();
    assert_eq!(failures, steps - 2);
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, EventKind::ContextReplaced(_))),
        "nothing was replaced"
    );
    // Nothing was lost, and every step's request was trimmed to fit instead.
    let thread = store.load("run-1").await.unwrap();
    assert_eq!(thread.projection().messages.len(), 1 + 2 * steps);
    let step_requests: Vec<_> = requests(&log)
        .into_iter()
        .filter(|r| r.purpose.is_none())
        .collect();
    assert_eq!(step_requests.len(), steps);
    for request in &step_requests {
        let breakdown = request.breakdown.as_ref().unwrap();
        assert!(breakdown.fits());
        assert_eq!(validate(&request.messages, Rules::OpenAi), vec![]);
    }
    assert!(
        step_requests
            .iter()
            .any(|r| r.fit.as_ref().is_some_and(|f| !f.dropped.is_empty())),
        "the later requests were trimmed"
    );
}
