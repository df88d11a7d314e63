//! Conditions over the context and the last output.
//!
//! Expressions are Jinja expressions (`user_role == 'admin'`,
//! `count > 3 and status in ['ok', 'done']`, `output.score >= 0.8`), evaluated by minijinja's
//! expression engine in the same sandbox as templates: no code execution, no file or
//! environment access, a fuel limit. Variables are the context's root keys, plus `output`, the
//! last step's parsed output (it takes precedence over a context key named `output`). A
//! missing variable is Jinja's `undefined`: false in a test, unequal to everything.
//!
//! An expression is compiled when a [`Condition`] is built (and deserialising one builds it),
//! so a malformed expression is reported when the workflow is validated, with its column.

use std::fmt;

use minijinja::UndefinedBehavior;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dynamic::FixedIds;
use super::isolation::{Evaluated, JobOutcome, RenderIsolation, RenderJob, mismatched};
use super::store::ContextStore;
use super::template::{DEFAULT_FUEL, sandbox};

/// Why an expression could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ExprError {
    /// The expression is not valid Jinja.
    #[error("invalid expression {expression:?} at column {column}: {message}")]
    Syntax {
        /// The expression.
        expression: String,
        /// 1-based column (in characters) where the problem was found.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// The expression failed while running (bad operand types, a failing filter...).
    #[error("cannot evaluate {expression:?}: {message}")]
    Eval {
        /// The expression.
        expression: String,
        /// What went wrong.
        message: String,
    },
}

/// What an expression sees: the context store and the last step's output.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    /// The context store; its root keys are the variables.
    pub store: &'a ContextStore,
    /// The last output's parsed value, visible as `output`.
    pub output: Option<&'a Value>,
    /// Where the expression runs when not in this process (see [`RenderIsolation`]).
    pub isolation: Option<&'a dyn RenderIsolation>,
}

impl fmt::Debug for Scope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("store", self.store)
            .field("output", &self.output)
            .field("isolated", &self.isolation.is_some())
            .finish()
    }
}

