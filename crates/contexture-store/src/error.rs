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
    /// A conditional append ([`crate::Store::append_after`]) found the thread moved on:
    /// another write came after the event it was built on. Nothing was stored.
    #[error(
        "thread `{thread}` moved on: the append was built on its event {expected}, but its last event is {last_seq}"
    )]
    Moved {
        /// The thread.
        thread: String,
        /// The last seq the append was built on (0: a thread with no events).
        expected: u64,
        /// The thread's last seq when the append was refused.
        last_seq: u64,
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
    /// A stored calibration of token estimates cannot be read back.
    #[error("the calibration of model `{model}` is unreadable: {detail}")]
    CorruptCalibration {
        /// The model family.
        model: String,
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
    /// The database failed: the driver's error, with what the store was doing.
    #[error("{backend}: {action}: {source}")]
    Database {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// What the store was doing.
        action: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The database file could not be created.
    #[error("cannot create the database file {}: {source}", path.display())]
    CreateFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
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
    /// A run's writes were refused because the server running it no longer holds its lease
    /// in the execution queue: another server may have adopted the run, and two writers of
    /// one log would fork its history.
    #[error(
        "the lease of execution `{execution}` ran out or was lost: another server may be running it now, so nothing more of it is written here"
    )]
    LeaseLost {
        /// The execution (its id in the whole store).
        execution: String,
    },
    /// A blocking database task panicked or was cancelled.
    #[error("database task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl StoreError {
    /// The fields of the error that name a thread, for a view of the store that maps ids
    /// (a tenant's) to change them all in one place.
    pub fn thread_ids_mut(&mut self) -> Vec<&mut String> {
        match self {
            StoreError::ThreadFull { thread, .. }
            | StoreError::ThreadTooLarge { thread, .. }
            | StoreError::NotFound { thread }
            | StoreError::AlreadyExists { thread }
            | StoreError::Moved { thread, .. }
            | StoreError::InvalidEvent { thread, .. }
            | StoreError::ForkedEventAppended { thread }
            | StoreError::Corrupt { thread, .. }
            | StoreError::Replay { thread, .. } => vec![thread],
            StoreError::ForkBeyondEnd { parent, .. } => vec![parent],
            StoreError::HasForks { thread, forks } => {
                std::iter::once(thread).chain(forks.iter_mut()).collect()
            }
            StoreError::KeyExists { .. }
            | StoreError::CorruptCalibration { .. }
            | StoreError::InvalidUrl { .. }
            | StoreError::Migration { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Database { .. }
            | StoreError::CreateFile { .. }
            | StoreError::WritePanicked { .. }
            | StoreError::WriterStopped
            | StoreError::LeaseLost { .. }
            | StoreError::Task(_) => Vec::new(),
        }
    }
}

/// A database driver's error, kept opaque: the store's error type is the same whichever
/// drivers are compiled in, and callers never depend on a driver's types.
#[derive(Debug)]
pub struct DriverError(Box<dyn std::error::Error + Send + Sync>);

impl DriverError {
    /// Wraps a driver's error.
    pub(crate) fn new(error: impl std::error::Error + Send + Sync + 'static) -> DriverError {
        DriverError(Box::new(error))
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl StoreError {
    /// The database's error `source` while the store was doing `action`.
    pub(crate) fn database(
        backend: &'static str,
        action: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Database {
            backend,
            action,
            source: DriverError::new(source),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> StoreError {
        StoreError::database("postgres", "get a connection", error)
    }
}

/// Attaches "what the store was doing" to database errors.
pub(crate) trait Action<T> {
    /// Wraps the error with `action`.
    fn doing(self, action: &'static str) -> Result<T, StoreError>;
}

#[cfg(feature = "sqlite")]
impl<T> Action<T> for Result<T, rusqlite::Error> {
    fn doing(self, action: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::database("sqlite", action, source))
    }
}

#[cfg(feature = "postgres")]
impl<T> Action<T> for Result<T, tokio_postgres::Error> {
    fn doing(self, action: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::database("postgres", action, source))
    }
}
