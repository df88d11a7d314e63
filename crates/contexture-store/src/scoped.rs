//! Tenants: a [`Scoped`] store is one tenant's view of a store, and itself a [`Store`], so
//! whatever runs on a store (the workflow engine, the chat turn, thread operations) runs on
//! a tenant's view unchanged and sees only that tenant's threads.
//!
//! The view keeps each of the tenant's threads (executions and conversation threads
//! included) under the stored id `TENANT/ID`, where `ID` is the id the tenant knows.
//! Tenant names never contain `/`, so the tenant of a stored id is the part before its first
//! `/`, and one tenant's ids are never inside another's. Through the view, every id goes in
//! scoped and comes out as the tenant knows it, in typed fields only: thread ids given to
//! the store, the ids a thread's events name (a fork's parent, a merged fork, a run's parent
//! execution, conversation and sub-workflows: [`EventKind::thread_ids_mut`]), the ids of
//! listed threads and those in store errors. A thread of another tenant is never found.

use std::fmt;
use std::time::{Duration, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::{Event, EventKind, Projection, Thread};
use contexture_core::tokens::Encoding;

use crate::retention::{RequestRetention, RequestsPruned};
use crate::{
    EventOutline, EventPage, JoinedTurn, KeyedEvent, NewEvent, ProjectionTail, PruneReport,
    QueueHold, RecentCursor, RunEndStore, Store, StoreError, ThreadInfo, TurnQueueStore,
    TurnTicket,
};

/// The separator between a tenant's name and the id the tenant knows, in stored ids.
const TENANT_SEPARATOR: char = '/';

/// A tenant: who owns a set of threads. Its name has 1 to 64 ASCII letters, digits, `-`,
/// `_` and `.`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

/// A tenant name that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TenantNameError(String);

impl Tenant {
    /// A tenant with a checked name.
    pub fn new(name: impl Into<String>) -> Result<Tenant, TenantNameError> {
        let name = name.into();
        if name.is_empty() || name.len() > 64 {
            return Err(TenantNameError(format!(
                "a tenant name has 1 to 64 characters, not {}",
                name.len()
            )));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(TenantNameError(format!(
                "tenant `{name}`: {c:?} is not allowed (letters, digits, `-`, `_`, `.`)"
            )));
        }
        Ok(Tenant(name))
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The prefix of every stored id of the tenant's threads: what per-tenant settings (a
    /// retention rule, say) match.
    pub fn id_prefix(&self) -> String {
        format!("{}{TENANT_SEPARATOR}", self.0)
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenant of a stored id, when it has one: the part before the first `/`, when that
/// is a tenant name.
pub fn tenant_of(stored_id: &str) -> Option<Tenant> {
    let (name, _) = stored_id.split_once(TENANT_SEPARATOR)?;
    Tenant::new(name).ok()
}

/// One tenant's view of a store (see the module documentation).
#[derive(Debug, Clone)]
pub struct Scoped<S> {
    inner: S,
    tenant: Tenant,
    prefix: String,
}

impl<S> Scoped<S> {
    /// `tenant`'s view of `inner`.
    pub fn new(inner: S, tenant: Tenant) -> Scoped<S> {
        let prefix = tenant.id_prefix();
        Scoped {
            inner,
            tenant,
            prefix,
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// The whole store under the view.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The id the thread `id` of this tenant has in the whole store (what
    /// [`Store::global_id`] answers through the view).
    fn stored_id(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }

    /// The id the tenant knows of a stored id, when the stored id is this tenant's.
    fn local<'a>(&self, stored: &'a str) -> Option<&'a str> {
        stored.strip_prefix(self.prefix.as_str())
    }

    /// A stored id as the tenant knows it; one that is not the tenant's is left whole (it
    /// cannot occur through the view: every id the view writes is scoped).
    fn unscoped(&self, stored: String) -> String {
        match self.local(&stored) {
            Some(local) => local.to_owned(),
            None => stored,
        }
    }

    fn scope_event(&self, mut event: NewEvent) -> NewEvent {
        for id in event.kind.thread_ids_mut() {
            *id = self.stored_id(id);
        }
        event
    }

    fn unscope_kind(&self, kind: &mut EventKind) {
        for id in kind.thread_ids_mut() {
            *id = self.unscoped(std::mem::take(id));
        }
    }

    fn unscope_events(&self, mut events: Vec<Event>) -> Vec<Event> {
        for event in &mut events {
            self.unscope_kind(&mut event.kind);
        }
        events
    }

    fn unscope_info(&self, mut info: ThreadInfo) -> ThreadInfo {
        info.id = self.unscoped(info.id);
        info.parent = info.parent.map(|parent| self.unscoped(parent));
        info
    }

    /// A list of threads the inner store answered, as the tenant sees it.
    fn unscope_infos(
        &self,
        infos: Result<Vec<ThreadInfo>, StoreError>,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        match infos {
            Ok(infos) => Ok(infos
                .into_iter()
                .map(|info| self.unscope_info(info))
                .collect()),
            Err(error) => Err(self.unscope_error(error)),
        }
    }

    /// A store error as the tenant sees it: the ids it names lose the tenant's prefix.
    fn unscope_error(&self, mut error: StoreError) -> StoreError {
        for id in error.thread_ids_mut() {
            *id = self.unscoped(std::mem::take(id));
        }
        error
    }
}

impl<S: Store> Store for Scoped<S> {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        let events = events.into_iter().map(|e| self.scope_event(e)).collect();
        self.inner
            .append(&self.stored_id(thread), events)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        let events = events.into_iter().map(|e| self.scope_event(e)).collect();
        self.inner
            .append_after(&self.stored_id(thread), after, events)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.inner
            .events(&self.stored_id(thread))
            .await
            .map(|events| self.unscope_events(events))
            .map_err(|e| self.unscope_error(e))
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        self.inner
            .exists(&self.stored_id(thread))
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        self.inner
            .events_after(&self.stored_id(thread), after)
            .await
            .map(|events| self.unscope_events(events))
            .map_err(|e| self.unscope_error(e))
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner
            .events_through(&self.stored_id(thread), after, through)
            .await
            .map(|events| self.unscope_events(events))
            .map_err(|e| self.unscope_error(e))
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        self.inner
            .outlines_through(&self.stored_id(thread), after, through)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn events_page(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<EventPage, StoreError> {
        let mut page = self
            .inner
            .events_page(&self.stored_id(thread), after, limit, max_bytes)
            .await
            .map_err(|e| self.unscope_error(e))?;
        page.events = self.unscope_events(page.events);
        Ok(page)
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        let mut keyed = self
            .inner
            .keyed_event(&self.stored_id(thread), key)
            .await
            .map_err(|e| self.unscope_error(e))?;
        if let Some(keyed) = &mut keyed {
            self.unscope_kind(&mut keyed.event.kind);
        }
        Ok(keyed)
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        self.inner
            .fork(&self.stored_id(parent), at_seq, &self.stored_id(child))
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        // An empty `after` starts at the first of the tenant's ids: scoped, it would be the
        // bare prefix, which no id equals and every id follows.
        let after = if after.is_empty() {
            String::new()
        } else {
            self.stored_id(after)
        };
        let page = self
            .inner
            .list_page(&self.stored_id(prefix), &after, limit)
            .await;
        self.unscope_infos(page)
    }

    /// The tenant's threads newest first. `contains` is looked for past the scoped prefix
    /// (the tenant's and the caller's), so the tenant's name never matches it.
    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let before = before.map(|cursor| RecentCursor {
            updated_at_ms: cursor.updated_at_ms,
            id: self.stored_id(&cursor.id),
        });
        let page = self
            .inner
            .list_recent(&self.stored_id(prefix), contains, before.as_ref(), limit)
            .await;
        self.unscope_infos(page)
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        let forks = self.inner.forks_of(&self.stored_id(thread)).await;
        self.unscope_infos(forks)
    }

    async fn thread_info(&self, thread: &str) -> Result<Option<ThreadInfo>, StoreError> {
        self.inner
            .thread_info(&self.stored_id(thread))
            .await
            .map(|info| info.map(|info| self.unscope_info(info)))
            .map_err(|e| self.unscope_error(e))
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        self.inner
            .delete(&self.stored_id(thread))
            .await
            .map_err(|e| self.unscope_error(e))
    }

    /// Deletes the tenant's threads last appended to before `idle_before`, forks before
    /// their parents; a thread with a kept fork is kept (every fork of a tenant's thread is
    /// the tenant's: forks are made through the view).
    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        let report = self
            .inner
            .prune_under(&self.stored_id(prefix), idle_before)
            .await
            .map_err(|e| self.unscope_error(e))?;
        let unscoped = |ids: Vec<String>| ids.into_iter().map(|id| self.unscoped(id)).collect();
        Ok(PruneReport {
            deleted: unscoped(report.deleted),
            kept_for_forks: unscoped(report.kept_for_forks),
        })
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        self.inner
            .set_retention(&self.stored_id(thread), retention)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        self.inner
            .prune_thread_requests(&self.stored_id(thread), retention, now)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    // Calibrations are per model, shared by every tenant's estimates.
    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        self.inner.calibration(model).await
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        self.inner.observe_calibration(model, observation).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        self.inner
            .load_projection(&self.stored_id(thread))
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        let mut tail = self
            .inner
            .load_projection_tail(&self.stored_id(thread), encoding, tokens)
            .await
            .map_err(|e| self.unscope_error(e))?;
        if let Some(fork) = &mut tail.fork
            && let Some(local) = self.local(&fork.parent)
        {
            fork.parent = local.to_owned();
        }
        Ok(tail)
    }

    fn global_id(&self, thread: &str) -> String {
        self.stored_id(thread)
    }

    async fn load(&self, thread: &str) -> Result<Thread, StoreError> {
        let events = self.events(thread).await?;
        Thread::replay(thread, events).map_err(|source| StoreError::Replay {
            thread: thread.to_string(),
            source,
        })
    }
}

impl<S: RunEndStore> RunEndStore for Scoped<S> {
    async fn append_ending_run(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        hold: &QueueHold,
        outcome: &str,
    ) -> Result<Vec<u64>, StoreError> {
        let events = events.into_iter().map(|e| self.scope_event(e)).collect();
        self.inner
            .append_ending_run(&self.stored_id(thread), events, hold, outcome)
            .await
            .map_err(|e| self.unscope_error(e))
    }
}

impl<S: TurnQueueStore> TurnQueueStore for Scoped<S> {
    async fn join_turn_queue(&self, thread: &str) -> Result<JoinedTurn, StoreError> {
        self.inner
            .join_turn_queue(&self.stored_id(thread))
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> Result<Option<u64>, StoreError> {
        self.inner
            .turns_ahead(&self.stored_id(thread), ticket)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn renew_turn(
        &self,
        thread: &str,
        ticket: TurnTicket,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner
            .renew_turn(&self.stored_id(thread), ticket, lease)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn leave_turn_queue(&self, thread: &str, ticket: TurnTicket) -> Result<(), StoreError> {
        self.inner
            .leave_turn_queue(&self.stored_id(thread), ticket)
            .await
            .map_err(|e| self.unscope_error(e))
    }

    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: TurnTicket,
    ) -> Result<Vec<u64>, StoreError> {
        let events = events.into_iter().map(|e| self.scope_event(e)).collect();
        self.inner
            .append_leaving_turn(&self.stored_id(thread), events, ticket)
            .await
            .map_err(|e| self.unscope_error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for bad in ["", "a/b", "a b", "ü", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
        for good in ["acme", "team-1", "a.b_c"] {
            assert!(Tenant::new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_stored_id_names_its_tenant() {
        let acme = Scoped::new((), Tenant::new("acme").unwrap());
        assert_eq!(acme.stored_id("t/1"), "acme/t/1");
        assert_eq!(tenant_of("acme/t/1").unwrap().name(), "acme");
        assert_eq!(acme.local("acme2/t"), None);
        assert_eq!(acme.local("acme/t"), Some("t"));
        assert_eq!(tenant_of("no-tenant"), None);
        assert_eq!(tenant_of("a b/c"), None);
    }
}
