//! The PostgreSQL store's schema: its numbered migrations, applied in order on open, one
//! opener at a time.

use std::time::SystemTime;

use super::PgStore;
use crate::error::Action;
use crate::{StoreError, epoch_ms, pending_migrations};

/// The numbered migrations, applied in order on open.
pub(super) const MIGRATIONS: &[(u32, &str)] = &[
    (
        1,
        include_str!("../../migrations/postgres/0001_threads.sql"),
    ),
    (
        2,
        include_str!("../../migrations/postgres/0002_api_keys.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres/0003_thread_bytes.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_ordinary_messages.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_message_bytes.sql"),
    ),
    (
        6,
        include_str!("../../migrations/postgres/0006_message_text.sql"),
    ),
    (
        7,
        include_str!("../../migrations/postgres/0007_key_index.sql"),
    ),
    (
        8,
        include_str!("../../migrations/postgres/0008_retention.sql"),
    ),
    (
        9,
        include_str!("../../migrations/postgres/0009_calibrations.sql"),
    ),
    (
        10,
        include_str!("../../migrations/postgres/0010_turn_queue.sql"),
    ),
    (
        11,
        include_str!("../../migrations/postgres/0011_tenant_conversations.sql"),
    ),
    (
        12,
        include_str!("../../migrations/postgres/0012_recent_threads.sql"),
    ),
    (
        13,
        include_str!("../../migrations/postgres/0013_execution_queue.sql"),
    ),
    (
        14,
        include_str!("../../migrations/postgres/0014_rate_limits.sql"),
    ),
    (
        15,
        include_str!("../../migrations/postgres/0015_deletions.sql"),
    ),
    (
        16,
        include_str!("../../migrations/postgres/0016_events_thread_lock.sql"),
    ),
    (
        17,
        include_str!("../../migrations/postgres/0017_partial_forks_index.sql"),
    ),
    (
        18,
        include_str!("../../migrations/postgres/0018_step_outputs_by_reference.sql"),
    ),
    (
        19,
        include_str!("../../migrations/postgres/0019_step_answers_by_reference.sql"),
    ),
    (
        20,
        include_str!("../../migrations/postgres/0020_token_counts_by_position.sql"),
    ),
    (
        21,
        include_str!("../../migrations/postgres/0021_execution_failures.sql"),
    ),
    (
        22,
        include_str!("../../migrations/postgres/0022_request_numbers_derived.sql"),
    ),
    (
        23,
        include_str!("../../migrations/postgres/0023_bodies_without_type.sql"),
    ),
];

impl PgStore {
    /// Applies the migrations of `migrations` (all of [`MIGRATIONS`], or for tests a prefix
    /// of it, as an older build would) that the database has not applied yet.
    pub(super) async fn migrate(
        &self,
        migrations: &'static [(u32, &'static str)],
    ) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin migrations")?;
        // Serialize concurrent openers of the same schema.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('contexture:' || current_schema()))",
            &[],
        )
        .await
        .doing("lock for migrations")?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                 version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .await
        .doing("create schema_version")?;
        let current: i32 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
            .await
            .doing("read the schema version")?
            .get(0);
        let current = u32::try_from(current).unwrap_or(0);
        for (version, sql) in pending_migrations("postgres", migrations, current)? {
            let failed = |e: tokio_postgres::Error| StoreError::Migration {
                backend: "postgres",
                version: *version,
                detail: e.to_string(),
            };
            tx.batch_execute(sql).await.map_err(failed)?;
            let number = i32::try_from(*version).unwrap_or(i32::MAX);
            tx.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                &[&number, &epoch_ms(SystemTime::now())],
            )
            .await
            .map_err(failed)?;
        }
        tx.commit().await.doing("commit migrations")
    }
}
