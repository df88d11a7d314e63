//! Test harnesses: a fresh SQLite file or a fresh PostgreSQL schema per test (see
//! `contexture_store::testing` for how an unreachable PostgreSQL is handled).

#![allow(dead_code)]

use contexture_store::testing::{self, TempDir};
use contexture_store::{PgStore, SqliteStore, Store};

pub use contexture_store::testing::pg_url;

/// A store under test that can be opened again.
pub trait Harness: Send + Sync {
    /// The store type.
    type S: Store + Clone + 'static;
    /// The store.
    fn store(&self) -> &Self::S;
    /// Opens the same database again, as a new process would.
    fn reopen(&self) -> impl std::future::Future<Output = Self::S> + Send;
}

/// A fresh SQLite file.
pub struct Sqlite {
    pub dir: TempDir,
    pub store: SqliteStore,
}

impl Sqlite {
    pub async fn new() -> Sqlite {
        let dir = TempDir::new("contexture-store-test");
        let store = SqliteStore::open(dir.join("threads.db"))
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
        SqliteStore::open(self.dir.join("threads.db"))
            .await
            .expect("reopen sqlite")
    }
}

/// A fresh schema in the test database, dropped by [`Pg::cleanup`].
pub struct Pg {
    pub schema: String,
    pub store: PgStore,
}

impl Pg {
    /// `None` (after a loud message) when PostgreSQL is unreachable outside CI; panics in CI.
    pub async fn new() -> Option<Pg> {
        let (store, schema) = testing::pg_store("ctx_test").await?;
        Some(Pg { schema, store })
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
