//! The SQLite store: the embedded default.
//!
//! One file in WAL mode with `synchronous = FULL`, so an append is on disk when it is
//! answered. Writes in this process go through one connection on one thread, which commits
//! the writes waiting for it together (see [`writer`]); writers in other processes are
//! serialized by `BEGIN IMMEDIATE` (waiting up to the busy timeout), and the seq of each new
//! event is the thread's `last_seq + 1` read inside that transaction, with the primary key
//! `(thread_id, seq)` as a backstop. Reads run on tokio's blocking pool.

mod api_keys;
mod checkpointer;
mod projection_cache;
mod references;
mod retention;
mod turn_queue;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, Projection};
use contexture_core::tokens::Encoding;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use self::checkpointer::Checkpointer;
use self::projection_cache::ProjectionCache;
use self::writer::Writer;

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
    (1, include_str!("../migrations/sqlite/0001_threads.sql")),
    (
        2,
        include_str!("../migrations/sqlite/0002_ordinary_messages.sql"),
    ),
    (3, include_str!("../migrations/sqlite/0003_api_keys.sql")),
    (4, include_str!("../migrations/sqlite/0004_deletions.sql")),
    (
        5,
        include_str!("../migrations/sqlite/0005_thread_bytes.sql"),
    ),
    (
        6,
        include_str!("../migrations/sqlite/0006_message_bytes.sql"),
    ),
    (
        7,
        include_str!("../migrations/sqlite/0007_message_text.sql"),
    ),
    (
        8,
        include_str!("../migrations/sqlite/0008_events_by_rowid.sql"),
    ),
    (9, include_str!("../migrations/sqlite/0009_retention.sql")),
    (
        10,
        include_str!("../migrations/sqlite/0010_calibrations.sql"),
    ),
    (11, include_str!("../migrations/sqlite/0011_turn_queue.sql")),
    (
        12,
        include_str!("../migrations/sqlite/0012_tenant_conversations.sql"),
    ),
];

/// `PRAGMA auto_vacuum`'s value for incremental vacuum.
const INCREMENTAL_VACUUM: i64 = 2;

/// Free pages one reclaiming write gives back (1 MB of 4 KB pages): a step of a few
/// milliseconds.
const RECLAIM_STEP: u32 = 256;

/// How long a write waits for another process's write transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The most reads running at once, each on a connection of its own; further reads wait for
/// one. Connections are kept and reused, so that their cached statements and page caches
/// stay warm.
const READERS: usize = 8;

/// A thread store in one SQLite file. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Writer,
    /// Held for its thread; dropped after the writer (fields drop in order), so that it
    /// checkpoints the last writes.
    _checkpointer: Checkpointer,
    readers: Mutex<Vec<Connection>>,
    reading: tokio::sync::Semaphore,
    projections: ProjectionCache,
    /// The most events a thread may hold (0: no limit).
    max_events: std::sync::atomic::AtomicU64,
    /// The most bytes of events a thread may hold (0: no limit).
    max_bytes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// Creates the database file at `path`, when it does not exist, readable and writable by
/// its owner only: it holds every tenant's conversations and the API keys' hashes. SQLite
/// gives its write-ahead log and shared-memory files the database file's permissions.
fn create_private(path: &Path) -> Result<(), StoreError> {
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

fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).doing("open the database file")?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .doing("set the busy timeout")?;
    // Room for every statement the store runs, so that none is prepared twice.
    conn.set_prepared_statement_cache_capacity(64);
    // A new file gives the pages of deleted threads back to the file system, a step at a
    // time ([`SqliteStore::reclaim`]). The mode is chosen before anything else makes the
    // file (WAL mode does); an older file keeps its free pages for reuse instead.
    conn.execute_batch(
        "PRAGMA auto_vacuum = INCREMENTAL; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
    )
    .doing("configure the connection")?;
    // The query planner stability guarantee: a cached statement keeps its plan whatever
    // values are bound. Without it, a statement that the planner checked against a partial
    // index (`events_special`) is prepared again on every new binding.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .doing("configure the connection")?;
    Ok(conn)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a connection half-way through a
    // transaction: rusqlite rolls back uncommitted transactions when they are dropped.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Applies the migrations of `migrations` (all of [`MIGRATIONS`], or for tests a prefix of
