//! Turns on one thread, one at a time, in the order they arrived: each turn is fitted with
//! the answer of the one before it, whichever server answers it.
//!
//! A turn takes a ticket in its thread's queue, kept in the store so that every server
//! sharing the store sees one queue ([`contexture_store::TurnQueueStore`]), and waits until
//! no ticket is ahead of it: then it holds the thread ([`TurnLease`]) until the lease is
//! dropped, which for a chat turn is once its end is recorded. A turn waits a bounded time
//! and is refused past it with nothing written ([`TurnWaitError::TimedOut`]).
//!
//! A held or waiting ticket is renewed every third of the lease ([`TurnQueue::lease`], 30 s
//! by default); a server that stops stops renewing, and once its ticket is older than the
//! lease the next turn to renew removes it, so a stopped server holds a thread for at most
//! the lease. On one server a turn that leaves wakes the next at once; turns of other
//! servers notice within [`TurnQueue::poll`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contexture_store::{JoinedTurn, StoreError, TurnQueueStore, TurnTicket};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::per_key::SharedPerKey;

/// How long a ticket stays in the queue without being renewed.
pub const TURN_LEASE: Duration = Duration::from_secs(30);

/// How often a waiting turn looks whether the turn ahead of it, on another server, left.
pub const TURN_POLL: Duration = Duration::from_millis(100);

/// Why a turn did not get its thread.
#[derive(Debug, thiserror::Error)]
pub enum TurnWaitError {
    /// The turns ahead of it did not end within the wait allowed.
    #[error(
        "the thread is busy: {ahead} turn(s) ahead of this one did not end within {} s; nothing was stored, send the turn again later",
        waited.as_secs_f64()
    )]
    TimedOut {
        /// The thread (as the store names it).
        thread: String,
        /// How long the turn waited.
        waited: Duration,
        /// The turns still ahead of it.
        ahead: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The queues of turns of the threads this process serves (see the module documentation).
/// One per process, shared by every door.
#[derive(Debug)]
pub struct TurnQueue {
    /// Wakes the turns of a thread waiting on this process when one of them leaves.
    wakers: SharedPerKey<Notify>,
    lease: Duration,
    poll: Duration,
}

impl Default for TurnQueue {
    fn default() -> Self {
        TurnQueue::with_timing(TURN_LEASE, TURN_POLL)
    }
}

impl TurnQueue {
    /// A queue with the given lease and poll interval (the defaults are [`TURN_LEASE`] and
    /// [`TURN_POLL`]).
    pub fn with_timing(lease: Duration, poll: Duration) -> TurnQueue {
        TurnQueue {
            wakers: SharedPerKey::default(),
            lease,
            poll,
        }
    }

    /// How long a ticket stays in the queue without being renewed.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How often a waiting turn looks at the queue without being woken.
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// Waits, at most `wait`, until the turns that arrived on `thread` before this one have
    /// ended, and holds the thread until the returned lease is dropped.
    pub async fn wait_for_turn<S>(
        &self,
        store: &S,
        thread: &str,
        wait: Duration,
    ) -> Result<TurnLease, TurnWaitError>
    where
        S: TurnQueueStore + Clone + 'static,
    {
        let started = Instant::now();
        let deadline = started + wait;
        // Two tenants' threads of one name share a waker: being woken only makes a turn
        // look at its own queue again.
        let waker = self.wakers.get(thread, Notify::new);
        // Registered before the queue is read (by the join, then by each look), so a turn
        // leaving in between still wakes this one.
        let mut notified = Box::pin(waker.notified());
        notified.as_mut().enable();
        let joined = join(store, thread).await?;
        let mut ticket = joined.ticket;
        // From here on the ticket leaves the queue however the wait ends (an error, a
        // timeout, the waiting task dropped).
        let mut lease = TurnLease::new(store, thread, ticket, &waker, self.lease);
        let mut renewed = Instant::now();
        // The join counted the turns ahead: the first look needs no read of its own.
        let mut counted = Some(joined.ahead);
        loop {
            let ahead = match counted.take() {
                Some(ahead) => ahead,
                None => {
                    notified = Box::pin(waker.notified());
                    notified.as_mut().enable();
                    match store.turns_ahead(thread, ticket).await? {
                        Some(ahead) => ahead,
                        None => {
                            // The ticket lapsed (this process stalled for a whole lease):
                            // join again.
                            let joined = join(store, thread).await?;
                            ticket = joined.ticket;
                            lease.rejoined(ticket);
                            renewed = Instant::now();
                            counted = Some(joined.ahead);
                            continue;
                        }
                    }
                }
            };
            if ahead == 0 {
                lease.hold();
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TurnWaitError::TimedOut {
                    thread: thread.to_owned(),
                    waited: now - started,
                    ahead,
                });
            }
            if now >= renewed + self.lease / 3 {
                // Keeps this ticket alive, and removes those of servers that stopped.
                store.renew_turn(thread, ticket, self.lease).await?;
                renewed = Instant::now();
                continue;
            }
            let next = deadline.min(now + self.poll).min(renewed + self.lease / 3);
            tokio::select! {
                () = notified.as_mut() => {}
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

/// Joins `thread`'s queue in a task of its own: a caller that stops waiting while the
/// ticket is being taken (a client that left) does not leave a ticket behind to hold the
/// thread until it lapses; the task gives it back.
async fn join<S>(store: &S, thread: &str) -> Result<JoinedTurn, StoreError>
where
    S: TurnQueueStore + Clone + 'static,
{
    let (joined, ticket) = tokio::sync::oneshot::channel();
    let (store, thread) = (store.clone(), thread.to_owned());
    tokio::spawn(async move {
        let result = store.join_turn_queue(&thread).await;
        if let Err(Ok(joined)) = joined.send(result) {
            let _ = store.leave_turn_queue(&thread, joined.ticket).await;
        }
    });
    match ticket.await {
        Ok(result) => result,
        // The task ended without an answer: it panicked, so nothing was joined.
        Err(_) => Err(StoreError::WritePanicked {
            detail: "joining a thread's queue of turns stopped".into(),
        }),
    }
}

/// A turn's thread and queue, as its lease reaches them, whatever the store.
trait Place: Send + Sync {
    /// Renews `ticket` (a failed renewal is tried again at the next beat).
    fn renew(&self, ticket: TurnTicket) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Gives `ticket` back and wakes the turns of this process waiting behind it.
    fn leave(self: Arc<Self>, ticket: TurnTicket);
    /// Wakes the turns of this process waiting behind a ticket that was given back.
    fn wake(&self);
    /// How long a ticket stays without being renewed.
    fn lease(&self) -> Duration;
}

/// [`Place`] in a store's queue.
struct StorePlace<S> {
    store: S,
    thread: String,
    waker: Arc<Notify>,
    lease: Duration,
}

impl<S: TurnQueueStore + Clone + 'static> Place for StorePlace<S> {
    fn renew(&self, ticket: TurnTicket) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // A ticket already removed cannot be won back while the turn runs, and the
            // thread's fold reads overlapping turns whole.
            let _ = self
                .store
                .renew_turn(&self.thread, ticket, self.lease)
                .await;
        })
    }

    fn leave(self: Arc<Self>, ticket: TurnTicket) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to leave from: the ticket lapses after the lease.
            return;
        };
        runtime.spawn(async move {
            // A ticket that cannot be removed now lapses after the lease.
            let _ = self.store.leave_turn_queue(&self.thread, ticket).await;
            self.waker.notify_waiters();
        });
    }

    fn wake(&self) {
        self.waker.notify_waiters();
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}

