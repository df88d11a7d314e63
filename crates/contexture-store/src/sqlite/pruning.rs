//! The SQLite store's pruning: threads idle for too long deleted (forks' parents kept), and
//! request records past their thread's retention.

use std::sync::Arc;
use std::time::SystemTime;

use rusqlite::{Connection, params};

use super::SqliteStore;
use super::retention;
use super::writes::delete_thread;
use crate::error::Action;
use crate::{PruneReport, RequestRetention, RequestsPruned, StoreError, epoch_ms};

/// Deletes the threads under `prefix` idle since before `cutoff`, inside the caller's write
/// transaction: leaves first, again and again, so that a parent goes once its forks went; an
/// idle thread a fork still reads is kept and reported.
pub(super) fn prune_idle(
    tx: &Connection,
    prefix: &str,
    cutoff: i64,
) -> Result<PruneReport, StoreError> {
    let end = crate::prefix_end(prefix);
    let mut report = PruneReport::default();
    loop {
        let leaves: Vec<String> = tx
            .prepare_cached(
                "SELECT id FROM threads t
                 WHERE updated_at < ?1 AND id >= ?2 AND (?3 IS NULL OR id < ?3)
                   AND NOT EXISTS (SELECT 1 FROM threads c WHERE c.parent_id = t.id)
                 ORDER BY id",
            )
            .doing("prepare the idle query")?
            .query_map(params![cutoff, prefix, end], |r| r.get(0))
            .doing("find idle threads")?
            .collect::<Result<_, _>>()
            .doing("read an idle thread")?;
        if leaves.is_empty() {
            break;
        }
        for id in leaves {
            delete_thread(tx, &id)?;
            report.deleted.push(id);
        }
    }
    report.kept_for_forks = tx
        .prepare_cached(
            "SELECT id FROM threads
             WHERE updated_at < ?1 AND id >= ?2 AND (?3 IS NULL OR id < ?3) ORDER BY id",
        )
        .doing("prepare the kept query")?
        .query_map(params![cutoff, prefix, end], |r| r.get(0))
        .doing("find kept threads")?
        .collect::<Result<_, _>>()
        .doing("read a kept thread")?;
    Ok(report)
}

impl SqliteStore {
    /// Prunes `thread`'s request records by `retention` (see
    /// [`crate::Store::prune_thread_requests`]): planned on a reader, written by the writer a
    /// batch at a time, planned again when the thread's appends outdate the plan.
    pub(super) async fn prune_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        /// Plans made on a reader that a busy thread's appends outdated before they were
        /// written: past these, the plan is made by the writer, a batch at a time.
        const STALE_PLANS: usize = 3;
        let now_ms = epoch_ms(now);
        let mut total = RequestsPruned::default();
        for _ in 0..STALE_PLANS {
            // The records are read on a reader: the writers wait only for the rewrites.
            let (id, policy) = (thread.to_string(), *retention);
            let planned = self
                .read(move |conn| {
                    let tx = conn.transaction().doing("begin a read")?;
                    let planned = retention::plan(&tx, &id, &policy, now_ms, usize::MAX)?;
                    tx.commit().doing("end the read")?;
                    Ok(planned)
                })
                .await?;
            total.kept_for_references = planned.kept_for_references();
            if planned.is_empty() {
                return Ok(total);
            }
            let planned = Arc::new(planned);
            let mut from = 0;
            let written = loop {
                let (id, plan) = (thread.to_string(), Arc::clone(&planned));
                match self
                    .write(move |tx| retention::apply(tx, &id, &plan, from))
                    .await?
                {
                    Some(done) => {
                        total.records += done.records;
                        total.bytes += done.bytes;
                        from += done.records as usize;
                        if from >= planned.len() {
                            break true;
                        }
                    }
                    None => {
                        tracing::debug!(thread, "appends outdated a pruning plan; planning again");
                        break false;
                    }
                }
            };
            if written {
                if total.records > 0 {
                    self.reclaim().await?;
                }
                return Ok(total);
            }
        }
        loop {
            let (id, policy) = (thread.to_string(), *retention);
            let (done, more) = self
                .write(move |tx| {
                    let planned =
                        retention::plan(tx, &id, &policy, now_ms, retention::BATCH_LIMIT)?;
                    let done = retention::apply(tx, &id, &planned, 0)?;
                    Ok((done, planned.more))
                })
                .await?;
            let done = done.unwrap_or_default();
            total.records += done.records;
            total.bytes += done.bytes;
            total.kept_for_references = done.kept_for_references;
            if !more {
                break;
            }
        }
        if total.records > 0 {
            self.reclaim().await?;
        }
        Ok(total)
    }
}
