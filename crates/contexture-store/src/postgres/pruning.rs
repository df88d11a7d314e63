//! The PostgreSQL store's pruning: threads idle for too long deleted (forks' parents kept),
//! and request records past their thread's retention, a batch per transaction.

use std::time::SystemTime;

use super::PgStore;
use super::retention;
use super::writes::delete_thread;
use crate::error::Action;
use crate::{PruneReport, RequestRetention, RequestsPruned, StoreError, epoch_ms};

impl PgStore {
    /// Deletes the threads under `prefix` idle since before `idle_before`, in one
    /// transaction: leaves first, again and again, so that a parent goes once its forks
    /// went; an idle thread a fork still reads is kept and reported.
    pub(super) async fn prune_idle_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        let cutoff = epoch_ms(idle_before);
        let end = crate::prefix_end(prefix);
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin pruning")?;
        let mut report = PruneReport::default();
        // Byte order (the "C" collation), as the thread list reads a prefix.
        loop {
            let leaves: Vec<String> = tx
                .query(
                    r#"SELECT id FROM threads t
                       WHERE updated_at < $1 AND id COLLATE "C" >= $2
                         AND ($3::text IS NULL OR id COLLATE "C" < $3)
                         AND NOT EXISTS (SELECT 1 FROM threads c WHERE c.parent_id = t.id)
                       ORDER BY id FOR UPDATE"#,
                    &[&cutoff, &prefix, &end],
                )
                .await
                .doing("find idle threads")?
                .iter()
                .map(|row| row.get(0))
                .collect();
            if leaves.is_empty() {
                break;
            }
            for id in leaves {
                delete_thread(&tx, &id).await?;
                report.deleted.push(id);
            }
        }
        report.kept_for_forks = tx
            .query(
                r#"SELECT id FROM threads
                   WHERE updated_at < $1 AND id COLLATE "C" >= $2
                     AND ($3::text IS NULL OR id COLLATE "C" < $3)
                   ORDER BY id"#,
                &[&cutoff, &prefix, &end],
            )
            .await
            .doing("find kept threads")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        tx.commit().await.doing("commit pruning")?;
        Ok(report)
    }

    pub(super) async fn prune_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        let now_ms = epoch_ms(now);
        let mut total = RequestsPruned::default();
        loop {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await.doing("begin pruning records")?;
            let (pruned, more) = retention::prune_batch(&tx, thread, retention, now_ms).await?;
            tx.commit().await.doing("commit pruning records")?;
            total.records += pruned.records;
            total.bytes += pruned.bytes;
            total.kept_for_references = pruned.kept_for_references;
            if !more {
                return Ok(total);
            }
        }
    }
}
