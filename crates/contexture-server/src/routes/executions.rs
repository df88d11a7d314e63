//! `/v1/executions`: start a workflow run (202 with its id at once), its status with the
//! usage tree, its events as server-sent events, cascading cancel, the log of its LLM
//! requests. A tenant's run is queued and taken by whichever server on the database has
//! room (see the execution worker), and taken over by another when its server dies; status,
//! events and cancel work from any server.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use contexture_core::thread::{Event, EventKind};
use contexture_engine::conversation::ConversationKey;
use contexture_engine::executor::{
    CHILD_SEPARATOR, ExecError, Executor, RunRequest, user_context_from_value,
};
use contexture_engine::report::{
    CallsKept, ExecutionStatus, ReadReport, read_report, usage_tree_of,
};
use contexture_engine::workflow::{Workflow, WorkflowOrigin};
use contexture_store::{ExecutionQueueStore, QueueState, Store, StoreError};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::{BodyBytes, JsonBody, QueryParams};
use crate::error::{ApiError, ApiResult};
use crate::execution_worker::QueuedRun;
use crate::routes::fresh_id;
use crate::tenancy::{Actor, Tenant, check_id};
use crate::tenant_store::{StoreView, TenantStore};

/// How often an event stream looks for new events.
const POLL: Duration = Duration::from_millis(100);

/// `POST /v1/executions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartExecution {
    /// A workflow file under the server's workflows directory.
    workflow: Option<String>,
    /// Or the workflow's YAML text (its sub-workflows are read from the workflows
    /// directory).
    workflow_yaml: Option<String>,
    /// The input: a JSON object (its keys fill the context store) or a text.
    #[serde(default)]
    input: Value,
    /// The execution's id (default: a fresh UUID).
    id: Option<String>,
    /// Continue a conversation of this user (and chat).
    conversation: Option<ConversationBody>,
    /// The run's user context: a JSON object every template of the run and of its
    /// sub-workflows reads, read-only, as `user_context.KEY`.
    #[serde(default)]
    user_context: Option<Value>,
}

/// A conversation named by a request; the tenant is the caller's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationBody {
    /// The user.
    pub(crate) user: String,
    /// A chat id, for several conversations of one user with one workflow.
    pub(crate) chat: Option<String>,
}

/// The name a workflow sent as text is known by, in its diagnostics and its log.
const REQUEST_WORKFLOW: &str = "request.yaml";

/// Older logs recorded workflow files with the server's directory; responses never show it.
pub(crate) fn relative_text(state: &AppState, text: String) -> String {
    match &state.workflows_dir {
        Some(dir) => text.replace(&format!("{}/", dir.display()), ""),
        None => text,
    }
}

