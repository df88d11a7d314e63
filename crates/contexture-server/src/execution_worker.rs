//! This server's share of the execution queue: it takes queued runs (and runs whose
//! server stopped renewing its lease) up to its capacity, runs each from its log while it
//! renews the run's lease, and finishes it in the queue when the run ends. Every server on
//! the database does the same, so a run goes on wherever there is room, and a run whose
//! server died is taken over by another once its lease runs out.
//!
//! A run is only ever written while its lease is held: its executor writes through a
//! [`Leased`] store, and a run whose lease is lost (a renewal refused, or no renewal
//! through before the lease would end) is stopped where it is, its LLM call dropped. The
//! server that takes it over resumes it from its log. The write of the run's end also
//! finishes it in the queue, in one transaction; the server finishes a run itself only
//! when it stopped without writing an end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contexture_engine::executor::{ExecError, RunOutcome};
use contexture_store::{
    AnyStore, ExecutionClaim, ExecutionQueueStore, HeldLease, Leased, QueueHold, Scoped, Store,
    StoreError, Tenant,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::app::AppState;

/// What the queue holds of a run, for the server that takes it: the run's log holds the
/// rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueuedRun {
    /// The run's id as its tenant knows it.
    pub execution: String,
}

/// How a run ended, as the queue records it.
fn outcome_text(outcome: &Result<RunOutcome, ExecError>) -> &'static str {
    match outcome {
        Ok(_) => "completed",
        Err(error) if error.is_cancelled() => "cancelled",
        Err(_) => "failed",
    }
}

/// This server's worker (one per server process).
#[derive(Debug)]
pub struct ExecutionWorker {
    /// This server's name in the queue: fresh for every process, so that a restarted
    /// server never mistakes its predecessor's leases for its own.
    node: String,
    /// The runs this server holds, by id in the whole store: each one's lease and epoch.
    held: Mutex<HashMap<String, (Arc<HeldLease>, i64)>>,
    /// Set when the server shuts down: it takes no more runs.
    stopping: AtomicBool,
    /// Set when a run was queued here: look at once instead of at the next interval.
    wake: Notify,
    started: AtomicBool,
}

impl Default for ExecutionWorker {
    fn default() -> Self {
        ExecutionWorker {
            node: format!("node-{}", crate::routes::fresh_id()),
            held: Mutex::default(),
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
            started: AtomicBool::new(false),
        }
    }
}

impl ExecutionWorker {
    /// This server's name in the queue.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How many runs this server holds now.
    pub fn held(&self) -> usize {
        self.lock().len()
    }

