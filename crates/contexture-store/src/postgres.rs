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
mod references;
mod retention;
mod turn_queue;

use std::time::SystemTime;

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, EventKind, Projection};
use contexture_core::tokens::Encoding;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};

use crate::calibration;
use crate::error::Action;
use crate::record::{self, Row, ThreadLimits, db_bytes, db_seq, seq_of};
use crate::request_refs::REQUEST_STARTED;
use crate::tail::{TailStart, fold_sparse, watermark_of};
use crate::{
    ForkChain, KeyedEvent, NewEvent, ProjectionTail, PruneReport, RequestRetention, RequestsPruned,
    Store, StoreError, ThreadInfo, epoch_ms, pending_migrations,
};

/// The numbered migrations, applied in order on open.
const MIGRATIONS: &[(u32, &str)] = &[
    (1, include_str!("../migrations/postgres/0001_threads.sql")),
    (2, include_str!("../migrations/postgres/0002_api_keys.sql")),
    (
        3,
        include_str!("../migrations/postgres/0003_thread_bytes.sql"),
    ),
    (
        4,
        include_str!("../migrations/postgres/0004_ordinary_messages.sql"),
    ),
    (
        5,
        include_str!("../migrations/postgres/0005_message_bytes.sql"),
    ),
    (
        6,
        include_str!("../migrations/postgres/0006_message_text.sql"),
    ),
    (7, include_str!("../migrations/postgres/0007_key_index.sql")),
    (8, include_str!("../migrations/postgres/0008_retention.sql")),
    (
        9,
        include_str!("../migrations/postgres/0009_calibrations.sql"),
    ),
    (
        10,
        include_str!("../migrations/postgres/0010_turn_queue.sql"),
    ),
    (
        11,
        include_str!("../migrations/postgres/0011_tenant_conversations.sql"),
    ),
];

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

    fn limits(&self) -> ThreadLimits {
        ThreadLimits {
            max_events: self.max_events.load(std::sync::atomic::Ordering::Relaxed),
            max_bytes: self.max_bytes.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with_schema(url, None, MIGRATIONS).await
    }

    /// Like [`PgStore::open`], keeping every table in `schema` (created when missing).
    /// `schema` must be an identifier of ASCII letters, digits and underscores.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with_schema(url, Some(schema), MIGRATIONS).await
    }

    /// Like [`PgStore::open_in_schema`], as a build that knows only the migrations up to
    /// `version` would (see [`crate::testing::pg_store_at_version`]).
    #[cfg(feature = "testing")]
    pub(crate) async fn open_in_schema_at_version(
        url: &str,
        schema: &str,
        version: u32,
    ) -> Result<PgStore, StoreError> {
        let migrations = crate::migrations_up_to(MIGRATIONS, version);
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

    /// Applies the migrations of `migrations` (all of [`MIGRATIONS`], or for tests a prefix
    /// of it, as an older build would) that the database has not applied yet.
    async fn migrate(&self, migrations: &'static [(u32, &'static str)]) -> Result<(), StoreError> {
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

/// The segments to read for `thread`, root first (see the SQLite store).
async fn chain(
    client: &impl GenericClient,
    thread: &str,
) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    let mut walk = ForkChain::new(thread);
    loop {
        let link = client
            .query_opt(
                "SELECT parent_id, fork_seq FROM threads WHERE id = $1",
                &[&walk.current()],
            )
            .await
            .doing("read the thread")?
            .map(|row| (row.get(0), row.get(1)));
        if !walk.step(link)? {
            return Ok(walk.segments());
        }
    }
}

/// Every event of a segment: `$1` the segment's thread, `$2` its last seq to read, `$3` the
/// seq to read after.
const ALL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 ORDER BY seq";

/// The events other than ordinary messages (through the `events_special` index);
/// parameters as for [`ALL_EVENTS`].
const SPECIAL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND ordinary_message IS NULL
     ORDER BY seq";

/// The ordinary messages; parameters as for [`ALL_EVENTS`].
const ORDINARY_MESSAGES: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND ordinary_message = 1
     ORDER BY seq";

