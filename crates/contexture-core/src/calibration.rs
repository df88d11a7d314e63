//! Estimates that learn from what providers report.
//!
//! A model without a shipped tokenizer is counted with a [`TokenCounter::Estimate`]: an
//! exact count under an OpenAI encoding scaled by the registry's ratio. Every call to such a
//! model brings back the provider's own count of the request's input tokens; set against the
//! estimate the request was built with, it says how far the ratio is off. A [`Calibration`]
//! keeps the last [`WINDOW`] of these [`Observation`]s for a model family and turns them
//! into a correction [`Calibration::factor`] for the ratio:
//!
//! - an over-estimate is preferred to an under-estimate (a request must never exceed the real
//!   window), so the factor is a **high quantile** ([`QUANTILE`]) of the ratios of reported
//!   to estimated tokens among the observations kept: scaled by it, the estimate of nine
//!   requests in ten is at least what their provider reported, while a few odd requests
//!   cannot set it alone. It never lowers the registry's ratio, which is the floor: a
//!   request is never measured smaller than the registry says;
//! - it is bounded: the factor stays within [`FACTOR_BOUNDS`], and an observation whose ratio
//!   falls outside [`OBSERVATION_BOUNDS`] is refused;
//! - it is robust to outliers: a report more than [`OUTLIER_SPREAD`] times above or below
//!   the median of those kept (a provider counting cached or image tokens, a broken proxy)
//!   is refused and counted, not kept; tiny requests (under [`MIN_ESTIMATE`] tokens), whose
//!   ratios are mostly fixed overhead, are ignored; and old observations leave the window;
//! - until [`MIN_OBSERVATIONS`] are kept there is no factor: the registry's ratio stands.
//!
//! This module decides; the store keeps a calibration per model family and the engine
//! feeds it each recorded call.

use serde::{Deserialize, Serialize};

use crate::tokens::TokenCounter;

/// The most observations a calibration keeps (the newest).
pub const WINDOW: usize = 64;
/// Observations kept before a calibration gives a factor.
pub const MIN_OBSERVATIONS: usize = 3;
/// Requests estimated below this many tokens are not observed.
pub const MIN_ESTIMATE: u64 = 32;
/// The least and the most the registry's ratio may be scaled by: the registry's ratio is
/// the floor.
pub const FACTOR_BOUNDS: (f64, f64) = (1.0, 3.0);
/// The ratios an observation may have to be kept.
pub const OBSERVATION_BOUNDS: (f64, f64) = (0.5, 3.0);
/// The share of kept observations the factor covers (nearest rank).
pub const QUANTILE: f64 = 0.9;
/// How far from the median ratio of the kept observations a new one may be, as a multiple
/// either way, before it is refused as an outlier.
pub const OUTLIER_SPREAD: f64 = 3.0;

/// One call: the request's estimated input tokens (under the registry's ratio, before any
/// calibration) and the input tokens its provider reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The estimate the request was measured with, uncalibrated.
    pub estimated: u64,
    /// What the provider reported.
    pub reported: u64,
}

impl Observation {
    /// Reported over estimated tokens.
    pub fn ratio(&self) -> f64 {
        self.reported as f64 / self.estimated as f64
    }
}

/// What [`Calibration::observe`] did with an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Kept: it counts towards the factor.
    Kept,
    /// Ignored: the request was too small (or reported nothing) to say anything.
    TooSmall,
    /// Refused as an outlier: out of bounds, or too far from the median.
    Outlier,
}

/// A model family's calibration: its recent observations and counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The observations kept, oldest first; at most [`WINDOW`].
    pub observations: Vec<Observation>,
    /// Observations kept so far, those that have left the window included.
    pub kept: u64,
    /// Observations refused as outliers so far.
    pub outliers: u64,
}

impl Calibration {
    /// Takes in one call's observation.
    pub fn observe(&mut self, observation: Observation) -> Verdict {
        if observation.estimated < MIN_ESTIMATE || observation.reported == 0 {
            return Verdict::TooSmall;
        }
        let ratio = observation.ratio();
        let (low, high) = OBSERVATION_BOUNDS;
        let far_from_median = self.median().is_some_and(|median| {
            ratio > median * OUTLIER_SPREAD || ratio < median / OUTLIER_SPREAD
        });
        if !(low..=high).contains(&ratio) || far_from_median {
            self.outliers += 1;
            return Verdict::Outlier;
        }
        self.observations.push(observation);
        if self.observations.len() > WINDOW {
            let excess = self.observations.len() - WINDOW;
            self.observations.drain(..excess);
        }
        self.kept += 1;
        Verdict::Kept
    }

    /// The median ratio of the kept observations, once there are enough to judge by.
    fn median(&self) -> Option<f64> {
        if self.observations.len() < MIN_OBSERVATIONS {
            return None;
        }
        let mut ratios: Vec<f64> = self.observations.iter().map(Observation::ratio).collect();
        ratios.sort_by(f64::total_cmp);
        Some(ratios[ratios.len() / 2])
    }

