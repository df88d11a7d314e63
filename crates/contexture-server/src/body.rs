//! Request bodies: JSON parsed with the path of whatever was wrong (`messages[2].role`), so
//! that a malformed request gets a 400 naming the field, and an oversized one a 413, both
//! as JSON errors; query strings likewise.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::json_shape;

/// A JSON body of type `T`.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

/// How deep a body's objects and arrays may nest (a chat message with tool schemas needs
/// about 12).
pub const MAX_JSON_DEPTH: usize = 64;

/// Parses `bytes` as `T`, naming the field that was wrong. A body nested deeper than
/// [`MAX_JSON_DEPTH`] or with a key repeated in one object is refused before parsing.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body is an object; serde would also read a struct from an array of its fields.
    if bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|first| *first != b'{')
    {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    }
    if let Err(problem) = json_shape::check(bytes, MAX_JSON_DEPTH) {
        return Err(ApiError::invalid(
            problem.path().to_owned(),
            problem.to_string(),
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let param = if path == "." || path == "?" {
            "body".to_owned()
        } else {
            path
        };
        ApiError::invalid(param.clone(), format!("{param}: {inner}"))
    })
}

/// How long a client has to send a request's whole body (the router's extension; 30 s
/// when absent).
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub Duration);

/// A request's body, read whole within its [`BodyTimeout`] (else a 408) and its size limit
/// (else a 413).
#[derive(Debug, Clone)]
pub struct BodyBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for BodyBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let limit = request
            .extensions()
            .get::<BodyTimeout>()
            .map_or(Duration::from_secs(30), |timeout| timeout.0);
        // Most bodies have arrived with their headers: only one still on its way is timed
        // (a timer for every request costs the busy server a twentieth of its throughput).
        let mut read = std::pin::pin!(Bytes::from_request(request, state));
        let read = match futures_util::poll!(read.as_mut()) {
            std::task::Poll::Ready(read) => Ok(read),
            std::task::Poll::Pending => tokio::time::timeout(limit, read).await,
        };
        let Ok(read) = read else {
            return Err(ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                code: "body_timeout",
                message: format!(
                    "the request's body did not arrive within {} s",
                    limit.as_secs_f64()
                ),
                param: Some("body".into()),
            });
        };
        read.map(BodyBytes).map_err(|rejection| {
            let status = rejection.status();
            ApiError {
                status,
                code: if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "body_too_large"
                } else {
                    "invalid_request"
                },
                message: rejection.body_text(),
                param: Some("body".into()),
            }
        })
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        check_content_type(request.headers())?;
        let BodyBytes(bytes) = BodyBytes::from_request(request, state).await?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("body", "the request needs a JSON body"));
        }
        parse(&bytes).map(JsonBody)
    }
}

/// A body's declared type must be JSON (`application/json`, or any `+json` type); a body
/// that declares none is read as JSON.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        code: "unsupported_media_type",
        message: format!(
            "the body must be JSON (Content-Type: application/json), not `{}`",
            String::from_utf8_lossy(value.as_bytes()).escape_debug()
        ),
        param: Some("Content-Type".into()),
    })
}

/// The `Idempotency-Key` header, when sent: 1 to 200 visible ASCII characters (no spaces or
/// tabs, which a client can lose or add without noticing).
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 200 || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "the Idempotency-Key header must be 1 to 200 visible ASCII characters, without spaces",
        ));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// Query parameters of type `T`; a malformed query is a 400 naming `query`.
#[derive(Debug, Clone)]
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(query)| QueryParams(query))
            .map_err(|rejection| ApiError::invalid("query", rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        items: Vec<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    #[test]
    fn errors_name_the_field() {
        let error = parse::<Outer>(br#"{"items": [{"n": 1}, {"n": "x"}]}"#).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("items[1].n"));
        assert!(error.message.contains("invalid type"), "{}", error.message);
        let error = parse::<Outer>(b"{").unwrap_err();
        assert_eq!(error.param.as_deref(), Some("body"));
        let error = parse::<Outer>(br#"{"items": [{"m": 1}]}"#).unwrap_err();
        assert!(
            error.message.contains("unknown field `m`"),
            "{}",
            error.message
        );
    }
}
