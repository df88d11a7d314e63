//! Test harnesses: a fresh SQLite file or a fresh PostgreSQL schema per test.
//!
//! PostgreSQL is reached at `CONTEXTURE_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When it cannot be reached, tests fail under
//! `CI=true` and are skipped with a loud message otherwise.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use contexture_store::{PgStore, SqliteStore, Store};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique name for this process and call.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A store under test that can be opened again.
pub trait Harness: Send + Sync {
    /// The store type.
    type S: Store + Clone + 'static;
    /// The store.
    fn store(&self) -> &Self::S;
    /// Opens the same database again, as a new process would.
    fn reopen(&self) -> impl std::future::Future<Output = Self::S> + Send;
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let path = std::env::temp_dir().join(unique("contexture-store-test"));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh SQLite file.
pub struct Sqlite {
    pub dir: TempDir,
    pub store: SqliteStore,
}

impl Sqlite {
    pub async fn new() -> Sqlite {
        let dir = TempDir::new();
        let store = SqliteStore::open(dir.0.join("threads.db"))
            .await
            .expect("open sqlite");
        Sqlite { dir, store }
    }
}

impl Harness for Sqlite {
    type S = SqliteStore;
    fn store(&self) -> &SqliteStore {
        &self.store
    }
    async fn reopen(&self) -> SqliteStore {
        SqliteStore::open(self.dir.0.join("threads.db"))
            .await
            .expect("reopen sqlite")
    }
}

/// The PostgreSQL URL for tests.
pub fn pg_url() -> String {
    std::env::var("CONTEXTURE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A fresh schema in the test database, dropped by [`Pg::cleanup`].
pub struct Pg {
    pub schema: String,
    pub store: PgStore,
}

impl Pg {
    /// `None` (after a loud message) when PostgreSQL is unreachable outside CI; panics in CI.
    pub async fn new() -> Option<Pg> {
        let schema = unique("ctx_test");
        match PgStore::open_in_schema(&pg_url(), &schema).await {
            Ok(store) => Some(Pg { schema, store }),
            Err(error) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
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
        }
    }

    pub async fn cleanup(self) {
        self.store
            .drop_schema()
            .await
            .expect("drop the test schema");
    }
}

impl Harness for Pg {
    type S = PgStore;
    fn store(&self) -> &PgStore {
        &self.store
    }
    async fn reopen(&self) -> PgStore {
        PgStore::open_in_schema(&pg_url(), &self.schema)
            .await
            .expect("reopen postgres")
    }
}
