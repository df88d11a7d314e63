//! Fitting a message list for a model, and the provider rules: `fit`, `validate`,
//! `repair`. The fit is the engine's, with the settings every fit is made with (the
//! registry's model, a fit policy, the call's overrides), as `contexture fit` makes it.

use contexture_core::Role;
use contexture_core::fit::{self as rules, FitPolicy, Rules, Strategy};
use contexture_core::thread::Projection;
use contexture_engine::fit_report::FitReport;
use contexture_engine::fitting::{
    FitError, FitOverrides, FitSettings, FittedRequest, HistoryShape,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

use crate::errors::{Kind, error, from_error};
use crate::json::{to_json, to_python};
use crate::messages::{self, Format};
use crate::tokens;

/// Histories with more messages than this are fitted with the interpreter released.
const DETACH_ABOVE_MESSAGES: usize = 256;

/// Fits `messages` for `model` and returns `(fitted messages, report)`: oversized tool
/// results cut, old ones cleared (with a policy that says so), the history trimmed by the
/// strategy to the budget (the model's window minus the reply reserve, lowered by
/// `max_tokens`), tool calls kept with their results and the list mended for the
/// provider's rules.
#[pyfunction]
#[pyo3(signature = (
    messages, model, max_tokens=None, strategy=None, rules=None, policy=None, tools=None,
    *, pin=Vec::new(), start_on=Vec::new(), end_on=Vec::new(), include_system=true,
    allow_partial=false, counts=None, format="openai", convert=None
))]
#[allow(clippy::too_many_arguments)]
pub fn fit<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    model: String,
    max_tokens: Option<u32>,
    strategy: Option<String>,
    rules: Option<String>,
    policy: Option<&Bound<'py, PyAny>>,
    tools: Option<&Bound<'py, PyAny>>,
    pin: Vec<usize>,
    start_on: Vec<String>,
    end_on: Vec<String>,
    include_system: bool,
    allow_partial: bool,
    counts: Option<Vec<u32>>,
    format: &str,
    convert: Option<Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let format = Format::parse(format)?;
    if convert.is_some() && (format != Format::OpenAi || !pin.is_empty()) {
        return Err(error(
            Kind::Input,
            "convert: only for a list in the openai format, without pins",
        ));
    }
    let overrides = FitOverrides {
        max_tokens,
        strategy: strategy.as_deref().map(parse_strategy).transpose()?,
        rules: rules.as_deref().map(parse_rules).transpose()?,
        shape: HistoryShape {
            keep_system: include_system,
            start_on: roles("start_on", &start_on)?,
            end_on: roles("end_on", &end_on)?,
            allow_partial,
        },
        ..FitOverrides::default()
    };
    let policy = match policy {
        Some(policy) if !policy.is_none() => parse_policy(policy)?,
        _ => FitPolicy::default(),
    };
    let settings = FitSettings::new(tokens::model(&model)?, policy, overrides)
        .map_err(|problem| from_error(Kind::Input, &problem))?;
    let tools = tokens::tools(tools)?;
    let encoding = settings.model.counter.encoding();
    let cannot_fit = |problem: FitError| {
        let limit = settings
            .budget()
            .limits(&settings.model)
            .map_or(0, |limits| limits.limit);
        error(
            Kind::Fit,
            format!(
                "cannot fit the messages into {limit} tokens for {}: {problem}",
                settings.model.id
            ),
        )
    };
    let (fitted, count, given) = match messages.cast::<PyList>() {
        // An OpenAI list is read from its end, one message at a time, only as far back as
        // the fit needs: a long history costs what the fit keeps. Pinned messages can be
        // anywhere, so a fit with pins reads every message.
        Ok(list) if format == Format::OpenAi && pin.is_empty() => {
            let mut reader = messages::Reader::new(list, counts, encoding, convert)?;
            let count = reader.len();
            let fitted = settings
                .fit_list_read_back(count, |index| reader.at(index), &tools)?
                .map_err(cannot_fit)?;
            (fitted, count, reader.into_given())
        }
        _ => {
            let mut read = messages::read(messages, format)?;
            let count = read.messages.len();
            for index in pin {
                match read.messages.get_mut(index) {
                    Some(message) => message.metadata.pinned = true,
                    None => {
                        return Err(error(
                            Kind::Input,
                            format!("pin: there is no message {index} (the list has {count})"),
                        ));
                    }
                }
            }
            if let Some(counts) = counts {
                messages::check_counts(&counts, count)?;
                for (message, tokens) in read.messages.iter().zip(counts) {
                    message.set_cached_tokens(encoding, tokens);
                }
            }
            read.refresh_given();
            let projection = Projection::from_messages(std::mem::take(&mut read.messages));
            let fitted = if count > DETACH_ABOVE_MESSAGES {
                py.detach(|| settings.fit(projection, &[], &tools))
            } else {
                settings.fit(projection, &[], &tools)
            }
            .map_err(cannot_fit)?;
            let shape = read;
            return finish(py, &settings, &fitted, count, &shape);
        }
    };
    let shape = messages::Read::from_given(given);
    finish(py, &settings, &fitted, count, &shape)
}

