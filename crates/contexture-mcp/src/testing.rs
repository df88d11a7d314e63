//! Test support (feature `testing`): the MCP servers of the repository's tests, which the
//! Python `mcp` package runs (the reference peer).
//!
//! Under CI (`CI=true`) a missing `mcp` package fails the test that asks for it; elsewhere
//! it says loudly that the test skipped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The path of the test server `name` under the repository's `tests/mcp`.
pub fn fixture(name: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "..", "tests", "mcp", name]
        .iter()
        .collect();
    path.canonicalize()
        .unwrap_or_else(|error| panic!("the test server {name}: {error}"))
        .display()
        .to_string()
}

/// Whether `python3` can import the `mcp` package's server; under CI its absence panics.
pub fn python_mcp() -> bool {
    let imported = Command::new("python3")
        .args(["-c", "from mcp.server import MCPServer"])
        .stdin(Stdio::null())
        .output();
    let problem = match imported {
        Ok(output) if output.status.success() => return true,
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        Err(error) => format!("cannot run python3: {error}"),
    };
    let advice = "install it with: python3 -m pip install 'mcp==2.3.0' (as .ci/run does)";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the Python package `mcp` is missing under CI ({problem}); {advice}");
    }
    eprintln!("\n*** SKIPPED: the Python package `mcp` is missing ({problem}); {advice} ***\n");
    false
}

/// `tests/mcp/tools_server.py` serving streamable HTTP on a free port of 127.0.0.1, killed
/// when dropped.
pub struct HttpToolsServer {
    child: Child,
    /// Its endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl HttpToolsServer {
    /// Starts it under the server name `name` and waits until it listens.
    pub fn start(name: &str) -> HttpToolsServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("python3")
            .args([
                fixture("tools_server.py"),
                "--http".into(),
                port.to_string(),
                "--name".into(),
                name.into(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3");
        let server = HttpToolsServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the HTTP MCP server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for HttpToolsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether process `pid` runs (a zombie does not count).
pub fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// Waits up to 10 s for process `pid` to end; panics if it does not.
pub fn wait_until_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_runs(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}
