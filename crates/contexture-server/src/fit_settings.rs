//! A request's fit settings: the server's default fit policy with the request's
//! overrides, turned into the engine's [`FitSettings`]; fitting itself is the engine's.

use contexture_core::fit::Strategy;
use contexture_engine::estimates::Learner;
use contexture_engine::fitting::{
    FitError, FitOverrides, FitSettings, FittedRequest, ModelChoice, SettingsError,
};

use crate::app::AppState;
use crate::error::ApiError;

/// The settings for `model` (as the request's `model` field names it, its estimate
/// calibrated as `learner` reads it: a tenant's own calibration, the operator's until the
/// tenant has one) under the server's default policy,
/// with the request's overrides of the strategy, the window share, the reply reserve and the
/// request's size; each mistake is a 400 naming its field. A thread's own policy takes the
/// default's place when the thread is read ([`FitSettings::adopt`]).
pub async fn settings(
    state: &AppState,
    learner: &Learner,
    model: &str,
    strategy: Option<&str>,
    budget_ratio: Option<f64>,
    reserve_output: Option<u32>,
    max_tokens: Option<u32>,
) -> Result<FitSettings, ApiError> {
    let strategy = strategy
        .map(|text| {
            text.parse::<Strategy>()
                .map_err(|error| ApiError::invalid("strategy", error.to_string()))
        })
        .transpose()?;
    let overrides = FitOverrides {
        strategy,
        budget_ratio,
        reserve: reserve_output,
        max_tokens,
        ..FitOverrides::default()
    };
    FitSettings::for_model(
        // Calibrations are per model, the same through every tenant's view.
        Some(&state.store),
        &state.registry,
        ModelChoice::Named(model),
        learner,
        state.config.fit.clone(),
        overrides,
    )
    .await
    .map_err(settings_error)
}

/// Fit settings that cannot be made, as the API answers: a 400 naming the field at fault,
/// or the store's error.
pub fn settings_error(error: SettingsError) -> ApiError {
    match error {
        SettingsError::Model(error) => ApiError::invalid("model", error.to_string()),
        SettingsError::Store(error) => ApiError::store(&error),
        SettingsError::Budget(error) => ApiError::invalid("budget_ratio", error.to_string()),
    }
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
