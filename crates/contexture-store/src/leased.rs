//! A run's writes fenced by its lease: a [`Leased`] store is a store whose writes are
//! refused ([`StoreError::LeaseLost`]) once the server no longer holds the lease of the
//! execution it runs ([`HeldLease`]), so that a server cut off from the database, hung, or
//! too slow to renew never writes to a log another server has adopted.
//!
//! The write that ends the run (its `run_ended` event, in the run's own log) also finishes
//! the run in the queue, in the same transaction and only while the database still names
//! this server's claim as the holder ([`RunEndStore::append_ending_run`]): a server that
//! dies just after the end leaves nothing for another to adopt, and one whose claim was
//! taken over writes no end at all.
//!
//! A lease is granted by the database's clock, but a server can only judge it by its own:
//! it counts the lease from the moment it *sent* the claim or renewal (the database granted
//! it later, so it lasts at least that long there), less a margin for the write in flight
//! and for clocks that tick at slightly different rates. Elapsed times are compared, never
//! the clocks' readings, so skew between machines does not matter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, EventKind, Projection, RunStatus, Thread};
use contexture_core::tokens::Encoding;

use crate::retention::{RequestRetention, RequestsPruned};
use crate::{
    EventOutline, EventPage, JoinedTurn, KeyedEvent, NewEvent, ProjectionTail, PruneReport,
    QueueHold, RecentCursor, RunEndStore, Store, StoreError, ThreadInfo, TurnQueueStore,
    TurnTicket,
};

/// The share of a lease kept back: a write checked just before the lease ends still has
/// this long to commit before another server may adopt the run.
const MARGIN_SHARE: u32 = 5;

/// A server's hold on one execution's lease, as its own clock judges it.
#[derive(Debug)]
pub struct HeldLease {
    execution: String,
    hold: QueueHold,
    lease: Duration,
    /// Until when writes are allowed.
    deadline: Mutex<Instant>,
    /// Set when the server learned that the lease is gone (a renewal was refused).
    lost: AtomicBool,
    /// The outcome the run was finished with in the queue, once its end was written.
    finished: OnceLock<&'static str>,
}

impl HeldLease {
    /// The lease of `execution` (its id in the whole store) held as `hold`, `lease` long,
    /// claimed by a request sent at `sent`.
    pub fn new(
        execution: impl Into<String>,
        hold: QueueHold,
        lease: Duration,
        sent: Instant,
    ) -> HeldLease {
        HeldLease {
            execution: execution.into(),
            hold,
            lease,
            deadline: Mutex::new(Self::usable_until(lease, sent)),
            lost: AtomicBool::new(false),
            finished: OnceLock::new(),
        }
    }

    fn usable_until(lease: Duration, sent: Instant) -> Instant {
        sent + lease - lease / MARGIN_SHARE
    }

    /// The execution held.
    pub fn execution(&self) -> &str {
        &self.execution
    }

    /// The lease was renewed by a request sent at `sent`.
    pub fn renewed(&self, sent: Instant) {
        let until = Self::usable_until(self.lease, sent);
        let mut deadline = self.lock();
        if until > *deadline {
            *deadline = until;
        }
    }

