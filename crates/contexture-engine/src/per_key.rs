//! A value shared by the holders of one key (a thread's waker, a tenant's share of a pool)
//! while any of them holds it. The map holds it weakly, so a key nobody holds any more is
//! forgotten as new keys come, and the map stays as small as what is in use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Values by key, each alive while a holder keeps it.
#[derive(Debug)]
pub(crate) struct SharedPerKey<T> {
    values: Mutex<HashMap<String, Weak<T>>>,
}

impl<T> Default for SharedPerKey<T> {
    fn default() -> Self {
        SharedPerKey {
            values: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> SharedPerKey<T> {
    /// The value of `key` its holders share, made by `make` when none holds one.
    pub(crate) fn get(&self, key: &str, make: impl FnOnce() -> T) -> Arc<T> {
        let mut values = self
            .values
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(value) = values.get(key).and_then(Weak::upgrade) {
            return value;
        }
        values.retain(|_, value| value.strong_count() > 0);
        let value = Arc::new(make());
        values.insert(key.to_owned(), Arc::downgrade(&value));
        value
    }
}
