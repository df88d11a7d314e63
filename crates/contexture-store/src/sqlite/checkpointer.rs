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
//! last. The writer restarts the log from its beginning once a checkpoint has copied all of
//! it, so the log stays about as large as [`INTERVAL`]'s writes.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::StoreError;

/// The most time between a commit and the checkpoint that copies it into the database.
pub(super) const INTERVAL: Duration = Duration::from_millis(200);

/// The handle on the checkpointing thread. Dropping it stops the thread after one last
/// checkpoint.
pub(super) struct Checkpointer {
    commits: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing on `conn`, a connection of its own to the database (in WAL mode).
    pub(super) fn start(conn: Connection) -> Result<Checkpointer, StoreError> {
        let (commits, committed) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("contexture-sqlite-checkpointer".into())
            .spawn(move || run(&conn, &committed))
            .map_err(|error| StoreError::WritePanicked {
                detail: format!("cannot start the checkpointing thread: {error}"),
            })?;
        Ok(Checkpointer {
            commits: Some(commits),
            thread: Some(thread),
        })
    }

    /// A handle the writer tells of each commit through.
    pub(super) fn notifier(&self) -> Option<mpsc::Sender<()>> {
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
/// notifier is gone.
fn run(conn: &Connection, committed: &mpsc::Receiver<()>) {
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
                    checkpoint(conn);
                }
                return;
            }
        }
        if pending && last.elapsed() >= INTERVAL {
            checkpoint(conn);
            pending = false;
            last = Instant::now();
        }
    }
}

/// One passive checkpoint. A failure (a reader in another process holding the log, a full
/// disk) leaves the frames in the log, which the next checkpoint copies: nothing is lost.
fn checkpoint(conn: &Connection) {
    if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(%error, "a checkpoint of the SQLite write-ahead log failed; the next one retries");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits on a connection that never checkpoints reach the database file anyway, and
    /// the log starts over instead of growing with every write.
    #[test]
    fn commits_reach_the_database_file_without_the_writer_checkpointing() {
        let dir = crate::testing::TempDir::new("contexture-checkpointer");
        let path = dir.join("db.sqlite");
        let open = || {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;")
                .unwrap();
            conn
        };
        let writer = open();
        writer.execute_batch("CREATE TABLE t (body TEXT)").unwrap();
        let checkpointer = Checkpointer::start(open()).unwrap();
        let committed = checkpointer.notifier().unwrap();
        let row = "x".repeat(2_000);
        let mut largest_log = 0;
        let wal = dir.join("db.sqlite-wal");
        for _ in 0..40 {
            for _ in 0..25 {
                writer.execute("INSERT INTO t VALUES (?1)", [&row]).unwrap();
                committed.send(()).unwrap();
            }
            std::thread::sleep(INTERVAL / 4);
            largest_log = largest_log.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        std::thread::sleep(INTERVAL * 3);
        let database = std::fs::metadata(&path).unwrap().len();
        // 1,000 rows of 2 KB: two megabytes in the file, where no checkpoint would have left
        // them in the log.
        assert!(
            database > 2_000_000,
            "the database file holds {database} bytes"
        );
        // The commits wrote about 8 MB to the log (two pages each); restarted after each
        // checkpoint that copied all of it, the log held what a few intervals wrote.
        assert!(
            largest_log < 3_000_000,
            "the log grew to {largest_log} bytes"
        );
        drop(committed);
        drop(checkpointer);
    }
}
