//! Scale-out: three `contexture serve` processes on one PostgreSQL schema share one
//! execution queue. The server running an execution is killed (SIGKILL) in the middle of a
//! step, again and again; each time another server takes the run over once its lease runs
//! out and completes it from its log, and no finished step is run twice (the fake provider
//! counts the calls of each step).

use std::time::{Duration, Instant};

use crate::common;

use common::serving::{Server, create_key, start_upstream};
use common::write_file;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::testing::{TempDir, in_ci, pg_url, unique};
use serde_json::{Value, json};

/// The lease the servers hold runs by, in seconds: short, so that the test is quick.
const LEASE_SECS: f64 = 2.0;

/// How long each call to the fake provider takes: long enough to kill a server during one.
const CALL_TIME: Duration = Duration::from_millis(700);

/// Three steps, one call each; each step's task names it, so the provider can count them.
const WORKFLOW: &str = "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: one, assistant_id: a, task: step-one, next: {state_id: two}}\n  - {id: two, assistant_id: a, task: step-two, next: {state_id: three}}\n  - {id: three, assistant_id: a, task: step-three, next: {state_id: end}}\n";

const STEPS: [&str; 3] = ["step-one", "step-two", "step-three"];

/// A fresh schema of the test database, as a `--db` URL, with the store to drop it; `None`
/// (after a loud message) when PostgreSQL is unreachable outside CI.
fn fresh_schema(runtime: &tokio::runtime::Runtime) -> Option<(String, contexture_store::PgStore)> {
    let url = pg_url();
    let schema = unique("ctx_scale");
    match runtime.block_on(contexture_store::PgStore::open_in_schema(&url, &schema)) {
        Ok(store) => {
            let separator = if url.contains('?') { '&' } else { '?' };
            Some((
                format!("{url}{separator}options=-csearch_path%3D{schema}"),
                store,
            ))
        }
        Err(error) => {
            if in_ci() {
                panic!("CI=true and PostgreSQL at {url} is unreachable: {error}");
            }
            eprintln!("\n!!! SKIPPING the scale-out test: {url} is unreachable ({error}).\n");
            None
        }
    }
}

/// The calls the provider received for `input`'s run, by the step they were for.
fn calls_per_step(upstream: &FakeUpstream, input: &str) -> [usize; 3] {
    let mut counts = [0; 3];
    for request in upstream.calls() {
        let messages = request.messages();
        if !messages.iter().any(|(_, text)| text == input) {
            continue;
        }
        let last_user = messages
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map(|(_, text)| text.as_str())
            .unwrap_or_default();
        if let Some(step) = STEPS.iter().position(|step| last_user == *step) {
            counts[step] += 1;
        }
    }
    counts
}

/// Which of `servers` holds the run: the one whose log names the node the queue shows.
fn holder(servers: &[Server], status: &Value) -> Option<usize> {
    let node = status["queue"]["node"].as_str()?;
    servers
        .iter()
        .position(|server| server.stderr().contains(node))
}

fn start_server(db: &str, upstream: &str, config: &str) -> Server {
    Server::start_with(db, upstream, "sk-test", &[("CONTEXTURE_CONFIG", config)])
}

#[test]
fn runs_survive_their_server_being_killed_mid_step_twenty_times() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = write_file(
        &dir,
        "server.toml",
        format!("[executions]\nlease_secs = {LEASE_SECS}\nclaim_interval_secs = 0.2\n"),
    );
    let upstream = start_upstream(&runtime);
    upstream.otherwise(|number, _| Reply::text(format!("reply {number}")).after(CALL_TIME));
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let mut servers: Vec<Server> = (0..3).map(|_| start_server(&db, &base, &config)).collect();

    let mut slowest = Duration::ZERO;
    for round in 1..=20 {
        let id = format!("run-{round}");
        let input = format!("input of {id}");
        let body = json!({"workflow_yaml": WORKFLOW, "id": id, "input": input}).to_string();
        let (head, answer) =
            servers[round % 3].request("POST", "/v1/executions", &key, Some(&body));
        assert!(head.starts_with("HTTP/1.1 202"), "{head}\n{answer}");

        // Wait until the second step's call is in flight.
        let deadline = Instant::now() + Duration::from_secs(60);
        while calls_per_step(&upstream, &input)[1] == 0 {
            assert!(Instant::now() < deadline, "{id}: step two never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = servers[0].get_json(&format!("/v1/executions/{id}"), &key);
        let held_by = holder(&servers, &status)
            .unwrap_or_else(|| panic!("{id}: no server holds it: {status}"));
        let killed_at = Instant::now();
        let log = servers[held_by].kill();
        assert!(
            log.contains(&format!("acme/{id}")),
            "{id}: the holder's log:\n{log}"
        );

        // Another server takes it over and completes it.
        let survivor = &servers[(held_by + 1) % 3];
        let status = loop {
            let status = survivor.get_json(&format!("/v1/executions/{id}"), &key);
            if !matches!(status["status"].as_str(), Some("running" | "queued")) {
                break status;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs_f64(LEASE_SECS + 10.0 + 30.0),
                "{id}: never completed after its server was killed: {status}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = killed_at.elapsed();
        slowest = slowest.max(took);
        assert_eq!(status["status"], "completed", "{id}: {status}");
        assert_eq!(status["queue"]["state"], "finished", "{id}: {status}");
        assert_eq!(status["queue"]["outcome"], "completed", "{id}: {status}");
        assert_eq!(status["queue"]["adopted"], true, "{id}: {status}");
        assert!(
            took < Duration::from_secs_f64(LEASE_SECS + 10.0),
            "{id}: completed {took:?} after its server was killed (lease {LEASE_SECS} s)"
        );
        // The finished step ran once; the one in flight at most twice; the last once.
        let calls = calls_per_step(&upstream, &input);
        assert_eq!(calls[0], 1, "{id}: step one's calls: {calls:?}");
        assert!(
            (1..=2).contains(&calls[1]),
            "{id}: step two's calls: {calls:?}"
        );
        assert_eq!(calls[2], 1, "{id}: step three's calls: {calls:?}");
        // The interrupted step shows without an output; every state finished once.
        let finished: Vec<&str> = status["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|step| step.get("output").is_some())
            .filter_map(|step| step["state_id"].as_str())
            .collect();
        assert_eq!(finished, ["one", "two", "three"], "{id}: {status}");
        assert_eq!(
            status["output"],
            format!("reply {}", upstream.call_count()),
            "{id}: {status}"
        );

        // A new server takes the killed one's place.
        servers[held_by] = start_server(&db, &base, &config);
    }
    eprintln!("slowest takeover: {slowest:?} (lease {LEASE_SECS} s)");
    for mut server in servers {
        server.stop();
    }
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}
