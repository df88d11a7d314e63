//! Fitting a thread's projection to a model, for `GET /v1/threads/{id}/context` and for the
//! requests the chat endpoint sends upstream: the engine's request fitting (the same as a
//! workflow step's), with the server's default policy and a request's overrides.

use contexture_core::Message;
use contexture_core::TokenCounter;
use contexture_core::budget::BudgetPolicy;
use contexture_core::fit::Strategy;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::{FitRecord, Projection};
use contexture_engine::executor::{FitTarget, FittedRequest, fit_request};
use contexture_engine::llm::rules_for_model;
use contexture_store::{ProjectionTail, Store, StoreError};
use serde_json::Value;

use crate::app::AppState;
use crate::error::ApiError;

/// `last`, `first`, `head-tail` (keeping 2 head units) or `head-tail:N`.
pub fn parse_strategy(text: &str) -> Option<Strategy> {
    match text {
        "last" => Some(Strategy::Last),
        "first" => Some(Strategy::First),
        "head-tail" => Some(Strategy::HeadTail { head: 2 }),
        _ => text
            .strip_prefix("head-tail:")
            .and_then(|n| n.parse().ok())
            .map(|head| Strategy::HeadTail { head }),
    }
}

/// How one fit is done: the server's default context policy with a request's overrides.
#[derive(Debug, Clone)]
pub struct FitSettings {
    /// The model.
    pub model: ModelInfo,
    /// Window share and reply reserve.
    pub budget: BudgetPolicy,
    /// Which history survives.
    pub strategy: Strategy,
}

impl FitSettings {
    /// The settings for `model` (`param` names the field in errors), with optional
    /// overrides of the strategy, the ratio and the reserve.
    pub fn new(
        state: &AppState,
        model: &str,
        strategy: Option<&str>,
        budget_ratio: Option<f64>,
        reserve_output: Option<u32>,
    ) -> Result<FitSettings, ApiError> {
        let model = state
            .registry
            .get(model)
            .map_err(|error| ApiError::invalid("model", error.to_string()))?;
        let strategy_text = strategy.unwrap_or(&state.config.context.strategy);
        let strategy = parse_strategy(strategy_text).ok_or_else(|| {
            ApiError::invalid(
                "strategy",
                format!("`{strategy_text}` is not one of last, first, head-tail, head-tail:N"),
            )
        })?;
        let mut budget = state.config.context.budget.clone();
        if let Some(ratio) = budget_ratio {
            budget.budget_ratio = ratio;
        }
        if reserve_output.is_some() {
            budget.reserve_output = reserve_output;
        }
        budget
            .validate()
            .map_err(|error| ApiError::invalid("budget_ratio", error.to_string()))?;
        Ok(FitSettings {
            model,
            budget,
            strategy,
        })
    }

    /// What fitting needs of the thread `thread` (stored id): its projection, or with a
    /// strategy that keeps the newest history, only its tail ([`Store::load_projection_tail`]),
    /// long enough that no fit can tell it from the whole: its newest messages past the
    /// window and `own_tokens` more (the request's own turns, which are part of what is read
    /// and are kept whole), and past `at_least` tokens (a compaction trigger's threshold,
    /// which must see a cut thread as over it).
    pub async fn load(
        &self,
        state: &AppState,
        thread: &str,
        own_tokens: u64,
        at_least: u64,
    ) -> Result<ProjectionTail, StoreError> {
        // A strategy that keeps old history too reads all of it.
        let tokens = if self.strategy == Strategy::Last {
            self.tail_tokens().saturating_add(own_tokens).max(at_least)
        } else {
            u64::MAX
        };
        state
            .store
            .load_projection_tail(thread, self.model.counter.encoding(), tokens)
            .await
    }

    /// The tokens a fit's history can hold at most, in the counter's encoding (an estimating
    /// counter that counts fewer tokens than its encoding needs more of them).
    fn tail_tokens(&self) -> u64 {
        let window = u64::from(self.model.context_window);
        let limit = self
            .budget
            .limits(&self.model)
            .map_or(window, |limits| u64::from(limits.limit));
        let needed = window.max(limit);
        match self.model.counter {
            TokenCounter::Estimate { ratio, .. } if ratio < 1.0 && ratio > 0.0 => {
                (needed as f64 / ratio).ceil() as u64
            }
            _ => needed,
        }
    }

    /// Fits `projection` (its system prompt, then its messages) followed by `own` (kept
    /// whole: the messages of the request being answered) with `tools`. The result passed
    /// the provider-rule validator.
    pub fn fit(
        &self,
        state: &AppState,
        projection: Projection,
        own: &[Message],
        tools: &[Value],
    ) -> Result<FittedRequest, ApiError> {
        let fitted = self.fit_unmetered(state, projection, own, tools)?;
        state.metrics.fitted(
            u64::from(fitted.breakdown.used),
            !fitted.fit.dropped.is_empty(),
        );
        Ok(fitted)
    }

    /// [`FitSettings::fit`] of a projection read from its end: what fitting left out
    /// counts the messages that were not read too (they come first in the history).
    pub fn fit_tail(
        &self,
        state: &AppState,
        tail: ProjectionTail,
        own: &[Message],
        tools: &[Value],
    ) -> Result<FittedRequest, ApiError> {
        let has_system = tail.projection.system.is_some();
        let mut fitted = self.fit(state, tail.projection, own, tools)?;
        count_unread(&mut fitted.fit, tail.unread, has_system);
        Ok(fitted)
    }

    /// [`FitSettings::fit`] without counting it in the metrics: for a check that a request
    /// can be fitted before anything of it is stored.
    pub fn fit_unmetered(
        &self,
        state: &AppState,
        projection: Projection,
        own: &[Message],
        tools: &[Value],
    ) -> Result<FittedRequest, ApiError> {
        let target = FitTarget {
            model: &self.model,
            policy: &self.budget,
            strategy: self.strategy,
            rules: rules_for_model(&state.registry, &self.model.id),
            tools,
        };
        let fitted = fit_request(
            projection.system.as_ref(),
            projection.messages,
            own,
            &target,
        )
        .map_err(|error| ApiError::unprocessable(error.to_string()))?;
        Ok(fitted)
    }
}

/// Puts the `unread` oldest history messages of a tail read into `fit`: the history starts
/// after the system prompt (when there is one), so the ranges left out move up by `unread`
/// and one more covers the unread ones; the tokens before trimming are no longer known.
pub fn count_unread(fit: &mut FitRecord, unread: usize, has_system: bool) {
    if unread == 0 {
        return;
    }
    let start = usize::from(has_system);
    let mut dropped = vec![[start, start + unread]];
    for [from, to] in fit.dropped.iter().copied() {
        let (from, to) = if from >= start {
            (from + unread, to + unread)
        } else {
            (from, to)
        };
        match dropped.last_mut() {
            Some(last) if last[1] == from => last[1] = to,
            _ => dropped.push([from, to]),
        }
    }
    dropped.sort_unstable();
    fit.dropped = dropped;
    fit.tokens_before = None;
    let note = format!("{unread} older messages were not read: the newest fill the window");
    fit.reason = Some(match fit.reason.take() {
        Some(reason) => format!("{note}; {reason}"),
        None => note,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse() {
        assert_eq!(parse_strategy("last"), Some(Strategy::Last));
        assert_eq!(parse_strategy("first"), Some(Strategy::First));
        assert_eq!(
            parse_strategy("head-tail:3"),
            Some(Strategy::HeadTail { head: 3 })
        );
        assert_eq!(parse_strategy("middle"), None);
    }
}