/// The text of validation problems for a client. A parse error of one of the operator's
/// files says where, never what the parser quoted from it: the file may hold anything.
fn diagnostics_text(error: &ExecError) -> String {
    let ExecError::Workflow(error) = error else {
        return error.to_string();
    };
    error
        .diagnostics
        .iter()
        .map(|diagnostic| {
            if diagnostic.path.is_empty() && diagnostic.file != REQUEST_WORKFLOW {
                let mut hidden = diagnostic.clone();
                hidden.message =
                    "not a valid workflow (the server's log has the parser's message)".into();
                hidden.to_string()
            } else {
                diagnostic.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The workflow a start names.
#[derive(Debug, Clone)]
pub(crate) enum WorkflowChoice {
    /// A file under the server's workflows directory, by its relative name.
    Named(String),
    /// The workflow's YAML text, sent by a client.
    Text(String),
    /// A file of the host's, by its path: only the operator at a terminal names one.
    HostFile(String),
}

/// The run a start asks for, its workflow read (from the workflows directory, the
/// request's text, or the operator's file) and validated with its sub-workflows.
fn validated_request(
    state: &AppState,
    choice: WorkflowChoice,
) -> ApiResult<(RunRequest, Workflow)> {
    let (file, text, origin) = match choice {
        WorkflowChoice::Named(name) => {
            let (file, text) = state
                .read_workflow(&name)
                .map_err(|problem| ApiError::invalid("workflow", problem))?;
            (file, text, WorkflowOrigin::Operator)
        }
        WorkflowChoice::Text(text) => (REQUEST_WORKFLOW.to_owned(), text, WorkflowOrigin::Client),
        WorkflowChoice::HostFile(path) => {
            let text = std::fs::read_to_string(&path).map_err(|error| {
                ApiError::invalid(
                    "workflow",
                    format!("cannot read workflow `{path}`: {error}"),
                )
            })?;
            (path, text, WorkflowOrigin::Operator)
        }
    };
    let mut request = RunRequest::new(file.clone(), text, String::new());
    request.origin = origin;
    let workflow = state.executor.validate(&request).map_err(|error| {
        if origin == WorkflowOrigin::Operator {
            tracing::warn!(workflow = %file, %error, "a workflow of the operator's is invalid");
        }
        let param = match origin {
            WorkflowOrigin::Operator => "workflow",
            WorkflowOrigin::Client => "workflow_yaml",
        };
        ApiError::invalid(param, diagnostics_text(&error))
    })?;
    Ok((request, workflow))
}

/// What a start asks for, besides its workflow.
#[derive(Debug, Default)]
pub(crate) struct StartSpec {
    /// The input: a JSON object (its keys fill the context store) or a text.
    pub(crate) input: Value,
    /// The execution's id (default: a fresh UUID).
    pub(crate) id: Option<String>,
    /// Continue a conversation of this user (and chat).
    pub(crate) conversation: Option<ConversationBody>,
    /// The run's user context (a JSON object).
    pub(crate) user_context: Option<Value>,
}

/// `POST /v1/executions`: validates the workflow (and its sub-workflows), then starts the
/// run in the background and answers 202 with its id.
pub async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<StartExecution>,
) -> ApiResult<Response> {
    let choice = match (body.workflow, body.workflow_yaml) {
        (Some(name), None) => WorkflowChoice::Named(name),
        (None, Some(text)) => WorkflowChoice::Text(text),
        _ => {
            return Err(ApiError::invalid(
                "workflow",
                "give exactly one of `workflow` (a file in the workflows directory) and `workflow_yaml`",
            ));
        }
    };
    let spec = StartSpec {
        input: body.input,
        id: body.id,
        conversation: body.conversation,
        user_context: body.user_context,
    };
    let threads = state.tenant_store(&caller.tenant);
    let actor = Actor::Tenant(caller.tenant.clone());
    let (id, status) = start_execution(&state, &threads, &actor, choice, spec).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "status": status})),
    )
        .into_response())
}

