//! The SQLite store's schema: its numbered migrations, applied in order on open, and the
//! database file, created readable by its owner only.

use std::path::Path;
use std::time::SystemTime;

use rusqlite::{Connection, TransactionBehavior, params};

use crate::error::Action;
use crate::{StoreError, epoch_ms, pending_migrations};

/// The numbered migrations, applied in order on open.
pub(super) const MIGRATIONS: &[(u32, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_threads.sql")),
    (
        2,
        include_str!("../../migrations/sqlite/0002_ordinary_messages.sql"),
    ),
    (3, include_str!("../../migrations/sqlite/0003_api_keys.sql")),
    (
        4,
        include_str!("../../migrations/sqlite/0004_deletions.sql"),
    ),
    (
        5,
        include_str!("../../migrations/sqlite/0005_thread_bytes.sql"),
    ),
    (
        6,
        include_str!("../../migrations/sqlite/0006_message_bytes.sql"),
    ),
    (
        7,
        include_str!("../../migrations/sqlite/0007_message_text.sql"),
    ),
    (
        8,
        include_str!("../../migrations/sqlite/0008_events_by_rowid.sql"),
    ),
    (
        9,
        include_str!("../../migrations/sqlite/0009_retention.sql"),
    ),
    (
        10,
        include_str!("../../migrations/sqlite/0010_calibrations.sql"),
    ),
    (
        11,
        include_str!("../../migrations/sqlite/0011_turn_queue.sql"),
    ),
    (
        12,
        include_str!("../../migrations/sqlite/0012_tenant_conversations.sql"),
    ),
    (
        13,
        include_str!("../../migrations/sqlite/0013_recent_threads.sql"),
    ),
    (
        14,
        include_str!("../../migrations/sqlite/0014_execution_queue.sql"),
    ),
    (
        15,
        include_str!("../../migrations/sqlite/0015_step_outputs_by_reference.sql"),
    ),
    (
        16,
        include_str!("../../migrations/sqlite/0016_step_answers_by_reference.sql"),
    ),
    (
        17,
        include_str!("../../migrations/sqlite/0017_token_counts_by_position.sql"),
    ),
    (
        18,
        include_str!("../../migrations/sqlite/0018_execution_failures.sql"),
    ),
    (
        19,
        include_str!("../../migrations/sqlite/0019_request_numbers_derived.sql"),
    ),
    (
        20,
        include_str!("../../migrations/sqlite/0020_bodies_without_type.sql"),
    ),
];

/// Creates the database file at `path`, when it does not exist, readable and writable by
/// its owner only: it holds every tenant's conversations and the API keys' hashes. SQLite
/// gives its write-ahead log and shared-memory files the database file's permissions.
pub(super) fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::CreateFile {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Applies the migrations of `migrations` (all of [`MIGRATIONS`], or for tests a prefix of
/// it, as an older build would) that the database has not applied yet.
pub(super) fn migrate(
    conn: &mut Connection,
    migrations: &'static [(u32, &'static str)],
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .doing("begin migrations")?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )
    .doing("create schema_version")?;
    let current: u32 = tx
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .doing("read the schema version")?;
    for (version, sql) in pending_migrations("sqlite", migrations, current)? {
        let failed = |e: rusqlite::Error| StoreError::Migration {
            backend: "sqlite",
            version: *version,
            detail: e.to_string(),
        };
        tx.execute_batch(sql).map_err(failed)?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![version, epoch_ms(SystemTime::now())],
        )
        .map_err(failed)?;
    }
    tx.commit().doing("commit migrations")
}
