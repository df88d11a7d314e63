//! The workflow context store: output parsing, transition flags,
//! templates, expressions, iteration.
//!
//! "Context" here means the execution's key-value store that templates read; a thread's
//! named contexts (lines of history) are [`crate::thread`]'s, and a model's context window is
//! [`crate::registry`]'s.
//!
//! A workflow execution carries one [`ContextStore`]: a JSON key-value map that every state
//! reads from (through [templates](template) and [conditions](expr)) and writes to (through its
//! parsed output and its [transition flags](flags)). Everything here is pure: time and ids reach
//! the template engine through the [`Clock`] and [`IdSource`] traits, and nothing touches the
//! disk, the network or the process environment.
//!
//! The pieces, in the order a step uses them:
//! - [`parse`]: turns a step's raw output into a value (JSON, Python literal, fenced JSON, JSON
//!   inside prose, else plain text) and says which root keys it contributes.
//! - [`flags`]: applies a step's output to the store under the transition flags, with one
//!   precedence table (docs/context-store.md), and says what changed.
//! - [`template`]: sandboxed Jinja rendering over the store with a missing-variable policy,
//!   recursive resolution of template values, and the keys each render used.
//! - [`expr`]: conditions and switch cases, compiled (and so validated) before they run.
//! - [`iter`]: selects the items of an iteration, gives each its own copy of the context and
//!   merges the copies back by a declared policy.
//! - [`args`]: renders configured tool arguments; the context never adds or replaces one.

pub mod args;
pub mod dynamic;
pub mod expr;
pub mod flags;
pub mod isolation;
pub mod iter;
pub mod parse;
pub mod path;
pub mod prompt;
pub mod pylit;
pub mod store;
pub mod template;
mod text_budget;

pub use dynamic::{Clock, FixedClock, FixedIds, IdSource, Timestamp};
pub use expr::{Branch, Condition, ExprError, Scope, Switch};
pub use flags::{
    ClearContextStore, StoreChange, TransitionFlags, TransitionOutcome, apply_transition,
};
pub use isolation::{IsolationFailure, JobOutcome, RenderIsolation, RenderJob};
pub use iter::{IterError, IterationItem, MergePolicy, select_items};
pub use parse::{OutputFormat, ParsedOutput, parse_output, parse_output_bytes};
pub use path::Path;
pub use prompt::PromptTemplate;
pub use store::ContextStore;
pub use template::{
    MissingPolicy, RenderOptions, Rendered, TemplateError, TemplateFormat, USER_CONTEXT, render,
    render_fstring,
};