/// it, as an older build would) that the database has not applied yet.
fn migrate(
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

impl SqliteStore {
    /// Opens (creating when missing) the database at `path` and applies pending migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || SqliteStore::open_blocking(path)).await?
    }

    /// Like [`SqliteStore::open`], on the calling thread.
    pub fn open_blocking(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_migrations(path.as_ref(), MIGRATIONS)
    }

    /// Opens the database at `path` as a build that knows only the migrations up to
    /// `version` would (see [`crate::testing::open_sqlite_at_version`]).
    #[cfg(feature = "testing")]
    pub(crate) fn open_at_version(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_migrations(path, crate::migrations_up_to(MIGRATIONS, version))
    }

    fn open_with_migrations(
        path: &Path,
        migrations: &'static [(u32, &'static str)],
    ) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        create_private(&path)?;
        let mut writer = connect(&path)?;
        migrate(&mut writer, migrations)?;
        // The checkpointer copies the log into the database; no commit waits for that.
        writer
            .execute_batch("PRAGMA wal_autocheckpoint = 0;")
            .doing("configure the writer")?;
        let checkpointer = Checkpointer::start(connect(&path)?)?;
        let committed = checkpointer.notifier();
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Writer::start(writer, committed)?,
                _checkpointer: checkpointer,
                readers: Mutex::new(Vec::new()),
                reading: tokio::sync::Semaphore::new(READERS),
                projections: ProjectionCache::default(),
                max_events: std::sync::atomic::AtomicU64::new(0),
                max_bytes: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// Gives the free pages of the file (those deleted threads left) back to the file
    /// system, [`RECLAIM_STEP`] pages per write: the writes queued meanwhile go in between,
    /// so none waits for more than one step. Nothing to do for a file made before the store
    /// chose incremental vacuum (its free pages are reused by later writes instead).
    async fn reclaim(&self) -> Result<(), StoreError> {
        let mut before = i64::MAX;
        loop {
            let left: i64 = self
                .write(|conn| {
                    let mode: i64 = conn
                        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
                        .doing("read the vacuum mode")?;
                    if mode != INCREMENTAL_VACUUM {
                        return Ok(0);
                    }
                    // The pragma frees one page per step of its statement: stepped through.
                    let mut vacuum = conn
                        .prepare_cached(&format!("PRAGMA incremental_vacuum({RECLAIM_STEP})"))
                        .doing("prepare reclaiming free pages")?;
                    let mut freeing = vacuum.query([]).doing("reclaim free pages")?;
                    while freeing.next().doing("reclaim free pages")?.is_some() {}
                    conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))
                        .doing("count free pages")
                })
                .await?;
            // A step that freed nothing (another process holds the pages) ends it too.
            if left == 0 || left >= before {
                return Ok(());
            }
            before = left;
        }
    }

    /// Rewrites the database file without its free pages, and switches a file made before
    /// the store chose incremental vacuum over to it (so that later deletes and prunings
    /// give their pages back as they go). Every write waits while the file is rewritten, a
    /// second or more per hundred megabytes: maintenance, not something to run under load.
    /// Returns the file's bytes before and after.
    pub async fn vacuum(&self) -> Result<(u64, u64), StoreError> {
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || {
            let size = |path: &Path| std::fs::metadata(path).map_or(0, |meta| meta.len());
            let before = size(&path);
            // `connect` asks for incremental vacuum, which `VACUUM` then applies.
            let conn = connect(&path)?;
            conn.execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
                .doing("rewrite the database file")?;
            Ok((before, size(&path)))
        })
        .await?
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Limits every thread to `max` events (`None`: no limit): an append that would pass it
    /// stores nothing and fails with [`StoreError::ThreadFull`].
    pub fn set_max_thread_events(&self, max: Option<u64>) {
        self.inner
            .max_events
            .store(max.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Limits every thread to `max` bytes of events, its fork prefix included (`None`: no
    /// limit): an append that would pass it stores nothing and fails with
    /// [`StoreError::ThreadTooLarge`].
    pub fn set_max_thread_bytes(&self, max: Option<u64>) {
        self.inner
            .max_bytes
            .store(max.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `work` inside a write transaction, batched with other writes (see [`writer`]).
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner.writer.write(work).await
    }

    /// Runs `work` on a pooled read connection, on tokio's blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        // The semaphore is never closed, so this always holds a permit.
        let _permit = self.inner.reading.acquire().await.ok();
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.with_reader(work)).await?
    }

    /// Runs `work` on a pooled read connection, on the calling thread: for reads known to be
    /// short (see [`Store::load_projection`] here), where the hand-off to the blocking pool
    /// and back cost more than the read. A read in WAL mode never waits for writers.
    async fn read_inline<T>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _permit = self.inner.reading.acquire().await.ok();
        self.inner.with_reader(work)
    }
}

/// The calibration stored for `model`, if any.
fn stored_calibration(conn: &Connection, model: &str) -> Result<Option<Calibration>, StoreError> {
    let text: Option<String> = conn
        .prepare_cached("SELECT calibration FROM model_calibrations WHERE model = ?1")
        .doing("prepare the calibration query")?
        .query_row(params![model], |row| row.get(0))
        .optional()
        .doing("read a calibration")?;
    text.map(|text| calibration::from_stored(model, &text))
        .transpose()
}

