//! Budgets over a tree of executions: a run's `max_tokens`, `max_cost_usd` and `max_steps`
//! bound its own calls and steps and those of every sub-workflow below it. A child starts
//! (or resumes) with what its parent has left as a ceiling on its own limits, and the
//! parent's later checks count what its children spent. A parent waits while its child runs,
//! so the budget left when a child starts is exactly what the child's subtree may spend.

use std::future::Future;
use std::pin::Pin;

use contexture_core::thread::RunLimits;
use contexture_store::Store;

use super::error::{ExecError, StepError};
use super::{ExecutionLog, Executor};

/// What an execution (or a subtree of them) spent: tokens in and out, dollars at known
/// prices, steps started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    /// Input and output tokens of every call.
    pub tokens: u64,
    /// Dollars of the calls whose price is known (a run with a cost budget refuses models
    /// without one, so its tree has no others).
    pub cost_usd: f64,
    /// Steps started (a sub-workflow state is one step of its parent's).
    pub steps: u64,
}

impl Spent {
    /// What `log`'s own calls and steps spent.
    pub fn own(log: &ExecutionLog) -> Spent {
        let usage = log.usage();
        Spent {
            tokens: usage.input_tokens + usage.output_tokens,
            cost_usd: log.cost_usd(),
            steps: log.steps_started(),
        }
    }

    /// What is left of this once `other` (a part of it) is taken away.
    pub fn minus(self, other: Spent) -> Spent {
        Spent {
            tokens: self.tokens.saturating_sub(other.tokens),
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
            steps: self.steps.saturating_sub(other.steps),
        }
    }

    /// Both together.
    pub fn plus(self, other: Spent) -> Spent {
        Spent {
            tokens: self.tokens + other.tokens,
            cost_usd: self.cost_usd + other.cost_usd,
            steps: self.steps + other.steps,
        }
    }
}

/// True when `limits` bound what a tree spends (tokens, dollars or steps): only then is what
/// children spent read from their logs.
pub(crate) fn bounds_tree(limits: RunLimits) -> bool {
    limits.max_tokens.is_some() || limits.max_cost_usd.is_some() || limits.max_steps.is_some()
}

/// What `limits` leave once `spent` is spent: the ceiling of a child's own limits. The
/// wall-clock limit is not passed down: the parent's clock runs while its child does, and
/// cancelling the parent cancels the child.
pub(crate) fn left(limits: RunLimits, spent: Spent) -> RunLimits {
    RunLimits {
        max_tokens: limits
            .max_tokens
            .map(|limit| limit.saturating_sub(spent.tokens)),
        max_cost_usd: limits
            .max_cost_usd
            .map(|limit| (limit - spent.cost_usd).max(0.0)),
        max_steps: limits
            .max_steps
            .map(|limit| limit.saturating_sub(spent.steps)),
        max_seconds: None,
    }
}

/// The error of a parent whose budget is spent before a child could start: named with the
/// parent's own limit and its tree's spending, not the child's empty ceiling.
pub(crate) fn exhausted(limits: RunLimits, spent: Spent) -> Option<StepError> {
    if let Some(limit) = limits.max_tokens
        && spent.tokens >= limit
    {
        return Some(StepError::TokenBudget {
            spent: spent.tokens,
            request: None,
            limit,
        });
    }
    if let Some(limit) = limits.max_cost_usd
        && spent.cost_usd >= limit
    {
        return Some(StepError::CostBudget {
            spent: spent.cost_usd,
            request: None,
            limit,
        });
    }
    match limits.max_steps {
        Some(max) if spent.steps >= max => Some(StepError::StepLimit { max }),
        _ => None,
    }
}

/// A boxed subtree read: executions nest, so the future's type cannot be spelled out.
type SpentRead<'a> = Pin<Box<dyn Future<Output = Result<Spent, ExecError>> + Send + 'a>>;

impl<S: Store> Executor<S> {
    /// What the children of `log` and their descendants spent.
    pub(crate) async fn descendants_spent(&self, log: &ExecutionLog) -> Result<Spent, ExecError> {
        let mut spent = Spent::default();
        for child in log.children() {
            spent = spent.plus(self.subtree_spent(child).await?);
        }
        Ok(spent)
    }

    /// What the execution `id` and its descendants spent, read from their logs.
    pub(crate) fn subtree_spent<'a>(&'a self, id: &'a str) -> SpentRead<'a> {
        Box::pin(async move {
            let log = match self.load(id).await {
                Ok(log) => log,
                // A child recorded by its parent whose log was never written spent nothing.
                Err(ExecError::NotFound { .. }) => return Ok(Spent::default()),
                Err(other) => return Err(other),
            };
            Ok(Spent::own(&log).plus(self.descendants_spent(&log).await?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_of_each_limit() {
        let limits = RunLimits {
            max_tokens: Some(250),
            max_cost_usd: Some(0.01),
            max_steps: Some(5),
            max_seconds: Some(30.0),
        };
        let spent = Spent {
            tokens: 182,
            cost_usd: 0.004,
            steps: 2,
        };
        let ceiling = left(limits, spent);
        assert_eq!(ceiling.max_tokens, Some(68));
        assert!((ceiling.max_cost_usd.unwrap() - 0.006).abs() < 1e-12);
        assert_eq!(ceiling.max_steps, Some(3));
        assert_eq!(ceiling.max_seconds, None);
        assert!(exhausted(limits, spent).is_none());
        // Spent past a limit: nothing is left, never a wrap-around.
        let over = Spent {
            tokens: 300,
            cost_usd: 0.02,
            steps: 9,
        };
        let ceiling = left(limits, over);
        assert_eq!(ceiling.max_tokens, Some(0));
        assert_eq!(ceiling.max_cost_usd, Some(0.0));
        assert_eq!(ceiling.max_steps, Some(0));
        assert!(matches!(
            exhausted(limits, over),
            Some(StepError::TokenBudget {
                spent: 300,
                request: None,
                limit: 250
            })
        ));
        // No limits: nothing to pass down.
        assert_eq!(left(RunLimits::default(), over), RunLimits::default());
        assert!(exhausted(RunLimits::default(), over).is_none());
    }
}
