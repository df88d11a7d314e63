//! The PostgreSQL store's queue of executions: [`ExecutionQueueStore`] over the
//! `execution_queue` table. Claims of every server are serialized by one transaction-scoped
//! advisory lock (a tenant's live leases are counted and taken in one step); renewals and
//! finishes are single updates guarded by the holder's epoch. Leases are the database's
//! clock.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use serde_json::Value;

use super::PgStore;
use super::writes::AlsoWritten;
use crate::error::Action;
use crate::execution_queue::{
    ExecutionClaim, PRUNE_BATCH, QUEUED_COLUMNS, QueueCounts, QueueHold, QueuedExecution,
    QueuedRow, RunEndStore, request_of,
};
use crate::turn_queue::lease_ms;
use crate::{ExecutionQueueStore, NewEvent, StoreError};

/// The database's clock in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Finishes run `id` as `outcome` when `node` holds it with `epoch` (in the caller's
/// transaction, if any): false when it does not.
pub(super) async fn finish_held(
    client: &impl GenericClient,
    id: &str,
    node: &str,
    epoch: i64,
    outcome: &str,
) -> Result<bool, StoreError> {
    let finished = client
        .execute(
            &format!(
                "UPDATE execution_queue SET state = 'finished', outcome = $4, \
                 finished_at = {NOW_MS}, lease_until = NULL \
                 WHERE id = $1 AND owner = $2 AND epoch = $3 AND state = 'running'"
            ),
            &[&id, &node, &epoch, &outcome],
        )
        .await
        .doing("finish an execution")?;
    Ok(finished == 1)
}

impl RunEndStore for PgStore {
    async fn append_ending_run(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        hold: &QueueHold,
        outcome: &str,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_events_with(
            thread,
            events,
            None,
            AlsoWritten::RunFinished { hold, outcome },
        )
        .await
    }
}

/// Runs a claim looks at in one go: past them, the next claim goes on.
const CLAIM_WINDOW: i64 = 1_000;

