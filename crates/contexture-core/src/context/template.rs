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

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value as JValue};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::dynamic::{Clock, FixedClock, FixedIds, IdSource, Timestamp, dynamic_value};
use super::isolation::{JobOutcome, RenderIsolation, RenderJob, RenderSettings, mismatched};
use super::path::Path;
use super::store::ContextStore;

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

/// Checks that `template` is valid Jinja without rendering it (so without running anything
/// it would compute): a syntax error names its line.
pub fn check_syntax(template: &str) -> Result<(), TemplateError> {
    let env = sandbox(UndefinedBehavior::Chainable, DEFAULT_FUEL);
    env.template_from_str(template)
        .map(|_| ())
        .map_err(|error| convert(&error, DEFAULT_FUEL))
}

/// Renders `template` against `store`.
pub fn render(
    template: &str,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Rendered, TemplateError> {
    let isolated = options.run_isolated(|| RenderJob::Render {
        template: template.to_owned(),
        context: store.clone(),
        settings: RenderSettings::of(options),
    });
    if let Some(outcome) = isolated {
        return match outcome? {
            JobOutcome::Rendered(result) => result,
            other => Err(TemplateError::Isolation {
                message: mismatched(&other).message,
            }),
        };
    }
    let shared = Arc::new(Shared::new(store, options));
    let text = shared.render_source(template)?;
    Ok(shared.finish(text))
}

/// Renders `template` to a JSON value: when the template is exactly one `{{ ... }}` tag (with
/// surrounding whitespace) whose variables all resolve, the value keeps its JSON type (a list
/// stays a list, `{{ items | length }}` is a number); otherwise it is the rendered text as a
/// string.
pub fn render_value(
    template: &str,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<(Value, Rendered), TemplateError> {
    let isolated = options.run_isolated(|| RenderJob::RenderValue {
        template: template.to_owned(),
        context: store.clone(),
        settings: RenderSettings::of(options),
    });
    if let Some(outcome) = isolated {
        return match outcome? {
            JobOutcome::Valued(result) => result,
            other => Err(TemplateError::Isolation {
                message: mismatched(&other).message,
            }),
        };
    }
    let shared = Arc::new(Shared::new(store, options));
    if let Some(path) = single_path_tag(template)
        && shared.path_exists(&path)
    {
        let probe = format!("{{{{ {} | tojson }}}}", path.to_jinja());
        let json = shared.render_source(&probe)?;
        let value = serde_json::from_str(&json).unwrap_or(Value::String(json));
        let text = match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Ok((value, shared.finish(text)));
    }
    let text = shared.render_source(template)?;
    let rendered = shared.finish(text);
    // Any other lone expression (`{{ items | length }}`, `{{ n + 1 }}`) keeps the JSON type
    // of its value too, when every variable it reads exists.
    if let Some(inner) = single_expression_tag(template)
        && rendered.missing.is_empty()
    {
        let probe = format!("{{{{ ({inner}) | tojson }}}}");
        if let Ok(json) = shared.render_source(&probe)
            && let Ok(value) = serde_json::from_str::<Value>(&json)
        {
            return Ok((value, rendered));
        }
    }
    Ok((Value::String(rendered.text.clone()), rendered))
}

/// The expression of a template that is exactly one expression tag.
fn single_expression_tag(template: &str) -> Option<&str> {
    let trimmed = template.trim();
    let tags = scan_tags(trimmed);
    match tags.as_slice() {
        [tag] if tag.start == 0 && tag.end == trimmed.len() => Some(tag.inner(trimmed).trim()),
        _ => None,
    }
}

/// The path of a template that is exactly one plain-path expression tag.
fn single_path_tag(template: &str) -> Option<Path> {
    let trimmed = template.trim();
    let tags = scan_tags(trimmed);
    match tags.as_slice() {
        [tag] if tag.start == 0 && tag.end == trimmed.len() => Path::parse(tag.inner(trimmed)).ok(),
        _ => None,
    }
}

/// True if `text` contains template syntax.
pub fn has_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

fn value_has_template(value: &Value) -> bool {
    match value {
        Value::String(s) => has_template(s),
        Value::Array(items) => items.iter().any(value_has_template),
        Value::Object(map) => map.values().any(value_has_template),
        _ => false,
    }
}

/// A sandboxed environment: no loader, fuel, the policy's undefined behaviour, JSON printing,
/// and the filters that print values measuring their text before making it.
pub(crate) fn sandbox<'s>(undefined: UndefinedBehavior, fuel: u64) -> Environment<'s> {
    let mut env = Environment::new();
    env.set_undefined_behavior(undefined);
    env.set_fuel(Some(fuel));
    // The text renders exactly: a template's final newline is kept, not stripped as Jinja's
    // default does.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    super::text_budget::add_budgeted_filters(&mut env);
    env.set_formatter(|out, state, value| {
        use minijinja::value::ValueKind;
        match value.kind() {
            ValueKind::None | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
                super::text_budget::write_json(out, state, value)
            }
            ValueKind::Bool => out
                .write_str(if value.is_true() { "true" } else { "false" })
                .map_err(|_| minijinja::Error::new(ErrorKind::WriteFailure, "cannot write output")),
            _ => minijinja::escape_formatter(out, state, value),
        }
    });
    env
}

/// A render's output that refuses to grow past its limit, so that a template that writes
/// without end stops at the limit instead of exhausting memory.
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl BoundedOutput {
    fn new(limit: usize) -> BoundedOutput {
        BoundedOutput {
            bytes: Vec::new(),
            limit,
            overflowed: false,
        }
    }
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, piece: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + piece.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("the template's output limit"));
        }
        self.bytes.extend_from_slice(piece);
        Ok(piece.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Converts a minijinja error raised while compiling or rendering.
fn convert(error: &minijinja::Error, fuel: u64) -> TemplateError {
    let message = match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    };
    match error.kind() {
        ErrorKind::SyntaxError => TemplateError::Syntax {
            line: error.line().unwrap_or(1),
            message,
        },
        ErrorKind::OutOfFuel => TemplateError::OutOfFuel { fuel },
        _ => TemplateError::Render {
            line: error.line(),
            message,
        },
    }
}

