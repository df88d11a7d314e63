//! The names a template may read, and what they hold.
//!
//! A render's root object answers a variable from the context store first (recording the key
//! as used and rendering, once per render, any template inside its value, with cycles and
//! deep chains reported), then from the caller's variables, then from the dynamic variables
//! (one value per render). The run's user context comes before all of them: no context key
//! shadows it. The same order decides whether a path resolves, which is what the
//! missing-variable policy asks.

use std::fmt;
use std::sync::Arc;

use minijinja::Value as JValue;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use serde_json::Value;

use super::rendering::Shared;
use super::scan::{has_template, value_has_template};
use super::{MAX_VALUE_NESTING, TemplateError, USER_CONTEXT};
use crate::context::dynamic::{DYNAMIC_VARIABLES, dynamic_value};
use crate::context::path::Path;

impl Shared {
    /// The root object of a template rendered with this render's context.
    pub(super) fn root(self: &Arc<Self>) -> JValue {
        JValue::from_object(Root(Arc::clone(self)))
    }

    /// True if `path` resolves: in the context store, among the caller's variables, or (a
    /// bare name) among the dynamic variables.
    pub(super) fn path_exists(&self, path: &Path) -> bool {
        if let Some(user_context) = self.user_context_named(&path.root) {
            return path.lookup_below(user_context).is_some();
        }
        match self
            .values
            .get(&path.root)
            .or_else(|| self.options.variables.get(&path.root))
        {
            Some(value) => path.lookup_below(value).is_some(),
            None => path.segments.is_empty() && DYNAMIC_VARIABLES.contains(&path.root.as_str()),
        }
    }

    /// The value of a root variable, as a template sees it.
    fn lookup_root(self: &Arc<Self>, name: &str) -> Option<JValue> {
        if let Some(user_context) = self.user_context_named(name) {
            return Some(JValue::from(minijinja::value::Serde(user_context)));
        }
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

    /// The run's user context, when `name` names it and the run has one.
    fn user_context_named(&self, name: &str) -> Option<&Value> {
        (name == USER_CONTEXT)
            .then_some(self.options.user_context.as_deref())
            .flatten()
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

    /// `value` with every template inside it rendered.
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
