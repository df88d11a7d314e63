//! Estimates that learn, in the engine: the model a call is measured with carries its
//! family's stored calibration, and every answered call with reported usage feeds it back
//! (see [`contexture_core::calibration`]). Models counted exactly are left alone.
//!
//! An observation compares the part of a request that estimates scale (its messages and
//! tool schemas, under the family's uncalibrated ratio) with the provider's count less the
//! reply priming, which is counted the same on both sides: so a request measured with the
//! calibration is never below what a kept report said.

use contexture_core::Message;
use contexture_core::calibration::Observation;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::Usage;
use contexture_core::tokens::REPLY_PRIMING;
use contexture_store::{Store, StoreError, Tenant};
use serde_json::Value;

/// Whose calls a calibration learns from and serves. A calibration is kept per model
/// family and learner, so one tenant's traffic never moves another's estimates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Learner {
    /// The operator's own runs (the CLI at a terminal): the family's calibration, read and
    /// fed.
    #[default]
    Operator,
    /// One tenant of a server: its own calibration of the family, read and fed; until it
    /// has a factor of its own, the operator's serves it.
    Tenant(Tenant),
    /// Reads the operator's calibration and feeds nothing (a server's executions, whose
    /// requests a client may shape).
    ReadOnly,
}

impl Learner {
    /// The store's key of `family`'s calibration for this learner (where it is fed).
    fn key(&self, family: &str) -> Option<String> {
        match self {
            Learner::Operator => Some(family.to_owned()),
            Learner::Tenant(tenant) => Some(format!("tenant:{tenant}:{family}")),
            Learner::ReadOnly => None,
        }
    }
}

/// `model` with the calibration `learner` reads applied (as it is when counted exactly or
/// when nothing has been learnt yet).
pub async fn calibrated<S: Store>(
    store: &S,
    model: ModelInfo,
    learner: &Learner,
) -> Result<ModelInfo, StoreError> {
    let Some(family) = model.calibration_key().map(str::to_owned) else {
        return Ok(model);
    };
    if let Learner::Tenant(_) = learner
        && let Some(key) = learner.key(&family)
        && let Some(own) = store.calibration(&key).await?
        && own.factor().is_some()
    {
        return Ok(model.calibrated(&own));
    }
    Ok(match store.calibration(&family).await? {
        Some(calibration) => model.calibrated(&calibration),
        None => model,
    })
}

/// What `messages` and `tools` come to under `model`'s estimate without any calibration:
/// the part of a request that an observation measures.
pub fn uncalibrated_estimate(model: &ModelInfo, messages: &[Message], tools: &[Value]) -> u64 {
    let counter = model.counter.uncalibrated();
    messages
        .iter()
        .map(|message| u64::from(counter.count_message(message)))
        .sum::<u64>()
        + u64::from(counter.count_tools(tools))
}

/// Feeds one answered call to the calibration of `model`'s family that `learner` feeds:
/// its request came to `estimated` ([`uncalibrated_estimate`]) and its provider reported
/// `usage` (nothing is fed when it reported none, when the model is counted exactly, or
/// when the learner feeds nothing).
pub async fn observe<S: Store>(
    store: &S,
    model: &ModelInfo,
    learner: &Learner,
    estimated: u64,
    usage: Option<Usage>,
) -> Result<(), StoreError> {
    let (Some(key), Some(usage)) = (
        model
            .calibration_key()
            .and_then(|family| learner.key(family)),
        usage,
    ) else {
        return Ok(());
    };
    if usage.input_tokens == 0 {
        return Ok(());
    }
    let observation = Observation {
        estimated,
        reported: usage.input_tokens.saturating_sub(u64::from(REPLY_PRIMING)),
    };
    store
        .observe_calibration(&key, observation)
        .await
        .map(|_| ())
}
