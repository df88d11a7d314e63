//! Fitting inside an assistant's own tool loop: a one-step agent whose tool results are
//! large, on a small window. Without a policy the step fails naming what to set; with
//! truncation and clearing every call fits, keeps its task and its most recent tool uses,
//! records what was cleared and cut, and the step's log keeps every result whole.

use crate::common;

use common::{events, executor, forty_call_workflow, requests, script, sqlite, start};
use contexture_core::fit::{Rules, is_cleared_placeholder, validate};
use contexture_core::thread::{EventKind, FitRecord, RequestRecord};
use contexture_core::{Encoding, Message, Role, TokenCounter};

/// A tool whose every result is about 1,200 tokens of numbered lines.
const WORKFLOW: &str = r#"
assistants:
  - id: agent
    model: gpt-4o-mini
    tools: [fetch]
    max_iterations: 12
    context:
      window: 4000
      reserve: 500
POLICY
tools:
  - id: fetch
    description: Fetch a page.
    response: '{% for i in range(300) %}line {{ i }} of page {{ arguments.page }}
      {% endfor %}'
states:
  - {id: s, assistant_id: agent, task: Read ten pages and sum them up., next: {end: true}}
"#;

/// Ten tool calls, one page each, then the answer.
fn calls() -> String {
    let mut script = String::new();
    for page in 0..10 {
        script.push_str(&format!(
            "- tool_calls: [{{id: call-{page}, name: fetch, arguments: {{page: {page}}}}}]\n"
        ));
    }
    script.push_str("- content: the sum of ten pages\n");
    script
}

#[tokio::test]
async fn without_a_policy_the_loop_does_not_fit_and_the_error_says_what_to_set() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script(&calls()));
    let error = start(&exec, &WORKFLOW.replace("POLICY", ""), "")
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("cannot fit the model's window")
            && text.contains("context.clear_tool_results"),
        "{text}"
    );
}

#[tokio::test]
async fn with_truncation_and_clearing_every_call_fits_and_keeps_its_task_and_recent_results() {
    let (_dir, store) = sqlite().await;
    let provider = script(&calls());
    let exec = executor(store.clone(), provider.clone());
    let policy = "      clear_tool_results: {trigger_tokens: 2500, keep: 2, clear_at_least: 500}\n      truncate_tool_results: {max_tokens: 900}";
    let out = start(&exec, &WORKFLOW.replace("POLICY", policy), "")
        .await
        .unwrap();
    assert_eq!(out.output, "the sum of ten pages");
    let counter = TokenCounter::Exact {
        encoding: Encoding::O200kBase,
    };
    let log = events(&store, "run-1").await;
    let records = requests(&log);
    assert_eq!(records.len(), 11);
    let sent = provider.requests();
    let mut cleared_any = false;
    for (n, (record, sent)) in records.iter().zip(&sent).enumerate() {
        // Recorded exactly as sent, within the limit, valid for both providers' rules.
        assert_eq!(record.messages, sent.messages, "call {n}");
        let fit = fits_and_keeps_task(n, record, &[Rules::OpenAi, Rules::Anthropic], |m| {
            m.role == Role::User && m.text() == "Read ten pages and sum them up."
        });
        let results: Vec<_> = record
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .collect();
        assert_eq!(results.len(), n, "call {n}: every call keeps a result");
        for (i, result) in results.iter().enumerate() {
            let text = result.text();
            assert!(counter.count_text(&text) <= 900, "call {n} result {i}");
            let recent = i + 2 >= results.len();
            if recent {
                assert!(
                    !is_cleared_placeholder(&text),
                    "call {n}: result {i} is recent"
                );
            }
            if is_cleared_placeholder(&text) {
                let id = result.tool_call_id.as_deref().unwrap();
                assert!(text.contains(&format!("({id}, ")), "{text}");
                cleared_any = true;
            }
        }
        if n >= 1 {
            // Every result the request holds is cut; one an earlier call cleared is put in
            // as its placeholder, never cut again.
            for result in &results {
                let id = result.tool_call_id.as_deref().unwrap();
                let cut = fit.truncated.iter().any(|t| *t.tool_call_id == *id);
                let carried = fit.cleared.iter().any(|c| *c.tool_call_id == *id);
                assert!(
                    cut || (carried && is_cleared_placeholder(&result.text())),
                    "call {n}: {id} neither cut nor cleared"
                );
            }
            assert!(
                fit.reason.as_deref().unwrap_or("").contains("cut"),
                "{fit:?}"
            );
        }
    }
    assert!(cleared_any, "the loop passed the trigger");
    // The step's log holds every result whole.
    let whole = logged_results(&log);
    assert_eq!(whole.len(), 10);
    for (page, text) in whole.iter().enumerate() {
        assert!(counter.count_text(text) > 1_000, "page {page}");
        assert!(
            text.contains(&format!("line 299 of page {page}")),
            "page {page}"
        );
    }
}

