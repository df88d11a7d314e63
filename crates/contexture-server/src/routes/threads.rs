//! `/v1/threads`: create, append (idempotent with `Idempotency-Key`), the projection fitted
//! to a model with its budget, events paged by seq, fork, merge, compact, restore, delete,
//! the thread's own policy for its requests, and its retention of request records.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use contexture_core::budget::BudgetBreakdown;
use contexture_core::compact::CompactionReport;
use contexture_core::format::ItemFormat;
use contexture_core::format::openai;
use contexture_core::thread::{
    ConflictPolicy, FitRecord, MergeKeys, MergePolicy, MergeSpec, ThreadPolicy,
};
use contexture_core::tokens::Encoding;
use contexture_engine::compaction::{CompactOptions, CompactionError, compact_stored};
use contexture_engine::fitting::FittedRequest;
use contexture_engine::threads::{MAX_SEARCH_HITS, NewThread};
use contexture_store::RequestRetention;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::{JsonBody, QueryParams};
use crate::error::{ApiError, ApiResult};
use crate::fit_settings;
use crate::routes::fresh_id;
use crate::tenancy::{Actor, check_id};
use crate::tenant_store::{StoreView, TenantStore};
use contexture_engine::fitting::{
    MessageView, ThreadFitError, ThreadReadError, fit_thread_on, thread_messages,
};

/// Parses OpenAI-format messages at `param`.
pub(crate) fn parse_messages(
    value: &Value,
    param: &str,
) -> ApiResult<Vec<contexture_core::Message>> {
    openai::parse_messages(value).map_err(|error| {
        let text = error.to_string();
        // The parser names positions from `messages`; keep the client's field name.
        let text = text.replacen("messages", param, 1);
        ApiError::invalid(param, text)
    })
}

fn id_param(what: &str, id: &str) -> ApiResult<()> {
    check_id(what, id).map_err(|problem| ApiError::invalid("id", problem))
}

/// `POST /v1/threads` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateThread {
    /// The id (default: a fresh UUID). A thread with this id must not exist.
    id: Option<String>,
    /// A system prompt.
    system: Option<String>,
    /// First messages (OpenAI format).
    messages: Option<Value>,
    /// Free JSON kept in the thread's store under `metadata`.
    metadata: Option<Value>,
    /// The thread's own retention policy for its request records.
    #[serde(default, deserialize_with = "contexture_core::map_only::optional")]
    retention: Option<RequestRetention>,
    /// The thread's own policy for its requests: how they are fitted (`context`) and when
    /// the thread is compacted (`compaction`), in place of the server's.
    #[serde(default, deserialize_with = "contexture_core::map_only::optional")]
    policy: Option<ThreadPolicy>,
}

/// A retention policy from a body: 400 naming the field when it cannot be used.
fn check_retention(param: &str, retention: &RequestRetention) -> ApiResult<()> {
    retention
        .check()
        .map_err(|error| ApiError::invalid(param, format!("{param}: {error}")))
}

/// `POST /v1/threads`: 201 with the id and the last seq.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateThread>,
) -> ApiResult<Response> {
    let id = body.id.unwrap_or_else(fresh_id);
    id_param("a thread id", &id)?;
    let messages = match &body.messages {
        Some(value) => parse_messages(value, "messages")?,
        None => Vec::new(),
    };
    if let Some(retention) = &body.retention {
        check_retention("retention", retention)?;
    }
    let new = NewThread {
        system: body.system,
        messages,
        metadata: body.metadata,
        retention: body.retention,
        policy: body.policy,
    };
    let last_seq = state.tenant_store(&caller.tenant).create(&id, new).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "last_seq": last_seq})),
    )
        .into_response())
}

/// A page's size: `limit` (default 100), 1 to 1000.
pub(crate) fn page_limit(limit: Option<usize>) -> ApiResult<usize> {
    let limit = limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "limit must be 1 to 1000"));
    }
    Ok(limit)
}

