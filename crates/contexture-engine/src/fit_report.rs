//! What one fit did, as plain data: what `contexture fit --report` prints and the Python
//! package's `fit` returns beside the fitted messages.

use contexture_core::budget::BudgetError;
use contexture_core::fit::{ClearedResult, RepairChange, Rules, TruncatedResult};
use serde::Serialize;

use crate::fitting::{FitSettings, FittedRequest};

/// The report of one fit of a message list: the budget it was fitted to, what was left out
/// (as ranges of the input's indices), cleared, cut and repaired, and the tokens before and
/// after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitReport {
    /// The model fitted for.
    pub model: String,
    /// Whose message rules the output follows.
    pub rules: Rules,
    /// The most tokens the whole request may take.
    pub max_tokens: u32,
    /// The tokens the history is cut down to once the request passes the hysteresis' high
    /// mark, when the policy has one.
    pub low_water: Option<u32>,
    /// The messages given.
    pub messages_in: usize,
    /// The messages kept (a head-tail marker included).
    pub messages_out: usize,
    /// True when the request was over its limit and history was left out for it.
    pub over_budget: bool,
    /// The input's indices left out, as half-open ranges.
    pub dropped: Vec<DroppedRange>,
    /// How many messages were left out.
    pub dropped_count: usize,
    /// The input index of the message kept only in part.
    pub partial: Option<usize>,
    /// The place among the output of the marker where history was left out.
    pub marker: Option<usize>,
    /// Tool results cut to their start and end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<TruncatedResult>,
    /// Tool results cleared.
    pub cleared: Vec<ClearedResult>,
    /// The tokens the clearing saved.
    pub tokens_cleared: u64,
    /// The request's tokens before fitting, when all of it was counted.
    pub tokens_before: Option<u64>,
    /// A lower bound of the request's tokens before fitting (what was left out unread is
    /// not counted).
    pub tokens_before_at_least: u64,
    /// The fitted request's tokens.
    pub tokens_after: u64,
    /// Changes made to the kept history for the provider's rules.
    pub repairs: Vec<RepairChange>,
}

/// Input indices `start..end` that a fit left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DroppedRange {
    /// The first index left out.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

impl FitReport {
    /// The report of `fitted`, a fit of `messages_in` messages with `settings`.
    pub fn new(
        settings: &FitSettings,
        fitted: &FittedRequest,
        messages_in: usize,
    ) -> Result<FitReport, BudgetError> {
        let limit = settings.budget().limits(&settings.model)?.limit;
        let record = &fitted.fit;
        Ok(FitReport {
            model: settings.model.id.clone(),
            rules: settings.rules(),
            max_tokens: limit,
            low_water: settings
                .policy
                .hysteresis
                .map(|hysteresis| (f64::from(limit) * hysteresis.low).floor() as u32),
            messages_in,
            messages_out: fitted.messages.len(),
            over_budget: fitted.trim.over_budget,
            dropped_count: record.dropped.iter().map(|[start, end]| end - start).sum(),
            dropped: record
                .dropped
                .iter()
                .map(|&[start, end]| DroppedRange { start, end })
                .collect(),
            partial: fitted.trim.partial,
            marker: fitted.trim.marker,
            truncated: record.truncated.clone(),
            tokens_cleared: record.cleared.iter().map(|result| result.tokens).sum(),
            cleared: record.cleared.clone(),
            tokens_before: record.tokens_before,
            tokens_before_at_least: fitted.trim.tokens_before_at_least,
            tokens_after: record.tokens_after,
            repairs: fitted.trim.repairs.clone(),
        })
    }
}