struct Shared {
    values: Map<String, Value>,
    options: RenderOptions,
    now: Timestamp,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    resolved: HashMap<String, JValue>,
    resolving: Vec<String>,
    used: BTreeSet<String>,
    missing: BTreeSet<String>,
    dynamic: HashMap<String, JValue>,
    error: Option<TemplateError>,
}

impl Shared {
    fn new(store: &ContextStore, options: &RenderOptions) -> Shared {
        Shared {
            values: store.as_map().clone(),
            options: options.clone(),
            now: options.clock.now(),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn finish(&self, text: String) -> Rendered {
        let state = self.state();
        Rendered {
            text,
            used_keys: state.used.iter().cloned().collect(),
            missing: state.missing.iter().cloned().collect(),
        }
    }

    fn path_exists(&self, path: &Path) -> bool {
        match self
            .values
            .get(&path.root)
            .or_else(|| self.options.variables.get(&path.root))
        {
            Some(value) => path.lookup_below(value).is_some(),
            None => {
                path.segments.is_empty()
                    && super::dynamic::DYNAMIC_VARIABLES.contains(&path.root.as_str())
            }
        }
    }

    /// Pre-scans, compiles and renders one template source with this render's context.
    fn render_source(self: &Arc<Self>, source: &str) -> Result<String, TemplateError> {
        let fuel = self.options.fuel;
        let undefined = match self.options.missing {
            MissingPolicy::Error => UndefinedBehavior::SemiStrict,
            _ => UndefinedBehavior::Chainable,
        };
        let globals = {
            let env = sandbox(undefined, fuel);
            let template = env
                .template_from_str(source)
                .map_err(|e| convert(&e, fuel))?;
            template.undeclared_variables(false)
        };
        let mut rewritten = String::with_capacity(source.len());
        let mut missing_here = Vec::new();
        let mut last = 0;
        for tag in scan_tags(source) {
            let Ok(path) = Path::parse(tag.inner(source)) else {
                continue;
            };
            let replacement = if !globals.contains(&path.root) {
                // A variable the template defines itself (loop variable, set, macro argument).
                if !path.uses_slash {
                    continue;
                }
                tag.with_inner(source, &path.to_jinja())
            } else if self.path_exists(&path) {
                let needs_rewrite = path.uses_slash
                    || path
                        .segments
                        .iter()
                        .any(|s| matches!(s, super::path::Segment::Index(_)));
                if !needs_rewrite {
                    continue;
                }
                tag.with_inner(source, &path.to_jinja())
            } else {
                missing_here.push(path.to_string());
                match self.options.missing {
                    MissingPolicy::Keep => {
                        format!("{{% raw %}}{}{{% endraw %}}", &source[tag.start..tag.end])
                    }
                    MissingPolicy::Empty => tag.with_inner(source, "''"),
                    MissingPolicy::Error => continue,
                }
            };
            rewritten.push_str(&source[last..tag.start]);
            rewritten.push_str(&replacement);
            last = tag.end;
        }
        rewritten.push_str(&source[last..]);
        if !missing_here.is_empty() {
            if self.options.missing == MissingPolicy::Error {
                missing_here.sort();
                missing_here.dedup();
                return Err(TemplateError::Missing {
                    names: missing_here,
                });
            }
            self.state().missing.extend(missing_here);
        }
        let env = sandbox(undefined, fuel);
        let template = env
            .template_from_str(&rewritten)
            .map_err(|e| convert(&e, fuel))?;
        let root = JValue::from_object(Root(Arc::clone(self)));
        let mut output = BoundedOutput::new(self.options.max_output_bytes);
        let result = template.render_captured_to(root, &mut output).map(drop);
        if let Some(error) = self.state().error.clone() {
            return Err(error);
        }
        if output.overflowed {
            return Err(TemplateError::OutputTooLarge {
                limit: self.options.max_output_bytes,
            });
        }
        match result {
            // The formatter writes only UTF-8 text, in whole pieces.
            Ok(_) => Ok(String::from_utf8(output.bytes)
                .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())),
            Err(error) if error.kind() == ErrorKind::UndefinedError => {
                let mut names: Vec<String> = template
                    .undeclared_variables(true)
                    .into_iter()
                    .filter(|name| {
                        Path::parse(name).is_ok_and(|path| {
                            globals.contains(&path.root) && !self.path_exists(&path)
                        })
                    })
                    .collect();
                names.sort();
                if names.is_empty() {
                    Err(convert(&error, fuel))
                } else {
                    Err(TemplateError::Missing { names })
                }
            }
            Err(error) => Err(convert(&error, fuel)),
        }
    }

    /// The value of a root variable, as a template sees it.
    fn lookup_root(self: &Arc<Self>, name: &str) -> Option<JValue> {
        if self.values.contains_key(name) {
            self.state().used.insert(name.to_owned());
            return self.resolve(name);
        }
        if let Some(value) = self.options.variables.get(name) {
            return Some(JValue::from(minijinja::value::Serde(value)));
        }
        let mut state = self.state();
        if let Some(value) = state.dynamic.get(name) {
            return Some(value.clone());
        }
        let value = JValue::from(minijinja::value::Serde(dynamic_value(
            name,
            self.now,
            self.options.ids.as_ref(),
        )?));
        state.dynamic.insert(name.to_owned(), value.clone());
        Some(value)
    }

    /// The value of context key `name` with any templates inside it rendered.
    fn resolve(self: &Arc<Self>, name: &str) -> Option<JValue> {
        let raw = {
            let mut state = self.state();
            if let Some(value) = state.resolved.get(name) {
                return Some(value.clone());
            }
            let raw = self.values.get(name)?;
            if !value_has_template(raw) {
                let value = JValue::from(minijinja::value::Serde(raw));
                state.resolved.insert(name.to_owned(), value.clone());
                return Some(value);
            }
            if let Some(at) = state.resolving.iter().position(|k| k == name) {
                let mut keys = state.resolving[at..].to_vec();
                keys.push(name.to_owned());
                state.error.get_or_insert(TemplateError::Cycle { keys });
                return None;
            }
            if state.resolving.len() >= MAX_VALUE_NESTING {
                let mut keys = state.resolving.clone();
                keys.push(name.to_owned());
                state.error.get_or_insert(TemplateError::TooDeep { keys });
                return None;
            }
            state.resolving.push(name.to_owned());
            raw.clone()
        };
        let result = self.resolve_json(raw);
        let mut state = self.state();
        state.resolving.pop();
        match result {
            Ok(json) => {
                let value = JValue::from(minijinja::value::Serde(&json));
                state.resolved.insert(name.to_owned(), value.clone());
                Some(value)
            }
            Err(error) => {
                let error = match error {
                    e @ (TemplateError::Cycle { .. }
                    | TemplateError::TooDeep { .. }
                    | TemplateError::InValue { .. }) => e,
                    other => TemplateError::InValue {
                        key: name.to_owned(),
                        error: Box::new(other),
                    },
                };
                state.error.get_or_insert(error);
                None
            }
        }
    }

    fn resolve_json(self: &Arc<Self>, value: Value) -> Result<Value, TemplateError> {
        Ok(match value {
            Value::String(s) if has_template(&s) => Value::String(self.render_source(&s)?),
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .map(|item| self.resolve_json(item))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| Ok((k, self.resolve_json(v)?)))
                    .collect::<Result<_, TemplateError>>()?,
            ),
            other => other,
        })
    }
}