/// `GET /v1/threads` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Threads after this id (in byte order of the ids; default: from the first).
    after: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/threads`: a page of the tenant's threads by id; `next_after` continues it.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    QueryParams(query): QueryParams<ListQuery>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    Ok(Json(
        list_threads(&threads, query.after.as_deref(), query.limit).await?,
    ))
}

/// A page of the threads `threads` holds, by id after `after`, at most `limit` (default
/// 100, at most 1000): `{threads, next_after}`, where `next_after` continues it.
pub(crate) async fn list_threads<S: StoreView>(
    threads: &TenantStore<'_, S>,
    after: Option<&str>,
    limit: Option<usize>,
) -> ApiResult<Value> {
    let limit = page_limit(limit)?;
    let page = threads.list_page(after, limit + 1).await?;
    let more = page.len() > limit;
    let mut threads = Vec::with_capacity(limit);
    for info in page.into_iter().take(limit) {
        threads.push(serde_json::to_value(&info).unwrap_or_default());
    }
    let next_after = if more {
        threads
            .last()
            .and_then(|thread| thread["id"].as_str().map(str::to_owned))
    } else {
        None
    };
    Ok(json!({ "threads": threads, "next_after": next_after }))
}

/// `GET /v1/threads/{id}`: the thread's summary.
pub async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    // Only the newest message is needed: the older ones are counted, not read.
    let threads = state.tenant_store(tenant);
    let thread = threads
        .load_projection_tail(&id, Encoding::O200kBase, 0)
        .await?;
    let projection = &thread.projection;
    let own = threads.retention(&id).await?;
    let retention = retention_answer(&state, &threads, &id, own);
    let policy = policy_answer(&state, &id, thread.policy.clone());
    Ok(Json(json!({
        "id": id,
        "retention": retention["retention"],
        "applied_retention": retention["applied_retention"],
        "policy": policy["policy"],
        "applied_policy": policy["applied_policy"],
        "last_seq": thread.last_seq,
        "context": projection.context,
        "messages": projection.messages.len()
            + thread.unread
            + usize::from(projection.system.is_some()),
        "metadata": thread.store.get("metadata").cloned().unwrap_or(Value::Null),
        "parent": thread.fork.as_ref().map(|fork| fork.parent.clone()),
        "fork_seq": thread.fork.as_ref().map(|fork| fork.at_seq),
    })))
}

/// `PUT /v1/threads/{id}/retention`: sets the thread's own retention policy for its request
/// records (`keep_days`, `keep_last`, at least one); the background pruning and `contexture
/// thread prune` apply it before the server's. Answers with the policy.
pub async fn set_retention(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RequestRetention>,
) -> ApiResult<Json<Value>> {
    check_retention("retention", &body)?;
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    threads.set_retention(&id, Some(body)).await?;
    Ok(Json(retention_answer(&state, &threads, &id, Some(body))))
}

/// `DELETE /v1/threads/{id}/retention`: removes the thread's own policy (the server's
/// applies again). Answers as `PUT` does.
pub async fn clear_retention(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    threads.set_retention(&id, None).await?;
    Ok(Json(retention_answer(&state, &threads, &id, None)))
}

/// A thread's retention as the API shows it: its own policy and the one pruning applies.
fn retention_answer(
    state: &AppState,
    threads: &TenantStore<'_, impl StoreView>,
    id: &str,
    own: Option<RequestRetention>,
) -> Value {
    // The rules match ids in the whole store (a tenant's rule, its prefix).
    let global_id = threads.store().global_id(id);
    let applied = own.or_else(|| state.retention.for_thread(&global_id).copied());
    json!({ "id": id, "retention": own, "applied_retention": applied })
}

/// `PUT /v1/threads/{id}/policy`: sets the thread's own policy for its requests (one
/// `policy_set` event): `context`, how they are fitted (a window that may only lower the
/// model's, the strategy, the reply reserve, tool results cleared and truncated,
/// hysteresis), and `compaction`; what it leaves out is the server's. Every server honours
/// it from the next request on. Answers with the policy and the one that applies.
pub async fn set_policy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ThreadPolicy>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    threads.set_policy(&id, Some(body.clone())).await?;
    Ok(Json(policy_answer(&state, &id, Some(body))))
}

/// `DELETE /v1/threads/{id}/policy`: removes the thread's own policy (the server's applies
/// again). Answers as `PUT` does.
pub async fn clear_policy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    threads.set_policy(&id, None).await?;
    Ok(Json(policy_answer(&state, &id, None)))
}

/// A thread's policy as the API shows it: its own, and the one its requests get (each part
/// its own, else the server's).
fn policy_answer(state: &AppState, id: &str, own: Option<ThreadPolicy>) -> Value {
    let fit = own
        .as_ref()
        .and_then(|policy| policy.fit.clone())
        .unwrap_or_else(|| state.config.fit.clone());
    let compaction = own
        .as_ref()
        .and_then(|policy| policy.compaction.clone())
        .or_else(|| state.config.compaction.clone());
    let applied = ThreadPolicy {
        fit: Some(fit),
        compaction,
    };
    json!({ "id": id, "policy": own, "applied_policy": applied })
}

