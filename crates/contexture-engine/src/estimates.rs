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
use contexture_store::{Store, StoreError};
use serde_json::Value;

/// `model` with its family's stored calibration applied (as it is when counted exactly or
/// when nothing has been learnt yet).
pub async fn calibrated<S: Store>(store: &S, model: ModelInfo) -> Result<ModelInfo, StoreError> {
    let Some(key) = model.calibration_key() else {
        return Ok(model);
    };
    Ok(match store.calibration(key).await? {
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

/// Feeds one answered call to `model`'s calibration: its request came to `estimated`
/// ([`uncalibrated_estimate`]) and its provider reported `usage` (nothing is fed when it
/// reported none, or when the model is counted exactly).
pub async fn observe<S: Store>(
    store: &S,
    model: &ModelInfo,
    estimated: u64,
    usage: Option<Usage>,
) -> Result<(), StoreError> {
    let (Some(key), Some(usage)) = (model.calibration_key(), usage) else {
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
        .observe_calibration(key, observation)
        .await
        .map(|_| ())
}
