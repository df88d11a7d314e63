//! Choosing a store by URL: `sqlite:PATH` or `postgres://...`.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, Projection};
use contexture_core::tokens::Encoding;

#[cfg(feature = "postgres")]
use crate::PgStore;
#[cfg(feature = "sqlite")]
use crate::SqliteStore;
use crate::{
    ApiKeyRecord, ApiKeyStore, EventOutline, KeyedEvent, NewEvent, ProjectionTail, PruneReport,
    RecentCursor, RequestRetention, RequestsPruned, Store, StoreError, ThreadInfo,
};

/// A parsed database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:PATH` (also `sqlite://PATH`).
    Sqlite(PathBuf),
    /// `postgres://...` or `postgresql://...`, passed to the driver as is.
    Postgres(String),
}

impl FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<StoreUrl, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(url.to_string()));
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(StoreError::InvalidUrl {
                    url: url.to_string(),
                    reason: "no file path after `sqlite:`".into(),
                });
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        Err(StoreError::InvalidUrl {
            url: url.to_string(),
            reason: "expected `sqlite:PATH` or `postgres://...`".into(),
        })
    }
}

/// A store chosen at run time, among the backends this build has (the `sqlite` and
/// `postgres` features).
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// An SQLite file.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// A PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

/// Runs `$call` on the store inside `$any`, whichever backend it is.
macro_rules! on_backend {
    ($any:expr, $store:ident => $call:expr) => {
        match $any {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $call,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $call,
        }
    };
}

impl AnyStore {
    /// Limits every thread to `max` events (`None`: no limit); see
    /// [`StoreError::ThreadFull`].
    pub fn set_max_thread_events(&self, max: Option<u64>) {
        on_backend!(self, store => store.set_max_thread_events(max))
    }

    /// Limits every thread to `max` bytes of events, its fork prefix included (`None`: no
    /// limit); see [`StoreError::ThreadTooLarge`].
    pub fn set_max_thread_bytes(&self, max: Option<u64>) {
        on_backend!(self, store => store.set_max_thread_bytes(max))
    }

    /// Bounds the memory of the store's cache of recently read threads to about `bytes`
    /// (0: keep none); see [`SqliteStore::set_projection_cache_bytes`].
    pub fn set_projection_cache_bytes(&self, bytes: u64) {
        on_backend!(self, store => store.set_projection_cache_bytes(bytes))
    }

    /// Rewrites an SQLite file without its free pages ([`SqliteStore::vacuum`]): its bytes
    /// before and after. `None` for PostgreSQL, whose autovacuum reuses the space.
    pub async fn vacuum(&self) -> Result<Option<(u64, u64)>, StoreError> {
        match self {
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(store) => store.vacuum().await.map(Some),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(_) => Ok(None),
        }
    }

    /// Opens the store `url` names (see [`StoreUrl`]), applying pending migrations. A URL of
    /// a backend this build lacks is an [`StoreError::InvalidUrl`].
    pub async fn open(url: &str) -> Result<AnyStore, StoreError> {
        #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
        let missing = |backend: &str| StoreError::InvalidUrl {
            url: url.to_owned(),
            reason: format!("this build has no {backend} support (the `{backend}` feature)"),
        };
        match url.parse::<StoreUrl>()? {
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => Ok(AnyStore::Sqlite(SqliteStore::open(path).await?)),
            #[cfg(not(feature = "sqlite"))]
            StoreUrl::Sqlite(_) => Err(missing("sqlite")),
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => Ok(AnyStore::Postgres(PgStore::open(&url).await?)),
            #[cfg(not(feature = "postgres"))]
            StoreUrl::Postgres(_) => Err(missing("postgres")),
        }
    }
}

impl Store for AnyStore {
    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        on_backend!(self, store => store.events_through(thread, after, through).await)
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        on_backend!(self, store => store.outlines_through(thread, after, through).await)
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        on_backend!(self, store => store.list_page(prefix, after, limit).await)
    }

    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        on_backend!(self, store => store.list_recent(prefix, contains, before, limit).await)
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        on_backend!(self, store => store.forks_of(thread).await)
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        on_backend!(self, store => store.keyed_event(thread, key).await)
    }

    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        on_backend!(self, store => store.append(thread, events).await)
    }

    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        on_backend!(self, store => store.append_after(thread, after, events).await)
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        on_backend!(self, store => store.events(thread).await)
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        on_backend!(self, store => store.exists(thread).await)
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        on_backend!(self, store => store.events_after(thread, after).await)
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        on_backend!(self, store => store.load_projection(thread).await)
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        on_backend!(self, store => store.load_projection_tail(thread, encoding, tokens).await)
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        on_backend!(self, store => store.fork(parent, at_seq, child).await)
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        on_backend!(self, store => store.delete(thread).await)
    }

    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        on_backend!(self, store => store.prune_under(prefix, idle_before).await)
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        on_backend!(self, store => store.set_retention(thread, retention).await)
    }

    async fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        on_backend!(self, store => store.prune_thread_requests(thread, retention, now).await)
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        on_backend!(self, store => store.calibration(model).await)
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        on_backend!(self, store => store.observe_calibration(model, observation).await)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        on_backend!(self, store => store.ping().await)
    }
}

