//! Test support for the crates that test against real databases (feature `testing`): a
//! temporary directory, unique names, and a fresh PostgreSQL schema per test.
//!
//! PostgreSQL is reached at `CONTEXTURE_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When it cannot be reached, [`pg_store`]
//! panics under `CI=true` and otherwise returns `None` after a loud message, so a developer
//! without PostgreSQL sees that tests were skipped and CI never skips silently.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{PgStore, SqliteStore, StoreError};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call, starting with `prefix` (usable as a schema or
/// thread name: letters, digits and underscores when `prefix` is).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A temporary directory, removed with everything in it when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory under the system's temporary directory.
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The PostgreSQL URL of the test database.
pub fn pg_url() -> String {
    std::env::var("CONTEXTURE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// True when `CI=true`: unreachable services fail tests instead of skipping them.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A store in a fresh schema of the test database (drop it with [`PgStore::drop_schema`]),
/// with the schema's name. `None`, after a loud message, when PostgreSQL is unreachable
/// outside CI; a panic under `CI=true`.
pub async fn pg_store(prefix: &str) -> Option<(PgStore, String)> {
    let schema = unique(prefix);
    match PgStore::open_in_schema(&pg_url(), &schema).await {
        Ok(store) => Some((store, schema)),
        Err(error) => unreachable_pg(error),
    }
}

/// What a test does when PostgreSQL cannot be reached: panics under `CI=true`, otherwise
/// says loudly that the test is skipped.
fn unreachable_pg<T>(error: StoreError) -> Option<T> {
    if in_ci() {
        panic!(
            "CI=true and PostgreSQL at {} is unreachable: {error}",
            pg_url()
        );
    }
    eprintln!(
        "\n!!! SKIPPING a PostgreSQL test: {} is unreachable ({error}). \
         Set CONTEXTURE_TEST_PG; under CI=true this fails.\n",
        pg_url()
    );
    None
}

/// Opens (creating when missing) the SQLite database at `path` as a build that knows only the
/// migrations up to `version` would: for tests that a new migration applies to a database an
/// older build left. A database at a newer version is refused with
/// [`StoreError::SchemaTooNew`], as that build would refuse it.
pub fn open_sqlite_at_version(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
    SqliteStore::open_at_version(path, version)
}

/// Like [`pg_store`], as a build that knows only the migrations up to `version` would (see
/// [`open_sqlite_at_version`]).
pub async fn pg_store_at_version(prefix: &str, version: u32) -> Option<(PgStore, String)> {
    let schema = unique(prefix);
    match PgStore::open_in_schema_at_version(&pg_url(), &schema, version).await {
        Ok(store) => Some((store, schema)),
        Err(error) => unreachable_pg(error),
    }
}

/// Opens `schema` of the test database as a build that knows only the migrations up to
/// `version` would (see [`open_sqlite_at_version`]).
pub async fn open_pg_at_version(schema: &str, version: u32) -> Result<PgStore, StoreError> {
    PgStore::open_in_schema_at_version(&pg_url(), schema, version).await
}
