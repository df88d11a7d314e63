//! A run's user context: an object the caller gives a run (who asked, their plan, their
//! locale) that every template of the run and of its sub-workflows reads, read-only, as
//! `user_context.*`. It is checked here once, whoever received it (the command line's
//! `--user-context`, the executions API's `user_context`).

use contexture_core::format::json_type;
use serde_json::{Map, Value};

/// The largest user context accepted, in bytes of compact JSON: it is recorded with the run
/// and with each sub-workflow's run, and read by every render.
pub const MAX_USER_CONTEXT_BYTES: usize = 64 * 1024;

/// Why a user context was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UserContextError {
    /// The text is not JSON.
    #[error("the user context is not valid JSON: {message} at line {line}, column {column}")]
    Json {
        /// What the parser found.
        message: String,
        /// The 1-based line.
        line: usize,
        /// The 1-based column.
        column: usize,
    },
    /// The value is JSON but not an object.
    #[error(
        "the user context must be a JSON object (its keys are read as user_context.KEY), not {found}"
    )]
    NotAnObject {
        /// What it was (`an array`, `a string`...).
        found: &'static str,
    },
    /// The value is larger than [`MAX_USER_CONTEXT_BYTES`].
    #[error("the user context is {bytes} bytes of JSON; at most {max} are accepted")]
    TooLarge {
        /// Its size as compact JSON.
        bytes: usize,
        /// The limit.
        max: usize,
    },
}

/// The user context written as JSON text.
pub fn parse_user_context(text: &str) -> Result<Map<String, Value>, UserContextError> {
    let value: Value = serde_json::from_str(text).map_err(|error| UserContextError::Json {
        message: error
            .to_string()
            .split(" at line ")
            .next()
            .unwrap_or("")
            .to_owned(),
        line: error.line(),
        column: error.column(),
    })?;
    user_context_from_value(value)
}

/// The user context given as a JSON value (an API body's field).
pub fn user_context_from_value(value: Value) -> Result<Map<String, Value>, UserContextError> {
    let map = match value {
        Value::Object(map) => map,
        other => {
            return Err(UserContextError::NotAnObject {
                found: json_type(&other),
            });
        }
    };
    let bytes = serde_json::to_vec(&map).map_or(usize::MAX, |json| json.len());
    if bytes > MAX_USER_CONTEXT_BYTES {
        return Err(UserContextError::TooLarge {
            bytes,
            max: MAX_USER_CONTEXT_BYTES,
        });
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_accepted_and_everything_else_is_named() {
        let cases: [(&str, Result<(), &str>); 8] = [
            (r#"{"plan": "pro", "user": {"name": "Ada"}}"#, Ok(())),
            ("{}", Ok(())),
            (
                "[1, 2]",
                Err("must be a JSON object (its keys are read as user_context.KEY), not an array"),
            ),
            (r#""pro""#, Err("not a string")),
            ("null", Err("not null")),
            ("42", Err("not a number")),
            (
                "{\"plan\": }",
                Err("not valid JSON: expected value at line 1, column 10"),
            ),
            ("{\n  \"plan\": \"pro\",\n}", Err("at line 3, column 1")),
        ];
        for (text, expected) in cases {
            match (parse_user_context(text), expected) {
                (Ok(_), Ok(())) => {}
                (Err(error), Err(part)) => {
                    assert!(error.to_string().contains(part), "{text}: {error}")
                }
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_context_past_the_limit_is_refused_with_its_size() {
        let big = format!(r#"{{"notes": "{}"}}"#, "x".repeat(MAX_USER_CONTEXT_BYTES));
        let error = parse_user_context(&big).unwrap_err();
        assert_eq!(
            error,
            UserContextError::TooLarge {
                bytes: MAX_USER_CONTEXT_BYTES + 12,
                max: MAX_USER_CONTEXT_BYTES
            }
        );
    }
}
