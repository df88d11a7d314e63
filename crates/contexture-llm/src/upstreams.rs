//! The upstreams a server's chat turns go to, chosen by model.
//!
//! A server calls one upstream by default and may name more, each for the models whose
//! names match its glob patterns (`claude-*`, `llama-3.?-*`): the routes are tried in the
//! order they were given and the first whose pattern matches wins; a model no route names
//! goes to the default. Each upstream speaks its own wire format, so a door writes the call
//! for the upstream the model picks ([`ChatUpstream::format`]).

use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::{Value, json};

use crate::passthrough::{ChatUpstream, PassthroughError, UpstreamResponse};
use crate::wire::{anthropic_model_entries, openai_model_entries};

/// Whose shape a model list is written in: the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelListShape {
    /// OpenAI's (`{"object": "list", "data": [...]}`).
    OpenAi,
    /// Anthropic's (`{"data": [...], "has_more", "first_id", "last_id"}`).
    Anthropic,
}

/// Every upstream's models ([`Upstreams::model_list`]).
#[derive(Debug)]
pub enum ModelList {
    /// The one upstream's list as it answered (its status and body), for a client of its
    /// own shape.
    AsAnswered(UpstreamResponse),
    /// The lists in one.
    Merged(Value),
}

/// Why the model list could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ModelListError {
    /// The one upstream could not be reached.
    #[error(transparent)]
    Upstream(#[from] PassthroughError),
    /// An upstream of several could not list its models (`which` names it: its place and
    /// kind).
    #[error("{which}: {problem}")]
    Listing {
        /// The upstream.
        which: String,
        /// What went wrong.
        problem: String,
    },
}

/// A glob pattern of a route that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the model pattern `{pattern}` is not a glob: {detail}")]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub detail: String,
}

/// The upstreams of a server: routes by model name, and the default for every other model.
#[derive(Clone)]
pub struct Upstreams {
    routes: Vec<Route>,
    default: Arc<dyn ChatUpstream>,
}

/// One route: the models it takes and where they go.
#[derive(Clone)]
struct Route {
    patterns: Vec<String>,
    matcher: GlobSet,
    upstream: Arc<dyn ChatUpstream>,
}

impl Upstreams {
    /// Every model to `default`.
    pub fn new(default: Arc<dyn ChatUpstream>) -> Upstreams {
        Upstreams {
            routes: Vec::new(),
            default,
        }
    }

    /// Checks that `pattern` is a glob a route can take.
    pub fn check_pattern(pattern: &str) -> Result<(), PatternError> {
        glob(pattern).map(drop)
    }

    /// Adds a route after those already added: the models matching any of `patterns` go to
    /// `upstream`, unless an earlier route takes them.
    pub fn route(
        mut self,
        patterns: &[String],
        upstream: Arc<dyn ChatUpstream>,
    ) -> Result<Upstreams, PatternError> {
        let mut set = GlobSetBuilder::new();
        for pattern in patterns {
            set.add(glob(pattern)?);
        }
        let matcher = set.build().map_err(|error| PatternError {
            pattern: patterns.join(", "),
            detail: error.to_string(),
        })?;
        self.routes.push(Route {
            patterns: patterns.to_vec(),
            matcher,
            upstream,
        });
        Ok(self)
    }

    /// The upstream `model` goes to: the first route with a pattern it matches, else the
    /// default.
    pub fn for_model(&self, model: &str) -> &Arc<dyn ChatUpstream> {
        self.routes
            .iter()
            .find(|route| route.matcher.is_match(model))
            .map_or(&self.default, |route| &route.upstream)
    }

    /// The default upstream, for the models no route takes.
    pub fn default_upstream(&self) -> &Arc<dyn ChatUpstream> {
        &self.default
    }