impl Inner {
    fn with_reader<T>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = lock(&self.readers).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => connect(&self.path)?,
        };
        let result = work(&mut conn);
        // One connection per permit; more only when a cancelled read's permit was reused
        // before its work ended, and those are not kept.
        let mut readers = lock(&self.readers);
        if readers.len() < READERS {
            readers.push(conn);
        }
        result
    }
}

/// Appends `rows` to `thread` (creating it), inside the caller's write transaction.
fn append_rows(
    tx: &Connection,
    thread: &str,
    rows: Vec<Row>,
    limits: ThreadLimits,
) -> Result<Vec<u64>, StoreError> {
    let now = epoch_ms(SystemTime::now());
    // Creates the thread when it is new, and reads its last seq and size either way.
    let (last, bytes, message_bytes): (i64, i64, i64) = tx
        .prepare_cached(
            "INSERT INTO threads (id, last_seq, created_at, updated_at) VALUES (?1, 0, ?2, ?2)
             ON CONFLICT (id) DO UPDATE SET last_seq = last_seq
             RETURNING last_seq, bytes, message_bytes",
        )
        .doing("prepare the thread's creation")?
        .query_row(params![thread, now], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .doing("create the thread or read its last seq")?;
    let mut last = seq_of(thread, last)?;
    let mut bytes = u64::try_from(bytes).unwrap_or(0);
    let mut message_bytes = u64::try_from(message_bytes).unwrap_or(0);
    let mut seqs = Vec::with_capacity(rows.len());
    {
        let mut find = tx
            .prepare_cached("SELECT seq FROM events WHERE thread_id = ?1 AND idempotency_key = ?2")
            .doing("prepare the idempotency lookup")?;
        let mut insert = tx
            .prepare_cached(
                "INSERT INTO events
                     (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .doing("prepare the insert")?;
        for mut row in rows {
            if let Some(key) = &row.key {
                let stored: Option<i64> = find
                    .query_row(params![thread, key], |r| r.get(0))
                    .optional()
                    .doing("look up the idempotency key")?;
                if let Some(seq) = stored {
                    seqs.push(seq_of(thread, seq)?);
                    continue;
                }
            }
            let seq = last + 1;
            if row.kind == REQUEST_STARTED {
                references::refer_request(tx, thread, seq, &mut row)?;
            }
            // On an error the savepoint of this write is rolled back: nothing of it is stored.
            limits.admit(thread, seq, &mut bytes, &row)?;
            message_bytes += record::message_bytes(&row);
            insert
                .execute(params![
                    thread,
                    db_seq(seq),
                    row.kind,
                    row.body,
                    row.tokens,
                    row.key,
                    now,
                    row.ordinary_message.then_some(1)
                ])
                .doing("insert the event")?;
            last = seq;
            seqs.push(seq);
        }
    }
    tx.prepare_cached(
        "UPDATE threads SET last_seq = ?2, updated_at = ?3, bytes = ?4, message_bytes = ?5
         WHERE id = ?1",
    )
    .doing("prepare the thread's update")?
    .execute(params![
        thread,
        db_seq(last),
        now,
        db_bytes(bytes),
        db_bytes(message_bytes)
    ])
    .doing("update the thread")?;
    Ok(seqs)
}

/// The segments to read for `thread`, root first: each thread with the last seq to read
/// from it (`None`: all of its own events).
fn chain(conn: &Connection, thread: &str) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    let mut walk = ForkChain::new(thread);
    loop {
        let link: Option<(Option<String>, Option<i64>)> = conn
            .prepare_cached("SELECT parent_id, fork_seq FROM threads WHERE id = ?1")
            .doing("prepare the thread query")?
            .query_row([walk.current()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .doing("read the thread")?;
        if !walk.step(link)? {
            return Ok(walk.segments());
        }
    }
}

/// The events of `thread` (its fork chain's shared prefix included) with seq above `after`.
fn read_events(
    conn: &mut Connection,
    thread: &str,
    after: u64,
    through: u64,
) -> Result<Vec<Event>, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let segments = chain(&tx, thread)?;
    let rows = decoded_in(
        &tx,
        thread,
        &record::segments_through(&segments, through),
        ALL_EVENTS,
        after,
        record::decode_row,
    )?;
    let events = references::resolve(&tx, thread, &segments, rows, after)?;
    tx.commit().doing("end the read")?;
    Ok(events)
}

/// Every event of a segment: `?1` the segment's thread, `?2` its last seq to read, `?3`
/// the seq to read after.
const ALL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 ORDER BY seq";

/// The events other than ordinary messages, through the `events_special` index (the
/// messages are not even scanned); parameters as for [`ALL_EVENTS`].
const SPECIAL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events INDEXED BY events_special
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message IS NULL
     ORDER BY seq";

/// The ordinary messages; parameters as for [`ALL_EVENTS`].
const ORDINARY_MESSAGES: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message = 1
     ORDER BY seq";

/// The events `select` (one of [`ALL_EVENTS`], [`SPECIAL_EVENTS`], [`ORDINARY_MESSAGES`])
/// finds in `segments` (of `thread`'s chain) with seq above `after`, in order.
///
/// A request record's references are left unresolved (see [`record::decode`]): the reads
/// that use this fold projections, which need no record's messages.
fn events_in(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
) -> Result<Vec<Event>, StoreError> {
    decoded_in(tx, thread, segments, select, after, record::decode)
}

/// The rows `select` finds (as for [`events_in`]), each decoded by `decode`.
fn decoded_in<T>(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
    decode: impl Fn(&str, u64, &str, &str, Option<&str>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut select = tx.prepare_cached(select).doing("prepare the event query")?;
    let mut events = Vec::new();
    for (id, limit) in segments {
        let mut rows = select
            .query(params![id, limit.map_or(i64::MAX, db_seq), db_seq(after)])
            .doing("query events")?;
        while let Some(row) = rows.next().doing("read an event")? {
            let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
            let text = |index: usize| row.get_ref(index).and_then(|v| Ok(v.as_str()?));
            let kind = text(1).doing("read a kind")?;
            let body = text(2).doing("read a body")?;
            let tokens = row
                .get_ref(3)
                .and_then(|v| Ok(v.as_str_or_null()?))
                .doing("read token counts")?;
            events.push(decode(thread, seq, kind, body, tokens)?);
        }
    }
    Ok(events)
}

/// The projection of `thread`'s active context, decoding only what can reach it: first the
/// events other than ordinary messages (found through the `events_special` index, so the
/// messages are not even scanned), then the ordinary messages after the active context's
/// anchor (see [`contexture_core::thread::projection_watermark`]). Seqs are gap-free, so
/// every seq that is neither is an ordinary message the anchor covers.
///
/// A fold kept in `cache` from an earlier read is brought up to date with the events after
/// it instead (see [`projection_cache`]); the fold read here is kept for the next read.
fn read_projection(
    conn: &mut Connection,
    thread: &str,
    cache: &ProjectionCache,
) -> Result<ProjectionTail, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let segments = chain(&tx, thread)?;
    let (last_seq, deletions): (i64, i64) = tx
        .prepare_cached(
            "SELECT t.last_seq, d.count FROM threads t, deletions d WHERE t.id = ?1 AND d.id = 1",
        )
        .doing("prepare the thread's state query")?
        .query_row([thread], |r| Ok((r.get(0)?, r.get(1)?)))
        .doing("read the thread's last seq")?;
    let last_seq = seq_of(thread, last_seq)?;
    let replay_error = |source| StoreError::Replay {
        thread: thread.to_string(),
        source,
    };
    if let Some(mut fold) = cache.take(thread, deletions, last_seq) {
        for event in events_in(&tx, thread, &segments, ALL_EVENTS, fold.last_seq())? {
            fold.apply(event).map_err(replay_error)?;
        }
        tx.commit().doing("end the read")?;
        let whole = ProjectionTail::from_fold(&fold, 0);
        cache.put(thread, deletions, fold);
        return Ok(whole);
    }
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0)?;
    let watermark = watermark_of(&special);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, watermark)?;
    tx.commit().doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, watermark)?;
    let whole = ProjectionTail::from_fold(&fold, 0);
    cache.put(thread, deletions, fold);
    Ok(whole)
}

