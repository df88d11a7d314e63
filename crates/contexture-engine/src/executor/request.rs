//! Building one LLM request of a step: the generic fitting is [`crate::fitting`]; this adds
//! the check of the messages a hook gives in place of the fitted ones.

use contexture_core::Message;
use contexture_core::budget::BudgetBreakdown;
use contexture_core::fit::{repair, validate};

use super::error::StepError;
use crate::fitting::FitTarget;

/// Checks messages a hook gave for one call: repaired for the provider's rules, then
/// validated and counted against the same limit.
pub(crate) fn check_view(
    hook: &str,
    view: Vec<Message>,
    target: &FitTarget<'_>,
    limit: u32,
) -> Result<(Vec<Message>, BudgetBreakdown), StepError> {
    let (messages, _) = repair(view, target.rules);
    let violations = validate(&messages, target.rules);
    if !violations.is_empty() {
        return Err(StepError::InvalidRequest {
            by: format!("hook `{hook}`"),
            violations,
        });
    }
    let breakdown = BudgetBreakdown::compute(target.model, target.policy, &messages, target.tools)?;
    if !breakdown.fits() {
        return Err(StepError::ViewOverBudget {
            hook: hook.to_owned(),
            tokens: breakdown.used,
            limit,
        });
    }
    Ok((messages, breakdown))
}
