//! The HTTP plumbing shared by the OpenAI-compatible and Anthropic providers: one attempt,
//! retries, timeouts, error mapping, and reading a server-sent event stream.

use std::time::Duration;

use serde_json::Value;

use crate::error::LlmError;
use crate::retry::{RetryPolicy, parse_retry_after};
use crate::sse::{SseDecoder, SseEvent};

/// How much of an error body is kept in [`LlmError::Status`].
const ERROR_BODY_LIMIT: usize = 2000;

/// A JSON-over-HTTP client for one provider.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    provider: &'static str,
    /// The longest a whole non-streamed call, or a pause in a stream, may take.
    pub timeout: Duration,
    /// When failed attempts are retried.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("provider", &self.provider)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    pub fn new(provider: &'static str, timeout: Duration, retry: RetryPolicy) -> HttpClient {
        HttpClient {
            client: reqwest::Client::new(),
            provider,
            timeout,
            retry,
        }
    }

    /// Posts `body` and returns the answer's JSON, retrying as the policy says; each attempt
    /// may take `timeout` (`None`: the client's).
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<(Value, u32), LlmError> {
        let timeout = timeout.unwrap_or(self.timeout);
        self.retry
            .run(|| async {
                let attempt = async {
                    let response = self.send(url, headers, body).await?;
                    let bytes = response.bytes().await.map_err(|e| self.transport(e))?;
                    serde_json::from_slice::<Value>(&bytes).map_err(|e| LlmError::Decode {
                        provider: self.provider.to_owned(),
                        detail: format!("the body is not JSON ({e})"),
                    })
                };
                tokio::time::timeout(timeout, attempt)
                    .await
                    .unwrap_or_else(|_| Err(self.timed_out(timeout)))
            })
            .await
    }

    /// Posts `body` and returns the response once its status is a success, retrying failed
    /// attempts (each may take `timeout`; `None`: the client's); the caller then reads the
    /// stream with [`HttpClient::events`].
    pub async fn post_stream(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<(reqwest::Response, u32), LlmError> {
        let timeout = timeout.unwrap_or(self.timeout);
        self.retry
            .run(|| async {
                tokio::time::timeout(timeout, self.send(url, headers, body))
                    .await
                    .unwrap_or_else(|_| Err(self.timed_out(timeout)))
            })
            .await
    }

    /// Reads the next chunk of a streamed body and decodes its events, waiting at most
    /// `timeout` (`None`: the client's); `None` at the end.
    pub async fn events(
        &self,
        response: &mut reqwest::Response,
        decoder: &mut SseDecoder,
        timeout: Option<Duration>,
    ) -> Result<Option<Vec<SseEvent>>, LlmError> {
        let timeout = timeout.unwrap_or(self.timeout);
        match tokio::time::timeout(timeout, response.chunk()).await {
            Err(_) => Err(self.timed_out(timeout)),
            Ok(Err(error)) => Err(self.transport(error)),
            Ok(Ok(Some(chunk))) => Ok(Some(decoder.feed(&chunk))),
            Ok(Ok(None)) => Ok(decoder.finish().map(|event| vec![event])),
        }
    }

    async fn send(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
    ) -> Result<reqwest::Response, LlmError> {
        let mut request = self.client.post(url).json(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.map_err(|e| self.transport(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_retry_after);
        let text = response.text().await.unwrap_or_default();
        Err(LlmError::Status {
            provider: self.provider.to_owned(),
            status: status.as_u16(),
            body: truncate(&text, ERROR_BODY_LIMIT),
            retry_after,
        })
    }

    fn transport(&self, error: reqwest::Error) -> LlmError {
        if error.is_timeout() {
            return self.timed_out(self.timeout);
        }
        // The URL is kept out of the message: a proxy URL may embed credentials.
        LlmError::Connection {
            provider: self.provider.to_owned(),
            detail: error.without_url().to_string(),
        }
    }

    fn timed_out(&self, timeout: Duration) -> LlmError {
        LlmError::Timeout {
            provider: self.provider.to_owned(),
            timeout,
        }
    }

    pub fn decode_error(&self, detail: impl Into<String>) -> LlmError {
        LlmError::Decode {
            provider: self.provider.to_owned(),
            detail: detail.into(),
        }
    }
}

fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Joins a base URL and a path without doubling or losing the slash between them.
pub(crate) fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_cleanly() {
        assert_eq!(
            join_url("http://h/v1/", "/chat/completions"),
            "http://h/v1/chat/completions"
        );
        assert_eq!(
            join_url("http://h/v1", "chat/completions"),
            "http://h/v1/chat/completions"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h...");
        assert_eq!(truncate("short", 10), "short");
    }
}
