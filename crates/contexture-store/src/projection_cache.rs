//! Folds of recently read threads, so that reading a thread's projection again costs the
//! events appended since, not the whole active context. Both stores keep one per store
//! (per process): SQLite's readers share it, and so do a PostgreSQL store's clones.
//!
//! A projection is a pure function of a thread's events, and a thread only grows: a fold up
//! to seq N stays the fold of the same events up to N for as long as the thread exists. The
//! one way its events can change under an id is a delete (then, perhaps, a new thread with
//! the same id). Every delete, by any process or server, bumps the database's deletion count
//! in its own transaction; a fold is kept with the count it was read under and used only
//! while the count, read in the same snapshot as the new events, is unchanged.

use std::collections::HashMap;
use std::sync::Mutex;

use contexture_core::thread::Thread;

/// The most events, over all kept folds, the cache stands for (a fold counts its last
/// seq); past it, folds are dropped until it is under again.
const MAX_CACHED_EVENTS: u64 = 200_000;

/// Folds of threads longer than this are not kept.
pub(crate) const MAX_EVENTS_PER_FOLD: u64 = 20_000;

struct Kept {
    deletions: i64,
    fold: Thread,
}

/// The cache: thread id to its fold, shared by the store's readers.
#[derive(Default)]
pub(crate) struct ProjectionCache {
    folds: Mutex<HashMap<String, Kept>>,
}

impl ProjectionCache {
    fn folds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        // A fold is replaced whole, never left half-updated in the map: a panic elsewhere
        // cannot leave an entry wrong.
        self.folds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when a fold of `thread` is kept (it may still turn out unusable to a reader).
    pub(crate) fn holds(&self, thread: &str) -> bool {
        self.folds().contains_key(thread)
    }

    /// The last seq of the fold of `thread` that is kept, if one is: a reader asks for the
    /// events after it, then [`ProjectionCache::take`]s the fold.
    pub(crate) fn kept_through(&self, thread: &str) -> Option<u64> {
        self.folds().get(thread).map(|kept| kept.fold.last_seq())
    }

    /// Takes out the fold of `thread` when it can be brought up to `last_seq`: read under
    /// the same deletion count and not past `last_seq` (a fold from a newer snapshot than
    /// the caller's is left for others).
    pub(crate) fn take(&self, thread: &str, deletions: i64, last_seq: u64) -> Option<Thread> {
        let mut folds = self.folds();
        let kept = folds.get(thread)?;
        if kept.deletions != deletions {
            folds.remove(thread);
            return None;
        }
        if kept.fold.last_seq() > last_seq {
            return None;
        }
        folds.remove(thread).map(|kept| kept.fold)
    }

    /// Drops the fold of `thread`, if one is kept (the thread is gone).
    pub(crate) fn forget(&self, thread: &str) {
        self.folds().remove(thread);
    }

    /// Keeps `fold`, read under `deletions`, unless a fold at least as far along is there.
    pub(crate) fn put(&self, thread: &str, deletions: i64, fold: Thread) {
        let size = fold.last_seq();
        if size > MAX_EVENTS_PER_FOLD {
            return;
        }
        let mut folds = self.folds();
        if let Some(kept) = folds.get(thread)
            && kept.deletions == deletions
            && kept.fold.last_seq() >= size
        {
            return;
        }
        folds.insert(thread.to_string(), Kept { deletions, fold });
        let mut total: u64 = folds.values().map(|kept| kept.fold.last_seq()).sum();
        if total > MAX_CACHED_EVENTS {
            // No recency order is kept: drop others (any) until under the bound.
            let others: Vec<String> = folds.keys().filter(|id| *id != thread).cloned().collect();
            for id in others {
                if total <= MAX_CACHED_EVENTS {
                    break;
                }
                if let Some(dropped) = folds.remove(&id) {
                    total -= dropped.fold.last_seq();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use contexture_core::Message;
    use contexture_core::thread::{Event, EventKind};

    use super::*;

    fn fold(id: &str, events: u64) -> Thread {
        let mut thread = Thread::new(id);
        for seq in 1..=events {
            thread
                .apply(Event::new(
                    seq,
                    EventKind::MessageAppended {
                        message: Message::user(format!("m{seq}")),
                    },
                ))
                .unwrap();
        }
        thread
    }

    #[test]
    fn a_fold_is_used_only_under_the_same_deletion_count_and_not_past_the_caller() {
        let cache = ProjectionCache::default();
        cache.put("t", 0, fold("t", 5));
        // A caller whose snapshot is older than the fold leaves it.
        assert!(cache.take("t", 0, 4).is_none());
        assert_eq!(cache.take("t", 0, 7).unwrap().last_seq(), 5);
        // Taken out: a second reader reads in full meanwhile.
        assert!(cache.take("t", 0, 7).is_none());
        cache.put("t", 0, fold("t", 5));
        // A delete since: the fold is dropped.
        assert!(cache.take("t", 1, 5).is_none());
        assert!(cache.take("t", 0, 5).is_none());
    }

    #[test]
    fn a_fold_further_along_is_not_replaced_by_an_older_one() {
        let cache = ProjectionCache::default();
        cache.put("t", 0, fold("t", 8));
        cache.put("t", 0, fold("t", 3));
        assert_eq!(cache.take("t", 0, 10).unwrap().last_seq(), 8);
        // Under a new deletion count, the newer read wins whatever its length.
        cache.put("t", 0, fold("t", 8));
        cache.put("t", 1, fold("t", 3));
        assert_eq!(cache.take("t", 1, 10).unwrap().last_seq(), 3);
    }

    #[test]
    fn the_cache_stays_under_its_event_bound() {
        let cache = ProjectionCache::default();
        let per = MAX_EVENTS_PER_FOLD;
        let threads = MAX_CACHED_EVENTS / per + 3;
        for i in 0..threads {
            cache.put(&format!("t{i}"), 0, fold(&format!("t{i}"), per));
        }
        let total: u64 = cache.folds().values().map(|k| k.fold.last_seq()).sum();
        assert!(total <= MAX_CACHED_EVENTS, "{total} events kept");
        // The last one put is kept; a fold over the per-fold bound is not.
        let last = format!("t{}", threads - 1);
        assert!(cache.take(&last, 0, per).is_some());
        cache.put("huge", 0, fold("huge", per + 1));
        assert!(cache.take("huge", 0, per + 1).is_none());
    }
}
