//! The queue of workflow executions, kept in the store so that every server sharing it
//! sees one queue: a run is enqueued ([`ExecutionQueueStore::enqueue_execution`]), a server
//! claims runs up to its capacity ([`ExecutionQueueStore::claim_executions`]) and holds
//! each by a lease it renews ([`ExecutionQueueStore::renew_execution`]) until it finishes
//! the run ([`ExecutionQueueStore::finish_execution`]). A server that stops renewing (it
//! died, lost the database, hung) loses the run when its lease runs out, and the next claim
//! adopts it. Leases are measured by the database's clock (SQLite's: one process), so the
//! servers need not agree on the time. Both stores implement it (SQLite migration 0014,
//! PostgreSQL migration 0013).
//!
//! Guarantees, the same for both stores and checked by the conformance suite:
//! - a run is held by at most one server at a time: claims are exclusive;
//! - every claim gives the run a new epoch: a renewal or a finish by an earlier holder
//!   does nothing, so a server that lost its lease can tell;
//! - a lease that ran out cannot be renewed, only claimed again;
//! - a tenant never holds more than the claim's tenant limit of live leases;
//! - queued runs are claimed oldest first, lapsed ones adopted with them;
//! - a finished run is never claimed again;
//! - a finished run's row is deleted only once it has been finished for longer than asked
//!   ([`ExecutionQueueStore::prune_finished_executions`]); no other row is;
//! - a run's end written by its holder ([`RunEndStore::append_ending_run`]) and its row's
//!   finish are one transaction: a server that dies after writing the end leaves no row
//!   for another server to adopt, and a holder that lost its lease writes neither.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use crate::{NewEvent, Store, StoreError};

/// Where a run stands in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Waiting for a server.
    Queued,
    /// Held by a server (its lease may have run out: see [`QueuedExecution::lease_live`]).
    Running,
    /// Ended.
    Finished,
}

impl QueueState {
    fn from_column(text: &str) -> Result<QueueState, StoreError> {
        match text {
            "queued" => Ok(QueueState::Queued),
            "running" => Ok(QueueState::Running),
            "finished" => Ok(QueueState::Finished),
            other => Err(StoreError::Corrupt {
                thread: String::new(),
                seq: 0,
                detail: format!("unknown execution queue state `{other}`"),
            }),
        }
    }
}

/// A run as the queue holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueuedExecution {
    /// The run's id (its log's thread id).
    pub id: String,
    /// The tenant it counts against.
    pub tenant: String,
    /// Where it stands.
    pub state: QueueState,
    /// The server holding it (or that last held it).
    pub owner: Option<String>,
    /// How many claims it has had: more than one means it was adopted.
    pub attempts: u32,
    /// How many times a holder gave it up on a database error of its own
    /// ([`ExecutionQueueStore::count_execution_failure`]).
    pub failures: u32,
    /// The current holder's epoch.
    pub epoch: i64,
    /// What the server that claims it needs to run it.
    pub request: Value,
    /// When it was enqueued (milliseconds since the Unix epoch, the database's clock).
    pub enqueued_at_ms: i64,
    /// When it was first claimed.
    pub started_at_ms: Option<i64>,
    /// Until when its holder's lease lasts.
    pub lease_until_ms: Option<i64>,
    /// Whether that lease was still live when it was read.
    pub lease_live: bool,
    /// When it finished.
    pub finished_at_ms: Option<i64>,
    /// How it ended.
    pub outcome: Option<String>,
}

/// How many runs the queue holds in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueCounts {
    /// Waiting for a server.
    pub queued: u64,
    /// Held by a server whose lease is live.
    pub running: u64,
    /// Held by a server whose lease ran out: the next claim adopts them.
    pub lapsed: u64,
    /// Ended.
    pub finished: u64,
}

/// A run a server claimed: it runs it (resuming it from its log when it was adopted) while
/// it renews its lease with `epoch`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionClaim {
    /// The run's id.
    pub id: String,
    /// The tenant it counts against.
    pub tenant: String,
    /// The claim's epoch, for renewing and finishing.
    pub epoch: i64,
    /// True when another server held it before (its lease ran out): it resumes from its log.
    pub adopted: bool,
    /// How many times a holder gave it up on a database error of its own so far
    /// ([`ExecutionQueueStore::count_execution_failure`]).
    pub failures: u32,
    /// What it needs to run.
    pub request: Value,
}

/// Who holds a run in the queue: the server and the epoch of its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHold {
    /// The server's name in the queue.
    pub node: String,
    /// The claim's epoch.
    pub epoch: i64,
}