/// The projection of `thread` read from its end (see [`Store::load_projection_tail`]): a
/// thread whose fold is kept, or that is short enough to keep, is read whole (and kept);
/// a longer one decodes its special events, then only the ordinary messages from where
/// their stored token counts, added up from the newest, pass `tokens`. A partial fold is
/// never kept: the cache holds whole projections only.
fn read_projection_tail(
    conn: &mut Connection,
    thread: &str,
    cache: &ProjectionCache,
    encoding: Encoding,
    tokens: u64,
) -> Result<ProjectionTail, StoreError> {
    let whole = |conn: &mut Connection| read_projection(conn, thread, cache);
    if cache.holds(thread) {
        return whole(conn);
    }
    let tx = conn.transaction().doing("begin a read")?;
    let last_seq: Option<i64> = tx
        .prepare_cached("SELECT last_seq FROM threads WHERE id = ?1")
        .doing("prepare the thread's state query")?
        .query_row([thread], |r| r.get(0))
        .optional()
        .doing("read the thread's last seq")?;
    if last_seq.is_none_or(|last| last <= db_seq(projection_cache::MAX_EVENTS_PER_FOLD)) {
        drop(tx);
        return whole(conn);
    }
    let segments = chain(&tx, thread)?;
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0)?;
    let watermark = watermark_of(&special);
    let (start, unread) = tail_start(&tx, thread, &segments, watermark, encoding, tokens)?;
    let unread_below = start.saturating_sub(1).max(watermark);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, unread_below)?;
    tx.commit().doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, unread_below)?;
    Ok(ProjectionTail::from_fold(&fold, unread))
}