/// `POST /v1/threads/{id}/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendMessages {
    /// The messages (OpenAI format), appended in one transaction.
    messages: Value,
}

/// `POST /v1/threads/{id}/messages` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendQuery {
    /// Append in this named context: it becomes the active one first, in the same
    /// transaction.
    context: Option<String>,
}

/// `POST /v1/threads/{id}/messages`: appends in one transaction and returns each seq. With
/// `Idempotency-Key: K`, message i carries key `K:i`, so a retried request stores nothing
/// and returns the seqs of the first. Creates the thread when it does not exist. With
/// `?context=NAME`, the messages go to that context (one the thread has): a switch to it,
/// unless it is active already, is recorded first in the same transaction.
pub async fn append(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    QueryParams(query): QueryParams<AppendQuery>,
    JsonBody(body): JsonBody<AppendMessages>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let key = crate::body::idempotency_key(&headers)?;
    let answer = append_to(
        &threads,
        &id,
        &body.messages,
        key.as_deref(),
        query.context.as_deref(),
    )
    .await?;
    Ok(Json(answer))
}

/// Appends the OpenAI-format `messages` to thread `id` (created when missing) in one
/// transaction, in the named `context` when one is given, each under idempotency key
/// `KEY:i` when `key` is given: `{seqs, switch_seq?}`. Nothing is written when any of it is
/// wrong.
pub(crate) async fn append_to<S: StoreView>(
    threads: &TenantStore<'_, S>,
    id: &str,
    messages: &Value,
    key: Option<&str>,
    context: Option<&str>,
) -> ApiResult<Value> {
    id_param("a thread id", id)?;
    threads.refuse_writes(id)?;
    let messages = parse_messages(messages, "messages")?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: the array is empty",
        ));
    }
    if let Some(context) = context {
        check_context_param(context)?;
    }
    let appended = threads.append_messages(id, messages, key, context).await?;
    let mut answer = json!({ "seqs": appended.seqs });
    if let Some(seq) = appended.switch_seq {
        answer["switch_seq"] = json!(seq);
    }
    Ok(answer)
}

/// `POST /v1/threads/{id}/switch` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchContext {
    /// The context to make active.
    context: String,
    /// An id for this operation: recorded again with the same id (a retry), it has no
    /// second effect.
    op_id: Option<String>,
    /// Start the context when the thread does not have it (default false: an unknown
    /// context is refused).
    #[serde(default)]
    create: bool,
}

/// `POST /v1/threads/{id}/switch`: makes a named context the active one, as one
/// `context_switched` event (queued while a request is in flight, applied when it ends);
/// returns its seq and whether it waits.
pub async fn switch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SwitchContext>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    id_param("a thread id", &id)?;
    check_context_param(&body.context)?;
    if let Some(op_id) = &body.op_id {
        check_id("an op_id", op_id).map_err(|problem| ApiError::invalid("op_id", problem))?;
    }
    threads.refuse_writes(&id)?;
    let switched = threads
        .switch_context(&id, &body.context, body.op_id, body.create)
        .await?;
    Ok(Json(json!({
        "seq": switched.seq,
        "context": body.context,
        "queued": switched.queued,
    })))
}

/// A context name from a request: 400 naming `context` when it cannot be one.
fn check_context_param(context: &str) -> ApiResult<()> {
    check_id("a context name", context).map_err(|problem| ApiError::invalid("context", problem))
}

/// `GET /v1/threads/{id}/context` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextQuery {
    /// The model to fit for (its window and tokenizer).
    pub(crate) model: String,
    /// At most this many tokens for the request (default: the model's budget).
    pub(crate) max_tokens: Option<u32>,
    /// `last`, `first`, `head-tail`, `head-tail:N`.
    pub(crate) strategy: Option<String>,
    /// The share of the window to use.
    pub(crate) budget_ratio: Option<f64>,
    /// Tokens reserved for the reply.
    pub(crate) reserve_output: Option<u32>,
}

