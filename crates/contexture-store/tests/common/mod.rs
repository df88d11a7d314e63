//! Test harnesses: a fresh SQLite file or a fresh PostgreSQL schema per test (see
//! `contexture_store::testing` for how an unreachable PostgreSQL is handled).

#![allow(dead_code)]

use std::future::Future;

use contexture_store::testing::{self, TempDir};
use contexture_store::{
    AnyStore, ApiKeyStore, ExecutionQueueStore, PgStore, RunEndStore, SqliteStore, Store,
    StoreError, TurnQueueStore,
};

pub use contexture_store::testing::pg_url;

/// A store under test that can be opened again.
pub trait Harness: Send + Sync {
    /// The store type.
    type S: Store
        + ApiKeyStore
        + TurnQueueStore
        + ExecutionQueueStore
        + RunEndStore
        + Clone
        + std::fmt::Debug
        + 'static;
    /// The last schema version before the API keys' migration (what an older build left).
    const BEFORE_API_KEYS: u32;
    /// The store.
    fn store(&self) -> &Self::S;
    /// The store, as an [`AnyStore`].
    fn any(&self) -> AnyStore;
    /// Opens the same database again, as a new process would.
    fn reopen(&self) -> impl Future<Output = Self::S> + Send;
    /// Opens the same database again as a build that knows only the migrations up to
    /// `version` would.
    fn open_at_version(
        &self,
        version: u32,
    ) -> impl Future<Output = Result<Self::S, StoreError>> + Send;
    /// The rows of the database's `schema_version` table: (version, applied at), in order.
    fn schema_versions(&self) -> impl Future<Output = Vec<(u32, i64)>> + Send;
    /// Runs `sql` on the database directly, past the store (for rows the store's API cannot
    /// write, such as several with the same timestamp).
    fn execute_raw(&self, sql: &str) -> impl Future<Output = ()> + Send;
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

    /// A fresh file created by the migrations up to `version` only, as an older build left
    /// it.
    pub fn at_version(version: u32) -> Sqlite {
        let dir = TempDir::new("contexture-store-test");
        let store = testing::open_sqlite_at_version(&dir.join("threads.db"), version)
            .expect("open sqlite at an older version");
        Sqlite { dir, store }
    }

    /// A fresh file created by the migrations before the API keys' only, as an older build
    /// left it.
    pub async fn before_api_keys() -> Sqlite {
        let dir = TempDir::new("contexture-store-test");
        let store = testing::open_sqlite_at_version(
            &dir.join("threads.db"),
            <Sqlite as Harness>::BEFORE_API_KEYS,
        )
        .expect("open sqlite at an older version");
        Sqlite { dir, store }
    }
}

impl Harness for Sqlite {
    type S = SqliteStore;
    const BEFORE_API_KEYS: u32 = 2;
    fn store(&self) -> &SqliteStore {
        &self.store
    }
    fn any(&self) -> AnyStore {
        AnyStore::Sqlite(self.store.clone())
    }
    async fn reopen(&self) -> SqliteStore {
        SqliteStore::open(self.dir.join("threads.db"))
            .await
            .expect("reopen sqlite")
    }
    async fn open_at_version(&self, version: u32) -> Result<SqliteStore, StoreError> {
        testing::open_sqlite_at_version(&self.dir.join("threads.db"), version)
    }
    async fn schema_versions(&self) -> Vec<(u32, i64)> {
        let conn = rusqlite::Connection::open(self.dir.join("threads.db")).expect("open sqlite");
        let mut select = conn
            .prepare("SELECT version, applied_at FROM schema_version ORDER BY version")
            .expect("prepare");
        select
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query schema_version")
            .collect::<Result<_, _>>()
            .expect("read schema_version")
    }
    async fn execute_raw(&self, sql: &str) {
        rusqlite::Connection::open(self.dir.join("threads.db"))
            .expect("open sqlite")
            .execute_batch(sql)
            .expect("run raw SQL");
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

    /// A fresh schema created by the migrations up to `version` only, as an older build left
    /// it; `None` as for [`Pg::new`].
    pub async fn at_version(version: u32) -> Option<Pg> {
        let (store, schema) = testing::pg_store_at_version("ctx_test", version).await?;
        Some(Pg { schema, store })
    }

    /// A fresh schema created by the migrations before the API keys' only, as an older build
    /// left it; `None` as for [`Pg::new`].
    pub async fn before_api_keys() -> Option<Pg> {
        let (store, schema) =
            testing::pg_store_at_version("ctx_test", <Pg as Harness>::BEFORE_API_KEYS).await?;
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
    const BEFORE_API_KEYS: u32 = 1;
    fn store(&self) -> &PgStore {
        &self.store
    }
    fn any(&self) -> AnyStore {
        AnyStore::Postgres(self.store.clone())
    }
    async fn reopen(&self) -> PgStore {
        PgStore::open_in_schema(&pg_url(), &self.schema)
            .await
            .expect("reopen postgres")
    }
    async fn open_at_version(&self, version: u32) -> Result<PgStore, StoreError> {
        testing::open_pg_at_version(&self.schema, version).await
    }
    async fn schema_versions(&self) -> Vec<(u32, i64)> {
        let rows = self
            .raw(|client| async move {
                client
                    .query(
                        "SELECT version, applied_at FROM schema_version ORDER BY version",
                        &[],
                    )
                    .await
            })
            .await
            .expect("query schema_version");
        rows.iter()
            .map(|row| {
                let version = u32::try_from(row.get::<_, i32>(0)).expect("a version");
                (version, row.get(1))
            })
            .collect()
    }
    async fn execute_raw(&self, sql: &str) {
        let sql = sql.to_string();
        self.raw(|client| async move { client.batch_execute(&sql).await })
            .await
            .expect("run raw SQL");
    }
}

impl Pg {
    /// Runs `work` on a connection of its own to the test schema, past the store.
    async fn raw<T, F>(
        &self,
        work: impl FnOnce(tokio_postgres::Client) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let mut config: tokio_postgres::Config = pg_url().parse().expect("the test URL");
        config.options(format!("-c search_path={}", self.schema));
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to postgres");
        let driver = tokio::spawn(connection);
        let result = work(client).await;
        let _ = driver.await;
        result
    }
}
