//! Iterations whose items run at once (`max_concurrency` above 1).
//!
//! Each item runs in its own copy of the run ([`Run::staged_item`]): it sees the history and
//! the context store as they stood when the iteration began (as it would one item at a
//! time: an item's results come together only when the last one ends), and what it records
//! is held back. As items end, whatever their order, those whose earlier items are all
//! recorded are recorded in item order, each with its end, so the log, the step numbers and
//! the fan-in are the same as if the items had run one after another. A failed item stops
//! the iteration: no later item starts, the items before it end and are recorded, then its
//! failure is; the later ones still running are dropped and run again on a resume.

use std::collections::BTreeMap;

use contexture_store::Store;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::error::ExecError;
use super::item_budget::ItemLedger;
use super::log::Iteration;
use super::step::{Ran, Work};
use super::tree_budget::bounds_tree;
use super::{Executor, Position, Run};
use crate::tools::is_context_manager;
use crate::workflow::{State, StepKind, Workflow};

/// Whether the items of an iteration over `state` run one at a time whatever its
/// `max_concurrency` says, because running them at once could break a guarantee: a
/// budget shared with sub-workflows (each child's ceiling is what was left when it
/// started, so children at once could each spend it), or a state that compacts the shared
/// history (the other items share it). Token and cost budgets do not: items' calls reserve
/// their most before they start (see [`ItemLedger`]).
pub(crate) fn one_at_a_time(run: &Run, workflow: &Workflow, state: &State) -> bool {
    match workflow.step_kind(state) {
        Some(StepKind::Workflow(_)) => bounds_tree(run.limits),
        Some(StepKind::Tool(tool)) => is_context_manager(tool),
        _ => false,
    }
}

/// An item that has run, waiting for the items before it to be recorded.
struct Finished {
    /// Its copy of the run, holding what it recorded.
    run: Run,
    /// Its step, or the error that stopped it (its failure is among what it recorded).
    result: Result<Ran, ExecError>,
}

impl<S: Store> Executor<S> {
    /// Runs the rest of `iteration`'s items, up to its concurrency at once, and records them
    /// in item order; the last one's end takes the iteration's transition.
    pub(crate) async fn run_items_at_once(
        &self,
        run: &mut Run,
        iteration: Iteration,
    ) -> Result<(), ExecError> {
        let limit = usize::try_from(iteration.concurrency)
            .unwrap_or(usize::MAX)
            .max(1);
        let total = iteration.items.len();
        let mut recorded = iteration.done.len();
        let mut next = recorded;
        let mut failed_at: Option<usize> = None;
        let mut waiting: BTreeMap<usize, Finished> = BTreeMap::new();
        let mut running = FuturesUnordered::new();
        let ledger = ItemLedger::new(run.tree_spent());
        loop {
            while failed_at.is_none() && next < total && running.len() < limit {
                let index = next;
                let mut item_run =
                    run.staged_item((index - recorded) as u64, ledger.clone(), index);
                let work = Work::item_at(&iteration, index, Vec::new());
                let state_id = iteration.state_id.clone();
                running.push(async move {
                    let result = self.run_step(&mut item_run, &state_id, &work).await;
                    (index, item_run, result)
                });
                next += 1;
            }
            let Some((index, item_run, result)) = running.next().await else {
                return Ok(());
            };
            // Whatever it reserved and did not spend (a call cut short) is free again.
            ledger.finished(index);
            if result.is_err() {
                failed_at = Some(failed_at.map_or(index, |at| at.min(index)));
            }
            waiting.insert(
                index,
                Finished {
                    run: item_run,
                    result,
                },
            );
            while let Some(finished) = waiting.remove(&recorded) {
                let held = finished
                    .run
                    .staging
                    .map(|staging| staging.events)
                    .unwrap_or_default();
                self.append(run, held).await?;
                ledger.recorded(recorded, run.tree_spent());
                let ran = finished.result?;
                let Position::Iteration(current) = run.log.position().clone() else {
                    return Err(ExecError::UnknownState {
                        execution_id: run.id.clone(),
                        state_id: iteration.state_id.clone(),
                    });
                };
                self.finish_step(run, ran, Work::item(current)).await?;
                recorded += 1;
            }
            if recorded == total {
                return Ok(());
            }
        }
    }
}
