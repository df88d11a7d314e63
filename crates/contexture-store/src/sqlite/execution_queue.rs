//! The SQLite store's queue of executions: [`ExecutionQueueStore`] over the
//! `execution_queue` table. Enqueueing, claiming, renewing and finishing are writes (the
//! writer thread runs one at a time, so a claim counts and takes a tenant's leases in one
//! step); reading a run is a read. Leases are this machine's clock: an SQLite file is
//! shared by processes of one machine only.

use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::SqliteStore;
use crate::error::Action;
use crate::execution_queue::{
    ExecutionClaim, PRUNE_BATCH, QUEUED_COLUMNS, QueueCounts, QueueHold, QueuedExecution,
    QueuedRow, RunEndStore, request_of,
};
use crate::turn_queue::lease_ms;
use crate::{ExecutionQueueStore, NewEvent, Store, StoreError, epoch_ms};

/// Finishes run `id` as `outcome` when `node` holds it with `epoch`, inside the caller's
/// write: false when it does not.
fn finish_held(
    tx: &Connection,
    id: &str,
    node: &str,
    epoch: i64,
    outcome: &str,
) -> Result<bool, StoreError> {
    let now = epoch_ms(SystemTime::now());
    let finished = tx
        .prepare_cached(
            "UPDATE execution_queue SET state = 'finished', outcome = ?4, \
             finished_at = ?5, lease_until = NULL \
             WHERE id = ?1 AND owner = ?2 AND epoch = ?3 AND state = 'running'",
        )
        .doing("prepare the finish")?
        .execute(params![id, node, epoch, outcome, now])
        .doing("finish an execution")?;
    Ok(finished == 1)
}

impl RunEndStore for SqliteStore {
    async fn append_ending_run(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        hold: &QueueHold,
        outcome: &str,
    ) -> Result<Vec<u64>, StoreError> {
        let (id, hold, outcome) = (self.global_id(thread), hold.clone(), outcome.to_owned());
        self.append_then(thread, events, move |tx| {
            if finish_held(tx, &id, &hold.node, hold.epoch, &outcome)? {
                Ok(())
            } else {
                Err(StoreError::LeaseLost { execution: id })
            }
        })
        .await
    }
}

/// Runs a claim looks at in one go: past them, the next claim goes on.
const CLAIM_WINDOW: i64 = 1_000;

