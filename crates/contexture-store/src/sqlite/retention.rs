//! Retention of request records in SQLite (see [`crate::retention`]): a thread's policy,
//! and one transaction's worth of pruning.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{Connection, OptionalExtension, params};

use crate::StoreError;
use crate::error::Action;
use crate::record::{self, db_bytes, db_seq, seq_of};
use crate::retention::{self, RequestRetention, RequestsPruned, Rewrite, StoredRecord};

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
/// shares and its own last seq.
fn descendants(tx: &Connection, thread: &str) -> Result<Vec<(String, u64, u64)>, StoreError> {
    let mut select = tx
        .prepare_cached(
            "WITH RECURSIVE below (id, shared, last_seq) AS (
                 SELECT id, fork_seq, last_seq FROM threads WHERE parent_id = ?1
                 UNION ALL
                 SELECT t.id, MIN(b.shared, t.fork_seq), t.last_seq FROM threads t
                 JOIN below b ON t.parent_id = b.id
             )
             SELECT id, shared, last_seq FROM below ORDER BY id",
        )
        .doing("prepare the forks query")?;
    let rows = select
        .query_map([thread], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .doing("find forks")?
        .collect::<Result<Vec<_>, _>>()
        .doing("read a fork")?;
    rows.into_iter()
        .map(|(id, shared, last)| Ok((id, seq_of(thread, shared)?, seq_of(thread, last)?)))
        .collect()
}

/// The limit of a plan made by the writer itself.
pub(super) const BATCH_LIMIT: usize = retention::PRUNE_BATCH;

/// What a thread and its forks hold when a pruning is planned: their last seqs. A pruning
/// planned on a reader is carried out only while these are unchanged, since a record
/// appended meanwhile may take a message from a record the plan prunes.
#[derive(Debug, PartialEq, Eq)]
struct Version {
    last_seq: u64,
    forks: Vec<(String, u64, u64)>,
}

fn version(tx: &Connection, thread: &str) -> Result<Option<Version>, StoreError> {
    let last: Option<i64> = tx
        .query_row(
            "SELECT last_seq FROM threads WHERE id = ?1",
            [thread],
            |r| r.get(0),
        )
        .optional()
        .doing("read the thread")?;
    let Some(last) = last else { return Ok(None) };
    Ok(Some(Version {
        last_seq: seq_of(thread, last)?,
        forks: descendants(tx, thread)?,
    }))
}

/// A pruning of one thread's records, planned on a read connection so that the writers do
/// not wait while the thread's records are read.
#[derive(Debug)]
pub(super) struct Planned {
    version: Version,
    /// The records' new bodies, in seq order.
    rewrites: Vec<Rewrite>,
    /// Where the next pruning starts reading once these are written.
    floor: u64,
    /// Records past the policy kept for the references of kept ones.
    kept_for_references: u64,
    /// True when the plan was limited and more records are to be pruned after these.
    pub(super) more: bool,
    /// The floor when the plan was made.
    floor_before: u64,
}

impl Planned {
    /// True when there is nothing to write.
    pub(super) fn is_empty(&self) -> bool {
        self.rewrites.is_empty() && self.floor == self.floor_before
    }

    /// How many records it prunes.
    pub(super) fn len(&self) -> usize {
        self.rewrites.len()
    }

    /// Records past the policy kept for the references of kept ones.
    pub(super) fn kept_for_references(&self) -> u64 {
        self.kept_for_references
    }
}

/// Plans the pruning of the records of `thread` (at most `limit`) that `retention` no longer
/// keeps at `now_ms`.
pub(super) fn plan(
    tx: &Connection,
    thread: &str,
    retention: &RequestRetention,
    now_ms: i64,
    limit: usize,
) -> Result<Planned, StoreError> {
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
    let version = version(tx, thread)?.ok_or_else(|| StoreError::NotFound {
        thread: thread.to_string(),
    })?;
    let records = records_from(tx, thread, floor)?;
    let mut referred = BTreeSet::new();
    for (fork, shared, _) in &version.forks {
        let theirs = records_from(tx, fork, 0)?;
        retention::referred_from_fork(theirs.into_iter().map(|r| r.stored), *shared, &mut referred);
    }
    let plan = retention::plan(retention, &records, &referred, floor, now_ms, limit);
    let mut held = BTreeMap::new();
    if let Some((from, to)) = retention::held_span(&plan, &records) {
        let segments = super::reads::chain(tx, thread)?;
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
    Ok(Planned {
        version,
        rewrites,
        floor: plan.floor,
        kept_for_references: plan.kept_for_references,
        more: plan.more,
        floor_before: floor,
    })
}

/// Writes `planned`'s rewrites from `from` on, at most [`retention::PRUNE_BATCH`] of them,
/// inside the writer's transaction, and the floor with the last of them; `None` (nothing
/// written) when the thread or a fork of it changed since the plan.
pub(super) fn apply(
    tx: &Connection,
    thread: &str,
    planned: &Planned,
    from: usize,
) -> Result<Option<RequestsPruned>, StoreError> {
    if version(tx, thread)?.as_ref() != Some(&planned.version) {
        return Ok(None);
    }
    let to = (from + retention::PRUNE_BATCH).min(planned.rewrites.len());
    let chunk = &planned.rewrites[from..to];
    let mut update = tx
        .prepare_cached(
            "UPDATE events SET body = ?3, tokens = NULL WHERE thread_id = ?1 AND seq = ?2",
        )
        .doing("prepare pruning a record")?;
    for rewrite in chunk {
        update
            .execute(params![thread, db_seq(rewrite.seq), rewrite.body])
            .doing("prune a request record")?;
    }
    let freed: u64 = chunk.iter().map(|rewrite| rewrite.freed).sum();
    tx.execute(
        "UPDATE threads SET bytes = MAX(bytes - ?2, 0) WHERE id = ?1",
        params![thread, db_bytes(freed)],
    )
    .doing("count the freed bytes")?;
    if to == planned.rewrites.len() {
        tx.execute(
            "UPDATE threads SET request_floor = ?2 WHERE id = ?1",
            params![thread, db_seq(planned.floor)],
        )
        .doing("move the pruning floor")?;
    }
    // A fork's size counts the prefix it shares.
    for (fork, shared, _) in &planned.version.forks {
        let shared_freed = retention::freed_through(chunk, *shared);
        if shared_freed > 0 {
            tx.execute(
                "UPDATE threads SET bytes = MAX(bytes - ?2, 0) WHERE id = ?1",
                params![fork, db_bytes(shared_freed)],
            )
            .doing("count a fork's freed bytes")?;
        }
    }
    Ok(Some(RequestsPruned {
        records: chunk.len() as u64,
        kept_for_references: planned.kept_for_references,
        bytes: freed,
    }))
}
