//! Renders run somewhere else, for templates nobody vouches for.
//!
//! Fuel and the output limit bound what a render does in most ways, but not every way a
//! template can turn data into text: a list that holds the same long string many times
//! (`[s] * 100000`, or lists of lists of it) costs little to build, and turning it into text
//! with `~` or a string filter allocates its whole printed size before any budget is asked.
//! Comparing or hashing such a list can likewise take unbounded time in one step. A server
//! therefore renders the templates and expressions of a workflow a client sent through a
//! [`RenderIsolation`]: a render is described as a [`RenderJob`] (plain data), run where its
//! memory and time are bounded (the engine's worker processes), and answered with a
//! [`JobOutcome`]. [`run_job`] is what the isolated side runs: the ordinary in-process render.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::dynamic::{FixedClock, IdSource, Timestamp};
use super::expr::{Condition, ExprError, Scope};
use super::store::ContextStore;
use super::template::{MissingPolicy, RenderOptions, Rendered, TemplateError};

/// Runs render jobs where their memory and time are bounded.
pub trait RenderIsolation: Send + Sync {
    /// Runs `job` and returns its outcome. `ids` answers the job's requests for fresh ids
    /// (`uuid` in a template), so that ids come from the caller's source.
    fn run(&self, job: &RenderJob, ids: &dyn IdSource) -> Result<JobOutcome, IsolationFailure>;
}

/// Why an isolated render gave no outcome: it passed a limit (memory, time) or whatever
/// ran it failed. The message says which, with the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct IsolationFailure {
    /// What went wrong, for people.
    pub message: String,
}

/// The settings of a render, as data: [`RenderOptions`] with the clock read once and without
/// the id source (ids are asked of the caller).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderSettings {
    /// What a missing variable renders as.
    pub missing: MissingPolicy,
    /// Instruction budget of one render.
    pub fuel: u64,
    /// The most bytes one render may write.
    pub max_output_bytes: usize,
    /// The moment `current_date` and friends show.
    pub now: Timestamp,
    /// The caller's extra variables.
    pub variables: Map<String, Value>,
    /// The run's user context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_context: Option<Map<String, Value>>,
}

impl RenderSettings {
    /// The settings of `options`, its clock read now.
    pub fn of(options: &RenderOptions) -> RenderSettings {
        RenderSettings {
            missing: options.missing,
            fuel: options.fuel,
            max_output_bytes: options.max_output_bytes,
            now: options.clock.now(),
            variables: options.variables.clone(),
            user_context: options
                .user_context
                .as_deref()
                .and_then(Value::as_object)
                .cloned(),
        }
    }

    /// In-process options with these settings, a clock stopped at `now` and ids from `ids`.
    pub fn into_options(self, ids: Arc<dyn IdSource>) -> RenderOptions {
        let mut options = RenderOptions::new(Arc::new(FixedClock(self.now)), ids)
            .with_missing(self.missing)
            .with_fuel(self.fuel)
            .with_max_output_bytes(self.max_output_bytes);
        options.variables = self.variables;
        options.with_user_context(self.user_context)
    }
}

/// One render, as data.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RenderJob {
    /// [`render`](super::template::render) a template to text.
    Render {
        /// The template.
        template: String,
        /// Its context store.
        #[serde(rename = "context")]
        store: ContextStore,
        /// How to render.
        settings: RenderSettings,
    },
    /// [`render_value`](super::template::render_value) a template to a JSON value.
    RenderValue {
        /// The template.
        template: String,
        /// Its context store.
        #[serde(rename = "context")]
        store: ContextStore,
        /// How to render.
        settings: RenderSettings,
    },
    /// Evaluate an expression (a [`Condition`]).
    Evaluate {
        /// The expression.
        expression: String,
        /// Its context store.
        #[serde(rename = "context")]
        store: ContextStore,
        /// The last output, visible as `output`.
        output: Option<Value>,
        /// Whether the value is wanted, or only its truthiness.
        value_wanted: bool,
    },
}

impl fmt::Debug for RenderJob {
    // The context can be large: the job is named by its kind and source only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderJob::Render { template, .. } => f.debug_tuple("Render").field(template).finish(),
            RenderJob::RenderValue { template, .. } => {
                f.debug_tuple("RenderValue").field(template).finish()
            }
            RenderJob::Evaluate { expression, .. } => {
                f.debug_tuple("Evaluate").field(expression).finish()
            }
        }
    }
}

/// An expression's truthiness with, when asked for, its value (JSON alone cannot always tell
/// the truthiness, as for Jinja's `undefined`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluated {
    /// The value (`undefined` is `null`), when it was asked for.
    pub value: Option<Value>,
    /// Whether Jinja counts it true.
    pub truthy: bool,
}

/// What a job gave, of the kind the job asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "result", rename_all = "snake_case")]
pub enum JobOutcome {
    /// A [`RenderJob::Render`]'s result.
    Rendered(Result<Rendered, TemplateError>),
    /// A [`RenderJob::RenderValue`]'s result.
    Valued(Result<(Value, Rendered), TemplateError>),
    /// A [`RenderJob::Evaluate`]'s result.
    Evaluated(Result<Evaluated, ExprError>),
}

/// Runs `job` here, in this process, asking `ids` for fresh ids: what the isolated side of a
/// [`RenderIsolation`] does with a job it is given.
pub fn run_job(job: RenderJob, ids: Arc<dyn IdSource>) -> JobOutcome {
    match job {
        RenderJob::Render {
            template,
            store,
            settings,
        } => JobOutcome::Rendered(super::template::render(
            &template,
            &store,
            &settings.into_options(ids),
        )),
        RenderJob::RenderValue {
            template,
            store,
            settings,
        } => JobOutcome::Valued(super::template::render_value(
            &template,
            &store,
            &settings.into_options(ids),
        )),
        RenderJob::Evaluate {
            expression,
            store,
            output,
            value_wanted,
        } => {
            let scope = Scope {
                store: &store,
                output: output.as_ref(),
                isolation: None,
            };
            JobOutcome::Evaluated(
                Condition::compile(expression)
                    .and_then(|condition| condition.evaluate(scope, value_wanted)),
            )
        }
    }
}

/// The error a caller reports when an isolation answered a job with an outcome of another
/// kind (a broken isolation, never a template's fault).
pub(crate) fn mismatched(outcome: &JobOutcome) -> IsolationFailure {
    IsolationFailure {
        message: format!(
            "the isolated render answered with the wrong kind of outcome: {outcome:?}"
        ),
    }
}