/// `GET /v1/threads/{id}/context`: the projection fitted to a model, with the budget
/// breakdown and what fitting left out.
pub async fn context(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ContextQuery>,
) -> ApiResult<Response> {
    let threads = state.tenant_store(&caller.tenant);
    let actor = Actor::Tenant(caller.tenant.clone());
    let fitted = fitted_context(&state, &threads, &actor, &id, &query).await?;
    Ok(Json(fitted.answer(&id)).into_response())
}

/// Thread `id` fitted as `query` asks: the projection fitted to the model, with the budget
/// breakdown and what fitting left out; each mistake in `query` names its field.
pub(crate) async fn fitted_context<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    actor: &Actor,
    id: &str,
    query: &ContextQuery,
) -> ApiResult<FittedContext> {
    let settings = fit_settings::settings(
        state,
        &actor.learner(),
        &query.model,
        query.strategy.as_deref(),
        query.budget_ratio,
        query.reserve_output,
        query.max_tokens,
    )
    .await?;
    match fit_thread_on(threads.store(), id, &settings, &state.cpu, actor.key()).await {
        Ok(fitted) => {
            fit_settings::metered(state, &fitted);
            Ok(FittedContext {
                model: settings.model.id.clone(),
                fitted,
            })
        }
        Err(error) => Err(thread_fit_error(threads, error)),
    }
}

/// A thread fitted to a model.
pub(crate) struct FittedContext {
    /// The model's id.
    pub(crate) model: String,
    /// What fitting made.
    pub(crate) fitted: FittedRequest,
}

impl FittedContext {
    /// The answer of `GET /v1/threads/{id}/context` for thread `thread`.
    pub(crate) fn answer<'a>(&'a self, thread: &'a str) -> ContextAnswer<'a> {
        ContextAnswer {
            thread,
            model: &self.model,
            messages: openai::WireMessages(&self.fitted.messages),
            budget: &self.fitted.breakdown,
            fit: &self.fitted.fit,
        }
    }
}

/// The answer of `GET /v1/threads/{id}/context`, written straight to the response body.
#[derive(Serialize)]
pub(crate) struct ContextAnswer<'a> {
    thread: &'a str,
    model: &'a str,
    messages: openai::WireMessages<'a>,
    budget: &'a BudgetBreakdown,
    fit: &'a FitRecord,
}

/// The answer to a thread that could not be read (a store error, told as the tenant sees
/// it) or fitted.
fn thread_fit_error<S: StoreView>(threads: &TenantStore<'_, S>, error: ThreadFitError) -> ApiError {
    match error {
        ThreadFitError::Store(error) => threads.error(error),
        ThreadFitError::Fit(error) => fit_settings::fit_error(error),
    }
}

/// `GET /v1/threads/{id}/messages` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    /// A named context instead of the active one.
    context: Option<String>,
    /// Only the last this many units (a message, or an assistant turn with its tool
    /// results), 1 to 100,000.
    limit: Option<usize>,
}

/// `GET /v1/threads/{id}/messages`: the projection of the active context (or `context`),
/// its last `limit` units only when given: a tool result always comes with its call.
pub async fn messages(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<MessagesQuery>,
) -> ApiResult<Response> {
    let threads = state.tenant_store(&caller.tenant);
    id_param("a thread id", &id)?;
    if let Some(limit) = query.limit
        && !(1..=100_000).contains(&limit)
    {
        return Err(ApiError::invalid("limit", "limit must be 1 to 100000"));
    }
    if let Some(context) = &query.context {
        check_context_param(context)?;
    }
    let view = MessageView {
        context: query.context.clone(),
        limit: query.limit,
        fit: None,
    };
    let messages = match thread_messages(threads.store(), &id, &view).await {
        Ok(messages) => messages,
        Err(ThreadReadError::Thread(error)) => return Err(thread_fit_error(&threads, error)),
        Err(ThreadReadError::UnknownContext(unknown)) => {
            return Err(ApiError::unknown_context(&id, &unknown));
        }
    };
    Ok(Json(MessagesAnswer {
        thread: &id,
        context: query.context.as_deref(),
        messages: openai::WireMessages(&messages),
    })
    .into_response())
}

/// The answer of `GET /v1/threads/{id}/messages`.
#[derive(Serialize)]
struct MessagesAnswer<'a> {
    thread: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a str>,
    messages: openai::WireMessages<'a>,
}

/// `GET /v1/threads/{id}/search` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    /// The text to look for (case-insensitive).
    query: String,
    /// At most this many hits (default 20, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/threads/{id}/search`: the thread's messages that hold a text, oldest first,
