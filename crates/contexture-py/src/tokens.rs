//! Token counts: of a text, and of a chat request part by part.

use std::sync::OnceLock;

use contexture_core::budget::{BudgetPolicy, RequestReport};
use contexture_core::registry::{ModelInfo, Registry};
use contexture_core::{Encoding, TokenCounter};
use pyo3::prelude::*;
use serde_json::Value;

use crate::errors::{Kind, error, from_error};
use crate::json::{to_json, to_python};
use crate::messages::{self, Format};

/// Texts longer than this are counted with the interpreter released: other Python threads
/// run meanwhile. Shorter ones would pay more for the release than they take to count.
const DETACH_ABOVE_BYTES: usize = 16 * 1024;

/// The built-in model registry (the CLI's without a models file).
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::builtin)
}

/// The model `name` as the registry knows it.
pub fn model(name: &str) -> PyResult<ModelInfo> {
    registry()
        .get(name)
        .map_err(|problem| from_error(Kind::Input, &problem))
}

/// The tool schemas of a `tools=` argument (a list of OpenAI-format tool dicts).
pub fn tools(tools: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Value>> {
    match tools {
        None => Ok(Vec::new()),
        Some(tools) if tools.is_none() => Ok(Vec::new()),
        Some(tools) => match to_json(tools, "tools")? {
            Value::Array(items) => Ok(items),
            _ => Err(error(Kind::Input, "tools: expected a list of tool schemas")),
        },
    }
}

/// Counts the tokens of `text` exactly: in `encoding` (`cl100k_base` or `o200k_base`), or
/// as `model` counts (its encoding, or its documented estimate); `o200k_base` when neither
/// is given.
#[pyfunction]
#[pyo3(signature = (text, encoding=None, model=None))]
pub fn count_tokens(
    py: Python<'_>,
    text: String,
    encoding: Option<String>,
    model: Option<String>,
) -> PyResult<u64> {
    let counter = match (encoding, model) {
        (Some(_), Some(_)) => {
            return Err(error(
                Kind::Input,
                "give either encoding or model, not both",
            ));
        }
        (Some(name), None) => TokenCounter::exact(
            Encoding::from_name(&name).map_err(|problem| from_error(Kind::Input, &problem))?,
        ),
        (None, Some(name)) => self::model(&name)?.counter,
        (None, None) => TokenCounter::exact(Encoding::O200kBase),
    };
    if text.len() > DETACH_ABOVE_BYTES {
        Ok(u64::from(py.detach(|| counter.count_text(&text))))
    } else {
        Ok(u64::from(counter.count_text(&text)))
    }
}

/// Counts a chat request as `model` does, part by part: each message, the reply priming,
/// the tool schemas, the total, and the model's budget for it (with `reserve` tokens kept
/// for the reply, default the model's output limit, at most a quarter of the window).
#[pyfunction]
#[pyo3(signature = (messages, model, tools=None, reserve=None, format="openai"))]
pub fn count_messages<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    model: String,
    tools: Option<&Bound<'py, PyAny>>,
    reserve: Option<u32>,
    format: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let read = messages::read(messages, Format::parse(format)?)?;
    let model = self::model(&model)?;
    let tools = self::tools(tools)?;
    let policy = BudgetPolicy {
        reserve_output: reserve,
        ..BudgetPolicy::default()
    };
    let report = RequestReport::count(&model, &policy, &read.messages, &tools)
        .map_err(|problem| from_error(Kind::Input, &problem))?;
    let value =
        serde_json::to_value(&report).map_err(|problem| from_error(Kind::Input, &problem))?;
    to_python(py, &value)
}