/// Checks that call `n`'s `record` fits its limit, is valid under each of `rules` and holds a
/// message that `is_task`; returns its fit record.
fn fits_and_keeps_task<'r>(
    n: usize,
    record: &'r RequestRecord,
    rules: &[Rules],
    is_task: impl Fn(&Message) -> bool,
) -> &'r FitRecord {
    let fit = record.fit.as_ref().expect("a fit record");
    assert!(
        fit.tokens_after <= u64::from(fit.limit),
        "call {n}: {fit:?}"
    );
    for &rules in rules {
        assert_eq!(
            validate(&record.messages, rules),
            vec![],
            "{rules} call {n}"
        );
    }
    assert!(
        record.messages.iter().any(is_task),
        "call {n} lost its task"
    );
    fit
}

/// The step's tool results as its log holds them.
fn logged_results(log: &[contexture_core::thread::Event]) -> Vec<String> {
    log.iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepMessage(step) if step.message.role == Role::Tool => {
                Some(step.message.text())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_compaction_trigger_compacts_the_loops_own_older_iterations() {
    // An OpenAI model's requests may hold the task, the notes and the summary as consecutive
    // user turns; an Anthropic model's have them merged.
    for (model, rules) in [
        ("gpt-4o-mini", Rules::OpenAi),
        ("claude-3-5-haiku", Rules::Anthropic),
    ] {
        loop_compaction(model, rules).await;
    }
}

async fn loop_compaction(model: &str, rules: Rules) {
    let (_dir, store) = sqlite().await;
    let provider = script(&calls());
    let exec = executor(store.clone(), provider.clone());
    // No shared history (one step): only the loop itself can be compacted.
    let workflow = WORKFLOW
        .replace("POLICY", "")
        .replace("model: gpt-4o-mini", &format!("model: {model}"))
        .replace(
        "    context:\n",
        "    compaction: {trigger: {window_share: 0.7}, keep: {tokens: 1500}, summary_tokens: 300}\n    context:\n",
    );
    let out = start(&exec, &workflow, "").await.unwrap();
    assert_eq!(out.output, "the sum of ten pages");
    let log = events(&store, "run-1").await;
    let compactions: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepCompacted(compaction) => Some(compaction.clone()),
            _ => None,
        })
        .collect();
    assert!(!compactions.is_empty(), "the trigger fired in the loop");
    let mut covered = 0;
    for compaction in &compactions {
        assert_eq!(compaction.step, 1);
        assert!(
            compaction.covered > covered,
            "each covers more: {compaction:?}"
        );
        covered = compaction.covered;
        assert!(compaction.tokens_after < compaction.tokens_before);
        // The task first, verbatim; then the summary.
        assert_eq!(
            compaction.replacement[0].text(),
            "Read ten pages and sum them up."
        );
        assert!(
            compaction
                .replacement
                .last()
                .unwrap()
                .text()
                .starts_with("Summary of the earlier conversation:"),
            "{compaction:?}"
        );
    }
    let records = requests(&log);
    assert_eq!(records.len(), 11);
    for (n, record) in records.iter().enumerate() {
        fits_and_keeps_task(n, record, &[rules], |m| {
            m.text().contains("Read ten pages and sum them up.")
        });
        // The newest tool use is always there whole.
        if n > 0 {
            let last = record.messages.last().unwrap();
            assert_eq!(last.role, Role::Tool, "call {n}");
            assert!(last.text().contains("line 299 of page"), "call {n}");
        }
    }
    assert!(
        records
            .last()
            .unwrap()
            .messages
            .iter()
            .any(|m| m.text().contains("Summary of the earlier conversation:")),
        "the last call sends the loop's summary"
    );
    // The step's log holds every result whole.
    let whole = logged_results(&log);
    assert_eq!(whole.len(), 10);
    for (page, text) in whole.iter().enumerate() {
        assert!(
            text.contains(&format!("line 299 of page {page}")),
            "page {page}"
        );
    }
}