impl<'a> Scope<'a> {
    /// A scope over `store` alone.
    pub fn new(store: &'a ContextStore) -> Scope<'a> {
        Scope {
            store,
            output: None,
            isolation: None,
        }
    }

    /// The same scope with `output` visible.
    pub fn with_output(mut self, output: &'a Value) -> Scope<'a> {
        self.output = Some(output);
        self
    }

    /// The same scope, evaluating through `isolation` (when given) instead of in this
    /// process.
    pub fn isolated_by(mut self, isolation: Option<&'a dyn RenderIsolation>) -> Scope<'a> {
        self.isolation = isolation;
        self
    }

    fn to_value(self) -> minijinja::Value {
        let mut map = self.store.as_map().clone();
        if let Some(output) = self.output {
            map.insert("output".to_owned(), output.clone());
        }
        minijinja::Value::from(minijinja::value::Serde(&map))
    }
}

/// A compiled (validated) expression.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Condition {
    source: String,
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Condition({:?})", self.source)
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl TryFrom<String> for Condition {
    type Error = ExprError;

    fn try_from(source: String) -> Result<Condition, ExprError> {
        Condition::compile(source)
    }
}

impl From<Condition> for String {
    fn from(condition: Condition) -> String {
        condition.source
    }
}

impl Condition {
    /// Compiles `source`; a syntax error names its column.
    pub fn compile(source: impl Into<String>) -> Result<Condition, ExprError> {
        let source = source.into();
        let env = sandbox(UndefinedBehavior::Chainable, DEFAULT_FUEL);
        if source.trim().is_empty() {
            return Err(ExprError::Syntax {
                expression: source,
                column: 1,
                message: "the expression is empty".to_owned(),
            });
        }
        if let Err(error) = env.compile_expression(&source) {
            let column = error.range().map_or(1, |range| {
                source[..range.start.min(source.len())].chars().count() + 1
            });
            let message = match error.detail() {
                Some(detail) => detail.to_owned(),
                None => error.kind().to_string(),
            };
            return Err(ExprError::Syntax {
                expression: source,
                column,
                message,
            });
        }
        Ok(Condition { source })
    }

    /// The expression text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates the expression to a JSON value (`undefined` becomes `null`).
    pub fn value(&self, scope: Scope<'_>) -> Result<Value, ExprError> {
        Ok(self.evaluate(scope, true)?.value.unwrap_or(Value::Null))
    }

    /// Evaluates the expression as a test, by Jinja truthiness (empty strings, lists and
    /// maps, zero, none and undefined are false).
    pub fn is_true(&self, scope: Scope<'_>) -> Result<bool, ExprError> {
        Ok(self.evaluate(scope, false)?.truthy)
    }

    /// Evaluates the expression to its truthiness and, when `value_wanted`, its value as
    /// JSON; through the scope's isolation when it has one.
    pub fn evaluate(&self, scope: Scope<'_>, value_wanted: bool) -> Result<Evaluated, ExprError> {
        let Some(isolation) = scope.isolation else {
            return self.evaluate_here(scope, value_wanted);
        };
        let job = RenderJob::Evaluate {
            expression: self.source.clone(),
            store: scope.store.clone(),
            output: scope.output.cloned(),
            value_wanted,
        };
        let fail = |message: String| ExprError::Eval {
            expression: self.source.clone(),
            message,
        };
        // An expression has no `uuid`: nothing asks for ids.
        match isolation.run(&job, &FixedIds::default()) {
            Ok(JobOutcome::Evaluated(result)) => result,
            Ok(other) => Err(fail(mismatched(&other).message)),
            Err(failure) => Err(fail(failure.message)),
        }
    }

    fn evaluate_here(&self, scope: Scope<'_>, value_wanted: bool) -> Result<Evaluated, ExprError> {
        let value = self.eval(scope)?;
        let truthy = value.is_true();
        if !value_wanted {
            return Ok(Evaluated {
                value: None,
                truthy,
            });
        }
        if value.is_undefined() {
            return Ok(Evaluated {
                value: Some(Value::Null),
                truthy,
            });
        }
        let value = serde_json::to_value(&value).map_err(|error| ExprError::Eval {
            expression: self.source.clone(),
            message: error.to_string(),
        })?;
        Ok(Evaluated {
            value: Some(value),
            truthy,
        })
    }

    /// Evaluates the expression in a fresh sandbox.
    fn eval(&self, scope: Scope<'_>) -> Result<minijinja::Value, ExprError> {
        let env = sandbox(UndefinedBehavior::Chainable, DEFAULT_FUEL);
        let fail = |error: minijinja::Error| ExprError::Eval {
            expression: self.source.clone(),
            message: match error.detail() {
                Some(detail) => format!("{}: {detail}", error.kind()),
                None => error.kind().to_string(),
            },
        };
        let expression = env.compile_expression(&self.source).map_err(fail)?;
        expression.eval(scope.to_value()).map_err(fail)
    }
}

/// `condition` / `then` / `otherwise`: two-way branching.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch<T> {
    /// The test.
    #[serde(rename = "expression")]
    pub condition: Condition,
    /// Chosen when the test is true.
    pub then: T,
    /// Chosen when the test is false.
    pub otherwise: T,
}

impl<T> Branch<T> {
    /// The branch the scope selects.
    pub fn choose(&self, scope: Scope<'_>) -> Result<&T, ExprError> {
        Ok(if self.condition.is_true(scope)? {
            &self.then
        } else {
            &self.otherwise
        })
    }
}

/// One case of a [`Switch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case<T> {
    /// The test.
    pub condition: Condition,
    /// Chosen when this is the first true case.
    pub target: T,
}

/// Switch-style branching: the first case whose condition holds, else the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switch<T> {
    /// The cases, tested in order.
    pub cases: Vec<Case<T>>,
    /// Chosen when no case holds.
    #[serde(default)]
    pub default: Option<T>,
}

impl<T> Switch<T> {
    /// The first true case's target, else the default (`None` if there is none).
    pub fn choose(&self, scope: Scope<'_>) -> Result<Option<&T>, ExprError> {
        for case in &self.cases {
            if case.condition.is_true(scope)? {
                return Ok(Some(&case.target));
            }
        }
        Ok(self.default.as_ref())
    }
}
