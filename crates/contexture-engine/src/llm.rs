//! Which provider answers an assistant's calls, under which model name, and whose message
//! rules its requests must follow.
//!
//! A run names its LLM with a [`LlmSpec`]:
//! - `scripted:FILE`: replies replayed from a YAML script (tests, demos; no network);
//! - `openai` or `openai:MODEL`: an OpenAI-compatible server at `OPENAI_BASE_URL` (default
//!   OpenAI) with `OPENAI_API_KEY`; Ollama, vLLM and llama.cpp servers work the same way;
//! - `anthropic` or `anthropic:MODEL`: Anthropic's messages API (`ANTHROPIC_BASE_URL`,
//!   `ANTHROPIC_API_KEY`);
//! - `auto` (the default): each assistant's model picks its provider: Anthropic for models
//!   the registry lists under `anthropic` (the `claude-*` family), OpenAI-compatible for the
//!   rest.
//!
//! With a `:MODEL`, every assistant calls that model; without one, each calls its own.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use contexture_core::fit;
use contexture_core::registry::Registry;
use contexture_llm::{AnthropicProvider, OpenAiProvider, Provider, RetryPolicy, ScriptedProvider};

/// Where one assistant's calls go.
#[derive(Clone)]
pub struct Route {
    /// The provider that answers.
    pub provider: Arc<dyn Provider>,
    /// The model id sent to the provider (and looked up in the registry for the window).
    pub model: String,
    /// The message rules the requests must follow; `None` when the provider stands in for
    /// any model (a scripted one): the model's family in the executor's registry decides.
    pub rules: Option<fit::Rules>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("provider", &self.provider.name())
            .field("model", &self.model)
            .field("rules", &self.rules)
            .finish()
    }
}

/// Picks the route of each assistant's calls.
pub trait Router: Send + Sync {
    /// The route for an assistant configured with `model`.
    fn route(&self, model: &str) -> Route;
}

/// One provider for every assistant, optionally with one model for all.
#[derive(Clone)]
pub struct FixedRouter {
    provider: Arc<dyn Provider>,
    model: Option<String>,
    rules: Option<fit::Rules>,
}

impl FixedRouter {
    /// Every call goes to `provider`, under the assistant's own model. The message rules are
    /// the provider's when it speaks one wire format (`openai`, `anthropic`), else the
    /// model's family's (a scripted provider stands in for any model).
    pub fn new(provider: Arc<dyn Provider>) -> FixedRouter {
        let rules = match provider.name() {
            "openai" => Some(fit::Rules::OpenAi),
            "anthropic" => Some(fit::Rules::Anthropic),
            _ => None,
        };
        FixedRouter {
            provider,
            model: None,
            rules,
        }
    }

    /// Builder: every assistant calls `model` instead of its own.
    pub fn with_model(mut self, model: impl Into<String>) -> FixedRouter {
        self.model = Some(model.into());
        self
    }
}

impl Router for FixedRouter {
    fn route(&self, model: &str) -> Route {
        Route {
            provider: self.provider.clone(),
            model: self.model.clone().unwrap_or_else(|| model.to_owned()),
            rules: self.rules,
        }
    }
}

/// Each assistant's model picks the provider: Anthropic's family goes to Anthropic, the
/// rest to the OpenAI-compatible endpoint.
#[derive(Clone)]
pub struct AutoRouter {
    openai: Arc<dyn Provider>,
    anthropic: Arc<dyn Provider>,
    registry: Arc<Registry>,
}

impl AutoRouter {
    /// Routes between the two providers by the registry's provider of each model.
    pub fn new(
        openai: Arc<dyn Provider>,
        anthropic: Arc<dyn Provider>,
        registry: Arc<Registry>,
    ) -> AutoRouter {
        AutoRouter {
            openai,
            anthropic,
            registry,
        }
    }
}

impl Router for AutoRouter {
    fn route(&self, model: &str) -> Route {
        let rules = self.registry.resolve(model).rules();
        let provider = match rules {
            fit::Rules::Anthropic => self.anthropic.clone(),
            _ => self.openai.clone(),
        };
        Route {
            provider,
            model: model.to_owned(),
            rules: Some(if rules == fit::Rules::Anthropic {
                rules
            } else {
                fit::Rules::OpenAi
            }),
        }
    }
}

/// How a run names its LLM (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmSpec {
    /// Replies replayed from a YAML script.
    Scripted(PathBuf),
    /// An OpenAI-compatible server, optionally with one model for every assistant.
    OpenAi(Option<String>),
    /// Anthropic's messages API, optionally with one model for every assistant.
    Anthropic(Option<String>),
    /// Each assistant's model picks its provider.
    Auto,
}

/// An `--llm` value that names no known provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid LLM `{spec}`: {reason} (expected scripted:FILE, openai[:MODEL], anthropic[:MODEL] or auto)"
)]
pub struct LlmSpecError {
    /// What was given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for LlmSpec {
    type Err = LlmSpecError;

    fn from_str(spec: &str) -> Result<LlmSpec, LlmSpecError> {
        let error = |reason: &str| LlmSpecError {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let (kind, rest) = match spec.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (spec, None),
        };
        let model = |rest: Option<&str>| -> Result<Option<String>, LlmSpecError> {
            match rest {
                None => Ok(None),
                Some("") => Err(error("the model after `:` is empty")),
                Some(model) => Ok(Some(model.to_owned())),
            }
        };
        match kind {
            "scripted" => match rest {
                Some(path) if !path.is_empty() => Ok(LlmSpec::Scripted(PathBuf::from(path))),
                _ => Err(error("scripted needs a file: scripted:FILE")),
            },
            "openai" => Ok(LlmSpec::OpenAi(model(rest)?)),
            "anthropic" => Ok(LlmSpec::Anthropic(model(rest)?)),
            "auto" if rest.is_none() => Ok(LlmSpec::Auto),
            _ => Err(error("unknown provider")),
        }
    }
}

