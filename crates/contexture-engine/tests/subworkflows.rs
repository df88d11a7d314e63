//! Sub-workflows, cancellation and usage roll-up: a child sees only what its
//! parent scoped for it, runs as its own execution, returns structured data; cancelling a
//! parent stops its running descendants with valid histories; subtree usage adds up.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{events, executor, library, script, sqlite, start, texts};
use contexture_core::fit::{Rules, validate};
use contexture_core::thread::{EventKind, RunStatus, Usage};
use contexture_core::{Message, Role};
use contexture_engine::executor::{ExecError, Executor, RunRequest};
use contexture_engine::report::{ExecutionStatus, usage_tree};
use contexture_llm::ScriptedProvider;
use contexture_store::{SqliteStore, Store};

const PARENT: &str = r#"
assistants: [{id: a, model: gpt-4o-mini}]
workflows:
  - {id: researcher, path: research.yaml}
states:
  - id: brief
    assistant_id: a
    task: 'Brief on {{topic}}'
    next: {state_id: research}
  - id: research
    workflow: researcher
    input:
      mapping: {subject: topic, depth: settings.depth}
    result: context
    next: {state_id: review, output_key: research}
  - id: review
    workflow: review.yaml
    history_summary: true
    next: {state_id: final}
  - id: final
    assistant_id: a
    task: 'Conclude from {{ research.finding }}'
    next: {end: true}
"#;

const RESEARCH: &str = r#"
assistants: [{id: r, model: gpt-4o-mini}]
states:
  - id: dig
    assistant_id: r
    task: 'Research {{subject}} at depth {{depth}}; the parent secret is {{secret}}'
    next: {end: true}
"#;

const REVIEW: &str = r#"
assistants: [{id: v, model: gpt-4o-mini}]
states:
  - {id: check, assistant_id: v, task: Review it, next: {end: true}}
"#;

#[tokio::test]
async fn children_see_only_what_is_scoped_and_return_structured_data() {
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- content: the brief
- content: '{"finding": "Rust is memory safe", "confidence": 0.9}'
- content: looks right
- content: concluded
"#,
    );
    let exec = executor(store.clone(), provider.clone()).with_workflow_source(library(&[
        ("research.yaml", RESEARCH),
        ("review.yaml", REVIEW),
    ]));
    let out = start(
        &exec,
        PARENT,
        r#"{"topic": "rust", "secret": "s3cr3t", "settings": {"depth": 2}}"#,
    )
    .await
    .unwrap();
    assert_eq!(out.output, "concluded");
    let sent = provider.requests();
    // The research child: fresh messages, only its mapped input.
    assert_eq!(
        texts(&sent[1].messages),
        [
            r#"{"depth":2,"subject":"rust"}"#,
            "Research rust at depth 2; the parent secret is {{secret}}"
        ]
    );
    assert!(!format!("{:?}", sent[1]).contains("s3cr3t"));
    // The review child gets the parent's last message (nothing else).
    assert_eq!(texts(&sent[2].messages)[0], "the brief");
    assert_eq!(sent[2].messages.len(), 2);
    // The child's result is structured data in the parent's context.
    assert_eq!(
        out.store.get("research").unwrap()["finding"],
        "Rust is memory safe"
    );
    // The final request sees one summary message for the review, none for the research.
    let last = texts(&sent[3].messages);
    assert!(last.iter().any(
        |t| t.starts_with("Sub-workflow `review.yaml`") && t.ends_with("returned: looks right")
    ));
    assert!(
        !last
            .iter()
            .any(|t| t.contains("Rust is memory safe") && t.starts_with("Sub"))
    );
    assert_eq!(last.last().unwrap(), "Conclude from Rust is memory safe");
    // Children are executions of their own, under the parent.
    let child = exec.load("run-1~research.1").await.unwrap();
    assert_eq!(
        child.start().unwrap().parent_execution_id.as_deref(),
        Some("run-1")
    );
    assert!(child.store().get("secret").is_none());
    let parent = exec.load("run-1").await.unwrap();
    assert_eq!(parent.children(), ["run-1~research.1", "run-1~review.1"]);
}