/// The root context object of a render: looks keys up in the store (tracking use and
/// resolving recursive templates), then among the dynamic variables.
struct Root(Arc<Shared>);

impl fmt::Debug for Root {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("keys", &self.0.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Object for Root {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &JValue) -> Option<JValue> {
        self.0.lookup_root(key.as_str()?)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::NonEnumerable
    }
}

/// An expression tag `{{ ... }}` found by [`scan_tags`]: byte range of the whole tag and of
/// its expression (without whitespace-control markers).
#[derive(Debug, Clone, Copy)]
struct Tag {
    start: usize,
    end: usize,
    inner_start: usize,
    inner_end: usize,
}

impl Tag {
    fn inner<'s>(&self, source: &'s str) -> &'s str {
        &source[self.inner_start..self.inner_end]
    }

    /// The tag with its expression replaced, keeping its delimiters and markers.
    fn with_inner(&self, source: &str, inner: &str) -> String {
        format!(
            "{} {inner} {}",
            &source[self.start..self.inner_start],
            &source[self.inner_end..self.end]
        )
    }
}

/// Finds the `{{ ... }}` tags of a template, skipping comments, statements and
/// `{% raw %}` blocks, and respecting string literals inside tags. Linear in the source.
fn scan_tags(source: &str) -> Vec<Tag> {
    let bytes = source.as_bytes();
    let mut tags = Vec::new();
    let mut i = 0;
    while let Some(found) = source[i..].find('{') {
        let at = i + found;
        match bytes.get(at + 1) {
            Some(b'{') => {
                let mut inner_start = at + 2;
                if matches!(bytes.get(inner_start), Some(b'-' | b'+')) {
                    inner_start += 1;
                }
                let Some(close) = find_close(bytes, inner_start, b'}') else {
                    break;
                };
                let mut inner_end = close;
                if inner_end > inner_start && matches!(bytes[inner_end - 1], b'-' | b'+') {
                    inner_end -= 1;
                }
                tags.push(Tag {
                    start: at,
                    end: close + 2,
                    inner_start,
                    inner_end,
                });
                i = close + 2;
            }
            Some(b'%') => {
                let Some(close) = find_close(bytes, at + 2, b'%') else {
                    break;
                };
                let body = source[at + 2..close].trim_matches(|c: char| c == '-' || c == '+');
                i = close + 2;
                if body.trim() == "raw" {
                    match find_endraw(source, i) {
                        Some(end) => i = end,
                        None => break,
                    }
                }
            }
            Some(b'#') => match source[at + 2..].find("#}") {
                Some(end) => i = at + 2 + end + 2,
                None => break,
            },
            _ => i = at + 1,
        }
    }
    tags
}

