//! The upstreams a server's chat turns go to, chosen by model.
//!
//! A server calls one upstream by default and may name more, each for the models whose
//! names match its glob patterns (`claude-*`, `llama-3.?-*`): the routes are tried in the
//! order they were given and the first whose pattern matches wins; a model no route names
//! goes to the default. Each upstream speaks its own wire format, so a door writes the call
//! for the upstream the model picks ([`ChatUpstream::format`]).

use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::passthrough::ChatUpstream;

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
