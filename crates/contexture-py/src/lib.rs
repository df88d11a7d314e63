//! `contexture._native`: the native half of the `contexture` Python package, a thin door
//! over the libraries. Each function reads its Python arguments (message dicts, policies,
//! names), makes one library call, and writes the result back as Python objects; the
//! package's Python half (`python/contexture`) adds the integrations and the client.

mod errors;
mod fitting;
mod json;
mod messages;
mod templates;
mod threads;
mod tokens;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(tokens::count_tokens, module)?)?;
    module.add_function(wrap_pyfunction!(tokens::count_messages, module)?)?;
    module.add_function(wrap_pyfunction!(fitting::fit, module)?)?;
    module.add_function(wrap_pyfunction!(fitting::validate, module)?)?;
    module.add_function(wrap_pyfunction!(fitting::repair, module)?)?;
    module.add_function(wrap_pyfunction!(messages::convert, module)?)?;
    module.add_class::<templates::Template>()?;
    module.add_class::<threads::Store>()?;
    module.add_class::<threads::Thread>()?;
    module.add_function(wrap_pyfunction!(templates::parse_output, module)?)?;
    module.add_function(wrap_pyfunction!(templates::eval_condition, module)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
