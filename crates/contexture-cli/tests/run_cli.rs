//! `contexture run`, `inspect` and `cancel`: the examples run as documented, errors point
//! into the file, a run killed with SIGKILL in the middle of an LLM call resumes from its log
//! without re-running its finished steps, conversations carry turns across runs, and a cancel
//! from another process stops a run and its sub-workflow.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Outcome, RunToEnd, sqlite_url};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::TempDir;
use serde_json::Value;

/// `contexture ARGS`, keeping executions in `dir` for the commands that read or write them.
fn contexture(dir: &TempDir, args: &[&str]) -> Command {
    let mut command = common::contexture(args);
    if matches!(args.first(), Some(&"run" | &"inspect" | &"cancel")) {
        command.args(["--db", &sqlite_url(dir, "runs.db")]);
    }
    command
}

fn ok(dir: &TempDir, args: &[&str]) -> String {
    contexture(dir, args).run().expect_success()
}

fn failure(dir: &TempDir, args: &[&str]) -> String {
    contexture(dir, args).run().expect_failure()
}

#[test]
fn the_agent_loop_example_cuts_and_clears_its_tool_results_and_inspect_shows_each() {
    let dir = TempDir::new("contexture-run-agent-loop");
    let output = ok(
        &dir,
        &[
            "run",
            "examples/agent-loop/workflow.yaml",
            "--llm",
            "scripted:examples/agent-loop/replies.yaml",
            "--execution-id",
            "agent-loop",
        ],
    );
    assert_eq!(output, "Pages 1 to 6 each list 300 numbered lines.\n");
    insta::assert_snapshot!("agent_loop_inspect", ok(&dir, &["inspect", "agent-loop"]));
    // The same execution as one self-contained page, for a bug report.
    let page = dir.join("agent-loop.html");
    let page_arg = page.to_str().unwrap();
    ok(&dir, &["inspect", "agent-loop", "--html", page_arg]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!doctype html>"), "{html}");
    assert_eq!(html.matches("<article class=\"call").count(), 7);
    assert!(html.contains("Against call #3 of the same step"));
    assert!(!html.contains("<script"));
    assert_eq!(
        ok(&dir, &["inspect", "agent-loop", "--html", "-"]),
        html,
        "`-` writes the page to standard output"
    );
    let refused = failure(
        &dir,
        &["inspect", "agent-loop", "--html", page_arg, "--json"],
    );
    assert!(refused.contains("cannot be used with"), "{refused}");
    let missing = failure(&dir, &["inspect", "no-such-run", "--html", page_arg]);
    assert!(missing.contains("no-such-run"), "{missing}");
}

#[test]
fn the_loop_compaction_example_summarizes_older_iterations_and_inspect_shows_each() {
    let dir = TempDir::new("contexture-run-loop-compaction");
    let output = contexture(
        &dir,
        &[
            "run",
            "examples/agent-loop-compaction/workflow.yaml",
            "--llm",
            "scripted:examples/agent-loop-compaction/replies.yaml",
            "--execution-id",
            "loop-compaction",
            "--trace",
        ],
    )
    .run();
    assert!(
        output
            .stderr
            .contains("--- step 1: loop compacted: its first"),
        "{}",
        output.stderr
    );
    assert_eq!(
        output.expect_success(),
        "Pages 1 to 6 each list 300 numbered lines.\n"
    );
    insta::assert_snapshot!(
        "loop_compaction_inspect",
        ok(&dir, &["inspect", "loop-compaction"])
    );
}

/// A call to a model with no known price makes the run's cost unknown, never a total that
/// leaves it out: `inspect` shows it, and its JSON has `null`.
#[test]
fn a_model_without_a_price_makes_the_cost_unknown() {
    let dir = TempDir::new("contexture-run-unknown-cost");
    std::fs::write(
        dir.join("models.toml"),
        "[models.house-model]\ncontext_window = 8192\nmax_output_tokens = 512\nencoding = \"o200k_base\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("wf.yaml"),
        "assistants:\n  - {id: a, model: house-model}\n  - {id: b, model: gpt-4o-mini}\nstates:\n  - {id: priced, assistant_id: b, task: First, next: {state_id: unpriced}}\n  - {id: unpriced, assistant_id: a, task: Second, next: {end: true}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("replies.yaml"),
        "replies:\n  - content: one\n  - content: two\n",
    )
    .unwrap();
    let models = dir.join("models.toml").display().to_string();
    let run = contexture(
        &dir,
        &[
            "run",
            dir.join("wf.yaml").to_str().unwrap(),
            "--models",
            &models,
            "--llm",
            &format!("scripted:{}", dir.join("replies.yaml").display()),
            "--execution-id",
            "mixed",
        ],
    )
    .run();
    assert_eq!(run.expect_success(), "two\n");
    let shown = ok(&dir, &["inspect", "mixed"]);
    assert!(
        shown.contains("tokens (") && shown.contains("cost unknown (a model without a price)"),
        "{shown}"
    );
    let report: Value = serde_json::from_str(&ok(&dir, &["inspect", "mixed", "--json"])).unwrap();
    assert_eq!(report["cost_usd"], Value::Null, "{report}");
    // The priced call alone has a cost.
    assert!(report["calls"][0]["end"]["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(report["calls"][1]["end"]["cost_usd"], Value::Null);
}

#[test]
fn the_examples_run_as_documented() {
    let dir = TempDir::new("contexture-run-cli");
    let multi = ok(
        &dir,
        &[
            "run",
            "examples/multi-phase/workflow.yaml",
            "--input",
            r#"{"product": "Acme Sync", "version": "2.4"}"#,
            "--llm",
            "scripted:examples/multi-phase/replies.yaml",
            "--execution-id",
            "multi-phase",
            "--print-context",
        ],
    );
    insta::assert_snapshot!("multi_phase_output", multi);
    let iterate = ok(
        &dir,
        &[
            "run",
            "examples/iterate/workflow.yaml",
            "--input-file",
            "examples/iterate/input.json",
            "--llm",
            "scripted:examples/iterate/replies.yaml",
            "--print-context",
        ],
    );
    insta::assert_snapshot!("iterate_output", iterate);
    let branching = ok(
        &dir,
        &[
            "run",
            "examples/branching/workflow.yaml",
            "--input",
            r#"{"ticket_id": "T-1042", "ticket": "Nothing loads since 9:00, all users affected", "customer_tier": "enterprise"}"#,
            "--llm",
            "scripted:examples/branching/replies.yaml",
        ],
    );
    assert_eq!(branching, "Paged sre for T-1042 (outage, high urgency).\n");
    // A state run on a fork: its call is listed with the run's, its tokens counted once.
    let forked = ok(
        &dir,
        &[
            "run",
            "examples/fork/workflow.yaml",
            "--input",
            "Acme Sync 2.4",
            "--llm",
            "scripted:examples/fork/replies.yaml",
            "--execution-id",
            "fork",
            "--print-context",
        ],
    );
    assert!(forked.contains("announce on June 3"), "{forked}");
    assert!(forked.contains(r#""choice": "June 3""#), "{forked}");
    let inspected = ok(&dir, &["inspect", "fork"]);
    assert!(
        inspected.contains("[2] explore (on fork fork~explore.fork.2) -> plan"),
        "{inspected}"
    );
    let report: Value = serde_json::from_str(&ok(&dir, &["inspect", "fork", "--json"])).unwrap();
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3);
    let input: u64 = calls
        .iter()
        .map(|call| call["end"]["usage"]["input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        report["usage"]["input_tokens"], input,
        "each call counted once"
    );
    // Every example validates.
    let validated = ok(
        &dir,
        &[
            "validate",
            "examples/multi-phase/workflow.yaml",
            "examples/iterate/workflow.yaml",
            "examples/branching/workflow.yaml",
            "examples/agent-loop/workflow.yaml",
            "examples/fork/workflow.yaml",
        ],
    );
    assert_eq!(validated.lines().count(), 5);
    // Inspect draws each call's budget.
    insta::assert_snapshot!("multi_phase_inspect", ok(&dir, &["inspect", "multi-phase"]));
    let report: Value =
        serde_json::from_str(&ok(&dir, &["inspect", "multi-phase", "--json"])).unwrap();
    assert_eq!(report["status"], "completed");
    assert_eq!(report["calls"].as_array().unwrap().len(), 4);
}

#[test]
fn validate_says_when_each_compaction_fires() {
    let dir = TempDir::new("contexture-validate-compaction");
    let workflow = dir.join("w.yaml");
    std::fs::write(
        &workflow,
        "assistants:\n  - {id: a, model: gpt-4o-mini, compaction: {summarizer: gpt-4o-mini}}\n  - {id: b, model: gpt-4o-mini, compaction: {trigger: {}}}\nstates:\n  - {id: s, assistant_id: a, next: {end: true}}\n",
    )
    .unwrap();
    let path = workflow.to_str().unwrap();
    let printed = ok(
        &dir,
        &[
            "validate",
            path,
            "examples/agent-loop-compaction/workflow.yaml",
        ],
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [
            format!("{path}: ok (1 states)").as_str(),
            "  assistant `a` compacts when the request is over 10000 tokens (the default: the policy names no trigger)",
            "  assistant `b` compacts only when asked for (`trigger: {}`)",
            "examples/agent-loop-compaction/workflow.yaml: ok (1 states)",
            "  assistant `reader` compacts when the request is over 0.7 of the model's window",
        ]
    );
}

#[test]
fn errors_say_where_and_how_to_go_on() {
    let dir = TempDir::new("contexture-run-cli");
    let workflow = dir.join("bad.yaml");
    std::fs::write(
        &workflow,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - id: s\n    assistant_id: b\n",
    )
    .unwrap();
    let stderr = failure(
        &dir,
        &["run", workflow.to_str().unwrap(), "--llm", "scripted:x"],
    );
    assert!(
        stderr.contains("bad.yaml:4:19: states[0].assistant_id: unknown assistant `b`"),
        "{stderr}"
    );
    let stderr = failure(
        &dir,
        &[
            "run",
            "examples/branching/workflow.yaml",
            "--llm",
            "gemini:x",
        ],
    );
    assert!(stderr.contains("invalid LLM `gemini:x`"), "{stderr}");
    let stderr = failure(
        &dir,
        &[
            "run",
            "examples/branching/workflow.yaml",
            "--llm",
            "scripted:does/not/exist.yaml",
        ],
    );
    assert!(
        stderr.contains("cannot read the script does/not/exist.yaml"),
        "{stderr}"
    );
    // A script that runs out fails the step; the error tells how to resume.
    let script = dir.join("short.yaml");
    std::fs::write(
        &script,
        "replies: [{content: '{\"category\": \"billing\"}'}]\n",
    )
    .unwrap();
    let stderr = failure(
        &dir,
        &[
            "run",
            "examples/branching/workflow.yaml",
            "--input",
            r#"{"ticket_id": "T-1", "ticket": "refund?", "customer_tier": "free"}"#,
            "--llm",
            &format!("scripted:{}", script.display()),
            "--execution-id",
            "short",
        ],
    );
    assert!(
        stderr.contains("execution `short`, step 2 (`billing`): the LLM call failed: scripted provider: no reply left"),
        "{stderr}"
    );
    assert!(
        stderr.contains("resume it with `contexture run --resume short`"),
        "{stderr}"
    );
    std::fs::write(
        &script,
        "replies: [{content: '{\"category\": \"billing\"}'}, {content: Refund sent.}]\n",
    )
    .unwrap();
    // The resumed scripted run skips the reply its log already used.
    assert_eq!(ok(&dir, &["run", "--resume", "short"]), "Refund sent.\n");
    let stderr = failure(&dir, &["run", "--resume", "missing"]);
    assert!(stderr.contains("no execution `missing`"), "{stderr}");
}

#[test]
fn a_run_killed_during_a_call_resumes_without_rerunning_finished_steps() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    upstream.fail_when_unscripted().extend([
        Reply::text(r#"{"product": "Acme Sync", "changes": ["sync"]}"#),
        Reply::hang(), // the second call hangs until the process is killed
    ]);
    let base = upstream.base_url();

    let dir = TempDir::new("contexture-run-cli");
    let workflow = dir.join("wf.yaml");
    std::fs::write(
        &workflow,
        r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: research, assistant_id: a, task: Research, next: {state_id: summarize}}
  - {id: summarize, assistant_id: a, task: 'Summarize {{changes | length}} change', next: {state_id: write}}
  - {id: write, assistant_id: a, task: Write, next: {end: true}}
"#,
    )
    .unwrap();
    let mut child = contexture(
        &dir,
        &[
            "run",
            workflow.to_str().unwrap(),
            "--llm",
            "openai",
            "--execution-id",
            "killed",
        ],
    )
    .env("OPENAI_BASE_URL", &base)
    .env("OPENAI_API_KEY", "sk-test")
    .spawn()
    .unwrap();
    upstream.wait_for_calls_blocking(2, Duration::from_secs(60));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    upstream.extend([Reply::text("One change."), Reply::text("Release notes.")]);
    let resumed = contexture(&dir, &["run", "--resume", "killed"])
        .env("OPENAI_BASE_URL", &base)
        .env("OPENAI_API_KEY", "sk-test")
        .run();
    assert_eq!(resumed.expect_success(), "Release notes.\n");
    let received = upstream.bodies();
    let tasks: Vec<String> = received
        .iter()
        .map(|body| {
            body["messages"].as_array().unwrap().last().unwrap()["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        tasks,
        [
            "Research",
            "Summarize 1 change",
            "Summarize 1 change",
            "Write"
        ],
        "the research step ran once; the interrupted step ran again"
    );
    assert_eq!(received[1], received[2]);
    let inspect = ok(&dir, &["inspect", "killed"]);
    assert!(inspect.contains("failed: interrupted"), "{inspect}");
}

const SUB_WORKFLOW_INPUT: &str = r#"{"product": "Acme Sync", "changes": ["faster sync", "fix: lost edits"], "internal_notes": "do not publish"}"#;

fn sub_workflow_run(dir: &TempDir, id: &str, conversation: &str, trace: bool) -> Outcome {
    let mut args = vec![
        "run",
        "examples/sub-workflow/workflow.yaml",
        "--input",
        SUB_WORKFLOW_INPUT,
        "--llm",
        "scripted:examples/sub-workflow/replies.yaml",
        "--conversation",
        conversation,
        "--execution-id",
        id,
    ];
    if trace {
        args.push("--trace");
    }
    let outcome = contexture(dir, &args).run();
    outcome.expect_success();
    outcome
}

#[test]
fn the_sub_workflow_example_scopes_its_child_and_continues_a_conversation() {
    let dir = TempDir::new("contexture-run-cli");
    let first = sub_workflow_run(&dir, "notes-1", "alice", true);
    let answer = String::from_utf8(first.stdout).unwrap();
    assert!(
        answer.starts_with("Acme Sync: sync is now twice as fast"),
        "{answer}"
    );
    let trace = first.stderr;
    let child_request = trace
        .split("--- request ")
        .find(|request| request.starts_with("notes-1~research.1/"))
        .expect("the child's request is traced");
    assert!(child_request.contains("faster sync"), "{child_request}");
    assert!(
        !child_request.contains("internal_notes"),
        "an unmapped key reached the child: {child_request}"
    );
    insta::assert_snapshot!("sub_workflow_inspect", ok(&dir, &["inspect", "notes-1"]));

    // The same conversation: the second run's request carries the first run's turns.
    let second = sub_workflow_run(&dir, "notes-2", "alice", true);
    let trace = second.stderr;
    let request = trace.split("--- request notes-2/step-2").nth(1).unwrap();
    assert!(
        request.contains("do not publish") && request.contains("edits made offline"),
        "{request}"
    );
    // Another user's conversation sees none of it.
    let other = sub_workflow_run(&dir, "notes-3", "bob", true);
    let trace = other.stderr;
    let request = trace.split("--- request notes-3/step-2").nth(1).unwrap();
    assert_eq!(
        request.matches("edits made offline").count(),
        0,
        "{request}"
    );
}

#[test]
fn a_run_as_a_tenant_keeps_its_execution_and_conversation_among_the_tenants_threads() {
    let dir = TempDir::new("contexture-run-cli");
    sub_workflow_run(&dir, "notes-1", "alice", false);
    let run_as_acme = |id: &str| {
        contexture(
            &dir,
            &[
                "run",
                "examples/sub-workflow/workflow.yaml",
                "--input",
                SUB_WORKFLOW_INPUT,
                "--llm",
                "scripted:examples/sub-workflow/replies.yaml",
                "--conversation",
                "alice",
                "--tenant",
                "acme",
                "--execution-id",
                id,
                "--trace",
            ],
        )
        .run()
    };
    // acme's alice is not the operator's: the first tenant run starts a new conversation.
    let first = run_as_acme("notes-1");
    first.expect_success();
    let request = first
        .stderr
        .split("--- request notes-1/step-2")
        .nth(1)
        .unwrap();
    assert_eq!(
        request.matches("edits made offline").count(),
        0,
        "{request}"
    );
    let second = run_as_acme("notes-2");
    second.expect_success();
    let request = second
        .stderr
        .split("--- request notes-2/step-2")
        .nth(1)
        .unwrap();
    assert!(request.contains("edits made offline"), "{request}");
    let listed = common::contexture(["thread", "list", "--db", &sqlite_url(&dir, "runs.db")])
        .run()
        .expect_success();
    let ids: Vec<&str> = listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|id| id.starts_with("acme/"))
        .collect();
    assert!(
        ids.contains(&"acme/conversation:alice:release-notes"),
        "{listed}"
    );
    assert!(
        ids.contains(&"acme/notes-1") && ids.contains(&"acme/notes-2"),
        "{listed}"
    );
    // The tenant's name is not a flag to guess: a bad one is refused before anything runs.
    let refused = failure(
        &dir,
        &[
            "run",
            "examples/sub-workflow/workflow.yaml",
            "--tenant",
            "a/b",
        ],
    );
    assert!(refused.contains("--tenant"), "{refused}");
}

#[test]
fn cancel_from_another_process_stops_a_run_and_its_sub_workflow() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = FakeUpstream::start_on(&runtime);
    upstream.fail_when_unscripted().extend([
        Reply::text("the brief"),
        Reply::hang(), // the child's call hangs until the cancellation stops it
    ]);
    let base = upstream.base_url();

    let dir = TempDir::new("contexture-run-cli");
    std::fs::write(
        dir.join("parent.yaml"),
        r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: brief, assistant_id: a, task: Brief, next: {state_id: research}}
  - {id: research, workflow: child.yaml, next: {state_id: write}}
  - {id: write, assistant_id: a, task: Write, next: {end: true}}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("child.yaml"),
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: dig, assistant_id: a, task: Dig, next: {end: true}}]\n",
    )
    .unwrap();
    let parent = dir.join("parent.yaml");
    let running = contexture(
        &dir,
        &[
            "run",
            parent.to_str().unwrap(),
            "--llm",
            "openai",
            "--execution-id",
            "job",
        ],
    )
    .env("OPENAI_BASE_URL", &base)
    .env("OPENAI_API_KEY", "sk-test")
    .spawn()
    .unwrap();
    upstream.wait_for_calls_blocking(2, Duration::from_secs(60));
    let cancelled = ok(&dir, &["cancel", "job", "--reason", "user stopped it"]);
    assert_eq!(
        cancelled,
        "cancel requested: job\ncancel requested: job~research.1\n"
    );
    let started = Instant::now();
    let output = running.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the run went on for {:?} after the cancel",
        started.elapsed()
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("cancelled"), "{stderr}");
    // Said once, clearly: no advice to resume what cannot be resumed.
    assert_eq!(
        stderr.matches("a cancelled run cannot be resumed").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("--resume"), "{stderr}");
    assert_eq!(upstream.call_count(), 2, "no call after the cancel");
    let refused = failure(&dir, &["run", "--resume", "job"]);
    assert!(
        refused.contains(
            "execution `job` was cancelled: user stopped it; a cancelled run cannot be resumed (start it again)"
        ),
        "{refused}"
    );
    let inspect = ok(&dir, &["inspect", "job"]);
    assert!(
        inspect.contains("job (") && inspect.matches("cancelled").count() >= 2,
        "{inspect}"
    );
    assert!(
        ok(&dir, &["cancel", "job"]).contains("already over"),
        "a second cancel has nothing to do"
    );
    let stderr = failure(&dir, &["cancel", "nobody"]);
    assert!(stderr.contains("nobody"), "{stderr}");
}

