//! Iteration: selecting the items, one context copy per item, and the
//! fan-in merge.
//!
//! `iter_key` names a list in the context (a root key or a path: `files`, `data.items`,
//! `data/items`), or, when it starts with `/`, is a JSON pointer into the last output
//! (`/items`). Each item runs with its own copy of the context (optionally only the listed
//! keys); an item that is an object also contributes its root keys to its copy, the way user
//! input does. When the items are done, [`merge_results`] merges what each item wrote back
//! into the parent store by a [`MergePolicy`], in item order. The executor runs the items
//! (one after another, or several at once when the iteration allows it, recording them in
//! item order either way); this module only decides what they see and what comes back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::path::Path;
use super::store::ContextStore;

/// Why iteration could not start or its results could not be merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IterError {
    /// The iter_key is neither a valid path nor a JSON pointer.
    #[error("invalid iter_key {iter_key:?}: {reason}")]
    InvalidKey {
        /// The key given.
        iter_key: String,
        /// What was wrong.
        reason: String,
    },
    /// Nothing is at the iter_key.
    #[error("iter_key {iter_key:?} names nothing in the {place}")]
    NotFound {
        /// The key given.
        iter_key: String,
        /// "context" or "last output".
        place: &'static str,
    },
    /// The value at the iter_key is not a list.
    #[error("iter_key {iter_key:?} names a {kind}, not a list")]
    NotAList {
        /// The key given.
        iter_key: String,
        /// The JSON kind found.
        kind: &'static str,
    },
    /// Two items wrote different values to the same key under [`MergePolicy::Error`].
    #[error("items {first} and {second} both wrote key {key:?} with different values")]
    Conflict {
        /// The key.
        key: String,
        /// Index of the first item that wrote it.
        first: usize,
        /// Index of the later item that wrote a different value.
        second: usize,
    },
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// Selects the list to iterate over.
pub fn select_items(
    iter_key: &str,
    store: &ContextStore,
    last_output: Option<&Value>,
) -> Result<Vec<Value>, IterError> {
    let (found, place) = if iter_key.starts_with('/') {
        (
            last_output.and_then(|output| output.pointer(iter_key)),
            "last output",
        )
    } else {
        let path = Path::parse(iter_key).map_err(|error| IterError::InvalidKey {
            iter_key: iter_key.to_owned(),
            reason: error.reason.to_owned(),
        })?;
        (store.lookup(&path), "context")
    };
    match found {
        None => Err(IterError::NotFound {
            iter_key: iter_key.to_owned(),
            place,
        }),
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(other) => Err(IterError::NotAList {
            iter_key: iter_key.to_owned(),
            kind: kind(other),
        }),
    }
}

/// One item of an iteration, with the context it runs with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationItem {
    /// Position in the list, from 0.
    pub index: usize,
    /// The item.
    pub value: Value,
    /// The item's own copy of the context store (the key `context`).
    #[serde(rename = "context")]
    pub store: ContextStore,
}

/// Builds one [`IterationItem`] per item: a copy of `context` (only the `keep` keys when given)
/// plus, for an object item, its root keys.
pub fn plan_items(
    items: Vec<Value>,
    store: &ContextStore,
    keep: Option<&[String]>,
) -> Vec<IterationItem> {
    let base = match keep {
        Some(keys) => store.filtered(keys),
        None => store.clone(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, value)| {
            let mut store = base.clone();
            if let Value::Object(map) = &value {
                for (key, v) in map {
                    store.insert(key.clone(), v.clone());
                }
            }
            IterationItem {
                index,
                value,
                store,
            }
        })
        .collect()
}

/// How the items' writes come back into the parent store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergePolicy {
    /// Writes are applied in item order; the last item's value wins.
    #[default]
    LastWins,
    /// Each written key becomes a list of the items' values in item order, appended to the
    /// parent's value (a list is extended, another value becomes the list's first element).
    Append,
    /// Two items writing different values to one key is an error.
    Error,
}

/// What one item wrote: the keys whose value at the end differs from its starting copy.
/// Removals inside an item do not propagate.
pub fn item_writes(item: &IterationItem, end: &ContextStore) -> Vec<(String, Value)> {
    end.as_map()
        .iter()
        .filter(|(key, value)| item.store.get(key) != Some(*value))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Merges the items' final contexts (`results[i]` is the end context of `items[i]`) into
/// `parent` by `policy`.
pub fn merge_results(
    parent: &ContextStore,
    items: &[IterationItem],
    results: &[ContextStore],
    policy: MergePolicy,
) -> Result<ContextStore, IterError> {
    let mut merged = parent.clone();
    let mut written: BTreeMap<String, (usize, Value)> = BTreeMap::new();
    for (item, end) in items.iter().zip(results) {
        for (key, value) in item_writes(item, end) {
            match policy {
                MergePolicy::LastWins => {
                    merged.insert(key, value);
                }
                MergePolicy::Error => {
                    if let Some((first, earlier)) = written.get(&key)
                        && *earlier != value
                    {
                        return Err(IterError::Conflict {
                            key,
                            first: *first,
                            second: item.index,
                        });
                    }
                    written.insert(key.clone(), (item.index, value.clone()));
                    merged.insert(key, value);
                }
                MergePolicy::Append => match merged.get_mut(&key) {
                    Some(Value::Array(list)) => list.push(value),
                    Some(other) => {
                        let previous = other.take();
                        *other = Value::Array(vec![previous, value]);
                    }
                    None => {
                        merged.insert(key, Value::Array(vec![value]));
                    }
                },
            }
        }
    }
    Ok(merged)
}
