//! Provider errors.

use std::time::Duration;

/// How the error of a scripted provider that ran out of replies begins.
pub const SCRIPT_EXHAUSTED: &str = "scripted provider: no reply left";

/// Why a chat call failed.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The provider answered with an HTTP error status.
    #[error("{provider}: HTTP {status}: {body}")]
    Status {
        /// The provider's name.
        provider: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the answer's body (the provider's error message).
        body: String,
        /// The delay the provider asked for in `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The call did not finish within the timeout.
    #[error("{provider}: no answer within {timeout:?}")]
    Timeout {
        /// The provider's name.
        provider: String,
        /// The timeout that was exceeded.
        timeout: Duration,
    },
    /// The connection failed or broke.
    #[error("{provider}: connection failed: {detail}")]
    Connection {
        /// The provider's name.
        provider: String,
        /// What the HTTP client said.
        detail: String,
    },
    /// The answer could not be understood.
    #[error("{provider}: unexpected answer: {detail}")]
    Decode {
        /// The provider's name.
        provider: String,
        /// What was wrong, and where.
        detail: String,
    },
    /// Every attempt failed with a retryable error.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<LlmError>,
    },
    /// The request cannot be expressed in the provider's format.
    #[error("{provider}: cannot send this request: {detail}")]
    InvalidRequest {
        /// The provider's name.
        provider: String,
        /// What cannot be sent.
        detail: String,
    },
    /// A scripted provider ran out of replies.
    #[error("{SCRIPT_EXHAUSTED} (the script has {replies} replies)")]
    ScriptExhausted {
        /// How many replies the script had.
        replies: usize,
    },
}

impl LlmError {
    /// True for errors worth another attempt: 408, 409, 429 and 5xx statuses, timeouts and
    /// connection failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Status { status, .. } => retryable_status(*status),
            LlmError::Timeout { .. } | LlmError::Connection { .. } => true,
            _ => false,
        }
    }

    /// The delay the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// True for the HTTP statuses worth another attempt: 408, 409, 429 and 5xx.
pub(crate) fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || (500..600).contains(&status)
}