    /// The outcome the run was finished with in the queue, in the same write as its end
    /// (`completed`, `failed` or `cancelled`); `None` until then.
    pub fn finished(&self) -> Option<&'static str> {
        self.finished.get().copied()
    }

    /// The lease is gone (a renewal was refused): nothing more is written.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Until when writes are allowed, unless the lease is renewed meanwhile.
    pub fn deadline(&self) -> Instant {
        *self.lock()
    }

    /// True while writes are allowed.
    pub fn holds(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && Instant::now() < self.deadline()
    }

    /// [`StoreError::LeaseLost`] once writes are no longer allowed.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.holds() {
            Ok(())
        } else {
            Err(StoreError::LeaseLost {
                execution: self.execution.clone(),
            })
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.deadline
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `S` with its writes allowed only while a lease is held (see the module documentation).
/// Reads go through whatever the lease.
#[derive(Debug, Clone)]
pub struct Leased<S> {
    inner: S,
    lease: std::sync::Arc<HeldLease>,
}

impl<S> Leased<S> {
    /// `inner`, written to only while `lease` is held.
    pub fn new(inner: S, lease: std::sync::Arc<HeldLease>) -> Leased<S> {
        Leased { inner, lease }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The lease its writes are allowed under.
    pub fn lease(&self) -> &HeldLease {
        &self.lease
    }
}

/// How a queued run ends, in the queue's words, when `events` end it.
fn run_outcome(events: &[NewEvent]) -> Option<&'static str> {
    events.iter().find_map(|event| match &event.kind {
        EventKind::RunEnded(end) => Some(match end.status {
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }),
        _ => None,
    })
}

impl<S: RunEndStore> Store for Leased<S> {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        self.lease.check()?;
        let ending =
            run_outcome(&events).filter(|_| self.inner.global_id(thread) == self.lease.execution);
        let Some(outcome) = ending else {
            return self.inner.append(thread, events).await;
        };
        match self
            .inner
            .append_ending_run(thread, events, &self.lease.hold, outcome)
            .await
        {
            Ok(seqs) => {
                let _ = self.lease.finished.set(outcome);
                Ok(seqs)
            }
            Err(error) => {
                if matches!(error, StoreError::LeaseLost { .. }) {
                    self.lease.lose();
                }
                Err(error)
            }
        }
    }

    /// Checked against the lease as [`Store::append`] is; a run's end written this way is
    /// not finished in the queue with it (the worker finishes a run whose end it did not
    /// see written, in a write of its own), so the executor writes its end with `append`.
    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        self.lease.check()?;
        self.inner.append_after(thread, after, events).await
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.events(thread).await
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        self.inner.exists(thread).await
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        self.inner.events_after(thread, after).await
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_through(thread, after, through).await
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        self.inner.outlines_through(thread, after, through).await
    }

    async fn events_page(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<EventPage, StoreError> {
        self.inner
            .events_page(thread, after, limit, max_bytes)
            .await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        self.inner.keyed_event(thread, key).await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        self.lease.check()?;
        self.inner.fork(parent, at_seq, child).await
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner.list_page(prefix, after, limit).await
    }

    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner
            .list_recent(prefix, contains, before, limit)
            .await
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner.forks_of(thread).await
    }

    async fn thread_info(&self, thread: &str) -> Result<Option<ThreadInfo>, StoreError> {
        self.inner.thread_info(thread).await
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        self.lease.check()?;
        self.inner.delete(thread).await
    }

    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        self.lease.check()?;
        self.inner.prune_under(prefix, idle_before).await
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        self.lease.check()?;
        self.inner.set_retention(thread, retention).await
    }

    async fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        self.lease.check()?;
        self.inner
            .prune_thread_requests(thread, retention, now)
            .await
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        self.inner.calibration(model).await
    }

    // Calibrations are shared by every run and summed, never a log's: a late observation
    // adds one sample.
    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        self.inner.observe_calibration(model, observation).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        self.inner.load_projection(thread).await
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        self.inner
            .load_projection_tail(thread, encoding, tokens)
            .await
    }

    fn global_id(&self, thread: &str) -> String {
        self.inner.global_id(thread)
    }

    async fn load(&self, thread: &str) -> Result<Thread, StoreError> {
        self.inner.load(thread).await
    }
}

