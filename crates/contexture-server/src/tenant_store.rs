//! A tenant's view of the store, as the routes use it. Handlers reach threads and executions
//! only through a [`TenantStore`]: it runs on the tenant's [`Scoped`] view of the store, so
//! the client's ids are the ids it knows and another tenant's threads are not found (404),
//! by construction; and it maps every store error to what the client may see.

use axum::http::StatusCode;
use contexture_core::Message;
use contexture_core::format::ItemFormat;
use contexture_core::thread::search::SearchHit;
use contexture_core::thread::{MergeError, MergeSpec, ThreadPolicy};
use contexture_core::tokens::Encoding;
use contexture_engine::threads::{
    Appended, Forked, NewThread, Switched, ThreadOpError, append_messages, clear_thread,
    create_thread, fork_thread, merge_thread, pop_item, restore_thread, search_thread,
    set_thread_policy, switch_context,
};
use contexture_store::{
    AnyStore, EventPage, ProjectionTail, RequestRetention, Scoped, Store, StoreError, Tenant,
    ThreadInfo, TurnQueueStore,
};

use contexture_engine::chat::{
    ChatError, RecordedTurn, TurnInput, delete_recorded_turn, recorded_turn, turn_input, turn_point,
};
use contexture_engine::executor::Executor;
use contexture_engine::turns::{TurnLease, TurnQueue, TurnWaitError};

use crate::active_runs::ActiveRuns;
use crate::app::AppState;
use crate::error::{ApiError, ApiResult};

/// What a client can do about a full thread.
const THREAD_FULL_REMEDY: &str = "start a new thread (a fork shares its parent's events and counts them, or carry a summary over)";

/// A view of the store the doors act on: the whole store, or a tenant's view of it.
pub(crate) trait StoreView: Store + TurnQueueStore + Clone + 'static {}

impl<S: Store + TurnQueueStore + Clone + 'static> StoreView for S {}

/// The store as one tenant sees it (or, for the operator's own door, the whole store: `S`
/// is then the store itself).
#[derive(Clone)]
pub(crate) struct TenantStore<'a, S: StoreView = Scoped<AnyStore>> {
    store: S,
    active_runs: &'a ActiveRuns,
    /// The most named contexts a thread may have.
    max_contexts: usize,
}

impl AppState {
    /// The store as `tenant` sees it.
    pub(crate) fn tenant_store(&self, tenant: &Tenant) -> TenantStore<'_> {
        self.store_view(self.store.clone().scoped(tenant.clone()))
    }

    /// The whole store, as the operator's own door (`contexture mcp` at a terminal) sees it.
    pub(crate) fn operator_store(&self) -> TenantStore<'_, AnyStore> {
        self.store_view(self.store.clone())
    }

    /// `store` (a view of this state's store) with the server's limits.
    fn store_view<S: StoreView>(&self, store: S) -> TenantStore<'_, S> {
        TenantStore {
            store,
            active_runs: &self.active_runs,
            max_contexts: self.config.limits.max_contexts_per_thread,
        }
    }

    /// The executor as it runs `tenant`'s workflows: on the tenant's view of the store, so
    /// that a run's sub-workflows and conversation are the tenant's too.
    pub(crate) fn tenant_executor(&self, tenant: &Tenant) -> Executor<Scoped<AnyStore>> {
        self.tenant_store(tenant).executor(&self.executor)
    }
}

