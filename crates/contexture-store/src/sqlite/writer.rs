//! Group commit: one thread owns the write connection and commits every write waiting for it
//! in one transaction.
//!
//! With `synchronous = FULL` each commit costs an fsync, and writers of one SQLite file
//! take turns; committing writes one by one caps a process at one write per fsync however
//! many callers wait. Here the writer thread takes every write queued while the previous
//! batch was committing, runs each inside its own savepoint (a failed write is rolled back
//! alone and answers its own error), and commits them all at once: one fsync for the
//! batch. No caller hears back before the commit that holds its write has returned, so an
//! answered write is on disk exactly as before; a failed commit fails every write of its
//! batch, none of which is then stored.
//!
//! A write of state that lapses by itself (a turn's place in its thread's queue) may ask for
//! less ([`Durability::Lapsing`]): a batch of such writes only is committed without the sync
//! (`synchronous = NORMAL`), so it survives the process but not the machine; the next synced
//! commit (or checkpoint) puts it on disk with everything before it. A batch with any other
//! write is synced whole.
//!
//! A write that finds nothing queued, the connection free and the file's write lock free at
//! once is committed on the calling thread instead, as a batch of its own: the writer thread
//! would have committed it alone too, and handing it over and waking its caller back costs
//! two thread switches, which on a virtual machine took about as long as the commit of a
//! small write. Writes that find the connection taken, or the file locked (a checkpoint
//! starting the log over, a vacuum, another process), go to the writer thread, which waits
//! for the lock and takes every write queued meanwhile, so the batches under load are what
//! they were and no caller's thread waits for a lock. The calling thread blocks only for its
//! own commit, and only on a tokio runtime with more than one worker (or outside one): on a
//! single-threaded runtime, where a blocked thread stops every task, writes always go to the
//! writer thread.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpointer::CommitNotifier;
use crate::StoreError;

/// The most writes committed together; a bound on how long the first of them waits.
const MAX_BATCH: usize = 256;

/// A commit that takes this long is logged as a warning.
const SLOW_COMMIT: Duration = Duration::from_millis(100);

/// A queued write: runs on the writer thread given the connection (inside the batch's
/// transaction), or is told why it cannot run.
type Job = Box<dyn FnOnce(Result<&Connection, StoreError>) -> Ran + Send>;

/// How far a write has reached when its caller hears back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durability {
    /// On disk: the commit holding it synced the write-ahead log (`synchronous = FULL`).
    Synced,
    /// In the write-ahead log, in the operating system's hands: it survives the process
    /// but not a crash of the machine, until the next synced commit or checkpoint. For
    /// state that lapses by itself, which a crash of the machine makes moot.
    Lapsing,
}

impl Durability {
    /// The `synchronous` setting a commit of this durability runs under.
    fn pragma(self) -> &'static str {
        match self {
            Durability::Synced => "PRAGMA synchronous = FULL",
            Durability::Lapsing => "PRAGMA synchronous = NORMAL",
        }
    }
}

/// A write waiting for its batch, with what its commit must do for it.
struct Queued {
    job: Job,
    durability: Durability,
}

/// Told of every rollback of a write (its savepoint, or a whole batch), before the next
/// write runs: what a cache kept from a write's reads may be gone.
pub(super) type OnRollback = Box<dyn Fn() + Send>;