/// The fitted messages written back as `shape` was read, and the report.
fn finish<'py>(
    py: Python<'py>,
    settings: &FitSettings,
    fitted: &FittedRequest,
    count: usize,
    shape: &messages::Read,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let report = FitReport::new(settings, fitted, count)
        .map_err(|problem| from_error(Kind::Input, &problem))?;
    let mut report =
        serde_json::to_value(&report).map_err(|problem| from_error(Kind::Input, &problem))?;
    if let (Some(given), Value::Object(fields)) = (&shape.given, &mut report) {
        // Each output message's index among those given, when it is one of them unchanged.
        let sources = given.sources(&fitted.messages);
        fields.insert(
            "sources".into(),
            serde_json::to_value(sources).unwrap_or_default(),
        );
    }
    Ok((
        messages::write(py, &fitted.messages, shape)?,
        to_python(py, &report)?,
    ))
}

/// Every place `messages` breaks the provider's rules (`openai`, `anthropic` or `gemini`),
/// in message order: a list of dicts with `index`, `kind`, the kind's fields and `message`
/// (the problem in words). Empty when the provider accepts the list as far as these rules
/// go.
#[pyfunction]
#[pyo3(signature = (messages, rules="openai", *, format="openai"))]
pub fn validate<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    rules: &str,
    format: &str,
) -> PyResult<Bound<'py, PyList>> {
    let read = messages::read(messages, Format::parse(format)?)?;
    let rules = parse_rules(rules)?;
    let problems = PyList::empty(py);
    for violation in rules::validate(&read.messages, rules) {
        problems.append(violation_dict(py, &violation)?)?;
    }
    Ok(problems)
}

/// `messages` mended for the provider's rules, and the changes made: `(messages,
/// changes)`, each change a dict with its `kind` and the indexes it concerns.
#[pyfunction]
#[pyo3(signature = (messages, rules="openai", *, format="openai"))]
pub fn repair<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    rules: &str,
    format: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let mut read = messages::read(messages, Format::parse(format)?)?;
    let rules = parse_rules(rules)?;
    let (repaired, changes) = rules::repair(std::mem::take(&mut read.messages), rules);
    let changes =
        serde_json::to_value(&changes).map_err(|problem| from_error(Kind::Input, &problem))?;
    Ok((
        messages::write(py, &repaired, &read)?,
        to_python(py, &changes)?,
    ))
}

/// A violation as a flat dict: `index`, `kind` and the kind's fields, and `message`.
fn violation_dict<'py>(
    py: Python<'py>,
    violation: &rules::Violation,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("index", violation.index)?;
    if let Ok(Value::Object(kind)) = serde_json::to_value(&violation.kind) {
        for (key, value) in &kind {
            dict.set_item(key, to_python(py, value)?)?;
        }
    }
    dict.set_item("message", violation.to_string())?;
    Ok(dict)
}

fn parse_rules(name: &str) -> PyResult<Rules> {
    name.parse()
        .map_err(|problem| error(Kind::Input, format!("rules: {problem}")))
}

pub fn parse_strategy(name: &str) -> PyResult<Strategy> {
    name.parse()
        .map_err(|problem| error(Kind::Input, format!("strategy: {problem}")))
}

fn roles(argument: &str, names: &[String]) -> PyResult<Vec<Role>> {
    names
        .iter()
        .map(|name| {
            Role::parse(name).ok_or_else(|| {
                error(
                    Kind::Input,
                    format!(
                        "{argument}: unknown role `{name}` (expected system, developer, user, assistant or tool)"
                    ),
                )
            })
        })
        .collect()
}

/// A fit policy dict (the shape of an assistant's `context:`); a problem names its key.
pub fn parse_policy(policy: &Bound<'_, PyAny>) -> PyResult<FitPolicy> {
    let policy: FitPolicy = deserialize("policy", policy)?;
    if let Some((field, problem)) = policy.problems().into_iter().next() {
        return Err(error(Kind::Input, format!("policy.{field}: {problem}")));
    }
    Ok(policy)
}

/// The argument `name` read as a `T`; a problem names its key (`policy.context.reserve`).
pub fn deserialize<T: serde::de::DeserializeOwned>(
    name: &str,
    value: &Bound<'_, PyAny>,
) -> PyResult<T> {
    let value = to_json(value, name)?;
    serde_path_to_error::deserialize(value).map_err(|problem| {
        let path = problem.path().to_string();
        let place = if path == "." {
            name.to_owned()
        } else {
            format!("{name}.{path}")
        };
        error(Kind::Input, format!("{place}: {}", problem.inner()))
    })
}
