//! Building one LLM request: the assistant's system prompt, the shared history, and the
//! step's own messages (its task, then its tool calls and results), fitted to the model's
//! window and checked against the provider's rules.

use contexture_core::Message;
use contexture_core::budget::{BudgetBreakdown, BudgetPolicy, Limits};
use contexture_core::fit::{self, Strategy, TrimOptions, repair, trim, validate};
use contexture_core::registry::ModelInfo;
use contexture_core::thread::FitRecord;
use contexture_core::tokens::tools_tokens;
use serde_json::Value;

use super::error::StepError;

/// Marks the step's own messages while they go through trimming, which keeps them whole.
const OWN_TAG: &str = "contexture:step-own";

/// What one request is fitted for.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The model (window, tokenizer, prices).
    pub model: &'a ModelInfo,
    /// The share of the window and the reply reserve.
    pub policy: &'a BudgetPolicy,
    /// Which history messages trimming keeps.
    pub strategy: Strategy,
    /// Whose message rules the request follows.
    pub rules: fit::Provider,
    /// The tool schemas sent.
    pub tools: &'a [Value],
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The messages, system prompt first.
    pub messages: Vec<Message>,
    /// The window arithmetic.
    pub limits: Limits,
    /// The request's tokens part by part.
    pub breakdown: BudgetBreakdown,
    /// What trimming left out.
    pub fit: FitRecord,
}

/// Fits `system + history + own` to `target`. The step's own messages are always kept
/// whole; history is trimmed by the strategy. The result passed the provider-rule
/// validator.
pub fn prepare(
    system: Option<&Message>,
    history: Vec<Message>,
    own: &[Message],
    target: &Target<'_>,
) -> Result<Prepared, StepError> {
    let limits = target.policy.limits(target.model)?;
    let counter = &target.model.counter;
    let mut all = Vec::with_capacity(history.len() + own.len() + 1);
    all.extend(system.cloned());
    all.extend(history);
    all.extend(own.iter().cloned().map(|mut message| {
        message.metadata.pinned = true;
        message.metadata.tags.push(OWN_TAG.to_owned());
        message
    }));
    let tools_tokens = if target.tools.is_empty() {
        0
    } else {
        counter.scale(tools_tokens(target.tools, counter.encoding()))
    };
    let options = TrimOptions {
        tools_tokens,
        strategy: target.strategy,
        provider: target.rules,
        ..TrimOptions::new(limits.limit)
    };
    // Consecutive turns of one role (the run's input, then a step's task) are merged first
    // where the provider requires alternation: trimming expects a valid history.
    let (all, repairs) = repair(all, target.rules);
    let trimmed = trim(&all, &options, counter).map_err(StepError::Fit)?;
    let messages: Vec<Message> = trimmed.messages.into_iter().map(unmark).collect();
    let violations = validate(&messages, target.rules);
    if !violations.is_empty() {
        return Err(StepError::InvalidRequest {
            by: "fitting".into(),
            violations,
        });
    }
    let breakdown = BudgetBreakdown::compute(target.model, target.policy, &messages, target.tools)?;
    let dropped_count: usize = trimmed.dropped.iter().map(|range| range.len()).sum();
    let mut reasons = Vec::new();
    if dropped_count > 0 {
        reasons.push(format!(
            "the history did not fit {} tokens (window {} x ratio {} - {} reserved for the reply): {} left out {dropped_count} message{}",
            limits.limit,
            limits.context_window,
            limits.budget_ratio,
            limits.reserve_output,
            strategy_name(target.strategy),
            if dropped_count == 1 { "" } else { "s" },
        ));
    }
    let changes = repairs.len() + trimmed.repairs.len();
    if changes > 0 {
        reasons.push(format!(
            "{changes} change{} for {} rules (merged turns, answered or dropped tool messages)",
            if changes == 1 { "" } else { "s" },
            target.rules
        ));
    }
    let fit = FitRecord {
        limit: limits.limit,
        tokens_before: trimmed.tokens_before,
        tokens_after: trimmed.tokens_after,
        dropped: trimmed
            .dropped
            .iter()
            .map(|range| [range.start, range.end])
            .collect(),
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
    };
    Ok(Prepared {
        messages,
        limits,
        breakdown,
        fit,
    })
}

/// Checks messages a hook gave for one call: repaired for the provider's rules, then
/// validated and counted against the same limit.
pub(crate) fn check_view(
    hook: &str,
    view: Vec<Message>,
    target: &Target<'_>,
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

fn unmark(mut message: Message) -> Message {
    if let Some(index) = message.metadata.tags.iter().position(|tag| tag == OWN_TAG) {
        message.metadata.tags.remove(index);
        message.metadata.pinned = false;
    }
    message
}

fn strategy_name(strategy: Strategy) -> String {
    match strategy {
        Strategy::Last => "strategy last".to_owned(),
        Strategy::First => "strategy first".to_owned(),
        Strategy::HeadTail { head } => format!("strategy head_tail (head {head})"),
    }
}