/// A turn's place in its thread's queue: while it is held ([`TurnQueue::wait_for_turn`]
/// returned it), no other turn of the thread runs. Dropping it leaves the queue and wakes
/// the next turn.
pub struct TurnLease {
    ticket: TurnTicket,
    thread: String,
    place: Arc<dyn Place>,
    /// Set once the ticket left the queue with the turn's last write
    /// ([`TurnLease::left_with_write`]): dropping the lease then only wakes the next turn.
    left: AtomicBool,
    /// Renews the ticket while the turn holds the thread.
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for TurnLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnLease")
            .field("ticket", &self.ticket)
            .field("held", &self.heartbeat.is_some())
            .finish()
    }
}

impl TurnLease {
    fn new<S>(
        store: &S,
        thread: &str,
        ticket: TurnTicket,
        waker: &Arc<Notify>,
        lease: Duration,
    ) -> TurnLease
    where
        S: TurnQueueStore + Clone + 'static,
    {
        let place = StorePlace {
            store: store.clone(),
            thread: thread.to_owned(),
            waker: Arc::clone(waker),
            lease,
        };
        TurnLease {
            ticket,
            thread: thread.to_owned(),
            place: Arc::new(place),
            left: AtomicBool::new(false),
            heartbeat: None,
        }
    }

    /// The ticket changed: the earlier one is gone from the queue.
    fn rejoined(&mut self, ticket: TurnTicket) {
        self.ticket = ticket;
    }

    /// The turn holds its thread: its ticket is renewed until the lease is dropped.
    fn hold(&mut self) {
        let place = Arc::clone(&self.place);
        let ticket = self.ticket;
        self.heartbeat = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(place.lease() / 3).await;
                place.renew(ticket).await;
            }
        }));
    }

    /// The turn's ticket in its thread's queue.
    pub fn ticket(&self) -> TurnTicket {
        self.ticket
    }

    /// The thread held (as the store the turn waited on names it).
    pub fn thread(&self) -> &str {
        &self.thread
    }

    /// The ticket left the queue in the same write as the turn's last events
    /// ([`contexture_store::TurnQueueStore::append_leaving_turn`]): dropping the lease gives
    /// nothing back, it only wakes the turns waiting here.
    pub fn left_with_write(&self) {
        self.left.store(true, Ordering::SeqCst);
    }
}

impl Drop for TurnLease {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        if self.left.load(Ordering::SeqCst) {
            self.place.wake();
        } else {
            Arc::clone(&self.place).leave(self.ticket);
        }
    }
}