impl std::fmt::Display for LlmSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LlmSpec::Scripted(path) => write!(f, "scripted:{}", path.display()),
            LlmSpec::OpenAi(None) => f.write_str("openai"),
            LlmSpec::OpenAi(Some(model)) => write!(f, "openai:{model}"),
            LlmSpec::Anthropic(None) => f.write_str("anthropic"),
            LlmSpec::Anthropic(Some(model)) => write!(f, "anthropic:{model}"),
            LlmSpec::Auto => f.write_str("auto"),
        }
    }
}

/// How HTTP providers behave.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// The timeout of one call (and of a pause in a stream).
    pub timeout: Duration,
    /// Retries on 429, 5xx, timeouts and connection failures.
    pub retry: RetryPolicy,
    /// The OpenAI-compatible base URL; `None` reads `OPENAI_BASE_URL` (default OpenAI's).
    pub openai_base_url: Option<String>,
    /// The OpenAI-compatible API key; `None` reads `OPENAI_API_KEY`.
    pub openai_api_key: Option<String>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            openai_base_url: None,
            openai_api_key: None,
        }
    }
}

/// Why an LLM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LlmSetupError {
    /// The script file could not be read.
    #[error("cannot read the script {}", path.display())]
    ReadScript {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The script is malformed.
    #[error(transparent)]
    Script(#[from] contexture_llm::ScriptError),
}

impl LlmSpec {
    /// Builds the router. For a scripted LLM, the first `skip` replies are marked used (a
    /// resumed run passes the number of requests its log already started).
    pub fn router(
        &self,
        settings: &HttpSettings,
        registry: Arc<Registry>,
        skip: usize,
    ) -> Result<Arc<dyn Router>, LlmSetupError> {
        let openai = || {
            let key = || {
                settings
                    .openai_api_key
                    .clone()
                    .or_else(|| std::env::var("OPENAI_API_KEY").ok())
            };
            let provider = match &settings.openai_base_url {
                Some(url) => OpenAiProvider::new(url.clone(), key()),
                None if settings.openai_api_key.is_some() => OpenAiProvider::new(
                    std::env::var("OPENAI_BASE_URL")
                        .unwrap_or_else(|_| "https://api.openai.com/v1".to_owned()),
                    key(),
                ),
                None => OpenAiProvider::from_env(),
            };
            Arc::new(
                provider
                    .with_timeout(settings.timeout)
                    .with_retry(settings.retry.clone()),
            ) as Arc<dyn Provider>
        };
        let anthropic = || {
            Arc::new(
                AnthropicProvider::from_env()
                    .with_timeout(settings.timeout)
                    .with_retry(settings.retry.clone()),
            ) as Arc<dyn Provider>
        };
        let fixed = |provider: Arc<dyn Provider>, model: &Option<String>| {
            let router = FixedRouter::new(provider);
            Arc::new(match model {
                Some(model) => router.with_model(model.clone()),
                None => router,
            }) as Arc<dyn Router>
        };
        Ok(match self {
            LlmSpec::Scripted(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| LlmSetupError::ReadScript {
                        path: path.clone(),
                        source,
                    })?;
                let script = ScriptedProvider::from_yaml(&text, &path.display().to_string())?;
                script.skip(skip);
                fixed(Arc::new(script), &None)
            }
            LlmSpec::OpenAi(model) => fixed(openai(), model),
            LlmSpec::Anthropic(model) => fixed(anthropic(), model),
            LlmSpec::Auto => Arc::new(AutoRouter::new(openai(), anthropic(), registry)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        let table = [
            (
                "scripted:ex/replies.yaml",
                Some(LlmSpec::Scripted("ex/replies.yaml".into())),
            ),
            ("openai", Some(LlmSpec::OpenAi(None))),
            (
                "openai:gpt-4o-mini",
                Some(LlmSpec::OpenAi(Some("gpt-4o-mini".into()))),
            ),
            (
                "anthropic:claude-sonnet-4-5",
                Some(LlmSpec::Anthropic(Some("claude-sonnet-4-5".into()))),
            ),
            ("auto", Some(LlmSpec::Auto)),
            ("scripted:", None),
            ("scripted", None),
            ("openai:", None),
            ("gemini:x", None),
            ("auto:x", None),
        ];
        for (text, expected) in table {
            match (text.parse::<LlmSpec>(), expected) {
                (Ok(spec), Some(expected)) => {
                    assert_eq!(spec, expected, "{text}");
                    assert_eq!(spec.to_string(), text);
                }
                (Err(error), None) => assert!(error.to_string().contains(text), "{error}"),
                (other, expected) => panic!("{text}: got {other:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn auto_routes_by_model_family() {
        let registry = Arc::new(Registry::builtin());
        let router = AutoRouter::new(
            Arc::new(ScriptedProvider::texts(["o"])),
            Arc::new(ScriptedProvider::texts(["a"])),
            registry,
        );
        assert_eq!(
            router.route("claude-sonnet-4-5").rules,
            Some(fit::Rules::Anthropic)
        );
        assert_eq!(router.route("gpt-4o").rules, Some(fit::Rules::OpenAi));
        assert_eq!(router.route("llama3.1:8b").rules, Some(fit::Rules::OpenAi));
        let scripted = FixedRouter::new(Arc::new(ScriptedProvider::texts(["x"])));
        assert_eq!(scripted.route("claude-sonnet-4-5").rules, None);
    }
}
