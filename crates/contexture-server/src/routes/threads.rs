//! `/v1/threads`: create, append (idempotent with `Idempotency-Key`), the projection fitted
//! to a model with its budget, events paged by seq, fork, merge, compact, delete.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use contexture_core::budget::BudgetBreakdown;
use contexture_core::compact::CompactionPolicy;
use contexture_core::format::openai;
use contexture_core::thread::{
    ConflictPolicy, EventKind, FitRecord, MergePolicy, MergeSpec, StoreChange,
};
use contexture_core::tokens::Encoding;
use contexture_engine::compaction::{CompactRequest, compact_stored};
use contexture_engine::executor::ExecError;
use contexture_store::{NewEvent, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::{JsonBody, QueryParams};
use crate::error::{ApiError, ApiResult};
use crate::fitting;
use crate::routes::fresh_id;
use crate::tenancy::{Tenant, check_id};
use contexture_engine::fitting::{ThreadFitError, fit_thread};

/// Maps a store error on a tenant's thread to the client's view of it.
pub(crate) fn store_error(tenant: &Tenant, error: StoreError) -> ApiError {
    let text = || tenant.unscope_text(&error.to_string());
    match &error {
        StoreError::NotFound { thread } => {
            ApiError::not_found("thread", tenant.unscope(thread).unwrap_or(thread))
        }
        StoreError::AlreadyExists { .. } => ApiError::conflict(text()),
        StoreError::HasForks { thread, forks } => {
            let unscoped = |id: &str| tenant.unscope(id).unwrap_or(id).to_owned();
            let forks: Vec<String> = forks.iter().map(|fork| unscoped(fork)).collect();
            ApiError::conflict(format!(
                "thread `{}` has forks ({}); delete them first",
                unscoped(thread),
                forks.join(", ")
            ))
        }
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

/// What a client can do about a full thread.
const THREAD_FULL_REMEDY: &str = "start a new thread (a fork shares its parent's events and counts them, or carry a summary over)";

/// Fails with 404 unless the tenant's thread exists.
pub(crate) async fn ensure_thread(state: &AppState, tenant: &Tenant, id: &str) -> ApiResult<()> {
    let scoped = tenant.scope(id);
    match state.store.exists(&scoped).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(store_error(tenant, StoreError::NotFound { thread: scoped })),
        Err(error) => Err(store_error(tenant, error)),
    }
}

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
}

/// `POST /v1/threads`: 201 with the id and the last seq.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateThread>,
) -> ApiResult<Response> {
    let tenant = &caller.tenant;
    let id = body.id.unwrap_or_else(fresh_id);
    id_param("a thread id", &id)?;
    let mut messages = match &body.messages {
        Some(value) => parse_messages(value, "messages")?,
        None => Vec::new(),
    };
    if let Some(system) = body.system {
        messages.insert(0, contexture_core::Message::system(system));
    }
    let scoped = tenant.scope(&id);
    if state
        .store
        .exists(&scoped)
        .await
        .map_err(|error| store_error(tenant, error))?
    {
        return Err(ApiError::conflict(format!("thread `{id}` already exists")));
    }
    let mut events = vec![NewEvent::new(EventKind::StoreChanged(StoreChange::Set {
        key: "metadata".into(),
        value: body.metadata.unwrap_or_else(|| json!({})),
    }))];
    events.extend(
        messages
            .into_iter()
            .map(|message| NewEvent::new(EventKind::MessageAppended { message })),
    );
    let seqs = state
        .store
        .append(&scoped, events)
        .await
        .map_err(|error| store_error(tenant, error))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "last_seq": seqs.last().copied().unwrap_or(0)})),
    )
        .into_response())
}

/// A page's size: `limit` (default 100), 1 to 1000.
fn page_limit(limit: Option<usize>) -> ApiResult<usize> {
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
    let limit = page_limit(query.limit)?;
    let tenant = &caller.tenant;
    let prefix = tenant.scope("");
    let after = query
        .after
        .as_deref()
        .map(|after| tenant.scope(after))
        .unwrap_or_default();
    let page = state.store.list_page(&prefix, &after, limit + 1).await?;
    let more = page.len() > limit;
    let mut threads = Vec::with_capacity(limit);
    for info in page.into_iter().take(limit) {
        let mut value = serde_json::to_value(&info).unwrap_or_default();
        tenant.unscope_json(&mut value);
        threads.push(value);
    }
    let next_after = if more {
        threads
            .last()
            .and_then(|thread| thread["id"].as_str().map(str::to_owned))
    } else {
        None
    };
    Ok(Json(
        json!({ "threads": threads, "next_after": next_after }),
    ))
}

