//! Python objects to JSON values and back: what the package's functions take (message
//! dicts, tool schemas, policies, template contexts) is read into `serde_json` values, and
//! what they return is written back as dicts and lists.
//!
//! Any object a caller passes is untrusted: one that is not JSON-shaped is a `TypeError`
//! and a float JSON cannot hold a `ValueError`, each naming where it is
//! (`messages[3].content[0].text`), and nesting deeper than [`MAX_DEPTH`] is refused
//! before it could exhaust the stack.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// The deepest nesting read: `serde_json`'s own limit for parsed text.
pub const MAX_DEPTH: usize = 128;

/// One step of the path to a value.
enum Step {
    Index(usize),
    Key(String),
}

/// Why an object is not JSON, and where (the path is gathered while unwinding, so the
/// happy path builds none).
struct NotJson {
    steps: Vec<Step>,
    problem: Problem,
}

enum Problem {
    /// A type JSON does not have (`bytes`, a class instance, ...).
    Type(String),
    /// A dict key that is not a `str`.
    Key(String),
    /// A float JSON cannot hold (NaN, infinity).
    Float(f64),
    /// An int outside 64 bits.
    Int,
    /// Nesting past [`MAX_DEPTH`].
    Depth,
    /// Python raised while the object was read (a `str` with lone surrogates, say).
    Raised(PyErr),
}

impl NotJson {
    fn new(problem: Problem) -> NotJson {
        NotJson {
            steps: Vec::new(),
            problem,
        }
    }

    fn at(mut self, step: Step) -> NotJson {
        self.steps.push(step);
        self
    }

    /// The Python exception, naming the place under `root` (the argument's name).
    fn into_err(self, root: &str) -> PyErr {
        let mut path = root.to_owned();
        for step in self.steps.iter().rev() {
            match step {
                Step::Index(index) => path.push_str(&format!("[{index}]")),
                Step::Key(key) => {
                    path.push('.');
                    path.push_str(key);
                }
            }
        }
        match self.problem {
            Problem::Type(name) => PyTypeError::new_err(format!(
                "{path}: a `{name}` is not JSON (expected a str, int, float, bool, None, dict or list)"
            )),
            Problem::Key(name) => {
                PyTypeError::new_err(format!("{path}: a dict key must be a str, not a `{name}`"))
            }
            Problem::Float(value) => {
                PyValueError::new_err(format!("{path}: {value} is not a JSON number"))
            }
            Problem::Int => {
                PyValueError::new_err(format!("{path}: the int does not fit in 64 bits"))
            }
            Problem::Depth => {
                PyValueError::new_err(format!("{path}: nested more than {MAX_DEPTH} levels deep"))
            }
            Problem::Raised(error) => {
                let message = format!("{path}: {error}");
                PyValueError::new_err(message)
            }
        }
    }
}

/// `object` as a JSON value; errors name the place under `root`.
pub fn to_json(object: &Bound<'_, PyAny>, root: &str) -> PyResult<Value> {
    convert(object, 0).map_err(|error| error.into_err(root))
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map_or_else(|_| "object".to_owned(), |name| name.to_string())
}

fn convert(object: &Bound<'_, PyAny>, depth: usize) -> Result<Value, NotJson> {
    if let Ok(text) = object.cast::<PyString>() {
        return text
            .to_cow()
            .map(|text| Value::String(text.into_owned()))
            .map_err(|error| NotJson::new(Problem::Raised(error)));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        if depth >= MAX_DEPTH {
            return Err(NotJson::new(Problem::Depth));
        }
        let mut map = Map::with_capacity(dict.len());
        for (key, value) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(NotJson::new(Problem::Key(type_name(&key))));
            };
            let key = key
                .to_cow()
                .map_err(|error| NotJson::new(Problem::Raised(error)))?;
            let value =
                convert(&value, depth + 1).map_err(|error| error.at(Step::Key(key.to_string())))?;
            map.insert(key.into_owned(), value);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(list) = object.cast::<PyList>() {
        if depth >= MAX_DEPTH {
            return Err(NotJson::new(Problem::Depth));
        }
        let mut items = Vec::with_capacity(list.len());
        for (index, item) in list.iter().enumerate() {
            items.push(convert(&item, depth + 1).map_err(|error| error.at(Step::Index(index)))?);
        }
        return Ok(Value::Array(items));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` is a subclass of `int`: asked first.
    if let Ok(flag) = object.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if object.cast::<PyInt>().is_ok() {
        if let Ok(value) = object.extract::<i64>() {
            return Ok(Value::Number(value.into()));
        }
        if let Ok(value) = object.extract::<u64>() {
            return Ok(Value::Number(value.into()));
        }
        return Err(NotJson::new(Problem::Int));
    }
    if let Ok(float) = object.cast::<PyFloat>() {
        let value = float.value();
        return Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| NotJson::new(Problem::Float(value)));
    }
    if let Ok(tuple) = object.cast::<PyTuple>() {
        if depth >= MAX_DEPTH {
            return Err(NotJson::new(Problem::Depth));
        }
        let mut items = Vec::with_capacity(tuple.len());
        for (index, item) in tuple.iter().enumerate() {
            items.push(convert(&item, depth + 1).map_err(|error| error.at(Step::Index(index)))?);
        }
        return Ok(Value::Array(items));
    }
    Err(NotJson::new(Problem::Type(type_name(object))))
}

/// `value` as Python objects: dicts (in the value's key order), lists, str, int, float,
/// bool and None.
pub fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any(),
        Value::Number(number) => {
            if let Some(value) = number.as_i64() {
                value.into_pyobject(py)?.into_any()
            } else if let Some(value) = number.as_u64() {
                value.into_pyobject(py)?.into_any()
            } else {
                number
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
            }
        }
        Value::String(text) => PyString::new(py, text).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, to_python(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
