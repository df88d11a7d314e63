//! The map both of a store's per-thread caches keep their entries in: thread id to entry,
//! bounded by the memory the entries hold (and by a second measure of the cache's own, such
//! as events), dropping the least recently put entries first.
//!
//! Each entry is stamped with the map's tick when it is put, and the map keeps running
//! totals, so that a put costs its own entry; only past a bound does it sort the entries by
//! their stamps, and then drops down to [`EVICT_TO_EIGHTHS`] of the bounds, so that the next
//! puts do not sort again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Past a bound, entries are dropped until the map is this fraction (in eighths) of it.
const EVICT_TO_EIGHTHS: u64 = 7;

/// The shared, bounded map. `max_bytes` can change while it is in use; `max_count` is fixed.
pub(crate) struct BoundedMap<V> {
    entries: Mutex<Entries<V>>,
    /// The byte bound, readable without the lock (a put checks it before measuring).
    max_bytes: AtomicU64,
}

/// The entries and their totals, under the map's lock.
pub(crate) struct Entries<V> {
    kept: HashMap<String, Entry<V>>,
    bytes: u64,
    count: u64,
    tick: u64,
    max_bytes: u64,
    max_count: u64,
}

struct Entry<V> {
    value: V,
    /// What the entry was measured at when it was put.
    bytes: u64,
    count: u64,
    /// The tick when it was put: the smallest is the least recently used.
    used: u64,
}

impl<V> BoundedMap<V> {
    /// A map holding about `max_bytes` (0: nothing) and `max_count` of the second measure.
    pub(crate) fn new(max_bytes: u64, max_count: u64) -> BoundedMap<V> {
        BoundedMap {
            entries: Mutex::new(Entries {
                kept: HashMap::new(),
                bytes: 0,
                count: 0,
                tick: 0,
                max_bytes,
                max_count,
            }),
            max_bytes: AtomicU64::new(max_bytes),
        }
    }

    /// The entries, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Entries<V>> {
        // An entry is put and removed whole, with the totals, under the lock: a panic
        // elsewhere cannot leave one half-updated.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The byte bound (0: the map keeps nothing).
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// Bounds the memory to about `bytes` (0: keep nothing), dropping entries now if needed.
    pub(crate) fn set_max_bytes(&self, bytes: u64) {
        self.max_bytes.store(bytes, Ordering::Relaxed);
        let mut entries = self.lock();
        entries.max_bytes = bytes;
        if bytes == 0 {
            entries.clear();
        } else {
            entries.evict("");
        }
    }
}

impl<V> Entries<V> {
    /// The entry of `key`, if one is kept.
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.kept.get(key).map(|entry| &entry.value)
    }

    /// Takes out the entry of `key`, if one is kept.
    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        let entry = self.kept.remove(key)?;
        self.bytes -= entry.bytes;
        self.count -= entry.count;
        Some(entry.value)
    }

    /// Keeps `value` for `key`, measured at `bytes` and `count`, in place of any entry
    /// there, as the most recently used; then drops the least recently used others while
    /// the map is past a bound. An entry that alone passes a bound is kept alone: callers
    /// that want no such entry check before putting. Nothing is kept while the byte bound
    /// is 0.
    pub(crate) fn insert(&mut self, key: &str, value: V, bytes: u64, count: u64) {
        self.remove(key);
        if self.max_bytes == 0 {
            return;
        }
        self.tick += 1;
        self.bytes += bytes;
        self.count += count;
        self.kept.insert(
            key.to_string(),
            Entry {
                value,
                bytes,
                count,
                used: self.tick,
            },
        );
        self.evict(key);
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        if !self.kept.is_empty() {
            self.kept.clear();
            self.bytes = 0;
            self.count = 0;
        }
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept.len()
    }

    /// The bytes and the count the entries were measured at, in all.
    #[cfg(test)]
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.bytes, self.count)
    }

    /// The entries' values.
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.kept.values().map(|entry| &entry.value)
    }

    /// Drops the least recently used entries but `keep` until both totals are within
    /// [`EVICT_TO_EIGHTHS`] of their bounds, when either is past its bound.
    fn evict(&mut self, keep: &str) {
        if self.bytes <= self.max_bytes && self.count <= self.max_count {
            return;
        }
        let bytes_to = self.max_bytes / 8 * EVICT_TO_EIGHTHS;
        let count_to = self.max_count / 8 * EVICT_TO_EIGHTHS;
        let mut by_use: Vec<(u64, String)> = self
            .kept
            .iter()
            .filter(|(key, _)| key.as_str() != keep)
            .map(|(key, entry)| (entry.used, key.clone()))
            .collect();
        by_use.sort_unstable();
        for (_, key) in by_use {
            if self.bytes <= bytes_to && self.count <= count_to {
                break;
            }
            self.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_a_bound_the_least_recently_put_go_first_down_to_seven_eighths() {
        let map = BoundedMap::new(800, u64::MAX);
        for key in ["a", "b", "c", "d"] {
            map.lock().insert(key, key.to_string(), 200, 1);
        }
        // `a` is put again: `b` is now the least recently used.
        let a = map.lock().remove("a").unwrap();
        map.lock().insert("a", a, 200, 1);
        map.lock().insert("e", "e".into(), 200, 1);
        let entries = map.lock();
        // 1,000 bytes past 800: down to 700 at most, so `b` and `c` went.
        assert_eq!(entries.totals(), (600, 3));
        assert!(entries.get("b").is_none() && entries.get("c").is_none());
        assert!(entries.get("a").is_some() && entries.get("d").is_some());
    }

    #[test]
    fn the_second_measure_bounds_too_and_an_entry_past_a_bound_is_kept_alone() {
        let map = BoundedMap::new(1 << 20, 80);
        for key in ["a", "b", "c"] {
            map.lock().insert(key, (), 10, 40);
        }
        // 120 past 80: down to 70 at most, so `a` and `b` went.
        assert_eq!(map.lock().totals(), (10, 40));
        assert!(map.lock().get("a").is_none() && map.lock().get("b").is_none());
        map.lock().insert("big", (), 10, 500);
        let entries = map.lock();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.totals(), (10, 500));
    }

    #[test]
    fn a_bound_of_zero_keeps_nothing_and_a_lower_bound_drops_now() {
        let map = BoundedMap::new(1_000, u64::MAX);
        for key in ["a", "b", "c", "d"] {
            map.lock().insert(key, (), 200, 0);
        }
        map.set_max_bytes(400);
        assert_eq!(map.lock().totals().0, 200, "down to 350 at most");
        assert!(map.lock().get("d").is_some());
        map.set_max_bytes(0);
        assert_eq!(map.lock().len(), 0);
        map.lock().insert("a", (), 1, 0);
        assert_eq!(map.lock().len(), 0);
        assert_eq!(map.max_bytes(), 0);
    }
}