/// The events `select` (one of [`ALL_EVENTS`], [`SPECIAL_EVENTS`], [`ORDINARY_MESSAGES`])
/// finds in `segments` (of `thread`'s chain) with seq above `after`, in order.
///
/// A request record's references are left unresolved (see [`record::decode`]): the reads
/// that use this fold projections, which need no record's messages.
async fn events_in(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
) -> Result<Vec<Event>, StoreError> {
    decoded_in(tx, thread, segments, select, after, record::decode).await
}

/// The rows `select` finds (as for [`events_in`]), each decoded by `decode`.
async fn decoded_in<T>(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
    decode: impl Fn(&str, u64, &str, &str, Option<&str>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let select = tx
        .prepare_cached(select)
        .await
        .doing("prepare the event query")?;
    let mut events = Vec::new();
    for (id, limit) in segments {
        let rows = tx
            .query(
                &select,
                &[id, &limit.map_or(i64::MAX, db_seq), &db_seq(after)],
            )
            .await
            .doing("query events")?;
        events.reserve(rows.len());
        for row in rows {
            let seq = seq_of(thread, row.get(0))?;
            events.push(decode(thread, seq, row.get(1), row.get(2), row.get(3))?);
        }
    }
    Ok(events)
}

/// A read-only transaction that sees one snapshot of the database (repeatable read).
async fn snapshot(
    client: &mut deadpool_postgres::Client,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .doing("begin a read")
}

/// The projection of `thread` read from its end (see [`Store::load_projection_tail`]), in
/// one snapshot: the events other than ordinary messages, then the ordinary messages after
/// the active context's anchor, from where their stored counts under `encoding`, added up
/// from the newest, pass `tokens` (all of them without `tail`).
async fn read_projection_tail(
    store: &PgStore,
    thread: &str,
    tail: Option<(Encoding, u64)>,
) -> Result<ProjectionTail, StoreError> {
    let mut client = store.pool.get().await?;
    let tx = snapshot(&mut client).await?;
    let segments = chain(&tx, thread).await?;
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0).await?;
    let watermark = watermark_of(&special);
    let (start, unread) = match tail {
        Some((encoding, tokens)) => {
            tail_start(&tx, thread, &segments, watermark, encoding, tokens).await?
        }
        None => (1, 0),
    };
    let skipped_through = start.saturating_sub(1).max(watermark);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, skipped_through).await?;
    tx.commit().await.doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, skipped_through)?;
    Ok(ProjectionTail::from_fold(&fold, unread))
}

/// Where the tail of `thread`'s ordinary messages after `watermark` starts (see
/// [`TailStart`]), read newest first a page of seqs and counts at a time, and how many older
/// messages are left unread; (1, 0) when every message is needed.
async fn tail_start(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    watermark: u64,
    encoding: Encoding,
    tokens: u64,
) -> Result<(u64, usize), StoreError> {
    const PAGE: i64 = 512;
    let mut tail = TailStart::new(encoding, tokens);
    'segments: for (id, limit) in segments.iter().rev() {
        let mut below = limit.map_or(i64::MAX, |limit| db_seq(limit).saturating_add(1));
        loop {
            let rows = tx
                .query(
                    "SELECT seq, tokens FROM events
                     WHERE thread_id = $1 AND seq < $2 AND seq > $3 AND ordinary_message = 1
                     ORDER BY seq DESC LIMIT $4",
                    &[id, &below, &db_seq(watermark), &PAGE],
                )
                .await
                .doing("read the tail")?;
            let page = rows.len();
            for row in rows {
                let seq: i64 = row.get(0);
                below = seq;
                if tail.add(seq_of(thread, seq)?, row.get(1)) {
                    break 'segments;
                }
            }
            if page < PAGE as usize {
                break;
            }
        }
    }
    let Some(start) = tail.start() else {
        return Ok((1, 0));
    };
    let mut unread: i64 = 0;
    for (id, limit) in segments {
        unread += tx
            .query_one(
                "SELECT count(*) FROM events
                 WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND seq < $4
                   AND ordinary_message = 1",
                &[
                    id,
                    &limit.map_or(i64::MAX, db_seq),
                    &db_seq(watermark),
                    &db_seq(start),
                ],
            )
            .await
            .doing("count the unread messages")?
            .get::<_, i64>(0);
    }
    Ok((start, usize::try_from(unread).unwrap_or(usize::MAX)))
}

