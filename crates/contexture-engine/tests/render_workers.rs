//! The pool of template workers, driven with small shell programs in place of the real
//! worker (the `contexture` binary's own worker is tested with the server): time limits,
//! workers that die or answer garbage, and the cap on workers alive at once.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use contexture_core::context::{FixedIds, JobOutcome, RenderIsolation, RenderJob};
use contexture_engine::render_workers::{RenderWorkers, WorkerCommand, WorkerLimits};

/// A worker that reads its setup, then answers every job after `delay` seconds with a true
/// expression.
fn answering_after(delay: &str) -> WorkerCommand {
    let script = format!(
        "read setup; while read job; do sleep {delay}; echo '{{\"outcome\":{{\"kind\":\"evaluated\",\"result\":{{\"Ok\":{{\"value\":null,\"truthy\":true}}}}}}}}'; done"
    );
    shell(&script)
}

fn shell(script: &str) -> WorkerCommand {
    WorkerCommand {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
    }
}

fn limits(seconds: f64, workers: usize) -> WorkerLimits {
    WorkerLimits {
        max_memory_bytes: 256 << 20,
        max_duration: Duration::from_secs_f64(seconds),
        max_workers: workers,
    }
}

fn job() -> RenderJob {
    RenderJob::Evaluate {
        expression: "true".into(),
        store: Default::default(),
        output: None,
        value_wanted: false,
    }
}

fn run(workers: &RenderWorkers) -> Result<JobOutcome, String> {
    workers
        .run(&job(), &FixedIds::default())
        .map_err(|failure| failure.message)
}

#[test]
fn a_worker_answers_and_is_reused() {
    // Each worker answers one job per line; the same one serves both renders.
    let workers = RenderWorkers::new(answering_after("0"), limits(5.0, 1));
    for _ in 0..2 {
        assert!(matches!(run(&workers), Ok(JobOutcome::Evaluated(Ok(e))) if e.truthy));
    }
    workers.check().unwrap();
}

#[test]
fn a_render_past_its_time_is_stopped_and_its_place_freed() {
    let workers = RenderWorkers::new(answering_after("30"), limits(0.5, 1));
    let started = Instant::now();
    let error = run(&workers).unwrap_err();
    assert_eq!(error, "it ran longer than a render may (0.5 s)");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The killed worker no longer counts: the next render gets a new one (and times out
    // the same way, rather than waiting for a place).
    let error = run(&workers).unwrap_err();
    assert_eq!(error, "it ran longer than a render may (0.5 s)");
}

#[test]
fn a_worker_that_dies_or_answers_garbage_fails_only_its_render() {
    let dying = RenderWorkers::new(shell("read setup; read job; exit 7"), limits(5.0, 1));
    let error = run(&dying).unwrap_err();
    assert!(
        error.starts_with("its worker stopped unexpectedly"),
        "{error}"
    );
    assert!(error.contains('7'), "{error}");
    let garbled = RenderWorkers::new(
        shell("read setup; while read job; do echo 'not json'; done"),
        limits(5.0, 1),
    );
    let error = run(&garbled).unwrap_err();
    assert_eq!(error, "its worker answered something unreadable: not json");
    let missing = RenderWorkers::new(
        WorkerCommand {
            program: "/nonexistent/worker".into(),
            args: vec![],
        },
        limits(5.0, 1),
    );
    let error = run(&missing).unwrap_err();
    assert!(
        error.starts_with("cannot start a template worker (/nonexistent/worker)"),
        "{error}"
    );
    // A failed start frees its place too.
    assert!(missing.check().is_err());
}

#[test]
fn at_most_the_limit_of_workers_run_and_a_render_waits_for_one() {
    let workers = Arc::new(RenderWorkers::new(answering_after("0.4"), limits(5.0, 1)));
    let started = Instant::now();
    let renders: Vec<_> = (0..3)
        .map(|_| {
            let workers = workers.clone();
            thread::spawn(move || run(&workers).is_ok())
        })
        .collect();
    for render in renders {
        assert!(render.join().unwrap());
    }
    // One worker serves the three renders one after another.
    assert!(started.elapsed() >= Duration::from_millis(1200));
    // The time limit counts the wait: renders queued behind one that holds the worker
    // for its whole time fail at their own limit, not later.
    let busy = Arc::new(RenderWorkers::new(answering_after("5"), limits(0.3, 1)));
    let started = Instant::now();
    let renders: Vec<_> = (0..3)
        .map(|_| {
            let busy = busy.clone();
            thread::spawn(move || run(&busy))
        })
        .collect();
    for render in renders {
        let error = render.join().unwrap().unwrap_err();
        assert!(error.contains("(0.3 s)"), "{error}");
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}