    /// Starts taking runs from the queue (once per process; later calls do nothing).
    pub fn start(&self, state: &AppState) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        tokio::spawn(claim_loop(state.clone()));
    }

    /// A run was queued: look for work now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Gives up every run this server holds (it is shutting down): their writes stop here
    /// at once, and each is released in the queue so that another server takes it over at
    /// its next look instead of when its lease would have run out. Takes no more runs.
    pub async fn release_all(&self, store: &impl ExecutionQueueStore) {
        self.stopping.store(true, Ordering::SeqCst);
        let held: Vec<(String, Arc<HeldLease>, i64)> = self
            .lock()
            .iter()
            .map(|(id, (lease, epoch))| (id.clone(), lease.clone(), *epoch))
            .collect();
        for (id, lease, epoch) in held {
            lease.lose();
            match store.release_execution(&id, &self.node, epoch).await {
                Ok(_) => {
                    tracing::info!(execution = %id, "released a run for another server to take over")
                }
                Err(error) => {
                    tracing::warn!(execution = %id, %error, "cannot release a run; it is taken over once its lease runs out")
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<HeldLease>, i64)>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Takes runs while there is room, every claim interval or when woken.
async fn claim_loop(state: AppState) {
    let worker = &state.worker;
    let settings = &state.config.executions;
    tracing::info!(
        node = %worker.node,
        capacity = settings.node_capacity,
        lease_secs = settings.lease_secs,
        "taking runs from the execution queue"
    );
    loop {
        if worker.stopping.load(Ordering::SeqCst) {
            return;
        }
        let room = settings.node_capacity.saturating_sub(worker.held());
        if room > 0 {
            let sent = Instant::now();
            match state
                .store
                .claim_executions(&worker.node, room, settings.max_running, settings.lease())
                .await
            {
                Ok(claims) => {
                    for claim in claims {
                        take(&state, claim, sent);
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot take runs from the execution queue"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.claim_interval()) => {}
            () = worker.wake.notified() => {}
        }
    }
}

/// Runs a claimed run here, renewing its lease, and finishes it in the queue.
fn take(state: &AppState, claim: ExecutionClaim, sent: Instant) {
    let hold = QueueHold {
        node: state.worker.node.clone(),
        epoch: claim.epoch,
    };
    let lease = Arc::new(HeldLease::new(
        claim.id.clone(),
        hold,
        state.config.executions.lease(),
        sent,
    ));
    state
        .worker
        .lock()
        .insert(claim.id.clone(), (lease.clone(), claim.epoch));
    let state = state.clone();
    tokio::spawn(async move {
        let id = claim.id.clone();
        supervise(&state, claim, lease).await;
        state.worker.lock().remove(&id);
        // Room was made: another run may be waiting.
        state.worker.wake();
    });
}

/// The run of `claim` under `lease`, to its end or until the lease is lost.
async fn supervise(state: &AppState, claim: ExecutionClaim, lease: Arc<HeldLease>) {
    let settings = &state.config.executions;
    let node = state.worker.node.clone();
    let queued: QueuedRun = match serde_json::from_value(claim.request.clone()) {
        Ok(queued) => queued,
        Err(error) => {
            tracing::error!(execution = %claim.id, %error, "a queued run cannot be read; it is finished as failed");
            finish(state, &claim, &node, "failed").await;
            return;
        }
    };
    let tenant = match Tenant::new(claim.tenant.clone()) {
        Ok(tenant) => tenant,
        Err(error) => {
            tracing::error!(execution = %claim.id, %error, "a queued run names no tenant; it is finished as failed");
            finish(state, &claim, &node, "failed").await;
            return;
        }
    };
    state.metrics.count_taken_execution(claim.adopted);
    tracing::info!(execution = %claim.id, node = %node, epoch = claim.epoch, "took a run from the execution queue");
    if claim.adopted {
        tracing::info!(execution = %claim.id, epoch = claim.epoch, "took over a run whose server stopped renewing its lease");
    }
    let store = Leased::new(state.store.clone().scoped(tenant), lease.clone());
    let executor = state.executor.on_store(store.clone());
    let active = state.active_runs.enter(&claim.id);
    let execution = queued.execution.clone();
    let mut run = tokio::spawn(async move {
        let _active = active;
        executor.resume(&execution).await
    });
    let every = settings.lease() / 3;
    let mut renewals = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let deadline = tokio::time::Instant::from_std(lease.deadline());
        tokio::select! {
            joined = &mut run => {
                concluded(state, &claim, &node, &queued, &store, joined).await;
                return;
            }
            _ = renewals.tick() => {
                if lease.finished().is_some() {
                    // The run's end finished it in the queue: there is no lease to renew,
                    // and the run has only its return left.
                    concluded(state, &claim, &node, &queued, &store, (&mut run).await).await;
                    return;
                }
                let sent = Instant::now();
                let renewal = tokio::time::timeout(
                    every,
                    state.store.renew_execution(&claim.id, &node, claim.epoch, settings.lease()),
                )
                .await;
                match renewal {
                    Ok(Ok(true)) => lease.renewed(sent),
                    // Refused because the run's end finished it meanwhile.
                    Ok(Ok(false)) if lease.finished().is_some() => {}
                    Ok(Ok(false)) => {
                        lease.lose();
                        run.abort();
                        tracing::warn!(execution = %claim.id, "a run's lease was refused on renewal: stopped it here");
                        return;
                    }
                    Ok(Err(error)) => tracing::warn!(execution = %claim.id, %error, "cannot renew a run's lease; trying again"),
                    Err(_) => tracing::warn!(execution = %claim.id, "renewing a run's lease took too long; trying again"),
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                if lease.finished().is_some() {
                    concluded(state, &claim, &node, &queued, &store, (&mut run).await).await;
                    return;
                }
                if !lease.holds() {
                    lease.lose();
                    run.abort();
                    state.metrics.count_lost_lease();
                    tracing::warn!(execution = %claim.id, "a run's lease could not be renewed in time: stopped it here; another server takes it over");
                    return;
                }
            }
        }
    }
}

/// The run of `claim` returned (`joined`): counts it when its end finished it in the queue,
/// finishes it there when that write did not (it stopped before writing an end, or its
/// task stopped), or leaves it as a database error or a lost lease asks.
async fn concluded(
    state: &AppState,
    claim: &ExecutionClaim,
    node: &str,
    queued: &QueuedRun,
    store: &Leased<Scoped<AnyStore>>,
    joined: Result<Result<RunOutcome, ExecError>, tokio::task::JoinError>,
) {
    let lease = store.lease();
    if let Some(outcome) = lease.finished() {
        tracing::info!(execution = %claim.id, outcome, "execution ended; its end finished it in the queue");
        state.metrics.count_finished_execution(outcome);
        return;
    }
    let outcome = match joined {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!(execution = %claim.id, %error, "a run's task stopped");
            // Held still: it finishes as failed; a panic is not retried forever.
            finish(state, claim, node, "failed").await;
            return;
        }
    };
    match &outcome {
        Err(ExecError::Store(StoreError::LeaseLost { .. })) => {
            tracing::warn!(execution = %claim.id, "stopped a run whose lease was lost; another server goes on with it");
        }
        Err(ExecError::Store(error)) if is_transient(error) => {
            stopped_on_database_error(state, claim, node, queued, store, error).await;
        }
        _ if !lease.holds() => {
            tracing::warn!(execution = %claim.id, "a run ended after its lease was lost; the server that took it over finishes it");
        }
        Ok(_) => {
            tracing::info!(execution = %claim.id, "execution completed");
            finish(state, claim, node, outcome_text(&outcome)).await;
        }
        Err(error) => {
            tracing::info!(execution = %claim.id, %error, "execution ended");
            finish(state, claim, node, outcome_text(&outcome)).await;
        }
    }
}

/// A run of `claim` that stopped on a database `error` while this server held it. When the
/// database answers (the error is the run's own, or passing), the stop is counted in the
/// queue and the run is taken up again from its log a claim interval later, by any server;
/// the stop that reaches `executions.max_database_failures` ends the run as failed instead,
/// its log saying why. When it does not answer, nothing is counted: the run is left to its
/// lease, and resumed by whichever server takes it next, as when a server dies.
async fn stopped_on_database_error(
    state: &AppState,
    claim: &ExecutionClaim,
    node: &str,
    queued: &QueuedRun,
    store: &Leased<Scoped<AnyStore>>,
    error: &StoreError,
) {
    let settings = &state.config.executions;
    let last = claim.failures.saturating_add(1) >= settings.max_database_failures;
    // The last stop keeps the lease while the run is ended; any other lets it be claimed
    // again soon.
    let retry_after = if last {
        settings.lease()
    } else {
        settings.claim_interval()
    };
    let sent = Instant::now();
    let counted = state
        .store
        .count_execution_failure(&claim.id, node, claim.epoch, retry_after)
        .await;
    let failures = match counted {
        Ok(Some(failures)) => failures,
        Ok(None) => {
            tracing::warn!(execution = %claim.id, %error, "a run stopped on a database error after another server took it over");
            return;
        }
        Err(also) => {
            tracing::warn!(execution = %claim.id, %error, %also, "a run stopped on a database error and the database does not answer; it is taken up again once its lease runs out");
            return;
        }
    };
    if !last {
        tracing::warn!(execution = %claim.id, %error, failures, "a run stopped on a database error; it is taken up again from its log");
        return;
    }
    store.lease().renewed(sent);
    let executor = state.executor.on_store(store.clone());
    let reason = format!(
        "the run stopped on a database error {failures} times (executions.max_database_failures); the last: {error}"
    );
    tracing::error!(execution = %claim.id, %error, failures, "a run stopped on database errors too many times; it is ended as failed");
    if let Err(also) = executor.end_failed(&queued.execution, &reason).await {
        tracing::error!(execution = %claim.id, %also, "cannot write a failed run's end to its log; it is finished in the queue all the same");
    }
    match store.lease().finished() {
        Some(outcome) => state.metrics.count_finished_execution(outcome),
        None => finish(state, claim, node, "failed").await,
    }
}

/// A store error that says nothing about the run: the database was away or the writer
/// stopped. Such a run is resumed, not finished as failed.
fn is_transient(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Database { .. } | StoreError::WriterStopped | StoreError::Task(_)
    )
}

/// How long finishing a run in the queue is tried before it is left to the lease: the
/// server that takes the run over then finds it ended and finishes it.
const FINISH_TRIES: u32 = 5;

async fn finish(state: &AppState, claim: &ExecutionClaim, node: &str, outcome: &str) {
    for attempt in 1..=FINISH_TRIES {
        match state
            .store
            .finish_execution(&claim.id, node, claim.epoch, outcome)
            .await
        {
            Ok(true) => {
                state.metrics.count_finished_execution(outcome);
                return;
            }
            Ok(false) => {
                tracing::warn!(execution = %claim.id, "a run ended after another server took it over");
                return;
            }
            Err(error) => {
                tracing::warn!(execution = %claim.id, %error, attempt, "cannot finish a run in the queue");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
        }
    }
}
