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

use contexture_core::message::{Content, Message, Part};
use contexture_core::thread::Thread;
use serde_json::{Map, Value};

use crate::bounded_map::BoundedMap;

/// The most events, over all kept folds, the cache stands for (a fold counts its last
/// seq); past it, the least recently used folds are dropped until it is under again.
const MAX_CACHED_EVENTS: u64 = 200_000;

/// Folds of threads longer than this are not kept.
pub(crate) const MAX_EVENTS_PER_FOLD: u64 = 20_000;

/// The memory the kept folds may hold by default (see [`fold_bytes`]): a
/// server's resident size is mostly this cache once it has served many threads.
pub const DEFAULT_PROJECTION_CACHE_BYTES: u64 = 16 * 1024 * 1024;

struct Kept {
    deletions: i64,
    fold: Thread,
}

/// The cache: thread id to its fold, shared by the store's readers, bounded by events and
/// by the memory its folds hold.
pub(crate) struct ProjectionCache {
    folds: BoundedMap<Kept>,
}

impl Default for ProjectionCache {
    fn default() -> ProjectionCache {
        ProjectionCache {
            folds: BoundedMap::new(DEFAULT_PROJECTION_CACHE_BYTES, MAX_CACHED_EVENTS),
        }
    }
}

impl ProjectionCache {
    /// Bounds the memory the kept folds hold to about `bytes` (0: keep none), dropping
    /// the least recently used ones now if they hold more.
    pub(crate) fn set_max_bytes(&self, bytes: u64) {
        self.folds.set_max_bytes(bytes);
    }

    /// True when a fold of `thread` is kept (it may still turn out unusable to a reader).
    pub(crate) fn holds(&self, thread: &str) -> bool {
        self.folds.lock().get(thread).is_some()
    }

    /// The last seq of the fold of `thread` that is kept, if one is: a reader asks for the
    /// events after it, then [`ProjectionCache::take`]s the fold.
    pub(crate) fn kept_through(&self, thread: &str) -> Option<u64> {
        self.folds
            .lock()
            .get(thread)
            .map(|kept| kept.fold.last_seq())
    }

    /// Takes out the fold of `thread` when it can be brought up to `last_seq`: read under
    /// the same deletion count and not past `last_seq` (a fold from a newer snapshot than
    /// the caller's is left for others).
    pub(crate) fn take(&self, thread: &str, deletions: i64, last_seq: u64) -> Option<Thread> {
        let mut folds = self.folds.lock();
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
        self.folds.lock().remove(thread);
    }

    /// Keeps `fold`, read under `deletions`, unless a fold at least as far along is there,
    /// dropping the least recently used others while the cache is past a bound. A fold
    /// larger than the memory bound is kept alone: a thread read again and again costs its
    /// new events only, however large, and the cache holds no more than that one thread.
    pub(crate) fn put(&self, thread: &str, deletions: i64, fold: Thread) {
        let events = fold.last_seq();
        if events > MAX_EVENTS_PER_FOLD || self.folds.max_bytes() == 0 {
            return;
        }
        // Measured outside the lock: it walks the fold's messages.
        let bytes = fold_bytes(&fold);
        let mut folds = self.folds.lock();
        if let Some(kept) = folds.get(thread)
            && kept.deletions == deletions
            && kept.fold.last_seq() >= events
        {
            return;
        }
        folds.insert(thread, Kept { deletions, fold }, bytes, events);
    }
}

/// About how many bytes `fold` holds in memory: its messages (see [`message_bytes`]) and a
/// fixed cost per event applied. It walks the messages once.
pub(crate) fn fold_bytes(fold: &Thread) -> u64 {
    /// What an event leaves behind besides messages (request ids, usage, seen ops).
    const PER_EVENT: u64 = 64;
    let messages: usize = fold.held_messages().map(message_bytes).sum();
    (messages as u64).saturating_add(fold.last_seq().saturating_mul(PER_EVENT))
}

/// About how many bytes `message` holds in memory: its texts, URLs, names, arguments and
/// extra fields, plus a fixed cost for its structure. Not exact (copies that share their
/// fields count each time): a bound on a cache, not an accounting.
pub(crate) fn message_bytes(message: &Message) -> usize {
    /// The fixed part: the shared fields, the token cache and the allocator's overhead.
    const STRUCTURE: usize = 256;
    let content = match &message.content {
        None => 0,
        Some(Content::Text(text)) => text.len(),
        Some(Content::Parts(parts)) => parts.iter().map(part_bytes).sum(),
    };
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| {
            64 + call.id.len() + call.name.len() + call.arguments.len() + map_bytes(&call.extra)
        })
        .sum();
    STRUCTURE
        + content
        + calls
        + message.name.as_ref().map_or(0, String::len)
        + message.tool_call_id.as_ref().map_or(0, |id| id.len())
        + map_bytes(&message.extra)
        + message.metadata.origin_step.as_ref().map_or(0, String::len)
        + message.metadata.tags.iter().map(String::len).sum::<usize>()
}

