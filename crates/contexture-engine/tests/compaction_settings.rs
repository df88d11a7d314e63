//! A compaction policy's settings beyond what it keeps: the trigger a policy gets when it
//! names none, the map-reduce threshold, and the summarizer's own timeout.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{events, executor, script, sqlite, start};
use contexture_core::Message;
use contexture_core::compact::{CompactionPolicy, DEFAULT_TRIGGER_TOKENS, Keep, Trigger};
use contexture_core::registry::Registry;
use contexture_core::thread::{EventKind, ReplaceReason};
use contexture_engine::compaction::{CompactRequest, CompactionOutcome, Compactor, compact_stored};
use contexture_engine::llm::{FixedRouter, Router};
use contexture_engine::workflow::Workflow;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{OpenAiProvider, Provider, RetryPolicy, ScriptedProvider};
use contexture_store::{NewEvent, SqliteStore, Store};

fn compactor(provider: Arc<dyn Provider>) -> Compactor {
    Compactor::new(
        Arc::new(FixedRouter::new(provider)) as Arc<dyn Router>,
        Arc::new(Registry::builtin()),
    )
}

/// How a policy's trigger reads from YAML (workflows, thread policies) and TOML (the
/// server's `[compaction]`): none named is the default threshold, `{}` is manual only.
#[test]
fn a_policy_that_names_no_trigger_compacts_past_ten_thousand_tokens() {
    let default = Trigger {
        tokens: Some(DEFAULT_TRIGGER_TOKENS),
        ..Trigger::default()
    };
    let table: [(&str, Trigger); 4] = [
        ("summarizer: gpt-4o-mini", default.clone()),
        ("keep: {messages: 2}", default.clone()),
        ("trigger: {}", Trigger::default()),
        (
            "trigger: {messages: 40}",
            Trigger {
                messages: Some(40),
                ..Trigger::default()
            },
        ),
    ];
    for (yaml, trigger) in table {
        let policy: CompactionPolicy = yaml_serde::from_str(yaml).unwrap();
        assert_eq!(policy.trigger, trigger, "{yaml}");
    }
    let policy: CompactionPolicy = toml::from_str("summarizer = \"gpt-4o-mini\"").unwrap();
    assert_eq!(policy.trigger, default);
    let policy: CompactionPolicy = toml::from_str("trigger = {}").unwrap();
    assert!(policy.trigger.is_empty());
    // A policy read back from its JSON keeps its trigger, the default one included.
    let json = serde_json::to_string(&CompactionPolicy::default()).unwrap();
    let back: CompactionPolicy = serde_json::from_str(&json).unwrap();
    assert_eq!(back, CompactionPolicy::default());
    assert_eq!(
        default.describe(),
        "when the request is over 10000 tokens",
        "what validate prints"
    );
}

fn two_steps(compaction: &str) -> String {
    format!(
        r#"
assistants:
  - id: a
    model: gpt-4o-mini
    compaction: {compaction}
states:
  - {{id: one, assistant_id: a, task: Collect the logs, next: {{state_id: two}}}}
  - {{id: two, assistant_id: a, task: Sum them up, next: {{end: true}}}}
"#
    )
}

/// The first step's answer takes about 12,000 tokens: the second step's request passes the
/// default threshold.
fn long_answer_script() -> Arc<ScriptedProvider> {
    let long = "node-7 disk latency rose again. ".repeat(2_000);
    script(&format!("- content: '{long}'\n- content: done\n"))
}

#[tokio::test]
async fn in_a_run_a_policy_without_a_trigger_compacts_and_an_empty_trigger_does_not() {
    for (compaction, compacts) in [
        ("{keep: {messages: 1}}", true),
        ("{keep: {messages: 1}, trigger: {}}", false),
    ] {
        let workflow = two_steps(compaction);
        let (_dir, store) = sqlite().await;
        let exec = executor(store.clone(), long_answer_script());
        let out = start(&exec, &workflow, "Incident 4711").await.unwrap();
        assert_eq!(out.output, "done");
        let compactions = events(&store, "run-1")
            .await
            .iter()
            .filter(|event| {
                matches!(&event.kind, EventKind::ContextReplaced(op) if op.reason == ReplaceReason::Compaction)
            })
            .count();
        assert_eq!(compactions, usize::from(compacts), "{compaction}");
    }
}