/// Where the tail of `thread`'s ordinary messages after `watermark` starts: the seq of the
/// oldest message to read, the newest ones' stored counts under `encoding` passing `tokens`
/// from there (1: read them all), and how many older ones are left unread. Only seqs and
/// counts are read, newest first, and the reading stops there.
fn tail_start(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    watermark: u64,
    encoding: Encoding,
    tokens: u64,
) -> Result<(u64, usize), StoreError> {
    let mut newest_first = tx
        .prepare_cached(
            "SELECT seq, tokens FROM events
             WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message = 1
             ORDER BY seq DESC",
        )
        .doing("prepare the tail query")?;
    let mut tail = TailStart::new(encoding, tokens);
    'segments: for (id, limit) in segments.iter().rev() {
        let mut rows = newest_first
            .query(params![
                id,
                limit.map_or(i64::MAX, db_seq),
                db_seq(watermark)
            ])
            .doing("read the tail")?;
        while let Some(row) = rows.next().doing("read a message's count")? {
            let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
            let stored = row
                .get_ref(1)
                .and_then(|v| Ok(v.as_str_or_null()?))
                .doing("read token counts")?;
            if tail.add(seq, stored) {
                break 'segments;
            }
        }
    }
    let Some(start) = tail.start() else {
        return Ok((1, 0));
    };
    let mut count = tx
        .prepare_cached(
            "SELECT count(*) FROM events
             WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND seq < ?4 AND ordinary_message = 1",
        )
        .doing("prepare the unread count")?;
    let mut unread: i64 = 0;
    for (id, limit) in segments {
        unread += count
            .query_row(
                params![
                    id,
                    limit.map_or(i64::MAX, db_seq),
                    db_seq(watermark),
                    db_seq(start)
                ],
                |r| r.get::<_, i64>(0),
            )
            .doing("count the unread messages")?;
    }
    Ok((start, usize::try_from(unread).unwrap_or(usize::MAX)))
}

/// Forks `parent` at `at_seq` as `child`, inside the caller's write transaction.
fn fork_thread(tx: &Connection, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
    let now = epoch_ms(SystemTime::now());
    let last: Option<i64> = tx
        .query_row(
            "SELECT last_seq FROM threads WHERE id = ?1",
            [parent],
            |r| r.get(0),
        )
        .optional()
        .doing("read the parent")?;
    let last = seq_of(
        parent,
        last.ok_or_else(|| StoreError::NotFound {
            thread: parent.to_string(),
        })?,
    )?;
    if at_seq > last {
        return Err(StoreError::ForkBeyondEnd {
            parent: parent.to_string(),
            at_seq,
            last_seq: last,
        });
    }
    let exists: Option<i64> = tx
        .query_row("SELECT 1 FROM threads WHERE id = ?1", [child], |r| r.get(0))
        .optional()
        .doing("check the fork's id")?;
    if exists.is_some() {
        return Err(StoreError::AlreadyExists {
            thread: child.to_string(),
        });
    }
    let seq = at_seq + 1;
    let body = record::forked_body(parent, at_seq);
    let (bytes, message_bytes) = sizes_through(tx, parent, at_seq)?;
    let bytes = bytes + record::body_bytes(&body);
    tx.execute(
        "INSERT INTO threads
             (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7)",
        params![
            child,
            parent,
            db_seq(at_seq),
            db_seq(seq),
            now,
            db_bytes(bytes),
            db_bytes(message_bytes)
        ],
    )
    .doing("create the fork")?;
    tx.execute(
        "INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at)
         VALUES (?1, ?2, 'forked', ?3, NULL, NULL, ?4)",
        params![child, db_seq(seq), body, now],
    )
    .doing("record the fork")?;
    Ok(seq)
}