/// A write that ran: whether it succeeded (its savepoint is kept), and how to answer its
/// caller once the batch's commit is known.
struct Ran {
    succeeded: bool,
    answer: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// The handle on the writer thread. Dropping it lets the thread finish the queued writes
/// and close the connection, and waits for that.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Queued>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the writer thread and the callers committing on their own threads share.
struct Shared {
    committer: Mutex<Committer>,
    /// Writes sent to the writer thread and not yet taken into a batch: while there are
    /// any, no write is committed on its caller's thread ahead of them.
    queued: AtomicUsize,
}

/// The write connection, and what its commits tell.
struct Committer {
    conn: Connection,
    /// The `synchronous` setting the connection is at.
    syncing: Durability,
    committed: Option<CommitNotifier>,
    rolled_back: OnRollback,
}

impl Writer {
    /// Starts the writer thread on `conn`; it tells `committed` of each commit, and
    /// `rolled_back` of each rollback.
    pub(super) fn start(
        conn: Connection,
        committed: Option<CommitNotifier>,
        rolled_back: OnRollback,
    ) -> Result<Writer, StoreError> {
        let (jobs, queue) = mpsc::channel::<Queued>();
        let shared = Arc::new(Shared {
            committer: Mutex::new(Committer {
                conn,
                // The connection is opened with `synchronous = FULL`.
                syncing: Durability::Synced,
                committed,
                rolled_back,
            }),
            queued: AtomicUsize::new(0),
        });
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("contexture-sqlite-writer".into())
            .spawn(move || run(&serving, &queue))
            .map_err(|error| StoreError::WritePanicked {
                detail: format!("cannot start the writer thread: {error}"),
            })?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
            shared,
        })
    }

    /// Runs `work` in the next batch and answers once that batch is committed and synced.
    /// `work` runs inside a transaction (and a savepoint of its own): it must not begin or
    /// end one.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.write_with(Durability::Synced, work).await
    }

    /// [`Writer::write`], answered once the batch is committed as far as `durability` asks.
    pub(super) async fn write_with<T: Send + 'static>(
        &self,
        durability: Durability,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Ok(conn) => catch_unwind(AssertUnwindSafe(|| work(conn))).unwrap_or_else(|panic| {
                    Err(StoreError::WritePanicked {
                        detail: panic_text(panic.as_ref()),
                    })
                }),
                Err(error) => Err(error),
            };
            Ran {
                succeeded: result.is_ok(),
                answer: Box::new(move |commit| {
                    let outcome = match (result, commit) {
                        (Ok(value), Ok(())) => Ok(value),
                        (Ok(_), Err(error)) | (Err(error), _) => Err(error),
                    };
                    // The caller may have gone (its request was dropped); the write stands.
                    let _ = reply.send(outcome);
                }),
            }
        });
        let queued = Queued { job, durability };
        if let Some(queued) = self.commit_here(queued) {
            self.shared.queued.fetch_add(1, Ordering::AcqRel);
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.send(queued).is_ok());
            if !sent {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                return Err(StoreError::WriterStopped);
            }
        }
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Commits `queued` on the calling thread when no write waits for the writer thread, the
    /// connection is free and the file's write lock is taken at once; else gives it back,
    /// to be sent there.
    fn commit_here(&self, queued: Queued) -> Option<Queued> {
        if !blocking_allowed() || self.shared.queued.load(Ordering::Acquire) != 0 {
            return Some(queued);
        }
        let mut committer = match self.shared.committer.try_lock() {
            Ok(committer) => committer,
            Err(TryLockError::Poisoned(poisoned)) => recovered(&self.shared.committer, poisoned),
            Err(TryLockError::WouldBlock) => return Some(queued),
        };
        // A write sent meanwhile goes first: the writer thread is about to take the lock.
        if self.shared.queued.load(Ordering::Acquire) != 0 {
            return Some(queued);
        }
        committer.commit_alone_now(queued)
    }
}

/// Whether the calling thread may block for a commit: outside a tokio runtime, or on a
/// multi-threaded one with another worker to go on with the other tasks. Not on a
/// single-threaded runtime, whose tasks (some perhaps needed by the write) would all wait.
fn blocking_allowed() -> bool {
    tokio::runtime::Handle::try_current().map_or(true, |runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && runtime.metrics().num_workers() > 1
    })
}

