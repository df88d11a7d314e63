//! The executor with the scripted provider: what each transition flag does to the shared
//! history later requests see and to the context store.

use crate::common;

use common::{events, executor, kinds, requests, script, sqlite, start, texts};
use contexture_core::thread::EventKind;
use contexture_store::Store;
use serde_json::json;

const TWO_STEPS: &str = r#"
assistants:
  - id: a
    model: gpt-4o-mini
states:
  - id: first
    assistant_id: a
    task: 'First task for {{user}}'
    next:
      state_id: second
      FLAGS
  - id: second
    assistant_id: a
    task: Second task
    next: {state_id: end}
"#;

fn two_steps(flags: &str) -> String {
    TWO_STEPS.replace("FLAGS", flags)
}

#[tokio::test]
async fn include_in_llm_history_false_hides_the_exchange_but_stores_it() {
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: '{\"secret\": \"s3\"}'}, {content: done}]");
    let exec = executor(store.clone(), provider.clone());
    let out = start(
        &exec,
        &two_steps("include_in_llm_history: false"),
        r#"{"user": "ann"}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.output, "done");
    assert_eq!(out.store.get("secret"), Some(&json!("s3")));
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[1].messages),
        [r#"{"user": "ann"}"#, "Second task"],
        "the second request sees the input, not the first step's task or output"
    );
    // The output is still in the log, in the step's end and the request's reply.
    let log = events(&store, "run-1").await;
    assert!(log.iter().any(|e| matches!(&e.kind,
        EventKind::StepFinished(end) if end.output.contains("s3"))));
}

#[tokio::test]
async fn clear_prior_messages_gives_the_next_state_a_clean_slate() {
    let (_dir, store) = sqlite().await;
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: a, task: Task one, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Task two, next: {state_id: three, clear_prior_messages: true}}
  - {id: three, assistant_id: a, task: Task three, next: {state_id: end}}
"#;
    let provider = script("[{content: out one}, {content: out two}, {content: out three}]");
    let exec = executor(store, provider.clone());
    start(&exec, workflow, "hello").await.unwrap();
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[1].messages),
        ["hello", "Task one", "out one", "Task two"]
    );
    assert_eq!(
        texts(&sent[2].messages),
        ["Task three"],
        "nothing before state three, the clearing step's exchange included"
    );

    // The page's pattern 5: the clearing step's output reaches the next state through the
    // store, and only there.
    let (_dir, store) = sqlite().await;
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini, system_prompt: You write.}]
states:
  - {id: research, assistant_id: a, task: Research, next: {state_id: write, output_key: summary, clear_context_store: keep_current, clear_prior_messages: true}}
  - {id: write, assistant_id: a, task: 'Write from {{ summary }}', next: {state_id: end}}
"#;
    let provider = script("[{content: the findings}, {content: the article}]");
    let exec = executor(store, provider.clone());
    start(&exec, workflow, "a topic").await.unwrap();
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[1].messages),
        ["You write.", "Write from the findings"]
    );
}

#[tokio::test]
async fn clear_context_store_keep_current_and_true() {
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: '{\"summary\": \"S\", \"n\": 2}'}, {content: 'ok'}]");
    let exec = executor(store.clone(), provider);
    let out = start(
        &exec,
        &two_steps("clear_context_store: keep_current"),
        r#"{"user": "ann", "old": 1}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&out.store).unwrap(),
        json!({"summary": "S", "n": 2})
    );

    let (_dir2, store2) = sqlite().await;
    let provider = script("[{content: '{\"summary\": \"S\"}'}, {content: '{\"late\": 1}'}]");
    let exec = executor(store2.clone(), provider.clone());
    let out = start(
        &exec,
        &two_steps("clear_context_store: true"),
        r#"{"user": "ann"}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&out.store).unwrap(),
        json!({"late": 1}),
        "the clear empties the store, this step's output included; later steps store again"
    );
    // The replayed thread agrees with the executor's view.
    let thread = store2.load("run-1").await.unwrap();
    assert_eq!(thread.store(), out.store.as_map());
}

