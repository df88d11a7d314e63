//! The async runtime a command's store, model and server work runs on.

use std::future::Future;

use anyhow::{Context, Result};

/// Runs `work` to its end on a runtime on the calling thread: for commands whose work is one
/// sequence of store reads and writes.
pub fn on_current_thread<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(work)
}

/// Runs `work` to its end on a runtime with `workers` threads (tokio's default, one per
/// core, when `None`): for commands that overlap calls, tool programs and store writes, or
/// serve connections.
pub fn on_worker_threads<T>(
    workers: Option<usize>,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(work)
}
