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
mod execution_queue;
mod pruning;
mod reads;
mod references;
mod retention;
mod schema;
mod turn_queue;
mod writer;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, Projection};
use contexture_core::tokens::Encoding;
use rusqlite::Connection;

use self::checkpointer::Checkpointer;
use self::writer::Writer;
use crate::projection_cache::{DEFAULT_PROJECTION_CACHE_BYTES, ProjectionCache};
use crate::referable_cache::{ReferableCache, referable_bytes};

use crate::error::Action;
use crate::record::{self, ThreadLimits};
use crate::{
    EventOutline, KeyedEvent, NewEvent, ProjectionTail, PruneReport, RecentCursor,
    RequestRetention, RequestsPruned, Store, StoreError, ThreadInfo, epoch_ms,
};

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
    /// The message bodies the writer compared each thread's last request record with.
    referable: Arc<ReferableCache>,
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

/// The writer's busy handler: waits for another writer (a restarting checkpoint, another
/// process) a millisecond at a time, for at most [`BUSY_TIMEOUT`]; on the writer thread
/// only, never on a caller's thread committing its own write ([`writer::may_wait`]).
fn writer_waits(waited: i32) -> bool {
    writer::may_wait() && wait_a_millisecond(waited, BUSY_TIMEOUT)
}

/// A busy handler's step: after `waited` tries, waits a millisecond and tries again, until
/// about `limit` has gone by.
fn wait_a_millisecond(waited: i32, limit: Duration) -> bool {
    if u128::try_from(waited).unwrap_or(u128::MAX) >= limit.as_millis() {
        return false;
    }
    std::thread::sleep(Duration::from_millis(1));
    true
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a connection half-way through a
    // transaction: rusqlite rolls back uncommitted transactions when they are dropped.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SqliteStore {
    /// Opens (creating when missing) the database at `path` and applies pending migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || SqliteStore::open_blocking(path)).await?
    }

    /// Like [`SqliteStore::open`], on the calling thread.
    pub fn open_blocking(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_migrations(path.as_ref(), schema::MIGRATIONS)
    }

    /// Opens the database at `path` as a build that knows only the migrations up to
    /// `version` would (see [`crate::testing::open_sqlite_at_version`]).
    #[cfg(feature = "testing")]
    pub(crate) fn open_at_version(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_migrations(
            path,
            crate::migrations_up_to(schema::MIGRATIONS, version),
        )
    }

    fn open_with_migrations(
        path: &Path,
        migrations: &'static [(u32, &'static str)],
    ) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        schema::create_private(&path)?;
        let mut writer = connect(&path)?;
        schema::migrate(&mut writer, migrations)?;
        // The checkpointer copies the log into the database; no commit waits for that. A
        // log grown by a burst is cut back to the size a restart keeps when it starts over.
        writer
            .execute_batch(&format!(
                "PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {};",
                checkpointer::RESTART_FRAMES * 4096
            ))
            .doing("configure the writer")?;
        // A checkpoint that starts the log over holds writes back for a few milliseconds;
        // the writer looks again every millisecond instead of SQLite's backoff (which sleeps
        // up to 100 ms at a time, most of it after the way is clear).
        writer
            .busy_handler(Some(writer_waits))
            .doing("configure the writer")?;
        let checkpointer = Checkpointer::start(connect(&path)?, checkpointer::RESTART_FRAMES)?;
        let committed = checkpointer.notifier();
        let referable = Arc::new(ReferableCache::new(referable_bytes(
            DEFAULT_PROJECTION_CACHE_BYTES,
        )));
        let cleared = Arc::clone(&referable);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Writer::start(writer, committed, Box::new(move || cleared.clear()))?,
                _checkpointer: checkpointer,
                readers: Mutex::new(Vec::new()),
                reading: tokio::sync::Semaphore::new(READERS),
                projections: ProjectionCache::default(),
                referable,
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

    /// Bounds the memory of the folds of recently read threads the store keeps, so that a
    /// thread read again costs only its new events, to about `bytes` (0: keep none; by
    /// default [`crate::DEFAULT_PROJECTION_CACHE_BYTES`]). The least recently read are
    /// dropped first. An eighth more (`bytes / 8`) bounds the message bodies the writer
    /// keeps so that a thread's next request record reads only its new messages.
    pub fn set_projection_cache_bytes(&self, bytes: u64) {
        self.inner.projections.set_max_bytes(bytes);
        self.inner.referable.set_max_bytes(referable_bytes(bytes));
    }

    /// Runs `work` inside a write transaction, batched with other writes (see [`writer`]).
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner.writer.write(work).await
    }

    /// [`SqliteStore::write`] for state that lapses by itself (a turn's place in its
    /// thread's queue): answered once committed, synced to disk by the next synced commit
    /// (see [`writer::Durability::Lapsing`]).
    async fn write_lapsing<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner
            .writer
            .write_with(writer::Durability::Lapsing, work)
            .await
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