#[tokio::test]
async fn output_key_stores_text_and_reset_keys_remove() {
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: 'A paragraph.'}, {content: 'ok'}]");
    let exec = executor(store, provider.clone());
    let out = start(
        &exec,
        &two_steps("output_key: paragraph\n      reset_keys_in_context_store: [user]"),
        r#"{"user": "ann", "keep": true}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&out.store).unwrap(),
        json!({"keep": true, "paragraph": "A paragraph."})
    );
}

#[tokio::test]
async fn tool_calls_stay_in_the_step_log_and_only_the_answer_is_shared() {
    let (_dir, store) = sqlite().await;
    let workflow = r#"
assistants:
  - id: researcher
    model: gpt-4o-mini
    tools: [lookup]
  - id: writer
    model: gpt-4o-mini
tools:
  - id: lookup
    description: Look a word up.
    response: 'definition of {{ arguments.word }}'
states:
  - {id: research, assistant_id: researcher, task: Define x, next: {state_id: write}}
  - {id: write, assistant_id: writer, task: Write it up, next: {state_id: end}}
"#;
    let provider = script(
        r#"
- tool_calls: [{id: c1, name: lookup, arguments: {word: x}}]
- content: x means y
- content: final text
"#,
    );
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, workflow, "go").await.unwrap();
    assert_eq!(out.output, "final text");
    let sent = provider.requests();
    // Within the step, the model sees its call and the result.
    assert_eq!(sent[1].messages.len(), 4);
    assert_eq!(sent[1].messages[3].text(), "definition of x");
    // The next step sees only the exchange: task and final answer.
    assert_eq!(
        texts(&sent[2].messages),
        ["go", "Define x", "x means y", "Write it up"]
    );
    assert!(sent[2].messages.iter().all(|m| m.tool_calls.is_empty()));
    let log = events(&store, "run-1").await;
    let step_messages: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::StepMessage(m) => Some((m.step, m.message.role.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(step_messages, [(1, "assistant"), (1, "tool")]);
    let thread = store.load("run-1").await.unwrap();
    assert_eq!(
        texts(&thread.projection().messages),
        ["go", "Define x", "x means y", "Write it up", "final text"]
    );
}

#[tokio::test]
async fn conditions_and_switches_choose_the_next_state() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - id: classify
    assistant_id: a
    task: Classify
    next:
      switch:
        cases:
          - {condition: "kind == 'bug'", target: bug}
          - {condition: "output.score > 5", target: high}
        default: other
  - id: bug
    assistant_id: a
    task: Bug
    next:
      condition: {expression: "severity == 'high'", then: page, otherwise: end}
  - {id: high, assistant_id: a, task: High, next: {end: true}}
  - {id: other, assistant_id: a, task: Other, next: {end: true}}
  - {id: page, assistant_id: a, task: Page, next: {end: true}}
"#;
    let table = [
        (
            r#"[{content: '{"kind": "bug"}'}, {content: '{"severity": "high"}'}, {content: paged}]"#,
            vec!["classify", "bug", "page"],
        ),
        (
            r#"[{content: '{"kind": "bug"}'}, {content: '{"severity": "low"}'}]"#,
            vec!["classify", "bug"],
        ),
        (
            r#"[{content: '{"kind": "feature", "score": 9}'}, {content: h}]"#,
            vec!["classify", "high"],
        ),
        (
            r#"[{content: 'no idea'}, {content: o}]"#,
            vec!["classify", "other"],
        ),
    ];
    for (replies, path) in table {
        let (_dir, store) = sqlite().await;
        let exec = executor(store.clone(), script(replies));
        start(&exec, workflow, "").await.unwrap();
        let states: Vec<String> = events(&store, "run-1")
            .await
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::StepStarted(s) => Some(s.state_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(states, path, "{replies}");
    }
}

#[tokio::test]
async fn a_switch_with_no_match_and_no_default_fails_the_run_clearly() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - id: classify
    assistant_id: a
    next:
      switch:
        cases: [{condition: "kind == 'bug'", target: end}]
"#;
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[{content: '{\"kind\": \"x\"}'}]"));
    let error = start(&exec, workflow, "").await.unwrap_err();
    assert!(
        error.to_string().contains("no switch case matched"),
        "{error}"
    );
    let log = events(&store, "run-1").await;
    assert_eq!(
        &kinds(&log)[kinds(&log).len() - 2..],
        ["step_failed", "run_ended"]
    );
}