/// The bytes of `thread`'s events and of its messages up to `at_seq`, its fork prefix
/// included: its sizes less its own events after `at_seq`, or, for a seq inside its prefix,
/// the parent's up to it.
fn sizes_through(tx: &Connection, thread: &str, at_seq: u64) -> Result<(u64, u64), StoreError> {
    let mut current = thread.to_owned();
    loop {
        let (bytes, message_bytes, parent, fork_seq): (i64, i64, Option<String>, Option<i64>) = tx
            .prepare_cached(
                "SELECT bytes, message_bytes, parent_id, fork_seq FROM threads WHERE id = ?1",
            )
            .doing("prepare the thread's size query")?
            .query_row([&current], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .doing("read the thread's size")?;
        if let (Some(parent), Some(fork_seq)) = (parent, fork_seq)
            && at_seq <= seq_of(&current, fork_seq)?
        {
            current = parent;
            continue;
        }
        let after: i64 = tx
            .prepare_cached(
                "SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0)
                 FROM events WHERE thread_id = ?1 AND seq > ?2",
            )
            .doing("prepare the size query")?
            .query_row(params![current, db_seq(at_seq)], |r| r.get(0))
            .doing("measure the thread's later events")?;
        let mut messages_after = 0u64;
        let mut later = tx
            .prepare_cached(
                "SELECT seq, kind, body FROM events WHERE thread_id = ?1 AND seq > ?2
                   AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')",
            )
            .doing("prepare the later messages query")?;
        let mut rows = later
            .query(params![current, db_seq(at_seq)])
            .doing("read the thread's later messages")?;
        while let Some(row) = rows.next().doing("read a later message")? {
            let seq = seq_of(&current, row.get(0).doing("read a seq")?)?;
            let kind: String = row.get(1).doing("read a kind")?;
            let body: String = row.get(2).doing("read a body")?;
            messages_after += record::stored_message_bytes(&current, seq, &kind, &body)?;
        }
        return Ok((
            u64::try_from(bytes - after).unwrap_or(0),
            u64::try_from(message_bytes)
                .unwrap_or(0)
                .saturating_sub(messages_after),
        ));
    }
}

fn forks_of(conn: &Connection, thread: &str) -> Result<Vec<String>, StoreError> {
    let mut select = conn
        .prepare_cached("SELECT id FROM threads WHERE parent_id = ?1 ORDER BY id")
        .doing("prepare the fork query")?;
    let forks = select
        .query_map([thread], |r| r.get(0))
        .doing("list forks")?
        .collect::<Result<Vec<String>, _>>()
        .doing("read a fork id")?;
    Ok(forks)
}

/// Deletes `thread`'s rows and counts the deletion (which drops cached folds of it, in
/// every process: see [`projection_cache`]).
fn delete_thread(conn: &Connection, thread: &str) -> Result<(), StoreError> {
    conn.execute("UPDATE deletions SET count = count + 1 WHERE id = 1", [])
        .doing("count the deletion")?;
    conn.execute("DELETE FROM events WHERE thread_id = ?1", [thread])
        .doing("delete events")?;
    conn.execute("DELETE FROM threads WHERE id = ?1", [thread])
        .doing("delete the thread")?;
    Ok(())
}

/// Deletes the threads idle since before `cutoff`, inside the caller's write transaction.
fn prune_idle(tx: &Connection, cutoff: i64) -> Result<PruneReport, StoreError> {
    let mut report = PruneReport::default();
    loop {
        let leaves: Vec<String> = {
            let mut select = tx
                .prepare_cached(
                    "SELECT id FROM threads t WHERE updated_at < ?1
                     AND NOT EXISTS (SELECT 1 FROM threads c WHERE c.parent_id = t.id) ORDER BY id",
                )
                .doing("prepare the idle query")?;
            select
                .query_map([cutoff], |r| r.get(0))
                .doing("find idle threads")?
                .collect::<Result<_, _>>()
                .doing("read an idle thread")?
        };
        if leaves.is_empty() {
            break;
        }
        for id in leaves {
            delete_thread(tx, &id)?;
            report.deleted.push(id);
        }
    }
    let mut select = tx
        .prepare_cached("SELECT id FROM threads WHERE updated_at < ?1 ORDER BY id")
        .doing("prepare the kept query")?;
    report.kept_for_forks = select
        .query_map([cutoff], |r| r.get(0))
        .doing("find kept threads")?
        .collect::<Result<_, _>>()
        .doing("read a kept thread")?;
    drop(select);
    Ok(report)
}

impl Store for SqliteStore {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // Encoded (serialized, tokens counted) here rather than on the writer thread, whose
        // time every write of the process shares; as the PostgreSQL store does.
        let mut rows = events
            .into_iter()
            .map(|event| record::encode(thread, event))
            .collect::<Result<Vec<_>, _>>()?;
        record::share_replies(thread, &mut rows)?;
        let thread = thread.to_string();
        let limits = ThreadLimits {
            max_events: self
                .inner
                .max_events
                .load(std::sync::atomic::Ordering::Relaxed),
            max_bytes: self
                .inner
                .max_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
        };
        self.write(move |conn| append_rows(conn, &thread, rows, limits))
            .await
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.events_after(thread, 0).await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        let (thread, key) = (thread.to_string(), key.to_string());
        self.read(move |conn| {
            let tx = conn.transaction().doing("begin a read")?;
            let row = tx
                .prepare_cached(
                    "SELECT seq, kind, body, tokens, created_at FROM events
                     WHERE thread_id = ?1 AND idempotency_key = ?2",
                )
                .doing("prepare the idempotency lookup")?
                .query_row(params![thread, key], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, Option<String>>(3)?,
                        row.get::<_, i64>(4)?,
                    ))
                })
                .optional()
                .doing("look up the idempotency key")?;
            let Some((seq, kind, body, tokens, appended_at_ms)) = row else {
                return Ok(None);
            };
            let seq = seq_of(&thread, seq)?;
            let decoded = record::decode_row(&thread, seq, &kind, &body, tokens.as_deref())?;
            let segments = chain(&tx, &thread)?;
            let mut events = references::resolve(&tx, &thread, &segments, vec![decoded], seq - 1)?;
            tx.commit().doing("end the read")?;
            Ok(events.pop().map(|event| KeyedEvent {
                event,
                appended_at_ms,
            }))
        })
        .await
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        let thread = thread.to_string();
        self.read_inline(move |conn| {
            conn.prepare_cached("SELECT 1 FROM threads WHERE id = ?1")
                .doing("prepare the thread query")?
                .exists([&thread])
                .doing("read the thread")
        })
        .await
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| read_events(conn, &thread, after, u64::MAX))
            .await
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| read_events(conn, &thread, after, through))
            .await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        let thread = thread.to_string();
        if self.inner.projections.holds(&thread) {
            // Only the events since the kept fold are read: a short read.
            let projections = &self.inner.projections;
            return self
                .read_inline(|conn| read_projection(conn, &thread, projections))
                .await
                .map(|whole| whole.projection);
        }
        let inner = Arc::clone(&self.inner);
        self.read(move |conn| read_projection(conn, &thread, &inner.projections))
            .await
            .map(|whole| whole.projection)
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        let thread = thread.to_string();
        let inner = Arc::clone(&self.inner);
        self.read(move |conn| {
            read_projection_tail(conn, &thread, &inner.projections, encoding, tokens)
        })
        .await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        let (parent, child) = (parent.to_string(), child.to_string());
        self.write(move |conn| fork_thread(conn, &parent, at_seq, &child))
            .await
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let (prefix, after) = (prefix.to_string(), after.to_string());
        let end = crate::prefix_end(&prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            let mut select = conn
                .prepare_cached(
                    "SELECT id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes,
                            message_bytes, retention
                     FROM threads WHERE id >= ?1 AND id > ?2 AND (?3 IS NULL OR id < ?3)
                     ORDER BY id LIMIT ?4",
                )
                .doing("prepare the thread list")?;
            let rows = select
                .query_map(params![prefix, after, end, limit], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, i64>(5)?,
                        r.get::<_, i64>(6)?,
                        r.get::<_, i64>(7)?,
                        r.get::<_, Option<String>>(8)?,
                    ))
                })
                .doing("list threads")?
                .collect::<Result<Vec<_>, _>>()
                .doing("read a thread")?;
            rows.into_iter()
                .map(
                    |(
                        id,
                        parent,
                        fork_seq,
                        last_seq,
                        created,
                        updated,
                        bytes,
                        message_bytes,
                        retention,
                    )| {
                        Ok(ThreadInfo {
                            retention: crate::retention::parse_stored(&id, retention.as_deref())?,
                            fork_seq: fork_seq.map(|s| seq_of(&id, s)).transpose()?,
                            last_seq: seq_of(&id, last_seq)?,
                            id,
                            parent,
                            created_at_ms: created,
                            updated_at_ms: updated,
                            bytes: u64::try_from(bytes).unwrap_or(0),
                            message_bytes: u64::try_from(message_bytes).unwrap_or(0),
                        })
                    },
                )
                .collect()
        })
        .await
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        let thread = thread.to_string();
        self.write(move |tx| {
            let exists: Option<i64> = tx
                .query_row("SELECT 1 FROM threads WHERE id = ?1", [&thread], |r| {
                    r.get(0)
                })
                .optional()
                .doing("read the thread")?;
            if exists.is_none() {
                return Err(StoreError::NotFound { thread });
            }
            let forks = forks_of(tx, &thread)?;
            if !forks.is_empty() {
                return Err(StoreError::HasForks { thread, forks });
            }
            delete_thread(tx, &thread)
        })
        .await?;
        self.reclaim().await
    }

    async fn prune(&self, idle_before: SystemTime) -> Result<PruneReport, StoreError> {
        let cutoff = epoch_ms(idle_before);
        let report = self.write(move |conn| prune_idle(conn, cutoff)).await?;
        self.reclaim().await?;
        Ok(report)
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        let model = model.to_string();
        self.read(move |conn| stored_calibration(conn, &model))
            .await
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        let model = model.to_string();
        let now = epoch_ms(SystemTime::now());
        // The writer runs one transaction at a time: the read, the fold and the write below
        // see no other writer in between.
        self.write(move |tx| {
            let mut current = stored_calibration(tx, &model)?.unwrap_or_default();
            current.observe(observation);
            tx.prepare_cached(
                "INSERT INTO model_calibrations (model, calibration, updated_at)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (model) DO UPDATE
                 SET calibration = excluded.calibration, updated_at = excluded.updated_at",
            )
            .doing("prepare the calibration write")?
            .execute(params![model, calibration::to_stored(&current), now])
            .doing("store a calibration")?;
            Ok(current)
        })
        .await
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        let thread = thread.to_string();
        self.write(move |tx| retention::set_retention(tx, &thread, retention.as_ref()))
            .await
    }

    async fn prune_thread_requests(
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|conn| {
            conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                .doing("ping")?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contexture_core::Message;
    use contexture_core::thread::EventKind;

    /// Fills thread `big` with `batches` appends of 50 messages of 2 KB, then thread `small`
    /// with one message.
    async fn big_and_small(store: &SqliteStore, batches: usize) {
        let say = |text: String| {
            NewEvent::new(EventKind::MessageAppended {
                message: Message::user(text),
            })
        };
        for _ in 0..batches {
            let batch = (0..50).map(|_| say("x".repeat(2_000))).collect();
            store.append("big", batch).await.unwrap();
        }
        store.append_one("small", say("kept".into())).await.unwrap();
    }

    /// Deleting a thread gives its pages back: the file shrinks, in steps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_threads_pages_go_back_to_the_file_system() {
        let dir = crate::testing::TempDir::new("contexture-reclaim");
        let path = dir.join("threads.db");
        let store = SqliteStore::open(&path).await.unwrap();
        big_and_small(&store, 40).await;
        let full = crate::testing::sqlite_disk_bytes(&path);
        assert!(full > 4_000_000, "{full}");
        let started = std::time::Instant::now();
        store.delete("big").await.unwrap();
        let took = started.elapsed();
        let after = crate::testing::sqlite_disk_bytes(&path);
        let steps = (full - after).div_ceil(4096 * u64::from(RECLAIM_STEP));
        eprintln!("delete + {steps} reclaiming steps: {took:?}");
        assert!(
            after < full / 10,
            "{full} bytes before the delete, {after} after"
        );
        assert_eq!(store.events("small").await.unwrap().len(), 1);
    }

    /// A file made before the store chose incremental vacuum keeps its free pages after a
    /// delete; a vacuum rewrites it without them and switches it over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vacuum_shrinks_an_older_file_and_switches_it_to_incremental_vacuum() {
        let dir = crate::testing::TempDir::new("contexture-vacuum");
        let path = dir.join("old.db");
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch("PRAGMA auto_vacuum = NONE; CREATE TABLE made_before (x);")
                .unwrap();
        }
        let mode = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
                .unwrap()
        };
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(mode(&path), 0, "an older file keeps its mode on open");
        big_and_small(&store, 20).await;
        store.delete("big").await.unwrap();
        let kept = crate::testing::sqlite_disk_bytes(&path);
        assert!(kept > 2_000_000, "the free pages stay in the file: {kept}");
        let (before, after) = store.vacuum().await.unwrap();
        assert!(
            before > 2_000_000 && after < before / 10,
            "{before} -> {after}"
        );
        assert_eq!(mode(&path), INCREMENTAL_VACUUM);
        assert_eq!(store.events("small").await.unwrap().len(), 1);
        store
            .append_one(
                "small",
                NewEvent::new(EventKind::MessageAppended {
                    message: Message::user("after"),
                }),
            )
            .await
            .unwrap();
        assert_eq!(store.events("small").await.unwrap().len(), 2);
    }

    /// A new database file, and its write-ahead log, are its owner's alone; an existing
    /// file keeps the permissions the operator gave it.
    #[cfg(unix)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_database_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let dir = crate::testing::TempDir::new("contexture-private");
        let path = dir.join("threads.db");
        let store = SqliteStore::open(&path).await.unwrap();
        big_and_small(&store, 1).await;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.join("threads.db-wal")), 0o600);
        drop(store);
        let shared = dir.join("shared.db");
        std::fs::write(&shared, b"").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640)).unwrap();
        let store = SqliteStore::open(&shared).await.unwrap();
        big_and_small(&store, 1).await;
        assert_eq!(mode(&shared), 0o640);
    }
}
