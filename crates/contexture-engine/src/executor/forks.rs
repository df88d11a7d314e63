//! Steps run on a fork of the execution's thread (a state's `fork`).
//!
//! The step's start is recorded in the execution's log, naming the fork; the fork is taken
//! just after it (nothing is copied: it reads the execution's events up to there), and the
//! step's calls, tool results, exchange, store changes and end are recorded in the fork. Then
//! one transaction in the execution's log holds the `merged` event (what the state's fork
//! settings bring back, the fork's usage and cost, each counted once) and the step's end, so
//! the execution goes on from the same transition the fork took. A failure, the merge's
//! included, is the execution's step failure; a fork a failed or interrupted step left is
//! never merged (a re-run step gets a fork of its own).

use contexture_core::thread::{ConflictPolicy, EventKind, Merge, MergePolicy, StepEnd, Usage};
use contexture_store::Store;

use super::error::{ExecError, StepError};
use super::step::Abort;
use super::{Executor, Run};
use crate::workflow::ForkSettings;

impl<S: Store> Executor<S> {
    /// A fork of the run's thread at its last event, as `fork_id`, to run a step on: a run
    /// of its own whose cancellation is the execution's.
    pub(crate) async fn fork_run(&self, run: &Run, fork_id: &str) -> Result<Run, ExecError> {
        let at = run.log.thread().last_seq();
        self.store.fork(&run.id, at, fork_id).await?;
        let log = self.load(fork_id).await?;
        Ok(Run {
            id: fork_id.to_owned(),
            workflow: run.workflow.clone(),
            log,
            limits: run.limits,
            descendants: run.descendants,
            hooks: run.hooks.clone(),
            staging: None,
            watch: Some(run.cancel_source()),
            mcp: run.mcp.clone(),
        })
    }

    /// Brings back only what a failed step's fork spent: a `merged` event with no message
    /// and no key, so the fork's usage and cost are counted once, in the execution (its
    /// report and its budgets), although nothing it made is kept.
    pub(crate) async fn account_fork(&self, run: &mut Run, fork: &Run) -> Result<(), ExecError> {
        let at = run.log.thread().last_seq();
        let since = fork
            .log
            .thread()
            .fork_point()
            .map_or(at, |point| point.at_seq + 1);
        let usage = fork.log.thread().usage_since(since);
        let (cost, unknown) = spent_since_fork(run, fork);
        if usage == Usage::default() && cost == 0.0 && !unknown {
            return Ok(());
        }
        let merge = Merge {
            child: fork.id.clone(),
            child_seq: fork.log.thread().last_seq(),
            policy: MergePolicy::OutputKeys,
            conflict: ConflictPolicy::default(),
            messages: Vec::new(),
            store_changes: Vec::new(),
            usage,
            cost_usd: Some(cost),
            cost_unknown: unknown,
        };
        self.append(run, vec![EventKind::Merged(merge)]).await
    }

    /// Merges `fork` back into the run with the step's `end`, in one transaction.
    pub(crate) async fn merge_fork(
        &self,
        run: &mut Run,
        fork: &Run,
        settings: &ForkSettings,
        end: StepEnd,
    ) -> Result<(), Abort> {
        let mut merged = run
            .log
            .thread()
            .plan_merge(fork.log.thread(), &settings.spec())
            .map_err(StepError::Fork)?;
        if let EventKind::Merged(merge) = &mut merged {
            let (cost, unknown) = spent_since_fork(run, fork);
            merge.cost_usd = Some(cost);
            merge.cost_unknown = unknown;
        }
        self.append(run, vec![merged, EventKind::StepFinished(end)])
            .await?;
        Ok(())
    }
}

/// What `fork` spent in dollars since it was taken from `run` (its log holds the execution's
/// calls up to the fork point too), and whether one of its own calls had no known price.
fn spent_since_fork(run: &Run, fork: &Run) -> (f64, bool) {
    let cost = (fork.log.cost_usd() - run.log.cost_usd()).max(0.0);
    let unknown = fork.log.total_cost_usd().is_none() && run.log.total_cost_usd().is_some();
    (cost, unknown)
}