#[tokio::test]
async fn iteration_runs_each_item_in_its_own_context_and_folds_the_outputs() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - id: plan
    assistant_id: a
    task: Plan
    next: {state_id: each, iter_key: /files}
  - id: each
    assistant_id: a
    task: 'Review {{name}} ({{item_index}}) after {{ done | default("nothing") }}'
    next:
      state_id: report
      output_key: reviews
      append_to_context: true
  - id: report
    assistant_id: a
    task: 'Report on {{ reviews | length }} reviews'
    next: {state_id: end}
"#;
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- content: '{"files": [{"name": "a.rs"}, {"name": "b.rs"}, {"name": "c.rs"}], "done": "planning"}'
- content: '{"ok": 1}'
- content: '{"ok": 2}'
- content: '{"ok": 3}'
- content: reported
"#,
    );
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, workflow, "").await.unwrap();
    assert_eq!(out.output, "reported");
    assert_eq!(
        out.store.get("reviews"),
        Some(&json!([{"ok": 1}, {"ok": 2}, {"ok": 3}]))
    );
    let sent = provider.requests();
    // Each item sees the history as it was when the iteration began, not its siblings.
    for (n, name) in ["a.rs", "b.rs", "c.rs"].iter().enumerate() {
        let request = &sent[1 + n];
        assert_eq!(
            request.messages.last().unwrap().text(),
            format!("Review {name} ({n}) after planning")
        );
        assert_eq!(request.messages.len(), 3, "item {n}: plan exchange + task");
    }
    // Afterwards the shared history holds every item's exchange, in order.
    assert_eq!(
        texts(&sent[4].messages)[2..],
        [
            "Review a.rs (0) after planning",
            r#"{"ok": 1}"#,
            "Review b.rs (1) after planning",
            r#"{"ok": 2}"#,
            "Review c.rs (2) after planning",
            r#"{"ok": 3}"#,
            "Report on 3 reviews"
        ]
    );
    // The items' own keys (`name`) did not leak into the shared store.
    assert!(out.store.get("name").is_none());
}

#[tokio::test]
async fn iterating_over_an_empty_list_goes_straight_on() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: each, assistant_id: a, task: 'Do {{item}}', next: {state_id: after}}
  - {id: after, assistant_id: a, task: After, next: {end: true}}
"#
    .replace(
        "states:\n",
        "states:\n  - {id: start, transform: {n: 0}, next: {state_id: each, iter_key: files}}\n",
    );
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: after}]");
    let exec = executor(store.clone(), provider.clone());
    let out = start(&exec, &workflow, r#"{"files": []}"#).await.unwrap();
    assert_eq!(out.output, "after");
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn scalar_items_without_a_task_are_the_user_turn() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: start, transform: {n: 1}, next: {state_id: each, iter_key: words, include_in_llm_history: false}}
  - {id: each, assistant_id: a, next: {end: true, output_key: defs, append_to_context: true}}
"#;
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: A}, {content: B}]");
    let exec = executor(store, provider.clone());
    let out = start(&exec, workflow, r#"{"words": ["alpha", "beta"]}"#)
        .await
        .unwrap();
    let sent = provider.requests();
    assert_eq!(sent[0].messages.last().unwrap().text(), "alpha");
    assert_eq!(sent[1].messages.last().unwrap().text(), "beta");
    assert_eq!(out.store.get("defs"), Some(&json!(["A", "B"])));
    assert_eq!(out.output, r#"["A","B"]"#);
}

#[tokio::test]
async fn the_recorded_requests_are_what_the_provider_received() {
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: one}, {content: two}]");
    let exec = executor(store.clone(), provider.clone());
    start(&exec, &two_steps("output_key: x"), r#"{"user": "u"}"#)
        .await
        .unwrap();
    let recorded = requests(&events(&store, "run-1").await);
    let received = provider.requests();
    assert_eq!(recorded.len(), received.len());
    for (record, request) in recorded.iter().zip(&received) {
        assert_eq!(record.messages, request.messages);
        let breakdown = record.breakdown.as_ref().unwrap();
        assert!(breakdown.fits());
        assert_eq!(request.max_tokens, Some(breakdown.limits.reserve_output));
    }
}