#[tokio::test]
async fn an_unmapped_path_and_an_unknown_source_state_are_clear_errors() {
    let (_dir, store) = sqlite().await;
    let exec =
        executor(store.clone(), script("[{content: brief}]")).with_workflow_source(library(&[
            ("research.yaml", RESEARCH),
            ("review.yaml", REVIEW),
        ]));
    let error = start(&exec, PARENT, r#"{"topic": "rust"}"#)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "execution `run-1`, step 2 (`research`): the sub-workflow's input: `depth` maps `settings.depth`, which is not in the context (its keys: topic)"
    );
    // An input state that does not exist is caught before the run.
    let broken = PARENT.replace(
        "mapping: {subject: topic, depth: settings.depth}",
        "state: nowhere",
    );
    let error = start(&exec, &broken, "{}").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("states[1].input.state: unknown state `nowhere`"),
        "{error}"
    );
}

/// Sums the usage of every call recorded in an execution's own log.
async fn calls_usage(store: &SqliteStore, id: &str) -> Usage {
    events(store, id)
        .await
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RequestEnded(end) => Some(end.usage),
            _ => None,
        })
        .fold(Usage::default(), Usage::plus)
}

#[tokio::test]
async fn subtree_usage_is_the_sum_of_its_calls_each_counted_once() {
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- {content: the brief, usage: {prompt_tokens: 100, completion_tokens: 10}}
- {content: '{"finding": "x"}', usage: {prompt_tokens: 200, completion_tokens: 20}}
- {content: ok, usage: {prompt_tokens: 300, completion_tokens: 30}}
- {content: done, usage: {prompt_tokens: 400, completion_tokens: 40}}
"#,
    );
    let exec = executor(store.clone(), provider).with_workflow_source(library(&[
        ("research.yaml", RESEARCH),
        ("review.yaml", REVIEW),
    ]));
    let out = start(&exec, PARENT, r#"{"topic": "t", "settings": {"depth": 1}}"#)
        .await
        .unwrap();
    assert_eq!(out.usage, Usage::new(500, 50), "the parent's own calls");
    let tree = usage_tree(&store, "run-1", 1 << 20).await.unwrap();
    assert_eq!(tree.own, Usage::new(500, 50));
    assert_eq!(tree.total, Usage::new(1000, 100));
    let mut sum = Usage::default();
    for id in ["run-1", "run-1~research.1", "run-1~review.1"] {
        sum = sum.plus(calls_usage(&store, id).await);
    }
    assert_eq!(tree.total, sum);
    assert_eq!(tree.children.len(), 2);
    assert_eq!(tree.children[0].own, Usage::new(200, 20));
    assert_eq!(tree.children[0].total, tree.children[0].own);
    let known = |cost: Option<f64>| cost.expect("every model here has a price");
    let children: f64 = tree.children.iter().map(|c| known(c.total_cost_usd)).sum();
    assert!((known(tree.total_cost_usd) - (known(tree.own_cost_usd) + children)).abs() < 1e-12);
}

/// A child of two calls.
const TWO_STEP_CHILD: &str = r#"
assistants: [{id: r, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: r, task: Child one, next: {state_id: two}}
  - {id: two, assistant_id: r, task: Child two, next: {end: true}}
"#;

/// A parent that runs `child.yaml`, then calls once.
const CHILD_THEN_CALL: &str = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: sub, workflow: child.yaml, next: {state_id: after}}
  - {id: after, assistant_id: a, task: After, next: {end: true}}
"#;

#[tokio::test]
async fn a_resumed_parent_resumes_its_child_without_rerunning_finished_steps() {
    let (_dir, store) = sqlite().await;
    let source = library(&[("child.yaml", TWO_STEP_CHILD)]);
    let exec = executor(
        store.clone(),
        script("[{content: c1}, {error: {status: 500}}]"),
    )
    .with_workflow_source(source.clone());
    let error = start(&exec, CHILD_THEN_CALL, "go").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("sub-workflow `child.yaml` (execution `run-1~sub.1`)"),
        "{error}"
    );
    let provider = script("[{content: c2}, {content: finished}]");
    let exec = executor(store.clone(), provider.clone()).with_workflow_source(source);
    let out = exec.resume("run-1").await.unwrap();
    assert_eq!(out.output, "finished");
    let sent: Vec<String> = provider
        .requests()
        .iter()
        .map(|r| r.messages.last().unwrap().text())
        .collect();
    assert_eq!(
        sent,
        ["Child two", "After"],
        "the child's first step did not run again"
    );
    assert_eq!(
        exec.load("run-1").await.unwrap().children(),
        ["run-1~sub.1"]
    );
}

