//! Retention of request records in PostgreSQL (see [`crate::retention`]): a thread's
//! policy, and one transaction's worth of pruning.

use std::collections::{BTreeMap, BTreeSet};

use deadpool_postgres::GenericClient;

use crate::StoreError;
use crate::error::Action;
use crate::record::{self, db_bytes, db_seq, seq_of};
use crate::retention::{self, RequestRetention, RequestsPruned, StoredRecord};

/// How many records one transaction prunes at most. Only the thread's own appends (and its
/// forks') wait for it: its row is locked, no other thread's is.
const BATCH: usize = 128;

/// Stores `thread`'s own policy (`None` clears it).
pub(super) async fn set_retention(
    client: &impl GenericClient,
    thread: &str,
    retention: Option<&RequestRetention>,
) -> Result<(), StoreError> {
    let changed = client
        .execute(
            "UPDATE threads SET retention = $2 WHERE id = $1",
            &[&thread, &retention::to_stored(retention)],
        )
        .await
        .doing("store the retention policy")?;
    if changed == 0 {
        return Err(StoreError::NotFound {
            thread: thread.to_string(),
        });
    }
    Ok(())
}

/// The request records of `thread` (its own) from `floor` on, in seq order.
async fn records_from(
    client: &impl GenericClient,
    thread: &str,
    floor: u64,
) -> Result<Vec<StoredRecord>, StoreError> {
    let rows = client
        .query(
            "SELECT seq, created_at, body, tokens FROM events
             WHERE thread_id = $1 AND kind = 'request_started' AND seq >= $2 ORDER BY seq",
            &[&thread, &db_seq(floor)],
        )
        .await
        .doing("read request records")?;
    let mut records = Vec::with_capacity(rows.len());
    for row in rows {
        let seq = seq_of(thread, row.get(0))?;
        let body: String = row.get(2);
        let tokens: Option<String> = row.get(3);
        records.push(StoredRecord {
            seq,
            created_at_ms: row.get(1),
            body_bytes: record::body_bytes(&body),
            stored: record::decode_request(
                thread,
                seq,
                "request_started",
                &body,
                tokens.as_deref(),
            )?,
        });
    }
    Ok(records)
}

/// The forks of `thread`, forks of forks included, each with the last seq of `thread` it
/// shares, locked against appends (which could otherwise refer to a record being pruned).
async fn descendants(
    client: &impl GenericClient,
    thread: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    let rows = client
        .query(
            "WITH RECURSIVE below (id, shared) AS (
                 SELECT id, fork_seq FROM threads WHERE parent_id = $1
                 UNION ALL
                 SELECT t.id, LEAST(b.shared, t.fork_seq) FROM threads t
                 JOIN below b ON t.parent_id = b.id
             )
             SELECT id, shared FROM below ORDER BY id",
            &[&thread],
        )
        .await
        .doing("find forks")?;
    let forks: Vec<(String, u64)> = rows
        .iter()
        .map(|row| Ok((row.get::<_, String>(0), seq_of(thread, row.get(1))?)))
        .collect::<Result<_, StoreError>>()?;
    let ids: Vec<&str> = forks.iter().map(|(id, _)| id.as_str()).collect();
    if !ids.is_empty() {
        client
            .query(
                "SELECT 1 FROM threads WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                &[&ids],
            )
            .await
            .doing("lock the forks")?;
    }
    Ok(forks)
}

/// Prunes at most one batch of `thread`'s request records under `retention` at `now_ms`;
/// true with it when more are left for the next transaction.
pub(super) async fn prune_batch(
    client: &impl GenericClient,
    thread: &str,
    retention: &RequestRetention,
    now_ms: i64,
) -> Result<(RequestsPruned, bool), StoreError> {
    let floor = client
        .query_opt(
            "SELECT request_floor FROM threads WHERE id = $1 FOR UPDATE",
            &[&thread],
        )
        .await
        .doing("lock the thread")?
        .ok_or_else(|| StoreError::NotFound {
            thread: thread.to_string(),
        })?;
    let floor = seq_of(thread, floor.get(0))?;
    let forks = descendants(client, thread).await?;
    let records = records_from(client, thread, floor).await?;
    let mut referred = BTreeSet::new();
    for (fork, shared) in &forks {
        let theirs = records_from(client, fork, 0).await?;
        retention::referred_from_fork(theirs.into_iter().map(|r| r.stored), *shared, &mut referred);
    }
    let plan = retention::plan(retention, &records, &referred, floor, now_ms, BATCH);
    let mut held = BTreeMap::new();
    if let Some((from, to)) = retention::held_span(&plan, &records) {
        for (id, limit) in super::reads::chain(client, thread).await? {
            let rows = client
                .query(
                    "SELECT seq, tokens FROM events
                     WHERE thread_id = $1 AND seq <= $2 AND seq >= $3 AND seq <= $4
                       AND kind IN ('message_appended', 'step_message', 'context_replaced',
                                    'merged')",
                    &[
                        &id,
                        &limit.map_or(i64::MAX, db_seq),
                        &db_seq(from),
                        &db_seq(to),
                    ],
                )
                .await
                .doing("count messages")?;
            for row in rows {
                let tokens: Option<String> = row.get(1);
                held.insert(
                    seq_of(thread, row.get(0))?,
                    retention::messages_held(tokens.as_deref()),
                );
            }
        }
    }
    let rewrites = retention::rewrites(thread, &plan, records, &held, now_ms)?;
    let update = client
        .prepare_cached(
            "UPDATE events SET body = $3, tokens = NULL WHERE thread_id = $1 AND seq = $2",
        )
        .await
        .doing("prepare pruning a record")?;
    for rewrite in &rewrites {
        client
            .execute(&update, &[&thread, &db_seq(rewrite.seq), &rewrite.body])
            .await
            .doing("prune a request record")?;
    }
    let freed: u64 = rewrites.iter().map(|rewrite| rewrite.freed).sum();
    client
        .execute(
            "UPDATE threads SET bytes = GREATEST(bytes - $2, 0), request_floor = $3 WHERE id = $1",
            &[&thread, &db_bytes(freed), &db_seq(plan.floor)],
        )
        .await
        .doing("count the freed bytes")?;
    // A fork's size counts the prefix it shares.
    for (fork, shared) in &forks {
        let shared_freed = retention::freed_through(&rewrites, *shared);
        if shared_freed > 0 {
            client
                .execute(
                    "UPDATE threads SET bytes = GREATEST(bytes - $2, 0) WHERE id = $1",
                    &[&fork, &db_bytes(shared_freed)],
                )
                .await
                .doing("count a fork's freed bytes")?;
        }
    }
    Ok((
        RequestsPruned {
            records: rewrites.len() as u64,
            kept_for_references: plan.kept_for_references,
            bytes: freed,
        },
        plan.more,
    ))
}
