//! The package's exceptions. Their classes are defined in Python (`contexture/_errors.py`,
//! where `InputError` is also a `ValueError`); the native code raises them by name, with
//! the same messages the CLI prints.

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Which of the package's exceptions to raise.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Bad input: a message list, a policy, a model name, a template (`ValueError` too).
    Input,
    /// A message list that cannot be fitted into its budget.
    Fit,
    /// A template that does not parse or does not render.
    Template,
    /// The store failed, or has no such thread.
    Store,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Input => "InputError",
            Kind::Fit => "FitError",
            Kind::Template => "TemplateError",
            Kind::Store => "StoreError",
        }
    }
}

/// An exception of `kind` with `message`.
pub fn error(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, kind) {
        Ok(class) => PyErr::from_type(class, message),
        // The package's Python half is missing (the module loaded on its own): the
        // message still reaches the caller.
        Err(_) => pyo3::exceptions::PyValueError::new_err(message),
    })
}

/// `error` as an exception of `kind`, its message the error's (with its causes).
pub fn from_error(kind: Kind, error: &(dyn std::error::Error + 'static)) -> PyErr {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    self::error(kind, message)
}

fn class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    let module = py.import("contexture._errors")?;
    Ok(module.getattr(kind.class_name())?.cast_into::<PyType>()?)
}
