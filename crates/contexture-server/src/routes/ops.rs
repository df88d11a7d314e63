//! Operations: liveness, readiness, metrics, the OpenAPI document, unknown routes.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use contexture_store::ExecutionQueueStore;
use contexture_store::Store;
use serde_json::json;

use crate::app::AppState;
use crate::error::ApiError;

/// The OpenAPI document, checked by a test to list every route the router serves.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: the store answers.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let ping = tokio::time::timeout(std::time::Duration::from_secs(2), state.store.ping()).await;
    match ping {
        Ok(Ok(())) => Json(json!({"status": "ready"})).into_response(),
        failed => {
            let error = match failed {
                Ok(Err(error)) => error.to_string(),
                _ => "no answer within 2 s".to_owned(),
            };
            tracing::warn!(%error, "not ready: the store does not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "reason": "the store does not answer"})),
            )
                .into_response()
        }
    }
}

/// How long a scrape waits for the queue's counts before it answers without them.
const QUEUE_COUNT_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /metrics`: Prometheus text exposition, with the execution queue's counts as of the
/// scrape.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let counts =
        match tokio::time::timeout(QUEUE_COUNT_TIME, state.store.execution_queue_counts()).await {
            Ok(Ok(counts)) => Some(counts),
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot count the execution queue for a scrape");
                None
            }
            Err(_) => {
                tracing::warn!("counting the execution queue took too long for a scrape");
                None
            }
        };
    state
        .metrics
        .set_queue(counts.as_ref(), state.worker.held());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /openapi.json`.
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// A path of this server asked with a method it does not take: a 405 naming both.
pub async fn method_not_allowed(method: axum::http::Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed",
        message: format!("{} does not take {method}", uri.path()),
        param: None,
    }
}

/// Any path this server does not have: a 404 naming it.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: format!("no route {}", uri.path()),
        param: None,
    }
}