    /// Every upstream, the routes' in order and then the default.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn ChatUpstream>> {
        self.routes
            .iter()
            .map(|route| &route.upstream)
            .chain(std::iter::once(&self.default))
    }

    /// Every upstream's models, in `shape`. One upstream's list, for a client of OpenAI's
    /// shape, as it answered; else the lists in one, the routed upstreams' first, each model
    /// once (an Anthropic list read into OpenAI's shape, and back for a client of
    /// Anthropic's). An upstream that cannot list its models fails the whole list, naming
    /// it: a list that left a provider's models out would say they are not there.
    pub async fn model_list(&self, shape: ModelListShape) -> Result<ModelList, ModelListError> {
        if self.routes.is_empty() && shape == ModelListShape::OpenAi {
            return Ok(ModelList::AsAnswered(self.default.models().await?));
        }
        let mut seen = std::collections::HashSet::new();
        let mut models = Vec::new();
        for (index, upstream) in self.all().enumerate() {
            let which = format!("upstream {} ({})", index + 1, upstream.format());
            let failed = |problem: String| ModelListError::Listing {
                which: which.clone(),
                problem,
            };
            let response = upstream
                .models()
                .await
                .map_err(|error| failed(error.to_string()))?;
            let status = response.status;
            let body = response
                .body
                .collect()
                .await
                .map_err(|error| failed(error.to_string()))?;
            if !(200..300).contains(&status) {
                return Err(failed(format!("answered {status} to the model list")));
            }
            let list: Value = serde_json::from_slice(&body)
                .map_err(|error| failed(format!("its model list is not JSON: {error}")))?;
            for model in openai_model_entries(upstream.format(), &list) {
                if seen.insert(model["id"].as_str().unwrap_or_default().to_owned()) {
                    models.push(model);
                }
            }
        }
        Ok(ModelList::Merged(match shape {
            ModelListShape::OpenAi => json!({"object": "list", "data": models}),
            ModelListShape::Anthropic => {
                let models = anthropic_model_entries(&models);
                let first_id = models.first().map(|model| model["id"].clone());
                let last_id = models.last().map(|model| model["id"].clone());
                json!({"data": models, "has_more": false,
                       "first_id": first_id, "last_id": last_id})
            }
        }))
    }
}

/// `pattern` read as a glob.
fn glob(pattern: &str) -> Result<Glob, PatternError> {
    Glob::new(pattern).map_err(|error| PatternError {
        pattern: pattern.to_owned(),
        detail: error.kind().to_string(),
    })
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        for route in &self.routes {
            list.entry(&(&route.patterns, route.upstream.format()));
        }
        list.entry(&("default", self.default.format()));
        list.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passthrough::{Passthrough, UpstreamConfig};
    use crate::wire::WireFormat;

    fn upstream(format: WireFormat, url: &str) -> Arc<dyn ChatUpstream> {
        Arc::new(Passthrough::new(UpstreamConfig::speaking(format, url, None)).unwrap())
    }

    fn patterns(list: &[&str]) -> Vec<String> {
        list.iter().map(|pattern| (*pattern).to_owned()).collect()
    }

    #[test]
    fn a_model_goes_to_the_first_route_it_matches_else_to_the_default() {
        let upstreams = Upstreams::new(upstream(WireFormat::OpenAiChat, "http://default"))
            .route(
                &patterns(&["claude-*", "anthropic/*"]),
                upstream(WireFormat::AnthropicMessages, "http://anthropic"),
            )
            .unwrap()
            .route(
                &patterns(&["claude-3-haiku*", "llama-3.?-*"]),
                upstream(WireFormat::OpenAiChat, "http://second"),
            )
            .unwrap();
        let table = [
            ("claude-sonnet-4-5", WireFormat::AnthropicMessages),
            // An earlier route wins over a later, more precise one.
            ("claude-3-haiku-20240307", WireFormat::AnthropicMessages),
            ("anthropic/claude-opus-4", WireFormat::AnthropicMessages),
            ("llama-3.1-8b", WireFormat::OpenAiChat),
            ("gpt-4o-mini", WireFormat::OpenAiChat),
            // Patterns match the whole name, not a part of it.
            ("my-claude-model", WireFormat::OpenAiChat),
            ("", WireFormat::OpenAiChat),
        ];
        for (model, format) in table {
            assert_eq!(upstreams.for_model(model).format(), format, "{model}");
        }
        let second = upstreams.for_model("llama-3.1-8b");
        assert!(Arc::ptr_eq(second, upstreams.all().nth(1).unwrap()));
        assert!(Arc::ptr_eq(
            upstreams.for_model("gpt-4o"),
            upstreams.default_upstream()
        ));
        assert_eq!(upstreams.all().count(), 3);
    }

    #[test]
    fn a_pattern_that_is_no_glob_is_refused_naming_it() {
        let error = Upstreams::new(upstream(WireFormat::OpenAiChat, "http://default"))
            .route(
                &patterns(&["claude-*", "claude-[3"]),
                upstream(WireFormat::AnthropicMessages, "http://anthropic"),
            )
            .unwrap_err();
        assert_eq!(error.pattern, "claude-[3");
        assert!(
            error.to_string().contains("`claude-[3` is not a glob"),
            "{error}"
        );
    }
}
