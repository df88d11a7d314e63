//! A system prompt or a task as a workflow file writes it: a text (a Jinja template, as
//! always), or a prompt template with its syntax and partial variables:
//!
//! ```yaml
//! system_prompt:
//!   template: 'You write {style}s about {topic}. Output JSON like {{"poem": "..."}}.'
//!   format: fstring          # or jinja (the default)
//!   partials: {style: haiku, today: '{{ current_date }}'}
//! ```

use std::fmt;

use contexture_core::context::template::has_template;
use contexture_core::context::{
    ContextStore, PromptTemplate, RenderOptions, Rendered, TemplateError, TemplateFormat,
};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A system prompt or a task.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptText {
    /// The text.
    pub template: String,
    /// Its syntax.
    pub format: TemplateFormat,
    /// Variables filled in ahead of time (a context key of the same name wins).
    pub partials: Map<String, Value>,
}

/// The map form, as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PromptSpec {
    template: String,
    #[serde(default)]
    format: TemplateFormat,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    partials: Map<String, Value>,
}

impl PromptText {
    /// A Jinja text, as a plain string in a file is.
    pub fn jinja(text: impl Into<String>) -> PromptText {
        PromptText {
            template: text.into(),
            format: TemplateFormat::Jinja,
            partials: Map::new(),
        }
    }

    /// As a prompt template (its syntax checked).
    pub fn prompt(&self) -> Result<PromptTemplate, TemplateError> {
        let mut prompt = PromptTemplate::new(self.template.clone(), self.format)?;
        for (name, value) in &self.partials {
            prompt = prompt.partial(name.clone(), value.clone());
        }
        Ok(prompt)
    }

    /// Rendered against `store`.
    pub fn render(
        &self,
        store: &ContextStore,
        options: &RenderOptions,
    ) -> Result<Rendered, TemplateError> {
        self.prompt()?.render(store, options)
    }

    /// The text as it is sent when nothing in it is a variable (`None` when something is).
    pub fn plain(&self) -> Option<String> {
        let plain = match self.format {
            TemplateFormat::Jinja => !has_template(&self.template),
            TemplateFormat::Fstring => !self.template.contains(['{', '}']),
        };
        plain.then(|| self.template.clone())
    }
}

impl<'de> Deserialize<'de> for PromptText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<PromptText, D::Error> {
        struct TextOrTemplate;

        impl<'de> Visitor<'de> for TextOrTemplate {
            type Value = PromptText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a text, or a map with `template` and optional `format` (jinja or fstring) and `partials`")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<PromptText, E> {
                Ok(PromptText::jinja(text))
            }

            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<PromptText, M::Error> {
                let spec = PromptSpec::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(PromptText {
                    template: spec.template,
                    format: spec.format,
                    partials: spec.partials,
                })
            }
        }

        deserializer.deserialize_any(TextOrTemplate)
    }
}

impl Serialize for PromptText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.format == TemplateFormat::Jinja && self.partials.is_empty() {
            return serializer.serialize_str(&self.template);
        }
        PromptSpec {
            template: self.template.clone(),
            format: self.format,
            partials: self.partials.clone(),
        }
        .serialize(serializer)
    }
}