    /// What the registry's ratio is scaled by: the [`QUANTILE`] of the kept ratios (by
    /// nearest rank), within [`FACTOR_BOUNDS`]; `None` until [`MIN_OBSERVATIONS`] are kept.
    pub fn factor(&self) -> Option<f64> {
        let count = self.observations.len();
        if count < MIN_OBSERVATIONS {
            return None;
        }
        let mut ratios: Vec<f64> = self.observations.iter().map(Observation::ratio).collect();
        ratios.sort_by(f64::total_cmp);
        let rank = ((QUANTILE * count as f64).ceil() as usize).clamp(1, count);
        Some(ratios[rank - 1].clamp(FACTOR_BOUNDS.0, FACTOR_BOUNDS.1))
    }

    /// `counter` corrected by the factor (in place of any earlier correction): an
    /// estimate's rounded count is scaled by it and rounded up again, so a request measured
    /// with it is at least the factor times its uncalibrated estimate; an exact count is left
    /// as it is (there is nothing to learn).
    pub fn apply(&self, counter: TokenCounter) -> TokenCounter {
        match (counter, self.factor()) {
            (
                TokenCounter::Estimate {
                    encoding, ratio, ..
                },
                Some(factor),
            ) => TokenCounter::Estimate {
                encoding,
                ratio,
                calibration: Some(factor),
            },
            _ => counter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Encoding;
    use proptest::prelude::*;

    fn seen(estimated: u64, reported: u64) -> Observation {
        Observation {
            estimated,
            reported,
        }
    }

    #[test]
    fn the_factor_is_a_high_quantile_of_the_kept_ratios_once_there_are_enough() {
        let mut calibration = Calibration::default();
        assert_eq!(calibration.observe(seen(1000, 1100)), Verdict::Kept);
        assert_eq!(calibration.observe(seen(1000, 1200)), Verdict::Kept);
        assert_eq!(calibration.factor(), None, "two are not enough");
        assert_eq!(calibration.observe(seen(2000, 2100)), Verdict::Kept);
        assert_eq!(calibration.factor(), Some(1.2), "of three, the largest");
        // Of twenty, the 18th: two odd requests do not set it.
        let mut many = Calibration::default();
        for _ in 0..18 {
            many.observe(seen(1000, 1100));
        }
        many.observe(seen(1000, 2000));
        many.observe(seen(1000, 2200));
        assert_eq!(many.factor(), Some(1.1));
        let counter = TokenCounter::Estimate {
            encoding: Encoding::Cl100kBase,
            ratio: 1.25,
            calibration: None,
        };
        assert_eq!(
            calibration.apply(counter),
            TokenCounter::Estimate {
                encoding: Encoding::Cl100kBase,
                ratio: 1.25,
                calibration: Some(1.2),
            }
        );
        let exact = TokenCounter::exact(Encoding::O200kBase);
        assert_eq!(
            calibration.apply(exact),
            exact,
            "exact counts are not calibrated"
        );
    }

    #[test]
    fn table_of_verdicts() {
        let mut calibration = Calibration::default();
        for observation in [seen(1000, 900), seen(1000, 1000), seen(1000, 950)] {
            calibration.observe(observation);
        }
        for (observation, verdict) in [
            (seen(10, 30), Verdict::TooSmall),
            (seen(1000, 0), Verdict::TooSmall),
            (seen(1000, 3100), Verdict::Outlier),
            (seen(1000, 400), Verdict::Outlier),
            (seen(1000, 2500), Verdict::Kept),
            (seen(100, 120), Verdict::Kept),
        ] {
            let mut copy = calibration.clone();
            assert_eq!(copy.observe(observation), verdict, "{observation:?}");
        }
        // Far from the median, though within bounds: an outlier.
        let mut steady = Calibration::default();
        for _ in 0..10 {
            steady.observe(seen(1000, 700));
        }
        assert_eq!(steady.observe(seen(1000, 2500)), Verdict::Outlier);
        assert_eq!(steady.outliers, 1);
        assert_eq!(
            steady.factor(),
            Some(1.0),
            "every report was lower, and the registry's ratio is the floor"
        );
    }

    #[test]
    fn the_window_keeps_the_newest() {
        let mut calibration = Calibration::default();
        calibration.observe(seen(1000, 1500));
        for _ in 0..WINDOW {
            calibration.observe(seen(1000, 1100));
        }
        assert_eq!(calibration.observations.len(), WINDOW);
        assert_eq!(calibration.kept, WINDOW as u64 + 1);
        assert_eq!(calibration.factor(), Some(1.1), "the old high one has left");
    }

    proptest! {
        /// Whatever the provider reports, the factor stays in bounds and, applied to the
        /// estimate, covers at least the quantile's share of the reports it kept; the
        /// window stays bounded.
        #[test]
        fn covers_the_quantile_of_its_kept_reports(
            reports in proptest::collection::vec((1u64..50_000, 0u64..200_000), 0..200)
        ) {
            let mut calibration = Calibration::default();
            for (estimated, reported) in reports {
                calibration.observe(seen(estimated, reported));
            }
            prop_assert!(calibration.observations.len() <= WINDOW);
            if let Some(factor) = calibration.factor() {
                prop_assert!((FACTOR_BOUNDS.0..=FACTOR_BOUNDS.1).contains(&factor));
                let kept = &calibration.observations;
                let covered = kept
                    .iter()
                    .filter(|kept| (kept.estimated as f64 * factor).ceil() as u64 >= kept.reported)
                    .count();
                let needed = (QUANTILE * kept.len() as f64).ceil() as usize;
                prop_assert!(covered >= needed, "{covered} of {} at {factor}", kept.len());
            }
        }
    }
}
