//! Model registry: the context window, output limit and tokenizer of each
//! model, found by longest-prefix match.
//!
//! The built-in table (`data/models.toml`, compiled into the binary) covers current OpenAI,
//! Anthropic, Google, Meta Llama, Mistral and Qwen models. A TOML text in the same format
//! adds entries or overrides fields ([`Registry::apply_toml`]); a [`ModelOverride`] changes one
//! call's view of a model. An unknown model resolves to the `[default]` entry (128K window).
//!
//! Matching fixes the peers' prefix bug: a prefix only matches at a boundary (`-`, `:`, `@`,
//! `_`, `/`, or the end of the id), and the longest matching prefix wins, so `gpt-4.1` never
//! matches the 8,192-token `gpt-4` entry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::calibration::Calibration;
use crate::fit::{Rules, SystemRole};
use crate::tokens::{Encoding, TokenCounter};

const BUILTIN_TOML: &str = include_str!("../data/models.toml");

/// Characters that may follow a registry prefix inside a model id.
const BOUNDARIES: [char; 5] = ['-', ':', '@', '_', '/'];

/// Errors of the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A registry TOML text could not be parsed or had a field of the wrong type.
    #[error("{source_name}: {message}")]
    Toml {
        /// Where the text came from (a file name, or "built-in").
        source_name: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// An entry's encoding is not a shipped encoding.
    #[error(
        "{source_name}: model `{model}`: unknown encoding `{encoding}` (known: cl100k_base, o200k_base)"
    )]
    UnknownEncoding {
        /// Where the text came from.
        source_name: String,
        /// The entry's key.
        model: String,
        /// The encoding named.
        encoding: String,
    },
    /// An entry's numbers do not make sense (zero window, output larger than the window,
    /// a non-positive ratio).
    #[error("{source_name}: model `{model}`: {problem}")]
    InvalidEntry {
        /// Where the text came from.
        source_name: String,
        /// The entry's key.
        model: String,
        /// What is wrong.
        problem: String,
    },
    /// No entry matches the model id (only from [`Registry::get`]; [`Registry::resolve`]
    /// falls back to the default).
    #[error(
        "unknown model `{model}`: no registry entry matches it (see `contexture models list`; add it with a models TOML file)"
    )]
    UnknownModel {
        /// The id asked for.
        model: String,
    },
}

/// Everything the engine needs to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The model id as asked for.
    pub id: String,
    /// The registry key that matched, or `None` when the default entry was used.
    pub matched: Option<String>,
    /// Who serves the model, when known.
    pub provider: Option<String>,
    /// Tokens the model accepts, prompt and output together.
    pub context_window: u32,
    /// The most tokens the model may generate in one reply.
    pub max_output_tokens: u32,
    /// How the model's tokens are counted.
    pub counter: TokenCounter,
    /// The provider's list prices, when known.
    pub pricing: Option<Pricing>,
    /// Where the model reads its system prompt (`native` unless its entry says otherwise).
    pub system_role: SystemRole,
}

/// A model's list prices in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    /// Dollars per million prompt tokens.
    pub input_per_mtok: f64,
    /// Dollars per million generated tokens.
    pub output_per_mtok: f64,
}

impl Pricing {
    /// The cost in dollars of a call with these token counts.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        (prompt_tokens as f64 * self.input_per_mtok
            + completion_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// A per-call change to a model's limits or tokenizer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelOverride {
    /// Replaces the context window.
    pub context_window: Option<u32>,
    /// Replaces the output limit.
    pub max_output_tokens: Option<u32>,
    /// Replaces the encoding.
    pub encoding: Option<Encoding>,
    /// Replaces the estimate ratio (`1.0` with an OpenAI encoding means exact counting).
    pub estimate_ratio: Option<f64>,
}

