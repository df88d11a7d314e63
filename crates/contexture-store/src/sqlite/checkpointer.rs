//! Checkpoints of the write-ahead log, off the write path.
//!
//! By SQLite's default, the connection whose commit takes the log past 1,000 pages copies
//! the whole log back into the database file, and syncs it, before that commit returns: one
//! write in every thousand pages waits for all of them (tens to hundreds of milliseconds on
//! a large, busy file), which is a latency spike at the tail however fast the other writes
//! are. The store's writer turns that off (`wal_autocheckpoint = 0`), and this thread, with
//! a connection of its own, checkpoints instead: a `PASSIVE` checkpoint, which waits for no
//! reader and no writer (writes go on appending to the log meanwhile), every
//! [`INTERVAL`] while writes keep coming, each one copying only what was written since the
//! last.
//!
//! Copying is not enough to keep the log small: SQLite starts the log over from its
//! beginning only when a write begins while no reader still reads frames of it, and under
//! steady reads and writes (a server with a few dozen busy clients) some reader always
//! does, so the log would grow without end (2.3 GB in a minute of such load, against a
//! 144 MB database). Once the log holds more than [`Checkpointer::start`]'s `restart_frames`,
//! the checkpoint is a `RESTART` one instead: it holds new writes back while the readers of
//! the log's frames finish (new readers read the database file alone, the log being all
//! copied), so the next write starts the log over. Every write waits while it does, so it
//! waits for them only briefly: [`RESTART_FIRST_WAIT`] at first, twice as long after each
//! attempt that readers outlasted (a long read, a reader the machine did not schedule in
//! time), up to [`RESTART_WAIT`], trying again at the next interval meanwhile; once the log
//! starts over, the next restart waits briefly again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::StoreError;

/// The most time between a commit and the checkpoint that copies it into the database.
pub(super) const INTERVAL: Duration = Duration::from_millis(200);

/// The log's frames past which a checkpoint starts it over (64 MB of 4 KB pages).
pub(super) const RESTART_FRAMES: i64 = 16_384;

/// How long a restarting checkpoint first holds writes back waiting for readers.
pub(super) const RESTART_FIRST_WAIT: Duration = Duration::from_millis(4);

/// The longest a restarting checkpoint holds writes back waiting for readers.
pub(super) const RESTART_WAIT: Duration = Duration::from_millis(100);

thread_local! {
    /// How long the checkpointing thread's current checkpoint may wait (its connection's
    /// busy handler is a plain function, which reads it here).
    static WAIT_LIMIT: std::cell::Cell<Duration> = const { std::cell::Cell::new(RESTART_FIRST_WAIT) };
}

/// The handle on the checkpointing thread. Dropping it stops the thread after one last
/// checkpoint.
pub(super) struct Checkpointer {
    commits: Option<CommitNotifier>,
    thread: Option<JoinHandle<()>>,
}

/// How the writer tells the checkpointer of its commits. Only the first commit since the
/// checkpointer last started a checkpoint wakes it: the checkpoint it then waits to run
/// covers every commit made meanwhile, and waking it for each of them cost two thread
/// switches per commit (a fifth of a one-client chat turn's).
#[derive(Clone)]
pub(super) struct CommitNotifier {
    /// True from the first commit told until the checkpointer starts the checkpoint that
    /// covers it.
    pending: Arc<AtomicBool>,
    wake: mpsc::Sender<()>,
}

impl CommitNotifier {
    /// Tells of a commit that has returned.
    pub(super) fn committed(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            // The checkpointer may have stopped; the writes stand either way.
            let _ = self.wake.send(());
        }
    }
}

