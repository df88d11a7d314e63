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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use contexture_store::{StoreError, TurnQueueStore, TurnTicket};
use tokio::sync::Notify;
use tokio::time::Instant;

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
    wakers: Mutex<HashMap<String, Weak<Notify>>>,
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
            wakers: Mutex::new(HashMap::new()),
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
        let waker = self.waker(thread);
        let mut ticket = join(store, thread).await?;
        // From here on the ticket leaves the queue however the wait ends (an error, a
        // timeout, the waiting task dropped).
        let mut lease = TurnLease::new(store, thread, ticket, &waker, self.lease);
        let mut renewed = Instant::now();
        loop {
            let notified = waker.notified();
            tokio::pin!(notified);
            // Registered before the queue is read, so a turn leaving in between still wakes
            // this one.
            notified.as_mut().enable();
            let ahead = match store.turns_ahead(thread, ticket).await? {
                Some(ahead) => ahead,
                None => {
                    // The ticket lapsed (this process stalled for a whole lease): join again.
                    ticket = join(store, thread).await?;
                    lease.rejoined(ticket);
                    renewed = Instant::now();
                    continue;
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
                () = &mut notified => {}
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// The waker shared by this process's turns on `thread`.
    fn waker(&self, thread: &str) -> Arc<Notify> {
        let mut wakers = self
            .wakers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(waker) = wakers.get(thread).and_then(Weak::upgrade) {
            return waker;
        }
        // Threads whose turns have all ended are forgotten as new ones come.
        wakers.retain(|_, waker| waker.strong_count() > 0);
        let waker = Arc::new(Notify::new());
        wakers.insert(thread.to_owned(), Arc::downgrade(&waker));
        waker
    }
}

/// Joins `thread`'s queue in a task of its own: a caller that stops waiting while the
/// ticket is being taken (a client that left) does not leave a ticket behind to hold the
/// thread until it lapses; the task gives it back.
async fn join<S>(store: &S, thread: &str) -> Result<TurnTicket, StoreError>
where
    S: TurnQueueStore + Clone + 'static,
{
    let (joined, ticket) = tokio::sync::oneshot::channel();
    let (store, thread) = (store.clone(), thread.to_owned());
    tokio::spawn(async move {
        let result = store.join_turn_queue(&thread).await;
        if let Err(Ok(ticket)) = joined.send(result) {
            let _ = store.leave_turn_queue(&thread, ticket).await;
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

/// What leaves a thread's queue: the store call, made once.
type Leave = Box<dyn FnOnce(TurnTicket) + Send + Sync>;

/// A turn's place in its thread's queue: while it is held ([`TurnQueue::wait_for_turn`]
/// returned it), no other turn of the thread runs. Dropping it leaves the queue and wakes
/// the next turn.
pub struct TurnLease {
    ticket: TurnTicket,
    leave: Option<Leave>,
    /// Renews the ticket while the turn holds the thread.
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    renew: Arc<dyn Fn(TurnTicket) -> RenewFuture + Send + Sync>,
    lease: Duration,
}

type RenewFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

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
        let leave = {
            let store = store.clone();
            let thread = thread.to_owned();
            let waker = Arc::clone(waker);
            Box::new(move |ticket: TurnTicket| {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    // No runtime to leave from: the ticket lapses after the lease.
                    return;
                };
                runtime.spawn(async move {
                    // A ticket that cannot be removed now lapses after the lease.
                    let _ = store.leave_turn_queue(&thread, ticket).await;
                    waker.notify_waiters();
                });
            }) as Leave
        };
        let renew = {
            let store = store.clone();
            let thread = thread.to_owned();
            Arc::new(move |ticket: TurnTicket| {
                let store = store.clone();
                let thread = thread.clone();
                Box::pin(async move {
                    // A failed renewal is tried again at the next beat; a ticket already
                    // removed cannot be won back while the turn runs, and the thread's
                    // fold reads overlapping turns whole.
                    let _ = store.renew_turn(&thread, ticket, lease).await;
                }) as RenewFuture
            })
        };
        TurnLease {
            ticket,
            leave: Some(leave),
            heartbeat: None,
            renew,
            lease,
        }
    }

    /// The ticket changed: the earlier one is gone from the queue.
    fn rejoined(&mut self, ticket: TurnTicket) {
        self.ticket = ticket;
    }

    /// The turn holds its thread: its ticket is renewed until the lease is dropped.
    fn hold(&mut self) {
        let renew = Arc::clone(&self.renew);
        let ticket = self.ticket;
        let every = self.lease / 3;
        self.heartbeat = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                renew(ticket).await;
            }
        }));
    }

    /// The turn's ticket in its thread's queue.
    pub fn ticket(&self) -> TurnTicket {
        self.ticket
    }
}

impl Drop for TurnLease {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        if let Some(leave) = self.leave.take() {
            leave(self.ticket);
        }
    }
}