#[test]
fn validate_says_when_each_compaction_fires() {
    let text = format!(
        "{}conversation:\n  compaction: {{trigger: {{}}}}\n",
        two_steps("{summarizer: gpt-4o-mini}")
    );
    let workflow = Workflow::load(&text, "w.yaml").unwrap();
    assert_eq!(
        workflow.compaction_triggers(),
        [
            (
                "assistant `a`".to_owned(),
                "when the request is over 10000 tokens (the default: the policy names no trigger)"
                    .to_owned()
            ),
            (
                "the conversation".to_owned(),
                "only when asked for (`trigger: {}`)".to_owned()
            ),
        ]
    );
}

/// Twelve exchanges of about 90 tokens each, then a question: a covered part of about
/// 1,100 tokens, far inside a 128k summarizer's window.
async fn incident_thread(store: &SqliteStore) {
    let mut messages = vec![Message::user("Review the incident log.")];
    for n in 0..12 {
        messages.push(Message::user(format!(
            "Log part {n}: {}",
            "disk latency rose on node-7 while the queue backed up. ".repeat(6)
        )));
        messages.push(Message::assistant(format!("Noted part {n}.")));
    }
    messages.push(Message::user("What now?"));
    store
        .append("t", NewEvent::messages(messages, None))
        .await
        .unwrap();
}

fn summarizer_policy() -> CompactionPolicy {
    CompactionPolicy {
        keep: Keep {
            tokens: None,
            messages: Some(1),
        },
        summarizer: Some("gpt-4o-mini".to_owned()),
        ..CompactionPolicy::default()
    }
}

#[tokio::test]
async fn mapreduce_tokens_splits_a_part_that_fits_the_summarizers_window() {
    for (mapreduce_tokens, splits) in [(None, false), (Some(300), true)] {
        let (_dir, store) = sqlite().await;
        incident_thread(&store).await;
        let provider = Arc::new(ScriptedProvider::texts(
            (0..40).map(|n| format!("partial-{n}")).collect::<Vec<_>>(),
        ));
        let mut policy = summarizer_policy();
        policy.mapreduce_tokens = mapreduce_tokens;
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
        let prompts: Vec<String> = provider
            .requests()
            .iter()
            .map(|request| request.messages[0].text())
            .collect();
        if !splits {
            assert_eq!(prompts.len(), 1, "one call below the window");
            continue;
        }
        let merges = prompts
            .iter()
            .filter(|p| p.starts_with("These are summaries of consecutive parts"))
            .count();
        assert!(prompts.len() >= 4 && merges >= 1, "{} calls", prompts.len());
        // Each map call's transcript keeps within the threshold.
        let counter = Registry::builtin().resolve("gpt-4o-mini").counter;
        for prompt in prompts.iter().filter(|p| p.contains("Log part")) {
            let start = prompt.find("Log part").unwrap();
            assert!(
                counter.count_text(&prompt[start..]) <= 300 + 40,
                "a chunk of {} tokens",
                counter.count_text(&prompt[start..])
            );
        }
    }
}

#[test]
fn a_threshold_too_small_for_a_chunk_and_a_timeout_out_of_range_are_refused() {
    let problems = |yaml: &str| {
        yaml_serde::from_str::<CompactionPolicy>(yaml)
            .unwrap()
            .problems()
    };
    assert_eq!(
        problems("mapreduce_tokens: 10"),
        [(
            "mapreduce_tokens",
            "mapreduce_tokens must be at least 64 (each chunk is one summarizer call), not 10"
                .to_owned()
        )]
    );
    for yaml in ["timeout_secs: 0", "timeout_secs: 3601"] {
        let found = problems(yaml);
        assert_eq!(found.len(), 1, "{yaml}");
        assert_eq!(found[0].0, "timeout_secs");
        assert!(found[0].1.contains("from 1 to 3600"), "{}", found[0].1);
    }
    assert_eq!(CompactionPolicy::default().timeout_secs, 600);
}