/// A parent an earlier release interrupted, its child named `PARENT/STATE.VISIT`, resumes
/// that child rather than starting another under the new name.
#[tokio::test]
async fn a_child_an_earlier_release_named_is_resumed_under_its_name() {
    let (_dir, store) = sqlite().await;
    let source = library(&[("child.yaml", TWO_STEP_CHILD)]);
    let exec = executor(
        store.clone(),
        script("[{content: c1}, {error: {status: 500}}]"),
    )
    .with_workflow_source(source.clone());
    start(&exec, CHILD_THEN_CALL, "go").await.unwrap_err();
    // The same logs as an earlier release wrote them: the parent `old` and its child
    // `old/sub.1`.
    for (id, old) in [("run-1", "old"), ("run-1~sub.1", "old/sub.1")] {
        let mut kinds = Vec::new();
        for event in events(&store, id).await {
            let text = serde_json::to_string(&event.kind)
                .unwrap()
                .replace("run-1~sub.1", "old/sub.1")
                .replace("run-1", "old");
            kinds.push(contexture_store::NewEvent::new(
                serde_json::from_str(&text).unwrap(),
            ));
        }
        store.append(old, kinds).await.unwrap();
    }
    let provider = script("[{content: c2}, {content: finished}]");
    let exec = executor(store.clone(), provider.clone()).with_workflow_source(source);
    let out = exec.resume("old").await.unwrap();
    assert_eq!(out.output, "finished");
    let sent: Vec<String> = provider
        .requests()
        .iter()
        .map(|r| r.messages.last().unwrap().text())
        .collect();
    assert_eq!(
        sent,
        ["Child two", "After"],
        "the child's first step ran again"
    );
    assert_eq!(exec.load("old").await.unwrap().children(), ["old/sub.1"]);
    assert!(!store.exists("old~sub.1").await.unwrap());
}

const CASCADE_PARENT: &str = r#"
states:
  - {id: sub, workflow: child.yaml, next: {end: true}}
"#;

const CASCADE_CHILD: &str = r#"
states:
  - {id: deeper, workflow: grandchild.yaml, next: {end: true}}
"#;

const CASCADE_GRANDCHILD: &str = r#"
assistants: [{id: g, model: gpt-4o-mini, tools: [slow, quick]}]
tools:
  - {id: slow, command: [sleep, '30']}
  - {id: quick, response: quick result}
states:
  - {id: work, assistant_id: g, task: Work, next: {end: true}}
"#;