#[tokio::test]
async fn the_context_manager_tool_compacts_the_loop_and_keeps_its_notes() {
    let (_dir, store) = sqlite().await;
    let mut replies = String::new();
    for page in 0..3 {
        replies.push_str(&format!(
            "- tool_calls: [{{id: call-{page}, name: fetch, arguments: {{page: {page}}}}}]\n"
        ));
    }
    replies.push_str("- tool_calls: [{id: call-cm, name: context_manager, arguments: {notes: 'pages 0-2 hold 900 lines', keep_tokens: 100}}]\n");
    replies.push_str("- tool_calls: [{id: call-3, name: fetch, arguments: {page: 3}}]\n");
    replies.push_str("- content: done\n");
    let provider = script(&replies);
    let exec = executor(store.clone(), provider.clone());
    let workflow = WORKFLOW
        .replace("POLICY", "")
        .replace("    tools: [fetch]", "    tools: [fetch, context_manager]")
        .replace("      window: 4000", "      window: 16000")
        .replace(
            "tools:\n  - id: fetch",
            "tools:\n  - {id: context_manager, tool: context_manager}\n  - id: fetch",
        );
    let out = start(&exec, &workflow, "").await.unwrap();
    assert_eq!(out.output, "done");
    let log = events(&store, "run-1").await;
    let answer = log
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::StepMessage(step)
                if step.message.tool_call_id.as_deref() == Some("call-cm") =>
            {
                Some(step.message.text())
            }
            _ => None,
        })
        .unwrap();
    assert!(
        answer.contains("This step's earlier tool calls and results"),
        "{answer}"
    );
    // The next call: the task, the notes verbatim, the summary, the context manager's own
    // call and result; no page before it.
    let sent = provider.requests();
    let next = &sent[4].messages;
    let texts: Vec<String> = next.iter().map(|m| m.text()).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Read ten pages and sum them up.")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Notes (kept verbatim):\npages 0-2 hold 900 lines")),
        "{texts:?}"
    );
    assert!(
        !texts.iter().any(|t| t.contains("line 299 of page 0")),
        "{texts:?}"
    );
    assert_eq!(validate(next, Rules::OpenAi), vec![]);
    // The log still holds the pages whole.
    assert_eq!(logged_results(&log).len(), 5);
}