/// The summarizer answers after 1.5 s; the provider's own timeout is 1 s (a run's
/// `--llm-timeout`). The policy's timeout is the one summarizer calls get.
#[tokio::test]
async fn the_summarizer_waits_for_the_policys_timeout_not_the_providers() {
    for (timeout_secs, succeeds) in [(None, true), (Some(1), false)] {
        let upstream = FakeUpstream::scripted([
            Reply::text("the slow summary").after(Duration::from_millis(1_500))
        ])
        .await;
        let provider = OpenAiProvider::new(upstream.base_url(), None)
            .with_timeout(Duration::from_secs(1))
            .with_retry(RetryPolicy::none());
        let (_dir, store) = sqlite().await;
        incident_thread(&store).await;
        let mut policy = summarizer_policy();
        policy.max_retries = 0;
        if let Some(seconds) = timeout_secs {
            policy.timeout_secs = seconds;
        }
        let report = compact_stored(
            &compactor(Arc::new(provider)),
            &store,
            "t",
            &CompactRequest::new(policy, "manual"),
        )
        .await
        .unwrap();
        match (&report.outcome, succeeds) {
            (CompactionOutcome::Compacted { .. }, true) => {
                assert_eq!(report.summary.as_deref(), Some("the slow summary"));
            }
            (CompactionOutcome::Failed { error }, false) => {
                assert!(error.contains("no answer within 1s"), "{error}");
            }
            (outcome, _) => panic!("timeout {timeout_secs:?}: {outcome:?}"),
        }
    }
}

/// A tool state running the `context_manager` tool sets the summarizer's timeout in its
/// configured arguments (the summarizer is tried three times: the default retries).
#[tokio::test]
async fn the_context_manager_tools_timeout_setting_bounds_its_summarizer() {
    let workflow = |timeout: &str| {
        format!(
            r#"
assistants:
  - id: a
    model: gpt-4o-mini
tools:
  - id: compact
    tool: context_manager
    arguments: {{timeout_secs: {timeout}, summarizer: gpt-4o-mini, keep_messages: 1}}
states:
  - {{id: one, assistant_id: a, task: Gather facts, next: {{state_id: two}}}}
  - {{id: two, assistant_id: a, task: More facts, next: {{state_id: squeeze}}}}
  - {{id: squeeze, tool_id: compact, next: {{end: true}}}}
"#
        )
    };
    for (timeout, compacted) in [("1", false), ("30", true), ("0", false)] {
        let upstream = FakeUpstream::scripted([
            Reply::text("fact one"),
            Reply::text("fact two"),
            Reply::text("the summary").after(Duration::from_millis(1_500)),
            Reply::text("the summary").after(Duration::from_millis(1_500)),
            Reply::text("the summary").after(Duration::from_millis(1_500)),
        ])
        .await;
        let (_dir, store) = sqlite().await;
        let exec = common::http_executor(store.clone(), &upstream.base_url());
        let outcome = start(&exec, &workflow(timeout), "Investigate ACME-9").await;
        let log = events(&store, "run-1").await;
        let replaced = log.iter().any(|event| {
            matches!(&event.kind, EventKind::ContextReplaced(op) if op.reason == ReplaceReason::Compaction)
        });
        assert_eq!(replaced, compacted, "timeout_secs {timeout}: {outcome:?}");
        if timeout == "0" {
            let error = format!("{:?}", outcome.unwrap_err());
            assert!(
                error.contains("timeout_secs must be a positive whole number"),
                "{error}"
            );
        }
    }
}