#[tokio::test]
async fn cancelling_a_parent_stops_its_running_child_and_grandchild_with_valid_histories() {
    let (_dir, store) = sqlite().await;
    // The grandchild's model calls a quick tool and a slow one; the slow one is running when
    // the parent is cancelled.
    let provider = Arc::new(
        ScriptedProvider::from_yaml(
            "[{tool_calls: [{id: q1, name: quick}, {id: s1, name: slow}]}, {content: never}]",
            "script.yaml",
        )
        .unwrap(),
    );
    let exec = Arc::new(
        executor(store.clone(), provider)
            .with_workflow_source(library(&[
                ("child.yaml", CASCADE_CHILD),
                ("grandchild.yaml", CASCADE_GRANDCHILD),
            ]))
            .with_cancel_poll(Duration::from_millis(20)),
    );
    let running = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.start(RunRequest {
                execution_id: Some("parent".into()),
                ..RunRequest::new("parent.yaml", CASCADE_PARENT, "go")
            })
            .await
        })
    };
    let grandchild = "parent~sub.1~deeper.1";
    // Wait until the slow tool is running: the quick one's result is in the step's log.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let results = match store.events(grandchild).await {
            Ok(events) => events
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::StepMessage(m) if m.message.role == Role::Tool))
                .count(),
            Err(_) => 0,
        };
        if results == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the grandchild never got busy"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let marked = exec
        .cancel("parent", Some("the user gave up".into()))
        .await
        .unwrap();
    assert_eq!(marked, ["parent", "parent~sub.1", grandchild]);
    let error = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the cancellation stops the run promptly")
        .unwrap()
        .unwrap_err();
    assert!(error.is_cancelled(), "{error}");
    assert!(error.to_string().contains("the user gave up"), "{error}");

    for id in ["parent", "parent~sub.1", grandchild] {
        let log = exec.load(id).await.unwrap();
        assert_eq!(
            log.end().map(|e| e.status),
            Some(RunStatus::Cancelled),
            "{id}"
        );
        assert!(log.cancel_requested().is_some(), "{id}");
        assert!(log.thread().in_flight().is_none(), "{id}");
        assert!(
            validate(&log.thread().projection().to_messages(), Rules::OpenAi).is_empty(),
            "{id}"
        );
    }
    // The grandchild's own step log: the call turn, the quick result, and a synthetic
    // result for the slow call the cancellation cut.
    let step_log: Vec<Message> = events(&store, grandchild)
        .await
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::StepMessage(m) => Some(m.message),
            _ => None,
        })
        .collect();
    let mut history = vec![Message::user("Work")];
    history.extend(step_log.iter().cloned());
    assert_eq!(validate(&history, Rules::OpenAi), vec![]);
    assert_eq!(
        step_log.last().unwrap().text(),
        "[call to `slow` was cancelled; no result]"
    );
    // Cancelled runs do not resume, and cancelling again does nothing.
    assert!(matches!(
        exec.resume("parent").await.unwrap_err(),
        ExecError::Cancelled { .. }
    ));
    assert!(exec.cancel("parent", None).await.unwrap().is_empty());
    let tree = usage_tree(&store, "parent", 1 << 20).await.unwrap();
    assert_eq!(tree.status, ExecutionStatus::Cancelled);
    assert_eq!(
        tree.children[0].children[0].status,
        ExecutionStatus::Cancelled
    );
}

#[tokio::test]
async fn a_failed_run_is_cancelled_at_once_and_a_running_one_from_another_executor() {
    let (_dir, store) = sqlite().await;
    // A failed run: cancelling it ends it.
    let exec = executor(store.clone(), script("[{error: {status: 500}}]"));
    let workflow =
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: s, assistant_id: a, task: T}]";
    start(&exec, workflow, "").await.unwrap_err();
    assert_eq!(exec.cancel("run-1", None).await.unwrap(), ["run-1"]);
    let log = exec.load("run-1").await.unwrap();
    assert_eq!(log.end().map(|e| e.status), Some(RunStatus::Cancelled));

    // A run left behind by a crashed process (a call in flight, nothing running it): the
    // cancellation is recorded, and a resume ends it as cancelled instead of running it.
    let (_dir, store) = sqlite().await;
    let hang: Arc<dyn contexture_llm::Provider> = Arc::new(Never);
    let exec = executor(store.clone(), hang);
    let _ = tokio::time::timeout(Duration::from_millis(200), start(&exec, workflow, "")).await;
    assert_eq!(
        exec.cancel("run-1", Some("stale".into())).await.unwrap(),
        ["run-1"]
    );
    let resumer: Executor<SqliteStore> = executor(store.clone(), script("[{content: x}]"));
    let error = resumer.resume("run-1").await.unwrap_err();
    assert!(error.is_cancelled(), "{error}");
    let log = resumer.load("run-1").await.unwrap();
    assert_eq!(log.end().map(|e| e.status), Some(RunStatus::Cancelled));
    assert!(log.thread().in_flight().is_none());
}

/// A provider that never answers.
struct Never;

