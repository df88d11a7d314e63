//! The providers chat turns go to: `[upstream]`, the default, and `[[upstreams]]`, each for
//! the models its glob patterns match. Each is OpenAI-compatible (`kind = "openai"`, chat
//! completions) or Anthropic's (`kind = "anthropic"`, messages); the doors translate.

use std::sync::Arc;
use std::time::Duration;

use contexture_llm::{
    ChatUpstream, Passthrough, UpstreamConfig as PassthroughConfig, Upstreams, WireFormat,
};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    /// OpenAI's chat completions (OpenAI, vLLM, llama.cpp, Ollama, ...).
    #[default]
    Openai,
    /// Anthropic's messages.
    Anthropic,
}

impl UpstreamKind {
    /// The wire format of this kind.
    pub fn format(self) -> WireFormat {
        match self {
            UpstreamKind::Openai => WireFormat::OpenAiChat,
            UpstreamKind::Anthropic => WireFormat::AnthropicMessages,
        }
    }

    /// The base URL of a provider of this kind that names none: OpenAI's or Anthropic's.
    pub fn default_base_url(self) -> &'static str {
        match self {
            UpstreamKind::Openai => "https://api.openai.com/v1",
            UpstreamKind::Anthropic => "https://api.anthropic.com",
        }
    }
}

/// The default provider (`[upstream]`): every model no entry of `[[upstreams]]` takes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The wire format it speaks (default `openai`).
    pub kind: UpstreamKind,
    /// Its base URL (`CONTEXTURE_UPSTREAM_URL`, else `OPENAI_BASE_URL`); default, the
    /// kind's: `https://api.openai.com/v1` or `https://api.anthropic.com`.
    pub base_url: Option<String>,
    /// Its API key (`CONTEXTURE_UPSTREAM_KEY`, else `OPENAI_API_KEY`), sent as
    /// `Authorization: Bearer` (as `x-api-key` to Anthropic). Never logged or returned.
    pub api_key: Option<String>,
    /// Seconds to wait for a connection and for the response's start (and between two
    /// chunks of a stream).
    pub timeout_secs: f64,
    /// Retries on connection failures, 429 and 5xx before any byte was returned.
    pub retries: u32,
    /// Seconds after which a chat turn sent with an `Idempotency-Key` whose answer never
    /// ended, and that no server is seen answering, counts as abandoned (its server stopped
    /// mid-call): a retry then records it as failed and calls the upstream again (default
    /// 600). Before that, a retry answers 409.
    pub abandon_after_secs: f64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            kind: UpstreamKind::Openai,
            base_url: None,
            api_key: None,
            timeout_secs: 120.0,
            retries: 2,
            abandon_after_secs: 600.0,
        }
    }
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout_secs", &self.timeout_secs)
            .field("retries", &self.retries)
            .field("abandon_after_secs", &self.abandon_after_secs)
            .finish()
    }
}

impl UpstreamConfig {
    /// The timeout as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// Its base URL, or its kind's when it names none.
    pub fn base_url(&self) -> &str {
        self.base_url
            .as_deref()
            .unwrap_or(self.kind.default_base_url())
    }
}

/// A provider for some models (an entry of `[[upstreams]]`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutedUpstream {
    /// Glob patterns of the model names it takes (`"claude-*"`): `*` any text, `?` one
    /// character, `[...]` one of a set; a pattern matches the whole name.
    pub models: Vec<String>,
    /// The wire format it speaks (default `openai`).
    #[serde(default)]
    pub kind: UpstreamKind,
    /// Its base URL; default, the kind's.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Its API key. Never logged or returned.
    #[serde(default)]
    pub api_key: Option<String>,
    /// As `[upstream]`'s (default 120).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// As `[upstream]`'s (default 2).
    #[serde(default = "default_retries")]
    pub retries: u32,
}

fn default_timeout_secs() -> f64 {
    UpstreamConfig::default().timeout_secs
}

fn default_retries() -> u32 {
    UpstreamConfig::default().retries
}

impl std::fmt::Debug for RoutedUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedUpstream")
            .field("models", &self.models)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout_secs", &self.timeout_secs)
            .field("retries", &self.retries)
            .finish()
    }
}

/// Checks the default provider and the routed ones: timeouts above zero, each route with
/// at least one pattern, every pattern a glob.
pub(super) fn check(
    upstream: &UpstreamConfig,
    routes: &[RoutedUpstream],
) -> Result<(), ConfigError> {
    if !(upstream.timeout_secs.is_finite() && upstream.timeout_secs > 0.0) {
        return Err(ConfigError::Invalid {
            field: "upstream.timeout_secs",
            problem: format!("must be above 0, not {}", upstream.timeout_secs),
        });
    }
    for (index, route) in routes.iter().enumerate() {
        let problem = |problem: String| ConfigError::Upstream { index, problem };
        if route.models.is_empty() {
            return Err(problem(
                "models: names no model; give at least one pattern, such as \"claude-*\"".into(),
            ));
        }
        if !(route.timeout_secs.is_finite() && route.timeout_secs > 0.0) {
            return Err(problem(format!(
                "timeout_secs: must be above 0, not {}",
                route.timeout_secs
            )));
        }
        for pattern in &route.models {
            Upstreams::check_pattern(pattern)
                .map_err(|error| problem(format!("models: {error}")))?;
        }
    }
    Ok(())
}

