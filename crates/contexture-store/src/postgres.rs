//! The PostgreSQL store.
//!
//! A pool of tokio-postgres connections (deadpool). An append locks the thread's row
//! (`SELECT last_seq ... FOR UPDATE`) in its transaction, so concurrent appends from any
//! number of tasks or processes get gap-free seqs; the primary key `(thread_id, seq)` is the
//! backstop. Plain appends (no idempotency key, no event whose validity depends on its seq)
//! take a faster path: one statement whose upsert of the thread row locks it and reserves the
//! seqs, inserting the events in the same implicit transaction. Bodies are stored as text so
//! they read back byte for byte.

mod api_keys;
mod execution_queue;
mod pruning;
mod rate_limits;
mod reads;
mod references;
mod retention;
mod schema;
mod turn_queue;
mod writes;

use std::time::SystemTime;

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, Projection};
use contexture_core::tokens::Encoding;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use crate::error::Action;
use crate::projection_cache::ProjectionCache;
use crate::record::ThreadLimits;
use crate::referable_cache::{ReferableCache, referable_bytes};
use crate::{
    EventOutline, KeyedEvent, NewEvent, ProjectionTail, PruneReport, RecentCursor,
    RequestRetention, RequestsPruned, Store, StoreError, ThreadInfo,
};

/// Connections in the pool.
const POOL_SIZE: usize = 16;

/// A thread store in a PostgreSQL database. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    schema: Option<String>,
    /// The most events a thread may hold (0: no limit), shared by clones.
    max_events: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The most bytes of events a thread may hold (0: no limit), shared by clones.
    max_bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Folds of recently read threads, checked against the database at each read and
    /// shared by clones.
    projections: std::sync::Arc<ProjectionCache>,
    /// The message bodies each thread's last request record, appended here, was compared
    /// with; shared by clones.
    referable: std::sync::Arc<ReferableCache>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .finish()
    }
}

fn invalid(url: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

impl PgStore {
    /// Limits every thread to `max` events (`None`: no limit): an append that would pass it
    /// stores nothing and fails with [`StoreError::ThreadFull`]. Clones share the limit.
    pub fn set_max_thread_events(&self, max: Option<u64>) {
        self.max_events
            .store(max.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Limits every thread to `max` bytes of events, its fork prefix included (`None`: no
    /// limit): an append that would pass it stores nothing and fails with
    /// [`StoreError::ThreadTooLarge`]. Clones share the limit.
    pub fn set_max_thread_bytes(&self, max: Option<u64>) {
        self.max_bytes
            .store(max.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Bounds the memory of the folds of recently read threads the store keeps, so that a
    /// thread read again costs only its new events, to about `bytes` (0: keep none; by
    /// default [`crate::DEFAULT_PROJECTION_CACHE_BYTES`]). The least recently read are
    /// dropped first. Clones share the cache. An eighth more (`bytes / 8`) bounds the
    /// message bodies kept so that a thread's next request record reads only its new
    /// messages.
    pub fn set_projection_cache_bytes(&self, bytes: u64) {
        self.projections.set_max_bytes(bytes);
        self.referable.set_max_bytes(referable_bytes(bytes));
    }

    fn limits(&self) -> ThreadLimits {
        ThreadLimits {
            max_events: self.max_events.load(std::sync::atomic::Ordering::Relaxed),
            max_bytes: self.max_bytes.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with_schema(url, None, schema::MIGRATIONS).await
    }

    /// Like [`PgStore::open`], keeping every table in `schema` (created when missing).
    /// `schema` must be an identifier of ASCII letters, digits and underscores.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with_schema(url, Some(schema), schema::MIGRATIONS).await
    }

    /// Like [`PgStore::open_in_schema`], as a build that knows only the migrations up to
    /// `version` would (see [`crate::testing::pg_store_at_version`]).
    #[cfg(feature = "testing")]
    pub(crate) async fn open_in_schema_at_version(
        url: &str,
        schema: &str,
        version: u32,
    ) -> Result<PgStore, StoreError> {
        let migrations = crate::migrations_up_to(schema::MIGRATIONS, version);
        PgStore::open_with_schema(url, Some(schema), migrations).await
    }

    async fn open_with_schema(
        url: &str,
        schema: Option<&str>,
        migrations: &'static [(u32, &'static str)],
    ) -> Result<PgStore, StoreError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| invalid(url, e))?;
        if let Some(schema) = schema {
            if schema.is_empty()
                || !schema
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(invalid(
                    url,
                    format!("schema name `{schema}` is not a plain identifier"),
                ));
            }
            let (client, connection) = config.connect(NoTls).await.doing("connect")?;
            let driver = tokio::spawn(connection);
            let created = client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await
                .doing("create the schema");
            drop(client);
            let _ = driver.await;
            created?;
            config.options(format!("-c search_path={schema}"));
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| invalid(url, format!("cannot build the connection pool: {e}")))?;
        let store = PgStore {
            pool,
            schema: schema.map(str::to_string),
            max_events: Default::default(),
            max_bytes: Default::default(),
            projections: Default::default(),
            referable: std::sync::Arc::new(ReferableCache::new(referable_bytes(
                crate::DEFAULT_PROJECTION_CACHE_BYTES,
            ))),
        };
        store.migrate(migrations).await?;
        Ok(store)
    }

    /// Drops the schema this store was opened in, with everything in it (for tests and
    /// temporary stores). Does nothing for a store opened without a schema.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        if let Some(schema) = &self.schema {
            let client = self.pool.get().await?;
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .doing("drop the schema")?;
        }
        Ok(())
    }
}

impl Store for PgStore {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        self.append_events(thread, events).await
    }

    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_events_with(thread, events, Some(after), writes::AlsoWritten::Nothing)
            .await
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.events_after(thread, 0).await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        self.read_keyed_event(thread, key).await
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        self.thread_exists(thread).await
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        self.events_through(thread, after, u64::MAX).await
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.read_events_through(thread, after, through).await
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        self.read_outlines_through(thread, after, through).await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        Ok(reads::read_projection_tail(self, thread, None)
            .await?
            .projection)
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        reads::read_projection_tail(self, thread, Some((encoding, tokens))).await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        self.fork_at(parent, at_seq, child).await
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.read_list_page(prefix, after, limit).await
    }

    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.read_list_recent(prefix, contains, before, limit).await
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        self.read_forks_of(thread).await
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        self.delete_unforked(thread).await
    }

    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        self.prune_idle_under(prefix, idle_before).await
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        self.read_calibration(model).await
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        self.observe(model, observation).await
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        retention::set_retention(&client, thread, retention.as_ref()).await
    }

    async fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        self.prune_requests(thread, retention, now).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await.doing("ping")?;
        Ok(())
    }
}
