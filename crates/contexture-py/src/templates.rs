//! Templates, step-output parsing and conditions, as a workflow step uses them:
//! `Template` (a prompt template with partials, joined by `+`), `parse_output`,
//! `eval_condition`.

use contexture_core::context::{
    Condition, ContextStore, MissingPolicy, PromptTemplate, Scope, TemplateFormat,
    parse_output as parse,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::{Map, Value};

use crate::errors::{Kind, error, from_error};
use crate::json::{to_json, to_python};

/// A prompt template: its text in Jinja (`{{ name }}`) or the simple syntax (`{name}`),
/// with partial variables filled in ahead of time. Its syntax is checked when it is made;
/// `a + b` joins two templates, keeping both sides' partials.
#[pyclass(name = "Template", module = "contexture", frozen)]
pub struct Template {
    inner: PromptTemplate,
}

#[pymethods]
impl Template {
    #[new]
    #[pyo3(signature = (source, format="jinja", partials=None))]
    fn new(source: String, format: &str, partials: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let format: TemplateFormat = format
            .parse()
            .map_err(|problem: String| error(Kind::Input, format!("format: {problem}")))?;
        let mut inner = PromptTemplate::new(source, format)
            .map_err(|problem| from_error(Kind::Template, &problem))?;
        for (name, value) in object(partials, "partials")? {
            inner = inner.partial(name, value);
        }
        Ok(Template { inner })
    }

    /// Renders the template against `context` (a dict: the step's context store) and the
    /// keyword arguments (which win over the context's keys; both win over partials).
    /// `missing` says what a variable nobody gives becomes: `"keep"` (its placeholder
    /// stays), `"empty"` or `"error"`.
    #[pyo3(signature = (context=None, *, missing="keep", **variables))]
    fn render(
        &self,
        context: Option<&Bound<'_, PyAny>>,
        missing: &str,
        variables: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let mut values = object(context, "context")?;
        if let Some(variables) = variables {
            values.extend(object(Some(variables.as_any()), "variables")?);
        }
        let missing: MissingPolicy = missing
            .parse()
            .map_err(|problem: String| error(Kind::Input, format!("missing: {problem}")))?;
        let options = contexture_engine::system::render_options(None).with_missing(missing);
        let rendered = self
            .inner
            .render(&ContextStore::from_map(values), &options)
            .map_err(|problem| from_error(Kind::Template, &problem))?;
        Ok(rendered.text)
    }

    fn __add__(&self, other: &Bound<'_, Template>) -> PyResult<Template> {
        let joined = (self.inner.clone() + other.get().inner.clone())
            .map_err(|problem| from_error(Kind::Template, &problem))?;
        Ok(Template { inner: joined })
    }

    /// The template's text.
    #[getter]
    fn source(&self) -> &str {
        self.inner.source()
    }

    /// Its syntax: `"jinja"` or `"fstring"`.
    #[getter]
    fn format(&self) -> String {
        self.inner.format().to_string()
    }

    /// Its partial variables.
    #[getter]
    fn partials<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &Value::Object(self.inner.partials().clone()))
    }

    /// The variables a caller must give, sorted (not the partials, not the dynamic
    /// variables such as `current_date`).
    #[getter]
    fn input_variables<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.input_variables())
    }

    fn __repr__(&self) -> String {
        format!(
            "Template({:?}, format={:?})",
            self.inner.source(),
            self.inner.format().to_string()
        )
    }
}

/// Parses a step's output as a workflow does: JSON, then a fenced block, then a Python
/// literal, then JSON found in prose, else the text itself. Returns a dict with `value`,
/// `format` (which stage found it) and `notes` (why earlier stages did not apply).
#[pyfunction]
pub fn parse_output<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    let parsed = parse(text);
    let mut value =
        serde_json::to_value(&parsed).map_err(|problem| from_error(Kind::Input, &problem))?;
    if let Value::Object(map) = &mut value {
        map.entry("notes")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    to_python(py, &value)
}

/// Evaluates a workflow condition or expression (`score > 3 and tags | length`) against
/// `context` (a dict) and, when given, a step's parsed `output`; returns its value.
#[pyfunction]
#[pyo3(signature = (expression, context=None, output=None))]
pub fn eval_condition<'py>(
    py: Python<'py>,
    expression: String,
    context: Option<&Bound<'py, PyAny>>,
    output: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let condition =
        Condition::compile(expression).map_err(|problem| from_error(Kind::Input, &problem))?;
    let store = ContextStore::from_map(object(context, "context")?);
    let output = match output {
        Some(output) if !output.is_none() => Some(to_json(output, "output")?),
        _ => None,
    };
    let mut scope = Scope::new(&store);
    if let Some(output) = &output {
        scope = scope.with_output(output);
    }
    let value = condition
        .value(scope)
        .map_err(|problem| from_error(Kind::Input, &problem))?;
    to_python(py, &value)
}

/// A dict argument as a JSON object (`None`: empty).
fn object(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Map<String, Value>> {
    match value {
        None => Ok(Map::new()),
        Some(value) if value.is_none() => Ok(Map::new()),
        Some(value) => match to_json(value, name)? {
            Value::Object(map) => Ok(map),
            _ => Err(error(Kind::Input, format!("{name}: expected a dict"))),
        },
    }
}