thread_local! {
    /// True while a caller begins a commit on its own thread: the write connection's busy
    /// handler ([`may_wait`]) then gives up at once, and the write goes to the writer thread.
    static BEGINNING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the write connection's busy handler may wait for the file's write lock on this
/// thread: not while a caller tries to commit on its own thread, which must not wait.
pub(super) fn may_wait() -> bool {
    !BEGINNING_HERE.with(Cell::get)
}

/// Locks the committer.
fn lock(committer: &Mutex<Committer>) -> MutexGuard<'_, Committer> {
    committer
        .lock()
        .unwrap_or_else(|poisoned| recovered(committer, poisoned))
}

/// The committer after a panic while it was held, outside the writes' own `catch_unwind`
/// (a rollback or commit hook, the log): a transaction it left open is rolled back, so
/// that the file's write lock is let go and the next batch can begin.
fn recovered<'a>(
    committer: &'a Mutex<Committer>,
    poisoned: std::sync::PoisonError<MutexGuard<'a, Committer>>,
) -> MutexGuard<'a, Committer> {
    let guard = poisoned.into_inner();
    if !guard.conn.is_autocommit() {
        let _ = control(&guard.conn, "ROLLBACK");
        (guard.rolled_back)();
    }
    committer.clear_poison();
    guard
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            // Queued writes are finished before the thread sees the closed channel.
            let _ = thread.join();
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a write panicked".into())
}

/// Runs one transaction-control statement, through the statement cache: these run several
/// times per batch, and preparing them each time showed in profiles.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn run(shared: &Shared, queue: &mpsc::Receiver<Queued>) {
    while let Ok(first) = queue.recv() {
        // Taken before the batch is: writes that queue while a caller commits on its own
        // thread join this batch.
        let mut committer = lock(&shared.committer);
        let mut batch = Vec::with_capacity(8);
        batch.push(first);
        batch.extend(queue.try_iter().take(MAX_BATCH - 1));
        shared.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        committer.commit(batch);
    }
}

impl Committer {
    /// Commits `batch` in one transaction, synced unless every write of it is lapsing, and
    /// answers each write.
    fn commit(&mut self, batch: Vec<Queued>) {
        let durability = if batch
            .iter()
            .any(|queued| queued.durability == Durability::Synced)
        {
            Durability::Synced
        } else {
            Durability::Lapsing
        };
        let batch: Vec<Job> = batch.into_iter().map(|queued| queued.job).collect();
        if let Err(error) = self.sync_as(durability) {
            // Not knowing how the next commit would sync, none runs: each write is told why.
            refuse(batch, "set how a commit syncs", &error);
            return;
        }
        commit_batch(&self.conn, batch, &*self.rolled_back);
        self.tell_committed();
    }

    /// Commits `queued` alone when the file's write lock is taken at once, without waiting
    /// for it; else gives it back untouched, for the writer thread (which waits, and tells
    /// the write of any error).
    fn commit_alone_now(&mut self, queued: Queued) -> Option<Queued> {
        if self.sync_as(queued.durability).is_err() {
            return Some(queued);
        }
        BEGINNING_HERE.set(true);
        let begun = control(&self.conn, "BEGIN IMMEDIATE");
        BEGINNING_HERE.set(false);
        if begun.is_err() {
            return Some(queued);
        }
        commit_begun(&self.conn, vec![queued.job], &*self.rolled_back);
        self.tell_committed();
        None
    }

    /// Sets how the next commit syncs, when it differs from the last.
    fn sync_as(&mut self, durability: Durability) -> rusqlite::Result<()> {
        if durability != self.syncing {
            control(&self.conn, durability.pragma())?;
            self.syncing = durability;
        }
        Ok(())
    }

    fn tell_committed(&self) {
        if let Some(committed) = &self.committed {
            committed.committed();
        }
    }
}

