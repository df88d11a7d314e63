//! The context store itself: an ordered JSON key-value map.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::parse::parse_output;
use super::path::Path;

/// The JSON key-value memory of one workflow execution.
///
/// Keys keep their insertion order, so snapshots and renders are stable. The store is plain
/// data: it is changed by [`apply_transition`](super::apply_transition), by iteration merges
/// and by the setters here, never behind the caller's back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContextStore {
    values: Map<String, Value>,
}

impl ContextStore {
    /// An empty store.
    pub fn new() -> ContextStore {
        ContextStore::default()
    }

    /// The initial store of an execution, from the user's input: parsed like a step output
    /// ([`parse_output`]), an object contributes its root keys (as does a list of objects);
    /// plain text, a plain list or a scalar contributes nothing.
    pub fn from_user_input(input: &str) -> ContextStore {
        let parsed = parse_output(input);
        let mut store = ContextStore::new();
        for (key, value) in parsed.contributions() {
            store.values.insert(key, value);
        }
        store
    }

    /// The store holding exactly the entries of `values`.
    pub fn from_map(values: Map<String, Value>) -> ContextStore {
        ContextStore { values }
    }

    /// The entries, in insertion order.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.values
    }

    /// The entries, by value.
    pub fn into_map(self) -> Map<String, Value> {
        self.values
    }

    /// The value stored under the root key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// The value at a path such as `user.profile.name`, `files/0/name` or `files[0].name`.
    pub fn lookup(&self, path: &Path) -> Option<&Value> {
        path.lookup_in(&self.values)
    }

    /// The value under the root key `key`, to change in place.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.values.get_mut(key)
    }

    /// Stores `value` under `key`, returning the value it replaced.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        self.values.insert(key.into(), value)
    }

    /// Removes `key`, returning its value; a missing key is not an error.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.values.shift_remove(key)
    }

    /// True if `key` is a root key of the store.
    pub fn contains_key(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The root keys, in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// Number of root keys.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// A copy holding only the listed root keys (those present), in the store's order.
    pub fn filtered(&self, keys: &[String]) -> ContextStore {
        ContextStore {
            values: self
                .values
                .iter()
                .filter(|(key, _)| keys.iter().any(|k| k == *key))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

impl From<Map<String, Value>> for ContextStore {
    fn from(values: Map<String, Value>) -> ContextStore {
        ContextStore { values }
    }
}