/// The index of the `<delim>}` closing a tag whose body starts at `from`, skipping string
/// literals.
fn find_close(bytes: &[u8], from: usize, delim: u8) -> Option<usize> {
    let mut i = from;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => {
                if b == b'\'' || b == b'"' {
                    quote = Some(b);
                } else if b == delim && bytes.get(i + 1) == Some(&b'}') {
                    return Some(i);
                }
            }
        }
        i += 1;
    }
    None
}

/// The end of the `{% endraw %}` tag after `from`.
fn find_endraw(source: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(found) = source[i..].find("{%") {
        let at = i + found;
        let close = source[at + 2..].find("%}")? + at + 2;
        let body = source[at + 2..close].trim_matches(|c: char| c == '-' || c == '+');
        if body.trim() == "endraw" {
            return Some(close + 2);
        }
        i = at + 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(value: Value) -> ContextStore {
        ContextStore::from_map(value.as_object().unwrap().clone())
    }

    fn render_keep(template: &str, ctx: Value) -> String {
        render(template, &store(ctx), &RenderOptions::fixed(0))
            .unwrap()
            .text
    }

    #[test]
    fn keeps_missing_paths_literally_and_renders_the_rest() {
        let ctx = json!({"user": {"name": "Ann"}});
        assert_eq!(
            render_keep("{{user.name}} {{user.missing}} {{ name }} {{-x-}}", ctx),
            "Ann {{user.missing}} {{ name }} {{-x-}}"
        );
    }

    #[test]
    fn loop_variables_are_not_mistaken_for_missing_context_keys() {
        let ctx = json!({"files": [{"name": "a"}, {"name": "b"}]});
        assert_eq!(
            render_keep(
                "{% for f in files %}{{ f.name }}{{ f/name }};{% endfor %}",
                ctx
            ),
            "aa;bb;"
        );
    }

    #[test]
    fn used_keys_are_reported() {
        let ctx = json!({"a": 1, "b": "{{c}}", "c": 2, "unused": 3});
        let rendered = render("{{a}}{{b}}", &store(ctx), &RenderOptions::fixed(0)).unwrap();
        assert_eq!(rendered.text, "12");
        assert_eq!(rendered.used_keys, ["a", "b", "c"]);
    }

    #[test]
    fn typed_values_for_single_tags() {
        let ctx = json!({"ids": [1, 2], "name": "x"});
        let (value, _) =
            render_value(" {{ ids }} ", &store(ctx.clone()), &RenderOptions::fixed(0)).unwrap();
        assert_eq!(value, json!([1, 2]));
        let (value, _) =
            render_value("id {{ ids }}", &store(ctx), &RenderOptions::fixed(0)).unwrap();
        assert_eq!(value, json!("id [1,2]"));
    }

    #[test]
    fn typed_values_for_single_expressions() {
        let ctx = json!({"ids": [1, 2], "n": 4, "name": "<x>", "on": true});
        let table = [
            ("{{ ids | length }}", json!(2)),
            ("{{ n + 1 }}", json!(5)),
            ("{{ n / 8 }}", json!(0.5)),
            ("{{ not on }}", json!(false)),
            ("{{ name | upper }}", json!("<X>")),
            ("{{ ids | map('string') | list }}", json!(["1", "2"])),
            ("{{ {'a': n} }}", json!({"a": 4})),
            // A missing variable keeps the literal text (the keep policy), as a string.
            ("{{ missing }}", json!("{{ missing }}")),
            ("{{ n }} and {{ n }}", json!("4 and 4")),
        ];
        for (template, expected) in table {
            let (value, _) =
                render_value(template, &store(ctx.clone()), &RenderOptions::fixed(0)).unwrap();
            assert_eq!(value, expected, "{template}");
        }
    }
}
