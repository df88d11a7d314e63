//! Running a template: the sandboxed environment, the rewrite of `{{ path }}` tags by the
//! missing-variable policy, the render itself with its output limit, and the typed render
//! of a lone expression.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value as JValue};
use serde_json::{Map, Value};

use super::fstring::{self, Piece};
use super::scan::{scan_tags, single_expression_tag, single_path_tag};
use super::{DEFAULT_FUEL, MissingPolicy, RenderOptions, Rendered, TemplateError};
use crate::context::dynamic::Timestamp;
use crate::context::isolation::{JobOutcome, RenderJob, RenderSettings, mismatched};
use crate::context::path::{Path, Segment};
use crate::context::store::ContextStore;

/// Checks that `template` is valid Jinja without rendering it (so without running anything
/// it would compute): a syntax error names its line.
pub fn check_syntax(template: &str) -> Result<(), TemplateError> {
    let env = sandbox(UndefinedBehavior::Chainable, DEFAULT_FUEL);
    env.template_from_str(template)
        .map(|_| ())
        .map_err(|error| convert(&error, DEFAULT_FUEL))
}

/// The root names a Jinja template reads from outside itself (not its loop variables or
/// `set`s), sorted.
pub(crate) fn jinja_variables(template: &str) -> Result<BTreeSet<String>, TemplateError> {
    let env = sandbox(UndefinedBehavior::Chainable, DEFAULT_FUEL);
    let compiled = env
        .template_from_str(template)
        .map_err(|error| convert(&error, DEFAULT_FUEL))?;
    Ok(compiled.undeclared_variables(false).into_iter().collect())
}

/// Renders `template` against `store`.
pub fn render(
    template: &str,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Rendered, TemplateError> {
    let isolated = options.run_isolated(|| RenderJob::Render {
        template: template.to_owned(),
        store: store.clone(),
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

/// Renders `template`, written in the simple syntax (`{name}` a variable, `{{` and `}}`
/// literal braces), against `store`: the same variables and missing-variable policy as
/// [`render`], a missing variable kept as the `{name}` it was written as.
pub fn render_fstring(
    template: &str,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Rendered, TemplateError> {
    let pieces = fstring::parse(template)?;
    let shared = Shared::new(store, options);
    let mut source = String::with_capacity(template.len());
    let mut missing = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => source.push_str(&fstring::jinja_text(&text)),
            Piece::Field { path, .. } if shared.path_exists(&path) => {
                source.push_str(&format!("{{{{ {} }}}}", path.to_jinja()));
            }
            Piece::Field { written, path } => {
                missing.push(path.to_string());
                if options.missing == MissingPolicy::Keep {
                    source.push_str(&fstring::jinja_text(&format!("{{{written}}}")));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    if options.missing == MissingPolicy::Error && !missing.is_empty() {
        return Err(TemplateError::Missing { names: missing });
    }
    let mut rendered = render(&source, store, options)?;
    rendered.missing.extend(missing);
    rendered.missing.sort();
    rendered.missing.dedup();
    Ok(rendered)
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
        store: store.clone(),
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
    crate::context::text_budget::add_budgeted_filters(&mut env);
    env.set_formatter(|out, state, value| {
        use minijinja::value::ValueKind;
        match value.kind() {
            ValueKind::None | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
                crate::context::text_budget::write_json(out, state, value)
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

/// One render in progress, shared by its root object and the renders of the context values
/// it reads.
pub(super) struct Shared {
    /// The context store's values.
    pub(super) values: Map<String, Value>,
    pub(super) options: RenderOptions,
    /// The clock read once, so that every dynamic date of the render agrees.
    pub(super) now: Timestamp,
    state: Mutex<State>,
}

/// What a render has learned so far.
#[derive(Default)]
pub(super) struct State {
    /// Context values with their templates rendered, by key.
    pub(super) resolved: HashMap<String, JValue>,
    /// The keys whose values are being rendered, outermost first.
    pub(super) resolving: Vec<String>,
    pub(super) used: BTreeSet<String>,
    pub(super) missing: BTreeSet<String>,
    /// The dynamic variables read so far, so that each keeps one value.
    pub(super) dynamic: HashMap<String, JValue>,
    /// The first error met inside a lookup, which minijinja cannot carry out of it.
    pub(super) error: Option<TemplateError>,
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

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
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

    /// Pre-scans, compiles and renders one template source with this render's context.
    pub(super) fn render_source(self: &Arc<Self>, source: &str) -> Result<String, TemplateError> {
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
                let needs_rewrite =
                    path.uses_slash || path.segments.iter().any(|s| matches!(s, Segment::Index(_)));
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
        let root = self.root();
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