/// A store that ends a queued run in its log and in the queue at once.
pub trait RunEndStore: Store {
    /// Appends `events`, which end a run, to `thread`, the run's log, and in the same
    /// transaction finishes the run in the queue (its id there is
    /// [`Store::global_id`] of `thread`) as `outcome`, when `hold` still holds it. When it
    /// does not (its lease ran out and another server claimed it, or it finished), nothing
    /// is appended: [`StoreError::LeaseLost`].
    fn append_ending_run(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        hold: &QueueHold,
        outcome: &str,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;
}

/// Storage of the queue of executions (see the module documentation).
pub trait ExecutionQueueStore: Send + Sync {
    /// Enqueues the run `id` of `tenant` with what it needs to run; a run of that id
    /// enqueued before is [`StoreError::AlreadyExists`].
    fn enqueue_execution(
        &self,
        id: &str,
        tenant: &str,
        request: &Value,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims for server `node` up to `most` runs, oldest first: queued ones, and running
    /// ones whose lease ran out (adopted); none of a tenant that already holds
    /// `tenant_limit` live leases. Each gets a lease of `lease` and a new epoch.
    fn claim_executions(
        &self,
        node: &str,
        most: usize,
        tenant_limit: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<ExecutionClaim>, StoreError>> + Send;

    /// Renews `node`'s lease of run `id` for `lease` from now. False when it no longer
    /// holds it: the lease ran out (it may have been claimed again), or the run finished.
    fn renew_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Marks run `id` finished with `outcome`, when `node` still holds it with `epoch`
    /// (false otherwise: another server holds it now).
    fn finish_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives up `node`'s lease of run `id` (held with `epoch`) at once, so that the next
    /// claim, of any server, adopts the run (a server shutting down). False when it no
    /// longer held it.
    fn release_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts one more time `node` gave up run `id` (held with `epoch`) on a database error
    /// while the database still answered, and lets the run be claimed again `retry_after`
    /// from now (by the database's clock): the count, or `None` when `node` no longer held
    /// it. A server ends the run as failed once the count reaches its cap, instead of
    /// taking it up again forever.
    fn count_execution_failure(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        retry_after: Duration,
    ) -> impl Future<Output = Result<Option<u32>, StoreError>> + Send;

    /// Finishes run `id` as `outcome` if it is still waiting in the queue (no server has
    /// taken it): true when it was; false when it was taken, finished, or never queued.
    fn finish_queued_execution(
        &self,
        id: &str,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// How many runs the queue holds in each state, judged by the database's clock.
    fn execution_queue_counts(
        &self,
    ) -> impl Future<Output = Result<QueueCounts, StoreError>> + Send;

    /// Deletes the queue's rows of runs that finished more than `kept` ago, by the
    /// database's clock, in batches of [`PRUNE_BATCH`] (one short transaction each), and
    /// returns how many. A run's log stays: its status and events are read from it, only
    /// the `queue` part of its status (attempts, node, times in the queue) goes.
    fn prune_finished_executions(
        &self,
        kept: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The run `id` as the queue holds it, if it was ever enqueued (and not pruned since).
    fn queued_execution(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<QueuedExecution>, StoreError>> + Send;
}

/// The most finished rows one transaction of [`ExecutionQueueStore::prune_finished_executions`]
/// deletes: writes queued behind it wait for no more than a batch.
pub const PRUNE_BATCH: i64 = 1_000;

/// The row columns a [`QueuedExecution`] is read from, in this order.
pub(crate) const QUEUED_COLUMNS: &str = "id, tenant, state, owner, attempts, epoch, request, \
     enqueued_at, started_at, lease_until, finished_at, outcome, failures";

/// The fields of a row read with [`QUEUED_COLUMNS`], before the request is parsed.
pub(crate) struct QueuedRow {
    pub id: String,
    pub tenant: String,
    pub state: String,
    pub owner: Option<String>,
    pub attempts: i64,
    pub epoch: i64,
    pub request: String,
    pub enqueued_at: i64,
    pub started_at: Option<i64>,
    pub lease_until: Option<i64>,
    pub finished_at: Option<i64>,
    pub outcome: Option<String>,
    pub failures: i64,
}

impl QueuedRow {
    /// The run, its lease judged at `now` (the database's clock).
    pub fn into_execution(self, now: i64) -> Result<QueuedExecution, StoreError> {
        let state = QueueState::from_column(&self.state)?;
        Ok(QueuedExecution {
            request: request_of(&self.id, &self.request)?,
            lease_live: state == QueueState::Running
                && self.lease_until.is_some_and(|until| until >= now),
            id: self.id,
            tenant: self.tenant,
            state,
            owner: self.owner,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            failures: u32::try_from(self.failures).unwrap_or(u32::MAX),
            epoch: self.epoch,
            enqueued_at_ms: self.enqueued_at,
            started_at_ms: self.started_at,
            lease_until_ms: self.lease_until,
            finished_at_ms: self.finished_at,
            outcome: self.outcome,
        })
    }
}

/// A stored request read back.
pub(crate) fn request_of(id: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::Corrupt {
        thread: id.to_owned(),
        seq: 0,
        detail: format!("the queued run's request is not JSON: {error}"),
    })
}
