//! A JSON body's shape, checked before it is parsed: how deep it nests and whether an object
//! repeats a key. Both are refused: a deeply nested value could be stored and then fail every
//! read (parsers bound their recursion), and a repeated key would silently drop one of its
//! values (the last one wins in most parsers, the first in others).
//!
//! The scan only looks at structure; a text that is not JSON passes it and is then reported
//! by the parser, with its position.

use std::borrow::Cow;
use std::collections::HashSet;

/// What is wrong with a body's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeProblem {
    /// A value nests deeper than allowed.
    TooDeep {
        /// The field that nests too deep: the path of the container that went too deep,
        /// without its trailing array indices.
        path: String,
        /// The limit.
        max: usize,
    },
    /// An object holds one key twice.
    DuplicateKey {
        /// The path of the repeated key.
        path: String,
    },
}

impl std::fmt::Display for ShapeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeProblem::TooDeep { path, max } => write!(
                f,
                "{path}: the JSON nests deeper than {max} levels of objects and arrays"
            ),
            ShapeProblem::DuplicateKey { path } => {
                write!(f, "{path}: the key appears twice in one object")
            }
        }
    }
}

impl ShapeProblem {
    /// The path the problem is at.
    pub fn path(&self) -> &str {
        match self {
            ShapeProblem::TooDeep { path, .. } | ShapeProblem::DuplicateKey { path } => path,
        }
    }
}

/// An object's keys are compared as they are written, unless a key holds an escape (then as
/// it reads): a handful of keys is searched in order, more in a set, so a huge object costs
/// linear time.
const FEW_KEYS: usize = 16;

enum Frame<'a> {
    Object {
        keys: Vec<Cow<'a, [u8]>>,
        set: Option<HashSet<Cow<'a, [u8]>>>,
        key: Option<Cow<'a, [u8]>>,
        expect_key: bool,
    },
    Array {
        index: usize,
    },
}

fn path_of(stack: &[Frame<'_>]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Object { key: Some(key), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&String::from_utf8_lossy(key));
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    if path.is_empty() {
        "body".to_owned()
    } else {
        path
    }
}

/// A key as it reads: the raw bytes between the quotes, or the decoded text when they hold an
/// escape; `None` when the key is not a valid JSON string (the parser will say so).
fn key_of(raw: &[u8]) -> Option<Cow<'_, [u8]>> {
    let inner = &raw[1..raw.len() - 1];
    if !inner.contains(&b'\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_slice::<String>(raw)
        .ok()
        .map(|text| Cow::Owned(text.into_bytes()))
}

/// Checks that `text` nests at most `max_depth` objects and arrays deep and that no object
/// repeats a key.
pub fn check(text: &[u8], max_depth: usize) -> Result<(), ShapeProblem> {
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut at = 0;
    while at < text.len() {
        match text[at] {
            b'"' => {
                let start = at;
                at += 1;
                while at < text.len() && text[at] != b'"' {
                    at += if text[at] == b'\\' { 2 } else { 1 };
                }
                let Some(raw) = text.get(start..=at) else {
                    // An unterminated string: the parser says where.
                    return Ok(());
                };
                if let Some(Frame::Object {
                    keys,
                    set,
                    key,
                    expect_key,
                }) = stack.last_mut()
                    && *expect_key
                {
                    let Some(name) = key_of(raw) else {
                        return Ok(());
                    };
                    *expect_key = false;
                    let repeated = match set {
                        Some(set) => !set.insert(name.clone()),
                        None if keys.contains(&name) => true,
                        None => {
                            keys.push(name.clone());
                            if keys.len() > FEW_KEYS {
                                *set = Some(keys.drain(..).collect());
                            }
                            false
                        }
                    };
                    *key = Some(name);
                    if repeated {
                        return Err(ShapeProblem::DuplicateKey {
                            path: path_of(&stack),
                        });
                    }
                }
            }
            open @ (b'{' | b'[') => {
                if stack.len() >= max_depth {
                    let path = path_of(&stack);
                    let field =
                        path.trim_end_matches(|c: char| c == ']' || c == '[' || c.is_ascii_digit());
                    return Err(ShapeProblem::TooDeep {
                        path: if field.is_empty() {
                            "body".to_owned()
                        } else {
                            field.to_owned()
                        },
                        max: max_depth,
                    });
                }
                stack.push(if open == b'{' {
                    Frame::Object {
                        keys: Vec::new(),
                        set: None,
                        key: None,
                        expect_key: true,
                    }
                } else {
                    Frame::Array { index: 0 }
                });
            }
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        at += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_and_duplicates_are_found_with_their_path() {
        let table: &[(&str, Result<(), ShapeProblem>)] = &[
            (r#"{"a": [1, {"b": 2}], "c": "}\"{"}"#, Ok(())),
            (
                r#"{"messages": [{"role": "user", "role": "system"}]}"#,
                Err(ShapeProblem::DuplicateKey {
                    path: "messages[0].role".into(),
                }),
            ),
            (
                r#"{"a": 1, "\u0061": 2}"#,
                Err(ShapeProblem::DuplicateKey { path: "a".into() }),
            ),
            (r#"[{"a": 1}, {"a": 1}]"#, Ok(())),
            (
                r#"{"a": [[[1]]]}"#,
                Err(ShapeProblem::TooDeep {
                    path: "a".into(),
                    max: 3,
                }),
            ),
            (r#"{"a": [["[[[[", "{{{{"]]}"#, Ok(())),
            // Not JSON: left to the parser.
            (r#"{"a": "unterminated"#, Ok(())),
            ("", Ok(())),
        ];
        for (text, expected) in table {
            assert_eq!(&check(text.as_bytes(), 3), expected, "{text}");
        }
    }

    #[test]
    fn a_large_object_is_checked_in_linear_time() {
        let keys: Vec<String> = (0..50_000).map(|i| format!("\"k{i}\": {i}")).collect();
        let text = format!("{{{}}}", keys.join(", "));
        assert_eq!(check(text.as_bytes(), 64), Ok(()));
        let text = format!("{{{}, \"k49999\": 0}}", keys.join(", "));
        assert_eq!(
            check(text.as_bytes(), 64),
            Err(ShapeProblem::DuplicateKey {
                path: "k49999".into()
            })
        );
    }

    #[test]
    fn a_hundred_thousand_levels_are_refused_without_recursion() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(
            check(deep.as_bytes(), 64),
            Err(ShapeProblem::TooDeep {
                path: "body".into(),
                max: 64
            })
        );
    }
}