impl ModelInfo {
    /// The message rules requests to this model must follow, by who serves it: Anthropic's
    /// for `anthropic`, Gemini's for `google` or `gemini`, else OpenAI's (which every
    /// OpenAI-compatible server accepts).
    pub fn rules(&self) -> Rules {
        match self.provider.as_deref() {
            Some("anthropic") => Rules::Anthropic,
            Some("google" | "gemini") => Rules::Gemini,
            _ => Rules::OpenAi,
        }
    }

    /// The key this model's estimates are calibrated under: the registry entry it matched
    /// (`default` for the default entry), as the estimate ratio belongs to the entry; `None`
    /// when its tokens are counted exactly.
    pub fn calibration_key(&self) -> Option<&str> {
        if self.counter.is_exact() {
            return None;
        }
        Some(self.matched.as_deref().unwrap_or("default"))
    }

    /// This model with `calibration` applied to its estimate (see
    /// [`crate::calibration`]); as it is when counted exactly or when the calibration has no
    /// factor yet.
    pub fn calibrated(mut self, calibration: &Calibration) -> ModelInfo {
        self.counter = calibration.apply(self.counter);
        self
    }

    /// This model with `changes` applied.
    pub fn with_override(mut self, changes: &ModelOverride) -> ModelInfo {
        if let Some(window) = changes.context_window {
            self.context_window = window;
        }
        if let Some(max_output) = changes.max_output_tokens {
            self.max_output_tokens = max_output;
        }
        if changes.encoding.is_some() || changes.estimate_ratio.is_some() {
            let encoding = changes.encoding.unwrap_or(self.counter.encoding());
            let ratio = changes.estimate_ratio.or(match self.counter {
                TokenCounter::Estimate { ratio, .. } => Some(ratio),
                TokenCounter::Exact { .. } => None,
            });
            self.counter = counter_for(encoding, ratio);
        }
        self
    }
}

/// One entry of a registry TOML text; every field optional so an override can change one.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySpec {
    context_window: Option<u32>,
    max_output_tokens: Option<u32>,
    encoding: Option<String>,
    estimate_ratio: Option<f64>,
    provider: Option<String>,
    input_cost_per_mtok: Option<f64>,
    output_cost_per_mtok: Option<f64>,
    system_role: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    #[serde(default)]
    default: Option<EntrySpec>,
    #[serde(default)]
    models: BTreeMap<String, EntrySpec>,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    context_window: u32,
    max_output_tokens: u32,
    encoding: Encoding,
    estimate_ratio: Option<f64>,
    provider: Option<String>,
    pricing: Option<Pricing>,
    system_role: SystemRole,
}

impl Entry {
    fn info(&self, id: &str, matched: Option<&str>) -> ModelInfo {
        ModelInfo {
            id: id.to_owned(),
            matched: matched.map(str::to_owned),
            provider: self.provider.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            counter: counter_for(self.encoding, self.estimate_ratio),
            pricing: self.pricing,
            system_role: self.system_role,
        }
    }
}

fn counter_for(encoding: Encoding, ratio: Option<f64>) -> TokenCounter {
    match ratio {
        Some(ratio) if ratio != 1.0 => TokenCounter::Estimate {
            encoding,
            ratio,
            calibration: None,
        },
        _ => TokenCounter::Exact { encoding },
    }
}

/// The table of known models.
#[derive(Debug, Clone, PartialEq)]
pub struct Registry {
    default: Entry,
    /// Keyed by lower-cased prefix.
    entries: BTreeMap<String, Entry>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// The built-in registry.
    pub fn builtin() -> Registry {
        let mut registry = Registry {
            default: Entry {
                context_window: 128_000,
                max_output_tokens: 4096,
                encoding: Encoding::O200kBase,
                estimate_ratio: None,
                provider: None,
                pricing: None,
                system_role: SystemRole::Native,
            },
            entries: BTreeMap::new(),
        };
        registry
            .apply_toml(BUILTIN_TOML, "built-in models.toml")
            .expect("the built-in registry is valid (pinned by a unit test)");
        registry
    }

