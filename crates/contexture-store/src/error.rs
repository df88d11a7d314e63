//! The store's error type.

use contexture_core::thread::ThreadError;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An append would take the thread past the store's limit on events per thread.
    #[error("thread `{thread}` is full: it may hold at most {max_events} events")]
    ThreadFull {
        /// The thread.
        thread: String,
        /// The limit.
        max_events: u64,
    },
    /// An append would take the thread past the store's limit on the bytes of its events.
    #[error("thread `{thread}` is full: it may hold at most {max_bytes} bytes of events")]
    ThreadTooLarge {
        /// The thread.
        thread: String,
        /// The limit.
        max_bytes: u64,
    },
    /// The thread does not exist.
    #[error("thread `{thread}` not found")]
    NotFound {
        /// The thread.
        thread: String,
    },
    /// A thread with this id already exists.
    #[error("thread `{thread}` already exists")]
    AlreadyExists {
        /// The thread.
        thread: String,
    },
    /// An API key with this id, or with the same key hash, is already stored (revoked keys
    /// included); nothing was written.
    #[error("API key `{id}` not created: a key with this id or this key hash already exists")]
    KeyExists {
        /// The id of the key that was not created.
        id: String,
    },
    /// A fork point after the parent's last event.
    #[error("cannot fork `{parent}` at seq {at_seq}: its last seq is {last_seq}")]
    ForkBeyondEnd {
        /// The parent.
        parent: String,
        /// The fork point asked for.
        at_seq: u64,
        /// The parent's last seq.
        last_seq: u64,
    },
    /// The thread has forks, which read its events.
    #[error("thread `{thread}` has forks ({}); delete them first", forks.join(", "))]
    HasForks {
        /// The thread.
        thread: String,
        /// Its forks.
        forks: Vec<String>,
    },
    /// An event cannot be appended at the seq it would get.
    #[error("thread `{thread}`: {source}")]
    InvalidEvent {
        /// The thread.
        thread: String,
        /// What is wrong with it.
        #[source]
        source: ThreadError,
    },
    /// `forked` events are written by [`crate::Store::fork`] only.
    #[error("thread `{thread}`: a `forked` event cannot be appended; use fork")]
    ForkedEventAppended {
        /// The thread.
        thread: String,
    },
    /// A stored event cannot be read back.
    #[error("thread `{thread}`, event {seq}: stored event is unreadable: {detail}")]
    Corrupt {
        /// The thread.
        thread: String,
        /// The event's seq.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// The stored events do not replay into a thread.
    #[error("thread `{thread}` does not replay: {source}")]
    Replay {
        /// The thread.
        thread: String,
        /// The first event that failed.
        #[source]
        source: ThreadError,
    },
    /// A database URL that is not understood.
    #[error("invalid database URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A migration failed.
    #[error("{backend} migration {version} failed: {detail}")]
    Migration {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// The migration's number.
        version: u32,
        /// The database's error.
        detail: String,
    },
    /// The database is at a schema version newer than this build knows.
    #[error("{backend} database is at schema version {found}, newer than this build's {known}")]
    SchemaTooNew {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// The database's version.
        found: u32,
        /// The newest version this build knows.
        known: u32,
    },
    /// An SQLite error.
    #[error("sqlite: {action}: {source}")]
    Sqlite {
        /// What the store was doing.
        action: &'static str,
        /// The error.
        #[source]
        source: rusqlite::Error,
    },
    /// A PostgreSQL error.
    #[error("postgres: {action}: {source}")]
    Postgres {
        /// What the store was doing.
        action: &'static str,
        /// The error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// No PostgreSQL connection could be taken from the pool.
    #[error("postgres: cannot get a connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A write panicked; its savepoint was rolled back, so nothing of it was stored.
    #[error("a database write panicked and was rolled back: {detail}")]
    WritePanicked {
        /// The panic's message.
        detail: String,
    },
    /// The SQLite writer thread is gone (it can only stop by panicking outside a write), so
    /// the write was not done.
    #[error("the SQLite writer thread has stopped; the write was not done")]
    WriterStopped,
    /// A blocking database task panicked or was cancelled.
    #[error("database task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Attaches "what the store was doing" to database errors.
pub(crate) trait Action<T> {
    /// Wraps the error with `action`.
    fn doing(self, action: &'static str) -> Result<T, StoreError>;
}

impl<T> Action<T> for Result<T, rusqlite::Error> {
    fn doing(self, action: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sqlite { action, source })
    }
}

impl<T> Action<T> for Result<T, tokio_postgres::Error> {
    fn doing(self, action: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Postgres { action, source })
    }
}