impl Checkpointer {
    /// Starts checkpointing on `conn`, a connection of its own to the database (in WAL
    /// mode), starting the log over once it holds more than `restart_frames` frames.
    pub(super) fn start(
        mut conn: Connection,
        restart_frames: i64,
    ) -> Result<Checkpointer, StoreError> {
        // Only a restarting checkpoint waits (for readers, holding writes back): briefly,
        // looking again every millisecond.
        conn.busy_handler(Some(restart_waits))
            .map_err(|error| StoreError::database("sqlite", "configure the checkpointer", error))?;
        let (wake, committed) = mpsc::channel::<()>();
        let pending = Arc::new(AtomicBool::new(false));
        let commits = CommitNotifier {
            pending: Arc::clone(&pending),
            wake,
        };
        let thread = std::thread::Builder::new()
            .name("contexture-sqlite-checkpointer".into())
            .spawn(move || run(&conn, &committed, &pending, restart_frames))
            .map_err(|error| StoreError::WritePanicked {
                detail: format!("cannot start the checkpointing thread: {error}"),
            })?;
        Ok(Checkpointer {
            commits: Some(commits),
            thread: Some(thread),
        })
    }

    /// A handle the writer tells of each commit through.
    pub(super) fn notifier(&self) -> Option<CommitNotifier> {
        self.commits.clone()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.commits.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Checkpoints at most every [`INTERVAL`] while commits come, and once more when the last
/// notifier is gone. `told` is the notifiers' [`CommitNotifier::pending`].
fn run(conn: &Connection, committed: &mpsc::Receiver<()>, told: &AtomicBool, restart_frames: i64) {
    let mut restart_wait = RESTART_FIRST_WAIT;
    let mut pending = false;
    let mut last = Instant::now();
    loop {
        let wait = if pending {
            INTERVAL.saturating_sub(last.elapsed())
        } else {
            Duration::from_secs(3600)
        };
        match committed.recv_timeout(wait) {
            Ok(()) => {
                pending = true;
                // Every commit told so far is covered by the next checkpoint.
                while committed.try_recv().is_ok() {}
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if pending {
                    checkpoint(conn, restart_frames, RESTART_WAIT);
                }
                return;
            }
        }
        if pending && last.elapsed() >= INTERVAL {
            // Cleared before the checkpoint starts: a commit made from here on wakes the
            // thread again, one made before is in the log this checkpoint copies.
            told.store(false, Ordering::Release);
            restart_wait = match checkpoint(conn, restart_frames, restart_wait) {
                Restart::Outlasted => (restart_wait * 2).min(RESTART_WAIT),
                Restart::Done | Restart::NotNeeded => RESTART_FIRST_WAIT,
            };
            pending = false;
            last = Instant::now();
        }
    }
}

/// The checkpointer's busy handler: a millisecond at a time, for at most the current
/// checkpoint's limit.
fn restart_waits(waited: i32) -> bool {
    super::wait_a_millisecond(waited, WAIT_LIMIT.get())
}

/// What became of starting the log over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// None was tried: the log was small enough to go on, or copying it failed (logged).
    NotNeeded,
    /// The log starts over at the next write.
    Done,
    /// Readers of the log's frames (or the writer, or a failure) kept it from starting over
    /// within the wait.
    Outlasted,
}

/// One passive checkpoint, then a restarting one, waiting at most `restart_wait`, when the
/// log holds more than `restart_frames` frames. A failure (a reader in another process
/// holding the log, a full disk) leaves the frames in the log, which the next checkpoint
/// copies: nothing is lost.
fn checkpoint(conn: &Connection, restart_frames: i64, restart_wait: Duration) -> Restart {
    let started = Instant::now();
    let frames = match run_checkpoint(conn, "PASSIVE") {
        Ok((_, frames, copied)) => {
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                frames,
                copied,
                "checkpointed the SQLite write-ahead log"
            );
            frames
        }
        Err(error) => {
            tracing::warn!(%error, "a checkpoint of the SQLite write-ahead log failed; the next one retries");
            return Restart::NotNeeded;
        }
    };
    if frames <= restart_frames {
        return Restart::NotNeeded;
    }
    let restarting = Instant::now();
    WAIT_LIMIT.set(restart_wait);
    let restarted = run_checkpoint(conn, "RESTART");
    WAIT_LIMIT.set(RESTART_FIRST_WAIT);
    match restarted {
        Ok((busy, frames, copied)) => {
            tracing::debug!(
                elapsed_ms = restarting.elapsed().as_millis() as u64,
                wait_ms = restart_wait.as_millis() as u64,
                restarted = busy == 0,
                frames,
                copied,
                "checkpointed the SQLite write-ahead log to start it over"
            );
            // Busy: a reader did not finish in time; the next interval tries again, waiting
            // longer.
            match busy {
                0 => Restart::Done,
                _ => Restart::Outlasted,
            }
        }
        Err(error) => {
            tracing::warn!(%error, "a checkpoint of the SQLite write-ahead log failed; the next one retries");
            Restart::Outlasted
        }
    }
}

