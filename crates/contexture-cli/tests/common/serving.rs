//! `contexture serve` as a child process, for tests that use it as a client would: started on
//! a free port, its stderr collected, stopped with SIGTERM when dropped; and the fake upstream
//! it forwards chat to.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contexture_fake_upstream::{FakeUpstream, Reply};
use serde_json::Value;

use super::{RunToEnd, contexture};

/// `CI` set to anything but empty, `0` or `false`: a missing tool fails a test instead of
/// skipping it.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

/// Starts the fake upstream on `runtime`: the Nth call is answered `reply N`, or, when it
/// asks for a stream, `streamed reply N` in three pieces (`streamed`, ` reply`, ` N`) and
/// without usage.
pub fn start_upstream(runtime: &tokio::runtime::Runtime) -> FakeUpstream {
    let upstream = FakeUpstream::start_on(runtime);
    upstream.otherwise(|number, request| {
        if request.wants_stream() {
            Reply::text_in_pieces([
                "streamed".to_owned(),
                " reply".to_owned(),
                format!(" {number}"),
            ])
            .no_usage()
        } else {
            Reply::text(format!("reply {number}"))
        }
    });
    upstream
}

/// A running `contexture serve`; stopped (SIGTERM, then SIGKILL) when dropped, also when the
/// test panics.
pub struct Server {
    child: Child,
    /// `HOST:PORT`.
    pub address: String,
    /// Everything it wrote on stderr so far.
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts `contexture serve` on a free port over `db`, forwarding chat to `upstream`
    /// with `upstream_key`, with debug logs from every crate.
    pub fn start(db: &str, upstream: &str, upstream_key: &str) -> Server {
        Server::start_with(db, upstream, upstream_key, &[])
    }

    /// [`Server::start`] with more environment variables (`CONTEXTURE_RATE_LIMIT`, ...).
    pub fn start_with(
        db: &str,
        upstream: &str,
        upstream_key: &str,
        env: &[(&str, &str)],
    ) -> Server {
        let mut child = contexture(["serve", "--db", db, "--bind", "127.0.0.1:0"])
            .env("CONTEXTURE_UPSTREAM_URL", upstream)
            .env("CONTEXTURE_UPSTREAM_KEY", upstream_key)
            // Debug logs from every crate: the upstream key must not show even there.
            .env("CONTEXTURE_LOG", "debug")
            .env_remove("CONTEXTURE_BIND")
            .env_remove("CONTEXTURE_ANONYMOUS_TENANT")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::null())
            .envs(env.iter().copied())
            .spawn()
            .expect("start contexture serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (listening, bound) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        let log = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(address) = line.strip_prefix("listening on http://") {
                    let _ = listening.send(address.trim().to_owned());
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut server = Server {
            child,
            address: String::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        };
        match bound.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => server.address = address,
            Err(_) => panic!(
                "contexture serve did not print `listening on` (exit: {:?}); stderr:\n{}",
                server.child.try_wait(),
                server.stderr()
            ),
        }
        server
    }

    /// What it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Stops the server and returns its whole stderr.
    pub fn stop(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_none() {
            #[cfg(unix)]
            // SAFETY: a plain signal to the child this test started.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        self.stderr()
    }

    /// Kills the server at once (SIGKILL: nothing of it runs after, as when its machine
    /// dies) and returns its whole stderr.
    pub fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        self.stderr()
    }

    /// Stops (`SIGSTOP`) or continues (`SIGCONT`) the server's process, as a machine that
    /// hangs and comes back would.
    #[cfg(unix)]
    pub fn freeze(&self, frozen: bool) {
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: a plain signal to the child this test started.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// `GET path` with the key; the JSON body of a 200.
    pub fn get_json(&self, path: &str, key: &str) -> Value {
        let (head, body) = self.request("GET", path, key, None);
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "GET {path}: {head}\n\n{body}"
        );
        serde_json::from_str(&body).unwrap_or_else(|error| panic!("GET {path}: {error}: {body}"))
    }

    /// `METHOD path` with the key and an optional JSON body; the response's head and body
    /// (de-chunked).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<&str>,
    ) -> (String, String) {
        self.request_with_host(method, path, key, &self.address, body.unwrap_or(""))
    }

    /// [`Server::request`] with `host` in the `Host` header (an MCP request also accepts
    /// server-sent events).
    pub fn request_with_host(
        &self,
        method: &str,
        path: &str,
        key: &str,
        host: &str,
        body: &str,
    ) -> (String, String) {
        let mut stream = TcpStream::connect(&self.address).expect("connect to the server");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let authorization = if key.is_empty() {
            String::new()
        } else {
            format!("Authorization: Bearer {key}\r\n")
        };
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let response = String::from_utf8(response).expect("a UTF-8 response");
        let (head, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_owned()
        };
        (head.to_owned(), body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `Transfer-Encoding: chunked` body, joined.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// Creates an API key for `tenant` in `db` with `contexture keys create`; the key.
pub fn create_key(db: &str, tenant: &str) -> String {
    let created = contexture([
        "keys", "create", "--tenant", tenant, "--name", "test", "--db", db,
    ])
    .run()
    .expect_success();
    let key = created.trim().to_owned();
    assert!(key.starts_with("ctx_"), "not a key: {key}");
    key
}
