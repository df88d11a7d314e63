//! Scale-out: `contexture serve` processes on one database share one execution queue. The
//! server running an execution is killed (SIGKILL) or frozen (SIGSTOP) in the middle of a
//! step; another server takes the run over once its lease runs out and completes it from
//! its log, no finished step is run twice (the fake provider counts the calls of each
//! step), and a frozen server that wakes up writes nothing more of the run.

use std::time::{Duration, Instant};

use crate::common;

use common::serving::{Server, create_key, start_upstream};
use common::{sqlite_url, write_file};
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
    let counts = calls_per_task(upstream, input, &STEPS);
    [counts[0], counts[1], counts[2]]
}

/// The calls the provider received for `input`'s run (or its children), by the task (of
/// `tasks`) they were sent for.
fn calls_per_task(upstream: &FakeUpstream, input: &str, tasks: &[&str]) -> Vec<usize> {
    let mut counts = vec![0; tasks.len()];
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
        if let Some(step) = tasks.iter().position(|step| last_user == *step) {
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

/// Writes the servers' configuration (short leases, frequent looks at the queue) in `dir`.
fn server_config(dir: &TempDir) -> String {
    write_file(
        dir,
        "server.toml",
        format!("[executions]\nlease_secs = {LEASE_SECS}\nclaim_interval_secs = 0.2\n"),
    )
}

/// The fake provider, each call taking [`CALL_TIME`].
fn slow_upstream(runtime: &tokio::runtime::Runtime) -> FakeUpstream {
    let upstream = start_upstream(runtime);
    upstream.otherwise(|number, _| Reply::text(format!("reply {number}")).after(CALL_TIME));
    upstream
}

/// Starts run `id` (its input names it) through `server`; its input.
fn start_run(server: &Server, key: &str, id: &str) -> String {
    let input = format!("input of {id}");
    let body = json!({"workflow_yaml": WORKFLOW, "id": id, "input": input}).to_string();
    let (head, answer) = server.request("POST", "/v1/executions", key, Some(&body));
    assert!(head.starts_with("HTTP/1.1 202"), "{head}\n{answer}");
    input
}

/// Waits until the second step's call of the run of `input` is in flight.
fn wait_for_step_two(upstream: &FakeUpstream, input: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls_per_step(upstream, input)[1] == 0 {
        assert!(Instant::now() < deadline, "{input}: step two never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (through `server`) until run `id` is neither queued nor running, in its log and in
/// the queue (the server marks the queue row finished just after the log's end, so for a
/// moment the two differ), and how long that took from `stopped_at` (giving up 30 s past the
/// lease plus 10 s).
fn wait_for_end(server: &Server, key: &str, id: &str, stopped_at: Instant) -> (Value, Duration) {
    let give_up = Duration::from_secs_f64(LEASE_SECS + 10.0 + 30.0);
    loop {
        let status = server.get_json(&format!("/v1/executions/{id}"), key);
        let going = |state: &Value| matches!(state.as_str(), Some("running" | "queued"));
        if !going(&status["status"]) && !going(&status["queue"]["state"]) {
            return (status, stopped_at.elapsed());
        }
        assert!(
            stopped_at.elapsed() < give_up,
            "{id}: never ended after its server stopped: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (through `server`) until run `id` ends, at most the lease plus 10 s after
/// `stopped_at`; its status, checked: completed, taken over, every step finished once, the
/// finished steps' calls made once and the interrupted one's at most twice.
fn wait_for_takeover(
    server: &Server,
    key: &str,
    id: &str,
    upstream: &FakeUpstream,
    input: &str,
    stopped_at: Instant,
) -> (Value, Duration) {
    let limit = Duration::from_secs_f64(LEASE_SECS + 10.0);
    let (status, took) = wait_for_end(server, key, id, stopped_at);
    assert_eq!(status["status"], "completed", "{id}: {status}");
    assert_eq!(status["queue"]["state"], "finished", "{id}: {status}");
    assert_eq!(status["queue"]["outcome"], "completed", "{id}: {status}");
    assert_eq!(status["queue"]["adopted"], true, "{id}: {status}");
    assert!(
        took < limit,
        "{id}: completed {took:?} after its server stopped (lease {LEASE_SECS} s)"
    );
    let calls = calls_per_step(upstream, input);
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
    (status, took)
}

#[test]
fn runs_survive_their_server_being_killed_mid_step_twenty_times() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = server_config(&dir);
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let mut servers: Vec<Server> = (0..3).map(|_| start_server(&db, &base, &config)).collect();

    let mut slowest = Duration::ZERO;
    for round in 1..=20 {
        let id = format!("run-{round}");
        let input = start_run(&servers[round % 3], &key, &id);
        wait_for_step_two(&upstream, &input);
        let status = servers[0].get_json(&format!("/v1/executions/{id}"), &key);
        let held_by = holder(&servers, &status)
            .unwrap_or_else(|| panic!("{id}: no server holds it: {status}"));
        let killed_at = Instant::now();
        let log = servers[held_by].kill();
        assert!(
            log.contains(&format!("acme/{id}")),
            "{id}: the holder's log:\n{log}"
        );

        let survivor = &servers[(held_by + 1) % 3];
        let (status, took) = wait_for_takeover(survivor, &key, &id, &upstream, &input, killed_at);
        slowest = slowest.max(took);
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

#[test]
fn a_frozen_server_that_wakes_after_its_run_was_taken_over_writes_nothing_more_of_it() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = server_config(&dir);
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let servers: Vec<Server> = (0..2).map(|_| start_server(&db, &base, &config)).collect();

    let id = "frozen-run";
    let input = start_run(&servers[0], &key, id);
    wait_for_step_two(&upstream, &input);
    let status = servers[0].get_json(&format!("/v1/executions/{id}"), &key);
    let held_by =
        holder(&servers, &status).unwrap_or_else(|| panic!("{id}: no server holds it: {status}"));
    let frozen_at = Instant::now();
    servers[held_by].freeze(true);
    let other = &servers[1 - held_by];
    wait_for_takeover(other, &key, id, &upstream, &input, frozen_at);
    let thread = other.get_json(&format!("/v1/threads/{id}"), &key);

    // It wakes with its step's call answered and its lease long gone: the answer is not
    // written, nothing is called again, and it says why.
    servers[held_by].freeze(false);
    std::thread::sleep(Duration::from_secs_f64(LEASE_SECS));
    let after = other.get_json(&format!("/v1/threads/{id}"), &key);
    assert_eq!(after["last_seq"], thread["last_seq"], "{after}");
    let calls = calls_per_step(&upstream, &input);
    assert!(calls[1] <= 2 && calls[2] == 1, "{calls:?}");
    let log = servers[held_by].stderr();
    assert!(
        log.contains("lease"),
        "the woken server's log says its lease was lost:\n{log}"
    );
    for mut server in servers {
        server.stop();
    }
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

#[test]
fn on_sqlite_a_restarted_server_takes_up_the_runs_its_predecessor_left() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = TempDir::new("contexture-scale-out");
    let db = sqlite_url(&dir, "runs.db");
    let config = server_config(&dir);
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let mut server = start_server(&db, &base, &config);
    let id = "restarted-run";
    let input = start_run(&server, &key, id);
    wait_for_step_two(&upstream, &input);
    let killed_at = Instant::now();
    server.kill();
    let mut server = start_server(&db, &base, &config);
    wait_for_takeover(&server, &key, id, &upstream, &input, killed_at);
    server.stop();
}

#[test]
fn three_servers_together_admit_the_configured_rate_not_three_times_it() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let (rate, burst) = (20.0, 10.0);
    let config = write_file(
        &dir,
        "server.toml",
        format!("[limits]\nrequests_per_second = {rate}\nburst = {burst}\n"),
    );
    let upstream = start_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let servers: Vec<Server> = (0..3).map(|_| start_server(&db, &base, &config)).collect();
    let started = Instant::now();
    let run = Duration::from_secs(3);
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = servers
            .iter()
            .map(|server| {
                let key = &key;
                scope.spawn(move || {
                    let mut admitted = 0;
                    while started.elapsed() < run {
                        let (head, _) = server.request("GET", "/v1/threads/nope", key, None);
                        if head.starts_with("HTTP/1.1 404") {
                            admitted += 1;
                        } else {
                            assert!(head.starts_with("HTTP/1.1 429"), "{head}");
                        }
                    }
                    admitted
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = burst + rate * elapsed;
    eprintln!(
        "admitted {admitted} in {elapsed:.2} s through three servers; the limit allows {allowed:.1}"
    );
    assert!(
        (admitted as f64) <= allowed * 1.1 && (admitted as f64) >= allowed * 0.9,
        "admitted {admitted} in {elapsed:.2} s; the limit allows {allowed:.1}"
    );
    for mut server in servers {
        server.stop();
    }
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

#[test]
fn a_tenants_running_executions_stay_within_its_limit_across_three_servers() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = write_file(
        &dir,
        "server.toml",
        // No rate limit: the statuses are polled faster than the default allows one key
        // (shared by the three servers), and this test is about the running limit only.
        "[limits]\nrequests_per_second = 0.0\n\
         [executions]\nmax_running = 2\nclaim_interval_secs = 0.1\n",
    );
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let other = create_key(&db, "globex");
    let base = upstream.base_url();
    let servers: Vec<Server> = (0..3).map(|_| start_server(&db, &base, &config)).collect();
    let ids: Vec<String> = (1..=6).map(|n| format!("limited-{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        start_run(&servers[n % 3], &key, id);
    }
    // Another tenant's run is not held back by acme's.
    start_run(&servers[0], &other, "globex-run");
    let mut globex_ran = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    let statuses = loop {
        let statuses: Vec<Value> = ids
            .iter()
            .map(|id| servers[1].get_json(&format!("/v1/executions/{id}"), &key))
            .collect();
        let globex = servers[2].get_json("/v1/executions/globex-run", &other);
        globex_ran |= globex["queue"]["state"] != "queued";
        if statuses
            .iter()
            .all(|status| status["status"] == "completed")
        {
            break statuses;
        }
        assert!(
            Instant::now() < deadline,
            "the runs never all completed: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(30));
    };
    // How many ran at once, from when each was taken and finished by the database's clock
    // (statuses read one after another cannot tell: a run may end and the next start
    // between two reads).
    let spans: Vec<(i64, i64)> = statuses
        .iter()
        .map(|status| {
            let queue = &status["queue"];
            (
                queue["started_at_ms"].as_i64().expect("taken"),
                queue["finished_at_ms"].as_i64().expect("finished"),
            )
        })
        .collect();
    let most = spans
        .iter()
        .map(|(at, _)| {
            spans
                .iter()
                .filter(|(start, end)| start <= at && at < end)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert_eq!(
        most, 2,
        "at most two of acme's runs at once, and two did run at once"
    );
    assert!(globex_ran);
    for mut server in servers {
        server.stop();
    }
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

/// A TCP proxy to PostgreSQL that a test can cut (every connection through it closed, new
/// ones refused) and restore, as a network partition between a server and its database.
struct CuttableProxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl CuttableProxy {
    fn start(target: &str) -> CuttableProxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (flag, streams, target) = (cut.clone(), open.clone(), target.to_owned());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if flag.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let mut kept = streams.lock().unwrap();
                kept.push(client.try_clone().unwrap());
                kept.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        CuttableProxy { port, cut, open }
    }

    /// Cuts every connection through it and refuses new ones until restored.
    fn cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for stream in self.open.lock().unwrap().drain(..) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

#[test]
fn a_server_cut_off_from_the_database_stops_its_run_and_another_completes_it() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = server_config(&dir);
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let host = db
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(host, _)| host.to_owned())
        .expect("a host in the test database's URL");
    let proxy = CuttableProxy::start(&host);
    let proxied = db.replacen(&host, &format!("127.0.0.1:{}", proxy.port), 1);
    // The cut-off server starts alone, so that it takes the run.
    let cut_off = start_server(&proxied, &base, &config);
    let id = "partitioned-run";
    let input = start_run(&cut_off, &key, id);
    wait_for_step_two(&upstream, &input);
    let other = start_server(&db, &base, &config);
    let status = other.get_json(&format!("/v1/executions/{id}"), &key);
    assert!(
        cut_off
            .stderr()
            .contains(status["queue"]["node"].as_str().unwrap()),
        "the cut-off server holds the run: {status}"
    );
    let cut_at = Instant::now();
    proxy.cut(true);
    wait_for_takeover(&other, &key, id, &upstream, &input, cut_at);
    let thread = other.get_json(&format!("/v1/threads/{id}"), &key);
    let log = cut_off.stderr();
    assert!(
        [
            "could not be renewed in time",
            "lease was refused",
            "a run stopped on a database error"
        ]
        .iter()
        .any(|said| log.contains(said)),
        "the cut-off server stopped the run when its lease was lost:\n{log}"
    );

    // The network comes back: the cut-off server reconnects by itself and writes nothing
    // more of the run.
    proxy.cut(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (head, body) = cut_off.request("GET", &format!("/v1/threads/{id}"), &key, None);
        if head.starts_with("HTTP/1.1 200") {
            let after: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(after["last_seq"], thread["last_seq"], "{after}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never reconnected: {head}\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls = calls_per_step(&upstream, &input);
    assert!(calls[1] <= 2 && calls[2] == 1, "{calls:?}");
    drop((cut_off, other));
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

/// A PostgreSQL cluster of the test's own (`initdb` in a temporary directory, run as the
/// `postgres` user), so that restarting it stops no other test's database.
struct PrivatePostgres {
    dir: TempDir,
    port: u16,
}

impl PrivatePostgres {
    /// Starts one; `None` (after a loud message) when this machine cannot outside CI.
    fn start() -> Option<PrivatePostgres> {
        let dir = TempDir::new("contexture-private-pg");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let owned = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .is_ok_and(|status| status.success());
        let cluster = PrivatePostgres { dir, port };
        let made = owned
            && cluster
                .as_postgres(&["initdb", "-A", "trust", "-U", "postgres", "-D"], &[])
                .is_ok_and(|status| status.success());
        if !made || !cluster.ctl("start") {
            if in_ci() {
                panic!("CI=true and a private PostgreSQL cluster cannot be started here");
            }
            eprintln!("\n!!! SKIPPING the PostgreSQL restart test: no private cluster here.\n");
            return None;
        }
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// Runs `program ARGS DATA MORE` as the `postgres` user.
    fn as_postgres(
        &self,
        program_and_args: &[&str],
        more: &[&str],
    ) -> std::io::Result<std::process::ExitStatus> {
        std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .args(program_and_args)
            .arg(self.data())
            .args(more)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
    }

    /// `pg_ctl ACTION` (start, stop, restart), waiting for it.
    fn ctl(&self, action: &str) -> bool {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.join("log").display().to_string();
        self.as_postgres(
            &["pg_ctl", "-w", "-m", "fast", "-D"],
            &[action, "-o", &options, "-l", &log],
        )
        .is_ok_and(|status| status.success())
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.ctl("stop");
    }
}

#[test]
fn postgres_restarted_under_load_loses_no_acknowledged_write_and_runs_resume() {
    let Some(postgres) = PrivatePostgres::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let db = postgres.url();
    let dir = TempDir::new("contexture-scale-out");
    // No rate limit: the writers go as fast as the servers answer.
    let config = write_file(
        &dir,
        "server.toml",
        format!(
            "[limits]\nrequests_per_second = 0.0\n[executions]\nlease_secs = {LEASE_SECS}\nclaim_interval_secs = 0.2\n"
        ),
    );
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let servers: Vec<Server> = (0..2).map(|_| start_server(&db, &base, &config)).collect();
    let id = "restart-run";
    let input = start_run(&servers[0], &key, id);
    wait_for_step_two(&upstream, &input);

    // Two writers append through the two servers while the database restarts.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (acknowledged, after_restart) = std::thread::scope(|scope| {
        let writers: Vec<_> = servers
            .iter()
            .enumerate()
            .map(|(n, server)| {
                let (key, stop) = (&key, &stop);
                scope.spawn(move || {
                    let mut acknowledged = Vec::new();
                    let mut refused_since: Option<Instant> = None;
                    let mut last_refusal = String::new();
                    let mut count = 0;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        count += 1;
                        let text = format!("m-{n}-{count}");
                        let body = json!({"messages": [{"role": "user", "content": text}]});
                        let (head, _) = server.request(
                            "POST",
                            &format!("/v1/threads/load-{n}/messages"),
                            key,
                            Some(&body.to_string()),
                        );
                        if head.starts_with("HTTP/1.1 200") {
                            acknowledged.push((n, text));
                            refused_since = None;
                        } else {
                            refused_since.get_or_insert_with(Instant::now);
                            last_refusal = head;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                    if refused_since.is_some() {
                        eprintln!("writer {n} still refused: {last_refusal}");
                    }
                    (acknowledged, refused_since.is_none())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(800));
        assert!(postgres.ctl("restart"), "pg_ctl restart failed");
        // Writes go on after the restart: the servers reconnect by themselves.
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut acknowledged = Vec::new();
        let mut writing_again = true;
        for writer in writers {
            let (written, again) = writer.join().unwrap();
            acknowledged.extend(written);
            writing_again &= again;
        }
        (acknowledged, writing_again)
    });
    assert!(
        after_restart,
        "a server did not write again after the restart"
    );
    // Every acknowledged append is there.
    for n in 0..2 {
        let mut stored = String::new();
        let mut after = 0;
        loop {
            let page = servers[0].get_json(
                &format!("/v1/threads/load-{n}/events?after={after}&limit=1000"),
                &key,
            );
            stored.push_str(&page.to_string());
            match page["next_after"].as_u64() {
                Some(next) if next > after => after = next,
                _ => break,
            }
        }
        for (_, text) in acknowledged.iter().filter(|(writer, _)| *writer == n) {
            assert!(
                stored.contains(&format!("\"{text}\"")),
                "acknowledged append {text} is missing"
            );
        }
    }
    assert!(
        acknowledged.len() > 20,
        "too few appends: {}",
        acknowledged.len()
    );
    // The run resumes and completes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = servers[1].get_json(&format!("/v1/executions/{id}"), &key);
        if !matches!(status["status"].as_str(), Some("running" | "queued")) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the run never completed: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["status"], "completed", "{status}");
    let calls = calls_per_step(&upstream, &input);
    assert!(
        calls[0] == 1 && (1..=2).contains(&calls[1]) && calls[2] == 1,
        "{calls:?}"
    );
    eprintln!(
        "{} appends acknowledged through a restart of PostgreSQL",
        acknowledged.len()
    );
    drop(servers);
}

#[test]
fn a_server_shutting_down_hands_its_runs_over_without_waiting_for_their_leases() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    // A long lease: a takeover that waited for it would take half a minute.
    let config = write_file(
        &dir,
        "server.toml",
        "[executions]\nlease_secs = 30.0\nclaim_interval_secs = 0.2\n",
    );
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let mut leaving = start_server(&db, &base, &config);
    let id = "handed-over";
    let input = start_run(&leaving, &key, id);
    wait_for_step_two(&upstream, &input);
    let staying = start_server(&db, &base, &config);
    let stopped_at = Instant::now();
    let log = leaving.stop();
    assert!(
        log.contains("released a run for another server to take over"),
        "{log}"
    );
    // Within the test's limit (the lease it did not wait for plus 10 s), and well within
    // the 30 s lease.
    let (_, took) = wait_for_takeover(&staying, &key, id, &upstream, &input, stopped_at);
    assert!(took < Duration::from_secs(10), "taken over after {took:?}");
    drop(staying);
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}

#[test]
fn a_sub_workflow_running_when_its_server_dies_is_taken_over_with_its_parent() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let Some((db, store)) = fresh_schema(&runtime) else {
        return;
    };
    let dir = TempDir::new("contexture-scale-out");
    let config = server_config(&dir);
    let workflows = dir.join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(
        workflows.join("child.yaml"),
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: c1, assistant_id: a, task: child-one, next: {state_id: c2}}\n  - {id: c2, assistant_id: a, task: child-two, next: {end: true}}\n",
    )
    .unwrap();
    let parent = "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: sub, workflow: child.yaml, next: {state_id: after}}\n  - {id: after, assistant_id: a, task: parent-after, next: {end: true}}\n";
    let upstream = slow_upstream(&runtime);
    let key = create_key(&db, "acme");
    let base = upstream.base_url();
    let workflows_dir = workflows.display().to_string();
    let start = || {
        Server::start_with(
            &db,
            &base,
            "sk-test",
            &[
                ("CONTEXTURE_CONFIG", config.as_str()),
                ("CONTEXTURE_WORKFLOWS_DIR", workflows_dir.as_str()),
            ],
        )
    };
    let mut servers: Vec<Server> = (0..2).map(|_| start()).collect();
    let id = "parent-run";
    let input = format!("input of {id}");
    let body = json!({"workflow_yaml": parent, "id": id, "input": input}).to_string();
    let (head, answer) = servers[0].request("POST", "/v1/executions", &key, Some(&body));
    assert!(head.starts_with("HTTP/1.1 202"), "{head}\n{answer}");
    let tasks = ["child-one", "child-two", "parent-after"];
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls_per_task(&upstream, &input, &tasks)[1] == 0 {
        assert!(
            Instant::now() < deadline,
            "the child's second step never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = servers[0].get_json(&format!("/v1/executions/{id}"), &key);
    let held_by =
        holder(&servers, &status).unwrap_or_else(|| panic!("no server holds it: {status}"));
    let killed_at = Instant::now();
    servers[held_by].kill();
    let other = &servers[1 - held_by];
    let (status, took) = wait_for_end(other, &key, id, killed_at);
    assert!(
        took < Duration::from_secs_f64(LEASE_SECS + 10.0),
        "completed {took:?} after its server was killed: {status}"
    );
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["queue"]["adopted"], true, "{status}");
    let calls = calls_per_task(&upstream, &input, &tasks);
    assert_eq!(calls[0], 1, "the child's finished step ran once: {calls:?}");
    assert!((1..=2).contains(&calls[1]), "{calls:?}");
    assert_eq!(calls[2], 1, "{calls:?}");
    let child = status["children"][0].as_str().expect("a child").to_owned();
    let child_status = other.get_json(&format!("/v1/executions/{child}"), &key);
    assert_eq!(child_status["status"], "completed", "{child_status}");
    for server in &mut servers {
        server.stop();
    }
    runtime
        .block_on(store.drop_schema())
        .expect("drop the test schema");
}
