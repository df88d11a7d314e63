//! The queue of chat turns on each thread, kept in the store so that every server sharing it
//! sees one queue: a turn joins with [`TurnQueueStore::join_turn_queue`] and gets a ticket,
//! holds its thread while no ticket before it is left ([`TurnQueueStore::turns_ahead`]),
//! keeps its place alive with [`TurnQueueStore::renew_turn`], and leaves with
//! [`TurnQueueStore::leave_turn_queue`], or with its last write
//! ([`TurnQueueStore::append_leaving_turn`]). A turn whose server stopped stops renewing; once its
//! heartbeat is older than the lease, the next turn that renews removes it. Both stores
//! implement it (SQLite migration 0011, PostgreSQL migration 0010).
//!
//! Guarantees, the same for both stores and checked by the conformance suite:
//! - tickets grow in the order turns joined, across servers;
//! - a thread is held by at most one live ticket at a time: the lowest of its queue;
//! - a ticket renewed within the lease is never removed by another turn.

use std::future::Future;
use std::time::Duration;

use crate::{NewEvent, StoreError};

/// A place in a thread's queue of turns.
pub type TurnTicket = i64;

/// A turn's place in its thread's queue as it joined ([`TurnQueueStore::join_turn_queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinedTurn {
    /// The turn's ticket.
    pub ticket: TurnTicket,
    /// How many turns of the thread were ahead of it as it joined (0: it holds the thread),
    /// as [`TurnQueueStore::turns_ahead`] would have said right then.
    pub ahead: u64,
}

/// Storage of each thread's queue of turns (see the module documentation).
pub trait TurnQueueStore: Send + Sync {
    /// Joins `thread`'s queue (the thread need not exist yet) and returns the turn's ticket,
    /// renewed as of now, with the turns ahead of it: a turn that finds none holds the
    /// thread without asking again.
    fn join_turn_queue(
        &self,
        thread: &str,
    ) -> impl Future<Output = Result<JoinedTurn, StoreError>> + Send;

    /// How many turns of `thread` are ahead of `ticket` (0: the turn holds the thread), or
    /// `None` when the ticket is no longer in the queue (it left, or its heartbeat lapsed and
    /// another turn removed it).
    fn turns_ahead(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Renews `ticket`'s heartbeat and removes the other turns of `thread` whose heartbeat is
    /// older than `lease`. False when the ticket is no longer in the queue.
    fn renew_turn(
        &self,
        thread: &str,
        ticket: TurnTicket,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Leaves `thread`'s queue (a ticket already gone is no error).
    fn leave_turn_queue(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Appends `events` to `thread` and leaves its queue with `ticket`, in one write: a
    /// turn's last write (its end), after which the next turn may hold the thread. The
    /// ticket is left only when the events are stored.
    fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: TurnTicket,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;
}

/// `lease` in whole milliseconds, for the stores' arithmetic.
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}
