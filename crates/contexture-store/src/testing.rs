//! Test support for the crates that test against real databases (feature `testing`): a
//! temporary directory, unique names, and a fresh PostgreSQL schema per test.
//!
//! PostgreSQL is reached at `CONTEXTURE_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When it cannot be reached, [`pg_store`]
//! panics under `CI=true` and otherwise returns `None` after a loud message, so a developer
//! without PostgreSQL sees that tests were skipped and CI never skips silently.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{PgStore, SqliteStore, StoreError};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call, starting with `prefix` (usable as a schema or
/// thread name: letters, digits and underscores when `prefix` is).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A temporary directory, removed with everything in it when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory under the system's temporary directory.
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The PostgreSQL URL of the test database.
pub fn pg_url() -> String {
    std::env::var("CONTEXTURE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The Redis server tests use: `CONTEXTURE_TEST_REDIS`, or the local default, when it
/// answers a connection. `None`, after a loud message, when it does not outside CI; a panic
/// under `CI=true`.
pub fn redis_url() -> Option<String> {
    let url = std::env::var("CONTEXTURE_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let address = url
        .trim_start_matches("redis://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_string();
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&address)
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2))
                .is_ok()
        });
    if reachable {
        return Some(url);
    }
    if in_ci() {
        panic!("CI=true and Redis at {url} is unreachable");
    }
    eprintln!(
        "\n!!! SKIPPING a Redis test: {url} is unreachable. \
         Set CONTEXTURE_TEST_REDIS; under CI=true this fails.\n"
    );
    None
}

/// True when `CI=true`: unreachable services fail tests instead of skipping them.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A store in a fresh schema of the test database (drop it with [`PgStore::drop_schema`]),
/// with the schema's name. `None`, after a loud message, when PostgreSQL is unreachable
/// outside CI; a panic under `CI=true`.
pub async fn pg_store(prefix: &str) -> Option<(PgStore, String)> {
    let schema = unique(prefix);
    match PgStore::open_in_schema(&pg_url(), &schema).await {
        Ok(store) => Some((store, schema)),
        Err(error) => unreachable_pg(error),
    }
}

/// What a test does when PostgreSQL cannot be reached: panics under `CI=true`, otherwise
/// says loudly that the test is skipped.
fn unreachable_pg<T>(error: StoreError) -> Option<T> {
    if in_ci() {
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

/// Makes the SQLite database at `path` refuse, with a database error, every event of
/// `kind` (`step_finished`, say) stored from now on, as a database refuses a value it cannot
/// hold: for tests of what a run does on a database error of its own while the database
/// still answers. Stores already open on the file see the change at their next statement.
pub fn sqlite_refuse_events_of_kind(path: &Path, kind: &str) -> Result<(), StoreError> {
    let conn = rusqlite::Connection::open(path)
        .map_err(|error| StoreError::database("sqlite", "open the database", error))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|error| StoreError::database("sqlite", "open the database", error))?;
    let kind = kind.replace('\'', "''");
    conn.execute_batch(&format!(
        "CREATE TRIGGER IF NOT EXISTS refuse_{name} BEFORE INSERT ON events \
         WHEN NEW.kind = '{kind}' BEGIN SELECT RAISE(ABORT, 'refused by a test'); END;",
        name = kind.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ))
    .map_err(|error| StoreError::database("sqlite", "add a refusing trigger", error))
}

/// Opens (creating when missing) the SQLite database at `path` as a build that knows only the
/// migrations up to `version` would: for tests that a new migration applies to a database an
/// older build left. A database at a newer version is refused with
/// [`StoreError::SchemaTooNew`], as that build would refuse it.
pub fn open_sqlite_at_version(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
    SqliteStore::open_at_version(path, version)
}

/// Like [`pg_store`], as a build that knows only the migrations up to `version` would (see
/// [`open_sqlite_at_version`]).
pub async fn pg_store_at_version(prefix: &str, version: u32) -> Option<(PgStore, String)> {
    let schema = unique(prefix);
    match PgStore::open_in_schema_at_version(&pg_url(), &schema, version).await {
        Ok(store) => Some((store, schema)),
        Err(error) => unreachable_pg(error),
    }
}

/// Opens `schema` of the test database as a build that knows only the migrations up to
/// `version` would (see [`open_sqlite_at_version`]).
pub async fn open_pg_at_version(schema: &str, version: u32) -> Result<PgStore, StoreError> {
    PgStore::open_in_schema_at_version(&pg_url(), schema, version).await
}

/// The bytes the SQLite database at `path` takes on disk once its write-ahead log is
/// checkpointed into it: the file, as a copy of it would take.
pub fn sqlite_disk_bytes(path: &Path) -> u64 {
    let conn = rusqlite::Connection::open(path).expect("open the database");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint the log");
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .expect("count pages");
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("read the page size");
    u64::try_from(pages * page_size).unwrap_or(0)
}

/// The bytes of event bodies of each kind in the SQLite database at `path`, most first: where
/// a thread's storage goes, for a test's log.
pub fn sqlite_body_bytes_by_kind(path: &Path) -> Vec<(String, u64)> {
    let conn = rusqlite::Connection::open(path).expect("open the database");
    let mut select = conn
        .prepare(
            "SELECT kind, SUM(length(CAST(body AS BLOB))) FROM events
             GROUP BY kind ORDER BY 2 DESC, 1",
        )
        .expect("prepare the sum");
    select
        .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)?)))
        .expect("sum the bodies")
        .map(|row| {
            let (kind, bytes) = row.expect("read a sum");
            (kind, u64::try_from(bytes).unwrap_or(0))
        })
        .collect()
}