/// `--user-context`: every request of the run and of its sub-workflow reads it; a value that
/// is not a JSON object is refused with what was wrong and where, before anything runs.
#[test]
fn the_user_context_reaches_the_sub_workflow_and_bad_ones_are_refused() {
    let dir = TempDir::new("contexture-run-user-context");
    std::fs::write(
        dir.join("workflow.yaml"),
        "assistants: [{id: a, model: gpt-4o-mini, system_prompt: 'You write for {{ user_context.user.name }}.'}]\n\
         states:\n  - {id: plan, assistant_id: a, task: 'Plan the {{ user_context.plan }} report', next: {state_id: child}}\n  \
         - {id: child, workflow: child.yaml, next: {end: true}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("child.yaml"),
        "assistants: [{id: c, model: gpt-4o-mini}]\n\
         states: [{id: write, assistant_id: c, task: 'Write it for {{ user_context.user.name }}', next: {end: true}}]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("replies.yaml"),
        "- content: a plan\n- content: the report\n",
    )
    .unwrap();
    let workflow = dir.join("workflow.yaml").display().to_string();
    let llm = format!("scripted:{}", dir.join("replies.yaml").display());
    let run = |user_context: &str| {
        contexture(
            &dir,
            &[
                "run",
                &workflow,
                "--llm",
                &llm,
                "--trace",
                "--user-context",
                user_context,
            ],
        )
        .run()
    };
    let outcome = run(r#"{"user": {"name": "Ada"}, "plan": "quarterly"}"#);
    assert_eq!(outcome.expect_success(), "the report\n");
    let trace = outcome.stderr;
    assert!(trace.contains("You write for Ada."), "{trace}");
    assert!(trace.contains("Plan the quarterly report"), "{trace}");
    let child = trace
        .split("--- request ")
        .find(|request| request.contains("~child.1/"))
        .expect("the child's request is traced");
    assert!(child.contains("Write it for Ada"), "{child}");

    for (bad, words) in [
        (
            r#"["Ada"]"#,
            "--user-context: the user context must be a JSON object (its keys are read as user_context.KEY), not an array",
        ),
        (
            "{\"user\": }",
            "--user-context: the user context is not valid JSON: expected value at line 1, column 10",
        ),
    ] {
        let error = run(bad).expect_failure();
        assert!(error.contains(words), "{bad}: {error}");
    }
}

/// `--max-tokens` bounds the run with its sub-workflow: the sub-workflow example spends 284
/// tokens in all (its child 104). With 250, its last call's reply is capped to the one token
/// left (the scripted provider stops there, as a real one does) and the tree ends at exactly
/// 250; with 200, the last call (145 tokens after the child's 104) is never sent.
#[test]
fn a_token_budget_bounds_the_run_and_its_sub_workflow() {
    let dir = TempDir::new("contexture-run-tree-budget");
    let run = |budget: &str, id: &str| {
        contexture(
            &dir,
            &[
                "run",
                "examples/sub-workflow/workflow.yaml",
                "--input",
                SUB_WORKFLOW_INPUT,
                "--llm",
                "scripted:examples/sub-workflow/replies.yaml",
                "--max-tokens",
                budget,
                "--execution-id",
                id,
            ],
        )
        .run()
    };
    let spent = |id: &str| {
        let report: Value = serde_json::from_str(&ok(&dir, &["inspect", id, "--json"])).unwrap();
        let total = &report["usage_tree"]["total"];
        total["input_tokens"].as_u64().unwrap() + total["output_tokens"].as_u64().unwrap()
    };
    let capped = run("250", "capped");
    assert_eq!(capped.expect_success(), "Ac\n");
    assert_eq!(spent("capped"), 250);
    let refused = run("200", "refused").expect_failure();
    assert!(
        refused.contains(
            "token budget exceeded: 104 tokens spent and this request needs 145 more against a budget of 200"
        ),
        "{refused}"
    );
    assert_eq!(spent("refused"), 104);
}

/// `--hook PROGRAM`: the program is called at every point with the point and its payload on
/// standard input; here it rewrites the task and the step's output. A program that fails
/// fails the run with the hook, the point and its standard error named.
#[test]
fn a_hook_program_given_on_the_command_line_sees_and_changes_the_run() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("contexture-run-hook");
    std::fs::write(
        dir.join("workflow.yaml"),
        "assistants: [{id: a, model: gpt-4o-mini}]\n\
         states: [{id: write, assistant_id: a, task: 'Write a haiku', next: {end: true}}]\n",
    )
    .unwrap();
    std::fs::write(dir.join("replies.yaml"), "- content: an old pond\n").unwrap();
    let hook = dir.join("shout.py");
    std::fs::write(
        &hook,
        "#!/usr/bin/env python3\n\
         import json, sys\n\
         payload = json.load(sys.stdin)\n\
         point = payload['point']\n\
         if point == 'on_step_enter':\n    print(json.dumps({'task': payload['task'] + ' about frogs'}))\n\
         elif point == 'on_step_exit':\n    print(json.dumps({'output': payload['output'].upper()}))\n",
    )
    .unwrap();
    let broken = dir.join("broken.sh");
    std::fs::write(&broken, "#!/bin/sh\necho 'no database here' >&2\nexit 4\n").unwrap();
    for program in [&hook, &broken] {
        std::fs::set_permissions(program, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let workflow = dir.join("workflow.yaml").display().to_string();
    let llm = format!("scripted:{}", dir.join("replies.yaml").display());
    let run = |hook: &std::path::Path| {
        contexture(
            &dir,
            &[
                "run",
                &workflow,
                "--llm",
                &llm,
                "--trace",
                "--hook",
                &hook.display().to_string(),
            ],
        )
        .run()
    };
    let outcome = run(&hook);
    assert_eq!(outcome.expect_success(), "AN OLD POND\n");
    assert!(
        outcome.stderr.contains("Write a haiku about frogs"),
        "{}",
        outcome.stderr
    );
    // The broken program exits without reading its input: with a task larger than a pipe
    // holds, writing it always finds the pipe closed, which must fail the step, not end the
    // process on a signal.
    std::fs::write(
        dir.join("workflow.yaml"),
        format!(
            "assistants: [{{id: a, model: gpt-4o-mini}}]\n\
             states: [{{id: write, assistant_id: a, task: '{}', next: {{end: true}}}}]\n",
            "frog ".repeat(60_000)
        ),
    )
    .unwrap();
    let error = run(&broken).expect_failure();
    assert!(
        error.contains("broken.sh` failed at on_step_enter"),
        "{error}"
    );
    assert!(
        error.contains("exited with exit status: 4: no database here"),
        "{error}"
    );
}