#[tokio::test]
async fn bad_loop_policies_are_refused_naming_the_key() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[]"));
    let table = [
        (
            "      clear_tool_results: {trigger_tokens: 0}",
            "assistants[0].context.clear_tool_results.trigger_tokens",
        ),
        (
            "      clear_tool_results: {trigger_tokens: 5000}",
            "is not below the window (4000)",
        ),
        (
            "      truncate_tool_results: {max_tokens: 10}",
            "assistants[0].context.truncate_tool_results.max_tokens",
        ),
        (
            "      truncate_tool_results: {max_tokens: 900, head: 3}",
            "unknown field `head`",
        ),
        (
            "      clear_tool_results: {trigger_tokens: 100, keep: -1}",
            "keep",
        ),
        (
            "      clear_tool_results: {trigger_tokens: 2000, keep: 5}\n      truncate_tool_results: {max_tokens: 900}",
            "assistants[0].context.clear_tool_results.keep: keep (5) results of up to truncate_tool_results.max_tokens (900) each take 4500 tokens, more than the 3500",
        ),
        (
            "      hysteresis: {high: 0.6, low: 0.9}",
            "assistants[0].context.hysteresis.low: low (0.9) must be below high (0.6)",
        ),
        (
            "      hysteresis: {high: 1.5, low: 0.5}",
            "assistants[0].context.hysteresis.high",
        ),
    ];
    for (policy, expected) in table {
        let error = start(&exec, &WORKFLOW.replace("POLICY", policy), "")
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(text.contains(expected), "{policy}: {text}");
        assert!(text.contains("workflow.yaml:"), "{policy}: {text}");
    }
    // A window the system prompt and a task (plain text, so measured before the run) cannot
    // fit in is named too; a templated task is measured when it is rendered.
    let small = WORKFLOW
        .replace("POLICY", "")
        .replace("window: 4000", "window: 510");
    let text = start(&exec, &small, "").await.unwrap_err().to_string();
    assert!(
        text.contains("assistants[0].context.window: window (510) leaves 10 tokens for a request, but the system prompt and the task of state `s` alone take"),
        "{text}"
    );
    let templated = small.replace("task: Read ten pages", "task: Read {{ count }} pages");
    let text = start(&exec, &templated, "").await.unwrap_err().to_string();
    assert!(!text.contains("context.window"), "{text}");
}

/// The forty-call loop under `context` (see [`common::forty_call_workflow`]), and its
/// scripted replies: forty searches, then the answer.
fn forty_calls(context: &str) -> (String, String) {
    let workflow = forty_call_workflow(context);
    let mut script = String::new();
    for call in 0..40 {
        script.push_str(&format!(
            "- tool_calls: [{{id: call-{call}, name: search, arguments: {{q: {call}}}}}]\n"
        ));
    }
    script.push_str("- content: forty searches done\n");
    (workflow, script)
}

/// Runs the forty-call loop under `context`: every request fits, validates for OpenAI and
/// Anthropic, keeps its task and its 3 most recent tool uses; returns the share of calls
/// whose request starts with the whole previous one.
async fn forty_call_loop(context: &str) -> f64 {
    let (workflow, replies) = forty_calls(context);
    let (_dir, store) = sqlite().await;
    let provider = script(&replies);
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, &workflow, "").await.unwrap();
    assert_eq!(out.output, "forty searches done");
    let records = requests(&events(&store, "run-1").await);
    assert_eq!(records.len(), 41);
    let mut stable = 0;
    for (n, record) in records.iter().enumerate() {
        let fit = fits_and_keeps_task(n, record, &[Rules::OpenAi, Rules::Anthropic], |m| {
            m.text() == "Search forty times and report."
        });
        let results: Vec<_> = record
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .collect();
        assert_eq!(results.len(), n);
        for result in results.iter().rev().take(3) {
            assert!(!is_cleared_placeholder(&result.text()), "call {n}");
        }
        match (n, fit.prefix) {
            (0, None) => {}
            (0, Some(prefix)) => panic!("the first call has no previous one: {prefix:?}"),
            (_, Some(prefix)) => stable += usize::from(prefix.stable()),
            (_, None) => panic!("call {n} records no prefix"),
        }
    }
    stable as f64 / 40.0
}

#[tokio::test]
async fn a_forty_call_loop_on_a_16000_window_fits_every_call_and_hysteresis_keeps_prefixes() {
    let clearing =
        "      clear_tool_results: {trigger_tokens: 9000, keep: 3, clear_at_least: 2000}";
    let without = forty_call_loop(clearing).await;
    let with = forty_call_loop(&format!(
        "{clearing}\n      hysteresis: {{high: 0.9, low: 0.6}}"
    ))
    .await;
    eprintln!("stable prefixes: {with:.2} of calls with hysteresis, {without:.2} without");
    assert!(with > without, "{with} with hysteresis, {without} without");
}
