//! Retries with exponential backoff.

use std::future::Future;
use std::time::Duration;

use crate::error::LlmError;

/// When and how often a failed call is tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (so `max_retries + 1` attempts at most).
    pub max_retries: u32,
    /// The delay before the first retry; it doubles for each further one.
    pub initial_delay: Duration,
    /// The longest delay between two attempts, whatever the backoff or `Retry-After` says.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// The delay before retry number `retry` (0-based) after `error`: the provider's
    /// `Retry-After` when it gave one, else `initial_delay x 2^retry`; capped at `max_delay`.
    pub fn delay(&self, retry: u32, error: &LlmError) -> Duration {
        self.delay_after(retry, error.retry_after())
    }

    /// The delay before retry number `retry` (0-based) when nothing says otherwise:
    /// `initial_delay x 2^retry`, capped at `max_delay`.
    pub fn backoff(&self, retry: u32) -> Duration {
        self.delay_after(retry, None)
    }

    /// The delay before retry number `retry` (0-based) when the server asked for
    /// `retry_after` (or did not): the rule of [`RetryPolicy::delay`].
    pub(crate) fn delay_after(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let backoff = self
            .initial_delay
            .checked_mul(2u32.saturating_pow(retry))
            .unwrap_or(self.max_delay);
        retry_after.unwrap_or(backoff).min(self.max_delay)
    }

    /// Runs `attempt` until it succeeds, fails with a non-retryable error, or the retries are
    /// used up. Returns the result and the number of attempts made.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<(T, u32), LlmError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, LlmError>>,
    {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match attempt().await {
                Ok(value) => return Ok((value, attempts)),
                Err(error) if !error.is_retryable() => return Err(error),
                Err(error) if attempts > self.max_retries => {
                    return Err(if attempts == 1 {
                        error
                    } else {
                        LlmError::RetriesExhausted {
                            attempts,
                            last: Box::new(error),
                        }
                    });
                }
                Err(error) => tokio::time::sleep(self.delay(attempts - 1, &error)).await,
            }
        }
    }
}

/// Parses a `Retry-After` header value given in seconds. The HTTP-date form is not
/// supported: it is treated as absent, so the backoff applies.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map(Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<Duration>) -> LlmError {
        LlmError::Status {
            provider: "test".into(),
            status: code,
            body: String::new(),
            retry_after,
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let policy = RetryPolicy {
            max_retries: 10,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        let error = status(500, None);
        let delays: Vec<u128> = (0..6)
            .map(|n| policy.delay(n, &error).as_millis())
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let policy = RetryPolicy {
            max_delay: Duration::from_secs(5),
            ..RetryPolicy::default()
        };
        assert_eq!(
            policy.delay(0, &status(429, Some(Duration::from_secs(2)))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.delay(0, &status(429, Some(Duration::from_secs(60)))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn which_errors_are_retried() {
        for (code, retry) in [
            (429, true),
            (500, true),
            (503, true),
            (400, false),
            (401, false),
            (404, false),
        ] {
            assert_eq!(status(code, None).is_retryable(), retry, "{code}");
        }
    }

    #[test]
    fn retry_after_header_values() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }
}