/// True for events whose validity depends on the seq they get, and for request records,
/// stored by reference to the events before them.
fn needs_seq_check(event: &EventKind) -> bool {
    matches!(
        event,
        EventKind::ContextReplaced(_) | EventKind::Forked { .. } | EventKind::RequestStarted(_)
    )
}

/// Appends events that need neither an idempotency lookup nor a seq-dependent check in one
/// statement (its own transaction): the upsert of the thread's row takes the row lock and
/// reserves the seqs, and the events are inserted with them.
async fn append_fast(
    client: &impl GenericClient,
    thread: &str,
    rows: Vec<Row>,
    now: i64,
    limits: ThreadLimits,
) -> Result<Vec<u64>, StoreError> {
    let count = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let added: u64 = rows.iter().map(|row| record::body_bytes(&row.body)).sum();
    let added_messages: u64 = rows.iter().map(record::message_bytes).sum();
    record::check_room(thread, rows.len() as u64, limits.max_events)?;
    record::check_bytes(thread, added, limits.max_bytes)?;
    let cap = |limit: u64| {
        if limit == 0 {
            i64::MAX
        } else {
            db_bytes(limit)
        }
    };
    let mut kinds = Vec::with_capacity(rows.len());
    let mut bodies = Vec::with_capacity(rows.len());
    let mut tokens = Vec::with_capacity(rows.len());
    let mut ordinary = Vec::with_capacity(rows.len());
    for row in rows {
        kinds.push(row.kind);
        bodies.push(row.body);
        tokens.push(row.tokens);
        ordinary.push(row.ordinary_message.then_some(1i16));
    }
    let statement = client
        .prepare_cached(
            "WITH reserved AS (
                 INSERT INTO threads (id, last_seq, created_at, updated_at, bytes, message_bytes)
                 VALUES ($1, $2, $3, $3, $9, $11)
                 ON CONFLICT (id) DO UPDATE
                 SET last_seq = threads.last_seq + EXCLUDED.last_seq, updated_at = EXCLUDED.updated_at,
                     bytes = threads.bytes + EXCLUDED.bytes,
                     message_bytes = threads.message_bytes + EXCLUDED.message_bytes
                 WHERE threads.last_seq + EXCLUDED.last_seq <= $7
                   AND threads.bytes + EXCLUDED.bytes <= $8
                 RETURNING last_seq)
             INSERT INTO events
                 (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
             SELECT $1, reserved.last_seq - $2 + e.ord, e.kind, e.body, e.tokens, NULL, $3, e.ordinary
             FROM reserved,
                  UNNEST($4::text[], $5::text[], $6::text[], $10::smallint[])
                      WITH ORDINALITY AS e (kind, body, tokens, ordinary, ord)
             RETURNING seq",
        )
        .await
        .doing("prepare the append")?;
    let rows = client
        .query(
            &statement,
            &[
                &thread,
                &count,
                &now,
                &kinds,
                &bodies,
                &tokens,
                &cap(limits.max_events),
                &cap(limits.max_bytes),
                &db_bytes(added),
                &ordinary,
                &db_bytes(added_messages),
            ],
        )
        .await
        .doing("append events")?;
    // The thread's row was not updated (it would pass a limit), so nothing was inserted.
    if rows.is_empty() {
        let row = client
            .query_one(
                "SELECT last_seq, bytes FROM threads WHERE id = $1",
                &[&thread],
            )
            .await
            .doing("read the thread's size")?;
        let (last, bytes): (i64, i64) = (row.get(0), row.get(1));
        record::check_room(
            thread,
            seq_of(thread, last)? + count as u64,
            limits.max_events,
        )?;
        record::check_bytes(
            thread,
            u64::try_from(bytes).unwrap_or(0) + added,
            limits.max_bytes,
        )?;
        return Err(StoreError::ThreadFull {
            thread: thread.to_string(),
            max_events: limits.max_events,
        });
    }
    let mut seqs = rows
        .iter()
        .map(|row| seq_of(thread, row.get(0)))
        .collect::<Result<Vec<_>, _>>()?;
    seqs.sort_unstable();
    Ok(seqs)
}

