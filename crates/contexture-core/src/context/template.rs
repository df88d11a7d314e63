//! Sandboxed Jinja templates over the context store.
//!
//! Rendering runs on minijinja with no loader (`include` and `import` find nothing: no file
//! access), no access to the process environment, and a fuel limit, so a runaway loop stops
//! with [`TemplateError::OutOfFuel`]. Values print as themselves when they are strings or
//! numbers and as compact JSON otherwise (`null`, `[1,2]`, `{"a":1}`).
//!
//! **Missing variables** follow [`MissingPolicy`]. Minijinja's own undefined behaviours cannot
//! keep the literal text, so before rendering, every `{{ path }}` tag whose expression is a
//! plain path (`name`, `user.profile.name`, `files/0/name`, `files[0].name`) and whose root is
//! not a variable the template defines itself (a loop variable, a `set`) is checked against the
//! context: a path that does not resolve is kept verbatim (`Keep`, the default), replaced with
//! nothing (`Empty`), or reported by name (`Error`). Inside larger expressions
//! (`{{ name | upper }}`, `{% if name %}`) a missing value is Jinja's `undefined` (empty, false,
//! and `default(...)` applies) under `Keep` and `Empty`, and an error naming the variable under
//! `Error`. Paths with `/` separators are rewritten to `[...]` lookups, since Jinja would read
//! `/` as division.
//!
//! **Literal braces:** `{% raw %}{{ not a variable }}{% endraw %}`, or `{{ '{{' }}`.
//!
//! **Recursive values:** a context value that contains a template (a string with `{{` or
//! `{%`, at any depth inside the value) is rendered, with the same context and policy, when a
//! template first reads it. A cycle (`a` = `{{b}}`, `b` = `{{a}}`) is
//! [`TemplateError::Cycle`] naming the keys in order.
//!
//! **Dynamic variables** ([`super::dynamic::DYNAMIC_VARIABLES`]) come from the [`Clock`] and
//! [`IdSource`] in the options, and caller-supplied ones (system values such as `hostname`)
//! from [`RenderOptions::variables`]; a context key of the same name takes precedence. Within one
//! render each dynamic variable has one value (`{{uuid}}` twice prints the same id).
//!
//! **The user context** ([`RenderOptions::user_context`]), a run's read-only object, is
//! `user_context`: it comes before everything, context keys included.
//!
//! The parts: `scan` finds the expression tags of a template source, `roots` answers which
//! names a template may read (context keys, with the templates inside their values rendered,
//! then the caller's and the dynamic variables), and `rendering` rewrites the tags by the
//! missing-variable policy and runs the sandbox. This module holds what they share: the
//! policy, the limits, the options, the result and the error.

pub(crate) mod fstring;
mod rendering;
mod roots;
mod scan;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::dynamic::{Clock, FixedClock, FixedIds, IdSource};
use super::isolation::{JobOutcome, RenderIsolation, RenderJob};

pub(crate) use rendering::jinja_variables;
pub(crate) use rendering::sandbox;
pub use rendering::{check_syntax, render, render_fstring, render_value};
pub use scan::has_template;

/// Which syntax a template is written in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateFormat {
    /// Jinja: `{{ name }}`, filters, `{% if %}`, loops (the default).
    #[default]
    Jinja,
    /// The simple syntax: `{name}` is a variable, `{{` and `}}` are literal braces.
    Fstring,
}

impl std::str::FromStr for TemplateFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<TemplateFormat, String> {
        match text {
            "jinja" => Ok(TemplateFormat::Jinja),
            "fstring" => Ok(TemplateFormat::Fstring),
            other => Err(format!(
                "unknown template format {other:?} (jinja or fstring)"
            )),
        }
    }
}

impl fmt::Display for TemplateFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TemplateFormat::Jinja => "jinja",
            TemplateFormat::Fstring => "fstring",
        })
    }
}

/// What a `{{ path }}` whose path does not resolve renders as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingPolicy {
    /// The tag stays as written: `{{name}}` renders `{{name}}` (the default).
    #[default]
    Keep,
    /// The tag renders as nothing.
    Empty,
    /// The render fails with [`TemplateError::Missing`] naming every missing path.
    Error,
}