impl SqliteStore {
    /// Appends `events` to `thread` and runs `then` in the same write (after the rows are
    /// inserted): an error of `then` stores none of them.
    pub(crate) async fn append_then(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        then: impl FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_after_then(thread, None, events, then).await
    }

    /// [`SqliteStore::append_then`], only when the thread's last seq is still `after`
    /// (when given; see [`Store::append_after`]).
    async fn append_after_then(
        &self,
        thread: &str,
        after: Option<u64>,
        events: Vec<NewEvent>,
        then: impl FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<Vec<u64>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // Encoded (serialized, tokens counted) here rather than on the writer thread, whose
        // time every write of the process shares; as the PostgreSQL store does.
        let rows = record::encode_batch(thread, events)?;
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
        let referable = Arc::clone(&self.inner.referable);
        self.write(move |conn| {
            let seqs = writes::append_rows(conn, &thread, rows, after, limits, &referable)?;
            then(conn)?;
            Ok(seqs)
        })
        .await
    }
}

impl Store for SqliteStore {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        self.append_then(thread, events, |_| Ok(())).await
    }

    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_after_then(thread, Some(after), events, |_| Ok(()))
            .await
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.events_after(thread, 0).await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        let (thread, key) = (thread.to_string(), key.to_string());
        self.read(move |conn| reads::keyed_event(conn, &thread, &key))
            .await
    }
    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        let thread = thread.to_string();
        self.read_inline(move |conn| reads::exists(conn, &thread))
            .await
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| reads::read_events(conn, &thread, after, u64::MAX))
            .await
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| reads::read_events(conn, &thread, after, through))
            .await
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| reads::read_outlines(conn, &thread, after, through))
            .await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        let thread = thread.to_string();
        if self.inner.projections.holds(&thread) {
            // Only the events since the kept fold are read: a short read.
            let projections = &self.inner.projections;
            return self
                .read_inline(|conn| reads::read_projection(conn, &thread, projections))
                .await
                .map(|whole| whole.projection);
        }
        let inner = Arc::clone(&self.inner);
        self.read(move |conn| reads::read_projection(conn, &thread, &inner.projections))
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
        if self.inner.projections.holds(&thread) {
            // As for a projection: only the events since the kept fold are read.
            let projections = &self.inner.projections;
            return self
                .read_inline(|conn| {
                    reads::read_projection_tail(conn, &thread, projections, encoding, tokens)
                })
                .await;
        }
        let inner = Arc::clone(&self.inner);
        self.read(move |conn| {
            reads::read_projection_tail(conn, &thread, &inner.projections, encoding, tokens)
        })
        .await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        let (parent, child) = (parent.to_string(), child.to_string());
        self.write(move |conn| writes::fork_thread(conn, &parent, at_seq, &child))
            .await
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let (prefix, after) = (prefix.to_string(), after.to_string());
        self.read(move |conn| reads::list_page(conn, &prefix, &after, limit))
            .await
    }

    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let (prefix, contains) = (prefix.to_string(), contains.to_string());
        let before = before.cloned();
        self.read(move |conn| reads::list_recent(conn, &prefix, &contains, before.as_ref(), limit))
            .await
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        let thread = thread.to_string();
        self.read(move |conn| reads::fork_infos(conn, &thread))
            .await
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        let thread = thread.to_string();
        self.write(move |tx| writes::delete_unforked(tx, &thread))
            .await?;
        self.reclaim().await
    }

    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        let cutoff = epoch_ms(idle_before);
        let prefix = prefix.to_owned();
        let report = self
            .write(move |conn| pruning::prune_idle(conn, &prefix, cutoff))
            .await?;
        self.reclaim().await?;
        Ok(report)
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        let model = model.to_string();
        self.read(move |conn| reads::stored_calibration(conn, &model))
            .await
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        let model = model.to_string();
        let now = epoch_ms(SystemTime::now());
        // The writer runs one transaction at a time: the read, the fold and the write see no
        // other writer in between.
        self.write(move |tx| writes::observe_calibration(tx, &model, observation, now))
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
        self.prune_requests(thread, retention, now).await
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