impl AnyStore {
    /// The store that holds rate limits shared by every server on the database: PostgreSQL's
    /// (an SQLite file has one server, whose own buckets are exact).
    #[cfg(feature = "postgres")]
    pub fn shared_rate_limits(&self) -> Option<&PgStore> {
        match self {
            AnyStore::Postgres(store) => Some(store),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

impl crate::RunEndStore for AnyStore {
    async fn append_ending_run(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        hold: &crate::QueueHold,
        outcome: &str,
    ) -> Result<Vec<u64>, StoreError> {
        on_backend!(self, store => store.append_ending_run(thread, events, hold, outcome).await)
    }
}

impl crate::ExecutionQueueStore for AnyStore {
    async fn enqueue_execution(
        &self,
        id: &str,
        tenant: &str,
        request: &serde_json::Value,
    ) -> Result<(), StoreError> {
        on_backend!(self, store => store.enqueue_execution(id, tenant, request).await)
    }

    async fn claim_executions(
        &self,
        node: &str,
        most: usize,
        tenant_limit: usize,
        lease: std::time::Duration,
    ) -> Result<Vec<crate::ExecutionClaim>, StoreError> {
        on_backend!(self, store => store.claim_executions(node, most, tenant_limit, lease).await)
    }

    async fn renew_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        on_backend!(self, store => store.renew_execution(id, node, epoch, lease).await)
    }

    async fn finish_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        on_backend!(self, store => store.finish_execution(id, node, epoch, outcome).await)
    }

    async fn release_execution(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        on_backend!(self, store => store.release_execution(id, node, epoch).await)
    }

    async fn count_execution_failure(
        &self,
        id: &str,
        node: &str,
        epoch: i64,
        retry_after: Duration,
    ) -> Result<Option<u32>, StoreError> {
        on_backend!(self, store => store.count_execution_failure(id, node, epoch, retry_after).await)
    }

    async fn finish_queued_execution(&self, id: &str, outcome: &str) -> Result<bool, StoreError> {
        on_backend!(self, store => store.finish_queued_execution(id, outcome).await)
    }

    async fn execution_queue_counts(&self) -> Result<crate::QueueCounts, StoreError> {
        on_backend!(self, store => store.execution_queue_counts().await)
    }

    async fn prune_finished_executions(
        &self,
        kept: std::time::Duration,
    ) -> Result<u64, StoreError> {
        on_backend!(self, store => store.prune_finished_executions(kept).await)
    }

    async fn queued_execution(
        &self,
        id: &str,
    ) -> Result<Option<crate::QueuedExecution>, StoreError> {
        on_backend!(self, store => store.queued_execution(id).await)
    }
}

impl crate::TurnQueueStore for AnyStore {
    async fn join_turn_queue(&self, thread: &str) -> Result<crate::JoinedTurn, StoreError> {
        on_backend!(self, store => store.join_turn_queue(thread).await)
    }

    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: crate::TurnTicket,
    ) -> Result<Option<u64>, StoreError> {
        on_backend!(self, store => store.turns_ahead(thread, ticket).await)
    }

    async fn renew_turn(
        &self,
        thread: &str,
        ticket: crate::TurnTicket,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        on_backend!(self, store => store.renew_turn(thread, ticket, lease).await)
    }

    async fn leave_turn_queue(
        &self,
        thread: &str,
        ticket: crate::TurnTicket,
    ) -> Result<(), StoreError> {
        on_backend!(self, store => store.leave_turn_queue(thread, ticket).await)
    }

    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: crate::TurnTicket,
    ) -> Result<Vec<u64>, StoreError> {
        on_backend!(self, store => store.append_leaving_turn(thread, events, ticket).await)
    }
}

impl ApiKeyStore for AnyStore {
    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        key_hash: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        on_backend!(self, store => store.create_api_key(id, tenant, name, key_hash).await)
    }

    async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        on_backend!(self, store => store.api_key_by_hash(key_hash).await)
    }

    async fn list_api_keys(&self, tenant: Option<&str>) -> Result<Vec<ApiKeyRecord>, StoreError> {
        on_backend!(self, store => store.list_api_keys(tenant).await)
    }

    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        on_backend!(self, store => store.revoke_api_key(id).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_by_scheme() {
        let table = [
            (
                "sqlite:contexture.db",
                Some(StoreUrl::Sqlite("contexture.db".into())),
            ),
            (
                "sqlite:///tmp/x.db",
                Some(StoreUrl::Sqlite("/tmp/x.db".into())),
            ),
            (
                "sqlite://rel/x.db",
                Some(StoreUrl::Sqlite("rel/x.db".into())),
            ),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                Some(StoreUrl::Postgres(
                    "postgres://postgres@127.0.0.1:5432/test".into(),
                )),
            ),
            (
                "postgresql://h/db",
                Some(StoreUrl::Postgres("postgresql://h/db".into())),
            ),
            ("sqlite:", None),
            ("mysql://h/db", None),
            ("contexture.db", None),
        ];
        for (url, expected) in table {
            match (url.parse::<StoreUrl>(), expected) {
                (Ok(parsed), Some(expected)) => assert_eq!(parsed, expected, "{url}"),
                (Err(StoreError::InvalidUrl { url: named, .. }), None) => assert_eq!(named, url),
                (other, expected) => panic!("{url}: got {other:?}, expected {expected:?}"),
            }
        }
    }
}
