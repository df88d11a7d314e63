//! Hook programs: a program called at the hook points with JSON on standard input, chained
//! in order, each firing once; a workflow's own `hooks`; and every way a program can fail
//! (non-zero exit, invalid JSON, an unknown key, a timeout), each failing the step with an
//! error naming the hook, the point and what went wrong.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{executor, script, sqlite, start, texts};
use contexture_engine::executor::{ExecError, RunRequest};
use contexture_engine::hooks::{HookPoint, HookProgramSpec, ProgramHook};
use contexture_engine::workflow::WorkflowOrigin;
use contexture_store::testing::TempDir;

/// A hook program whose behaviour its first argument chooses; it appends
/// `NAME:point:step` to the log file its third argument names.
const HOOK: &str = r#"
import json, sys, time
mode, name, log = sys.argv[1], sys.argv[2], sys.argv[3]
payload = json.load(sys.stdin)
point = payload["point"]
step = (payload.get("step") or payload.get("call", {}).get("step") or {}).get("step")
with open(log, "a") as f:
    f.write(f"{name}:{point}:{step}\n")
answer = {}
if mode == "tag":
    if point == "on_step_enter" and payload["task"] is not None:
        answer = {"task": payload["task"] + " +" + name}
    elif point == "after_llm_call" and not payload["reply"].get("tool_calls"):
        reply = payload["reply"]
        reply["content"] = (reply.get("content") or "") + ">" + name
        answer = {"reply": reply}
    elif point == "on_step_exit":
        answer = {"output": "[" + payload["output"] + "]"}
elif mode == "view" and point == "before_llm_call":
    answer = {"view": [{"role": "system", "content": "Answer in French."}] + payload["messages"]}
elif mode == "fail":
    sys.stderr.write("boom: the hook broke\nsecond line\n")
    sys.exit(3)
elif mode == "garbage":
    sys.stdout.write("{\n  \"task\": oops\n}")
    sys.exit(0)
elif mode == "unknown":
    answer = {"tsk": "typo"}
elif mode == "array":
    answer = [1, 2]
elif mode == "slow":
    time.sleep(10)
elif mode == "silent":
    sys.exit(0)
print(json.dumps(answer))
"#;