impl contexture_llm::Provider for Never {
    fn name(&self) -> &str {
        "never"
    }
    fn complete<'a>(
        &'a self,
        _: &'a contexture_llm::ChatRequest,
    ) -> contexture_llm::BoxFuture<'a, Result<contexture_llm::ChatResponse, contexture_llm::LlmError>>
    {
        Box::pin(std::future::pending())
    }
    fn stream<'a>(
        &'a self,
        _: &'a contexture_llm::ChatRequest,
        _: &'a mut (dyn FnMut(contexture_llm::StreamDelta) + Send),
    ) -> contexture_llm::BoxFuture<'a, Result<contexture_llm::ChatResponse, contexture_llm::LlmError>>
    {
        Box::pin(std::future::pending())
    }
}

#[test]
fn sub_workflows_are_checked_before_a_run() {
    use contexture_engine::workflow::Workflow;
    let source = library(&[
        ("ok.yaml", REVIEW),
        ("broken.yaml", "states: [{id: s, assistant_id: ghost}]"),
        ("loop.yaml", "states: [{id: again, workflow: loop.yaml}]"),
    ]);
    let parent = r#"
states:
  - {id: a, workflow: ok.yaml, next: {state_id: b}}
  - {id: b, workflow: missing.yaml, next: {state_id: c}}
  - {id: c, workflow: broken.yaml, next: {state_id: d}}
  - {id: d, workflow: loop.yaml}
"#;
    let error = Workflow::load_tree(parent, "parent.yaml", source.as_ref()).unwrap_err();
    let lines: Vec<String> = error.diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "parent.yaml:4:23: states[1].workflow: sub-workflow `missing.yaml`: no workflow missing.yaml",
            "broken.yaml:1:32: states[0].assistant_id: unknown assistant `ghost` (none are declared)",
            "loop.yaml:1:32: states[0].workflow: sub-workflow `loop.yaml` runs itself: parent.yaml -> loop.yaml -> loop.yaml",
        ]
    );
}

const USER_PARENT: &str = r#"
assistants:
  - {id: a, model: gpt-4o-mini, system_prompt: 'You help {{ user_context.user.name }} ({{ user_context.plan }} plan).'}
states:
  - id: first
    assistant_id: a
    task: 'Plan for {{ user_context.user.name }}'
    next: {state_id: child, output_key: user_context}
  - id: child
    workflow: middle.yaml
    next: {end: true}
"#;

const USER_MIDDLE: &str = r#"
assistants: [{id: m, model: gpt-4o-mini}]
states:
  - id: work
    assistant_id: m
    task: 'Middle for {{ user_context.user.name }}'
    next: {state_id: deeper}
  - id: deeper
    workflow: leaf.yaml
    next: {end: true}
"#;

const USER_LEAF: &str = r#"
assistants: [{id: l, model: gpt-4o-mini}]
states:
  - {id: leaf, assistant_id: l, task: 'Leaf for {{ user_context.user.name }} on {{ user_context.plan }}', next: {end: true}}
"#;

/// A run's user context reaches every template of the run and of its sub-workflows (two
/// levels down) without any mapping, no step can shadow it (the first step's output is
/// stored under `user_context`), and each child's log records it, so a resume keeps it.
#[tokio::test]
async fn the_user_context_reaches_every_descendant_read_only() {
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- content: '{"user": {"name": "Mallory"}, "plan": "free"}'
- content: middle done
- content: leaf done
"#,
    );
    let exec = executor(store.clone(), provider.clone()).with_workflow_source(library(&[
        ("middle.yaml", USER_MIDDLE),
        ("leaf.yaml", USER_LEAF),
    ]));
    let user_context = serde_json::json!({"user": {"name": "Ada"}, "plan": "pro"});
    let outcome = exec
        .start(RunRequest {
            execution_id: Some("run-1".into()),
            user_context: user_context.as_object().cloned(),
            ..RunRequest::new("workflow.yaml", USER_PARENT, "go")
        })
        .await
        .unwrap();
    assert_eq!(outcome.output, "leaf done");
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[0].messages),
        ["You help Ada (pro plan).", "go", "Plan for Ada"]
    );
    assert_eq!(texts(&sent[1].messages).last().unwrap(), "Middle for Ada");
    assert_eq!(
        texts(&sent[2].messages).last().unwrap(),
        "Leaf for Ada on pro"
    );
    // The parent's store holds the step's output under that name; templates never read it.
    let parent = exec.load("run-1").await.unwrap();
    assert_eq!(
        parent.store().get("user_context").unwrap()["user"]["name"],
        "Mallory"
    );
    for id in ["run-1", "run-1~child.1", "run-1~child.1~deeper.1"] {
        let log = exec.load(id).await.unwrap();
        assert_eq!(
            log.start().unwrap().user_context.as_ref(),
            user_context.as_object(),
            "{id}"
        );
    }
}

