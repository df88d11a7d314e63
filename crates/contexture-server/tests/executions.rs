//! Executions over HTTP (start, server-sent events, status, request log, conversations), and
//! two servers sharing one PostgreSQL database: concurrent appends through both stay
//! gap-free, and a cancel sent to one stops a run on the other.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestServer, client, config};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{TempDir, pg_store, pg_url};
use contexture_store::{AnyStore, PgStore, SqliteStore};
use reqwest::StatusCode;
use serde_json::{Value, json};

const WORKFLOW: &str = r#"
name: notes
assistants: [{id: writer, model: gpt-4o-mini, system_prompt: Be brief.}]
states:
  - {id: outline, assistant_id: writer, task: 'Outline notes on {{topic}}', next: {state_id: write}}
  - {id: write, assistant_id: writer, task: Write them, next: {end: true}}
"#;

async fn get(server: &TestServer, key: &str, path: &str) -> (StatusCode, Value) {
    let response = client()
        .get(server.url(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (
        response.status(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn post(server: &TestServer, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let response = client()
        .post(server.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (
        response.status(),
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn wait_for_status(server: &TestServer, key: &str, id: &str, wanted: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = get(server, key, &format!("/v1/executions/{id}")).await;
        if status["status"] == wanted {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "execution {id} never became {wanted}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_execution_runs_in_the_background_and_streams_its_events() {
    let dir = TempDir::new("contexture-exec");
    let replies = dir.join("replies.yaml");
    std::fs::write(
        &replies,
        "- content: an outline\n- content: the notes\n- content: outline 2\n- content: notes 2\n",
    )
    .unwrap();
    let mut config = config(None);
    config.llm = format!("scripted:{}", replies.display());
    config.workflows_dir = Some(dir.path().to_owned());
    std::fs::write(dir.join("notes.yaml"), WORKFLOW).unwrap();
    let store = SqliteStore::open(dir.join("exec.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;

    let (status, started) = post(&server, &key, "/v1/executions", json!({
        "workflow": "notes.yaml", "input": {"topic": "Rust"}, "id": "run-1", "conversation": {"user": "maria"}
    })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    assert_eq!(started["id"], "run-1");
    // The event stream: every event, live, ending with the run's end.
    let text = client()
        .get(server.url("/v1/executions/run-1/events"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"run_started"), "{text}");
    assert_eq!(kinds.last(), Some(&"run_ended"), "{text}");
    assert_eq!(kinds.iter().filter(|k| **k == "request_started").count(), 2);
    assert!(!text.contains("acme/"), "ids are the client's: {text}");
    // Resuming the stream after a seq gives only what follows.
    let response = client()
        .get(server.url("/v1/executions/run-1/events"))
        .bearer_auth(&key)
        .header("Last-Event-ID", "3")
        .send()
        .await
        .unwrap();
    assert!(response.text().await.unwrap().starts_with("id: 4\n"));

    let status = wait_for_status(&server, &key, "run-1", "completed").await;
    assert_eq!(status["output"], "the notes");
    // The run's end finished it in the queue in the same write: the first status that
    // says `completed` (read from the log, then the queue) has it finished there too.
    assert_eq!(status["queue"]["state"], "finished", "{status}");
    assert_eq!(status["queue"]["outcome"], "completed", "{status}");
    assert_eq!(status["usage_tree"]["execution_id"], "run-1");
    let (_, log) = get(&server, &key, "/v1/executions/run-1/requests").await;
    let calls = log["requests"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["request"]["messages"][0]["content"], "Be brief.");

    // The same conversation: the second run sees the first run's turns.
    post(&server, &key, "/v1/executions", json!({"workflow": "notes.yaml", "input": {"topic": "Go"}, "id": "run-2", "conversation": {"user": "maria"}})).await;
    wait_for_status(&server, &key, "run-2", "completed").await;
    let (_, log) = get(&server, &key, "/v1/executions/run-2/requests").await;
    let first: Vec<&str> = log["requests"][0]["request"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(first.contains(&"the notes"), "{first:?}");

    // Errors: an id taken, another tenant, a completed run has nothing to cancel.
    let (status, _) = post(
        &server,
        &key,
        "/v1/executions",
        json!({"workflow": "notes.yaml", "id": "run-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let other = server.key("globex").await;
    assert_eq!(
        get(&server, &other, "/v1/executions/run-1").await.0,
        StatusCode::NOT_FOUND
    );
    let (status, cancelled) = post(&server, &key, "/v1/executions/run-1/cancel", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cancelled["cancel_requested"], json!([]));
    server.shutdown().await;
}

#[tokio::test]
async fn two_servers_share_one_postgres_database() {
    let Some((store_a, schema)) = pg_store("serve_two").await else {
        return;
    };
    let store_b = PgStore::open_in_schema(&pg_url(), &schema).await.unwrap();
    let upstream = FakeUpstream::start().await;
    let base = upstream.base_url();
    upstream.extend([Reply::text("an outline"), Reply::hang()]);
    let mut config = config(Some(&base));
    config.llm = "openai:gpt-4o-mini".into();
    let a = TestServer::start(config.clone(), AnyStore::Postgres(store_a.clone())).await;
    let b = TestServer::start(config, AnyStore::Postgres(store_b)).await;
    let key = a.key("acme").await; // keys live in the shared database

    // Concurrent appends to one thread through both servers: unique, gap-free seqs.
    let mut tasks = Vec::new();
    for (n, server) in [&a.base, &b.base].into_iter().cycle().take(40).enumerate() {
        let url = format!("{server}/v1/threads/shared/messages");
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth(key)
                .json(&json!({"messages": [{"role": "user", "content": format!("m{n}")}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.json::<Value>().await.unwrap()["seqs"][0]
                .as_u64()
                .unwrap()
        }));
    }
    let mut seqs = Vec::new();
    for task in tasks {
        seqs.push(task.await.unwrap());
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<u64>>());

    // A run on server A, cancelled through server B.
    let (status, _) = post(
        &a,
        &key,
        "/v1/executions",
        json!({"workflow_yaml": WORKFLOW, "input": {"topic": "Rust"}, "id": "job"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    upstream.wait_for_calls(2, Duration::from_secs(30)).await;
    let (status, cancelled) = post(
        &b,
        &key,
        "/v1/executions/job/cancel",
        json!({"reason": "stop"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["cancel_requested"], json!(["job"]));
    let started = Instant::now();
    let status = wait_for_status(&a, &key, "job", "cancelled").await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        upstream.bodies().len(),
        2,
        "nothing was sent after the cancel"
    );
    assert_eq!(status["steps"].as_array().unwrap().len(), 2);
    a.shutdown().await;
    b.shutdown().await;
    store_a.drop_schema().await.unwrap();
}

const USER_PARENT: &str = r#"
assistants: [{id: a, model: gpt-4o-mini}]
states:
  - {id: plan, assistant_id: a, task: 'Plan for {{ user_context.user }} on {{ user_context.plan }}', next: {state_id: leaf}}
  - {id: leaf, workflow: leaf.yaml, next: {end: true}}
"#;

const USER_LEAF: &str = r#"
assistants: [{id: l, model: gpt-4o-mini}]
states:
  - {id: answer, assistant_id: l, task: 'Leaf for {{ user_context.user }}', next: {end: true}}
"#;

/// Two tenants start the same client workflow, each with its own user context, over real
/// HTTP to a fake provider: every request of each run, its sub-workflow's included, reads
/// its own user context and never the other's; a user context that is not a JSON object of
/// bounded size is a 400 naming `user_context`, and no execution is written.
#[tokio::test]
async fn each_run_and_its_children_read_their_own_user_context() {
    let dir = TempDir::new("contexture-user-context");
    std::fs::write(dir.join("leaf.yaml"), USER_LEAF).unwrap();
    let upstream = FakeUpstream::start().await;
    upstream.extend((0..4).map(|n| Reply::text(format!("reply {n}"))));
    let mut config = config(Some(&upstream.base_url()));
    config.llm = "openai:gpt-4o-mini".into();
    config.workflows_dir = Some(dir.path().to_owned());
    let store = SqliteStore::open(dir.join("exec.db")).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let runs = [("acme", "Ada", "pro"), ("globex", "Grace", "free")];
    let mut keys = Vec::new();
    for (tenant, user, plan) in runs {
        let key = server.key(tenant).await;
        let (status, body) = post(
            &server,
            &key,
            "/v1/executions",
            json!({"workflow_yaml": USER_PARENT, "input": "go", "id": "job",
                   "user_context": {"user": user, "plan": plan}}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        keys.push(key);
    }
    for key in &keys {
        let status = wait_for_status(&server, key, "job", "completed").await;
        let output = status["output"].as_str().unwrap();
        assert!(output.starts_with("reply "), "{status}");
    }
    let bodies: Vec<String> = upstream.bodies().iter().map(Value::to_string).collect();
    assert_eq!(bodies.len(), 4);
    for (_, user, plan) in runs {
        let other = if user == "Ada" { "Grace" } else { "Ada" };
        let plan_request = format!("Plan for {user} on {plan}");
        let leaf_request = format!("Leaf for {user}");
        let own: Vec<&String> = bodies.iter().filter(|b| b.contains(user)).collect();
        assert_eq!(own.len(), 2, "{user}: {bodies:?}");
        assert!(own.iter().any(|b| b.contains(&plan_request)), "{bodies:?}");
        assert!(own.iter().any(|b| b.contains(&leaf_request)), "{bodies:?}");
        assert!(own.iter().all(|b| !b.contains(other)), "{bodies:?}");
    }

    // Hostile user contexts: refused before anything is written.
    let key = &keys[0];
    let big = "x".repeat(70 * 1024);
    let table = [
        (json!(["Ada"]), "not an array"),
        (json!("Ada"), "not a string"),
        (json!(42), "not a number"),
        (json!({"notes": big}), "at most 65536 are accepted"),
    ];
    for (user_context, words) in table {
        let (status, error) = post(
            &server,
            key,
            "/v1/executions",
            json!({"workflow_yaml": USER_PARENT, "id": "refused", "user_context": user_context}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert_eq!(error["error"]["param"], "user_context", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
        let (status, _) = get(&server, key, "/v1/executions/refused").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    server.shutdown().await;
}

/// A run that stops on a database error of its own (the database answers, but refuses what
/// the run writes) is taken up again from its log, and ended as failed, its log saying why,
/// once it has stopped `executions.max_database_failures` times, instead of being taken up
/// forever. Another tenant's run on the same server is untouched.
#[tokio::test]
async fn a_run_refused_by_the_database_again_and_again_ends_failed_after_its_retries() {
    let dir = TempDir::new("contexture-database-failures");
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|number, _| Reply::text(format!("reply {number}")));
    let mut config = config(Some(&upstream.base_url()));
    config.llm = "openai:gpt-4o-mini".into();
    config.executions.max_database_failures = 3;
    config.executions.claim_interval_secs = 0.1;
    let path = dir.join("exec.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    // Every step's finish is refused from now on: no run can get past its first step.
    contexture_store::testing::sqlite_refuse_events_of_kind(&path, "step_finished").unwrap();
    let (status, body) = post(
        &server,
        &key,
        "/v1/executions",
        json!({"workflow_yaml": WORKFLOW, "input": {"topic": "tides"}, "id": "refused"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let status = wait_for_status(&server, &key, "refused", "failed").await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("stopped on a database error 3 times")
            && error.contains("refused by a test"),
        "{status}"
    );
    // The queue row is finished, not left to be claimed again: in the same write as the
    // run's end, so the status that first says `failed` says so too.
    let queue = &status["queue"];
    assert_eq!(queue["state"], "finished", "{queue}");
    assert_eq!(queue["outcome"], "failed", "{queue}");
    assert_eq!(queue["database_failures"], 3, "{queue}");
    assert_eq!(queue["attempts"], 3, "{queue}");
    // Each attempt ran the first step's call again, from the log: three in all, and no more
    // once the run has ended.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(upstream.bodies().len(), 3);
    // Another tenant's ids stay its own.
    let other = server.key("globex").await;
    let (status, _) = get(&server, &other, "/v1/executions/refused").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn items_run_at_once_under_the_servers_token_ceiling_and_the_budget_holds() {
    // Every execution the server runs has a token budget (its ceiling, or the workflow's
    // own): items still run `max_concurrency` at once, each call reserving its most.
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|_, _| {
        Reply::text("reviewed")
            .usage(10, 2)
            .after(Duration::from_secs(1))
    });
    let dir = TempDir::new("contexture-items");
    let store = SqliteStore::open(dir.join("items.db")).await.unwrap();
    let server =
        TestServer::start(config(Some(&upstream.base_url())), AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let workflow = |max_tokens: u64| {
        format!(
            "assistants: [{{id: a, model: gpt-4o-mini, context: {{reserve: 100}}}}]\n\
             states:\n\
             \x20 - {{id: plan, transform: {{planned: true}}, \
             next: {{state_id: each, iter_key: files, max_concurrency: 3}}}}\n\
             \x20 - {{id: each, assistant_id: a, task: 'Review {{{{ item }}}}', \
             next: {{state_id: end, output_key: reviews}}}}\n\
             limits: {{max_tokens: {max_tokens}}}\n"
        )
    };
    let input = json!({"files": ["a", "b", "c", "d", "e", "f"]});

    // The server's ceiling only (1,000,000 tokens): six items of a second each, three at
    // once, take two seconds, and the budget counts each call once.
    let started = Instant::now();
    let (status, body) = post(
        &server,
        &key,
        "/v1/executions",
        json!({"workflow_yaml": workflow(1_000_000), "input": input, "id": "roomy"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = wait_for_status(&server, &key, "roomy", "completed").await;
    let took = started.elapsed();
    eprintln!("six items of 1 s, three at once, under a token budget: {took:?}");
    assert!(took < Duration::from_secs(3), "six 1 s items took {took:?}");
    assert_eq!(done["usage_tree"]["total"]["input_tokens"], 6 * 10);
    assert_eq!(done["usage_tree"]["total"]["output_tokens"], 6 * 2);

    // A budget that holds two calls' reservations at once, not three: the items wait for
    // one another, no reply limit is cut, and the run ends inside its budget.
    let (status, body) = post(
        &server,
        &key,
        "/v1/executions",
        json!({"workflow_yaml": workflow(300), "input": input, "id": "tight"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = wait_for_status(&server, &key, "tight", "completed").await;
    let total = &done["usage_tree"]["total"];
    assert_eq!(total["input_tokens"], 6 * 10, "{done}");
    let (_, log) = get(&server, &key, "/v1/executions/tight/requests").await;
    let limits: Vec<&Value> = log["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|call| &call["request"]["budget"]["max_output_tokens"])
        .collect();
    assert_eq!(limits.len(), 6, "{log}");
    assert!(limits.iter().all(|limit| **limit == 100), "{limits:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn the_request_log_comes_in_pages_bounded_by_bytes() {
    // Twelve calls of about 20 KB each (their task); pages of at most 64 KiB.
    let upstream = FakeUpstream::start().await;
    upstream.otherwise(|_, _| Reply::text("reviewed"));
    let dir = TempDir::new("contexture-request-pages");
    let store = SqliteStore::open(dir.join("pages.db")).await.unwrap();
    let mut config = config(Some(&upstream.base_url()));
    config.limits.max_page_bytes = 64 * 1024;
    let server = TestServer::start(config, AnyStore::Sqlite(store)).await;
    let key = server.key("acme").await;
    let workflow = "assistants: [{id: a, model: gpt-4o-mini}]\n\
                    states:\n\
                    \x20 - {id: plan, transform: {planned: true}, \
                    next: {state_id: each, iter_key: files}}\n\
                    \x20 - {id: each, assistant_id: a, task: 'file {{ item }}: {{ user_context.pad }}', \
                    next: {state_id: end, output_key: reviews}}\n";
    // The input is the history's first message, so the bulk comes through the user context.
    let files: Vec<u32> = (0..12).collect();
    let pad = "lorem ipsum ".repeat(1_700);
    let (status, body) = post(
        &server,
        &key,
        "/v1/executions",
        json!({"workflow_yaml": workflow, "input": {"files": files}, "id": "big",
               "user_context": {"pad": pad}}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    wait_for_status(&server, &key, "big", "completed").await;

    let mut tasks = Vec::new();
    let mut pages = 0;
    let mut after = 0;
    loop {
        let response = client()
            .get(server.url(&format!("/v1/executions/big/requests?after={after}")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap();
        assert!(text.len() < 100 * 1024, "a page of {} bytes", text.len());
        let page: Value = serde_json::from_str(&text).unwrap();
        pages += 1;
        for call in page["requests"].as_array().unwrap() {
            assert!(call["end"]["usage"].is_object(), "each call with its end");
            let messages = call["request"]["messages"].as_array().unwrap();
            let task = messages.last().unwrap()["content"].as_str().unwrap();
            tasks.push(task.split(':').next().unwrap().to_owned());
        }
        match page["next_after"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let expected: Vec<String> = (0..12).map(|n| format!("file {n}")).collect();
    assert_eq!(tasks, expected, "every call once, in order");
    assert!(pages >= 4, "{pages} pages");
    // `limit` pages by count; bad values are named; another tenant sees nothing.
    let (_, page) = get(
        &server,
        &key,
        "/v1/executions/big/requests?after=10&limit=1",
    )
    .await;
    assert_eq!(page["requests"].as_array().unwrap().len(), 1);
    assert_eq!(page["next_after"], 11);
    for query in ["limit=0", "limit=1001", "after=-1", "after=x", "page=2"] {
        let (status, body) = get(
            &server,
            &key,
            &format!("/v1/executions/big/requests?{query}"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
    }
    let other = server.key("globex").await;
    assert_eq!(
        get(&server, &other, "/v1/executions/big/requests").await.0,
        StatusCode::NOT_FOUND
    );
    server.shutdown().await;
}