impl std::str::FromStr for MissingPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<MissingPolicy, String> {
        match text {
            "keep" => Ok(MissingPolicy::Keep),
            "empty" => Ok(MissingPolicy::Empty),
            "error" => Ok(MissingPolicy::Error),
            other => Err(format!(
                "unknown missing-variable policy {other:?} (keep, empty or error)"
            )),
        }
    }
}

/// Default fuel: enough for loops over tens of thousands of items, small enough that an
/// endless loop stops in well under a second. Fuel also pays for the data a render creates
/// (about one unit per 64 bytes: strings and lists built by operators and filters, and the
/// output), so it bounds a render's memory too: about 64 MB at this budget, whatever the
/// template repeats, doubles or joins. A few single steps escape it (a list that repeats a
/// long string turned into text by `~` or a string filter is charged only once it is made):
/// a template nobody vouches for renders through a [`RenderIsolation`] that caps memory and
/// time.
pub const DEFAULT_FUEL: u64 = 1_000_000;

/// Default limit of one render's output: 16 MiB, twice the text of the largest model
/// windows; a template that would write more stops there instead of growing without bound.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// The name templates read the run's user context by ([`RenderOptions::user_context`]).
pub const USER_CONTEXT: &str = "user_context";

/// Deepest chain of context values that render other context values (`a` uses `b` uses ...).
pub const MAX_VALUE_NESTING: usize = 32;

/// How to render.
#[derive(Clone)]
pub struct RenderOptions {
    /// What a missing variable renders as.
    pub missing: MissingPolicy,
    /// Instruction budget of one render (each recursive value render has its own).
    pub fuel: u64,
    /// The most bytes one render may write, checked as it writes (each recursive value
    /// render has its own limit too).
    pub max_output_bytes: usize,
    /// Source of `current_date` and friends.
    pub clock: Arc<dyn Clock>,
    /// Source of `uuid` and `short_uuid`.
    pub ids: Arc<dyn IdSource>,
    /// More variables supplied by the caller, such as the system values `hostname`,
    /// `username`, `os` and `working_directory` (the CLI fills these; the core reads nothing
    /// from the machine). A context key of the same name takes precedence.
    pub variables: Map<String, Value>,
    /// The run's user context (who asked, their plan, their locale...), read as
    /// `user_context.*`: set once for a run and seen by every sub-workflow below it. Unlike
    /// the caller's variables it takes precedence over a context key of the same name, so
    /// no step can shadow or change it.
    /// Always an object (see [`RenderOptions::with_user_context`]).
    pub user_context: Option<Arc<Value>>,
    /// Where renders run when not in this process: set for templates nobody vouches for
    /// (a workflow a client sent), so that their memory and time are bounded.
    pub isolation: Option<Arc<dyn RenderIsolation>>,
}

impl fmt::Debug for RenderOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenderOptions")
            .field("missing", &self.missing)
            .field("fuel", &self.fuel)
            .field("now", &self.clock.now())
            .field("isolated", &self.isolation.is_some())
            .finish_non_exhaustive()
    }
}

impl RenderOptions {
    /// Options with the default policy (keep) and fuel, and the given time and id sources.
    pub fn new(clock: Arc<dyn Clock>, ids: Arc<dyn IdSource>) -> RenderOptions {
        RenderOptions {
            missing: MissingPolicy::Keep,
            fuel: DEFAULT_FUEL,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            clock,
            ids,
            variables: Map::new(),
            user_context: None,
            isolation: None,
        }
    }

    /// Deterministic options for tests and previews: a clock stopped at `unix_seconds` (UTC)
    /// and ids counting from zero.
    pub fn fixed(unix_seconds: i64) -> RenderOptions {
        RenderOptions::new(
            Arc::new(FixedClock::utc(unix_seconds)),
            Arc::new(FixedIds::default()),
        )
    }

    /// The same options with another missing-variable policy.
    pub fn with_missing(mut self, missing: MissingPolicy) -> RenderOptions {
        self.missing = missing;
        self
    }

    /// The same options with one more caller-supplied variable.
    pub fn with_variable(mut self, name: impl Into<String>, value: Value) -> RenderOptions {
        self.variables.insert(name.into(), value);
        self
    }