/// A copy of an SQLite error for each write of a batch that it fails.
fn copy_error(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

fn fail(action: &'static str, error: &rusqlite::Error) -> StoreError {
    StoreError::database("sqlite", action, copy_error(error))
}

/// Tells each write of `batch` that it cannot run, since `action` failed with `error`.
fn refuse(batch: Vec<Job>, action: &'static str, error: &rusqlite::Error) {
    for job in batch {
        let ran = job(Err(fail(action, error)));
        (ran.answer)(Ok(()));
    }
}

/// Runs `batch` in one transaction, each write in a savepoint, commits, then answers each.
fn commit_batch(conn: &Connection, batch: Vec<Job>, rolled_back: &dyn Fn()) {
    if let Err(error) = control(conn, "BEGIN IMMEDIATE") {
        refuse(batch, "begin a write", &error);
        return;
    }
    commit_begun(conn, batch, rolled_back);
}

/// [`commit_batch`] in the transaction already begun.
fn commit_begun(conn: &Connection, batch: Vec<Job>, rolled_back: &dyn Fn()) {
    let mut ran: Vec<Ran> = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    for job in jobs.by_ref() {
        if let Err(error) = control(conn, "SAVEPOINT write") {
            ran.push(job(Err(fail("begin a write's savepoint", &error))));
            continue;
        }
        let outcome = job(Ok(conn));
        let ended = if conn.is_autocommit() {
            // SQLite rolled the whole transaction back on the write's error (a full disk,
            // an I/O error): the writes before it are gone too.
            Err((
                "commit a batch of writes",
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                    Some("SQLite rolled back the transaction after an error in a write of the same batch; retry".into()),
                ),
            ))
        } else {
            if !outcome.succeeded {
                rolled_back();
            }
            end_savepoint(conn, outcome.succeeded)
                .map_err(|error| ("end a write's savepoint", error))
        };
        ran.push(outcome);
        if let Err((action, error)) = ended {
            rolled_back();
            abandon(conn, ran, action, &error);
            let rest: Vec<Job> = jobs.collect();
            if !rest.is_empty() {
                commit_batch(conn, rest, rolled_back);
            }
            return;
        }
    }
    let committing = Instant::now();
    let committed = control(conn, "COMMIT");
    let took = committing.elapsed();
    if took >= SLOW_COMMIT {
        // Every write queued meanwhile waited as long: a slow disk shows here first.
        tracing::warn!(
            elapsed_ms = took.as_millis() as u64,
            writes = ran.len(),
            "a commit of the SQLite store took long (the file system's sync)"
        );
    }
    match committed {
        Ok(()) => {
            for outcome in ran {
                (outcome.answer)(Ok(()));
            }
        }
        Err(error) => {
            let _ = control(conn, "ROLLBACK");
            rolled_back();
            for outcome in ran {
                (outcome.answer)(Err(fail("commit a batch of writes", &error)));
            }
        }
    }
}

/// Keeps a write's savepoint when it succeeded, else rolls it back; then releases it.
fn end_savepoint(conn: &Connection, succeeded: bool) -> rusqlite::Result<()> {
    if !succeeded {
        control(conn, "ROLLBACK TO write")?;
    }
    control(conn, "RELEASE write")
}

