//! Fitting a history into a model's window.
//!
//! - [`validate()`] lists every place a message list breaks a provider's rules, and [`repair()`]
//!   fixes what it can without inventing content (module [`mod@validate`], [`mod@repair`]).
//! - [`units()`] groups a history into the pieces that are kept or dropped whole: an assistant
//!   turn with its tool results, or one other message; [`IndexedHistory`] keeps those units
//!   and their token costs as messages are appended.
//! - [`trim()`] and [`IndexedHistory::fit`] cut a history to a token budget by strategy
//!   (last, first, head+tail) with hysteresis, pinned messages and the system prompt kept.
//! - [`clear_tool_results`] replaces old tool results with placeholders, and
//!   [`truncate_tool_results`] cuts oversized ones to their start and end.
//! - [`clear_thinking`] leaves the reasoning of older assistant turns out.
//! - [`FitPolicy`] holds all of those choices, as workflows, chat threads and the command
//!   line set them.
//!
//! Invariant: every message list these functions return passes [`validate()`] for the
//! provider they were given, whenever their input did (and [`repair()`] makes it so).

pub mod clear;
pub mod policy;
pub mod repair;
pub mod shrink;
pub mod system_role;
pub mod thinking;
pub mod trim;
pub mod truncate;
pub mod units;
pub mod validate;

pub use clear::{
    Carried, ClearInputs, ClearOptions, ClearPolicy, ClearTrigger, Cleared, ClearedResult,
    Replacements, carry_cleared, clear_tool_results, clear_tool_results_with, cleared_placeholder,
    is_cleared_placeholder,
};
pub use policy::FitPolicy;
pub use repair::{RepairChange, cancelled_result_text, repair};
pub use shrink::{CutMemory, HistoryCut, Hysteresis, RequestParts, ShrinkPolicy, Shrunk, shrink};
pub use system_role::{SystemRole, UnknownSystemRole, place_system_prompt};
pub use thinking::{ClearedThinking, ThinkingPolicy, clear_thinking, reasoning_turns};
pub use trim::{
    MARKER_TAG, Strategy, TrimError, TrimOptions, Trimmed, UnknownStrategy, marker_message, trim,
};
pub use truncate::{TruncatePolicy, Truncated, TruncatedResult, truncate_tool_results};
pub use units::{IndexedHistory, Unit, units};
pub use validate::{Rules, UnknownRules, Violation, ViolationKind, validate};
