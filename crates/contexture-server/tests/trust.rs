//! The trust model of `contexture serve`: what a request sends never runs a program or
//! reads a file of the server's choosing; the operator's workflows run programs only when
//! the configuration allows it; refusals come at validation (400, naming the tool, the rule
//! and the setting) before anything is recorded; runs are bounded by default.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_server::ServerConfig;
use contexture_store::testing::TempDir;
use contexture_store::{AnyStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn serve_in(dir: &TempDir, config: ServerConfig) -> (TestServer, String) {
    let store = SqliteStore::open(dir.join("trust.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    (server, key)
}

async fn call(
    server: &TestServer,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client().request(method, server.url(path)).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    (
        response.status(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn start(server: &TestServer, key: &str, body: Value) -> (StatusCode, Value) {
    call(
        server,
        key,
        reqwest::Method::POST,
        "/v1/executions",
        Some(body),
    )
    .await
}

async fn wait_for_end(server: &TestServer, key: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, status) = call(
            server,
            key,
            reqwest::Method::GET,
            &format!("/v1/executions/{id}"),
            None,
        )
        .await;
        if !matches!(status["status"].as_str(), None | Some("running" | "queued")) {
            return status;
        }
        assert!(Instant::now() < deadline, "{id} never ended: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn program_workflow(marker: &std::path::Path) -> String {
    format!(
        "tools:\n  - id: t\n    command: [\"sh\", \"-c\", \"id > {}\"]\nstates:\n  - id: s\n    tool_id: t\n    next: {{state_id: end}}\n",
        marker.display()
    )
}

#[tokio::test]
async fn a_requests_workflow_never_runs_a_program_whatever_the_configuration() {
    let dir = TempDir::new("contexture-trust");
    let marker = dir.join("pwned.txt");
    for allow_programs in [false, true] {
        let mut config = config(None);
        config.workflows_dir = Some(dir.path().to_owned());
        config.executions.allow_programs = allow_programs;
        let (server, key) = serve_in(&dir, config).await;
        let (status, error) = start(
            &server,
            &key,
            json!({"workflow_yaml": program_workflow(&marker), "input": "x", "id": "run-1"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("request.yaml:3:5: tools[0].command: tool `t` runs a program (`command`), which is refused here: a workflow sent in a request never starts a program on the server"),
            "{message}"
        );
        assert_eq!(error["error"]["param"], "workflow_yaml");
        assert!(!marker.exists(), "the program ran");
        let (status, _) = call(
            &server,
            &key,
            reqwest::Method::GET,
            "/v1/executions/run-1",
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "nothing was recorded");
        server.shutdown().await;
    }
}

#[tokio::test]
async fn the_operators_workflows_run_programs_only_when_allowed() {
    let dir = TempDir::new("contexture-trust");
    let flows = dir.join("flows");
    std::fs::create_dir_all(&flows).unwrap();
    let marker = dir.join("ran.txt");
    std::fs::write(flows.join("tool.yaml"), program_workflow(&marker)).unwrap();

    let mut refused = config(None);
    refused.workflows_dir = Some(dir.path().to_owned());
    let (server, key) = serve_in(&dir, refused).await;
    let (status, error) = start(&server, &key, json!({"workflow": "flows/tool.yaml"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("flows/tool.yaml:3:5: tools[0].command: tool `t` runs a program (`command`), which is refused here: this server runs no programs: its operator may set `[executions] allow_programs = true`"),
        "{message}"
    );
    assert!(!marker.exists());
    server.shutdown().await;

    let mut allowed = config(None);
    allowed.workflows_dir = Some(dir.path().to_owned());
    allowed.executions.allow_programs = true;
    let (server, key) = serve_in(&dir, allowed).await;
    let (status, body) = start(
        &server,
        &key,
        json!({"workflow": "flows/tool.yaml", "id": "run-2"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let end = wait_for_end(&server, &key, "run-2").await;
    assert_eq!(end["status"], "completed", "{end}");
    assert!(marker.exists());
    // The log and the responses name the file relative to the workflows directory.
    let text = end.to_string();
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    let events = client()
        .get(server.url("/v1/executions/run-2/events"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        events.contains(r#""workflow_file":"flows/tool.yaml""#),
        "{events}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn no_file_is_read_or_quoted_through_a_workflows_name() {
    let dir = TempDir::new("contexture-trust");
    let secret = "sk-upstream-secret-do-not-show";
    std::fs::write(
        dir.join("contexture.toml"),
        format!("[upstream]\napi_key = \"{secret}\"\n"),
    )
    .unwrap();
    std::fs::write(dir.join("keys.yaml"), format!("api_key: {secret}\n")).unwrap();
    std::fs::write(dir.join("list.yaml"), format!("- {secret}\n")).unwrap();

    // No workflows directory: nothing is read, whatever the name.
    let (server, key) = serve_in(&dir, config(None)).await;
    for name in ["contexture.toml", "keys.yaml", "/etc/passwd"] {
        let (status, error) = start(&server, &key, json!({"workflow": name})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {error}");
        let text = error.to_string();
        assert!(!text.contains(secret), "{text}");
        assert_eq!(error["error"]["param"], "workflow");
    }
    let (_, error) = start(&server, &key, json!({"workflow": "keys.yaml"})).await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this server has no workflows directory"),
        "{error}"
    );
    // Neither through a sub-workflow of a request's workflow.
    let parent = "states:\n  - {id: sub, workflow: keys.yaml, next: {state_id: end}}\n";
    let (status, error) = start(&server, &key, json!({"workflow_yaml": parent})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(
        error.to_string().contains("no workflows directory"),
        "{error}"
    );
    server.shutdown().await;

    // With one: only `.yaml` files, and a parse error says where, never what it read.
    let mut with_dir = config(None);
    with_dir.workflows_dir = Some(dir.path().to_owned());
    let (server, key) = serve_in(&dir, with_dir).await;
    let cases = [
        json!({"workflow": "contexture.toml"}),
        json!({"workflow": "keys.yaml"}),
        json!({"workflow": "list.yaml"}),
        json!({"workflow": "../trust.db"}),
        json!({"workflow_yaml": parent}),
        json!({"workflow_yaml": parent.replace("keys.yaml", "list.yaml")}),
        json!({"workflow_yaml": parent.replace("keys.yaml", "contexture.toml")}),
    ];
    for body in cases {
        let (status, error) = start(&server, &key, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        let text = error.to_string();
        assert!(!text.contains(secret), "{body}: {text}");
        assert!(!text.contains("api_key"), "{body}: {text}");
    }
    let (_, error) = start(&server, &key, json!({"workflow": "keys.yaml"})).await;
    assert_eq!(
        error["error"]["message"],
        "keys.yaml:1:1: not a valid workflow (the server's log has the parser's message)"
    );
    let (_, error) = start(&server, &key, json!({"workflow": "contexture.toml"})).await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not a workflow file: workflows end in `.yaml` or `.yml`"),
        "{error}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_run_that_never_ends_is_stopped_by_the_default_step_ceiling() {
    let dir = TempDir::new("contexture-trust");
    let (server, key) = serve_in(&dir, config(None)).await;
    let looping = "states:\n  - id: again\n    transform: {n: '{{ (n | default(0)) + 1 }}'}\n    next: {state_id: again}\n";
    for (id, workflow) in [
        ("loop-1", looping.to_owned()),
        (
            "loop-2",
            format!("limits: {{max_steps: 1000000}}\n{looping}"),
        ),
    ] {
        let (status, body) = start(
            &server,
            &key,
            json!({"workflow_yaml": workflow, "input": {}, "id": id}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let end = wait_for_end(&server, &key, id).await;
        assert_eq!(end["status"], "failed", "{end}");
        assert!(
            end["error"]
                .as_str()
                .unwrap()
                .contains("step limit reached: 200 steps"),
            "{end}"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_requests_workflow_reaches_the_host_only_through_the_operators_registered_tools() {
    let dir = TempDir::new("contexture-trust");
    let mut config = config(None);
    // The program echoes its input and what it can see of the environment: the operator's
    // variable, and none of the server process's (cargo sets CARGO_MANIFEST_DIR for tests).
    config.tools.insert(
        "lookup".into(),
        contexture_server::RegisteredTool {
            command: vec![
                "sh".into(),
                "-c".into(),
                r#"printf '%s|%s|%s' "$(cat)" "$REGION" "$CARGO_MANIFEST_DIR""#.into(),
            ],
            env: [("REGION".to_owned(), "eu-west".to_owned())].into(),
            timeout_secs: 10.0,
        },
    );
    let (server, key) = serve_in(&dir, config).await;
    let workflow = "tools:\n  - id: find\n    tool: lookup\n    arguments: {city: Paris}\nstates:\n  - id: s\n    tool_id: find\n    next: {state_id: end}\n";
    let (status, body) = start(
        &server,
        &key,
        json!({"workflow_yaml": workflow, "input": "x", "id": "run-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let end = wait_for_end(&server, &key, "run-1").await;
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["output"], r#"{"city":"Paris"}|eu-west|"#, "{end}");

    // A name nobody registered is refused at validation, listing what is registered.
    let unknown = workflow.replace("tool: lookup", "tool: shell");
    let (status, error) = start(&server, &key, json!({"workflow_yaml": unknown})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tool `find` has no implementation") && message.contains("lookup"),
        "{message}"
    );
    server.shutdown().await;
}

#[test]
fn a_registered_tool_must_be_a_usable_program_under_a_free_name() {
    let problem = |toml: &str| {
        ServerConfig::parse(toml, std::path::Path::new("contexture.toml"))
            .and_then(|config| config.toolbox().map(|_| ()))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        problem("[tools.echo]\ncommand = [\"cat\"]\n"),
        "tools.echo: `echo` is a built-in tool; register this one under another name"
    );
    assert_eq!(
        problem("[tools.search]\ncommand = []\n"),
        "tools.search: the command is empty: name a program"
    );
    assert_eq!(
        problem("[tools.\"a b\"]\ncommand = [\"cat\"]\n"),
        "tools.a b: a tool's name is 1 to 64 letters, digits, `_` or `-`"
    );
    assert_eq!(
        problem("[tools.search]\ncommand = [\"cat\"]\ntimeout_secs = 0\n"),
        "tools.search: timeout_secs must be above 0, not 0"
    );
    assert!(
        problem("[tools.search]\nprogram = \"cat\"\n").contains("unknown field `program`"),
        "an unknown setting is named"
    );
}

/// The most memory this test process has held (it runs the server): Linux's high-water mark.
fn peak_memory_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

#[tokio::test]
async fn a_clients_template_that_would_fill_memory_fails_alone_and_the_server_goes_on() {
    let dir = TempDir::new("contexture-trust");
    let mut config = config(None);
    config.executions.template_memory_mib = 256;
    let (server, key) = serve_in(&dir, config).await;
    // A list that repeats one long string costs little to build; turned into text by `~`,
    // a string filter or an expression, it is gigabytes. Each fails at the worker's limit.
    let bombs = [
        (
            "concat",
            "states:\n  - id: s\n    transform: {t: '{% set s = \"x\" * 100000 %}{{ ([s] * 100000) ~ \"\" }}'}\n    next: {state_id: end}\n",
        ),
        (
            "filter",
            "states:\n  - id: s\n    transform: {t: '{% set s = \"x\" * 100000 %}{{ ([s] * 100000) | upper }}'}\n    next: {state_id: end}\n",
        ),
        (
            "condition",
            "states:\n  - id: s\n    transform: {t: 1}\n    next:\n      condition: {expression: '(([\"x\" * 100000] * 100000) ~ \"\") == \"\"', then: end, otherwise: end}\n",
        ),
    ];
    for (id, workflow) in bombs {
        let (status, body) = start(
            &server,
            &key,
            json!({"workflow_yaml": workflow, "input": {}, "id": id}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{id}: {body}");
        let end = wait_for_end(&server, &key, id).await;
        assert_eq!(end["status"], "failed", "{id}: {end}");
        let error = end["error"].as_str().unwrap();
        assert!(
            error.contains("needed more memory than a render may use (256 MiB)"),
            "{id}: {error}"
        );
    }
    // The server itself never held the text: its peak stays far below one bomb's size.
    let peak = peak_memory_bytes();
    assert!(peak < 1024 * 1024 * 1024, "peak {peak} bytes");
    // And it goes on rendering clients' templates, uuid included (ids come from the server).
    let (status, body) = start(
        &server,
        &key,
        json!({
            "workflow_yaml": "states:\n  - id: s\n    transform: {t: '{{ n * 2 }}', id: '{{ uuid }}'}\n    next: {state_id: end}\n",
            "input": {"n": 21},
            "id": "after",
        }),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let end = wait_for_end(&server, &key, "after").await;
    assert_eq!(end["status"], "completed", "{end}");
    let output: Value = serde_json::from_str(end["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["t"], 42, "{output}");
    assert_eq!(output["id"].as_str().map(str::len), Some(36), "{output}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_clients_template_that_would_run_for_ever_is_stopped_at_the_time_limit() {
    let dir = TempDir::new("contexture-trust");
    let mut config = config(None);
    config.executions.template_seconds = 1.0;
    let (server, key) = serve_in(&dir, config).await;
    // Comparing two lists that each refer to themselves 2^40 times is one step for fuel and
    // days of work.
    let workflow = "states:\n  - id: s\n    transform: {t: '{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}'}\n    next: {state_id: end}\n";
    let started = Instant::now();
    let (status, body) = start(
        &server,
        &key,
        json!({"workflow_yaml": workflow, "input": {}, "id": "spin"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let end = wait_for_end(&server, &key, "spin").await;
    assert_eq!(end["status"], "failed", "{end}");
    let error = end["error"].as_str().unwrap();
    assert!(
        error.contains("ran longer than a render may (1 s)"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    server.shutdown().await;
}

#[tokio::test]
async fn a_template_worker_that_cannot_start_stops_the_server_from_starting() {
    let mut config = config(None);
    config.executions.template_worker = Some(vec!["/nonexistent/contexture".into()]);
    let dir = TempDir::new("contexture-trust");
    let store = SqliteStore::open(dir.join("trust.db")).await.unwrap();
    let error = contexture_server::AppState::with_store(config, AnyStore::Sqlite(store))
        .err()
        .expect("a worker that cannot start stops the server from starting")
        .to_string();
    assert!(
        error.contains("executions.template_worker: cannot start a template worker"),
        "{error}"
    );
}

#[tokio::test]
async fn a_requests_workflow_cannot_name_an_address_for_the_server_to_connect_to() {
    let dir = TempDir::new("contexture-trust");
    let (server, key) = serve_in(&dir, config(None)).await;
    let workflow = "mcp_servers:\n  - name: metadata\n    config: {url: 'http://169.254.169.254/latest/'}\nstates:\n  - id: s\n    transform: {t: 1}\n    next: {state_id: end}\n";
    let (status, body) = start(
        &server,
        &key,
        json!({"workflow_yaml": workflow, "input": {}, "id": "mcp-url"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("mcp_servers[0].config.url: MCP server `metadata` names a URL (`config.url`), which is refused here"),
        "{body}"
    );
    let (status, _) = call(
        &server,
        &key,
        reqwest::Method::GET,
        "/v1/executions/mcp-url",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

/// The operator's hook programs (`[[hooks]]`) run at every execution's hook points, seeing
/// only their own environment; a request's workflow cannot name one (it would start a
/// program), and a bad declaration stops the configuration.
#[tokio::test]
async fn hook_programs_come_from_the_operator_only() {
    let dir = TempDir::new("contexture-trust");
    let marker = dir.join("client-hook-ran.txt");
    let mut config = config(None);
    config.hooks = vec![contexture_engine::hooks::HookProgramSpec {
        command: vec![
            "python3".into(),
            "-c".into(),
            "import json, os, sys\n\
             p = json.load(sys.stdin)\n\
             seen = os.environ.get('REGION', '') + '|' + os.environ.get('CARGO_MANIFEST_DIR', '')\n\
             print(json.dumps({'output': p['output'] + '|' + seen}))"
                .into(),
        ],
        points: vec![contexture_engine::hooks::HookPoint::OnStepExit],
        timeout_seconds: Some(20.0),
        environment: Some([("REGION".to_owned(), "eu-west".to_owned())].into()),
    }];
    let (server, key) = serve_in(&dir, config).await;
    let workflow = "tools:\n  - {id: t, response: result}\nstates:\n  - {id: s, tool_id: t, next: {state_id: end}}\n";
    let (status, body) = start(
        &server,
        &key,
        json!({"workflow_yaml": workflow, "input": "x", "id": "run-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let end = wait_for_end(&server, &key, "run-1").await;
    assert_eq!(end["status"], "completed", "{end}");
    // The operator's variable, none of the server process's.
    assert_eq!(end["output"], "result|eu-west|", "{end}");

    let hooked = format!(
        "{workflow}hooks:\n  - command: [sh, -c, 'touch {}']\n",
        marker.display()
    );
    let (status, error) = start(
        &server,
        &key,
        json!({"workflow_yaml": hooked, "id": "run-2"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("hooks[0].command: hook `sh -c touch")
            && message.contains("a workflow sent in a request never starts a program"),
        "{message}"
    );
    assert!(!marker.exists(), "the client's hook ran");
    server.shutdown().await;

    let problem = |toml: &str| {
        ServerConfig::parse(toml, std::path::Path::new("contexture.toml"))
            .and_then(|config| config.hook_programs().map(|_| ()))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        problem("[[hooks]]\ncommand = []\n"),
        "hooks[0].command is empty: name a program"
    );
    assert_eq!(
        problem("[[hooks]]\ncommand = [\"x\"]\ntimeout_seconds = -1\n"),
        "hooks[0].timeout_seconds is -1: give a number of seconds above 0, at most 86400"
    );
    assert!(
        problem("[[hooks]]\ncommand = [\"x\"]\npoints = [\"on_start\"]\n")
            .contains("unknown variant `on_start`"),
        "an unknown point is named"
    );
}
