//! Fitting switched off (`context: {enabled: false}`): the history is sent as it is, still
//! repaired and validated for the provider's rules, and a request over the model's window is
//! refused with the reason before anything is sent.

use crate::common;

use std::sync::Arc;

use common::{events, executor, requests, script, sqlite, start};
use contexture_core::fit::{FitPolicy, Rules, validate};
use contexture_core::registry::Registry;
use contexture_core::thread::{EventKind, Projection};
use contexture_core::{Message, ToolCall};
use contexture_engine::fitting::{FitError, FitOverrides, FitSettings};

fn registry() -> Registry {
    common::small_models()
}

fn off() -> FitPolicy {
    FitPolicy {
        enabled: false,
        ..FitPolicy::default()
    }
}

fn projection(messages: Vec<Message>) -> Projection {
    Projection {
        system: Some(Message::system("Be brief.")),
        messages,
        context: "main".to_owned(),
    }
}

/// About 100 tokens per message.
fn history(turns: usize) -> Vec<Message> {
    (0..turns)
        .flat_map(|n| {
            [
                Message::user(format!(
                    "Question {n}: {}",
                    "why is node-7 slow? ".repeat(18)
                )),
                Message::assistant(format!(
                    "Answer {n}: {}",
                    "the disk queue grew. ".repeat(18)
                )),
            ]
        })
        .collect()
}

#[test]
fn a_policy_with_fitting_off_sends_what_trimming_would_cut() {
    let model = registry().get("small-window").unwrap();
    // Half the window: trimming keeps about 550 tokens of the request.
    let half = FitPolicy {
        budget_ratio: 0.5,
        ..FitPolicy::default()
    };
    let messages = history(4);
    let trimmed = FitSettings::new(model.clone(), half.clone(), FitOverrides::default())
        .unwrap()
        .fit(projection(messages.clone()), &[], &[])
        .unwrap();
    assert!(trimmed.messages.len() < messages.len() + 1);
    let whole = FitSettings::new(
        model,
        FitPolicy {
            enabled: false,
            ..half
        },
        FitOverrides::default(),
    )
    .unwrap()
    .fit(projection(messages.clone()), &[], &[])
    .unwrap();
    assert_eq!(whole.messages.len(), messages.len() + 1);
    assert_eq!(&whole.messages[1..], messages.as_slice());
    assert!(whole.fit.dropped.is_empty());
    assert!(
        whole
            .fit
            .reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with("fitting is off")),
        "{:?}",
        whole.fit.reason
    );
}

#[test]
fn with_fitting_off_a_request_over_the_window_is_refused_with_the_reason() {
    let model = registry().get("small-window").unwrap();
    let settings = FitSettings::new(model, off(), FitOverrides::default()).unwrap();
    let error = settings
        .fit(projection(history(8)), &[], &[])
        .expect_err("about 1,600 tokens do not fit 1,300");
    assert!(matches!(
        error,
        FitError::OverWindow {
            limit: 1300,
            window: 1500,
            reserve: 200,
            ..
        }
    ));
    let text = error.to_string();
    assert!(
        text.starts_with("fitting is off (`context.enabled: false`) and the request needs")
            && text.contains("it was not sent"),
        "{text}"
    );
}

#[test]
fn with_fitting_off_the_request_is_still_repaired_for_the_providers_rules() {
    let model = registry().get("claude-sonnet-4-5").unwrap();
    let settings = FitSettings::new(model, off(), FitOverrides::default()).unwrap();
    let messages = vec![
        // An orphan result (its call was never recorded), then two user turns in a row.
        Message::tool_result("lost", "42"),
        Message::user("First."),
        Message::user("Second."),
        Message::assistant_tool_calls(vec![ToolCall::new("c1", "lookup", "{}")]),
    ];
    let fitted = settings.fit(projection(messages), &[], &[]).unwrap();
    assert_eq!(validate(&fitted.messages, Rules::Anthropic), vec![]);
    let texts: Vec<String> = fitted.messages.iter().map(Message::text).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("First.") && t.contains("Second.")),
        "{texts:?}"
    );
    assert!(!texts.iter().any(|t| t == "42"), "{texts:?}");
}

#[test]
fn settings_that_cannot_apply_with_fitting_off_are_named() {
    let policy: FitPolicy =
        yaml_serde::from_str("enabled: false\nclear_tool_results: {trigger_tokens: 9000, keep: 2}")
            .unwrap();
    assert_eq!(
        policy.problems(),
        [(
            "clear_tool_results".to_owned(),
            "clear_tool_results has no effect with `enabled: false` (fitting is off): remove one of them".to_owned()
        )]
    );
    // Off is written out; on, the default, is not.
    assert_eq!(
        serde_json::to_value(off()).unwrap()["enabled"],
        serde_json::json!(false)
    );
    assert!(
        serde_json::to_value(FitPolicy::default())
            .unwrap()
            .get("enabled")
            .is_none()
    );
}

fn steps(context: &str, count: usize) -> String {
    let mut text = format!(
        "assistants:\n  - id: a\n    model: small-window\n    context: {context}\nstates:\n"
    );
    for n in 0..count {
        let next = if n + 1 == count {
            "{end: true}".to_owned()
        } else {
            format!("{{state_id: s{}}}", n + 1)
        };
        text += &format!("  - {{id: s{n}, assistant_id: a, task: 'Part {n}', next: {next}}}\n");
    }
    text
}

/// The scripted replies of `count` steps: each answer is cut to the reply's reserve (200
/// tokens) as the model's would be.
fn long_answers(count: usize) -> String {
    (0..count)
        .map(|n| {
            format!(
                "- content: 'Answer {n}: {}'\n",
                "the disk queue grew. ".repeat(60)
            )
        })
        .collect()
}

#[tokio::test]
async fn in_a_run_an_assistant_with_fitting_off_sees_the_whole_history_or_fails_before_sending() {
    // Five steps: half the window (550 tokens for the request) trims the last step's
    // history of four 200-token answers; fitting off sends all of it.
    for (context, dropped) in [
        ("{budget_ratio: 0.5}", true),
        ("{budget_ratio: 0.5, enabled: false}", false),
    ] {
        let (_dir, store) = sqlite().await;
        let provider = script(&long_answers(5));
        let exec = executor(store.clone(), provider.clone()).with_registry(Arc::new(registry()));
        start(&exec, &steps(context, 5), "Go").await.unwrap();
        let last = provider.requests().pop().unwrap();
        let texts: Vec<String> = last.messages.iter().map(Message::text).collect();
        assert_eq!(
            !texts.iter().any(|t| t.starts_with("Answer 0")),
            dropped,
            "{context}: {texts:?}"
        );
        assert_eq!(validate(&last.messages, Rules::OpenAi), vec![]);
    }
    // Eight steps: seven answers pass the 1,300 tokens the window leaves the request.
    let (_dir, store) = sqlite().await;
    let provider = script(&long_answers(8));
    let exec = executor(store.clone(), provider.clone()).with_registry(Arc::new(registry()));
    let error = start(&exec, &steps("{enabled: false}", 8), "Go")
        .await
        .expect_err("the last request does not fit");
    assert!(error.to_string().contains("fitting is off"), "{error}");
    let sent = provider.requests().len();
    let log = events(&store, "run-1").await;
    assert_eq!(
        requests(&log).len(),
        sent,
        "nothing was sent for the failed step"
    );
    assert!(sent < 8);
    assert!(
        log.iter()
            .any(|event| matches!(&event.kind, EventKind::StepFailed(failure) if failure.error.contains("fitting is off")))
    );
}