impl<S: StoreView> TenantStore<'_, S> {
    /// `executor` as it runs workflows on this view of the store (the one place where
    /// executions get their store): a run's sub-workflows and conversation are this view's.
    pub(crate) fn executor(&self, executor: &Executor<AnyStore>) -> Executor<S> {
        executor.on_store(self.store.clone())
    }

    /// The tenant's view of the store, for engine operations (whose store errors then go
    /// through [`TenantStore::error`]).
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The client's view of a store error on one of the tenant's threads.
    pub(crate) fn error(&self, error: StoreError) -> ApiError {
        let text = || error.to_string();
        match &error {
            StoreError::NotFound { thread } => ApiError::not_found("thread", thread),
            StoreError::AlreadyExists { .. }
            | StoreError::HasForks { .. }
            | StoreError::Moved { .. } => ApiError::conflict(text()),
            StoreError::ForkBeyondEnd { .. } => ApiError::invalid("at_seq", text()),
            StoreError::ThreadFull { max_events, .. } => ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "thread_full",
                message: format!(
                    "{}; nothing of this request was stored (`limits.max_thread_events` = {max_events}): {THREAD_FULL_REMEDY}",
                    text()
                ),
                param: None,
            },
            StoreError::ThreadTooLarge { max_bytes, .. } => ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "thread_full",
                message: format!(
                    "{}; nothing of this request was stored (`limits.max_thread_bytes` = {max_bytes}): {THREAD_FULL_REMEDY}",
                    text()
                ),
                param: None,
            },
            StoreError::InvalidEvent { .. } | StoreError::ForkedEventAppended { .. } => {
                ApiError::unprocessable(text())
            }
            _ => ApiError::store(&error),
        }
    }

    /// The client's view of a failed thread operation.
    fn op_error(&self, error: ThreadOpError) -> ApiError {
        match error {
            ThreadOpError::Store(error) => self.error(error),
            // The path's thread exists; a missing source is a mistake in the body, not a
            // missing resource.
            ThreadOpError::NoMergeSource { from } => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "unprocessable",
                message: format!("from: no thread `{from}` to merge from"),
                param: Some("from".into()),
            },
            // The path's thread exists; the event named is what is wrong.
            error @ ThreadOpError::Retention { .. } => {
                ApiError::invalid("retention", error.to_string())
            }
            ThreadOpError::Policy { field, problem } => ApiError::invalid(
                format!("policy.{field}"),
                format!("policy.{field}: {problem}"),
            ),
            error @ ThreadOpError::NoItem { .. } => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "unprocessable",
                message: error.to_string(),
                param: None,
            },
            error @ ThreadOpError::Restore { .. } => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "unprocessable",
                message: format!("before: {}", error),
                param: Some("before".into()),
            },
            // Each merge refusal names the body field at fault; nothing was written.
            ThreadOpError::Merge(error) => {
                let (status, code, param) = match &error {
                    MergeError::NotAFork { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", "from")
                    }
                    MergeError::NothingToMerge { .. } => (StatusCode::CONFLICT, "conflict", "from"),
                    MergeError::NoSummary { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", "policy")
                    }
                    MergeError::NoKeys => (StatusCode::BAD_REQUEST, "invalid_request", "keys"),
                    MergeError::MissingKey { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", "keys")
                    }
                    MergeError::KeyConflict { .. } => {
                        (StatusCode::CONFLICT, "conflict", "conflict")
                    }
                };
                ApiError {
                    status,
                    code,
                    message: format!("{param}: {}", error),
                    param: Some(param.into()),
                }
            }
            // A write into a context the thread does not have conflicts with the thread's
            // state (the thread is there; a switch with `create` makes the context).
            ThreadOpError::UnknownContext(unknown) => {
                let mut error = ApiError::unknown_context(&unknown.thread, &unknown);
                error
                    .message
                    .push_str("; a switch with `create` starts a new one");
                ApiError {
                    status: StatusCode::CONFLICT,
                    code: "unknown_context",
                    ..error
                }
            }
            ThreadOpError::TooManyContexts(error) => ApiError {
                status: StatusCode::CONFLICT,
                code: "too_many_contexts",
                message: format!("{} (`limits.max_contexts_per_thread`)", error),
                param: Some("context".into()),
            },
            error @ ThreadOpError::ContextName { .. } => {
                ApiError::invalid("context", format!("context: {error}"))
            }
            error @ ThreadOpError::EmptyQuery => {
                ApiError::invalid("query", format!("query: {error}"))
            }
            error @ ThreadOpError::OpIdReused { .. } => ApiError {
                status: StatusCode::CONFLICT,
                code: "conflict",
                message: format!("op_id: {error}"),
                param: Some("op_id".into()),
            },
        }
    }

    /// 409 while thread `id` is the log of a running execution.
    pub(crate) fn refuse_writes(&self, id: &str) -> ApiResult<()> {
        self.active_runs
            .refuse_writes(&self.store.global_id(id), id)
    }

    /// True when the tenant's thread `id` exists.
    pub(crate) async fn exists(&self, id: &str) -> ApiResult<bool> {
        self.store
            .exists(id)
            .await
            .map_err(|error| self.error(error))
    }

    /// The summary of the tenant's thread `id`, when it exists.
    pub(crate) async fn thread_info(&self, id: &str) -> ApiResult<Option<ThreadInfo>> {
        self.store
            .thread_info(id)
            .await
            .map_err(|error| self.error(error))
    }

    /// Fails with 404 unless the tenant's thread `id` exists.
    pub(crate) async fn ensure(&self, id: &str) -> ApiResult<()> {
        if self.exists(id).await? {
            Ok(())
        } else {
            Err(ApiError::not_found("thread", id))
        }
    }

    /// A page of the events of the tenant's thread `id` after seq `after` (see
    /// [`Store::events_page`]).
    pub(crate) async fn events_page(
        &self,
        id: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> ApiResult<EventPage> {
        self.store
            .events_page(id, after, limit, max_bytes)
            .await
            .map_err(|error| self.error(error))
    }

    /// The chat turn of the tenant's thread `id` whose request was recorded at
    /// `request_seq`, with what it brought; `None` when there is no such thread or turn.
    pub(crate) async fn recorded_turn(
        &self,
        id: &str,
        request_seq: u64,
    ) -> ApiResult<Option<(RecordedTurn, TurnInput)>> {
        let Some(turn) = self.found(recorded_turn(&self.store, id, request_seq).await)? else {
            return Ok(None);
        };
        let input = turn_input(&self.store, id, request_seq, &turn.record).await;
        Ok(Some((turn, self.chat_result(input)?)))
    }

    /// True when the tenant's thread `id` has a chat turn (not deleted) whose request was
    /// recorded at `request_seq`.
    pub(crate) async fn has_recorded_turn(&self, id: &str, request_seq: u64) -> ApiResult<bool> {
        let point = turn_point(&self.store, id, request_seq).await;
        Ok(self.found(point)?.is_some())
    }

    /// Deletes the chat turn of the tenant's thread `id` whose request was recorded at
    /// `request_seq`; false when there is no such thread or turn.
    pub(crate) async fn delete_recorded_turn(&self, id: &str, request_seq: u64) -> ApiResult<bool> {
        let deleted = delete_recorded_turn(&self.store, id, request_seq).await;
        Ok(self.found(deleted)?.is_some())
    }

    /// The result of a read of a chat turn: `None` when there is no such thread or turn.
    fn found<T>(&self, result: Result<T, ChatError>) -> ApiResult<Option<T>> {
        match result {
            Err(ChatError::UnknownPoint { .. } | ChatError::Store(StoreError::NotFound { .. })) => {
                Ok(None)
            }
            other => self.chat_result(other).map(Some),
        }
    }

    /// The result of an operation on a chat turn, its errors as the API answers them.
    fn chat_result<T>(&self, result: Result<T, ChatError>) -> ApiResult<T> {
        result.map_err(|error| match error {
            ChatError::Store(error) => self.error(error),
            error => ApiError::unprocessable(error.to_string()),
        })
    }

    /// The tail of the tenant's thread `id` (see [`Store::load_projection_tail`]).
    pub(crate) async fn load_projection_tail(
        &self,
        id: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> ApiResult<ProjectionTail> {
        self.store
            .load_projection_tail(id, encoding, tokens)
            .await
            .map_err(|error| self.error(error))
    }

    /// A page of the tenant's threads after the client's id `after`, at most `limit`.
    pub(crate) async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> ApiResult<Vec<ThreadInfo>> {
        self.store
            .list_page("", after.unwrap_or_default(), limit)
            .await
            .map_err(|error| self.error(error))
    }

    /// Sets (`None`: removes) the retention policy of the tenant's thread `id`.
    pub(crate) async fn set_retention(
        &self,
        id: &str,
        retention: Option<RequestRetention>,
    ) -> ApiResult<()> {
        self.store
            .set_retention(id, retention)
            .await
            .map_err(|error| self.error(error))
    }

    /// The own retention policy of the tenant's thread `id` (404 when there is no thread).
    pub(crate) async fn retention(&self, id: &str) -> ApiResult<Option<RequestRetention>> {
        let info = self
            .store
            .thread_info(id)
            .await
            .map_err(|error| self.error(error))?
            .ok_or_else(|| ApiError::not_found("thread", id))?;
        Ok(info.retention)
    }

    /// Deletes the tenant's thread `id`.
    pub(crate) async fn delete(&self, id: &str) -> ApiResult<()> {
        self.store
            .delete(id)
            .await
            .map_err(|error| self.error(error))
    }

    /// Creates the tenant's thread `id`; its last seq.
    pub(crate) async fn create(&self, id: &str, new: NewThread) -> ApiResult<u64> {
        create_thread(&self.store, id, new)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Sets (`None`: removes) the own policy of the tenant's thread `id`; the event's seq.
    pub(crate) async fn set_policy(
        &self,
        id: &str,
        policy: Option<ThreadPolicy>,
    ) -> ApiResult<u64> {
        set_thread_policy(&self.store, id, policy)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Forks the tenant's thread `parent` as its thread `child`.
    pub(crate) async fn fork(
        &self,
        parent: &str,
        at_seq: Option<u64>,
        child: &str,
    ) -> ApiResult<Forked> {
        fork_thread(&self.store, parent, at_seq, child)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Merges the tenant's fork `from` into its thread `into`; the merge event's seq.
    pub(crate) async fn merge(&self, into: &str, from: &str, spec: &MergeSpec) -> ApiResult<u64> {
        merge_thread(&self.store, into, from, spec)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Appends `messages` to the tenant's thread `id` (created when missing), in the named
    /// `context` when one is given (see [`append_messages`]).
    pub(crate) async fn append_messages(
        &self,
        id: &str,
        messages: Vec<Message>,
        key: Option<&str>,
        context: Option<&str>,
    ) -> ApiResult<Appended> {
        append_messages(&self.store, id, messages, key, context)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Waits for the turns before this one on the tenant's thread `id` to end (see
    /// [`TurnQueue::wait_for_turn`]), at most `wait`: past it, a 409 with nothing stored.
    pub(crate) async fn wait_for_turn(
        &self,
        turns: &TurnQueue,
        id: &str,
        wait: std::time::Duration,
    ) -> ApiResult<TurnLease> {
        turns
            .wait_for_turn(&self.store, id, wait)
            .await
            .map_err(|error| self.turn_wait_error(error))
    }

    /// A wait for a thread's turn that failed, as the client sees it: past the wait limit a
    /// 409, a store failure as any other.
    pub(crate) fn turn_wait_error(&self, error: TurnWaitError) -> ApiError {
        match error {
            TurnWaitError::Store(error) => self.error(error),
            error @ TurnWaitError::TimedOut { .. } => ApiError::conflict(error.to_string()),
        }
    }

    /// Switches the tenant's thread `id` to its context `context` (see [`switch_context`]).
    pub(crate) async fn switch_context(
        &self,
        id: &str,
        context: &str,
        op_id: Option<String>,
        create: bool,
    ) -> ApiResult<Switched> {
        switch_context(&self.store, id, context, op_id, create, self.max_contexts)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// The first `limit` messages of thread `id` that hold `query` (see [`search_thread`]).
    pub(crate) async fn search(
        &self,
        id: &str,
        query: &str,
        limit: usize,
    ) -> ApiResult<Vec<SearchHit>> {
        search_thread(&self.store, id, query, limit)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Empties the active conversation of the tenant's thread `id` (its system prompt and
    /// pinned messages stay) as one replace event; its seq, `None` when there was nothing.
    pub(crate) async fn clear(&self, id: &str) -> ApiResult<Option<u64>> {
        clear_thread(&self.store, id)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Takes the newest item off the tenant's thread `id` in `format` (see [`pop_item`]) and
    /// returns it; `None` when the conversation is empty.
    pub(crate) async fn pop(
        &self,
        id: &str,
        format: ItemFormat,
    ) -> ApiResult<Option<serde_json::Value>> {
        pop_item(&self.store, id, format)
            .await
            .map_err(|error| self.op_error(error))
    }

    /// Puts back what the replace event `before` of the tenant's thread `id` covered; the
    /// restore event's seq.
    pub(crate) async fn restore(&self, id: &str, before: u64) -> ApiResult<u64> {
        restore_thread(&self.store, id, before)
            .await
            .map_err(|error| self.op_error(error))
    }
}