const BUDGET_PARENT: &str = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: first, assistant_id: a, task: Start, next: {state_id: child}}
  - {id: child, workflow: spend.yaml, next: {state_id: last}}
  - {id: last, assistant_id: a, task: Finish, next: {end: true}}
"#;

const BUDGET_CHILD: &str = r#"
assistants: [{id: c, model: gpt-4o-mini}]
states:
  - {id: one, assistant_id: c, task: One, next: {state_id: two}}
  - {id: two, assistant_id: c, task: Two, next: {end: true}}
"#;

/// Replies with the usage providers report: the parent's first call 50 tokens, each of the
/// child's two calls 40, the parent's last call 25.
const BUDGET_REPLIES: &str = r#"
- {content: started, usage: {prompt_tokens: 40, completion_tokens: 10}}
- {content: one, usage: {prompt_tokens: 30, completion_tokens: 10}}
- {content: two, usage: {prompt_tokens: 30, completion_tokens: 10}}
- {content: finished, usage: {prompt_tokens: 20, completion_tokens: 5}}
"#;

/// A parent's `max_tokens`, `max_cost_usd` and `max_steps` bound its whole tree: the child
/// starts with what the parent left as its ceiling, the parent's later calls count what the
/// child spent, and each reply is capped to what the budget leaves, so the tree never ends
/// past a limit.
#[tokio::test]
async fn a_parents_limits_bound_its_whole_tree() {
    use contexture_core::thread::RunLimits;
    struct Case {
        limits: RunLimits,
        /// The run's error, or `None` when it completes.
        error: Option<&'static str>,
        /// The child's recorded limits, when it starts.
        child: Option<RunLimits>,
        /// The tree's tokens and steps at the end.
        tokens: u64,
        steps: u64,
    }
    let tokens = |max| RunLimits {
        max_tokens: Some(max),
        ..RunLimits::default()
    };
    let cases = [
        // Enough for everything: the child's ceiling is what the first call left.
        Case {
            limits: tokens(200),
            error: None,
            child: Some(tokens(150)),
            tokens: 155,
            steps: 5,
        },
        // The child's ceiling (50) stops its second call: it has spent 40 of it.
        Case {
            limits: tokens(100),
            error: Some(
                "(execution `run-1~child.1`): execution `run-1~child.1`, step 2 (`two`): token budget exceeded: 40 tokens spent and this request needs",
            ),
            child: Some(tokens(50)),
            tokens: 90,
            steps: 4,
        },
        // The first call spent the whole budget: the child never starts.
        Case {
            limits: tokens(50),
            error: Some(
                "step 2 (`child`): token budget exceeded: 50 tokens spent against a budget of 50",
            ),
            child: None,
            tokens: 50,
            steps: 2,
        },
        // Steps over the tree: the parent's two leave the child one.
        Case {
            limits: RunLimits {
                max_steps: Some(3),
                ..RunLimits::default()
            },
            error: Some("step 2 (`two`): step limit reached: 1 steps"),
            child: Some(RunLimits {
                max_steps: Some(1),
                ..RunLimits::default()
            }),
            tokens: 90,
            steps: 3,
        },
        // Dollars: the first call's $0.000012 (gpt-4o-mini's prices) comes off the child's.
        Case {
            limits: RunLimits {
                max_cost_usd: Some(0.001),
                ..RunLimits::default()
            },
            error: None,
            child: Some(RunLimits {
                max_cost_usd: Some(0.001 - 0.000_012),
                ..RunLimits::default()
            }),
            tokens: 155,
            steps: 5,
        },
    ];
    for (number, case) in cases.iter().enumerate() {
        let (_dir, store) = sqlite().await;
        let provider = script(BUDGET_REPLIES);
        let exec = executor(store.clone(), provider.clone())
            .with_workflow_source(library(&[("spend.yaml", BUDGET_CHILD)]))
            .with_limits(case.limits);
        let outcome = start(&exec, BUDGET_PARENT, "go").await;
        match (&outcome, case.error) {
            (Ok(_), None) => {}
            (Err(error), Some(words)) => {
                assert!(error.to_string().contains(words), "case {number}: {error}")
            }
            (other, _) => panic!("case {number}: {other:?}"),
        }
        let tree = usage_tree(&store, "run-1", 1 << 20).await.unwrap();
        let spent = tree.total.input_tokens + tree.total.output_tokens;
        assert_eq!(spent, case.tokens, "case {number}");
        if let Some(limit) = case.limits.max_tokens {
            assert!(spent <= limit, "case {number}: {spent} > {limit}");
        }
        let parent = exec.load("run-1").await.unwrap();
        let child = exec.load("run-1~child.1").await.ok();
        let steps =
            parent.steps_started() + child.as_ref().map_or(0, |child| child.steps_started());
        assert_eq!(steps, case.steps, "case {number}");
        let child_limits = child.map(|child| child.start().unwrap().limits);
        match (child_limits, case.child) {
            (Some(got), Some(want)) => {
                assert_eq!(got.max_tokens, want.max_tokens, "case {number}");
                assert_eq!(got.max_steps, want.max_steps, "case {number}");
                let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) => (a - b).abs() < 1e-12,
                    (a, b) => a == b,
                };
                assert!(
                    close(got.max_cost_usd, want.max_cost_usd),
                    "case {number}: {got:?}"
                );
            }
            (None, None) => {}
            (got, want) => panic!("case {number}: child limits {got:?}, expected {want:?}"),
        }
        // Every reply was capped to what the budget left of the tree.
        if let Some(limit) = case.limits.max_tokens {
            let requests = provider.requests();
            let last_parent = requests.len() == 4;
            if last_parent {
                let cap = requests[3].max_tokens.unwrap();
                assert!(u64::from(cap) < limit - 130, "case {number}: {cap}");
            }
        }
    }
}