/// `GET /v1/threads/{id}`: the thread's summary.
pub async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    // Only the newest message is needed: the older ones are counted, not read.
    let thread = state
        .store
        .load_projection_tail(&tenant.scope(&id), Encoding::O200kBase, 0)
        .await
        .map_err(|error| store_error(tenant, error))?;
    let projection = &thread.projection;
    let mut value = json!({
        "id": id,
        "last_seq": thread.last_seq,
        "messages": projection.messages.len()
            + thread.unread
            + usize::from(projection.system.is_some()),
        "metadata": thread.store.get("metadata").cloned().unwrap_or(Value::Null),
        "parent": thread.fork.as_ref().map(|fork| fork.parent.clone()),
        "fork_seq": thread.fork.as_ref().map(|fork| fork.at_seq),
    });
    tenant.unscope_json(&mut value);
    Ok(Json(value))
}

/// `POST /v1/threads/{id}/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendMessages {
    /// The messages (OpenAI format), appended in one transaction.
    messages: Value,
}

/// `POST /v1/threads/{id}/messages`: appends in one transaction and returns each seq. With
/// `Idempotency-Key: K`, message i carries key `K:i`, so a retried request stores nothing
/// and returns the seqs of the first. Creates the thread when it does not exist.
pub async fn append(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<AppendMessages>,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    id_param("a thread id", &id)?;
    state.active_runs.refuse_writes(&tenant.scope(&id), &id)?;
    let messages = parse_messages(&body.messages, "messages")?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: the array is empty",
        ));
    }
    let key = crate::body::idempotency_key(&headers)?;
    let events = NewEvent::messages(messages, key.as_deref());
    let seqs = state
        .store
        .append(&tenant.scope(&id), events)
        .await
        .map_err(|error| store_error(tenant, error))?;
    Ok(Json(json!({ "seqs": seqs })))
}

/// `GET /v1/threads/{id}/context` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextQuery {
    /// The model to fit for (its window and tokenizer).
    model: String,
    /// At most this many tokens for the request (default: the model's budget).
    max_tokens: Option<u32>,
    /// `last`, `first`, `head-tail`, `head-tail:N`.
    strategy: Option<String>,
    /// The share of the window to use.
    budget_ratio: Option<f64>,
    /// Tokens reserved for the reply.
    reserve_output: Option<u32>,
}

/// `GET /v1/threads/{id}/context`: the projection fitted to a model, with the budget
/// breakdown and what fitting left out.
pub async fn context(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ContextQuery>,
) -> ApiResult<Response> {
    let tenant = &caller.tenant;
    let mut settings = fitting::settings(
        &state,
        &query.model,
        query.strategy.as_deref(),
        query.budget_ratio,
        query.reserve_output,
    )?;
    if let Some(max) = query.max_tokens {
        settings
            .cap_tokens(max)
            .map_err(|error| ApiError::invalid("budget_ratio", error.to_string()))?;
    }
    let fitted = match fit_thread(&state.store, &tenant.scope(&id), &settings).await {
        Ok(fitted) => {
            fitting::metered(&state, &fitted);
            fitted
        }
        Err(ThreadFitError::Store(error)) => return Err(store_error(tenant, error)),
        Err(ThreadFitError::Fit(error)) => return Err(fitting::fit_error(error)),
    };
    Ok(Json(ContextAnswer {
        thread: &id,
        model: &settings.model.id,
        messages: openai::WireMessages(&fitted.messages),
        budget: &fitted.breakdown,
        fit: &fitted.fit,
    })
    .into_response())
}

/// The answer of `GET /v1/threads/{id}/context`, written straight to the response body.
#[derive(Serialize)]
struct ContextAnswer<'a> {
    thread: &'a str,
    model: &'a str,
    messages: openai::WireMessages<'a>,
    budget: &'a BudgetBreakdown,
    fit: &'a FitRecord,
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

/// `GET /v1/threads/{id}/events`: a page of events; `next_after` continues it.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<EventsQuery>,
) -> ApiResult<Json<Value>> {
    let limit = page_limit(query.limit)?;
    let tenant = &caller.tenant;
    let events = state
        .store
        .events_after(&tenant.scope(&id), query.after)
        .await
        .map_err(|error| store_error(tenant, error))?;
    let more = events.len() > limit;
    let page: Vec<_> = events.into_iter().take(limit).collect();
    let next_after = if more {
        page.last().map(|event| event.seq)
    } else {
        None
    };
    let mut value = json!({ "events": page, "next_after": next_after });
    tenant.unscope_json(&mut value);
    Ok(Json(value))
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
    let tenant = &caller.tenant;
    let child = body.id.unwrap_or_else(fresh_id);
    id_param("a thread id", &child)?;
    state.active_runs.refuse_writes(&tenant.scope(&id), &id)?;
    let at_seq = match body.at_seq {
        Some(at) => at,
        None => state
            .store
            .load(&tenant.scope(&id))
            .await
            .map_err(|error| store_error(tenant, error))?
            .last_seq(),
    };
    let seq = state
        .store
        .fork(&tenant.scope(&id), at_seq, &tenant.scope(&child))
        .await
        .map_err(|error| store_error(tenant, error))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": child, "parent": id, "at_seq": at_seq, "forked_seq": seq})),
    )
        .into_response())
}