/// The providers of `upstream` and `routes`, ready to call (see [`check`] for what the
/// settings must be; a base URL or key that cannot be used is refused here, naming the
/// setting).
pub fn upstreams(
    upstream: &UpstreamConfig,
    routes: &[RoutedUpstream],
) -> Result<Upstreams, String> {
    let default = passthrough(
        upstream.kind,
        upstream.base_url(),
        upstream.api_key.clone(),
        upstream.timeout(),
        upstream.retries,
    )
    .map_err(|error| format!("upstream: {error}"))?;
    let mut upstreams = Upstreams::new(default);
    for (index, route) in routes.iter().enumerate() {
        let called = passthrough(
            route.kind,
            route
                .base_url
                .as_deref()
                .unwrap_or(route.kind.default_base_url()),
            route.api_key.clone(),
            Duration::from_secs_f64(route.timeout_secs),
            route.retries,
        )
        .map_err(|error| format!("upstreams[{index}]: {error}"))?;
        upstreams = upstreams
            .route(&route.models, called)
            .map_err(|error| format!("upstreams[{index}].models: {error}"))?;
    }
    Ok(upstreams)
}

fn passthrough(
    kind: UpstreamKind,
    base_url: &str,
    api_key: Option<String>,
    timeout: Duration,
    retries: u32,
) -> Result<Arc<dyn ChatUpstream>, contexture_llm::PassthroughError> {
    let mut config = PassthroughConfig::speaking(kind.format(), base_url, api_key);
    config.timeout = timeout;
    config.retries = retries;
    Ok(Arc::new(Passthrough::new(config)?))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::ServerConfig;

    fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
        let config = ServerConfig::parse(text, Path::new("c.toml"))?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn upstreams_are_read_with_their_kinds_defaults_and_routes() {
        let config = parse(
            r#"
[upstream]
base_url = "http://127.0.0.1:9/v1"

[[upstreams]]
models = ["claude-*"]
kind = "anthropic"
api_key = "sk-ant-secret"

[[upstreams]]
models = ["llama-*", "qwen-*"]
base_url = "http://127.0.0.1:8/v1"
timeout_secs = 5
retries = 0
"#,
        )
        .unwrap();
        assert_eq!(config.upstream.kind, UpstreamKind::Openai);
        assert_eq!(config.upstreams.len(), 2);
        let claude = &config.upstreams[0];
        assert_eq!(claude.kind, UpstreamKind::Anthropic);
        assert_eq!(claude.base_url, None);
        assert_eq!(claude.timeout_secs, 120.0);
        assert_eq!(claude.retries, 2);
        assert!(!format!("{config:?}").contains("sk-ant-secret"));
        let upstreams = upstreams(&config.upstream, &config.upstreams).unwrap();
        let table = [
            ("claude-sonnet-4-5", WireFormat::AnthropicMessages),
            ("qwen-2.5", WireFormat::OpenAiChat),
            ("gpt-4o-mini", WireFormat::OpenAiChat),
        ];
        for (model, format) in table {
            assert_eq!(upstreams.for_model(model).format(), format, "{model}");
        }
        assert_eq!(upstreams.all().count(), 3);
    }

    #[test]
    fn an_anthropic_default_upstream_calls_anthropic_unless_told_otherwise() {
        let config = parse("[upstream]\nkind = \"anthropic\"\n").unwrap();
        assert_eq!(config.upstream.base_url(), "https://api.anthropic.com");
        assert_eq!(
            ServerConfig::default().upstream.base_url(),
            "https://api.openai.com/v1"
        );
    }

    #[test]
    fn bad_upstreams_are_refused_naming_the_setting() {
        let table = [
            (
                "[[upstreams]]\nmodels = []\n",
                "upstreams[0].models: names no model",
            ),
            (
                "[[upstreams]]\nmodels = [\"a\"]\n[[upstreams]]\nmodels = [\"claude-[\"]\n",
                "upstreams[1].models: the model pattern `claude-[` is not a glob",
            ),
            (
                "[[upstreams]]\nmodels = [\"a\"]\ntimeout_secs = 0\n",
                "upstreams[0].timeout_secs: must be above 0",
            ),
            ("[upstream]\ntimeout_secs = -1\n", "upstream.timeout_secs"),
            (
                "[upstream]\nkind = \"gemini\"\n",
                "unknown variant `gemini`",
            ),
            (
                "[[upstreams]]\nkind = \"openai\"\n",
                "missing field `models`",
            ),
            (
                "[[upstreams]]\nmodels = [\"a\"]\nurl = \"http://x\"\n",
                "unknown field `url`",
            ),
        ];
        for (text, expected) in table {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_base_url_that_cannot_be_called_is_refused_naming_the_entry() {
        let config = parse("[[upstreams]]\nmodels = [\"a\"]\nbase_url = \"ftp://x\"\n").unwrap();
        let error = upstreams(&config.upstream, &config.upstreams).unwrap_err();
        assert!(error.starts_with("upstreams[0]: "), "{error}");
        assert!(error.contains("http or https"), "{error}");
    }
}
