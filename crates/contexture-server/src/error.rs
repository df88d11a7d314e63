//! API errors: a status and a JSON body in the OpenAI error shape, so that clients written
//! for OpenAI show the message: `{"error": {"message", "type", "param", "code"}}`. `param`
//! names the field that was wrong, when one was. The paths of Anthropic's API answer the same
//! errors in Anthropic's shape instead ([`anthropic_errors`]).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use contexture_core::thread::UnknownContext;
use contexture_engine::tenant_slots::SlotsFull;
use contexture_store::StoreError;
use serde_json::json;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A short machine-readable code (`not_found`, `invalid_request`, ...).
    pub code: &'static str,
    /// What was wrong, for a person.
    pub message: String,
    /// The request field that was wrong (`messages[2].role`, `model`), when one was.
    pub param: Option<String>,
}

impl ApiError {
    /// 400: the request is malformed; `param` names the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_request",
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// 404 naming `context`, as for a thread that does not exist: the request is well
    /// formed, the context it names is not there. `thread` is the client's id.
    pub fn unknown_context(thread: &str, unknown: &UnknownContext) -> ApiError {
        ApiError {
            param: Some("context".into()),
            message: format!(
                "thread `{thread}` has no context `{}` ({})",
                unknown.context,
                unknown.known_text()
            ),
            ..ApiError::not_found("context", &unknown.context)
        }
    }

    /// 404: nothing of this tenant's has that id (other tenants' ids look the same).
    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: format!("no {what} `{id}`"),
            param: None,
        }
    }

    /// 409: the request conflicts with what is stored.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: message.into(),
            param: None,
        }
    }

    /// 401: no API key, or one that is unknown or revoked.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "invalid_api_key",
            message: message.into(),
            param: None,
        }
    }

    /// 422: the request is well formed but cannot be done (a thread that cannot fit).
    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "unprocessable",
            message: message.into(),
            param: None,
        }
    }

    /// 503: the server cannot answer now (it is shutting down).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: message.into(),
            param: None,
        }
    }

    /// 502: the upstream provider could not be reached or answered nonsense.
    pub fn upstream(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            code: "upstream_error",
            message: message.into(),
            param: None,
        }
    }

    /// An upstream's refusal (a status that is not success), passed on with its status and
    /// what it said (the `error.message` of OpenAI's and Anthropic's error shapes alike).
    pub fn upstream_refusal(status: u16, body: &[u8]) -> ApiError {
        let said: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let message = said
            .get("error")
            .and_then(|error| error.get("message").or(Some(error)))
            .map(|message| match message {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&body[..body.len().min(2_000)]).into_owned()
            });
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            code: "upstream_error",
            message: format!("the upstream answered {status}: {message}"),
            param: None,
        }
    }

    /// 500 for a failure of the server's own (a task that stopped); the detail is logged,
    /// the client gets a generic message.
    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        tracing::error!(%detail, "internal error");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal_error",
            message: "the server could not answer this request (its log says why)".into(),
            param: None,
        }
    }

    /// 500 for a store failure; the detail is logged, the client gets a generic message.
    pub fn store(error: &StoreError) -> ApiError {
        tracing::error!(%error, "store error");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "store_error",
            message: "the store failed; the operation may be retried".into(),
            param: None,
        }
    }
}

impl From<SlotsFull> for ApiError {
    fn from(error: SlotsFull) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "too_many_open",
            message: error.to_string(),
            param: None,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        ApiError::store(&error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.code,
                "param": self.param,
                "code": self.code,
            }
        });
        let store_failure = self.code == "store_error";
        let mut response = (self.status, Json(body)).into_response();
        if store_failure {
            // The metrics layer counts store errors by this mark.
            response.extensions_mut().insert(StoreFailure);
        }
        // Kept so that a path answering in another API's shape writes the same error.
        response.extensions_mut().insert(self);
        response
    }
}

impl ApiError {
    /// The error in the shape of Anthropic's API:
    /// `{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            400 | 409 | 422 => "invalid_request_error",
            401 => "authentication_error",
            402 => "billing_error",
            403 => "permission_error",
            404 | 405 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            504 => "timeout_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": self.message}})
    }
}

/// The paths of Anthropic's API this server answers.
const ANTHROPIC_PATHS: &str = "/v1/messages";

/// Middleware: an error answered on a path of Anthropic's API (`/v1/messages`, its
/// `count_tokens`) is written in Anthropic's error shape, whichever layer refused (the
/// key's check and the rate limit included), its status and headers kept.
pub async fn anthropic_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let anthropic = path
        .strip_prefix(ANTHROPIC_PATHS)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    let response = next.run(request).await;
    let Some(error) = anthropic
        .then(|| response.extensions().get::<ApiError>().cloned())
        .flatten()
    else {
        return response;
    };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        axum::body::Body::from(error.anthropic_body().to_string()),
    )
}

/// Marks a response that a store error caused.
#[derive(Debug, Clone, Copy)]
pub struct StoreFailure;

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
