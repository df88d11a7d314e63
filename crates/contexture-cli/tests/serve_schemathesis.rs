//! Schema-based fuzzing of `contexture serve` with Schemathesis (PyPI `schemathesis`,
//! installed by `.ci/run`): every operation of the served OpenAPI document, with a fixed seed,
//! every check (no server error, every status and body as documented, schema-invalid input
//! refused and schema-valid input accepted, stateful sequences), against the real binary over
//! SQLite with a local fake upstream. The server must still be healthy afterwards, and its log
//! must hold no panic.
//!
//! Under CI (`CI=true`) a missing `schemathesis` fails the test; elsewhere the test says
//! loudly that it skipped.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Instant;

use common::root;
use common::serving::{Server, create_key, start_upstream, under_ci};
use contexture_store::testing::TempDir;

/// The seed, so a failure found once is found again.
const SEED: &str = "20261125";
/// Examples per operation and phase.
const EXAMPLES: &str = "100";

fn schemathesis_available() -> Result<(), String> {
    match Command::new("schemathesis")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        Err(error) => Err(format!("cannot run schemathesis: {error}")),
    }
}

#[test]
fn schemathesis_finds_nothing_wrong_with_the_served_document() {
    if let Err(problem) = schemathesis_available() {
        assert!(
            !under_ci(),
            "CI=true and Schemathesis is missing ({problem}); .ci/run installs it"
        );
        eprintln!(
            "\n\n*** SKIPPED serve_schemathesis: Schemathesis is missing ({problem}); install it with `python3 -m pip install schemathesis` ***\n\n"
        );
        return;
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let upstream_url = start_upstream(&runtime).base_url();
    let dir = TempDir::new("contexture-schemathesis");
    let db = format!("sqlite:{}", dir.join("fuzz.db").display());
    let key = create_key(&db, "acme");
    let mut server = Server::start_with(
        &db,
        &upstream_url,
        "sk-upstream-secret",
        // The fuzzer is one client sending as fast as it can; the rate limit is tested
        // elsewhere, and here it would only turn answers into 429s.
        &[("CONTEXTURE_RATE_LIMIT", "0"), ("CONTEXTURE_LOG", "info")],
    );
    let document = format!("http://{}/openapi.json", server.address);
    let config = root().join("tests/schemathesis/schemathesis.toml");
    let output = Command::new("schemathesis")
        .current_dir(dir.path())
        .arg("--config-file")
        .arg(&config)
        .args(["run", &document, "--checks", "all", "--seed", SEED])
        // One worker: Schemathesis's workers are threads, and this machine's CPython 3.11
        // sometimes fails in them compiling its own code ("AST constructor recursion depth
        // mismatch"), a crash of the tool, not a finding.
        .args(["--max-examples", EXAMPLES, "--workers", "1"])
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&output.stdout);
    let tail: Vec<&str> = report.lines().rev().take(40).collect();
    assert!(
        output.status.success(),
        "Schemathesis found problems (seed {SEED}):\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    let health = server.get_json("/healthz", &key);
    assert_eq!(health["status"], "ok");
    let log = server.stop();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    eprintln!("serve_schemathesis took {:?}", started.elapsed());
}