    /// Adds the entries of a registry TOML text, or overrides fields of existing ones.
    /// `source_name` names the text in errors (usually its file path). On error nothing is
    /// changed.
    pub fn apply_toml(&mut self, text: &str, source_name: &str) -> Result<(), RegistryError> {
        let file: RegistryFile = toml::from_str(text).map_err(|error| RegistryError::Toml {
            source_name: source_name.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        })?;
        let mut updated = self.clone();
        if let Some(spec) = file.default {
            updated.default = merge(Some(&updated.default), &spec, "[default]", source_name)?;
        }
        for (key, spec) in &file.models {
            let key = key.to_ascii_lowercase();
            let entry = merge(updated.entries.get(&key), &spec.clone(), &key, source_name)?;
            updated.entries.insert(key, entry);
        }
        *self = updated;
        Ok(())
    }

    /// The entry matching `model` by longest boundary-aware prefix, or an error naming it.
    pub fn get(&self, model: &str) -> Result<ModelInfo, RegistryError> {
        self.find(model)
            .map(|(key, entry)| entry.info(model, Some(key)))
            .ok_or_else(|| RegistryError::UnknownModel {
                model: model.to_owned(),
            })
    }

    /// The entry matching `model`, or the default entry (128K window) when none matches.
    pub fn resolve(&self, model: &str) -> ModelInfo {
        self.get(model)
            .unwrap_or_else(|_| self.default.info(model, None))
    }

    /// The default entry, used for models no entry matches.
    pub fn default_model(&self) -> ModelInfo {
        self.default.info("default", None)
    }

    /// Every entry, as if its key were asked for, in key order.
    pub fn models(&self) -> Vec<ModelInfo> {
        self.entries
            .iter()
            .map(|(key, entry)| entry.info(key, Some(key)))
            .collect()
    }

    fn find(&self, model: &str) -> Option<(&str, &Entry)> {
        let id = model.trim().to_ascii_lowercase();
        self.longest_prefix(&id).or_else(|| {
            // `meta-llama/llama-3.1-8b-instruct`, `openai/gpt-4o`: try the part after the path.
            id.rsplit_once('/')
                .and_then(|(_, tail)| self.longest_prefix(tail))
        })
    }

    fn longest_prefix(&self, id: &str) -> Option<(&str, &Entry)> {
        // Candidate prefixes of `id` ending at a boundary, longest first; each is one map
        // lookup, so matching costs O(boundaries in the id), not O(entries).
        let mut ends: Vec<usize> = id
            .char_indices()
            .filter(|(_, c)| BOUNDARIES.contains(c))
            .map(|(index, _)| index)
            .collect();
        ends.push(id.len());
        ends.iter()
            .rev()
            .find_map(|&end| self.entries.get_key_value(&id[..end]))
            .map(|(key, entry)| (key.as_str(), entry))
    }
}

