//! A request's budget as the inspector draws it: five parts across the usable window.

use contexture_core::budget::{BudgetBreakdown, BudgetParts};
use serde::Serialize;

/// The drawn bar's length in its own units (the SVG's view box).
const BAR_UNITS: usize = 1000;

/// The names of the parts, in drawing order.
const PART_NAMES: [&str; 5] = ["system", "tools", "history", "reserve", "free"];

/// One part of the bar.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BarPart {
    /// `system`, `tools`, `history`, `reserve` or `free`.
    pub name: &'static str,
    /// Its tokens.
    pub tokens: u64,
    /// Where it starts along the bar, in [`BAR_UNITS`].
    pub x: usize,
    /// Its length along the bar, in [`BAR_UNITS`] (at least one when it is not empty).
    pub width: usize,
}

/// A request's budget: the window's arithmetic and its five parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetBar {
    /// The model the budget is for.
    pub model: String,
    /// The encoding the counts come from, and whether they are exact.
    pub encoding: String,
    /// Whether the counts are the model's own encoding's (else estimated).
    pub exact: bool,
    /// The model's context window.
    pub context_window: u32,
    /// The share of it the budget may use.
    pub budget_ratio: f64,
    /// The usable tokens: the window times the ratio.
    pub usable: u32,
    /// The tokens the request used.
    pub used: u32,
    /// The parts, in drawing order.
    pub parts: Vec<BarPart>,
    /// The bar's length in its units.
    pub units: usize,
}

impl BudgetBar {
    /// The bar of `budget`.
    pub fn of(budget: &BudgetBreakdown) -> BudgetBar {
        let parts = BudgetParts::of(budget);
        let cells = parts.cells(BAR_UNITS);
        let mut x = 0;
        let parts = PART_NAMES
            .iter()
            .zip(parts.in_order())
            .zip(cells)
            .map(|((&name, tokens), width)| {
                let part = BarPart {
                    name,
                    tokens,
                    x,
                    width,
                };
                x += width;
                part
            })
            .collect();
        BudgetBar {
            model: budget.model.clone(),
            encoding: budget.encoding.clone(),
            exact: budget.exact,
            context_window: budget.limits.context_window,
            budget_ratio: budget.limits.budget_ratio,
            usable: budget.limits.usable,
            used: budget.used,
            parts,
            units: BAR_UNITS,
        }
    }
}
