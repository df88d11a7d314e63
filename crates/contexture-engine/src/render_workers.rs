//! Template renders in worker processes whose memory and time are bounded.
//!
//! A server renders the templates and expressions of a workflow a client sent here: each
//! render is sent to a worker process (the `contexture` binary's `template-worker` command),
//! which limits its own address space before it reads a job, runs the ordinary in-process
//! render, and answers. A render that needs more memory than the limit ends its worker (the
//! allocation fails and the process aborts); one that runs past the time limit has its worker
//! killed. Either way the render fails with the limit named and the server goes on: no
//! template can take the server's memory or a thread of it, whatever it builds.
//!
//! Workers are reused: one that answered goes back to a small idle pool. A job and its answer
//! are single JSON lines on the worker's standard input and output; a render that asks for a
//! fresh id (`uuid`) asks the caller for it on the same lines, so ids come from the caller's
//! source.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contexture_core::context::isolation::run_job;
use contexture_core::context::{
    IdSource, IsolationFailure, JobOutcome, RenderIsolation, RenderJob,
};
use serde::{Deserialize, Serialize};

/// How to start a worker: a program and its arguments (for `contexture`, its own path and
/// `template-worker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// The bounds of renders: each one's memory and time, and how many run at once (so the
/// workers together hold at most `max_workers` times `max_memory_bytes`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerLimits {
    /// The most address space a worker may map, in bytes (its heap, stack and code).
    pub max_memory_bytes: u64,
    /// The longest one render may take, waiting for a free worker included.
    pub max_duration: Duration,
    /// The most workers alive at once; a render waits for a free one.
    pub max_workers: usize,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            max_duration: DEFAULT_MAX_DURATION,
            max_workers: DEFAULT_MAX_WORKERS,
        }
    }
}

/// Default number of workers alive at once.
pub const DEFAULT_MAX_WORKERS: usize = 4;

/// Default memory of a worker: 1 GiB, room for the largest context a render is given plus
/// the data fuel lets one render create (about 64 MB) many times over.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 1024 * 1024 * 1024;

/// Default time of one render: fuel stops an ordinary runaway loop well within a second.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(5);

/// What the caller sends a worker, one JSON line each.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ToWorker<J> {
    /// First line: the worker's limit, applied before anything else is read.
    Setup { max_memory_bytes: u64 },
    /// A render to run.
    Job(J),
    /// The id a `NeedId` asked for.
    Id([u8; 16]),
}

/// What a worker answers, one JSON line each.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FromWorker {
    /// The running render wants a fresh id.
    NeedId,
    /// The render's outcome.
    Outcome(JobOutcome),
}

/// Worker processes that run render jobs, reused between renders.
pub struct RenderWorkers {
    command: WorkerCommand,
    limits: WorkerLimits,
    pool: Mutex<Pool>,
    /// Signalled when a worker goes back to the pool or ends.
    freed: Condvar,
}

/// The workers not rendering now, and how many are alive in all.
#[derive(Default)]
struct Pool {
    idle: Vec<Worker>,
    alive: usize,
}

/// A worker lent to one render: it goes back to the pool when the render gave an outcome,
/// and is ended (freeing its place) otherwise.
struct Lease<'a> {
    workers: &'a RenderWorkers,
    worker: Option<Worker>,
    healthy: bool,
}

impl Lease<'_> {
    fn worker(&mut self) -> &mut Worker {
        self.worker
            .as_mut()
            .expect("a lease holds its worker until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        let mut pool = self.workers.pool();
        if self.healthy {
            pool.idle.push(worker);
        } else {
            pool.alive -= 1;
            drop(pool);
            // Ended outside the lock: killing and reaping can take a moment.
            drop(worker);
        }
        self.workers.freed.notify_one();
    }
}