/// Validates the workflow (and its sub-workflows), writes the start of the run's log on
/// `threads`' store, and queues it (a tenant's) or starts it here (the operator's); answers
/// its id and where it stands (`queued` or `running`) once its log exists.
pub(crate) async fn start_execution<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    actor: &Actor,
    choice: WorkflowChoice,
    spec: StartSpec,
) -> ApiResult<(String, &'static str)> {
    // Checked before the workflow is read: a bad body is refused whatever it names.
    let user_context = spec
        .user_context
        .map(user_context_from_value)
        .transpose()
        .map_err(|error| ApiError::invalid("user_context", error.to_string()))?;
    let (mut request, workflow) = {
        let state = state.clone();
        // Reading the workflow and its sub-workflows blocks on the disk: off the runtime.
        tokio::task::spawn_blocking(move || validated_request(&state, choice))
            .await
            .map_err(|error| {
                ApiError::internal(format!("workflow validation stopped: {error}"))
            })??
    };
    let file = request.workflow_file.clone();
    let id = spec.id.unwrap_or_else(fresh_id);
    check_id("an execution id", &id).map_err(|problem| ApiError::invalid("id", problem))?;
    if id.contains([CHILD_SEPARATOR, '/']) {
        // Sub-workflow executions are named `PARENT~STATE.VISIT` (and were `PARENT/...`).
        return Err(ApiError::invalid(
            "id",
            format!("an execution id may not contain `{CHILD_SEPARATOR}` or `/`"),
        ));
    }
    // The run's name in the whole store, for this process's registry and logs.
    let global = threads.store().global_id(&id);
    if threads.exists(&id).await? {
        return Err(ApiError::conflict(format!(
            "execution `{id}` already exists"
        )));
    }
    let input = match spec.input {
        Value::String(text) => text,
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let conversation = match spec.conversation {
        Some(conversation) => {
            check_id("conversation.user", &conversation.user)
                .map_err(|problem| ApiError::invalid("conversation.user", problem))?;
            Some(ConversationKey::new(
                &conversation.user,
                conversation.chat,
                &workflow,
                &file,
            ))
        }
        None => None,
    };
    request.input = input;
    request.execution_id = Some(id.clone());
    request.llm = Some(state.config.llm.clone());
    request.conversation = conversation;
    request.user_context = user_context;
    // The run sees the actor's threads only.
    let executor = threads.executor(&state.executor);
    let status = match actor {
        Actor::Tenant(tenant) => {
            queue_run(state, &executor, tenant, request, &id, &global).await?;
            "queued"
        }
        Actor::Operator => {
            run_here(state, threads, actor, executor, request, &id, &global).await?;
            "running"
        }
    };
    Ok((id, status))
}

/// Writes the start of a tenant's run to its log and queues it: this server or another
/// takes it from the queue within the tenant's limit of running executions.
async fn queue_run<S: StoreView>(
    state: &AppState,
    executor: &Executor<S>,
    tenant: &Tenant,
    request: RunRequest,
    id: &str,
    global: &str,
) -> ApiResult<()> {
    let opened = executor.open(request).await.map_err(|error| match error {
        ExecError::AlreadyExists { .. } => {
            ApiError::conflict(format!("execution `{id}` already exists"))
        }
        ExecError::Store(error) => ApiError::store(&error),
        other => ApiError::invalid("workflow", other.to_string()),
    })?;
    debug_assert_eq!(opened, id);
    let queued = serde_json::to_value(QueuedRun {
        execution: id.to_owned(),
    })
    .map_err(ApiError::internal)?;
    if let Err(error) = state
        .store
        .enqueue_execution(global, tenant.name(), &queued)
        .await
    {
        if let Err(also) = executor.end_unqueued(id, &error.to_string()).await {
            tracing::error!(execution = %global, %also, "a run that could not be queued cannot be marked failed");
        }
        return Err(ApiError::store(&error));
    }
    state.worker.start(state);
    state.worker.wake();
    Ok(())
}

/// Runs the operator's run in this process at once (the operator's own door, at a
/// terminal, serves one user; its runs are not queued for servers on other hosts, whose
/// files its workflows may not name).
async fn run_here<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    actor: &Actor,
    executor: Executor<S>,
    request: RunRequest,
    id: &str,
    global: &str,
) -> ApiResult<()> {
    let slot = state.running.take(actor.key())?;
    let active = state.active_runs.enter(global);
    let name = global.to_owned();
    let run = tokio::spawn(async move {
        let _slot = slot;
        let _active = active;
        match executor.start(request).await {
            Ok(_) => tracing::info!(execution = %name, "execution completed"),
            Err(ExecError::Cancelled { .. }) => {
                tracing::info!(execution = %name, "execution cancelled")
            }
            Err(error) => tracing::warn!(execution = %name, %error, "execution failed"),
        }
    });
    // Answer once the run's log exists, so that status, events and cancel find it at once.
    let logged = tokio::time::timeout(Duration::from_secs(10), async {
        while !run.is_finished() {
            if matches!(threads.exists(id).await, Ok(true)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    if logged.is_err() {
        tracing::warn!(execution = %global, "the run's log did not appear within 10 s");
    }
    Ok(())
}

/// The first `limit` events of the tenant's execution `id` after seq `after` (a page, see
/// [`Store::events_page`](contexture_store::Store::events_page)); a 404 for a thread that
/// is not there.
async fn execution_page<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    id: &str,
    after: u64,
    limit: usize,
) -> ApiResult<Vec<Event>> {
    let page = threads
        .events_page(id, after, limit, state.config.limits.max_page_bytes)
        .await
        .map_err(|error| match error {
            not_found if not_found.status == StatusCode::NOT_FOUND => {
                ApiError::not_found("execution", id)
            }
            other => other,
        })?;
    Ok(page.events)
}

/// Checks that the tenant's thread `id` is an execution (it starts with a run's start),
/// reading its first event only.
async fn check_execution(state: &AppState, tenant: &Tenant, id: &str) -> ApiResult<()> {
    let first = execution_page(state, &state.tenant_store(tenant), id, 0, 1).await?;
    match first.first().map(|event| &event.kind) {
        Some(EventKind::RunStarted(_)) => Ok(()),
        // A thread that is not an execution.
        _ => Err(ApiError::not_found("execution", id)),
    }
}

/// The report of the tenant's execution `id`, read a page of events at a time, with the
/// calls `kept` (the calls of its forked steps among them).
pub(crate) async fn execution_report<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    id: &str,
    kept: CallsKept,
) -> ApiResult<ReadReport> {
    read_report(
        threads.store(),
        id,
        kept,
        state.config.limits.max_page_bytes,
    )
    .await
    .map_err(|error| match error {
        StoreError::NotFound { .. } => ApiError::not_found("execution", id),
        other => threads.error(other),
    })?
    .ok_or_else(|| ApiError::not_found("execution", id))
}

/// `GET /v1/executions/{id}`: status, steps, calls, usage, and the usage tree of the
/// execution and its sub-executions.
pub async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    Ok(Json(execution_status(&state, &threads, &id).await?))
}

/// The status of execution `id`: status, output or error, steps, calls, usage, and the
/// usage tree of the execution and its sub-executions.
pub(crate) async fn execution_status<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    id: &str,
) -> ApiResult<Value> {
    let report = execution_report(state, threads, id, CallsKept::None)
        .await?
        .report;
    let tree = usage_tree_of(threads.store(), &report, state.config.limits.max_page_bytes).await?;
    let mut value = json!({
        "id": id,
        "status": report.status,
        "output": report.output,
        "error": report.error,
        "cancel_requested": report.cancel_requested,
        "usage": report.usage,
        "cost_usd": report.cost_usd,
        "steps": report.steps,
        "children": report.children,
        "parent_execution_id": report.parent_execution_id,
        "usage_tree": tree,
    });
    if let Some(queued) = state
        .store
        .queued_execution(&threads.store().global_id(id))
        .await
        .map_err(|error| ApiError::store(&error))?
    {
        if queued.state == QueueState::Queued && report.status == ExecutionStatus::Running {
            value["status"] = json!("queued");
        }
        value["queue"] = json!({
            "state": queued.state,
            "attempts": queued.attempts,
            "adopted": queued.attempts > 1,
            "database_failures": queued.failures,
            "node": queued.owner,
            "lease_live": queued.lease_live,
            "outcome": queued.outcome,
            "enqueued_at_ms": queued.enqueued_at_ms,
            "started_at_ms": queued.started_at_ms,
            "finished_at_ms": queued.finished_at_ms,
        });
    }
    strip_workflow_paths(state, &mut value);
    Ok(value)
}