/// each with its event's seq and type, its role and an excerpt around the match.
pub async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<SearchQuery>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    Ok(Json(
        search_in(&threads, &id, &query.query, query.limit).await?,
    ))
}

/// The first `limit` (default 20, at most 1000) messages of thread `id` that hold `query`:
/// `{thread, query, hits}`.
pub(crate) async fn search_in<S: StoreView>(
    threads: &TenantStore<'_, S>,
    id: &str,
    query: &str,
    limit: Option<usize>,
) -> ApiResult<Value> {
    let limit = limit.unwrap_or(20);
    if !(1..=MAX_SEARCH_HITS).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!("limit must be 1 to {MAX_SEARCH_HITS}"),
        ));
    }
    let hits = threads.search(id, query, limit).await?;
    Ok(json!({ "thread": id, "query": query, "hits": hits }))
}

/// `GET /v1/threads/{id}/events` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Events with seq above this (default 0: from the start).
    #[serde(default)]
    after: u64,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/threads/{id}/events`: a page of events, at most `limit` of them and about
/// `limits.max_page_bytes` of JSON (a request record is as large as what it sent);
/// `next_after` continues it.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<EventsQuery>,
) -> ApiResult<Response> {
    let limit = page_limit(query.limit)?;
    let tenant = &caller.tenant;
    let page = state
        .tenant_store(tenant)
        .events_page(&id, query.after, limit, state.config.limits.max_page_bytes)
        .await?;
    let next_after = if page.more {
        page.events.last().map(|event| event.seq)
    } else {
        None
    };
    // Each event becomes JSON on its own, so the page is never held twice over.
    let mut body = Vec::new();
    body.extend_from_slice(b"{\"events\":[");
    for (i, event) in page.events.into_iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        // Writing an event into memory cannot fail.
        let _ = serde_json::to_writer(&mut body, &event);
    }
    body.extend_from_slice(b"],\"next_after\":");
    let _ = serde_json::to_writer(&mut body, &next_after);
    body.push(b'}');
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

/// `POST /v1/threads/{id}/fork` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkThread {
    /// The fork's id (default: a fresh UUID).
    id: Option<String>,
    /// The parent's last event the fork shares (default: its last event).
    at_seq: Option<u64>,
}

/// `POST /v1/threads/{id}/fork`: 201 with the fork's id and its `forked` event's seq.
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ForkThread>,
) -> ApiResult<Response> {
    let threads = state.tenant_store(&caller.tenant);
    let answer = fork_as(&threads, &id, body.id, body.at_seq).await?;
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Forks thread `parent` at `at_seq` (default: its last event) as thread `child` (default:
/// a fresh id; a bad one is refused naming `id`): `{id, parent, at_seq, forked_seq}`.
pub(crate) async fn fork_as<S: StoreView>(
    threads: &TenantStore<'_, S>,
    parent: &str,
    child: Option<String>,
    at_seq: Option<u64>,
) -> ApiResult<Value> {
    let child = child.unwrap_or_else(fresh_id);
    id_param("a thread id", &child)?;
    threads.refuse_writes(parent)?;
    let forked = threads.fork(parent, at_seq, &child).await?;
    Ok(json!({
        "id": child,
        "parent": parent,
        "at_seq": forked.at_seq,
        "forked_seq": forked.forked_seq
    }))
}

/// `POST /v1/threads/{id}/merge` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeThread {
    /// The fork to merge into this thread.
    from: String,
    /// `append-messages` (default), `summary-only` or `output-keys`.
    #[serde(default)]
    policy: MergePolicy,
    /// `child-wins` (default), `parent-wins`, `error` or `append`.
    #[serde(default)]
    conflict: ConflictPolicy,
    /// The fork's store keys to bring back: a list of names, or `"all"`.
    #[serde(default)]
    keys: MergeKeys,
}

/// `POST /v1/threads/{id}/merge`: merges a fork back; returns the merge event's seq.
pub async fn merge(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MergeThread>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    let spec = MergeSpec {
        policy: body.policy,
        conflict: body.conflict,
        keys: body.keys,
    };
    let seq = threads.merge(&id, &body.from, &spec).await?;
    Ok(Json(json!({ "seq": seq, "from": body.from })))
}

/// `POST /v1/threads/{id}/restore` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreThread {
    /// The seq of the replace event (a compaction, a clear) whose covered messages come back.
    before: u64,
}

/// `POST /v1/threads/{id}/restore`: puts back the projection as it was just before a
/// replace event, messages appended since included, as one more event (nothing is deleted,
/// so a restore can be undone the same way); returns its seq.
pub async fn restore(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RestoreThread>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    let seq = threads.restore(&id, body.before).await?;
    Ok(Json(json!({ "seq": seq })))
}

/// `POST /v1/threads/{id}/pop` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PopItem {
    /// The format of the item taken: `openai` (a message, the default) or `responses` (one
    /// item of a turn).
    #[serde(default)]
    format: ItemFormat,
}

/// `POST /v1/threads/{id}/pop`: takes the newest item off the thread's conversation as one
/// replace event (the log keeps it) and returns it (`null` when the conversation is
/// empty): what a client's session does when it rewinds a turn.
pub async fn pop(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PopItem>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    let item = threads.pop(&id, body.format).await?;
    Ok(Json(json!({ "item": item })))
}

/// `POST /v1/threads/{id}/clear` body: none of its own (an empty object).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearThread {}

/// `POST /v1/threads/{id}/clear`: empties the thread's conversation (its system prompt and
/// pinned messages stay) as one replace event, which `restore` undoes; returns its seq
/// (`null` when there was nothing to clear).
pub async fn clear(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(ClearThread {}): JsonBody<ClearThread>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    let seq = threads.clear(&id).await?;
    Ok(Json(json!({ "seq": seq })))
}

/// `POST /v1/threads/{id}/compact` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactThread {
    /// The summarizer model (default: the configured policy's, else the offline
    /// extractive summarizer).
    pub(crate) model: Option<String>,
    /// Keep at most this many recent tokens verbatim.
    pub(crate) keep_tokens: Option<u64>,
    /// Keep at most this many recent messages verbatim.
    pub(crate) keep_messages: Option<usize>,
    /// Notes kept verbatim before the summary, never sent to the summarizer.
    pub(crate) notes: Option<String>,
    /// False keeps only the notes (default true).
    pub(crate) preserve_history: Option<bool>,
    /// The model whose tokenizer measures before and after (default gpt-4o).
    pub(crate) tokens_model: Option<String>,
    /// The seconds one summarizer call may take (default: the configured policy's, 600).
    pub(crate) timeout_secs: Option<u64>,
}

/// `POST /v1/threads/{id}/compact`: one recorded, reversible compaction; the report says
/// what was covered and the tokens before and after. A failed summarizer replaces nothing.
pub async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CompactThread>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let actor = Actor::Tenant(caller.tenant.clone());
    let report = compact_thread(&state, &threads, &actor, &id, body).await?;
    Ok(Json(serde_json::to_value(&report).unwrap_or_default()))
}

/// Compacts thread `id` as `body` asks: one recorded, reversible compaction; its report.
pub(crate) async fn compact_thread<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    actor: &Actor,
    id: &str,
    body: CompactThread,
) -> ApiResult<CompactionReport> {
    threads.ensure(id).await?;
    threads.refuse_writes(id)?;
    // A compaction calls the summarizer for the tenant, as a chat turn calls the model: it
    // takes one of the tenant's places and waits for the thread's turns before it, so its
    // calls never overlap a turn's.
    let _slot = match actor {
        Actor::Tenant(tenant) => Some(state.chat.take_slot(tenant)?),
        Actor::Operator => None,
    };
    let _turn = threads
        .wait_for_turn(&state.turns, id, state.config.limits.thread_turn_wait())
        .await?;
    let options = CompactOptions {
        summarizer: body.model,
        keep_tokens: body.keep_tokens,
        keep_messages: body.keep_messages,
        notes: body.notes,
        preserve_history: body.preserve_history,
        measure_model: body.tokens_model,
        timeout_secs: body.timeout_secs,
        ..CompactOptions::default()
    };
    let policy = state.config.compaction.clone().unwrap_or_default();
    let request = options
        .request(policy, "api")
        .map_err(|invalid| ApiError::invalid(invalid.field, invalid.problem))?;
    let report = compact_stored(&state.compactor, threads.store(), id, &request)
        .await
        .map_err(|error| match error {
            CompactionError::Store(error) => threads.error(error),
            other => ApiError::unprocessable(other.to_string()),
        })?;
    state.metrics.compaction(&report.outcome);
    Ok(report)
}

/// `DELETE /v1/threads/{id}`: 204; 409 while forks of it exist.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    threads.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
