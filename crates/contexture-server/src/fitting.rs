//! A request's fit settings: the server's default context policy with the request's
//! overrides, turned into the engine's [`FitSettings`]; fitting itself is the engine's.

use contexture_core::fit::Strategy;
use contexture_engine::fitting::{FitError, FitSettings, FittedRequest};

use crate::app::AppState;
use crate::error::ApiError;

/// The settings for `model` (as the request's `model` field names it), with optional
/// overrides of the strategy, the window share and the reply reserve; each mistake is a 400
/// naming its field.
pub fn settings(
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
    let strategy = match strategy {
        Some(text) => text
            .parse::<Strategy>()
            .map_err(|error| ApiError::invalid("strategy", error.to_string()))?,
        None => state.config.context.strategy,
    };
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
    Ok(FitSettings::new(model, budget, strategy))
}

/// A request that cannot be fitted: a 422 that says why.
pub fn fit_error(error: FitError) -> ApiError {
    ApiError::unprocessable(error.to_string())
}

/// Counts a fit that was sent (or shown) in the metrics.
pub fn metered(state: &AppState, fitted: &FittedRequest) {
    state.metrics.fitted(
        u64::from(fitted.breakdown.used),
        !fitted.fit.dropped.is_empty(),
    );
}