/// Workflow files are shown relative to the workflows directory.
fn strip_workflow_paths(state: &AppState, value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(text) if key == "workflow_file" => {
                        *text = relative_text(state, std::mem::take(text));
                    }
                    other => strip_workflow_paths(state, other),
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| strip_workflow_paths(state, item)),
        _ => {}
    }
}

/// `GET /v1/executions/{id}/requests` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestsQuery {
    /// Requests after the first `after` (default 0: from the first).
    #[serde(default)]
    after: usize,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/executions/{id}/requests`: a page of the execution's LLM requests, in order:
/// exactly the messages sent, the budget breakdown, what fitting left out, and how each
/// call ended. At most `limit` of them and about `limits.max_page_bytes` of JSON (a request
/// is as large as what it sent; the first always); `next_after` continues it.
pub async fn requests(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<RequestsQuery>,
) -> ApiResult<Json<Value>> {
    let kept = CallsKept::Page {
        after: query.after,
        limit: crate::routes::threads::page_limit(query.limit)?,
        max_bytes: state.config.limits.max_page_bytes,
    };
    let read = execution_report(&state, &state.tenant_store(&caller.tenant), &id, kept).await?;
    Ok(Json(json!({
        "id": id,
        "requests": read.report.calls,
        "next_after": read.next_after,
    })))
}

/// `POST /v1/executions/{id}/cancel` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelExecution {
    /// Why, recorded with the cancellation.
    reason: Option<String>,
}

/// `POST /v1/executions/{id}/cancel`: cancels the execution and its descendants, wherever
/// they run (through the store); lists the executions newly marked.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    BodyBytes(body): BodyBytes,
) -> ApiResult<Json<Value>> {
    let tenant = &caller.tenant;
    let reason = if body.is_empty() {
        None
    } else {
        crate::body::check_content_type(&headers)?;
        crate::body::parse::<CancelExecution>(&body)?.reason
    };
    check_execution(&state, tenant, &id).await?;
    let threads = state.tenant_store(tenant);
    let executor = state.tenant_executor(tenant);
    let failed = |error: ExecError| match error {
        ExecError::Store(error) => threads.error(error),
        other => ApiError::conflict(other.to_string()),
    };
    let marked = executor.cancel(&id, reason).await.map_err(failed)?;
    // A run still waiting in the queue will never run: it ends cancelled now, without
    // waiting for a server to take it.
    if state
        .store
        .finish_queued_execution(&threads.store().global_id(&id), "cancelled")
        .await
        .map_err(|error| ApiError::store(&error))?
    {
        executor
            .end_cancelled_before_start(&id)
            .await
            .map_err(failed)?;
    }
    Ok(Json(json!({ "id": id, "cancel_requested": marked })))
}

/// `GET /v1/executions/{id}/events` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Start after this seq (default 0; the `Last-Event-ID` header also sets it).
    after: Option<u64>,
}

/// `GET /v1/executions/{id}/events`: the execution's events as server-sent events (`id`:
/// the seq, `event`: the event's type, `data`: the event as JSON), from `after`, live until
/// the run ends.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    QueryParams(query): QueryParams<EventsQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let tenant = caller.tenant.clone();
    check_execution(&state, &tenant, &id).await?;
    let after = match (query.after, headers.get("last-event-id")) {
        (Some(after), _) => after,
        (None, Some(value)) => value
            .to_str()
            .ok()
            .and_then(|value| value.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "Last-Event-ID",
                    "Last-Event-ID must be the seq of an event this stream sent (a whole number)",
                )
            })?,
        (None, None) => 0,
    };
    // A client that already has the whole log, and it ends with the run's end, gets a
    // stream that ends at once.
    let threads = state.tenant_store(&tenant);
    let info = threads
        .store()
        .thread_info(&id)
        .await
        .map_err(|error| threads.error(error))?;
    let ended = match info {
        Some(info) if info.last_seq <= after => {
            let last =
                execution_page(&state, &threads, &id, info.last_seq.saturating_sub(1), 1).await?;
            last.first()
                .is_some_and(|event| matches!(event.kind, EventKind::RunEnded(_)))
        }
        _ => false,
    };
    struct Cursor {
        after: u64,
        pending: std::collections::VecDeque<Event>,
        ended: bool,
        // Given back when the stream ends or its client goes away.
        _slot: contexture_engine::tenant_slots::Slot,
    }
    let cursor = Cursor {
        after,
        pending: Default::default(),
        ended,
        _slot: state.streams.take(tenant.name())?,
    };
    let stream = stream::unfold(cursor, move |mut cursor| {
        let state = state.clone();
        let id = id.clone();
        let tenant = tenant.clone();
        async move {
            loop {
                if let Some(event) = cursor.pending.pop_front() {
                    cursor.after = event.seq;
                    if matches!(event.kind, EventKind::RunEnded(_)) {
                        cursor.ended = true;
                    }
                    let data = serde_json::to_value(&event).unwrap_or_default();
                    let sse = SseEvent::default()
                        .id(event.seq.to_string())
                        .event(event.kind.type_name())
                        .data(data.to_string());
                    return Some((Ok(sse), cursor));
                }
                if cursor.ended {
                    return None;
                }
                // A page at a time, so a stream of a long log holds a page, not the log.
                let page = state
                    .tenant_store(&tenant)
                    .events_page(&id, cursor.after, 100, state.config.limits.max_page_bytes)
                    .await;
                match page {
                    Ok(page) if !page.events.is_empty() => cursor.pending.extend(page.events),
                    Ok(_) => tokio::time::sleep(POLL).await,
                    Err(error) => {
                        tracing::warn!(error = %error.message, "event stream stopped by a store error");
                        return None;
                    }
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
