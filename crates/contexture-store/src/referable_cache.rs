//! The message bodies a thread's next request record is compared with, kept between appends
//! so that recording a chat turn costs its new messages, not a read of the whole thread.
//!
//! A request record is stored by reference to the thread's messages (see
//! [`crate::request_refs`]): the append compares each message the request sent with the
//! message events' messages, byte for byte, from where the thread's recent records start
//! their runs. Read from the database every time, that is a read of most of the thread per
//! turn. Each store keeps what the last append of a thread compared with here instead, and
//! the next one reads only the message events after it.
//!
//! What is kept must stay what the database holds:
//! - a thread's events only grow, and a message event is never rewritten; a delete (then,
//!   perhaps, a new thread with the same id) bumps the database's deletion count, and
//!   bodies are used only under the count they were read under (as the projection cache
//!   does), whichever process or server deleted;
//! - the bodies are read inside a write that may still be rolled back. SQLite's writer
//!   keeps them at once and drops everything kept on any rollback (a write's savepoint, or
//!   its whole batch when the commit fails: [`ReferableCache::clear`]), before another write
//!   runs; PostgreSQL keeps them only once the append has committed.

use crate::bounded_map::BoundedMap;
use crate::request_refs::{Address, Referable};

/// The database's deletion count, which bodies are kept under (both stores' SQL).
pub(crate) const DELETION_COUNT: &str = "SELECT count FROM deletions WHERE id = 1";

/// What a body costs besides its text in the bound (its address and the vector's slot).
const PER_BODY: u64 = 48;

/// The bodies of one thread's message events from one seq through another.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct KeptBodies {
    /// The message events' messages as stored, in address order, none missing between the
    /// first and the last.
    pub messages: Vec<(Address, String)>,
    /// The first seq they cover.
    pub from: u64,
    /// The last seq they cover (the message events through it are all there).
    pub through: u64,
    /// True when they were widened back to the thread's first seq because a record sent an
    /// ordinary message the usual span did not hold: they are then kept whole, since the
    /// thread's next record is likely to need them again.
    pub widened: bool,
}

impl KeptBodies {
    fn bytes(&self) -> u64 {
        self.messages
            .iter()
            .map(|(_, body)| body.len() as u64 + PER_BODY)
            .sum()
    }
}

struct Kept {
    deletions: i64,
    bodies: KeptBodies,
}

/// The bound on the bodies kept beside a projection cache of `projection_bytes`: an eighth
/// of it (the bodies of the threads being written to, not of every thread read).
pub(crate) fn referable_bytes(projection_bytes: u64) -> u64 {
    projection_bytes / 8
}

/// The kept bodies, by thread, bounded by the memory they hold.
pub(crate) struct ReferableCache {
    threads: BoundedMap<Kept>,
}

impl ReferableCache {
    /// A cache holding about `max_bytes` of bodies (0: none).
    pub(crate) fn new(max_bytes: u64) -> ReferableCache {
        ReferableCache {
            threads: BoundedMap::new(max_bytes, u64::MAX),
        }
    }

    /// Bounds the memory to about `bytes` (0: keep nothing), dropping threads now if needed.
    pub(crate) fn set_max_bytes(&self, bytes: u64) {
        self.threads.set_max_bytes(bytes);
    }

    /// Takes out the bodies of `thread` when they were read under `deletions` and cover
    /// `from` (their older ones are dropped unless they were widened); `None` otherwise.
    pub(crate) fn take(&self, thread: &str, deletions: i64, from: u64) -> Option<KeptBodies> {
        let kept = self.threads.lock().remove(thread)?;
        if kept.deletions != deletions || kept.bodies.from > from {
            return None;
        }
        let mut bodies = kept.bodies;
        if !bodies.widened {
            let older = bodies.messages.partition_point(|(at, _)| at.seq < from);
            bodies.messages.drain(..older);
            bodies.from = from;
        }
        Some(bodies)
    }

    /// Keeps `bodies` of `thread`, read under `deletions`, dropping the least recently used
    /// others while past the bound. Bodies larger than the bound are not kept.
    pub(crate) fn put(&self, thread: &str, deletions: i64, bodies: KeptBodies) {
        let bytes = bodies.bytes();
        if bytes > self.threads.max_bytes() {
            return;
        }
        self.threads
            .lock()
            .insert(thread, Kept { deletions, bodies }, bytes, 0);
    }

