//! Transition flags: how a step's output changes the store and the message
//! history.
//!
//! [`apply_transition`] is the one place the flags are interpreted; the executor calls it
//! after each step. Its precedence table (docs/context-store.md, one test per row):
//!
//! 1. `clear_context_store: true` empties the store; nothing of this step is kept, whatever
//!    the other store flags say.
//! 2. `store_in_context: false` makes the output contribute nothing (`output_key` and
//!    `append_to_context` then do nothing); clearing and resetting still apply.
//! 3. `output_key` stores the whole output under that key: the parsed value when it is an
//!    object or a list, else the raw output text. Root keys are then not merged.
//! 4. Without `output_key`, an object contributes its root keys; a list contributes the root
//!    keys of its objects in order (the last wins) and ignores other items; a scalar or a
//!    string contributes nothing.
//! 5. `append_to_context` turns each contributed key into a list: an absent key becomes
//!    `[new]`, a list gets `new` pushed, any other value `v` becomes `[v, new]`.
//! 6. `clear_context_store: "keep_current"` drops every earlier key before the contributions
//!    are merged.
//! 7. `reset_keys_in_context_store` removes the listed keys after the merge, including keys
//!    this step just wrote; keys that are absent are ignored.
//! 8. `include_in_llm_history` and `clear_prior_messages` act on the messages only and never
//!    on the store; `clear_prior_messages` wins: the history is emptied, this step's exchange
//!    included (a clean slate).
//! 9. No value is special: a string such as `"__DELETE_KEY__"` is stored like any other.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::parse::ParsedOutput;
use super::store::ContextStore;

/// `clear_context_store`: `false`, `true` or `"keep_current"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClearContextStore {
    /// `false`: keep the store and merge the new values (the default).
    #[default]
    No,
    /// `true`: empty the store, new values included.
    All,
    /// `"keep_current"`: keep only what this step contributes.
    KeepCurrent,
}

impl Serialize for ClearContextStore {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ClearContextStore::No => serializer.serialize_bool(false),
            ClearContextStore::All => serializer.serialize_bool(true),
            ClearContextStore::KeepCurrent => serializer.serialize_str("keep_current"),
        }
    }
}

impl<'de> Deserialize<'de> for ClearContextStore {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Bool(false) | Value::Null => Ok(ClearContextStore::No),
            Value::Bool(true) => Ok(ClearContextStore::All),
            Value::String(s) if s == "keep_current" => Ok(ClearContextStore::KeepCurrent),
            other => Err(de::Error::custom(format!(
                "clear_context_store must be false, true or \"keep_current\", not {other}"
            ))),
        }
    }
}

fn yes() -> bool {
    true
}

/// The context flags of one transition, as written in a workflow's `next:` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransitionFlags {
    /// Store the output in the context store (default true).
    #[serde(default = "yes")]
    pub store_in_context: bool,
    /// Show the output to later LLM calls (default true).
    #[serde(default = "yes")]
    pub include_in_llm_history: bool,
    /// Remove all earlier messages from the history, this step's exchange included: the next
    /// state starts with a clean slate (default false).
    pub clear_prior_messages: bool,
    /// Clear the store (default false).
    pub clear_context_store: ClearContextStore,
    /// Keys removed after the merge (default none).
    pub reset_keys_in_context_store: Vec<String>,
    /// Store the whole output under this key instead of merging its root keys.
    pub output_key: Option<String>,
    /// Append to existing values instead of replacing them (default false).
    pub append_to_context: bool,
}

impl Default for TransitionFlags {
    fn default() -> TransitionFlags {
        TransitionFlags {
            store_in_context: true,
            include_in_llm_history: true,
            clear_prior_messages: false,
            clear_context_store: ClearContextStore::No,
            reset_keys_in_context_store: Vec::new(),
            output_key: None,
            append_to_context: false,
        }
    }
}

impl TransitionFlags {
    /// Whether the step's exchange (its task and output) joins the history later LLM calls
    /// see: `include_in_llm_history`, unless `clear_prior_messages` gives the next state a
    /// clean slate (what it needs of this step then reaches it through the store).
    pub fn output_in_history(&self) -> bool {
        self.include_in_llm_history && !self.clear_prior_messages
    }
}

/// One change to the store, for the execution log.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StoreChange {
    /// A key was added or its value replaced.
    Set {
        /// The key.
        key: String,
        /// Its value before, if it had one.
        #[serde(skip_serializing_if = "Option::is_none")]
        old: Option<Value>,
        /// Its value now.
        new: Value,
    },
    /// A key was removed.
    Remove {
        /// The key.
        key: String,
        /// Its value before.
        old: Value,
    },
}

/// What applying a step's output under its flags did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransitionOutcome {
    /// The store after the transition.
    pub store: ContextStore,
    /// The difference between the store before and after, keys in the order of the new store
    /// (sets), then removed keys in the order of the old store.
    pub changes: Vec<StoreChange>,
    /// Whether the step's output message stays visible to later LLM calls.
    pub output_in_history: bool,
    /// Whether all messages before this step's output leave the history.
    pub clear_prior_messages: bool,
}

/// Applies a step's parsed output to `store` under `flags` (see the module documentation for
/// the precedence table). Pure: the input store is not changed.
pub fn apply_transition(
    flags: &TransitionFlags,
    store: &ContextStore,
    output: &ParsedOutput,
) -> TransitionOutcome {
    let mut next = match flags.clear_context_store {
        ClearContextStore::No => store.clone(),
        ClearContextStore::All | ClearContextStore::KeepCurrent => ContextStore::new(),
    };
    if flags.clear_context_store != ClearContextStore::All && flags.store_in_context {
        let contributions = match &flags.output_key {
            Some(key) => {
                let value = if output.is_structured() {
                    output.value.clone()
                } else {
                    Value::String(output.raw.clone())
                };
                vec![(key.clone(), value)]
            }
            None => output.contributions(),
        };
        for (key, value) in contributions {
            if flags.append_to_context {
                match next.get_mut(&key) {
                    None => {
                        next.insert(key, Value::Array(vec![value]));
                    }
                    Some(Value::Array(items)) => items.push(value),
                    Some(old) => {
                        let previous = old.take();
                        *old = Value::Array(vec![previous, value]);
                    }
                }
            } else {
                next.insert(key, value);
            }
        }
    }
    if flags.clear_context_store != ClearContextStore::All {
        for key in &flags.reset_keys_in_context_store {
            next.remove(key);
        }
    }
    TransitionOutcome {
        changes: diff(store, &next),
        store: next,
        output_in_history: flags.output_in_history(),
        clear_prior_messages: flags.clear_prior_messages,
    }
}

/// The changes that turn `before` into `after`.
pub fn diff(before: &ContextStore, after: &ContextStore) -> Vec<StoreChange> {
    let mut changes = Vec::new();
    for (key, new) in after.as_map() {
        let old = before.get(key);
        if old != Some(new) {
            changes.push(StoreChange::Set {
                key: key.clone(),
                old: old.cloned(),
                new: new.clone(),
            });
        }
    }
    for (key, old) in before.as_map() {
        if !after.contains_key(key) {
            changes.push(StoreChange::Remove {
                key: key.clone(),
                old: old.clone(),
            });
        }
    }
    changes
}
