//! Sub-workflow steps: the child runs as its own execution (fresh messages,
//! its own context store, `parent_execution_id` in its log), with only the input its parent
//! scoped for it. A resumed parent resumes the child it had started instead of starting over,
//! and a child that completed before the parent crashed is not run again.

use std::future::Future;
use std::pin::Pin;

use contexture_core::thread::RunLimits;
use contexture_store::Store;
use serde_json::Value;

use super::error::{ExecError, StepError};
use super::step::{Abort, ChildPlan};
use super::tree_budget::{Spent, bounds_tree, exhausted, left};
use super::{Executor, Run, RunOutcome, RunRequest};
use crate::workflow::{State, SubResult};

/// A child run, boxed: runs nest, so the future's type cannot be spelled out.
type ChildRun<'a> = Pin<Box<dyn Future<Output = Result<RunOutcome, ExecError>> + Send + 'a>>;

impl<S: Store> Executor<S> {
    /// Runs (or resumes) the child execution `child` and returns the state's output.
    pub(crate) async fn run_child(
        &self,
        run: &mut Run,
        state: &State,
        reference: &str,
        child: &ChildPlan,
    ) -> Result<String, Abort> {
        let failed = |error: String| StepError::SubWorkflow {
            workflow: reference.to_owned(),
            child: child.id.clone(),
            error,
        };
        let parent_file = run
            .log
            .start()
            .map(|s| s.workflow_file.clone())
            .unwrap_or_default();
        let path = run.workflow.workflow_path(reference).to_owned();
        let (file, text) = self.sources.load(&path, &parent_file).map_err(&failed)?;
        let existing = match self.load(&child.id).await {
            Ok(log) => Some(log),
            Err(ExecError::NotFound { .. }) => None,
            Err(other) => return Err(other.into()),
        };
        // The parent's limits bound its whole tree: the child may spend what the parent
        // and its other children left. `run.descendants` holds what every child spent so
        // far (this one's earlier part too, when it resumes), kept up to date one child at a
        // time, so a long iteration of sub-workflows reads each child's log once or twice.
        let bounded = bounds_tree(run.limits);
        let before = match &existing {
            Some(_) if bounded => self.subtree_spent(&child.id).await?,
            _ => Spent::default(),
        };
        let others = run.descendants.minus(before);
        let spent = run.tree_spent().minus(before);
        let within = left(run.limits, spent);
        // A child this step started before (the parent was resumed) goes on where it
        // stopped; a completed one gives its outcome without running again.
        let outcome = match existing {
            Some(_) => self.resume_boxed(&child.id, within).await,
            None => {
                let mut request = RunRequest::new(file, text, child.input_text());
                request.execution_id = Some(child.id.clone());
                request.llm = run.log.start().and_then(|s| s.llm.clone());
                if let Some(start) = run.log.start() {
                    request.origin = super::origin_of(start);
                    request.user_context = start.user_context.clone();
                }
                if let Some(error) = exhausted(run.limits, spent) {
                    return Err(error.into());
                }
                self.begin_boxed(request, run.id.clone(), within).await
            }
        };
        // Whatever its end, what the child spent counts against the parent's limits.
        self.refresh(run).await?;
        if bounded {
            run.descendants = others.plus(self.subtree_spent(&child.id).await?);
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                // The parent's own cancellation (it cascades) wins over the child's error.
                self.refresh(run).await?;
                if let Some(request) = run.log.cancel_requested() {
                    return Err(StepError::Cancelled {
                        reason: request.reason.clone(),
                    }
                    .into());
                }
                return Err(failed(error.to_string()).into());
            }
        };
        Ok(match state.result {
            SubResult::Output => outcome.output,
            SubResult::Context => Value::Object(outcome.store.into_map()).to_string(),
        })
    }

    fn begin_boxed(&self, request: RunRequest, parent: String, within: RunLimits) -> ChildRun<'_> {
        Box::pin(self.begin(request, Some(parent), within))
    }

    fn resume_boxed<'a>(&'a self, id: &'a str, within: RunLimits) -> ChildRun<'a> {
        Box::pin(self.resume_within(id, within))
    }
}