fn merge(
    base: Option<&Entry>,
    spec: &EntrySpec,
    key: &str,
    source_name: &str,
) -> Result<Entry, RegistryError> {
    let invalid = |problem: String| RegistryError::InvalidEntry {
        source_name: source_name.to_owned(),
        model: key.to_owned(),
        problem,
    };
    let encoding = match &spec.encoding {
        Some(name) => Encoding::from_name(name).map_err(|_| RegistryError::UnknownEncoding {
            source_name: source_name.to_owned(),
            model: key.to_owned(),
            encoding: name.clone(),
        })?,
        None => base.map_or(Encoding::O200kBase, |b| b.encoding),
    };
    let context_window = spec
        .context_window
        .or(base.map(|b| b.context_window))
        .ok_or_else(|| invalid("context_window is missing".to_owned()))?;
    let max_output_tokens = spec
        .max_output_tokens
        .or(base.map(|b| b.max_output_tokens))
        .ok_or_else(|| invalid("max_output_tokens is missing".to_owned()))?;
    let estimate_ratio = spec.estimate_ratio.or(base.and_then(|b| b.estimate_ratio));
    if context_window == 0 {
        return Err(invalid("context_window must be greater than 0".to_owned()));
    }
    if max_output_tokens > context_window {
        return Err(invalid(format!(
            "max_output_tokens ({max_output_tokens}) exceeds context_window ({context_window})"
        )));
    }
    if let Some(ratio) = estimate_ratio
        && !(ratio.is_finite() && ratio > 0.0)
    {
        return Err(invalid(format!(
            "estimate_ratio must be a positive number, not {ratio}"
        )));
    }
    let pricing = match (spec.input_cost_per_mtok, spec.output_cost_per_mtok) {
        (Some(input), Some(output)) => Some(Pricing {
            input_per_mtok: input,
            output_per_mtok: output,
        }),
        (None, None) => base.and_then(|b| b.pricing),
        _ => {
            return Err(invalid(
                "input_cost_per_mtok and output_cost_per_mtok must be given together".to_owned(),
            ));
        }
    };
    if let Some(p) = pricing
        && !(p.input_per_mtok >= 0.0 && p.output_per_mtok >= 0.0)
    {
        return Err(invalid("prices must be non-negative numbers".to_owned()));
    }
    let system_role = match &spec.system_role {
        Some(name) => name
            .parse::<SystemRole>()
            .map_err(|error| invalid(error.to_string()))?,
        None => base.map_or(SystemRole::Native, |b| b.system_role),
    };
    Ok(Entry {
        pricing,
        context_window,
        max_output_tokens,
        encoding,
        estimate_ratio,
        provider: spec
            .provider
            .clone()
            .or_else(|| base.and_then(|b| b.provider.clone())),
        system_role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_rules_follow_who_serves_it() {
        let registry = Registry::builtin();
        for (model, rules) in [
            ("claude-3-5-sonnet-20241022", Rules::Anthropic),
            ("gemini-2.5-pro", Rules::Gemini),
            ("gpt-4o", Rules::OpenAi),
            ("llama3.1:8b", Rules::OpenAi),
            ("totally-unknown", Rules::OpenAi),
        ] {
            assert_eq!(registry.resolve(model).rules(), rules, "{model}");
        }
        let served_by = |provider: &str| ModelInfo {
            provider: Some(provider.to_owned()),
            ..registry.resolve("gpt-4o")
        };
        assert_eq!(served_by("gemini").rules(), Rules::Gemini);
        assert_eq!(served_by("mistral").rules(), Rules::OpenAi);
    }

    #[test]
    fn builtin_registry_parses() {
        let registry = Registry::builtin();
        assert!(registry.models().len() > 40);
    }

    #[test]
    fn longest_prefix_at_a_boundary() {
        let registry = Registry::builtin();
        let cases = [
            ("gpt-4", Some("gpt-4"), 8192),
            ("gpt-4-0613", Some("gpt-4"), 8192),
            ("gpt-4.1", Some("gpt-4.1"), 1_047_576),
            ("gpt-4.1-mini-2025-04-14", Some("gpt-4.1-mini"), 1_047_576),
            ("gpt-4.1-2025-04-14", Some("gpt-4.1"), 1_047_576),
            ("gpt-4o-2024-08-06", Some("gpt-4o"), 128_000),
            ("gpt-4o-mini", Some("gpt-4o-mini"), 128_000),
            ("GPT-4-Turbo-Preview", Some("gpt-4-turbo"), 128_000),
            ("claude-opus-4-1-20250805", Some("claude-opus-4-1"), 200_000),
            (
                "claude-3-5-sonnet-20241022",
                Some("claude-3-5-sonnet"),
                200_000,
            ),
            (
                "meta-llama/llama-3.1-8b-instruct",
                Some("llama-3.1"),
                131_072,
            ),
            ("llama3.1:8b", Some("llama3.1"), 131_072),
            ("qwen2.5-coder:7b", Some("qwen2.5-coder"), 32_768),
            (
                "gemini-2.5-pro-preview-05-06",
                Some("gemini-2.5-pro"),
                1_048_576,
            ),
            ("openai/gpt-5-mini", Some("gpt-5-mini"), 400_000),
            ("gpt-5-2025-08-07", Some("gpt-5"), 400_000),
            ("gpt-4x", None, 128_000),
            ("totally-unknown", None, 128_000),
        ];
        for (id, matched, window) in cases {
            let info = registry.resolve(id);
            assert_eq!(info.matched.as_deref(), matched, "{id}");
            assert_eq!(info.context_window, window, "{id}");
        }
    }

    #[test]
    fn openai_models_count_exactly_and_others_estimate() {
        let registry = Registry::builtin();
        assert!(registry.resolve("gpt-4o").counter.is_exact());
        assert_eq!(
            registry.resolve("gpt-4").counter.encoding(),
            Encoding::Cl100kBase
        );
        assert!(!registry.resolve("claude-sonnet-4-5").counter.is_exact());
    }

    #[test]
    fn toml_overrides_and_adds() {
        let mut registry = Registry::builtin();
        registry
            .apply_toml(
                "[models.\"gpt-4o\"]\ncontext_window = 64000\n\n[models.\"my-model\"]\ncontext_window = 32000\nmax_output_tokens = 1000\nencoding = \"cl100k_base\"\n",
                "mine.toml",
            )
            .unwrap();
        let gpt = registry.resolve("gpt-4o");
        assert_eq!(gpt.context_window, 64000);
        assert_eq!(gpt.max_output_tokens, 16384);
        assert_eq!(registry.resolve("my-model-v2").context_window, 32000);
    }

    #[test]
    fn toml_errors_name_the_place() {
        let mut registry = Registry::builtin();
        let before = registry.clone();
        let err = registry
            .apply_toml("[models.\"x\"]\ncontext_window = \"big\"\n", "mine.toml")
            .unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("mine.toml:"), "{text}");
        assert!(text.contains("line 2"), "{text}");
        assert_eq!(registry, before);

        let err = registry
            .apply_toml(
                "[models.\"x\"]\ncontext_window = 10\nmax_output_tokens = 5\nencoding = \"p50k\"\n",
                "mine.toml",
            )
            .unwrap_err();
        assert!(err.to_string().contains("unknown encoding `p50k`"));

        let err = registry
            .apply_toml("[models.\"x\"]\ncontext_window = 10\n", "mine.toml")
            .unwrap_err();
        assert!(err.to_string().contains("max_output_tokens is missing"));
    }

    #[test]
    fn per_call_override() {
        let info = Registry::builtin()
            .resolve("gpt-4o")
            .with_override(&ModelOverride {
                context_window: Some(1000),
                estimate_ratio: Some(1.5),
                ..ModelOverride::default()
            });
        assert_eq!(info.context_window, 1000);
        assert_eq!(
            info.counter,
            TokenCounter::Estimate {
                encoding: Encoding::O200kBase,
                ratio: 1.5,
                calibration: None,
            }
        );
    }

    #[test]
    fn pricing_is_read_and_applied() {
        let registry = Registry::builtin();
        let pricing = registry.resolve("gpt-4o-2024-08-06").pricing.unwrap();
        assert_eq!(pricing.input_per_mtok, 2.5);
        assert!((pricing.cost(1_000_000, 100_000) - 3.5).abs() < 1e-9);
        assert_eq!(registry.resolve("unknown-model").pricing, None);
        let mut registry = registry;
        let err = registry
            .apply_toml("[models.\"x\"]\ncontext_window = 10\nmax_output_tokens = 5\ninput_cost_per_mtok = 1.0\n", "mine.toml")
            .unwrap_err();
        assert!(err.to_string().contains("must be given together"), "{err}");
    }

    #[test]
    fn unknown_model_is_an_error_from_get() {
        let err = Registry::builtin().get("nope").unwrap_err();
        assert!(err.to_string().contains("unknown model `nope`"));
    }
}
