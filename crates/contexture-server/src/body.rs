//! Request bodies: JSON parsed with the path of whatever was wrong (`messages[2].role`), so
//! that a malformed request gets a 400 naming the field, and an oversized one a 413, both
//! as JSON errors; query strings likewise.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body of type `T`.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

/// Parses `bytes` as `T`, naming the field that was wrong.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
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
            })?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("body", "the request needs a JSON body"));
        }
        parse(&bytes).map(JsonBody)
    }
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
