//! The executions running on this server, by stored id, so that the thread routes can keep
//! a running execution's log read-only without a store read: a client that appended to,
//! forked, merged into, compacted or deleted it would leave the run with a history it never
//! made (or none at all). An execution's children (`PARENT/STATE.VISIT`) count as running
//! while their root does.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::ApiError;

/// The running executions.
#[derive(Debug, Default)]
pub struct ActiveRuns(Mutex<HashSet<String>>);

/// One running execution; dropping it ends it.
#[derive(Debug)]
pub struct ActiveRun {
    runs: Arc<ActiveRuns>,
    id: String,
}

impl ActiveRuns {
    /// Marks the execution `id` (stored id) running until the returned value is dropped.
    pub fn enter(self: &Arc<Self>, id: &str) -> ActiveRun {
        self.lock().insert(id.to_owned());
        ActiveRun {
            runs: self.clone(),
            id: id.to_owned(),
        }
    }

    /// True when `thread` (stored id) is the log of a running execution or of one of its
    /// sub-workflow executions.
    pub fn holds(&self, thread: &str) -> bool {
        let runs = self.lock();
        runs.contains(thread)
            || thread
                .match_indices('/')
                .any(|(at, _)| runs.contains(&thread[..at]))
    }

    /// A 409 when `thread` (shown to the client as `shown`) is a running execution's log.
    pub fn refuse_writes(&self, thread: &str, shown: &str) -> Result<(), ApiError> {
        if self.holds(thread) {
            return Err(ApiError::conflict(format!(
                "thread `{shown}` is the log of a running execution: it is read-only until the run ends (follow it with GET /v1/executions/{{id}}/events)"
            )));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        self.runs.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_and_its_children_are_held_while_it_runs() {
        let runs = Arc::new(ActiveRuns::default());
        let run = runs.enter("acme/run-1");
        assert!(runs.holds("acme/run-1"));
        assert!(runs.holds("acme/run-1/research.1"));
        assert!(!runs.holds("acme/run-10"));
        assert!(!runs.holds("acme"));
        assert!(runs.refuse_writes("acme/run-1", "run-1").is_err());
        drop(run);
        assert!(!runs.holds("acme/run-1"));
        assert!(runs.refuse_writes("acme/run-1", "run-1").is_ok());
    }
}