    /// The same options with the run's user context (see [`RenderOptions::user_context`]).
    pub fn with_user_context(mut self, user_context: Option<Map<String, Value>>) -> RenderOptions {
        self.user_context = user_context.map(|map| Arc::new(Value::Object(map)));
        self
    }

    /// The same options with another fuel budget.
    pub fn with_fuel(mut self, fuel: u64) -> RenderOptions {
        self.fuel = fuel;
        self
    }

    /// The same options with another output limit.
    pub fn with_max_output_bytes(mut self, bytes: usize) -> RenderOptions {
        self.max_output_bytes = bytes;
        self
    }

    /// The same options, rendering through `isolation` instead of in this process.
    pub fn with_isolation(mut self, isolation: Arc<dyn RenderIsolation>) -> RenderOptions {
        self.isolation = Some(isolation);
        self
    }

    /// Runs `job` through the isolation, if there is one.
    fn run_isolated(
        &self,
        job: impl FnOnce() -> RenderJob,
    ) -> Option<Result<JobOutcome, TemplateError>> {
        let isolation = self.isolation.as_ref()?;
        Some(
            isolation
                .run(&job(), self.ids.as_ref())
                .map_err(|failure| TemplateError::Isolation {
                    message: failure.message,
                }),
        )
    }
}

/// A finished render.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendered {
    /// The rendered text.
    pub text: String,
    /// The context's root keys the render read, directly or through recursive values, sorted.
    pub used_keys: Vec<String>,
    /// The paths that did not resolve and were kept or emptied per the policy, sorted.
    pub missing: Vec<String>,
}

/// Why a template could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum TemplateError {
    /// The template is not valid Jinja.
    #[error("template syntax error at line {line}: {message}")]
    Syntax {
        /// 1-based line in the template.
        line: usize,
        /// What the parser found wrong.
        message: String,
    },
    /// The template is not valid in the simple `{name}` syntax ([`TemplateFormat::Fstring`]).
    #[error("template syntax error at line {line}, column {column}: {message}")]
    FstringSyntax {
        /// 1-based line in the template.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// What is wrong, and how to write it instead.
        message: String,
    },
    /// Two prompt templates joined by `+` give one partial variable different values.
    #[error("both templates give partial variable `{name}` a value, and the values differ")]
    PartialConflict {
        /// The partial.
        name: String,
    },
    /// Variables were missing under [`MissingPolicy::Error`].
    #[error("missing variable{}: {}", if names.len() == 1 { "" } else { "s" }, names.join(", "))]
    Missing {
        /// The paths that did not resolve, sorted.
        names: Vec<String>,
    },
    /// Context values refer to each other in a loop.
    #[error("template cycle in context values: {}", keys.join(" -> "))]
    Cycle {
        /// The keys of the cycle, the first repeated at the end (`a -> b -> a`).
        keys: Vec<String>,
    },
    /// Context values refer to each other more than [`MAX_VALUE_NESTING`] levels deep.
    #[error("context values nest templates more than {MAX_VALUE_NESTING} levels deep: {}", keys.join(" -> "))]
    TooDeep {
        /// The chain of keys.
        keys: Vec<String>,
    },
    /// The render used up its fuel (an endless or huge loop, or too much data created).
    #[error(
        "template ran out of fuel after {fuel} units (an endless or very large loop, or more data than one render may create?)"
    )]
    OutOfFuel {
        /// The budget that ran out.
        fuel: u64,
    },
    /// The render would have written more than its limit.
    #[error("template output exceeds {limit} bytes (a loop or repetition that writes too much?)")]
    OutputTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A template stored in a context value failed.
    #[error("in the template of context key {key:?}: {error}")]
    InValue {
        /// The root key whose value holds the template.
        key: String,
        /// What went wrong there.
        error: Box<TemplateError>,
    },
    /// The render ran where its memory and time are bounded, and passed a bound (or what ran
    /// it failed); the message names the limit.
    #[error("template render stopped: {message}")]
    Isolation {
        /// What happened, with the limit.
        message: String,
    },
    /// Any other failure while rendering (a filter given bad input, a division by zero...).
    #[error("template error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Render {
        /// 1-based line, when known.
        line: Option<usize>,
        /// What went wrong.
        message: String,
    },
}