/// `PRAGMA wal_checkpoint(mode)`: whether it was kept from finishing (1) or not (0), the
/// log's frames, and how many of them are in the database file.
fn run_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits on a connection that never checkpoints reach the database file anyway, and
    /// the log starts over instead of growing with every write.
    #[test]
    fn commits_reach_the_database_file_without_the_writer_checkpointing() {
        let logged = Logged::new("contexture-checkpointer", RESTART_FRAMES);
        let mut largest_log = 0;
        let wal = logged.wal();
        let restarts_before = log_restarts(&wal);
        for _ in 0..40 {
            for _ in 0..25 {
                logged.write();
            }
            std::thread::sleep(INTERVAL / 4);
            largest_log = largest_log.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        std::thread::sleep(INTERVAL * 3);
        let database = std::fs::metadata(&logged.path).unwrap().len();
        // 1,000 rows of 2 KB: two megabytes in the file, where no checkpoint would have left
        // them in the log.
        assert!(
            database > 2_000_000,
            "the database file holds {database} bytes"
        );
        // The commits wrote about 8 MB to the log (two pages each). Restarted after each
        // checkpoint that copied all of it, the log starts over again and again; how large
        // it gets between restarts depends on how often the checkpointer's thread runs on
        // a busy machine, so it is only held well under what was written.
        let restarts = log_restarts(&wal) - restarts_before;
        assert!(restarts >= 3, "the log started over {restarts} times");
        assert!(
            largest_log < 6_000_000,
            "the log grew to {largest_log} bytes"
        );
    }

    /// Under reads that never stop (some reader always holds frames of the log), the log
    /// still starts over once it passes the restart size, instead of growing with every
    /// write.
    #[test]
    fn the_log_starts_over_while_readers_keep_reading() {
        // 256 frames of 4 KB: 1 MB.
        let logged = Logged::new("contexture-checkpointer-readers", 256);
        // Two readers whose read transactions overlap: one of them is always reading.
        let readers = Readers::start(&logged.path, Duration::ZERO, |reader| {
            Duration::from_millis(2 + u64::from(reader))
        });
        let wal = logged.wal();
        let mut largest_log = 0;
        let first_restarts = log_restarts(&wal);
        let started = Instant::now();
        // Writes that never pause either (the log is never all copied when a read begins):
        // about 40 MB written to the log, 160 times the restart size.
        for write in 0..8_000 {
            logged.write();
            std::thread::sleep(Duration::from_micros(150));
            if write % 100 == 0 {
                largest_log = largest_log.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            }
        }
        let restarts = log_restarts(&wal) - first_restarts;
        let reads = readers.stop();
        assert!(reads > 100, "the readers read {reads} times");
        drop(logged);
        // The log restarts past 1 MB, checked every interval: a restart every interval or
        // two while the writes go on (how many depends on how the machine schedules the
        // threads, which the tests running beside this one share), and the log never held
        // more than part of what was written. Without the restarting checkpoint the log
        // never starts over and holds all 40 MB.
        let elapsed = started.elapsed();
        assert!(
            restarts >= 3,
            "the log started over {restarts} times in {elapsed:?}"
        );
        assert!(
            largest_log < 25_000_000,
            "the log grew to {largest_log} bytes in {elapsed:?}, starting over {restarts} times"
        );
    }

    /// Readers that each read for longer than a restart first waits, one of them always
    /// reading: the restarts wait longer each time until they outlast them, and the log
    /// starts over. With the first wait kept, it never would (a restart needs every reader
    /// of the log's frames gone, and one of two readers staggered by half their 24 ms always
    /// has 12 ms or more to go).
    #[test]
    fn restarts_wait_longer_for_readers_that_outlast_them() {
        const READ_FOR: Duration = Duration::from_millis(24);
        assert!(READ_FOR / 2 > RESTART_FIRST_WAIT * 2);
        let logged = Logged::new("contexture-checkpointer-long-readers", 64);
        let readers = Readers::start(&logged.path, READ_FOR / 2, |_| READ_FOR);
        let wal = logged.wal();
        let first_restarts = log_restarts(&wal);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            logged.write();
            std::thread::sleep(Duration::from_micros(500));
        }
        let restarts = log_restarts(&wal) - first_restarts;
        readers.stop();
        drop(logged);
        assert!(restarts >= 2, "the log started over {restarts} times");
    }

    /// A database in WAL mode that never checkpoints by itself, holding a table `t`, and a
    /// checkpointer on it. Its log is not synced: these tests are about its size.
    struct Logged {
        // Dropped in this order: the checkpointer's thread ends once the last notifier is
        // gone, and the directory goes after every connection to the file in it.
        writer: Connection,
        committed: CommitNotifier,
        _checkpointer: Checkpointer,
        path: std::path::PathBuf,
        _dir: crate::testing::TempDir,
    }

    impl Logged {
        fn new(name: &str, restart_frames: i64) -> Logged {
            let dir = crate::testing::TempDir::new(name);
            let path = dir.join("db.sqlite");
            let writer = open_unsynced(&path);
            writer
                .execute_batch("CREATE TABLE t (body TEXT); INSERT INTO t VALUES ('first');")
                .unwrap();
            let checkpointer = Checkpointer::start(open_unsynced(&path), restart_frames).unwrap();
            Logged {
                committed: checkpointer.notifier().unwrap(),
                _checkpointer: checkpointer,
                writer,
                path,
                _dir: dir,
            }
        }

        fn wal(&self) -> std::path::PathBuf {
            self.path.with_extension("sqlite-wal")
        }

        /// Commits a row of 2 KB and tells the checkpointer.
        fn write(&self) {
            self.writer
                .execute("INSERT INTO t VALUES (?1)", [&"x".repeat(2_000)])
                .unwrap();
            self.committed.committed();
        }
    }

    fn open_unsynced(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = OFF;",
        )
        .unwrap();
        conn
    }

    /// Two readers of `t`, reading again and again until stopped, each read transaction
    /// held for `read_for(reader)`; the second starts `stagger` after the first.
    struct Readers {
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        threads: Vec<JoinHandle<u64>>,
    }

    impl Readers {
        fn start(
            path: &std::path::Path,
            stagger: Duration,
            read_for: fn(u32) -> Duration,
        ) -> Readers {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let threads = (0..2)
                .map(|reader| {
                    let conn = open_unsynced(path);
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(stagger * reader);
                        let mut reads = 0u64;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            conn.execute_batch("BEGIN").unwrap();
                            let _: i64 = conn
                                .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
                                .unwrap();
                            std::thread::sleep(read_for(reader));
                            conn.execute_batch("COMMIT").unwrap();
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            Readers { stop, threads }
        }

        /// Stops the readers; how many reads they made.
        fn stop(self) -> u64 {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            self.threads
                .into_iter()
                .map(|reader| reader.join().unwrap())
                .sum()
        }
    }

    /// How many times the log at `wal` has started over since it was created: its header's
    /// checkpoint sequence number, which each restart raises by one.
    fn log_restarts(wal: &std::path::Path) -> u32 {
        use std::io::Read;
        let mut header = [0u8; 16];
        std::fs::File::open(wal)
            .and_then(|mut file| file.read_exact(&mut header))
            .expect("the log has a header");
        u32::from_be_bytes([header[12], header[13], header[14], header[15]])
    }
}
