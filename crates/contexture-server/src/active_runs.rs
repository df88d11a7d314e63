//! The executions running on this server, by stored id, so that the thread routes can keep
//! a running execution's log read-only without a store read: a client that appended to,
//! forked, merged into, compacted or deleted it would leave the run with a history it never
//! made (or none at all). An execution's children (`PARENT~STATE.VISIT`, or `PARENT/...` as
//! earlier releases named them) count as running while their root does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use contexture_engine::executor::CHILD_SEPARATOR;

use crate::error::ApiError;

/// The running executions, each with how many runs of it are going on here (a run and a
/// resume of it may overlap for a moment; the log stays held until both end).
#[derive(Debug, Default)]
pub struct ActiveRuns(Mutex<HashMap<String, usize>>);

/// One running execution; dropping it ends it.
#[derive(Debug)]
pub struct ActiveRun {
    runs: Arc<ActiveRuns>,
    id: String,
}

impl ActiveRuns {
    /// Marks the execution `id` (stored id) running until the returned value is dropped.
    pub fn enter(self: &Arc<Self>, id: &str) -> ActiveRun {
        *self.lock().entry(id.to_owned()).or_default() += 1;
        ActiveRun {
            runs: self.clone(),
            id: id.to_owned(),
        }
    }

    /// True when `thread` (stored id) is the log of a running execution or of one of its
    /// sub-workflow executions.
    pub fn holds(&self, thread: &str) -> bool {
        let runs = self.lock();
        runs.contains_key(thread)
            || thread
                .match_indices([CHILD_SEPARATOR, '/'])
                .any(|(at, _)| runs.contains_key(&thread[..at]))
    }

    /// True when no execution runs here.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        let mut runs = self.runs.lock();
        if let Some(count) = runs.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                runs.remove(&self.id);
            }
        }
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

    #[test]
    fn a_log_entered_twice_stays_held_until_both_runs_end() {
        let runs = Arc::new(ActiveRuns::default());
        let first = runs.enter("acme/run-1");
        let second = runs.enter("acme/run-1");
        drop(first);
        assert!(runs.holds("acme/run-1"));
        drop(second);
        assert!(!runs.holds("acme/run-1"));
    }
}
