//! The inspector's web page, `/ui`: a shell page and its script and style (open: they hold
//! no data), and the views it shows, rendered as HTML fragments behind the same keys and
//! tenants as the API (`/ui/views/...`). The page keeps the key in the browser's session
//! storage and sends it as the bearer token; the key never goes in a URL.
//!
//! Every `/ui` answer carries a Content-Security-Policy that lets the page run only its own
//! script and load only from this server: a message whose text holds markup is escaped by
//! the templates, and could run nothing even if it were not.

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use contexture_engine::report::{CallsKept, usage_tree_of};
use contexture_inspector::{ContextView, ExecutionView, ForkRow, HomeView, Inspector, ThreadView};
use contexture_store::{RecentCursor, Store, ThreadInfo};
use serde::Deserialize;
use std::sync::LazyLock;

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::QueryParams;
use crate::error::{ApiError, ApiResult};
use crate::routes::executions::{execution_report, relative_text};
use crate::routes::threads::{ContextQuery, fitted_context};
use crate::tenancy::Actor;
use crate::tenant_store::{StoreView, TenantStore};

/// The inspector's templates, compiled once per process.
static INSPECTOR: LazyLock<Inspector> = LazyLock::new(Inspector::new);

/// The page's policy: its own script and style only, requests to this server only, no
/// frames, no forms posted elsewhere, no plugins.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The shell page.
const INDEX: &str = include_str!("../ui/index.html");
/// The page's script.
const SCRIPT: &str = include_str!("../ui/inspector.js");

/// Calls shown on one page of an execution's view.
const CALLS_PER_PAGE: usize = 20;

/// The routes anyone may call: the shell page, its script and its style.
pub(crate) fn open_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/ui", get(index)),
        ("/ui/", get(index)),
        ("/ui/inspector.js", get(script)),
        ("/ui/inspector.css", get(style)),
        ("/ui/favicon.svg", get(favicon)),
    ]
}

/// The views, behind authentication.
pub(crate) fn view_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/ui/views/home", get(home)),
        ("/ui/views/executions/{id}", get(execution)),
        ("/ui/views/threads/{id}", get(thread)),
    ]
}

/// Middleware for every `/ui` answer: the page's security headers.
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let on_ui = request.uri().path().starts_with("/ui");
    let mut response = next.run(request).await;
    if on_ui {
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        // Views hold a tenant's data: never kept by the browser or a proxy.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

async fn favicon() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "image/svg+xml")],
        include_str!("../ui/favicon.svg"),
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        contexture_inspector::STYLE,
    )
}

/// Threads listed on one page of the first view.
const THREADS_PER_PAGE: usize = 50;

/// The longest text searched for in ids.
const MAX_SEARCH_CHARS: usize = 200;

/// `GET /ui/views/home` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeQuery {
    /// Text the ids hold (default: every id).
    #[serde(default)]
    q: String,
    /// The page after this place (`MILLISECONDS:ID`, from the previous page's link).
    before: Option<String>,
}

/// `GET /ui/views/home`: the tenant's threads and executions, newest first, searchable by
/// id, a page at a time.
async fn home(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    QueryParams(query): QueryParams<HomeQuery>,
) -> ApiResult<Html<String>> {
    if query.q.chars().count() > MAX_SEARCH_CHARS {
        return Err(ApiError::invalid(
            "q",
            format!("q: search for at most {MAX_SEARCH_CHARS} characters"),
        ));
    }
    let cursor = match &query.before {
        Some(text) => {
            let cursor: RecentCursor = text
                .parse()
                .map_err(|problem| ApiError::invalid("before", format!("before: {problem}")))?;
            Some(cursor)
        }
        None => None,
    };
    let threads = state.tenant_store(&caller.tenant);
    let mut page = threads
        .store()
        .list_recent("", &query.q, cursor.as_ref(), THREADS_PER_PAGE + 1)
        .await
        .map_err(|error| threads.error(error))?;
    let more = page.len() > THREADS_PER_PAGE;
    page.truncate(THREADS_PER_PAGE);
    let view = HomeView::new(&query.q, page, more, cursor.is_none());
    let html = INSPECTOR
        .home_fragment(&view)
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Html(html))
}

/// `GET /ui/views/executions/{id}` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionViewQuery {
    /// Calls after the first `after` (default 0).
    #[serde(default)]
    after: usize,
}