#[tokio::test]
async fn iter_merge_says_how_the_items_outputs_come_together() {
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: start, transform: {n: 1}, next: {state_id: each, iter_key: items, include_in_llm_history: false, MERGE}}
  - {id: each, assistant_id: a, task: 'Item {{item}}', next: {end: true}}
"#;
    let replies =
        "[{content: '{\"score\": 1, \"same\": 0}'}, {content: '{\"score\": 2, \"same\": 0}'}]";
    let table = [
        ("iter_merge: last_wins", Ok(json!({"score": 2, "same": 0}))),
        (
            "iter_merge: append",
            Ok(json!({"score": [1, 2], "same": [0, 0]})),
        ),
        (
            "iter_merge: error",
            Err("items 0 and 1 both wrote key \"score\" with different values"),
        ),
    ];
    for (merge, expected) in table {
        let (_dir, store) = sqlite().await;
        let exec = executor(store, script(replies));
        let result = start(
            &exec,
            &workflow.replace("MERGE", merge),
            r#"{"items": ["a", "b"]}"#,
        )
        .await;
        match (result, expected) {
            (Ok(out), Ok(expected)) => {
                let mut context = out.store.into_map();
                context.shift_remove("items");
                context.shift_remove("n");
                assert_eq!(serde_json::Value::Object(context), expected, "{merge}");
            }
            (Err(error), Err(expected)) => {
                assert!(error.to_string().contains(expected), "{merge}: {error}")
            }
            (other, _) => panic!("{merge}: {other:?}"),
        }
    }
}

/// `include_in_iterator_context` lists the only context keys each item's run sees (with the
/// item's own keys and `item`/`item_index`): a key not listed renders as missing in the
/// item's task, and the items' writes still come back; the list is recorded with the step, so
/// a resumed iteration filters the same way. Without it, every key is seen.
#[tokio::test]
async fn include_in_iterator_context_says_which_keys_each_item_sees() {
    let workflow = |include: &str| {
        format!(
            r#"
assistants: [{{id: a, model: gpt-4o-mini}}]
states:
  - id: plan
    assistant_id: a
    task: Plan
    next: {{state_id: each, iter_key: /files{include}}}
  - id: each
    assistant_id: a
    task: 'Review {{{{name}}}} for {{{{ audience }}}} ({{{{ secret }}}})'
    next: {{state_id: end, output_key: review}}
"#
        )
    };
    let replies = r#"
- content: '{"files": [{"name": "a.rs"}, {"name": "b.rs"}], "audience": "reviewers", "secret": "s3cr3t"}'
- content: first
- content: second
"#;
    for (include, tasks) in [
        (
            ", include_in_iterator_context: [audience]",
            [
                "Review a.rs for reviewers ({{ secret }})",
                "Review b.rs for reviewers ({{ secret }})",
            ],
        ),
        (
            "",
            [
                "Review a.rs for reviewers (s3cr3t)",
                "Review b.rs for reviewers (s3cr3t)",
            ],
        ),
    ] {
        let (_dir, store) = sqlite().await;
        let provider = script(replies);
        let exec = executor(store.clone(), provider.clone());
        let out = start(&exec, &workflow(include), "").await.unwrap();
        let sent = provider.requests();
        for (n, task) in tasks.iter().enumerate() {
            assert_eq!(
                sent[1 + n].messages.last().unwrap().text(),
                *task,
                "{include}"
            );
        }
        // What the items wrote came back to the shared store, and nothing was lost from it.
        assert_eq!(out.store.get("review"), Some(&json!("second")), "{include}");
        assert_eq!(out.store.get("secret"), Some(&json!("s3cr3t")), "{include}");
    }
    // Validation: the list needs an iteration, and names keys.
    let bad = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - id: plan
    assistant_id: a
    task: Plan
    next: {state_id: each, include_in_iterator_context: [audience, ' ']}
  - {id: each, assistant_id: a, task: Go, next: {state_id: end}}
"#;
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[]"));
    let error = start(&exec, bad, "").await.unwrap_err().to_string();
    assert!(
        error.contains(
            "states[0].next.include_in_iterator_context: include_in_iterator_context needs iter_key"
        ),
        "{error}"
    );
    assert!(
        error
            .contains("states[0].next.include_in_iterator_context[1]: a context key name is empty"),
        "{error}"
    );
}