impl ExecutionQueueStore for PgStore {
    async fn enqueue_execution(
        &self,
        id: &str,
        tenant: &str,
        request: &Value,
    ) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        let request = request.to_string();
        let inserted = client
            .execute(
                &format!(
                    "INSERT INTO execution_queue (id, tenant, state, request, enqueued_at) \
                     VALUES ($1, $2, 'queued', $3, {NOW_MS}) ON CONFLICT (id) DO NOTHING"
                ),
                &[&id, &tenant, &request],
            )
            .await
            .doing("enqueue an execution")?;
        if inserted == 0 {
            return Err(StoreError::AlreadyExists { thread: id.into() });
        }
        Ok(())
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
        let mut client = self.pool.get().await?;
        let tx = client
            .transaction()
            .await
            .doing("begin claiming executions")?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('contexture-executions:' || current_schema()))",
            &[],
        )
        .await
        .doing("take the claim lock")?;
        let now: i64 = tx
            .query_one(&format!("SELECT {NOW_MS}"), &[])
            .await
            .doing("read the database's clock")?
            .get(0);
        let mut held: std::collections::HashMap<String, usize> = tx
            .query(
                "SELECT tenant, count(*) FROM execution_queue \
                 WHERE state = 'running' AND lease_until >= $1 GROUP BY tenant",
                &[&now],
            )
            .await
            .doing("count the tenants' live leases")?
            .into_iter()
            .map(|row| {
                let count: i64 = row.get(1);
                (row.get(0), usize::try_from(count).unwrap_or(usize::MAX))
            })
            .collect();
        let open = tx
            .query(
                "SELECT id, tenant FROM execution_queue \
                 WHERE state = 'queued' OR (state = 'running' AND lease_until < $1) \
                 ORDER BY enqueued_at, id LIMIT $2",
                &[&now, &CLAIM_WINDOW],
            )
            .await
            .doing("find the runs to claim")?;
        let lease_until = now.saturating_add(lease_ms(lease));
        let mut claims = Vec::new();
        for row in open {
            if claims.len() >= most {
                break;
            }
            let (id, tenant): (String, String) = (row.get(0), row.get(1));
            let count = held.entry(tenant.clone()).or_default();
            if *count >= tenant_limit {
                continue;
            }
            let claimed = tx
                .query_opt(
                    "UPDATE execution_queue SET state = 'running', owner = $2, \
                     epoch = epoch + 1, attempts = attempts + 1, lease_until = $3, \
                     started_at = coalesce(started_at, $4) \
                     WHERE id = $1 AND (state = 'queued' OR (state = 'running' AND lease_until < $4)) \
                     RETURNING epoch, attempts, request, failures",
                    &[&id, &node, &lease_until, &now],
                )
                .await
                .doing("claim an execution")?;
            let Some(claimed) = claimed else { continue };
            *count += 1;
            let attempts: i64 = claimed.get(1);
            let request: String = claimed.get(2);
            claims.push(ExecutionClaim {
                request: request_of(&id, &request)?,
                id,
                tenant,
                epoch: claimed.get(0),
                adopted: attempts > 1,
                failures: u32::try_from(claimed.get::<_, i64>(3)).unwrap_or(u32::MAX),
            });
        }
        tx.commit().await.doing("commit the claims")?;
        Ok(claims)
    }

    async fn renew_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let lease = lease_ms(lease);
        let renewed = client
            .execute(
                &format!(
                    "UPDATE execution_queue SET lease_until = {NOW_MS} + $4 \
                     WHERE id = $1 AND owner = $2 AND epoch = $3 AND state = 'running' \
                     AND lease_until >= {NOW_MS}"
                ),
                &[&id, &node, &epoch, &lease],
            )
            .await
            .doing("renew an execution's lease")?;
        Ok(renewed == 1)
    }

    async fn finish_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        finish_held(&client, id, node, epoch, outcome).await
    }

    async fn release_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let released = client
            .execute(
                &format!(
                    "UPDATE execution_queue SET lease_until = {NOW_MS} - 1 \
                     WHERE id = $1 AND owner = $2 AND epoch = $3 AND state = 'running'"
                ),
                &[&id, &node, &epoch],
            )
            .await
            .doing("release an execution")?;
        Ok(released == 1)
    }

    async fn count_execution_failure(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        retry_after: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let client = self.pool.get().await?;
        let retry_ms = lease_ms(retry_after);
        let failures = client
            .query_opt(
                &format!(
                    "UPDATE execution_queue SET failures = failures + 1, \
                     lease_until = {NOW_MS} + $4 \
                     WHERE id = $1 AND owner = $2 AND epoch = $3 AND state = 'running' \
                     RETURNING failures"
                ),
                &[&id, &node, &epoch, &retry_ms],
            )
            .await
            .doing("count an execution's failure")?;
        Ok(failures.map(|row| u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX)))
    }

    async fn finish_queued_execution(&self, id: &str, outcome: &str) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let finished = client
            .execute(
                &format!(
                    "UPDATE execution_queue SET state = 'finished', outcome = $2, \
                     finished_at = {NOW_MS} WHERE id = $1 AND state = 'queued'"
                ),
                &[&id, &outcome],
            )
            .await
            .doing("finish a queued execution")?;
        Ok(finished == 1)
    }

    async fn execution_queue_counts(&self) -> Result<QueueCounts, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                &format!(
                    "WITH clock AS (SELECT {NOW_MS} AS now) SELECT \
                     count(*) FILTER (WHERE state = 'queued'), \
                     count(*) FILTER (WHERE state = 'running' AND lease_until >= clock.now), \
                     count(*) FILTER (WHERE state = 'running' AND lease_until < clock.now), \
                     count(*) FILTER (WHERE state = 'finished') \
                     FROM execution_queue, clock"
                ),
                &[],
            )
            .await
            .doing("count the execution queue")?;
        let count = |at: usize| u64::try_from(row.get::<_, i64>(at)).unwrap_or(0);
        Ok(QueueCounts {
            queued: count(0),
            running: count(1),
            lapsed: count(2),
            finished: count(3),
        })
    }

    async fn prune_finished_executions(&self, kept: Duration) -> Result<u64, StoreError> {
        // Far past any clock, without overflowing the subtraction.
        let kept_ms = lease_ms(kept).min(i64::MAX / 2);
        let mut pruned = 0;
        loop {
            let client = self.pool.get().await?;
            let deleted = client
                .execute(
                    &format!(
                        "DELETE FROM execution_queue WHERE id IN (SELECT id FROM execution_queue \
                         WHERE state = 'finished' AND finished_at < {NOW_MS} - $1 LIMIT $2)"
                    ),
                    &[&kept_ms, &PRUNE_BATCH],
                )
                .await
                .doing("delete finished runs from the execution queue")?;
            pruned += deleted;
            if deleted < PRUNE_BATCH as u64 {
                return Ok(pruned);
            }
        }
    }

    async fn queued_execution(&self, id: &str) -> Result<Option<QueuedExecution>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!("SELECT {QUEUED_COLUMNS}, {NOW_MS} FROM execution_queue WHERE id = $1"),
                &[&id],
            )
            .await
            .doing("read a queued execution")?;
        let Some(row) = row else { return Ok(None) };
        let now: i64 = row.get(13);
        QueuedRow {
            id: row.get(0),
            tenant: row.get(1),
            state: row.get(2),
            owner: row.get(3),
            attempts: row.get(4),
            epoch: row.get(5),
            request: row.get(6),
            enqueued_at: row.get(7),
            started_at: row.get(8),
            lease_until: row.get(9),
            finished_at: row.get(10),
            outcome: row.get(11),
            failures: row.get(12),
        }
        .into_execution(now)
        .map(Some)
    }
}
