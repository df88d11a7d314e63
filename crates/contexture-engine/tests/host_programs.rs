//! What a run may do on the host: a client's workflow never starts a program (nor do its
//! sub-workflows or a resume of it), an operator's only when the executor allows it; every
//! refusal comes at validation, before anything is recorded. Ceilings on run limits and the
//! wall-clock limit.

use crate::common;

use std::time::{Duration, Instant};

use common::{events, executor, kinds, library, script, sqlite};
use contexture_core::thread::{EventKind, RunLimits, RunStart, RunStatus};
use contexture_engine::executor::{ExecError, RunRequest, StepError};
use contexture_engine::workflow::{Diagnostic, Programs, WorkflowOrigin};
use contexture_store::{NewEvent, Store};

const PROGRAM_TOOL: &str = r#"states:
  - id: s
    tool_id: t
    next: {state_id: end}
tools:
  - id: t
    command: [sh, -c, 'id > pwned.txt']
"#;

const MCP_PROGRAM: &str = r#"states:
  - id: s
    transform: {a: b}
mcp_servers:
  - name: files
    config:
      command: npx
"#;

fn client(text: &str) -> RunRequest {
    RunRequest {
        execution_id: Some("run-1".into()),
        origin: WorkflowOrigin::Client,
        user_context: None,
        ..RunRequest::new("request.yaml", text, "x")
    }
}

/// The one diagnostic of a validation error: anything else fails the test.
fn refusal(error: &ExecError) -> &Diagnostic {
    let ExecError::Workflow(error) = error else {
        panic!("not a validation error: {error}");
    };
    assert_eq!(error.diagnostics.len(), 1, "{error}");
    &error.diagnostics[0]
}

#[tokio::test]
async fn a_clients_program_tool_is_refused_at_validation_with_where_and_why() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"));
    let error = exec.start(client(PROGRAM_TOOL)).await.unwrap_err();
    let ExecError::Workflow(error) = &error else {
        panic!("not a validation error: {error}");
    };
    let diagnostic = &error.diagnostics[0];
    assert_eq!(diagnostic.file, "request.yaml");
    assert_eq!(diagnostic.path, "tools[0].command");
    assert_eq!((diagnostic.line, diagnostic.column), (7, 5));
    assert!(
        diagnostic
            .message
            .starts_with("tool `t` runs a program (`command`), which is refused here: a workflow sent in a request never starts a program"),
        "{}",
        diagnostic.message
    );
    assert!(store.events("run-1").await.unwrap_or_default().is_empty());
    assert!(!std::path::Path::new("pwned.txt").exists());

    let error = exec.validate(&client(MCP_PROGRAM)).unwrap_err();
    let diagnostic = refusal(&error);
    assert_eq!(
        (diagnostic.file.as_str(), diagnostic.line, diagnostic.column),
        ("request.yaml", 7, 16)
    );
    assert_eq!(diagnostic.path, "mcp_servers[0].config.command");
    assert!(
        diagnostic
            .message
            .starts_with("MCP server `files` is started as a program"),
        "{diagnostic}"
    );
}

#[tokio::test]
async fn an_operators_program_runs_only_when_the_executor_allows_programs() {
    let (_dir, store) = sqlite().await;
    let allowed = executor(store.clone(), script("[]"));
    let echo = PROGRAM_TOOL.replace("'id > pwned.txt'", "'echo ran'");
    let out = allowed
        .start(RunRequest {
            execution_id: Some("run-1".into()),
            ..RunRequest::new("workflow.yaml", echo.clone(), "x")
        })
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "ran");

    let refused = executor(store.clone(), script("[]")).with_programs(Programs::Refused(
        "programs are off (set `allow_programs = true`)".into(),
    ));
    let error = refused
        .start(RunRequest {
            execution_id: Some("run-2".into()),
            ..RunRequest::new("workflow.yaml", echo, "x")
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("tool `t` runs a program (`command`), which is refused here: programs are off (set `allow_programs = true`)"),
        "{error}"
    );
    assert!(store.events("run-2").await.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn a_clients_sub_workflows_run_no_program_either() {
    let (_dir, store) = sqlite().await;
    let child = PROGRAM_TOOL.replace("'id > pwned.txt'", "'echo ran'");
    let exec = executor(store.clone(), script("[]"))
        .with_workflow_source(library(&[("child.yaml", &child)]));
    let parent = "states:\n  - {id: sub, workflow: child.yaml, next: {state_id: end}}\n";
    let error = exec.start(client(parent)).await.unwrap_err();
    let diagnostic = refusal(&error);
    assert_eq!(
        (diagnostic.file.as_str(), diagnostic.line, diagnostic.column),
        ("child.yaml", 7, 5)
    );
    assert_eq!(diagnostic.path, "tools[0].command");
    assert!(
        diagnostic.message.starts_with("tool `t` runs a program"),
        "{diagnostic}"
    );
    assert!(store.events("run-1").await.unwrap_or_default().is_empty());
    // The operator's own run of the same parent may.
    let out = exec
        .start(RunRequest {
            execution_id: Some("run-2".into()),
            ..RunRequest::new("parent.yaml", parent, "x")
        })
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "ran");
}

#[tokio::test]
async fn a_resumed_client_run_stays_a_client_run() {
    let (_dir, store) = sqlite().await;
    // A log as an older server could have written it: a client's workflow with a program.
    store
        .append(
            "run-1",
            vec![NewEvent::new(EventKind::RunStarted(RunStart {
                workflow_file: "request.yaml".into(),
                workflow_text: PROGRAM_TOOL.into(),
                input: "x".into(),
                llm: None,
                parent_execution_id: None,
                limits: RunLimits::default(),
                conversation: None,
                from_client: true,
                user_context: None,
            }))],
        )
        .await
        .unwrap();
    let exec = executor(store.clone(), script("[]"));
    let error = exec.resume("run-1").await.unwrap_err();
    let ExecError::NotRunnable { file, problems } = &error else {
        panic!("not a refusal to run: {error}");
    };
    assert_eq!(file, "request.yaml");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("tool `t` runs a program (`command`), which is refused here: a workflow sent in a request never starts a program"),
        "{problems:?}"
    );
    assert_eq!(kinds(&events(&store, "run-1").await), ["run_started"]);
}

