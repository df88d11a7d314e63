//! What the CLI's integration tests share: the `contexture` binary as a command that ignores
//! the caller's environment, a run's outcome with the assertions every test makes on it, and
//! (in [`serving`]) `contexture serve` as a child process with a fake upstream.

#![allow(dead_code)]

pub mod python;
pub mod serving;

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use contexture_store::testing::TempDir;
use serde_json::Value;

/// The repository's root, where the binary runs, so that paths such as
/// `examples/conversation.json` resolve.
pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `contexture ARGS`, run from the repository's root with its outputs captured and no
/// standard input. The variables that would point it at another configuration, database,
/// model table or provider are removed, so the tests' results do not depend on the shell
/// they run in; a test sets any it needs after this.
pub fn contexture<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_contexture"));
    command
        .current_dir(root())
        .args(args)
        .env_remove("CONTEXTURE_CONFIG")
        .env_remove("CONTEXTURE_DB")
        .env_remove("CONTEXTURE_LLM")
        .env_remove("CONTEXTURE_MODELS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The `--db` URL of an SQLite file named `file` in `dir`.
pub fn sqlite_url(dir: &TempDir, file: &str) -> String {
    format!("sqlite:{}", dir.join(file).display())
}

/// Running a command to its end.
pub trait RunToEnd {
    /// Runs it with no input and waits for it to exit.
    fn run(&mut self) -> Outcome;

    /// Runs it with `input` on its standard input and waits for it to exit.
    fn run_with_input(&mut self, input: &[u8]) -> Outcome;
}

impl RunToEnd for Command {
    fn run(&mut self) -> Outcome {
        let output = self.output().expect("run contexture");
        Outcome::of(self, output)
    }

    fn run_with_input(&mut self, input: &[u8]) -> Outcome {
        let mut child = self
            .stdin(Stdio::piped())
            .spawn()
            .expect("start contexture");
        // A command that fails before reading its input closes the pipe (EPIPE): not an
        // error here, the exit status and stderr say what happened.
        let _ = child.stdin.take().expect("stdin").write_all(input);
        let output = child.wait_with_output().expect("wait for contexture");
        Outcome::of(self, output)
    }
}

/// What a run of the binary left: whether it succeeded and what it printed.
pub struct Outcome {
    /// The command line, for failure messages.
    pub command: String,
    /// Whether it exited with status 0.
    pub ok: bool,
    /// Its standard output, as it was.
    pub stdout: Vec<u8>,
    /// Its standard error (invalid UTF-8 replaced).
    pub stderr: String,
}

impl Outcome {
    fn of(command: &Command, output: Output) -> Outcome {
        let args: Vec<_> = command.get_args().map(OsStr::to_string_lossy).collect();
        Outcome {
            command: format!("contexture {}", args.join(" ")),
            ok: output.status.success(),
            stdout: output.stdout,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Its standard output, once it is checked that the run succeeded.
    #[track_caller]
    pub fn expect_success(&self) -> String {
        assert!(self.ok, "`{}` failed:\n{}", self.command, self.stderr);
        String::from_utf8(self.stdout.clone()).expect("UTF-8 output")
    }

    /// Its standard output as JSON, once it is checked that the run succeeded.
    #[track_caller]
    pub fn expect_json(&self) -> Value {
        let stdout = self.expect_success();
        serde_json::from_str(&stdout).unwrap_or_else(|error| {
            panic!("`{}` printed no JSON ({error}): {stdout}", self.command)
        })
    }

    /// Its standard error, once it is checked that the run failed.
    #[track_caller]
    pub fn expect_failure(&self) -> String {
        assert!(
            !self.ok,
            "`{}` succeeded; it printed:\n{}",
            self.command,
            String::from_utf8_lossy(&self.stdout)
        );
        self.stderr.clone()
    }
}

/// Writes `content` to a file named `name` in `dir`; its path, as an argument.
pub fn write_file(dir: &TempDir, name: &str, content: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write a test file");
    path.display().to_string()
}
