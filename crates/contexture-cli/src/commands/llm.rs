//! The options that say which LLM answers and how it is called, shared by the commands that
//! call models (`run`, `thread compact`).

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use contexture_engine::llm::HttpSettings;
use contexture_llm::RetryPolicy;

/// How to reach the LLM.
#[derive(Debug, Args)]
pub struct LlmArgs {
    /// Who answers: scripted:FILE, openai[:MODEL], anthropic[:MODEL] or auto (also
    /// $CONTEXTURE_LLM; default auto: each model picks its provider).
    #[arg(long, env = "CONTEXTURE_LLM")]
    pub llm: Option<String>,
    /// Seconds an LLM call may take (and a stream may pause).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub llm_timeout: f64,
    /// Retries of an LLM call on 429, 5xx, timeouts and connection failures.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub llm_retries: u32,
    /// The OpenAI-compatible server's base URL (default: $OPENAI_BASE_URL, else OpenAI's),
    /// e.g. http://127.0.0.1:11434/v1 for Ollama; the key comes from $OPENAI_API_KEY.
    #[arg(long, value_name = "URL")]
    pub openai_base_url: Option<String>,
}

impl LlmArgs {
    /// The HTTP providers' settings; an error for a timeout that is not a positive number.
    pub fn settings(&self) -> Result<HttpSettings> {
        if !(self.llm_timeout.is_finite() && self.llm_timeout > 0.0) {
            bail!(
                "--llm-timeout must be a positive number of seconds, not {}",
                self.llm_timeout
            );
        }
        Ok(HttpSettings {
            timeout: Duration::from_secs_f64(self.llm_timeout),
            retry: RetryPolicy {
                max_retries: self.llm_retries,
                ..RetryPolicy::default()
            },
            openai_base_url: self.openai_base_url.clone(),
            openai_api_key: None,
        })
    }
}