    /// Drops everything kept: a write was rolled back, and what it read may be gone.
    pub(crate) fn clear(&self) {
        self.threads.lock().clear();
    }
}

/// How one record's comparison gathers the thread's message bodies: what kept bodies give,
/// and what is left to read (the same for both stores; each reads in its own way).
///
/// A store [`Gathering::start`]s with the kept bodies it took, reads the message events from
/// [`Gathering::read_from`] through the seq before the record, refers; when an ordinary
/// message was left over, reads the older ones through [`Gathering::unread_before`] and
/// [`Gathering::widen`]s; and keeps what [`Gathering::finish`] gives back (SQLite at once,
/// since the writer clears the cache on any rollback; PostgreSQL once the append commits).
#[derive(Debug)]
pub(crate) struct Gathering {
    /// Kept bodies older than the record's span (there only when they were widened).
    older: Vec<(Address, String)>,
    /// The first seq the bodies in hand cover.
    covered_from: u64,
    from: u64,
    to: u64,
    /// The first seq to read from the database.
    pub read_from: u64,
    widened: bool,
}

impl Gathering {
    /// Starts gathering the bodies from `from` through `to` into `referable`, with the
    /// `kept` bodies taken for them (see [`ReferableCache::take`]), if any.
    pub(crate) fn start(
        kept: Option<KeptBodies>,
        from: u64,
        to: u64,
        referable: &mut Referable,
    ) -> Gathering {
        match kept {
            // Only bodies that run on into what is read from the database: a gap between
            // them would let a run cover messages never compared.
            Some(mut kept)
                if kept.from <= from && kept.through <= to && kept.through + 1 >= from =>
            {
                let split = kept.messages.partition_point(|(at, _)| at.seq < from);
                referable.extend(kept.messages.split_off(split));
                Gathering {
                    older: kept.messages,
                    covered_from: kept.from,
                    from,
                    to,
                    read_from: kept.through + 1,
                    widened: kept.widened,
                }
            }
            _ => Gathering {
                older: Vec::new(),
                covered_from: from,
                from,
                to,
                read_from: from,
                widened: false,
            },
        }
    }

    /// The last seq before the bodies in hand: what a widened comparison reads from seq 1.
    pub(crate) fn unread_before(&self) -> u64 {
        self.covered_from.min(self.from) - 1
    }

    /// Puts `before` (the message events from seq 1 through [`Gathering::unread_before`])
    /// and the older bodies in hand ahead of `referable`'s.
    pub(crate) fn widen(&mut self, referable: &mut Referable, mut before: Referable) {
        before.extend(std::mem::take(&mut self.older));
        referable.prepend(before);
        self.covered_from = 1;
        self.widened = true;
    }