struct Fixture {
    dir: TempDir,
    hook: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = TempDir::new("contexture-hook-programs");
        let hook = dir.join("hook.py");
        std::fs::write(&hook, HOOK).unwrap();
        Fixture { dir, hook }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("hooks.log")
    }

    fn command(&self, mode: &str, name: &str) -> Vec<String> {
        vec![
            "python3".into(),
            self.hook.display().to_string(),
            mode.into(),
            name.into(),
            self.log().display().to_string(),
        ]
    }

    fn hook(&self, mode: &str, name: &str) -> Arc<ProgramHook> {
        Arc::new(
            ProgramHook::new(HookProgramSpec {
                command: self.command(mode, name),
                points: Vec::new(),
                timeout_seconds: Some(3.0),
                environment: None,
            })
            .unwrap(),
        )
    }

    fn fired(&self) -> Vec<String> {
        read_lines(&self.log())
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

const WORKFLOW: &str = r#"
assistants:
  - {id: a, model: gpt-4o-mini, tools: [t]}
tools:
  - {id: t, response: result}
states:
  - {id: one, assistant_id: a, task: One, next: {state_id: two}}
  - {id: two, tool_id: t, next: {end: true, output_key: last}}
"#;

const REPLIES: &str = r#"
- tool_calls: [{id: c1, name: t}]
- content: first
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_programs_chain_in_order_and_fire_once_per_point() {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let provider = script(REPLIES);
    let exec = executor(store, provider.clone())
        .with_hook(fixture.hook("tag", "h1"))
        .with_hook(fixture.hook("tag", "h2"));
    let out = start(&exec, WORKFLOW, "").await.unwrap();
    assert_eq!(
        fixture.fired(),
        [
            "h1:on_step_enter:1",
            "h2:on_step_enter:1",
            "h1:before_llm_call:1",
            "h2:before_llm_call:1",
            "h1:after_llm_call:1",
            "h2:after_llm_call:1",
            "h1:before_llm_call:1",
            "h2:before_llm_call:1",
            "h1:after_llm_call:1",
            "h2:after_llm_call:1",
            "h1:on_step_exit:1",
            "h2:on_step_exit:1",
            "h1:on_step_enter:2",
            "h2:on_step_enter:2",
            "h1:on_step_exit:2",
            "h2:on_step_exit:2",
        ]
    );
    // Each program received the previous one's result.
    let sent = provider.requests();
    assert_eq!(sent[0].messages[0].text(), "One +h1 +h2");
    assert_eq!(
        out.store.get("last"),
        Some(&serde_json::json!("[[result]]"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_view_changes_one_call_only() {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: un}]");
    let exec = executor(store, provider.clone()).with_hook(fixture.hook("view", "v"));
    start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: one, assistant_id: a, task: One}]",
        "",
    )
    .await
    .unwrap();
    assert_eq!(
        texts(&provider.requests()[0].messages),
        ["Answer in French.", "One"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_declares_its_own_hooks_before_the_callers() {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let provider = script(REPLIES);
    let command = serde_json::to_string(&fixture.command("tag", "wf")).unwrap();
    let workflow =
        format!("{WORKFLOW}hooks:\n  - {{command: {command}, points: [on_step_exit]}}\n");
    let exec = executor(store, provider).with_hook(fixture.hook("tag", "caller"));
    let out = start(&exec, &workflow, "").await.unwrap();
    let exits: Vec<String> = fixture
        .fired()
        .into_iter()
        .filter(|line| line.contains("on_step_exit"))
        .collect();
    assert_eq!(
        exits,
        [
            "wf:on_step_exit:1",
            "caller:on_step_exit:1",
            "wf:on_step_exit:2",
            "caller:on_step_exit:2"
        ]
    );
    // The workflow's hook is called only at the point it names.
    assert!(
        !fixture
            .fired()
            .iter()
            .any(|line| line.starts_with("wf:on_step_enter"))
    );
    assert_eq!(
        out.store.get("last"),
        Some(&serde_json::json!("[[result]]"))
    );
}

/// Runs the one-step workflow with a hook of `mode` and returns the failure's text.
async fn failure_of(mode: &str, timeout_seconds: f64) -> String {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: un}]");
    let hook = ProgramHook::new(HookProgramSpec {
        command: fixture.command(mode, "bad"),
        points: vec![HookPoint::OnStepEnter],
        timeout_seconds: Some(timeout_seconds),
        environment: None,
    })
    .unwrap();
    let exec = executor(store, provider.clone()).with_hook(Arc::new(hook));
    let error = start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: one, assistant_id: a, task: One}]",
        "",
    )
    .await
    .expect_err("the hook fails the step");
    assert!(
        matches!(error, ExecError::StepFailed { .. }),
        "a step failure, not {error:?}"
    );
    // Nothing was sent: the step failed before its call.
    assert!(provider.requests().is_empty());
    error.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_fails_fails_the_step_with_its_stderr() {
    let text = failure_of("fail", 3.0).await;
    assert!(text.contains("step 1 (`one`)"), "{text}");
    assert!(text.contains("hook.py fail bad"), "names the hook: {text}");
    assert!(text.contains("at on_step_enter"), "{text}");
    assert!(text.contains("exited with exit status: 3"), "{text}");
    assert!(
        text.contains("boom: the hook broke"),
        "quotes stderr: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_answers_are_named_with_where_they_go_wrong() {
    let garbage = failure_of("garbage", 3.0).await;
    assert!(
        garbage.contains("not valid JSON (line 2, column 11)"),
        "{garbage}"
    );
    let unknown = failure_of("unknown", 3.0).await;
    assert!(
        unknown.contains("unknown key `tsk`") && unknown.contains("`task`"),
        "{unknown}"
    );
    let array = failure_of("array", 3.0).await;
    assert!(array.contains("an array, not an object"), "{array}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_past_its_timeout_is_stopped() {
    let started = std::time::Instant::now();
    let text = failure_of("slow", 0.5).await;
    assert!(text.contains("gave no answer within 500ms"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_changes_nothing() {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let provider = script("[{content: un}]");
    let exec = executor(store, provider.clone()).with_hook(fixture.hook("silent", "s"));
    let out = start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: one, assistant_id: a, task: One, next: {end: true, output_key: out}}]",
        "",
    )
    .await
    .unwrap();
    assert_eq!(texts(&provider.requests()[0].messages), ["One"]);
    assert_eq!(out.store.get("out"), Some(&serde_json::json!("un")));
}

#[tokio::test]
async fn bad_hook_declarations_are_named_where_written() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[]"));
    let base = "assistants: [{id: a, model: gpt-4o-mini}]\nstates: [{id: one, assistant_id: a, task: One}]\n";
    for (hooks, expected) in [
        ("hooks: [{command: []}]", "hooks[0].command"),
        (
            "hooks: [{command: [x], timeout_seconds: 0}]",
            "hooks[0].timeout_seconds",
        ),
        (
            "hooks: [{command: [x], points: [on_step_start]}]",
            "on_step_start",
        ),
        ("hooks: [{command: [x], when: always}]", "when"),
    ] {
        let error = start(&exec, &format!("{base}{hooks}\n"), "")
            .await
            .expect_err(hooks)
            .to_string();
        assert!(error.contains(expected), "{hooks}: {error}");
        assert!(error.contains("workflow.yaml"), "{hooks}: {error}");
    }
}

#[tokio::test]
async fn a_clients_workflow_never_starts_a_hook_program() {
    let fixture = Fixture::new();
    let (_dir, store) = sqlite().await;
    let exec = executor(store, script("[{content: un}]"));
    let command = serde_json::to_string(&fixture.command("tag", "client")).unwrap();
    let mut request = RunRequest::new(
        "workflow.yaml",
        format!(
            "assistants: [{{id: a, model: gpt-4o-mini}}]\nstates: [{{id: one, assistant_id: a, task: One}}]\nhooks: [{{command: {command}}}]\n"
        ),
        "",
    );
    request.origin = WorkflowOrigin::Client;
    let error = exec.start(request).await.expect_err("refused").to_string();
    assert!(error.contains("hooks[0].command"), "{error}");
    assert!(error.contains("never starts a program"), "{error}");
    // Refused before anything ran: the program never started.
    assert!(fixture.fired().is_empty());
}