/// `GET /ui/views/executions/{id}`: the tenant's execution as the inspector shows it, a page
/// of its calls at a time.
async fn execution(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ExecutionViewQuery>,
) -> ApiResult<Html<String>> {
    let threads = state.tenant_store(&caller.tenant);
    let kept = CallsKept::Page {
        after: query.after,
        limit: CALLS_PER_PAGE,
        max_bytes: state.config.limits.max_page_bytes,
    };
    let read = execution_report(&state, &threads, &id, kept).await?;
    let tree = usage_tree_of(
        threads.store(),
        &read.report,
        state.config.limits.max_page_bytes,
    )
    .await
    .map_err(|error| threads.error(error))?;
    let mut view = ExecutionView::new(&read, &tree, query.after);
    view.workflow_file = relative_text(&state, std::mem::take(&mut view.workflow_file));
    for row in &mut view.tree {
        row.workflow_file = relative_text(&state, std::mem::take(&mut row.workflow_file));
    }
    let html = INSPECTOR
        .execution_fragment(&view)
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Html(html))
}

/// Events shown on one page of a thread's timeline.
const EVENTS_PER_PAGE: usize = 50;

/// The model a thread's context is fitted for when the page names none.
const DEFAULT_MODEL: &str = "gpt-4o";

/// The most threads a fork tree shows, and how deep it goes below the thread's root.
const FORK_TREE_ROWS: usize = 200;
const FORK_TREE_DEPTH: usize = 8;

/// `GET /ui/views/threads/{id}` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadViewQuery {
    /// The timeline's events after this seq (default 0: from the first).
    #[serde(default)]
    after: u64,
    /// The model to fit the context for (default `gpt-4o`).
    model: Option<String>,
}

/// `GET /ui/views/threads/{id}`: the tenant's thread as the inspector shows it: a page of
/// its timeline, its forks, and its context fitted for a model.
async fn thread(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ThreadViewQuery>,
) -> ApiResult<Html<String>> {
    let threads = state.tenant_store(&caller.tenant);
    let info = threads
        .store()
        .thread_info(&id)
        .await
        .map_err(|error| threads.error(error))?
        .ok_or_else(|| ApiError::not_found("thread", &id))?;
    let page = threads
        .events_page(
            &id,
            query.after,
            EVENTS_PER_PAGE,
            state.config.limits.max_page_bytes,
        )
        .await?;
    let forks = fork_tree(&threads, &info).await?;
    let model = query.model.unwrap_or_else(|| DEFAULT_MODEL.to_owned());
    let context_query = ContextQuery {
        model: model.clone(),
        max_tokens: None,
        strategy: None,
        budget_ratio: None,
        reserve_output: None,
    };
    let actor = Actor::Tenant(caller.tenant.clone());
    // A context that cannot be fitted as asked (an unknown model) is said on the page: the
    // rest of the thread is still worth showing.
    let context = match fitted_context(&state, &threads, &actor, &id, &context_query).await {
        Ok(fitted) => Ok(ContextView::new(
            &fitted.model,
            &fitted.fitted.messages,
            &fitted.fitted.breakdown,
            &fitted.fitted.fit,
        )),
        Err(error) if error.status.is_client_error() => Err(error.message),
        Err(error) => return Err(error),
    };
    let view = ThreadView::new(
        info.clone(),
        &page.events,
        query.after,
        page.more,
        EVENTS_PER_PAGE as u64,
        forks,
        context,
        &model,
    );
    let html = INSPECTOR
        .thread_fragment(&view)
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Html(html))
}

/// The fork tree `info` belongs to: from its root (its oldest ancestor), each thread's forks
/// below it, depth first; at most [`FORK_TREE_ROWS`] threads, [`FORK_TREE_DEPTH`] deep.
async fn fork_tree<S: StoreView>(
    threads: &TenantStore<'_, S>,
    info: &ThreadInfo,
) -> ApiResult<Vec<ForkRow>> {
    let mut root = info.clone();
    let mut climbed = 0;
    while let Some(parent) = root.parent.clone() {
        match threads.store().thread_info(&parent).await {
            Ok(Some(parent)) if climbed < FORK_TREE_DEPTH => root = parent,
            // An ancestor deleted (or too far up): the tree starts below it.
            Ok(_) | Err(contexture_store::StoreError::NotFound { .. }) => break,
            Err(error) => return Err(threads.error(error)),
        }
        climbed += 1;
    }
    let mut rows = Vec::new();
    let mut stack = vec![(root, 0usize)];
    while let Some((thread, depth)) = stack.pop() {
        if rows.len() >= FORK_TREE_ROWS {
            break;
        }
        let forks = if depth < FORK_TREE_DEPTH {
            threads
                .store()
                .forks_of(&thread.id)
                .await
                .map_err(|error| threads.error(error))?
        } else {
            Vec::new()
        };
        rows.push(ForkRow {
            depth,
            id: thread.id.clone(),
            fork_seq: thread.fork_seq,
            last_seq: thread.last_seq,
            current: thread.id == info.id,
            more: depth >= FORK_TREE_DEPTH,
        });
        // Depth first, oldest fork first.
        stack.extend(forks.into_iter().rev().map(|fork| (fork, depth + 1)));
    }
    Ok(rows)
}