/// The bytes the threads of `schema` (of the test database) take on disk, after a `VACUUM`
/// that frees what superseded row versions took: the `events` table whole (its indexes,
/// out-of-line (TOAST) storage and maps included) and the `threads` table's rows. (That
/// table's own pages and indexes hold one row per thread; an append updates the row, which
/// leaves index entries that only a later vacuum reuses, whatever the thread holds.)
pub async fn pg_disk_bytes(schema: &str) -> u64 {
    let mut config: tokio_postgres::Config = pg_url().parse().expect("the test URL");
    config.options(format!("-c search_path={schema}"));
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    let driver = tokio::spawn(connection);
    for table in ["threads", "events"] {
        client
            .batch_execute(&format!("VACUUM {table}"))
            .await
            .expect("vacuum");
    }
    let bytes: i64 = client
        .query_one(
            "SELECT (pg_total_relation_size('events')
                     + (SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM threads t))::BIGINT",
            &[],
        )
        .await
        .expect("measure the tables")
        .get(0);
    // Where the bytes are, for a test that finds too many.
    let parts = client
        .query(
            "SELECT c.relname::TEXT, pg_relation_size(c.oid)::BIGINT FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() OR c.oid IN (
                 SELECT reltoastrelid FROM pg_class t JOIN pg_namespace tn ON tn.oid = t.relnamespace
                 WHERE tn.nspname = current_schema())
             ORDER BY 2 DESC",
            &[],
        )
        .await
        .expect("measure the relations");
    let parts: Vec<String> = parts
        .iter()
        .map(|row| format!("{} {}", row.get::<_, String>(0), row.get::<_, i64>(1)))
        .collect();
    eprintln!("{schema}: {}", parts.join(", "));
    drop(client);
    let _ = driver.await;
    u64::try_from(bytes).unwrap_or(0)
}

/// A text of about `len` bytes that differs with `n`: what the storage tests and benchmarks
/// write as conversations (`benches/storage/langgraph_chat.py` writes the same texts).
pub fn prose(n: usize, len: usize) -> String {
    let words = [
        "context", "window", "thread", "model", "request", "message", "store", "fit",
    ];
    let mut text = format!("turn {n}:");
    let mut i = n;
    while text.len() < len {
        text.push(' ');
        text.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    text
}

/// The length of message `n` of those conversations: 40 to 1,000 bytes, most of them short.
pub fn message_length(n: usize) -> usize {
    40 + (n * 7919) % 960 * ((n % 3) + 1) / 3
}
