//! Durable thread storage: the [`Store`] trait with SQLite (`SqliteStore`, the embedded
//! default; feature `sqlite`) and PostgreSQL (`PgStore`; feature `postgres`)
//! implementations, and `AnyStore`, either one chosen by URL. Both features are on by
//! default; a crate that needs only the trait (the workflow engine) turns them off, and
//! database errors reach callers wrapped ([`DriverError`]) whichever drivers are built.
//!
//! A store keeps each thread's append-only event log (see [`contexture_core::thread`]) and
//! rebuilds threads by replaying it. Guarantees, the same for both stores and checked by one
//! conformance suite (`tests/conformance.rs`):
//! - an append is one transaction, acknowledged only after it commits;
//! - concurrent appends to one thread, from many tasks or many processes, get unique,
//!   gap-free seqs starting at 1 (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: a row lock on the
//!   thread);
//! - an event may carry an idempotency key: a retry with the same key stores nothing and
//!   returns the seq assigned the first time;
//! - a fork records only its parent and fork point; reading it walks the parent's prefix;
//! - each message's token counts, per encoding, are computed once at append time and stored,
//!   so loading a thread never re-tokenizes;
//! - migrations are numbered SQL files under `migrations/`, applied on open;
//! - a thread that has forks is never deleted out from under them: [`Store::delete`] refuses
//!   with [`StoreError::HasForks`], and [`Store::prune`] removes idle forks before their
//!   parents and keeps a parent while any fork of it is kept.
//!
//! Both stores also keep the HTTP server's API keys ([`ApiKeyStore`], by the hash of the
//! key), each thread's queue of chat turns ([`TurnQueueStore`], so that turns on one thread
//! run one at a time across servers) and answer a cheap health check ([`Store::ping`]).

// Without a backend, the helpers the backends share have no user.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

mod api_keys;
mod bounded_map;
mod calibration;
mod derived_numbers;
mod error;
mod execution_queue;
mod forks;
mod leased;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod projection_cache;
mod rate_limits;
mod record;
#[cfg(feature = "redis")]
mod redis_rate_limits;
mod referable_cache;
mod request_refs;
mod retention;
mod scoped;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tail;
#[cfg(all(feature = "testing", feature = "sqlite", feature = "postgres"))]
pub mod testing;
mod turn_queue;
mod untyped_bodies;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod url;

use std::future::Future;
use std::time::SystemTime;

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, EventKind, Projection, Thread};
use contexture_core::tokens::Encoding;

pub use api_keys::{ApiKeyRecord, ApiKeyStore};
pub use error::{DriverError, StoreError};
pub use execution_queue::{
    ExecutionClaim, ExecutionQueueStore, PRUNE_BATCH, QueueCounts, QueueHold, QueueState,
    QueuedExecution, RunEndStore,
};
pub use leased::{HeldLease, Leased};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
pub use projection_cache::DEFAULT_PROJECTION_CACHE_BYTES;
pub use rate_limits::{RateLimit, RateLimitStore};
#[cfg(feature = "redis")]
pub use redis_rate_limits::{REDIS_KEY_PREFIX, RedisRateLimits};
pub use retention::{
    RequestPruneReport, RequestRetention, RequestsPruned, RetentionError, RetentionRules,
};
pub use scoped::{Scoped, Tenant, TenantNameError, tenant_of};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use tail::ProjectionTail;
pub use turn_queue::{JoinedTurn, TurnQueueStore, TurnTicket};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use url::{AnyStore, StoreUrl};

/// An event to append, with an optional idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// What happened.
    pub kind: EventKind,
    /// A key unique within the thread: appending an event with a key already stored stores
    /// nothing and returns the seq assigned the first time.
    pub idempotency_key: Option<String>,
}

impl NewEvent {
    /// An event without an idempotency key.
    pub fn new(kind: EventKind) -> NewEvent {
        NewEvent {
            kind,
            idempotency_key: None,
        }
    }

    /// Builder: sets the idempotency key.
    pub fn with_key(mut self, key: impl Into<String>) -> NewEvent {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The events appending `messages` in order; with a request's idempotency `key`, the
    /// i-th (from 0) is keyed `KEY:i`, so a retry of the request, through any door, stores
    /// each message once.
    pub fn messages(
        messages: impl IntoIterator<Item = contexture_core::Message>,
        key: Option<&str>,
    ) -> Vec<NewEvent> {
        messages
            .into_iter()
            .enumerate()
            .map(|(i, message)| {
                let event = NewEvent::new(EventKind::MessageAppended { message });
                match key {
                    Some(key) => event.with_key(format!("{key}:{i}")),
                    None => event,
                }
            })
            .collect()
    }
}

impl From<EventKind> for NewEvent {
    fn from(kind: EventKind) -> NewEvent {
        NewEvent::new(kind)
    }
}

/// An event found by its idempotency key ([`Store::keyed_event`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedEvent {
    /// The event.
    pub event: Event,
    /// When it was appended, in milliseconds since the Unix epoch (the clock of the machine
    /// that appended it).
    pub appended_at_ms: i64,
}

