//! Python clients nobody here wrote (the `openai` and `openai-agents` packages, pinned and
//! installed by `.ci/run`) driving `contexture serve` through a script of `tests/python/`.

use std::process::{Command, Stdio};

use serde_json::Value;

use super::root;
use super::serving::{Server, under_ci};

/// True when `python3` can import `module`. When it cannot, the test `test` fails under CI
/// (`CI=true`), naming the pinned package to install (`package`, e.g. `openai==3.57.0`);
/// elsewhere it says loudly that it skipped, and the caller returns.
pub fn has_package(test: &str, module: &str, package: &str) -> bool {
    let import = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .output();
    let problem = match import {
        Ok(output) if output.status.success() => return true,
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        Err(error) => format!("cannot run python3: {error}"),
    };
    let advice = format!("install it with: python3 -m pip install '{package}' (as .ci/run does)");
    assert!(
        !under_ci(),
        "{test}: the Python module `{module}` is missing under CI ({problem}); {advice}"
    );
    eprintln!(
        "\n\n*** SKIPPED {test}: the Python module `{module}` is missing ({problem}); {advice} ***\n\n"
    );
    false
}

/// Runs `tests/python/<script>` against `server` with the tenant's `key` (as
/// `CONTEXTURE_BASE_URL` and `CONTEXTURE_API_KEY`) and `env`, and reads the one JSON object it
/// prints; fails with the script's output and the server's log when it does not succeed.
pub fn run_script(script: &str, server: &Server, key: &str, env: &[(&str, &str)]) -> Value {
    let script = root().join("tests/python").join(script);
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .env(
            "CONTEXTURE_BASE_URL",
            format!("http://{}/v1", server.address),
        )
        .env("CONTEXTURE_API_KEY", key)
        .envs(env.iter().copied())
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY");
    summary(command, &script.display().to_string(), || {
        format!("server log:\n{}", server.stderr())
    })
}

/// Runs a Python client (`command`, from the repository's root, no standard input) and
/// reads the one JSON object it prints; fails naming `client`, with its output and what
/// `log` gives then (a server's log), when it does not succeed.
pub fn summary(mut command: Command, client: &str, log: impl FnOnce() -> String) -> Value {
    let output = command
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!(
            "{client} failed ({}):\n{stderr}\n{stdout}\n{}",
            output.status,
            log()
        );
    }
    serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("{client}'s summary is not JSON ({error}): {stdout}"))
}