/// A system prompt and a task written as prompt templates in the simple syntax: literal
/// braces stay, partials fill in (a dynamic one rendered at the step), context keys win.
#[tokio::test]
async fn prompt_templates_in_the_simple_syntax_render_with_their_partials() {
    let workflow = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/workflows/ok_prompt_templates.yaml"
    ))
    .unwrap();
    let (_dir, store) = sqlite().await;
    let provider = script("- content: '{\"poem\": \"waves\"}'\n- content: signed\n");
    let exec = executor(store, provider.clone());
    let out = start(&exec, &workflow, r#"{"topic": "the sea"}"#)
        .await
        .unwrap();
    assert_eq!(out.output, "signed");
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[0].messages),
        [
            r#"You write haikus. Answer as JSON: {"poem": "..."}"#,
            r#"{"topic": "the sea"}"#,
            "A poem about the sea, dated 2026-01-01"
        ]
    );
    assert_eq!(
        sent[1].messages.last().unwrap().text(),
        "Sign it for the sea"
    );
    // A context key of the partial's name wins over it.
    let (_dir, store) = sqlite().await;
    let provider = script("- content: a\n- content: b\n");
    let exec = executor(store, provider.clone());
    start(
        &exec,
        &workflow,
        r#"{"topic": "rain", "style": "limerick"}"#,
    )
    .await
    .unwrap();
    assert!(
        provider.requests()[0].messages[0]
            .text()
            .starts_with("You write limericks.")
    );
}

/// `thread_context` runs a state in a named context of the execution's thread: a clear made
/// there empties that context only, so a later state in `main` still sees the whole history
/// while a later state in the named context starts from the clear; each switch is recorded
/// once, with the step's start. A name that cannot be one is refused with its key.
#[tokio::test]
async fn a_state_runs_in_its_named_context_and_a_clear_there_leaves_main_whole() {
    let (_dir, store) = sqlite().await;
    let workflow = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: a, task: Task one, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Task two, thread_context: scratch, next: {state_id: three, clear_prior_messages: true}}
  - {id: three, assistant_id: a, task: Task three, next: {state_id: four}}
  - {id: four, assistant_id: a, task: Task four, thread_context: scratch, next: {state_id: end}}
"#;
    let provider = script(
        "[{content: out one}, {content: out two}, {content: out three}, {content: out four}]",
    );
    let exec = executor(store.clone(), provider.clone());
    start(&exec, workflow, "hello").await.unwrap();
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[1].messages),
        ["hello", "Task one", "out one", "Task two"],
        "a new context shows the whole history"
    );
    assert_eq!(
        texts(&sent[2].messages),
        ["hello", "Task one", "out one", "Task three"],
        "main was not cleared (a clearing step's own exchange never joins the history)"
    );
    assert_eq!(
        texts(&sent[3].messages),
        ["Task three", "out three", "Task four"],
        "scratch starts from its clear: what was added since is seen"
    );
    let log = events(&store, "run-1").await;
    let switches: Vec<(String, Option<String>)> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ContextSwitched { context, op_id } => Some((context.clone(), op_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        switches,
        [
            (
                "scratch".to_owned(),
                Some("run-1/step-2/context".to_owned())
            ),
            ("main".to_owned(), Some("run-1/step-3/context".to_owned())),
            (
                "scratch".to_owned(),
                Some("run-1/step-4/context".to_owned())
            ),
        ]
    );

    let bad =
        "states:\n  - {id: s, transform: {a: 1}, thread_context: '', next: {state_id: end}}\n";
    let error = start(&exec, bad, "").await.expect_err("refused");
    assert!(
        error.to_string().contains(
            "states[0].thread_context: thread_context \"\" cannot name a context: it is empty"
        ),
        "{error}"
    );
}