/// An event's place and type, without what it holds ([`Store::outlines_through`]): what
/// a read of where a thread's turns are needs, at a fraction of reading the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutline {
    /// The event's seq.
    pub seq: u64,
    /// Its type.
    pub event_type: contexture_core::thread::EventType,
    /// For a request's record or end, the request's id.
    pub request_id: Option<String>,
}

impl EventOutline {
    /// The outline of `event`.
    pub fn of(event: &Event) -> EventOutline {
        EventOutline {
            seq: event.seq,
            event_type: event.kind.event_type(),
            request_id: match &event.kind {
                EventKind::RequestStarted(record) => Some(record.request_id.clone()),
                EventKind::RequestEnded(end) => Some(end.request_id.clone()),
                _ => None,
            },
        }
    }
}

/// A page of a thread's events ([`Store::events_page`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventPage {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// True when the thread has events after the page's last.
    pub more: bool,
}

/// The bytes of `event` as JSON, counted without keeping them.
fn json_size(event: &Event) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and events always serialize.
    let _ = serde_json::to_writer(&mut count, event);
    count.0
}

/// A summary of one stored thread.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ThreadInfo {
    /// The thread's id.
    pub id: String,
    /// The thread it was forked from, when it is a fork.
    pub parent: Option<String>,
    /// The parent's last seq it shares, when it is a fork.
    pub fork_seq: Option<u64>,
    /// The seq of its last event (a fork's seqs continue its parent's prefix).
    pub last_seq: u64,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When it was last appended to, in milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
    /// The bytes of its events as stored (their JSON bodies), its fork prefix included.
    pub bytes: u64,
    /// The bytes of its messages as stored, each once (the bodies of its `message_appended`
    /// events), its fork prefix included: the text it holds. `bytes` less this is what the
    /// rest of its log (request records, runs, store changes) costs.
    pub message_bytes: u64,
    /// Its own retention policy for request records, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<RequestRetention>,
    /// True when it is an execution's log: its own first event (seq 1, it not being a fork)
    /// is a `run_started` event. False for forks and plain threads. Left out of the JSON, so
    /// that what the HTTP API answers does not change.
    #[serde(skip)]
    pub execution: bool,
}

/// Where a page of [`Store::list_recent`] continues: after the thread last appended to at
/// `updated_at_ms` with id `id` (the last of the previous page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentCursor {
    /// The last thread's [`ThreadInfo::updated_at_ms`].
    pub updated_at_ms: i64,
    /// The last thread's id.
    pub id: String,
}

impl RecentCursor {
    /// The cursor that continues after `info`.
    pub fn after(info: &ThreadInfo) -> RecentCursor {
        RecentCursor {
            updated_at_ms: info.updated_at_ms,
            id: info.id.clone(),
        }
    }
}

/// A cursor as text, `MILLISECONDS:ID` (what a page's link carries).
impl std::fmt::Display for RecentCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.updated_at_ms, self.id)
    }
}

/// Text that is not a cursor ([`RecentCursor`]'s `MILLISECONDS:ID`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a place in the list (MILLISECONDS:ID, as the list's links give it)")]
pub struct NotACursor;

impl std::str::FromStr for RecentCursor {
    type Err = NotACursor;

    fn from_str(text: &str) -> Result<RecentCursor, NotACursor> {
        let (ms, id) = text.split_once(':').ok_or(NotACursor)?;
        Ok(RecentCursor {
            updated_at_ms: ms.parse().map_err(|_| NotACursor)?,
            id: id.to_owned(),
        })
    }
}

/// `text` with ASCII letters lowercased: what [`Store::list_recent`] matches `contains`
/// against (other letters keep their case, the same in every store).
pub(crate) fn ascii_folded(text: &str) -> String {
    text.to_ascii_lowercase()
}

