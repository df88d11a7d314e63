//! The SQLite store's writes, each inside the writer's transaction: appending events, forking
//! a thread (with the sizes its shared prefix brings) and deleting one.

use std::time::SystemTime;

use contexture_core::calibration::{Calibration, Observation};
use rusqlite::{Connection, OptionalExtension, params};

use super::references;
use crate::calibration;
use crate::error::Action;
use crate::forks::{ForkPlan, PrefixSize, SizeRow};
use crate::record::{self, Row, ThreadLimits, db_bytes, db_seq, seq_of};
use crate::referable_cache::ReferableCache;
use crate::request_refs::REQUEST_STARTED;
use crate::{StoreError, epoch_ms};

/// Appends `rows` to `thread` (creating it), inside the caller's write transaction; with
/// `after`, only when the thread's last seq is still that ([`StoreError::Moved`]).
pub(super) fn append_rows(
    tx: &Connection,
    thread: &str,
    rows: Vec<Row>,
    after: Option<u64>,
    limits: ThreadLimits,
    referable: &ReferableCache,
) -> Result<Vec<u64>, StoreError> {
    let now = epoch_ms(SystemTime::now());
    // Creates the thread when it is new, and reads its last seq and size either way.
    let (last, bytes, message_bytes): (i64, i64, i64) = tx
        .prepare_cached(
            "INSERT INTO threads (id, last_seq, created_at, updated_at) VALUES (?1, 0, ?2, ?2)
             ON CONFLICT (id) DO UPDATE SET last_seq = last_seq
             RETURNING last_seq, bytes, message_bytes",
        )
        .doing("prepare the thread's creation")?
        .query_row(params![thread, now], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .doing("create the thread or read its last seq")?;
    let mut last = seq_of(thread, last)?;
    if let Some(expected) = after
        && expected != last
    {
        // The write's savepoint is rolled back: the thread's creation too, if it made it.
        return Err(StoreError::Moved {
            thread: thread.to_owned(),
            expected,
            last_seq: last,
        });
    }
    let mut bytes = u64::try_from(bytes).unwrap_or(0);
    let mut message_bytes = u64::try_from(message_bytes).unwrap_or(0);
    let mut seqs = Vec::with_capacity(rows.len());
    {
        let mut find = tx
            .prepare_cached("SELECT seq FROM events WHERE thread_id = ?1 AND idempotency_key = ?2")
            .doing("prepare the idempotency lookup")?;
        let mut insert = tx
            .prepare_cached(
                "INSERT INTO events
                     (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .doing("prepare the insert")?;
        for mut row in rows {
            if let Some(key) = &row.key {
                let stored: Option<i64> = find
                    .query_row(params![thread, key], |r| r.get(0))
                    .optional()
                    .doing("look up the idempotency key")?;
                if let Some(seq) = stored {
                    seqs.push(seq_of(thread, seq)?);
                    continue;
                }
            }
            let seq = last + 1;
            if row.kind == REQUEST_STARTED {
                references::refer_request(tx, thread, seq, &mut row, referable)?;
            }
            // On an error the savepoint of this write is rolled back: nothing of it is stored.
            limits.admit(thread, seq, &mut bytes, &row)?;
            // Before the insert: the end's row shrinks where the new rows can still use the
            // room it leaves (the newest pages), rather than leaving a hole behind them.
            if row.step_answer {
                bytes = bytes.saturating_sub(references::share_answer(tx, thread, seq, &row)?);
            }
            message_bytes += record::message_bytes(&row);
            insert
                .execute(params![
                    thread,
                    db_seq(seq),
                    row.kind,
                    row.body,
                    row.tokens,
                    row.key,
                    now,
                    row.ordinary_message.then_some(1)
                ])
                .doing("insert the event")?;
            last = seq;
            seqs.push(seq);
        }
    }
    tx.prepare_cached(
        "UPDATE threads SET last_seq = ?2, updated_at = ?3, bytes = ?4, message_bytes = ?5
         WHERE id = ?1",
    )
    .doing("prepare the thread's update")?
    .execute(params![
        thread,
        db_seq(last),
        now,
        db_bytes(bytes),
        db_bytes(message_bytes)
    ])
    .doing("update the thread")?;
    Ok(seqs)
}

/// Forks `parent` at `at_seq` as `child`, inside the caller's write transaction.
pub(super) fn fork_thread(
    tx: &Connection,
    parent: &str,
    at_seq: u64,
    child: &str,
) -> Result<u64, StoreError> {
    let now = epoch_ms(SystemTime::now());
    let last: Option<i64> = tx
        .query_row(
            "SELECT last_seq FROM threads WHERE id = ?1",
            [parent],
            |r| r.get(0),
        )
        .optional()
        .doing("read the parent")?;
    let plan = ForkPlan::new(parent, at_seq, last)?;
    let exists: Option<i64> = tx
        .query_row("SELECT 1 FROM threads WHERE id = ?1", [child], |r| r.get(0))
        .optional()
        .doing("check the fork's id")?;
    if exists.is_some() {
        return Err(StoreError::AlreadyExists {
            thread: child.to_string(),
        });
    }
    let (bytes, message_bytes) = plan.sizes(sizes_through(tx, parent, at_seq)?);
    tx.execute(
        "INSERT INTO threads
             (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7)",
        params![
            child,
            parent,
            db_seq(at_seq),
            db_seq(plan.seq),
            now,
            db_bytes(bytes),
            db_bytes(message_bytes)
        ],
    )
    .doing("create the fork")?;
    tx.execute(
        "INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at)
         VALUES (?1, ?2, 'forked', ?3, NULL, NULL, ?4)",
        params![child, db_seq(plan.seq), plan.body, now],
    )
    .doing("record the fork")?;
    Ok(plan.seq)
}

/// The bytes of `thread`'s events and of its messages up to `at_seq`, its fork prefix
/// included: its sizes less its own events after `at_seq`, or, for a seq inside its prefix,
/// the parent's up to it.
pub(super) fn sizes_through(
    tx: &Connection,
    thread: &str,
    at_seq: u64,
) -> Result<(u64, u64), StoreError> {
    let mut walk = PrefixSize::new(thread, at_seq);
    loop {
        let row: SizeRow = tx
            .prepare_cached(
                "SELECT bytes, message_bytes, parent_id, fork_seq FROM threads WHERE id = ?1",
            )
            .doing("prepare the thread's size query")?
            .query_row([walk.current()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .doing("read the thread's size")?;
        if !walk.step(row)? {
            break;
        }
    }
    let (current, after) = (walk.current(), walk.measuring());
    let bytes_after: i64 = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0)
             FROM events WHERE thread_id = ?1 AND seq > ?2",
        )
        .doing("prepare the size query")?
        .query_row(params![current, after], |r| r.get(0))
        .doing("measure the thread's later events")?;
    let mut messages_after = 0u64;
    let mut later = tx
        .prepare_cached(
            "SELECT seq, kind, body FROM events WHERE thread_id = ?1 AND seq > ?2
               AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')",
        )
        .doing("prepare the later messages query")?;
    let mut rows = later
        .query(params![current, after])
        .doing("read the thread's later messages")?;
    while let Some(row) = rows.next().doing("read a later message")? {
        let seq = seq_of(current, row.get(0).doing("read a seq")?)?;
        let kind: String = row.get(1).doing("read a kind")?;
        let body: String = row.get(2).doing("read a body")?;
        messages_after += record::stored_message_bytes(current, seq, &kind, &body)?;
    }
    Ok(walk.finish(bytes_after, messages_after))
}

/// Deletes `thread`'s rows and counts the deletion (which drops cached folds of it, in
/// every process: see [`crate::projection_cache`]).
pub(super) fn delete_thread(conn: &Connection, thread: &str) -> Result<(), StoreError> {
    conn.execute("UPDATE deletions SET count = count + 1 WHERE id = 1", [])
        .doing("count the deletion")?;
    conn.execute("DELETE FROM events WHERE thread_id = ?1", [thread])
        .doing("delete events")?;
    conn.execute("DELETE FROM threads WHERE id = ?1", [thread])
        .doing("delete the thread")?;
    Ok(())
}

/// Deletes `thread`, which must exist and have no forks.
pub(super) fn delete_unforked(tx: &Connection, thread: &str) -> Result<(), StoreError> {
    let exists: Option<i64> = tx
        .query_row("SELECT 1 FROM threads WHERE id = ?1", [thread], |r| {
            r.get(0)
        })
        .optional()
        .doing("read the thread")?;
    if exists.is_none() {
        return Err(StoreError::NotFound {
            thread: thread.to_owned(),
        });
    }
    let forks = super::reads::forks_of(tx, thread)?;
    if !forks.is_empty() {
        return Err(StoreError::HasForks {
            thread: thread.to_owned(),
            forks,
        });
    }
    delete_thread(tx, thread)
}

/// Folds `observation` into `model`'s stored calibration and stores the result.
pub(super) fn observe_calibration(
    tx: &Connection,
    model: &str,
    observation: Observation,
    now: i64,
) -> Result<Calibration, StoreError> {
    let mut current = super::reads::stored_calibration(tx, model)?.unwrap_or_default();
    current.observe(observation);
    tx.prepare_cached(
        "INSERT INTO model_calibrations (model, calibration, updated_at)
         VALUES (?1, ?2, ?3)
         ON CONFLICT (model) DO UPDATE
         SET calibration = excluded.calibration, updated_at = excluded.updated_at",
    )
    .doing("prepare the calibration write")?
    .execute(params![model, calibration::to_stored(&current), now])
    .doing("store a calibration")?;
    Ok(current)
}