impl std::fmt::Debug for RenderWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderWorkers")
            .field("command", &self.command)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl RenderWorkers {
    /// Workers started with `command`, each render held to `limits`. No worker starts until
    /// the first render.
    pub fn new(command: WorkerCommand, limits: WorkerLimits) -> RenderWorkers {
        RenderWorkers {
            command,
            limits,
            pool: Mutex::new(Pool::default()),
            freed: Condvar::new(),
        }
    }

    /// Starts one worker and runs a trivial render on it: the check a server makes at
    /// startup that its workers can start at all.
    pub fn check(&self) -> Result<(), IsolationFailure> {
        let job = RenderJob::Evaluate {
            expression: "true".to_owned(),
            store: Default::default(),
            output: None,
            value_wanted: false,
        };
        match self.run(&job, &contexture_core::context::FixedIds::default())? {
            JobOutcome::Evaluated(Ok(evaluated)) if evaluated.truthy => Ok(()),
            other => Err(IsolationFailure {
                message: format!("a template worker answered a trivial render with {other:?}"),
            }),
        }
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle worker, or a new one while fewer than the limit are alive, or (waiting until
    /// `deadline`) the next one freed.
    fn lease(&self, deadline: Instant) -> Result<Lease<'_>, IsolationFailure> {
        let mut pool = self.pool();
        loop {
            if let Some(worker) = pool.idle.pop() {
                return Ok(Lease {
                    workers: self,
                    worker: Some(worker),
                    healthy: false,
                });
            }
            if pool.alive < self.limits.max_workers.max(1) {
                pool.alive += 1;
                drop(pool);
                return match Worker::start(&self.command, self.limits.max_memory_bytes) {
                    Ok(worker) => Ok(Lease {
                        workers: self,
                        worker: Some(worker),
                        healthy: false,
                    }),
                    Err(failure) => {
                        self.pool().alive -= 1;
                        self.freed.notify_one();
                        Err(failure)
                    }
                };
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(IsolationFailure {
                    message: format!(
                        "it waited for one of the {} template workers as long as a render may \
                         take ({} s)",
                        self.limits.max_workers,
                        self.limits.max_duration.as_secs_f64()
                    ),
                });
            }
            pool = self
                .freed
                .wait_timeout(pool, wait)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    fn memory_mib(&self) -> u64 {
        self.limits.max_memory_bytes / (1024 * 1024)
    }
}

impl RenderIsolation for RenderWorkers {
    fn run(&self, job: &RenderJob, ids: &dyn IdSource) -> Result<JobOutcome, IsolationFailure> {
        let deadline = Instant::now() + self.limits.max_duration;
        let mut lease = self.lease(deadline)?;
        lease.worker().send(&ToWorker::Job(job))?;
        loop {
            match lease.worker().receive(deadline) {
                Received::Message(FromWorker::NeedId) => {
                    lease.worker().send(&ToWorker::<()>::Id(ids.next_id()))?;
                }
                Received::Message(FromWorker::Outcome(outcome)) => {
                    lease.healthy = true;
                    return Ok(outcome);
                }
                Received::TimedOut => {
                    return Err(IsolationFailure {
                        message: format!(
                            "it ran longer than a render may ({} s)",
                            self.limits.max_duration.as_secs_f64()
                        ),
                    });
                }
                Received::Garbled(line) => {
                    return Err(IsolationFailure {
                        message: format!("its worker answered something unreadable: {line:.200}"),
                    });
                }
                Received::Ended => {
                    let status = lease.worker().finish();
                    return Err(IsolationFailure {
                        message: if ended_out_of_memory(status) {
                            format!(
                                "it needed more memory than a render may use ({} MiB)",
                                self.memory_mib()
                            )
                        } else {
                            format!("its worker stopped unexpectedly ({})", describe(status))
                        },
                    });
                }
            }
        }
    }
}

/// One worker process: its input, and its output lines as they arrive.
struct Worker {
    child: Child,
    input: ChildStdin,
    lines: Receiver<String>,
}

/// What reading a worker's next line gave.
enum Received {
    Message(FromWorker),
    Garbled(String),
    TimedOut,
    Ended,
}

impl Worker {
    fn start(command: &WorkerCommand, max_memory_bytes: u64) -> Result<Worker, IsolationFailure> {
        // The worker learns nothing of this process: no environment (where secrets live),
        // no working directory of interest, no terminal.
        let mut child = Command::new(&command.program)
            .args(&command.args)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| IsolationFailure {
                message: format!(
                    "cannot start a template worker ({}): {error}",
                    command.program.display()
                ),
            })?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(IsolationFailure {
                message: "a template worker started without its pipes".to_owned(),
            });
        };
        let (sender, lines) = mpsc::channel();
        // The output is read on its own thread so that waiting for it can time out.
        std::thread::Builder::new()
            .name("template-worker-output".to_owned())
            .spawn(move || {
                for line in BufReader::new(output).lines() {
                    let Ok(line) = line else { break };
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|error| IsolationFailure {
                message: format!("cannot read a template worker's output: {error}"),
            })?;
        let mut worker = Worker {
            child,
            input,
            lines,
        };
        worker.send(&ToWorker::<()>::Setup { max_memory_bytes })?;
        Ok(worker)
    }

    fn send<J: Serialize>(&mut self, message: &ToWorker<J>) -> Result<(), IsolationFailure> {
        let mut line = serde_json::to_vec(message).map_err(|error| IsolationFailure {
            message: format!("cannot write a render job: {error}"),
        })?;
        line.push(b'\n');
        self.input
            .write_all(&line)
            .and_then(|()| self.input.flush())
            .map_err(|error| IsolationFailure {
                message: format!("cannot send a render to its worker: {error}"),
            })
    }

    fn receive(&mut self, deadline: Instant) -> Received {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(line) => match serde_json::from_str(&line) {
                Ok(message) => Received::Message(message),
                Err(_) => Received::Garbled(line),
            },
            Err(RecvTimeoutError::Timeout) => Received::TimedOut,
            Err(RecvTimeoutError::Disconnected) => Received::Ended,
        }
    }

    /// Ends the worker (if it still runs) and reports how it ended.
    fn finish(&mut self) -> Option<std::process::ExitStatus> {
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker dropped mid-render (timed out, garbled) or from the idle pool is ended and
        // reaped, never left running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a worker ended the way a failed allocation ends it: an abort.
fn ended_out_of_memory(status: Option<std::process::ExitStatus>) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        // SIGABRT, 6 on every Unix.
        const SIGABRT: i32 = 6;
        status.and_then(|status| status.signal()) == Some(SIGABRT)
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

fn describe(status: Option<std::process::ExitStatus>) -> String {
    status.map_or_else(
        || "its status is unknown".to_owned(),
        |status| status.to_string(),
    )
}

/// Runs this process as a template worker: reads the setup line and applies its memory
/// limit, then answers render jobs from `input` on `output` until `input` ends. The
/// `template-worker` command of the `contexture` binary.
pub fn serve_worker(
    input: impl BufRead + Send + 'static,
    output: impl Write + Send + 'static,
) -> Result<(), WorkerError> {
    let pipe = Arc::new(Mutex::new(Pipe {
        input: Box::new(input),
        output: Box::new(output),
    }));
    match read_message(&pipe)? {
        Some(ToWorker::Setup { max_memory_bytes }) => limit_memory(max_memory_bytes)?,
        _ => {
            return Err(WorkerError::Protocol(
                "the first line must be the setup".into(),
            ));
        }
    }
    let ids: Arc<dyn IdSource> = Arc::new(AskedIds { pipe: pipe.clone() });
    loop {
        match read_message(&pipe)? {
            None => return Ok(()),
            Some(ToWorker::Job(job)) => {
                let outcome = run_job(job, ids.clone());
                write_message(&pipe, &FromWorker::Outcome(outcome))?;
            }
            Some(_) => return Err(WorkerError::Protocol("expected a render job".into())),
        }
    }
}

/// Why a worker stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Its input or output failed.
    #[error("template worker input or output failed: {0}")]
    Io(#[from] std::io::Error),
    /// A line was not what the protocol allows there.
    #[error("template worker protocol error: {0}")]
    Protocol(String),
    /// The memory limit could not be applied.
    #[error("cannot limit the template worker's memory: {0}")]
    Limit(String),
}

struct Pipe {
    input: Box<dyn BufRead + Send>,
    output: Box<dyn Write + Send>,
}

fn read_message(pipe: &Mutex<Pipe>) -> Result<Option<ToWorker<RenderJob>>, WorkerError> {
    let mut pipe = pipe.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut line = String::new();
    if pipe.input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line)
        .map(Some)
        .map_err(|error| WorkerError::Protocol(format!("unreadable line: {error}")))
}

fn write_message(pipe: &Mutex<Pipe>, message: &FromWorker) -> Result<(), WorkerError> {
    let mut pipe = pipe.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut line = serde_json::to_vec(message)
        .map_err(|error| WorkerError::Protocol(format!("cannot write an answer: {error}")))?;
    line.push(b'\n');
    pipe.output.write_all(&line)?;
    pipe.output.flush()?;
    Ok(())
}

/// Ids asked of the caller, over the worker's own lines.
struct AskedIds {
    pipe: Arc<Mutex<Pipe>>,
}

impl IdSource for AskedIds {
    fn next_id(&self) -> [u8; 16] {
        let answer =
            write_message(&self.pipe, &FromWorker::NeedId).and_then(|()| read_message(&self.pipe));
        match answer {
            Ok(Some(ToWorker::Id(id))) => id,
            // The caller broke the protocol or went away: nothing sensible is left to do.
            _ => std::process::exit(3),
        }
    }
}

#[cfg(unix)]
fn limit_memory(max_memory_bytes: u64) -> Result<(), WorkerError> {
    use rlimit::Resource;
    Resource::AS
        .set(max_memory_bytes, max_memory_bytes)
        .map_err(|error| WorkerError::Limit(error.to_string()))?;
    // A worker that runs out of memory aborts: no core file of a client's template.
    Resource::CORE
        .set(0, 0)
        .map_err(|error| WorkerError::Limit(error.to_string()))
}

#[cfg(not(unix))]
fn limit_memory(_max_memory_bytes: u64) -> Result<(), WorkerError> {
    Err(WorkerError::Limit(
        "template workers need a Unix system to limit their memory".into(),
    ))
}