const SELF_LOOP: &str = r#"states:
  - id: again
    transform: {n: '{{ (n | default(0)) + 1 }}'}
    next: {state_id: again}
"#;

#[tokio::test]
async fn ceilings_stop_a_loop_that_sets_no_limit_and_lower_a_higher_one() {
    for (workflow, expected) in [
        (SELF_LOOP.to_owned(), 5),
        (format!("limits: {{max_steps: 1000}}\n{SELF_LOOP}"), 5),
        (format!("limits: {{max_steps: 3}}\n{SELF_LOOP}"), 3),
    ] {
        let (_dir, store) = sqlite().await;
        let exec = executor(store.clone(), script("[]")).with_limit_caps(RunLimits {
            max_steps: Some(5),
            ..RunLimits::default()
        });
        let error = exec
            .start(RunRequest {
                execution_id: Some("run-1".into()),
                ..RunRequest::new("workflow.yaml", workflow.clone(), "{}")
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                &error,
                ExecError::StepFailed { error, .. }
                    if matches!(**error, StepError::StepLimit { max } if max == expected)
            ),
            "{workflow}: {error}"
        );
    }
}

#[tokio::test]
async fn the_wall_clock_limit_cancels_a_run_with_its_reason() {
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), script("[]"))
        .with_cancel_poll(Duration::from_millis(20))
        .with_limit_caps(RunLimits {
            max_seconds: Some(0.3),
            ..RunLimits::default()
        });
    let slow = PROGRAM_TOOL.replace("'id > pwned.txt'", "'sleep 10'");
    let started = Instant::now();
    let error = exec
        .start(RunRequest {
            execution_id: Some("run-1".into()),
            ..RunRequest::new("workflow.yaml", slow, "x")
        })
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    assert!(
        error.is_cancelled() && error.to_string().contains("wall-clock limit reached"),
        "{error}"
    );
    let log = events(&store, "run-1").await;
    let ended = log.iter().find_map(|event| match &event.kind {
        EventKind::RunEnded(end) => Some(end.status),
        _ => None,
    });
    assert_eq!(ended, Some(RunStatus::Cancelled));
}

#[tokio::test]
async fn a_clients_templates_do_not_see_which_host_runs_them() {
    let (_dir, store) = sqlite().await;
    let options = contexture_core::context::RenderOptions::fixed(1_767_225_600)
        .with_variable("hostname", "build-host-7".into())
        .with_variable("username", "svc-contexture".into())
        .with_variable("working_directory", "/srv/contexture".into())
        .with_variable("os", "linux".into());
    let exec = executor(store.clone(), script("[]")).with_render_options(options);
    let workflow = r#"missing_variables: empty
states:
  - id: s
    transform:
      host: "[{{ hostname }}|{{ username }}|{{ working_directory }}|{{ os }}]"
    next: {state_id: end}
"#;
    let operator = exec
        .start(RunRequest {
            execution_id: Some("operator".into()),
            ..RunRequest::new("workflow.yaml", workflow, "x")
        })
        .await
        .unwrap();
    assert_eq!(
        operator.output,
        r#"{"host":"[build-host-7|svc-contexture|/srv/contexture|linux]"}"#
    );
    let from_client = exec.start(client(workflow)).await.unwrap();
    assert_eq!(from_client.output, r#"{"host":"[|||linux]"}"#);
}