/// `POST /v1/threads/{id}/merge` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeThread {
    /// The fork to merge into this thread.
    from: String,
    /// `append-messages` (default), `summary-only` or `output-keys`.
    #[serde(default = "default_merge_policy")]
    policy: MergePolicy,
    /// `child-wins` (default), `parent-wins`, `error` or `append`.
    #[serde(default = "default_conflict")]
    conflict: ConflictPolicy,
    /// The fork's store keys to bring back.
    #[serde(default)]
    keys: Vec<String>,
}

fn default_merge_policy() -> MergePolicy {
    MergePolicy::AppendMessages
}

fn default_conflict() -> ConflictPolicy {
    ConflictPolicy::ChildWins
}

/// `POST /v1/threads/{id}/merge`: merges a fork back; returns the merge event's seq.
pub async fn merge(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MergeThread>,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    let load = |id: String| {
        let state = state.clone();
        let tenant = tenant.clone();
        async move {
            state
                .store
                .load(&tenant.scope(&id))
                .await
                .map_err(|error| store_error(&tenant, error))
        }
    };
    state.active_runs.refuse_writes(&tenant.scope(&id), &id)?;
    let parent = load(id.clone()).await?;
    // The path's thread exists; a missing fork is a mistake in the body, not a missing
    // resource.
    let child = load(body.from.clone()).await.map_err(|error| {
        if error.status == StatusCode::NOT_FOUND {
            ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "unprocessable",
                message: format!("from: no thread `{}` to merge from", body.from),
                param: Some("from".into()),
            }
        } else {
            error
        }
    })?;
    let spec = MergeSpec {
        policy: body.policy,
        conflict: body.conflict,
        keys: body.keys,
    };
    let event = parent
        .plan_merge(&child, &spec)
        .map_err(|error| ApiError::conflict(tenant.unscope_text(&error.to_string())))?;
    let seq = state
        .store
        .append_one(&tenant.scope(&id), NewEvent::new(event))
        .await
        .map_err(|error| store_error(tenant, error))?;
    Ok(Json(json!({ "seq": seq, "from": body.from })))
}

/// `POST /v1/threads/{id}/compact` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactThread {
    /// The summarizer model (default: the configured policy's, else the offline
    /// extractive summarizer).
    model: Option<String>,
    /// Keep at most this many recent tokens verbatim.
    keep_tokens: Option<u64>,
    /// Keep at most this many recent messages verbatim.
    keep_messages: Option<usize>,
    /// Notes kept verbatim before the summary, never sent to the summarizer.
    notes: Option<String>,
    /// False keeps only the notes (default true).
    preserve_history: Option<bool>,
    /// The model whose tokenizer measures before and after (default gpt-4o).
    tokens_model: Option<String>,
}

/// `POST /v1/threads/{id}/compact`: one recorded, reversible compaction; the report says
/// what was covered and the tokens before and after. A failed summarizer replaces nothing.
pub async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CompactThread>,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    ensure_thread(&state, tenant, &id).await?;
    state.active_runs.refuse_writes(&tenant.scope(&id), &id)?;
    let mut policy = state
        .config
        .context
        .compaction
        .clone()
        .unwrap_or_else(CompactionPolicy::default);
    if body.model.is_some() {
        policy.summarizer = body.model.clone();
    }
    if body.keep_tokens.is_some() || body.keep_messages.is_some() {
        policy.keep.tokens = body.keep_tokens;
        policy.keep.messages = body.keep_messages;
    }
    if let Some((field, problem)) = policy.problems().into_iter().next() {
        return Err(ApiError::invalid(field, problem));
    }
    let mut request = CompactRequest::new(policy, "api");
    request.notes = body.notes;
    request.preserve_history = body.preserve_history.unwrap_or(true);
    if let Some(model) = body.tokens_model {
        request.measure_model = model;
    }
    let report = compact_stored(&state.compactor, &state.store, &tenant.scope(&id), &request)
        .await
        .map_err(|error| match error {
            ExecError::Store(error) => store_error(tenant, error),
            other => ApiError::unprocessable(tenant.unscope_text(&other.to_string())),
        })?;
    state.metrics.compaction(&report.outcome);
    let mut value = serde_json::to_value(&report).unwrap_or_default();
    tenant.unscope_json(&mut value);
    Ok(Json(value))
}

/// `DELETE /v1/threads/{id}`: 204; 409 while forks of it exist.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = &caller.tenant;
    state.active_runs.refuse_writes(&tenant.scope(&id), &id)?;
    state
        .store
        .delete(&tenant.scope(&id))
        .await
        .map_err(|error| store_error(tenant, error))?;
    Ok(StatusCode::NO_CONTENT)
}
