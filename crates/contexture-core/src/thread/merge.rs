//! Merging a fork back into its parent.
//!
//! [`Thread::plan_merge`] computes the [`EventKind::Merged`] event to append to the parent;
//! applying it adds the messages and store changes it records. A merge covers the fork's
//! events after the fork point (or after its previous merge), so neither messages nor usage
//! are ever brought back twice.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::message::Role;
use crate::thread::{ConflictPolicy, EventKind, Merge, MergePolicy, StoreChange, Thread};

/// How to merge a fork: what to bring back, and how key conflicts resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeSpec {
    /// What to bring back.
    pub policy: MergePolicy,
    /// How conflicting keys resolve.
    pub conflict: ConflictPolicy,
    /// The fork's store keys to bring back (its declared outputs, or all of them). Required,
    /// and the only thing brought back, with [`MergePolicy::OutputKeys`]; with the other
    /// policies they are brought back beside the messages.
    pub keys: MergeKeys,
}

/// Which of a fork's store keys a merge brings back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeKeys {
    /// These keys; each must be in the fork's store.
    Listed(Vec<String>),
    /// Every key the fork's store holds (a value equal to the parent's changes nothing).
    All,
}

impl Default for MergeKeys {
    fn default() -> MergeKeys {
        MergeKeys::Listed(Vec::new())
    }
}

impl From<Vec<String>> for MergeKeys {
    fn from(keys: Vec<String>) -> MergeKeys {
        MergeKeys::Listed(keys)
    }
}

/// Written as a list of key names, or the word `"all"`.
impl Serialize for MergeKeys {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            MergeKeys::Listed(keys) => keys.serialize(serializer),
            MergeKeys::All => serializer.serialize_str("all"),
        }
    }
}

/// Read as a list of key names, or the word `"all"`.
impl<'de> Deserialize<'de> for MergeKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<MergeKeys, D::Error> {
        struct KeysVisitor;

        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = MergeKeys;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of key names, or \"all\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<MergeKeys, E> {
                match text {
                    "all" => Ok(MergeKeys::All),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<MergeKeys, A::Error> {
                Vec::<String>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(MergeKeys::Listed)
            }
        }

        deserializer.deserialize_any(KeysVisitor)
    }
}

/// Why a fork cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// The thread to merge is not a fork of this thread.
    #[error("thread `{child}` is not a fork of `{parent}`")]
    NotAFork {
        /// The thread merged into.
        parent: String,
        /// The thread to merge.
        child: String,
    },
    /// Nothing happened in the fork since the fork point or its previous merge.
    #[error("fork `{child}` has nothing new after seq {since} to merge")]
    NothingToMerge {
        /// The fork.
        child: String,
        /// Where the merge would start.
        since: u64,
    },
    /// `summary-only` found no assistant message in the fork to use as its summary.
    #[error("fork `{child}` has no assistant message after seq {since} to merge as a summary")]
    NoSummary {
        /// The fork.
        child: String,
        /// Where the merge would start.
        since: u64,
    },
    /// `output-keys` was asked with no key.
    #[error("merge policy output-keys needs at least one key")]
    NoKeys,
    /// A declared output key is missing from the fork's store.
    #[error("fork `{child}` has no output key `{key}`")]
    MissingKey {
        /// The fork.
        child: String,
        /// The key.
        key: String,
    },
    /// A key holds different values in the parent and the fork, and the policy is `error`.
    #[error("key `{key}` conflicts: the parent holds {parent_value} and the fork {child_value}")]
    KeyConflict {
        /// The key.
        key: String,
        /// The parent's value (JSON).
        parent_value: String,
        /// The fork's value (JSON).
        child_value: String,
    },
}

impl Thread {
    /// Computes the event that merges `child` (a fork of this thread) into this thread under
    /// `spec`. Append it to this thread's log to perform the merge.
    pub fn plan_merge(&self, child: &Thread, spec: &MergeSpec) -> Result<EventKind, MergeError> {
        let fork = child
            .fork_point()
            .filter(|fork| fork.parent == self.id)
            .ok_or_else(|| MergeError::NotAFork {
                parent: self.id.clone(),
                child: child.id.clone(),
            })?;
        // The fork's own log begins with its `forked` event at `at_seq + 1`.
        let since = self.merged_through(&child.id).unwrap_or(fork.at_seq + 1);
        if child.last_seq() <= since {
            return Err(MergeError::NothingToMerge {
                child: child.id.clone(),
                since,
            });
        }
        let fresh = child.messages_after(since);
        let messages = match spec.policy {
            MergePolicy::AppendMessages => fresh.iter().map(|e| e.message.clone()).collect(),
            MergePolicy::SummaryOnly => {
                let summary = fresh
                    .iter()
                    .rev()
                    .find(|e| e.message.role == Role::Assistant)
                    .ok_or_else(|| MergeError::NoSummary {
                        child: child.id.clone(),
                        since,
                    })?;
                vec![summary.message.clone()]
            }
            MergePolicy::OutputKeys => {
                if spec.keys == MergeKeys::Listed(Vec::new()) {
                    return Err(MergeError::NoKeys);
                }
                Vec::new()
            }
        };
        let keys: Vec<String> = match &spec.keys {
            MergeKeys::Listed(keys) => keys.clone(),
            MergeKeys::All => child.store().keys().cloned().collect(),
        };
        let mut store_changes = Vec::with_capacity(keys.len());
        for key in &keys {
            let value = child
                .store()
                .get(key)
                .ok_or_else(|| MergeError::MissingKey {
                    child: child.id.clone(),
                    key: key.clone(),
                })?;
            if let Some(value) = resolve(key, self.store().get(key), value, spec.conflict)? {
                store_changes.push(StoreChange::Set {
                    key: key.clone(),
                    value,
                });
            }
        }
        Ok(EventKind::Merged(Merge {
            child: child.id.clone(),
            child_seq: child.last_seq(),
            policy: spec.policy,
            conflict: spec.conflict,
            messages,
            store_changes,
            usage: child.usage_since(since),
            cost_usd: None,
            cost_unknown: false,
        }))
    }
}

/// The value `key` takes in the parent after the merge, or `None` when it stays as it is.
fn resolve(
    key: &str,
    parent: Option<&Value>,
    child: &Value,
    conflict: ConflictPolicy,
) -> Result<Option<Value>, MergeError> {
    let Some(parent) = parent else {
        return Ok(Some(child.clone()));
    };
    if parent == child {
        return Ok(None);
    }
    match conflict {
        ConflictPolicy::ChildWins => Ok(Some(child.clone())),
        ConflictPolicy::ParentWins => Ok(None),
        ConflictPolicy::Error => Err(MergeError::KeyConflict {
            key: key.to_string(),
            parent_value: parent.to_string(),
            child_value: child.to_string(),
        }),
        ConflictPolicy::Append => {
            let mut items = match parent {
                Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            items.push(child.clone());
            Ok(Some(Value::Array(items)))
        }
    }
}
