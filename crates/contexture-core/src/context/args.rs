//! Dynamic values in tool and MCP server arguments.
//!
//! Only the configured arguments are rendered, each string (at any depth of the argument
//! value) as a template over the context. The context never adds an argument and never
//! replaces one: a context key named like an argument is just a variable the configured
//! template may or may not use (fixing CodeMie, where it silently overrode the configuration).
//! A string that is exactly one `{{ path }}` keeps the JSON type of what it names, so
//! `ids: '{{ids}}'` passes a list, not its text.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::store::ContextStore;
use super::template::{RenderOptions, TemplateError, has_template, render_value};

/// Configured arguments after rendering.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedArgs {
    /// The arguments, same keys and order as configured.
    pub args: Map<String, Value>,
    /// The context keys the templates used, sorted.
    pub used_keys: Vec<String>,
    /// Paths that did not resolve (kept or emptied per the policy), sorted.
    pub missing: Vec<String>,
}

/// Why an argument could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool argument {argument:?}: {error}")]
pub struct ArgError {
    /// The argument (top-level name).
    pub argument: String,
    /// The template error.
    pub error: TemplateError,
}

/// Renders the templates inside `configured`.
pub fn resolve_args(
    configured: &Map<String, Value>,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<ResolvedArgs, ArgError> {
    let mut used = BTreeSet::new();
    let mut missing = BTreeSet::new();
    let mut args = Map::new();
    for (name, value) in configured {
        let resolved =
            resolve_value(value, store, options, &mut used, &mut missing).map_err(|error| {
                ArgError {
                    argument: name.clone(),
                    error,
                }
            })?;
        args.insert(name.clone(), resolved);
    }
    Ok(ResolvedArgs {
        args,
        used_keys: used.into_iter().collect(),
        missing: missing.into_iter().collect(),
    })
}

/// Renders the templates inside a list of arguments (MCP server `args`).
pub fn resolve_arg_list(
    configured: &[Value],
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Vec<Value>, TemplateError> {
    let mut used = BTreeSet::new();
    let mut missing = BTreeSet::new();
    configured
        .iter()
        .map(|value| resolve_value(value, store, options, &mut used, &mut missing))
        .collect()
}

fn resolve_value(
    value: &Value,
    store: &ContextStore,
    options: &RenderOptions,
    used: &mut BTreeSet<String>,
    missing: &mut BTreeSet<String>,
) -> Result<Value, TemplateError> {
    Ok(match value {
        Value::String(text) if has_template(text) => {
            let (value, rendered) = render_value(text, store, options)?;
            used.extend(rendered.used_keys);
            missing.extend(rendered.missing);
            value
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| resolve_value(item, store, options, used, missing))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), resolve_value(v, store, options, used, missing)?)))
                .collect::<Result<_, TemplateError>>()?,
        ),
        other => other.clone(),
    })
}
