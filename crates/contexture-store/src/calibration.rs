//! Calibrations of token estimates, one per model family (see
//! [`contexture_core::calibration`]): both stores keep each as JSON in a row of
//! `model_calibrations` (SQLite migration 0010, PostgreSQL migration 0009).
//!
//! Guarantees, the same for both stores and checked by the conformance suite:
//! - an observation is taken in within one transaction that reads the row, folds the
//!   observation in and writes it back, so concurrent writers (several server nodes) each
//!   add theirs and none is lost;
//! - a row holds at most the core's window of observations: storage does not grow with the
//!   number of calls;
//! - a row that cannot be read back is an error naming the model, never a silent reset.

use contexture_core::calibration::Calibration;

use crate::StoreError;

/// The stored text of `calibration`.
pub(crate) fn to_stored(calibration: &Calibration) -> String {
    serde_json::to_string(calibration)
        .unwrap_or_else(|_| unreachable!("numbers and lists of numbers"))
}

/// The calibration stored as `text` for `model`.
pub(crate) fn from_stored(model: &str, text: &str) -> Result<Calibration, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::CorruptCalibration {
        model: model.to_owned(),
        detail: error.to_string(),
    })
}