impl<S: TurnQueueStore> TurnQueueStore for Leased<S> {
    async fn join_turn_queue(&self, thread: &str) -> Result<JoinedTurn, StoreError> {
        self.lease.check()?;
        self.inner.join_turn_queue(thread).await
    }

    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.turns_ahead(thread, ticket).await
    }

    async fn renew_turn(
        &self,
        thread: &str,
        ticket: TurnTicket,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew_turn(thread, ticket, lease).await
    }

    // Leaving a queue only ever lets others go on.
    async fn leave_turn_queue(&self, thread: &str, ticket: TurnTicket) -> Result<(), StoreError> {
        self.inner.leave_turn_queue(thread, ticket).await
    }

    // A write to the thread like any other: refused once the lease is lost.
    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: TurnTicket,
    ) -> Result<Vec<u64>, StoreError> {
        self.lease.check()?;
        self.inner.append_leaving_turn(thread, events, ticket).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use contexture_core::Message;
    use contexture_core::thread::EventKind;

    use super::*;
    use crate::{ExecutionQueueStore, SqliteStore};

    /// A store holding `run-1` in its queue, claimed by `node-1`, and the claim's epoch.
    async fn claimed_run(dir: &crate::testing::TempDir) -> (SqliteStore, i64) {
        let store = SqliteStore::open(dir.join("leased.db")).await.unwrap();
        store
            .enqueue_execution("run-1", "acme", &serde_json::json!({}))
            .await
            .unwrap();
        let claim = store
            .claim_executions("node-1", 1, 10, Duration::from_secs(60))
            .await
            .unwrap();
        (store, claim[0].epoch)
    }

    fn hold(epoch: i64) -> QueueHold {
        QueueHold {
            node: "node-1".into(),
            epoch,
        }
    }

    fn ended(status: RunStatus) -> Vec<NewEvent> {
        vec![NewEvent::new(EventKind::RunEnded(
            contexture_core::thread::RunEnd {
                status,
                output: None,
                error: None,
            },
        ))]
    }

    fn appended(text: &str) -> Vec<NewEvent> {
        vec![NewEvent::new(EventKind::MessageAppended {
            message: Message::user(text),
        })]
    }

    #[test]
    fn a_lease_is_usable_until_its_margin_before_it_ends() {
        let sent = Instant::now();
        let lease = HeldLease::new("run-1", hold(1), Duration::from_secs(10), sent);
        assert_eq!(lease.deadline(), sent + Duration::from_secs(8));
        assert!(lease.holds());
        // A renewal sent earlier than the claim never shortens the lease.
        lease.renewed(sent - Duration::from_secs(5));
        assert_eq!(lease.deadline(), sent + Duration::from_secs(8));
        lease.renewed(sent + Duration::from_secs(3));
        assert_eq!(lease.deadline(), sent + Duration::from_secs(11));
        lease.lose();
        assert!(!lease.holds());
        assert!(matches!(
            lease.check(),
            Err(StoreError::LeaseLost { execution }) if execution == "run-1"
        ));
    }

    #[tokio::test]
    async fn writes_stop_when_the_lease_is_lost_and_reads_go_on() {
        let dir = crate::testing::TempDir::new("contexture-leased");
        let store = SqliteStore::open(dir.join("leased.db")).await.unwrap();
        let lease = Arc::new(HeldLease::new(
            "run-1",
            hold(1),
            Duration::from_secs(60),
            Instant::now(),
        ));
        let leased = Leased::new(store.clone(), lease.clone());
        leased.append("run-1", appended("one")).await.unwrap();
        leased.fork("run-1", 1, "run-1~fork").await.unwrap();
        lease.lose();
        for refused in [
            leased.append("run-1", appended("two")).await.map(drop),
            leased.fork("run-1", 1, "run-1~again").await.map(drop),
            leased.delete("run-1~fork").await,
            leased.set_retention("run-1", None).await,
        ] {
            assert!(
                matches!(refused, Err(StoreError::LeaseLost { .. })),
                "{refused:?}"
            );
        }
        assert_eq!(leased.events("run-1").await.unwrap().len(), 1);
        assert!(leased.exists("run-1~fork").await.unwrap());
        assert_eq!(store.events("run-1").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_lease_that_runs_out_refuses_writes_without_being_told() {
        let dir = crate::testing::TempDir::new("contexture-leased");
        let store = SqliteStore::open(dir.join("leased.db")).await.unwrap();
        let lease = Arc::new(HeldLease::new(
            "run-1",
            hold(1),
            Duration::from_millis(50),
            Instant::now(),
        ));
        let leased = Leased::new(store, lease);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(matches!(
            leased.append("run-1", appended("late")).await,
            Err(StoreError::LeaseLost { .. })
        ));
    }

    #[tokio::test]
    async fn the_runs_own_end_finishes_it_in_the_queue_and_a_childs_does_not() {
        let dir = crate::testing::TempDir::new("contexture-leased");
        let (store, epoch) = claimed_run(&dir).await;
        let lease = Arc::new(HeldLease::new(
            "run-1",
            hold(epoch),
            Duration::from_secs(60),
            Instant::now(),
        ));
        let leased = Leased::new(store.clone(), lease.clone());
        // A sub-workflow's end is its own log's: the queue row stays the run's.
        leased
            .append("run-1~child", ended(RunStatus::Failed))
            .await
            .unwrap();
        let row = store.queued_execution("run-1").await.unwrap().unwrap();
        assert_eq!(row.state, crate::QueueState::Running);
        assert_eq!(lease.finished(), None);
        leased
            .append("run-1", ended(RunStatus::Completed))
            .await
            .unwrap();
        let row = store.queued_execution("run-1").await.unwrap().unwrap();
        assert_eq!(row.state, crate::QueueState::Finished);
        assert_eq!(row.outcome.as_deref(), Some("completed"));
        assert_eq!(lease.finished(), Some("completed"));
    }

    #[tokio::test]
    async fn an_end_refused_by_the_queue_loses_the_lease_and_stores_nothing() {
        let dir = crate::testing::TempDir::new("contexture-leased");
        let (store, epoch) = claimed_run(&dir).await;
        // This server's clock says it holds the run; the queue says another claim does.
        let lease = Arc::new(HeldLease::new(
            "run-1",
            hold(epoch + 1),
            Duration::from_secs(60),
            Instant::now(),
        ));
        let leased = Leased::new(store.clone(), lease.clone());
        leased.append("run-1", appended("step")).await.unwrap();
        assert!(matches!(
            leased.append("run-1", ended(RunStatus::Completed)).await,
            Err(StoreError::LeaseLost { .. })
        ));
        assert!(!lease.holds());
        assert_eq!(lease.finished(), None);
        assert_eq!(store.events("run-1").await.unwrap().len(), 1);
        let row = store.queued_execution("run-1").await.unwrap().unwrap();
        assert_eq!(row.state, crate::QueueState::Running);
    }
}