/// The bytes of `thread`'s events and of its messages up to `at_seq`, its fork prefix
/// included: its sizes less its own events after `at_seq`, or, for a seq inside its prefix,
/// the parent's up to it.
async fn sizes_through(
    client: &impl GenericClient,
    thread: &str,
    at_seq: u64,
) -> Result<(u64, u64), StoreError> {
    let mut current = thread.to_owned();
    loop {
        let row = client
            .query_one(
                "SELECT bytes, message_bytes, parent_id, fork_seq FROM threads WHERE id = $1",
                &[&current],
            )
            .await
            .doing("read the thread's size")?;
        let (bytes, message_bytes, parent, fork_seq): (i64, i64, Option<String>, Option<i64>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if let (Some(parent), Some(fork_seq)) = (parent, fork_seq)
            && at_seq <= seq_of(&current, fork_seq)?
        {
            current = parent;
            continue;
        }
        let after: i64 = client
            .query_one(
                "SELECT COALESCE(SUM(octet_length(body)), 0)::BIGINT
                 FROM events WHERE thread_id = $1 AND seq > $2",
                &[&current, &db_seq(at_seq)],
            )
            .await
            .doing("measure the thread's later events")?
            .get(0);
        let later = client
            .query(
                "SELECT seq, kind, body FROM events WHERE thread_id = $1 AND seq > $2
                   AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')",
                &[&current, &db_seq(at_seq)],
            )
            .await
            .doing("read the thread's later messages")?;
        let mut messages_after = 0u64;
        for row in later {
            let seq = seq_of(&current, row.get(0))?;
            messages_after += record::stored_message_bytes(&current, seq, row.get(1), row.get(2))?;
        }
        return Ok((
            u64::try_from(bytes - after).unwrap_or(0),
            u64::try_from(message_bytes)
                .unwrap_or(0)
                .saturating_sub(messages_after),
        ));
    }
}

async fn delete_thread(client: &impl GenericClient, thread: &str) -> Result<(), StoreError> {
    client
        .execute("DELETE FROM events WHERE thread_id = $1", &[&thread])
        .await
        .doing("delete events")?;
    client
        .execute("DELETE FROM threads WHERE id = $1", &[&thread])
        .await
        .doing("delete the thread")?;
    Ok(())
}

impl Store for PgStore {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = events
            .into_iter()
            .map(|event| record::encode(thread, event))
            .collect::<Result<Vec<_>, _>>()?;
        record::share_replies(thread, &mut rows)?;
        let now = epoch_ms(SystemTime::now());
        let limits = self.limits();
        let mut client = self.pool.get().await?;
        if rows
            .iter()
            .all(|row| row.key.is_none() && !needs_seq_check(&row.event))
        {
            return append_fast(&client, thread, rows, now, limits).await;
        }
        let tx = client.transaction().await.doing("begin an append")?;
        tx.execute(
            "INSERT INTO threads (id, last_seq, created_at, updated_at) VALUES ($1, 0, $2, $2)
             ON CONFLICT (id) DO NOTHING",
            &[&thread, &now],
        )
        .await
        .doing("create the thread")?;
        let row = tx
            .query_one(
                "SELECT last_seq, bytes, message_bytes FROM threads WHERE id = $1 FOR UPDATE",
                &[&thread],
            )
            .await
            .doing("lock the thread")?;
        let mut last = seq_of(thread, row.get(0))?;
        let mut bytes = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let mut message_bytes = u64::try_from(row.get::<_, i64>(2)).unwrap_or(0);
        let find = tx
            .prepare_cached("SELECT seq FROM events WHERE thread_id = $1 AND idempotency_key = $2")
            .await
            .doing("prepare the idempotency lookup")?;
        let insert = tx
            .prepare_cached(
                "INSERT INTO events
                     (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .doing("prepare the insert")?;
        let mut seqs = Vec::with_capacity(rows.len());
        for mut row in rows {
            if let Some(key) = &row.key {
                let stored = tx
                    .query_opt(&find, &[&thread, key])
                    .await
                    .doing("look up the idempotency key")?;
                if let Some(stored) = stored {
                    seqs.push(seq_of(thread, stored.get(0))?);
                    continue;
                }
            }
            let seq = last + 1;
            if row.kind == REQUEST_STARTED {
                references::refer_request(&tx, thread, seq, &mut row).await?;
            }
            // On an error the transaction is dropped: nothing of this append is stored.
            limits.admit(thread, seq, &mut bytes, &row)?;
            message_bytes += record::message_bytes(&row);
            tx.execute(
                &insert,
                &[
                    &thread,
                    &db_seq(seq),
                    &row.kind,
                    &row.body,
                    &row.tokens,
                    &row.key,
                    &now,
                    &row.ordinary_message.then_some(1i16),
                ],
            )
            .await
            .doing("insert the event")?;
            last = seq;
            seqs.push(seq);
        }
        tx.execute(
            "UPDATE threads SET last_seq = $2, updated_at = $3, bytes = $4, message_bytes = $5
             WHERE id = $1",
            &[
                &thread,
                &db_seq(last),
                &now,
                &db_bytes(bytes),
                &db_bytes(message_bytes),
            ],
        )
        .await
        .doing("update the thread")?;
        tx.commit().await.doing("commit the append")?;
        Ok(seqs)
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.events_after(thread, 0).await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = snapshot(&mut client).await?;
        let select = tx
            .prepare_cached(
                "SELECT seq, kind, body, tokens, created_at FROM events
                 WHERE thread_id = $1 AND idempotency_key = $2",
            )
            .await
            .doing("prepare the idempotency lookup")?;
        let Some(row) = tx
            .query_opt(&select, &[&thread, &key])
            .await
            .doing("look up the idempotency key")?
        else {
            return Ok(None);
        };
        let seq = seq_of(thread, row.get(0))?;
        let decoded = record::decode_row(thread, seq, row.get(1), row.get(2), row.get(3))?;
        let segments = chain(&tx, thread).await?;
        let mut events =
            references::resolve(&tx, thread, &segments, vec![decoded], seq - 1).await?;
        tx.commit().await.doing("end the read")?;
        Ok(events.pop().map(|event| KeyedEvent {
            event,
            appended_at_ms: row.get(4),
        }))
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt("SELECT 1 FROM threads WHERE id = $1", &[&thread])
            .await
            .doing("read the thread")?;
        Ok(row.is_some())
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
        let mut client = self.pool.get().await?;
        let tx = snapshot(&mut client).await?;
        let segments = chain(&tx, thread).await?;
        let rows = decoded_in(
            &tx,
            thread,
            &record::segments_through(&segments, through),
            ALL_EVENTS,
            after,
            record::decode_row,
        )
        .await?;
        let events = references::resolve(&tx, thread, &segments, rows, after).await?;
        tx.commit().await.doing("end the read")?;
        Ok(events)
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        Ok(read_projection_tail(self, thread, None).await?.projection)
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        read_projection_tail(self, thread, Some((encoding, tokens))).await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        let now = epoch_ms(SystemTime::now());
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin a fork")?;
        let last = tx
            .query_opt(
                "SELECT last_seq FROM threads WHERE id = $1 FOR UPDATE",
                &[&parent],
            )
            .await
            .doing("lock the parent")?
            .ok_or_else(|| StoreError::NotFound {
                thread: parent.to_string(),
            })?;
        let last = seq_of(parent, last.get(0))?;
        if at_seq > last {
            return Err(StoreError::ForkBeyondEnd {
                parent: parent.to_string(),
                at_seq,
                last_seq: last,
            });
        }
        let seq = at_seq + 1;
        let body = record::forked_body(parent, at_seq);
        let (bytes, message_bytes) = sizes_through(&tx, parent, at_seq).await?;
        let bytes = bytes + record::body_bytes(&body);
        let created = tx
            .execute(
                "INSERT INTO threads
                     (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes)
                 VALUES ($1, $2, $3, $4, $5, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
                &[
                    &child,
                    &parent,
                    &db_seq(at_seq),
                    &db_seq(seq),
                    &now,
                    &db_bytes(bytes),
                    &db_bytes(message_bytes),
                ],
            )
            .await
            .doing("create the fork")?;
        if created == 0 {
            return Err(StoreError::AlreadyExists {
                thread: child.to_string(),
            });
        }
        tx.execute(
            "INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at)
             VALUES ($1, $2, 'forked', $3, NULL, NULL, $4)",
            &[&child, &db_seq(seq), &body, &now],
        )
        .await
        .doing("record the fork")?;
        tx.commit().await.doing("commit the fork")?;
        Ok(seq)
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let client = self.pool.get().await?;
        let end = crate::prefix_end(prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Byte order (the "C" collation), whatever the database's collation, so that a prefix
        // is one range and pages follow each other.
        let rows = client
            .query(
                r#"SELECT id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes,
                          message_bytes, retention
                   FROM threads
                   WHERE id COLLATE "C" >= $1 AND id COLLATE "C" > $2
                     AND ($3::text IS NULL OR id COLLATE "C" < $3)
                   ORDER BY id COLLATE "C" LIMIT $4"#,
                &[&prefix, &after, &end, &limit],
            )
            .await
            .doing("list threads")?;
        rows.into_iter()
            .map(|row| {
                let id: String = row.get(0);
                let retention: Option<String> = row.get(8);
                Ok(ThreadInfo {
                    retention: crate::retention::parse_stored(&id, retention.as_deref())?,
                    parent: row.get(1),
                    fork_seq: row
                        .get::<_, Option<i64>>(2)
                        .map(|s| seq_of(&id, s))
                        .transpose()?,
                    last_seq: seq_of(&id, row.get(3))?,
                    created_at_ms: row.get(4),
                    updated_at_ms: row.get(5),
                    bytes: u64::try_from(row.get::<_, i64>(6)).unwrap_or(0),
                    message_bytes: u64::try_from(row.get::<_, i64>(7)).unwrap_or(0),
                    id,
                })
            })
            .collect()
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin a delete")?;
        tx.query_opt("SELECT 1 FROM threads WHERE id = $1 FOR UPDATE", &[&thread])
            .await
            .doing("lock the thread")?
            .ok_or_else(|| StoreError::NotFound {
                thread: thread.to_string(),
            })?;
        let forks: Vec<String> = tx
            .query(
                "SELECT id FROM threads WHERE parent_id = $1 ORDER BY id",
                &[&thread],
            )
            .await
            .doing("list forks")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if !forks.is_empty() {
            return Err(StoreError::HasForks {
                thread: thread.to_string(),
                forks,
            });
        }
        delete_thread(&tx, thread).await?;
        tx.commit().await.doing("commit the delete")
    }

    async fn prune(&self, idle_before: SystemTime) -> Result<PruneReport, StoreError> {
        let cutoff = epoch_ms(idle_before);
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin pruning")?;
        let mut report = PruneReport::default();
        loop {
            let leaves: Vec<String> = tx
                .query(
                    "SELECT id FROM threads t WHERE updated_at < $1
                     AND NOT EXISTS (SELECT 1 FROM threads c WHERE c.parent_id = t.id)
                     ORDER BY id FOR UPDATE",
                    &[&cutoff],
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
                "SELECT id FROM threads WHERE updated_at < $1 ORDER BY id",
                &[&cutoff],
            )
            .await
            .doing("find kept threads")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        tx.commit().await.doing("commit pruning")?;
        Ok(report)
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT calibration FROM model_calibrations WHERE model = $1",
                &[&model],
            )
            .await
            .doing("read a calibration")?;
        row.map(|row| calibration::from_stored(model, row.get(0)))
            .transpose()
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        let now = epoch_ms(SystemTime::now());
        let mut client = self.pool.get().await?;
        let tx = client
            .transaction()
            .await
            .doing("begin a calibration update")?;
        // The row exists (empty) before it is locked, so two first observations of a model
        // serialize on it like any later ones.
        tx.execute(
            "INSERT INTO model_calibrations (model, calibration, updated_at)
             VALUES ($1, $2, $3) ON CONFLICT (model) DO NOTHING",
            &[
                &model,
                &calibration::to_stored(&Calibration::default()),
                &now,
            ],
        )
        .await
        .doing("create a calibration")?;
        let row = tx
            .query_one(
                "SELECT calibration FROM model_calibrations WHERE model = $1 FOR UPDATE",
                &[&model],
            )
            .await
            .doing("lock a calibration")?;
        let mut current = calibration::from_stored(model, row.get(0))?;
        current.observe(observation);
        tx.execute(
            "UPDATE model_calibrations SET calibration = $2, updated_at = $3 WHERE model = $1",
            &[&model, &calibration::to_stored(&current), &now],
        )
        .await
        .doing("store a calibration")?;
        tx.commit().await.doing("commit a calibration")?;
        Ok(current)
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

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await.doing("ping")?;
        Ok(())
    }
}