/// The 1-based character position where an id under `prefix` goes on past it: where
/// [`Store::list_recent`] looks for `contains` (SQL's `substr` counts characters).
pub(crate) fn past_prefix(prefix: &str) -> i64 {
    i64::try_from(prefix.chars().count())
        .unwrap_or(i64::MAX)
        .saturating_add(1)
}

/// The least string above every string that starts with `prefix` (`None`: there is none
/// to bound with, the prefix being empty), for a range scan of a prefix.
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        if let Some(next) = char::from_u32(u32::from(last) + 1) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// What [`Store::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// Threads deleted (forks before their parents).
    pub deleted: Vec<String>,
    /// Idle threads kept because a fork of theirs is kept.
    pub kept_for_forks: Vec<String>,
}

/// Durable storage of thread event logs. See the crate documentation for the guarantees.
pub trait Store: Send + Sync {
    /// Appends `events` to `thread` in one transaction, creating the thread when it does not
    /// exist, and returns the seq of each event (for a retried idempotency key, the seq stored
    /// the first time). Returns only after the transaction committed.
    fn append(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// Appends `events` to `thread` as [`Store::append`] does, but only when the thread's
    /// last event is still the one at seq `after` (0: the thread does not exist yet or holds
    /// no events): the write of a caller that read the thread and built these events on what
    /// it read. When another write came first, nothing is stored and the error is
    /// [`StoreError::Moved`].
    fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// Every event of `thread`, oldest first; for a fork, the parent's events up to the fork
    /// point come first.
    fn events(&self, thread: &str) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// True when `thread` exists (it was appended to or forked, and not deleted since).
    fn exists(&self, thread: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The events of `thread` with seq above `after`, oldest first (as [`Store::events`]
    /// gives them): what a reader that has folded the log up to `after` is missing.
    fn events_after(
        &self,
        thread: &str,
        after: u64,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// The events of `thread` with seq above `after` and at most `through`, oldest first, as
    /// [`Store::events_after`] gives them.
    fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// The outlines of the events [`Store::events_through`] reads (seq above `after`, at
    /// most `through`, a fork's shared prefix included), oldest first, without decoding
    /// what the events hold: a request record's messages are not resolved, a message not
    /// even read.
    fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> impl Future<Output = Result<Vec<EventOutline>, StoreError>> + Send;

    /// A page of `thread`'s events with seq above `after`, oldest first: at most `limit`
    /// events, and no more of them than fit `max_bytes` as JSON, the first always (an event
    /// is as large as what it holds: a request record as the messages it sent). The
    /// events are read a few at a time, so what a page costs is bounded by its bytes, not
    /// by the thread.
    fn events_page(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> impl Future<Output = Result<EventPage, StoreError>> + Send {
        async move {
            const CHUNK: u64 = 16;
            let mut page = EventPage::default();
            let mut bytes = 0usize;
            let mut cursor = after;
            while page.events.len() < limit {
                let want = CHUNK.min((limit - page.events.len()) as u64);
                let chunk = self
                    .events_through(thread, cursor, cursor.saturating_add(want))
                    .await?;
                if chunk.is_empty() {
                    return Ok(page);
                }
                for event in chunk {
                    let size = json_size(&event);
                    if !page.events.is_empty() && bytes.saturating_add(size) > max_bytes {
                        page.more = true;
                        return Ok(page);
                    }
                    bytes = bytes.saturating_add(size);
                    cursor = event.seq;
                    page.events.push(event);
                }
            }
            page.more = !self
                .events_through(thread, cursor, cursor.saturating_add(1))
                .await?
                .is_empty();
            Ok(page)
        }
    }

    /// The event of `thread` (its own, not a fork's parent's) that was appended with the
    /// idempotency key `key`, if one was, and when: what a retried request finds of its
    /// first attempt.
    fn keyed_event(
        &self,
        thread: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<KeyedEvent>, StoreError>> + Send;

    /// Creates `child` as a fork of `parent` after the parent's event `at_seq` (0 forks before
    /// the first event) and returns the seq of the child's `forked` event (`at_seq + 1`).
    /// Nothing is copied.
    fn fork(
        &self,
        parent: &str,
        at_seq: u64,
        child: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Every thread, by id.
    fn list(&self) -> impl Future<Output = Result<Vec<ThreadInfo>, StoreError>> + Send {
        self.list_page("", "", usize::MAX)
    }

    /// A page of the threads whose ids start with `prefix`: those after `after` (every one
    /// when empty), in byte order of their ids, at most `limit`.
    fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ThreadInfo>, StoreError>> + Send;

    /// A page of the threads whose ids start with `prefix` and whose id, past the prefix,
    /// holds `contains` as a literal substring (empty: every one; case-insensitive for ASCII
    /// letters, other letters compared as they are), newest first: by last append
    /// (`updated_at_ms`) descending, then id (its bytes) descending; those after `before`
    /// (none: from the newest), at most `limit`. Pages follow each other with
    /// [`RecentCursor::after`] the last of a page; a thread appended to meanwhile moves to
    /// the front, so a walk of pages may miss or repeat it.
    fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ThreadInfo>, StoreError>> + Send;

    /// The forks of `thread` (the threads whose parent it is; not their own forks), oldest
    /// first (by creation, then id). Empty when it has none; [`StoreError::NotFound`] when
    /// `thread` does not exist.
    fn forks_of(
        &self,
        thread: &str,
    ) -> impl Future<Output = Result<Vec<ThreadInfo>, StoreError>> + Send;

    /// The summary of `thread` (its sizes, fork point, retention policy), when it exists.
    fn thread_info(
        &self,
        thread: &str,
    ) -> impl Future<Output = Result<Option<ThreadInfo>, StoreError>> + Send {
        async move {
            // Among the ids that start with a thread's id, its own sorts first.
            let page = self.list_page(thread, "", 1).await?;
            Ok(page.into_iter().find(|info| info.id == thread))
        }
    }

    /// Deletes `thread` and its events. Refuses with [`StoreError::HasForks`] when forks
    /// of it exist (they read its events); delete or prune the forks first.
    fn delete(&self, thread: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes every thread last appended to before `idle_before`, forks before their
    /// parents; a thread with a fork that is kept is kept too, and reported.
    fn prune(
        &self,
        idle_before: SystemTime,
    ) -> impl Future<Output = Result<PruneReport, StoreError>> + Send {
        self.prune_under("", idle_before)
    }

    /// [`Store::prune`] of the threads whose ids start with `prefix` (as
    /// [`Store::list_page`] selects them); a thread kept for a fork is kept whatever the
    /// fork's id.
    fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> impl Future<Output = Result<PruneReport, StoreError>> + Send;

    /// Sets `thread`'s own retention policy for its request records (`None` clears it):
    /// [`Store::prune_requests`] applies it before any rule. Refuses an unknown thread.
    fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes the messages of `thread`'s own request records that `retention` no longer
    /// keeps at `now`, except those a kept record (of the thread or of a fork of it) takes
    /// a message from; message events are never touched. Works through the records in
    /// short transactions of a few dozen to a hundred or so records.
    fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> impl Future<Output = Result<RequestsPruned, StoreError>> + Send;

    /// Prunes the request records of every thread with a policy: its own, else the one
    /// `rules` give it by its id in the whole store (see [`Store::global_id`]; through a
    /// tenant's view, the tenant's threads only) (see [`Store::prune_thread_requests`]). A
    /// thread deleted meanwhile is passed over.
    fn prune_requests(
        &self,
        rules: &RetentionRules,
        now: SystemTime,
    ) -> impl Future<Output = Result<RequestPruneReport, StoreError>> + Send {
        async move {
            const PAGE: usize = 500;
            let mut report = RequestPruneReport::default();
            let mut after = String::new();
            loop {
                let page = self.list_page("", &after, PAGE).await?;
                for info in &page {
                    // Rules match ids in the whole store (a tenant's rule, its prefix).
                    let rule = rules.for_thread(&self.global_id(&info.id)).copied();
                    let Some(retention) = info.retention.or(rule) else {
                        continue;
                    };
                    match self.prune_thread_requests(&info.id, &retention, now).await {
                        Ok(pruned) => report.add(&info.id, pruned),
                        Err(StoreError::NotFound { .. }) => {}
                        Err(error) => return Err(error),
                    }
                }
                match page.last() {
                    Some(last) if page.len() == PAGE => after = last.id.clone(),
                    _ => return Ok(report),
                }
            }
        }
    }

    /// The calibration of token estimates for the model family `model` (the registry entry
    /// an estimated model matched), if any call to it was observed.
    fn calibration(
        &self,
        model: &str,
    ) -> impl Future<Output = Result<Option<Calibration>, StoreError>> + Send;

    /// Takes one call's observation into `model`'s calibration, in one transaction
    /// (concurrent writers each add theirs), and returns the calibration as it now is.
    fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> impl Future<Output = Result<Calibration, StoreError>> + Send;

    /// A cheap health check: one `SELECT 1` round trip through the store's connections (for
    /// a readiness probe). It waits as long as getting a connection does: callers that must
    /// answer in time wrap it in a timeout.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Appends one event and returns its seq.
    fn append_one(
        &self,
        thread: &str,
        event: NewEvent,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async move {
            let seqs = self.append(thread, vec![event]).await?;
            seqs.first().copied().ok_or_else(|| StoreError::Corrupt {
                thread: thread.to_string(),
                seq: 0,
                detail: "an append of one event returned no seq".into(),
            })
        }
    }

    /// The projection of `thread`'s active context (system prompt kept apart), exactly as
    /// `load(thread).projection()` gives it. Stores may compute it without decoding the
    /// messages that the last context replace covers, so that long, compacted threads load
    /// fast; the SQLite store does.
    fn load_projection(
        &self,
        thread: &str,
    ) -> impl Future<Output = Result<Projection, StoreError>> + Send {
        async move { Ok(self.load(thread).await?.projection()) }
    }

    /// The projection of `thread`'s active context read from its end: its newest ordinary
    /// (not system) messages back to where their stored token counts under `encoding` pass
    /// `tokens`, with everything else of the projection (the system prompt, summaries,
    /// merged and step messages). Fitting that keeps the newest history within a budget of
    /// at most `tokens` tokens gives the same request from it as from the whole projection,
    /// and costs a read of the tail instead of the thread. The messages left out are counted
    /// in [`ProjectionTail::unread`]; the thread's last seq, context store and fork point
    /// come with it, whatever was read. Stores may read everything (`unread` 0); the SQLite
    /// and PostgreSQL stores read only the tail of a long thread (`tokens` at `u64::MAX`
    /// reads the whole projection).
    fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> impl Future<Output = Result<ProjectionTail, StoreError>> + Send {
        let _ = (encoding, tokens);
        async move {
            let thread = self.load(thread).await?;
            Ok(ProjectionTail::from_fold(&thread, 0))
        }
    }

    /// The id `thread` has in the whole store: the same for a store, scoped for a tenant's
    /// view (`TENANT/ID`, see [`Scoped`]). Unique across views, it names the thread in what a
    /// process keeps beside the store (locks, registries of turns and runs, logs).
    fn global_id(&self, thread: &str) -> String {
        thread.to_owned()
    }

    /// `tenant`'s view of this store: itself a store, holding only the tenant's threads
    /// (see [`Scoped`]).
    fn scoped(self, tenant: Tenant) -> Scoped<Self>
    where
        Self: Sized,
    {
        Scoped::new(self, tenant)
    }

    /// Loads `thread` by replaying its events (messages carry their stored token counts).
    fn load(&self, thread: &str) -> impl Future<Output = Result<Thread, StoreError>> + Send {
        async move {
            let events = self.events(thread).await?;
            Thread::replay(thread, events).map_err(|source| StoreError::Replay {
                thread: thread.to_string(),
                source,
            })
        }
    }
}

/// The migrations of `all` newer than the database's `current` version, in order; an error
/// when the database was migrated by a newer build than this one.
pub(crate) fn pending_migrations(
    backend: &'static str,
    all: &'static [(u32, &'static str)],
    current: u32,
) -> Result<impl Iterator<Item = &'static (u32, &'static str)>, StoreError> {
    let known = all.last().map_or(0, |(version, _)| *version);
    if current > known {
        return Err(StoreError::SchemaTooNew {
            backend,
            found: current,
            known,
        });
    }
    Ok(all.iter().filter(move |(version, _)| *version > current))
}

/// The migrations of `all` up to `version`: what a build that knows no newer one applies.
#[cfg(feature = "testing")]
pub(crate) fn migrations_up_to(
    all: &'static [(u32, &'static str)],
    version: u32,
) -> &'static [(u32, &'static str)] {
    &all[..all.iter().take_while(|(v, _)| *v <= version).count()]
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub(crate) fn epoch_ms(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod cursor_tests {
    use super::{NotACursor, RecentCursor};

    #[test]
    fn cursors_read_back_ids_that_hold_colons() {
        let cursor = RecentCursor {
            updated_at_ms: 1_764_000_000_000,
            id: "conversation:alice:support".to_owned(),
        };
        let text = cursor.to_string();
        assert_eq!(text, "1764000000000:conversation:alice:support");
        assert_eq!(text.parse::<RecentCursor>(), Ok(cursor));
        for bad in ["", "12", "x:id", ":id"] {
            assert_eq!(bad.parse::<RecentCursor>(), Err(NotACursor), "{bad}");
        }
    }
}
