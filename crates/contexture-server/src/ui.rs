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
use contexture_inspector::{ExecutionView, Inspector};
use serde::Deserialize;
use std::sync::LazyLock;

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::QueryParams;
use crate::error::{ApiError, ApiResult};
use crate::routes::executions::{execution_report, relative_text};

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
    vec![("/ui/views/executions/{id}", get(execution))]
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