impl ExecutionQueueStore for SqliteStore {
    async fn enqueue_execution(
        &self,
        id: &str,
        tenant: &str,
        request: &Value,
    ) -> Result<(), StoreError> {
        let (id, tenant, request) = (id.to_owned(), tenant.to_owned(), request.to_string());
        let now = epoch_ms(SystemTime::now());
        self.write(move |tx| {
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO execution_queue (id, tenant, state, request, enqueued_at) \
                     VALUES (?1, ?2, 'queued', ?3, ?4) ON CONFLICT (id) DO NOTHING",
                )
                .doing("prepare the execution queue insert")?
                .execute(params![id, tenant, request, now])
                .doing("enqueue an execution")?;
            if inserted == 0 {
                return Err(StoreError::AlreadyExists { thread: id });
            }
            Ok(())
        })
        .await
    }

    async fn claim_executions(
        &self,
        node: &str,
        most: usize,
        tenant_limit: usize,
        lease: Duration,
    ) -> Result<Vec<ExecutionClaim>, StoreError> {
        if most == 0 || tenant_limit == 0 {
            return Ok(Vec::new());
        }
        let node = node.to_owned();
        let now = epoch_ms(SystemTime::now());
        let lease_until = now.saturating_add(lease_ms(lease));
        self.write(move |tx| {
            let mut held: std::collections::HashMap<String, usize> = tx
                .prepare_cached(
                    "SELECT tenant, count(*) FROM execution_queue \
                     WHERE state = 'running' AND lease_until >= ?1 GROUP BY tenant",
                )
                .doing("prepare the lease count")?
                .query_map(params![now], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })
                .doing("count the tenants' live leases")?
                .map(|row| {
                    row.map(|(tenant, count)| (tenant, usize::try_from(count).unwrap_or(usize::MAX)))
                })
                .collect::<Result<_, _>>()
                .doing("read the tenants' live leases")?;
            let open: Vec<(String, String)> = tx
                .prepare_cached(
                    "SELECT id, tenant FROM execution_queue \
                     WHERE state = 'queued' OR (state = 'running' AND lease_until < ?1) \
                     ORDER BY enqueued_at, id LIMIT ?2",
                )
                .doing("prepare the open runs' query")?
                .query_map(params![now, CLAIM_WINDOW], |row| Ok((row.get(0)?, row.get(1)?)))
                .doing("find the runs to claim")?
                .collect::<Result<_, _>>()
                .doing("read the runs to claim")?;
            let mut claim = tx
                .prepare_cached(
                    "UPDATE execution_queue SET state = 'running', owner = ?2, \
                     epoch = epoch + 1, attempts = attempts + 1, lease_until = ?3, \
                     started_at = coalesce(started_at, ?4) \
                     WHERE id = ?1 AND (state = 'queued' OR (state = 'running' AND lease_until < ?4)) \
                     RETURNING epoch, attempts, request, failures",
                )
                .doing("prepare the claim")?;
            let mut claims = Vec::new();
            for (id, tenant) in open {
                if claims.len() >= most {
                    break;
                }
                let count = held.entry(tenant.clone()).or_default();
                if *count >= tenant_limit {
                    continue;
                }
                let claimed: Option<(i64, i64, String, i64)> = claim
                    .query_row(params![id, node, lease_until, now], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })
                    .optional()
                    .doing("claim an execution")?;
                let Some((epoch, attempts, request, failures)) = claimed else {
                    continue;
                };
                *count += 1;
                claims.push(ExecutionClaim {
                    request: request_of(&id, &request)?,
                    id,
                    tenant,
                    epoch,
                    adopted: attempts > 1,
                    failures: u32::try_from(failures).unwrap_or(u32::MAX),
                });
            }
            Ok(claims)
        })
        .await
    }

    async fn renew_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let (id, node) = (id.to_owned(), node.to_owned());
        let now = epoch_ms(SystemTime::now());
        let lease_until = now.saturating_add(lease_ms(lease));
        self.write(move |tx| {
            let renewed = tx
                .prepare_cached(
                    "UPDATE execution_queue SET lease_until = ?4 \
                     WHERE id = ?1 AND owner = ?2 AND epoch = ?3 AND state = 'running' \
                     AND lease_until >= ?5",
                )
                .doing("prepare the lease renewal")?
                .execute(params![id, node, epoch, lease_until, now])
                .doing("renew an execution's lease")?;
            Ok(renewed == 1)
        })
        .await
    }

    async fn finish_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let (id, node, outcome) = (id.to_owned(), node.to_owned(), outcome.to_owned());
        self.write(move |tx| finish_held(tx, &id, &node, epoch, &outcome))
            .await
    }

    async fn release_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        let (id, node) = (id.to_owned(), node.to_owned());
        let now = epoch_ms(SystemTime::now());
        self.write(move |tx| {
            let released = tx
                .prepare_cached(
                    "UPDATE execution_queue SET lease_until = ?4 - 1 \
                     WHERE id = ?1 AND owner = ?2 AND epoch = ?3 AND state = 'running'",
                )
                .doing("prepare the release")?
                .execute(params![id, node, epoch, now])
                .doing("release an execution")?;
            Ok(released == 1)
        })
        .await
    }

    async fn count_execution_failure(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        retry_after: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let (id, node) = (id.to_owned(), node.to_owned());
        let until = epoch_ms(SystemTime::now()) + lease_ms(retry_after);
        self.write(move |tx| {
            let failures: Option<i64> = tx
                .prepare_cached(
                    "UPDATE execution_queue SET failures = failures + 1, lease_until = ?4 \
                     WHERE id = ?1 AND owner = ?2 AND epoch = ?3 AND state = 'running' \
                     RETURNING failures",
                )
                .doing("prepare the failure count")?
                .query_row(params![id, node, epoch, until], |row| row.get(0))
                .optional()
                .doing("count an execution's failure")?;
            Ok(failures.map(|count| u32::try_from(count).unwrap_or(u32::MAX)))
        })
        .await
    }

    async fn finish_queued_execution(&self, id: &str, outcome: &str) -> Result<bool, StoreError> {
        let (id, outcome) = (id.to_owned(), outcome.to_owned());
        let now = epoch_ms(SystemTime::now());
        self.write(move |tx| {
            let finished = tx
                .prepare_cached(
                    "UPDATE execution_queue SET state = 'finished', outcome = ?2, \
                     finished_at = ?3 WHERE id = ?1 AND state = 'queued'",
                )
                .doing("prepare the queued run's finish")?
                .execute(params![id, outcome, now])
                .doing("finish a queued execution")?;
            Ok(finished == 1)
        })
        .await
    }

    async fn execution_queue_counts(&self) -> Result<QueueCounts, StoreError> {
        let now = epoch_ms(SystemTime::now());
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT \
                 count(*) FILTER (WHERE state = 'queued'), \
                 count(*) FILTER (WHERE state = 'running' AND lease_until >= ?1), \
                 count(*) FILTER (WHERE state = 'running' AND lease_until < ?1), \
                 count(*) FILTER (WHERE state = 'finished') \
                 FROM execution_queue",
            )
            .doing("prepare the queue's count")?
            .query_row(params![now], |row| {
                let count =
                    |at: usize| row.get::<_, i64>(at).map(|n| u64::try_from(n).unwrap_or(0));
                Ok(QueueCounts {
                    queued: count(0)?,
                    running: count(1)?,
                    lapsed: count(2)?,
                    finished: count(3)?,
                })
            })
            .doing("count the execution queue")
        })
        .await
    }

    async fn prune_finished_executions(&self, kept: Duration) -> Result<u64, StoreError> {
        let mut pruned = 0;
        loop {
            let before = epoch_ms(SystemTime::now()).saturating_sub(lease_ms(kept));
            let deleted = self
                .write(move |tx| {
                    tx.prepare_cached(
                        "DELETE FROM execution_queue WHERE id IN (SELECT id FROM execution_queue \
                         WHERE state = 'finished' AND finished_at < ?1 LIMIT ?2)",
                    )
                    .doing("prepare the finished runs' delete")?
                    .execute(params![before, PRUNE_BATCH])
                    .doing("delete finished runs from the execution queue")
                })
                .await?;
            pruned += deleted as u64;
            if (deleted as i64) < PRUNE_BATCH {
                return Ok(pruned);
            }
        }
    }

    async fn queued_execution(&self, id: &str) -> Result<Option<QueuedExecution>, StoreError> {
        let id = id.to_owned();
        let now = epoch_ms(SystemTime::now());
        self.read(move |conn| {
            let row = conn
                .prepare_cached(&format!(
                    "SELECT {QUEUED_COLUMNS} FROM execution_queue WHERE id = ?1"
                ))
                .doing("prepare the queued run's read")?
                .query_row(params![id], |row| {
                    Ok(QueuedRow {
                        id: row.get(0)?,
                        tenant: row.get(1)?,
                        state: row.get(2)?,
                        owner: row.get(3)?,
                        attempts: row.get(4)?,
                        epoch: row.get(5)?,
                        request: row.get(6)?,
                        enqueued_at: row.get(7)?,
                        started_at: row.get(8)?,
                        lease_until: row.get(9)?,
                        finished_at: row.get(10)?,
                        outcome: row.get(11)?,
                        failures: row.get(12)?,
                    })
                })
                .optional()
                .doing("read a queued execution")?;
            row.map(|row| row.into_execution(now)).transpose()
        })
        .await
    }
}