    /// The bodies to keep for the thread's next record: all `referable` compared with, and
    /// the older ones in hand (widened before, so kept whole).
    pub(crate) fn finish(mut self, referable: &mut Referable) -> KeptBodies {
        if !self.older.is_empty() {
            let mut before = Referable::default();
            before.extend(std::mem::take(&mut self.older));
            referable.prepend(before);
        }
        if !self.widened {
            self.covered_from = self.from;
        }
        KeptBodies {
            messages: referable.take_messages(),
            from: self.covered_from,
            through: self.to,
            widened: self.widened,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(from: u64, through: u64) -> KeptBodies {
        KeptBodies {
            messages: (from..=through)
                .map(|seq| (Address { seq, index: 0 }, format!("message {seq}")))
                .collect(),
            from,
            through,
            widened: false,
        }
    }

    fn seqs(messages: &[(Address, String)]) -> Vec<u64> {
        messages.iter().map(|(at, _)| at.seq).collect()
    }

    #[test]
    fn a_gathering_reads_only_past_the_kept_bodies_and_never_leaves_a_gap() {
        // Kept through 5, the record's span from 3: 3 to 5 from memory, 6 on read.
        let mut referable = Referable::default();
        let gathering = Gathering::start(Some(bodies(3, 5)), 3, 8, &mut referable);
        assert_eq!(gathering.read_from, 6);
        referable.extend(bodies(6, 8).messages);
        let kept = gathering.finish(&mut referable);
        assert_eq!((kept.from, kept.through, kept.widened), (3, 8, false));
        assert_eq!(seqs(&kept.messages), (3..=8).collect::<Vec<_>>());

        // Kept through 5 but the span starts at 9: the bodies would leave 6 to 8 out.
        let mut referable = Referable::default();
        let gathering = Gathering::start(Some(bodies(1, 5)), 9, 12, &mut referable);
        assert_eq!(gathering.read_from, 9);
        assert!(referable.take_messages().is_empty());

        // Newer than the record (kept past `to`): not used either.
        let mut referable = Referable::default();
        let gathering = Gathering::start(Some(bodies(1, 9)), 1, 5, &mut referable);
        assert_eq!(gathering.read_from, 1);
        assert!(referable.take_messages().is_empty());

        // Widened bodies: the older ones stay aside for the comparison, and are kept whole.
        let widened = KeptBodies {
            widened: true,
            ..bodies(1, 5)
        };
        let mut referable = Referable::default();
        let gathering = Gathering::start(Some(widened), 3, 6, &mut referable);
        assert_eq!(gathering.read_from, 6);
        assert_eq!(seqs(&referable.take_messages()), vec![3, 4, 5]);
        referable.extend(bodies(3, 6).messages);
        let kept = gathering.finish(&mut referable);
        assert_eq!((kept.from, kept.through, kept.widened), (1, 6, true));
        assert_eq!(seqs(&kept.messages), (1..=6).collect::<Vec<_>>());

        // A comparison widened to the first seq reads what lies before the bodies in hand.
        let mut referable = Referable::default();
        let mut gathering = Gathering::start(Some(bodies(4, 5)), 4, 6, &mut referable);
        assert_eq!(gathering.unread_before(), 3);
        let mut before = Referable::default();
        before.extend(bodies(1, 3).messages);
        gathering.widen(&mut referable, before);
        referable.extend(bodies(6, 6).messages);
        let kept = gathering.finish(&mut referable);
        assert_eq!((kept.from, kept.through, kept.widened), (1, 6, true));
        assert_eq!(seqs(&kept.messages), (1..=6).collect::<Vec<_>>());
    }

    #[test]
    fn bodies_are_used_only_under_the_same_deletion_count_and_from_where_they_start() {
        let cache = ReferableCache::new(1 << 20);
        cache.put("t", 3, bodies(1, 10));
        // Another deletion count: dropped.
        assert_eq!(cache.take("t", 4, 1), None);
        assert_eq!(cache.take("t", 3, 1), None, "dropped on the mismatch");
        // Asked from before their first seq: not usable.
        cache.put("t", 3, bodies(5, 10));
        assert_eq!(cache.take("t", 3, 4), None);
        // From inside: the older ones are dropped.
        cache.put("t", 3, bodies(5, 10));
        let taken = cache.take("t", 3, 8).expect("usable");
        assert_eq!(taken, bodies(8, 10));
        assert_eq!(cache.take("t", 3, 8), None, "taken out");
        // Widened bodies are kept whole.
        cache.put(
            "t",
            3,
            KeptBodies {
                widened: true,
                ..bodies(1, 10)
            },
        );
        assert_eq!(cache.take("t", 3, 8).expect("usable").messages.len(), 10);
    }

    #[test]
    fn a_rollback_clears_everything_and_the_bound_drops_the_least_recently_used() {
        let one = bodies(1, 10).bytes();
        let cache = ReferableCache::new(one * 2);
        cache.put("a", 0, bodies(1, 10));
        cache.put("b", 0, bodies(1, 10));
        cache.put("c", 0, bodies(1, 10));
        assert_eq!(cache.take("a", 0, 1), None, "the least recently used went");
        assert!(cache.take("c", 0, 1).is_some());
        cache.put("c", 0, bodies(1, 10));
        cache.clear();
        assert_eq!(cache.take("b", 0, 1), None);
        assert_eq!(cache.take("c", 0, 1), None);
        // Larger than the bound: not kept; 0 keeps nothing.
        cache.put("big", 0, bodies(1, 100));
        assert_eq!(cache.take("big", 0, 1), None);
        cache.set_max_bytes(0);
        cache.put("a", 0, bodies(1, 1));
        assert_eq!(cache.take("a", 0, 1), None);
    }
}