/// A tree stopped by its budget resumes with a larger one: the resumed child's ceiling is
/// what the parent left with the child's earlier spending counted once, and the parent's last
/// call counts the whole child.
#[tokio::test]
async fn a_tree_stopped_by_its_budget_resumes_under_a_larger_one() {
    use contexture_core::thread::RunLimits;
    let tokens = |max| RunLimits {
        max_tokens: Some(max),
        ..RunLimits::default()
    };
    let (_dir, store) = sqlite().await;
    let library = library(&[("spend.yaml", BUDGET_CHILD)]);
    let first = executor(store.clone(), script(BUDGET_REPLIES))
        .with_workflow_source(library.clone())
        .with_limits(tokens(100));
    let error = start(&first, BUDGET_PARENT, "go").await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("token budget exceeded: 40 tokens spent"),
        "{error}"
    );
    let rest = script(
        r#"
- {content: two, usage: {prompt_tokens: 30, completion_tokens: 10}}
- {content: finished, usage: {prompt_tokens: 20, completion_tokens: 5}}
"#,
    );
    let second = executor(store.clone(), rest.clone())
        .with_workflow_source(library)
        .with_limits(tokens(200));
    let outcome = second.resume("run-1").await.unwrap();
    assert_eq!(outcome.output, "finished");
    // The parent's last reply was capped to what the tree left: 200 - 130 - its request.
    let requests = rest.requests();
    assert_eq!(requests.len(), 2);
    let tree = usage_tree(&store, "run-1", 1 << 20).await.unwrap();
    assert_eq!(tree.total.input_tokens + tree.total.output_tokens, 155);
    let cap = u64::from(requests[1].max_tokens.unwrap());
    assert!(cap < 70, "{cap}");
}
