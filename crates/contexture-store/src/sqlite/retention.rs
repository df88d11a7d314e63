//! Retention of request records in SQLite (see [`crate::retention`]): a thread's policy,
//! and one transaction's worth of pruning.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{Connection, OptionalExtension, params};

use crate::StoreError;
use crate::error::Action;
use crate::record::{self, db_bytes, db_seq, seq_of};
use crate::retention::{self, RequestRetention, RequestsPruned, StoredRecord};

/// Stores `thread`'s own policy (`None` clears it).
pub(super) fn set_retention(
    tx: &Connection,
    thread: &str,
    retention: Option<&RequestRetention>,
) -> Result<(), StoreError> {
    let changed = tx
        .execute(
            "UPDATE threads SET retention = ?2 WHERE id = ?1",
            params![thread, retention::to_stored(retention)],
        )
        .doing("store the retention policy")?;
    if changed == 0 {
        return Err(StoreError::NotFound {
            thread: thread.to_string(),
        });
    }
    Ok(())
}

/// The request records of `thread` (its own) from `floor` on, in seq order.
fn records_from(
    tx: &Connection,
    thread: &str,
    floor: u64,
) -> Result<Vec<StoredRecord>, StoreError> {
    let mut select = tx
        .prepare_cached(
            "SELECT seq, created_at, body, tokens FROM events
             WHERE thread_id = ?1 AND kind = 'request_started' AND seq >= ?2 ORDER BY seq",
        )
        .doing("prepare the request records query")?;
    let mut found = select
        .query(params![thread, db_seq(floor)])
        .doing("read request records")?;
    let mut records = Vec::new();
    while let Some(row) = found.next().doing("read a request record")? {
        let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
        let body: String = row.get(2).doing("read a body")?;
        let tokens: Option<String> = row.get(3).doing("read token counts")?;
        records.push(StoredRecord {
            seq,
            created_at_ms: row.get(1).doing("read a time")?,
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
/// shares.
fn descendants(tx: &Connection, thread: &str) -> Result<Vec<(String, u64)>, StoreError> {
    let mut select = tx
        .prepare_cached(
            "WITH RECURSIVE below (id, shared) AS (
                 SELECT id, fork_seq FROM threads WHERE parent_id = ?1
                 UNION ALL
                 SELECT t.id, MIN(b.shared, t.fork_seq) FROM threads t
                 JOIN below b ON t.parent_id = b.id
             )
             SELECT id, shared FROM below",
        )
        .doing("prepare the forks query")?;
    let rows = select
        .query_map([thread], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })
        .doing("find forks")?
        .collect::<Result<Vec<_>, _>>()
        .doing("read a fork")?;
    rows.into_iter()
        .map(|(id, shared)| Ok((id, seq_of(thread, shared)?)))
        .collect()
}

/// Prunes at most one batch of `thread`'s request records under `retention` at `now_ms`;
/// true with it when more are left for the next transaction.
pub(super) fn prune_batch(
    tx: &Connection,
    thread: &str,
    retention: &RequestRetention,
    now_ms: i64,
) -> Result<(RequestsPruned, bool), StoreError> {
    let floor: Option<i64> = tx
        .query_row(
            "SELECT request_floor FROM threads WHERE id = ?1",
            [thread],
            |r| r.get(0),
        )
        .optional()
        .doing("read the thread")?;
    let Some(floor) = floor else {
        return Err(StoreError::NotFound {
            thread: thread.to_string(),
        });
    };
    let floor = seq_of(thread, floor)?;
    let records = records_from(tx, thread, floor)?;
    let forks = descendants(tx, thread)?;
    let mut referred = BTreeSet::new();
    for (fork, shared) in &forks {
        let theirs = records_from(tx, fork, 0)?;
        retention::referred_from_fork(theirs.into_iter().map(|r| r.stored), *shared, &mut referred);
    }
    let plan = retention::plan(retention, &records, &referred, floor, now_ms);
    let mut held = BTreeMap::new();
    if let Some((from, to)) = retention::held_span(&plan, &records) {
        let segments = super::chain(tx, thread)?;
        let mut select = tx
            .prepare_cached(
                "SELECT seq, tokens FROM events
                 WHERE thread_id = ?1 AND seq <= ?2 AND seq >= ?3 AND seq <= ?4
                   AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')",
            )
            .doing("prepare the message counts query")?;
        for (id, limit) in &segments {
            let rows = select
                .query_map(
                    params![id, limit.map_or(i64::MAX, db_seq), db_seq(from), db_seq(to)],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?)),
                )
                .doing("count messages")?
                .collect::<Result<Vec<_>, _>>()
                .doing("read a message count")?;
            for (seq, tokens) in rows {
                held.insert(
                    seq_of(thread, seq)?,
                    retention::messages_held(tokens.as_deref()),
                );
            }
        }
    }
    let rewrites = retention::rewrites(thread, &plan, records, &held, now_ms)?;
    let mut update = tx
        .prepare_cached(
            "UPDATE events SET body = ?3, tokens = NULL WHERE thread_id = ?1 AND seq = ?2",
        )
        .doing("prepare pruning a record")?;
    for rewrite in &rewrites {
        update
            .execute(params![thread, db_seq(rewrite.seq), rewrite.body])
            .doing("prune a request record")?;
    }
    let freed: u64 = rewrites.iter().map(|rewrite| rewrite.freed).sum();
    tx.execute(
        "UPDATE threads SET bytes = MAX(bytes - ?2, 0), request_floor = ?3 WHERE id = ?1",
        params![thread, db_bytes(freed), db_seq(plan.floor)],
    )
    .doing("count the freed bytes")?;
    // A fork's size counts the prefix it shares.
    for (fork, shared) in &forks {
        let shared_freed = retention::freed_through(&rewrites, *shared);
        if shared_freed > 0 {
            tx.execute(
                "UPDATE threads SET bytes = MAX(bytes - ?2, 0) WHERE id = ?1",
                params![fork, db_bytes(shared_freed)],
            )
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
