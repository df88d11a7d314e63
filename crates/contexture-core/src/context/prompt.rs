//! Prompt templates as values: a template text in one of two syntaxes ([`TemplateFormat`]),
//! with partial variables filled in ahead of time, that lists the variables it still needs
//! and combines with another by `+`.
//!
//! Partials are the template's own values: a context key of the same name (what the caller
//! passes when formatting) wins over them, as keyword arguments win over partials in the
//! prompt-template libraries this mirrors. A partial whose value is itself a template
//! (`"{{ current_date }}"`) is rendered when the prompt is, so it can be dynamic.

use std::collections::BTreeSet;
use std::ops::Add;

use serde_json::{Map, Value};

use super::dynamic::DYNAMIC_VARIABLES;
use super::store::ContextStore;
use super::template::fstring;
use super::template::{
    RenderOptions, Rendered, TemplateError, TemplateFormat, has_template, jinja_variables, render,
    render_fstring, render_value,
};

/// A prompt template: its text, its syntax and its partial variables.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTemplate {
    source: String,
    format: TemplateFormat,
    partials: Map<String, Value>,
}

impl PromptTemplate {
    /// A template of `source` in `format`, its syntax checked (a mistake names its line, and
    /// its column in the simple syntax).
    pub fn new(source: impl Into<String>, format: TemplateFormat) -> Result<Self, TemplateError> {
        let template = PromptTemplate {
            source: source.into(),
            format,
            partials: Map::new(),
        };
        template.read_variables()?;
        Ok(template)
    }

    /// A Jinja template (`{{ name }}`).
    pub fn jinja(source: impl Into<String>) -> Result<Self, TemplateError> {
        PromptTemplate::new(source, TemplateFormat::Jinja)
    }

    /// A template in the simple syntax (`{name}`, `{{` and `}}` literal braces).
    pub fn fstring(source: impl Into<String>) -> Result<Self, TemplateError> {
        PromptTemplate::new(source, TemplateFormat::Fstring)
    }

    /// The same template with the partial variable `name` set to `value` (a string holding a
    /// Jinja template is rendered each time the prompt is).
    pub fn partial(mut self, name: impl Into<String>, value: Value) -> Self {
        self.partials.insert(name.into(), value);
        self
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its syntax.
    pub fn format(&self) -> TemplateFormat {
        self.format
    }

    /// Its partial variables.
    pub fn partials(&self) -> &Map<String, Value> {
        &self.partials
    }

    /// The variables a caller must supply, sorted: the root names the template reads, less
    /// its partials and the dynamic variables (`current_date`, `uuid`, ...), which are
    /// always there.
    pub fn input_variables(&self) -> Vec<String> {
        self.read_variables()
            .unwrap_or_default()
            .into_iter()
            .filter(|name| {
                !self.partials.contains_key(name) && !DYNAMIC_VARIABLES.contains(&name.as_str())
            })
            .collect()
    }

    /// Renders the prompt against `store` with `options`: the partials are variables below
    /// the context's keys (a key of the same name wins).
    pub fn render(
        &self,
        store: &ContextStore,
        options: &RenderOptions,
    ) -> Result<Rendered, TemplateError> {
        let mut options = options.clone();
        for (name, value) in &self.partials {
            let value = match value {
                Value::String(text) if has_template(text) => render_value(text, store, &options)?.0,
                other => other.clone(),
            };
            options.variables.insert(name.clone(), value);
        }
        match self.format {
            TemplateFormat::Jinja => render(&self.source, store, &options),
            TemplateFormat::Fstring => render_fstring(&self.source, store, &options),
        }
    }

    /// Every root name the template reads.
    fn read_variables(&self) -> Result<BTreeSet<String>, TemplateError> {
        match self.format {
            TemplateFormat::Jinja => jinja_variables(&self.source),
            TemplateFormat::Fstring => Ok(fstring::variables(&fstring::parse(&self.source)?)),
        }
    }

    /// The template's text in Jinja syntax (for joining templates of both syntaxes).
    fn jinja_source(&self) -> String {
        match self.format {
            TemplateFormat::Jinja => self.source.clone(),
            TemplateFormat::Fstring => fstring::to_jinja(&self.source),
        }
    }
}

/// `a + b`: the texts one after the other, both sides' partials kept. Two templates of one
/// syntax keep it; a simple template joined to a Jinja one is turned into Jinja first. Both
/// sides giving one partial different values is [`TemplateError::PartialConflict`], never a
/// silent choice.
impl Add for PromptTemplate {
    type Output = Result<PromptTemplate, TemplateError>;

    fn add(self, other: PromptTemplate) -> Self::Output {
        let (source, format) = if self.format == other.format {
            (self.source.clone() + &other.source, self.format)
        } else {
            (
                self.jinja_source() + &other.jinja_source(),
                TemplateFormat::Jinja,
            )
        };
        let mut partials = self.partials;
        for (name, value) in other.partials {
            match partials.get(&name) {
                Some(existing) if *existing != value => {
                    return Err(TemplateError::PartialConflict { name });
                }
                _ => {
                    partials.insert(name, value);
                }
            }
        }
        Ok(PromptTemplate {
            source,
            format,
            partials,
        })
    }
}