/// Ends a batch whose transaction is lost (SQLite rolled it back) or in doubt (a savepoint
/// could not be closed): rolls back what is left of it, and fails every write of it that
/// had succeeded, since none is stored. The failed ones answer their own errors.
fn abandon(conn: &Connection, ran: Vec<Ran>, action: &'static str, error: &rusqlite::Error) {
    if !conn.is_autocommit() {
        let _ = control(conn, "ROLLBACK");
    }
    for outcome in ran {
        (outcome.answer)(if outcome.succeeded {
            Err(fail(action, error))
        } else {
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use super::*;
    use crate::error::Action;

    /// Runs a test on both kinds of runtime: on a multi-threaded one, a write that finds
    /// nothing queued and the connection free is committed on its caller's thread; on a
    /// single-threaded one, every write goes through the writer thread.
    macro_rules! on_both_runtimes {
        ($name:ident) => {
            mod $name {
                #[tokio::test]
                async fn single_threaded() {
                    super::$name().await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn multi_threaded() {
                    super::$name().await
                }
            }
        };
    }

    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        conn
    }

    fn insert(conn: &Connection, id: i64) -> Result<i64, StoreError> {
        conn.execute("INSERT INTO t (id, v) VALUES (?1, 'x')", [id])
            .doing("insert")?;
        Ok(id)
    }

    /// The ids in the table, in order.
    fn ids(conn: &Connection) -> Result<Vec<i64>, StoreError> {
        let mut select = conn.prepare("SELECT id FROM t ORDER BY id").unwrap();
        let ids = select
            .query_map([], |r| r.get::<_, i64>(0))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        Ok(ids)
    }

    type TestWrite = Box<dyn FnOnce(&Connection) -> Result<i64, StoreError> + Send>;

    /// Starts a write of `durability` that holds the writer, once running, until the
    /// returned sender sends: the writes queued meanwhile form the next batch. Then it runs
    /// `work`.
    async fn held<T: Send + 'static>(
        writer: &std::sync::Arc<Writer>,
        durability: Durability,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> (
        std_mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<T, StoreError>>,
    ) {
        let (release, wait) = std_mpsc::channel::<()>();
        let (started, running) = oneshot::channel::<()>();
        let writer = writer.clone();
        let gate = tokio::spawn(async move {
            writer
                .write_with(durability, move |conn| {
                    let _ = started.send(());
                    let _ = wait.recv();
                    work(conn)
                })
                .await
        });
        running.await.unwrap();
        (release, gate)
    }

    /// Waits until `count` writes are queued for the writer thread (while a held write keeps
    /// it from taking them): the writes that will form its next batch.
    async fn queued_for_the_thread(writer: &Writer, count: usize) {
        let waited = std::time::Instant::now();
        while writer.shared.queued.load(Ordering::Acquire) < count {
            assert!(
                waited.elapsed() < std::time::Duration::from_secs(10),
                "the writes were not queued"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    on_both_runtimes!(a_failed_or_panicking_write_is_rolled_back_alone_in_its_batch);
    async fn a_failed_or_panicking_write_is_rolled_back_alone_in_its_batch() {
        let rollbacks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = rollbacks.clone();
        let on_rollback: OnRollback = Box::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let writer = std::sync::Arc::new(Writer::start(table(), None, on_rollback).unwrap());
        let (release, gate) = held(&writer, Durability::Synced, |conn| insert(conn, 1)).await;
        // Queued while the writer is held: these form one batch.
        let spawn = |work: TestWrite| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write(work).await })
        };
        let ok_a = spawn(Box::new(|conn| insert(conn, 2)));
        let failing = spawn(Box::new(|conn| {
            insert(conn, 3)?;
            insert(conn, 2) // a duplicate key: the whole write, row 3 included, is undone
        }));
        let panicking = spawn(Box::new(|conn| {
            insert(conn, 4)?;
            panic!("boom")
        }));
        let ok_b = spawn(Box::new(|conn| insert(conn, 5)));
        queued_for_the_thread(&writer, 4).await;
        release.send(()).unwrap();

        assert_eq!(gate.await.unwrap().unwrap(), 1);
        assert_eq!(ok_a.await.unwrap().unwrap(), 2);
        assert!(matches!(
            failing.await.unwrap(),
            Err(StoreError::Database {
                backend: "sqlite",
                action: "insert",
                ..
            })
        ));
        match panicking.await.unwrap() {
            Err(StoreError::WritePanicked { detail }) => assert_eq!(detail, "boom"),
            other => panic!("expected a panic's error, got {other:?}"),
        }
        assert_eq!(ok_b.await.unwrap().unwrap(), 5);
        assert_eq!(writer.write(ids).await.unwrap(), vec![1, 2, 5]);
        // Each rolled-back write was told of, before the writes after it ran.
        assert_eq!(rollbacks.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    on_both_runtimes!(a_failed_commit_fails_every_write_of_the_batch_and_stores_none);
    async fn a_failed_commit_fails_every_write_of_the_batch_and_stores_none() {
        let conn = table();
        // A deferred foreign key is checked at COMMIT: one bad write fails the commit.
        conn.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE child (id INTEGER PRIMARY KEY,
                 t_id INTEGER REFERENCES t(id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let rollbacks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = rollbacks.clone();
        let on_rollback: OnRollback = Box::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let writer = std::sync::Arc::new(Writer::start(conn, None, on_rollback).unwrap());
        let (release, gate) = held(&writer, Durability::Synced, |conn| insert(conn, 1)).await;
        let orphan = {
            let writer = writer.clone();
            tokio::spawn(async move {
                writer
                    .write(|conn| {
                        conn.execute("INSERT INTO child (id, t_id) VALUES (1, 99)", [])
                            .doing("insert a child")
                    })
                    .await
            })
        };
        queued_for_the_thread(&writer, 1).await;
        release.send(()).unwrap();
        // The gate's write ran alone in the first batch; the orphan's batch fails at COMMIT.
        assert_eq!(gate.await.unwrap().unwrap(), 1);
        assert!(matches!(
            orphan.await.unwrap(),
            Err(StoreError::Database {
                backend: "sqlite",
                action: "commit a batch of writes",
                ..
            })
        ));
        // The connection is usable again, and the failed batch left nothing.
        let children: i64 = writer
            .write(|conn| {
                conn.query_row("SELECT COUNT(*) FROM child", [], |r| r.get(0))
                    .doing("count")
            })
            .await
            .unwrap();
        assert_eq!(children, 0);
        // The failed commit was told of as a rollback.
        assert_eq!(rollbacks.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The `synchronous` setting a write sees inside its batch: 1 is NORMAL, 2 is FULL.
    fn synchronous(conn: &Connection) -> Result<i64, StoreError> {
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0))
            .doing("read how commits sync")
    }

    on_both_runtimes!(a_batch_of_lapsing_writes_alone_is_committed_without_the_sync);
    async fn a_batch_of_lapsing_writes_alone_is_committed_without_the_sync() {
        let writer = std::sync::Arc::new(Writer::start(table(), None, Box::new(|| {})).unwrap());
        let lapsing = writer.write_with(Durability::Lapsing, synchronous);
        assert_eq!(lapsing.await.unwrap(), 1);
        assert_eq!(writer.write(synchronous).await.unwrap(), 2);

        // A lapsing write batched with a synced one is synced with it.
        let (release, gate) = held(&writer, Durability::Lapsing, synchronous).await;
        let queued = |durability: Durability| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write_with(durability, synchronous).await })
        };
        let lapsing = queued(Durability::Lapsing);
        let synced = queued(Durability::Synced);
        queued_for_the_thread(&writer, 2).await;
        release.send(()).unwrap();
        assert_eq!(gate.await.unwrap().unwrap(), 1);
        assert_eq!(lapsing.await.unwrap().unwrap(), 2);
        assert_eq!(synced.await.unwrap().unwrap(), 2);

        // And a lapsing batch after it goes without the sync again.
        let lapsing = writer.write_with(Durability::Lapsing, synchronous);
        assert_eq!(lapsing.await.unwrap(), 1);
    }

    /// The name of the thread a write runs on.
    fn thread_name(_: &Connection) -> Result<String, StoreError> {
        Ok(std::thread::current().name().unwrap_or_default().to_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_finds_the_writer_idle_is_committed_on_its_callers_thread() {
        let writer = std::sync::Arc::new(Writer::start(table(), None, Box::new(|| {})).unwrap());
        let caller = {
            let writer = writer.clone();
            tokio::spawn(async move {
                // The commit happens within the write's first poll, on this thread.
                let here = std::thread::current().id();
                let ran = writer
                    .write(|conn| {
                        insert(conn, 1)?;
                        Ok(std::thread::current().id())
                    })
                    .await;
                (here, ran)
            })
        };
        let (here, ran) = caller.await.unwrap();
        assert_eq!(ran.unwrap(), here);

        // While a write holds the connection, the next one waits for the writer thread.
        let (release, gate) = held(&writer, Durability::Synced, thread_name).await;
        let queued = {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write(thread_name).await })
        };
        queued_for_the_thread(&writer, 1).await;
        release.send(()).unwrap();
        assert_ne!(gate.await.unwrap().unwrap(), "contexture-sqlite-writer");
        assert_eq!(queued.await.unwrap().unwrap(), "contexture-sqlite-writer");
    }

    /// The writer's busy handler as the store sets it: waits a millisecond at a time, but
    /// not on a caller's thread committing its own write.
    fn waits_unless_beginning_here(waited: i32) -> bool {
        if !may_wait() || waited > 10_000 {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        true
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_finds_the_file_locked_waits_on_the_writer_thread_not_its_callers() {
        let dir =
            std::env::temp_dir().join(format!("contexture-writer-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("locked.db");
        let _ = std::fs::remove_file(&path);
        let mut conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
        )
        .unwrap();
        conn.busy_handler(Some(waits_unless_beginning_here))
            .unwrap();
        let writer = std::sync::Arc::new(Writer::start(conn, None, Box::new(|| {})).unwrap());
        // Another connection (another process, a vacuum) holds the file's write lock.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let write = {
            let writer = writer.clone();
            tokio::spawn(async move {
                writer
                    .write(|conn| {
                        insert(conn, 1)?;
                        thread_name(conn)
                    })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!write.is_finished(), "the write waits for the lock");
        other.execute_batch("COMMIT").unwrap();
        assert_eq!(write.await.unwrap().unwrap(), "contexture-sqlite-writer");
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_while_committing_leaves_no_transaction_open_for_the_next_write() {
        // The rollback hook panics once, in the middle of a batch: outside the writes' own
        // `catch_unwind`, so the commit's lock is poisoned with the transaction open.
        let panicked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let once = panicked.clone();
        let on_rollback: OnRollback = Box::new(move || {
            if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                panic!("a rollback hook panicked");
            }
        });
        let writer = std::sync::Arc::new(Writer::start(table(), None, on_rollback).unwrap());
        let failing = {
            let writer = writer.clone();
            tokio::spawn(async move {
                writer
                    .write(|conn| {
                        insert(conn, 1)?;
                        insert(conn, 1)
                    })
                    .await
            })
        };
        assert!(failing.await.is_err(), "the caller's commit panicked");
        assert!(panicked.load(std::sync::atomic::Ordering::SeqCst));
        // The next write begins a transaction of its own and commits; the failed one left
        // nothing.
        let stored = writer.write(|conn| {
            insert(conn, 2)?;
            ids(conn)
        });
        assert_eq!(stored.await.unwrap(), vec![2]);
    }

    #[tokio::test]
    async fn on_a_single_threaded_runtime_every_write_goes_through_the_writer_thread() {
        let writer = Writer::start(table(), None, Box::new(|| {})).unwrap();
        assert_eq!(
            writer.write(thread_name).await.unwrap(),
            "contexture-sqlite-writer"
        );
    }

    on_both_runtimes!(every_answered_write_is_in_the_file_once_the_writer_is_closed);
    async fn every_answered_write_is_in_the_file_once_the_writer_is_closed() {
        // Each kind of runtime runs this test in a directory of its own.
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        let dir = std::env::temp_dir().join(format!(
            "contexture-writer-{}-{flavor:?}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("drop.db");
        let _ = std::fs::remove_file(&path);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        let writer = std::sync::Arc::new(Writer::start(conn, None, Box::new(|| {})).unwrap());
        let writes: Vec<_> = (0..50)
            .map(|id| {
                let writer = writer.clone();
                tokio::spawn(async move { writer.write(move |conn| insert(conn, id)).await })
            })
            .collect();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        drop(writer);
        let count: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 50);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