/// About how many bytes `part` holds in memory (see [`message_bytes`]).
fn part_bytes(part: &Part) -> usize {
    32 + match part {
        Part::Text { text, extra } => text.len() + map_bytes(extra),
        Part::Image { url, detail, extra } => {
            url.len() + detail.as_ref().map_or(0, String::len) + map_bytes(extra)
        }
        Part::Reasoning {
            text,
            signature,
            redacted,
            extra,
        } => {
            text.len()
                + signature.as_ref().map_or(0, String::len)
                + redacted.as_ref().map_or(0, String::len)
                + map_bytes(extra)
        }
        Part::Other { value } => value_bytes(value),
    }
}

/// About how many bytes a JSON object holds in memory.
fn map_bytes(map: &Map<String, Value>) -> usize {
    map.iter()
        .map(|(key, value)| 32 + key.len() + value_bytes(value))
        .sum()
}

/// About how many bytes a JSON value holds in memory.
fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(text) => 24 + text.len(),
        Value::Array(items) => 24 + items.iter().map(value_bytes).sum::<usize>(),
        Value::Object(map) => 48 + map_bytes(map),
        _ => 16,
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
        let total: u64 = cache.folds.lock().values().map(|k| k.fold.last_seq()).sum();
        assert!(total <= MAX_CACHED_EVENTS, "{total} events kept");
        assert_eq!(total, cache.folds.lock().totals().1);
        // The last one put is kept; a fold over the per-fold bound is not.
        let last = format!("t{}", threads - 1);
        assert!(cache.take(&last, 0, per).is_some());
        cache.put("huge", 0, fold("huge", per + 1));
        assert!(cache.take("huge", 0, per + 1).is_none());
    }

    #[test]
    fn the_cache_stays_under_its_byte_bound_dropping_the_least_recently_used() {
        let cache = ProjectionCache::default();
        let one = fold_bytes(&fold("a", 100));
        // Room for about four such folds.
        cache.set_max_bytes(one * 4 + one / 2);
        for id in ["a", "b", "c", "d"] {
            cache.put(id, 0, fold(id, 100));
        }
        // `a` is read again (taken and put back): `b` is now the least recently used.
        let a = cache.take("a", 0, 100).unwrap();
        cache.put("a", 0, a);
        cache.put("e", 0, fold("e", 100));
        assert!(
            !cache.holds("b"),
            "the least recently used fold is dropped first"
        );
        assert!(cache.holds("a") && cache.holds("e"));
        let bytes: u64 = cache
            .folds
            .lock()
            .values()
            .map(|k| fold_bytes(&k.fold))
            .sum();
        assert_eq!(bytes, cache.folds.lock().totals().0);
        assert!(bytes <= one * 4 + one / 2, "{bytes} bytes kept");
        // A fold that alone passes the bound is kept alone; a bound of 0 keeps nothing.
        cache.put("big", 0, fold("big", 1_000));
        assert!(cache.holds("big"));
        assert_eq!(cache.folds.lock().len(), 1);
        cache.put("a", 0, fold("a", 100));
        assert!(cache.holds("a") && !cache.holds("big"));
        cache.set_max_bytes(0);
        assert!(!cache.holds("a"));
        cache.put("a", 0, fold("a", 1));
        assert!(!cache.holds("a"));
        assert_eq!(cache.folds.lock().totals().0, 0);
    }

    #[test]
    fn a_message_s_estimated_bytes_follow_what_it_holds() {
        let base = message_bytes(&Message::user(""));
        assert_eq!(
            message_bytes(&Message::user("x".repeat(1_000))),
            base + 1_000
        );
        let call = Message::assistant_tool_calls(vec![contexture_core::message::ToolCall::new(
            "c1",
            "f",
            "a".repeat(500),
        )]);
        assert!(message_bytes(&call) >= base + 504);
        let mut parts = Message::user("");
        parts.content = Some(Content::Parts(vec![
            Part::text("t".repeat(300)),
            Part::image("u".repeat(200)),
        ]));
        assert!(message_bytes(&parts) >= base + 500);
        let mut extra = Message::user("");
        extra
            .extra
            .insert("k".into(), serde_json::json!({"nested": ["v".repeat(100)]}));
        assert!(message_bytes(&extra) > base + 100);
        // A fold counts its messages and its events.
        assert!(fold_bytes(&fold("t", 10)) >= 10 * (base as u64 + 64));
    }
}
