//! Paths into the context: `user.profile.name`, `files/0/name`, `files[0].name`,
//! `data['odd key']`.
//!
//! A path is a root key followed by segments. A segment follows `.` or `/` (a name, or digits
//! meaning a list index) or sits in brackets (`[0]`, `[-1]` counting from the end, `['key']` or
//! `["key"]`). Names are ASCII identifiers (`[A-Za-z_][A-Za-z0-9_]*`).

use std::fmt;

use serde_json::{Map, Value};

/// One step of a [`Path`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// An object key (also accepted on an object whose key looks like a number).
    Key(String),
    /// A list index; negative counts from the end. On an object it is looked up as a key.
    Index(i64),
}

/// A parsed path: a root key and the segments below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// The context's root key.
    pub root: String,
    /// The steps below the root.
    pub segments: Vec<Segment>,
    /// True when the text used `/` separators (which Jinja itself would read as division).
    pub uses_slash: bool,
}

/// Why a text is not a path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid path {text:?}: {reason}")]
pub struct PathError {
    /// The text given.
    pub text: String,
    /// What was wrong.
    pub reason: &'static str,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl Path {
    /// Parses a path; surrounding whitespace is allowed.
    pub fn parse(text: &str) -> Result<Path, PathError> {
        let fail = |reason| PathError {
            text: text.to_owned(),
            reason,
        };
        let s = text.trim().as_bytes();
        let mut pos = 0;
        let ident = |pos: &mut usize| -> Option<String> {
            let start = *pos;
            if !s.get(start).copied().is_some_and(is_ident_start) {
                return None;
            }
            while s.get(*pos).copied().is_some_and(is_ident_char) {
                *pos += 1;
            }
            Some(String::from_utf8_lossy(&s[start..*pos]).into_owned())
        };
        let root = ident(&mut pos).ok_or_else(|| fail("it must start with a name"))?;
        let mut segments = Vec::new();
        let mut uses_slash = false;
        while pos < s.len() {
            match s[pos] {
                sep @ (b'.' | b'/') => {
                    uses_slash |= sep == b'/';
                    pos += 1;
                    if s.get(pos).is_some_and(u8::is_ascii_digit) {
                        let start = pos;
                        while s.get(pos).is_some_and(u8::is_ascii_digit) {
                            pos += 1;
                        }
                        let digits = std::str::from_utf8(&s[start..pos]).unwrap_or("0");
                        if s.get(pos).copied().is_some_and(is_ident_char) {
                            return Err(fail("a segment starting with a digit must be all digits"));
                        }
                        let index = digits.parse().map_err(|_| fail("index too large"))?;
                        segments.push(Segment::Index(index));
                    } else {
                        let name = ident(&mut pos)
                            .ok_or_else(|| fail("expected a name after a separator"))?;
                        segments.push(Segment::Key(name));
                    }
                }
                b'[' => {
                    pos += 1;
                    match s.get(pos) {
                        Some(&quote @ (b'\'' | b'"')) => {
                            pos += 1;
                            let start = pos;
                            while s.get(pos).is_some_and(|&b| b != quote && b != b'\\') {
                                pos += 1;
                            }
                            if s.get(pos) != Some(&quote) {
                                return Err(fail("unterminated quoted key"));
                            }
                            let key = String::from_utf8_lossy(&s[start..pos]).into_owned();
                            pos += 1;
                            segments.push(Segment::Key(key));
                        }
                        _ => {
                            let start = pos;
                            if s.get(pos) == Some(&b'-') {
                                pos += 1;
                            }
                            while s.get(pos).is_some_and(u8::is_ascii_digit) {
                                pos += 1;
                            }
                            let digits = std::str::from_utf8(&s[start..pos]).unwrap_or("");
                            let index = digits.parse().map_err(|_| {
                                fail("expected an index or a quoted key in brackets")
                            })?;
                            segments.push(Segment::Index(index));
                        }
                    }
                    if s.get(pos) != Some(&b']') {
                        return Err(fail("expected ']'"));
                    }
                    pos += 1;
                }
                _ => return Err(fail("unexpected character")),
            }
        }
        Ok(Path {
            root,
            segments,
            uses_slash,
        })
    }

    /// Follows the path in a map of root keys.
    pub fn lookup_in<'v>(&self, root: &'v Map<String, Value>) -> Option<&'v Value> {
        self.lookup_below(root.get(&self.root)?)
    }

    /// Follows the segments (not the root) starting at `value`.
    pub fn lookup_below<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        let mut current = value;
        for segment in &self.segments {
            current = match (segment, current) {
                (Segment::Key(key), Value::Object(map)) => map.get(key)?,
                (Segment::Index(index), Value::Object(map)) => map.get(&index.to_string())?,
                (Segment::Index(index), Value::Array(items)) => {
                    let len = items.len() as i64;
                    let at = if *index < 0 { len + index } else { *index };
                    if at < 0 {
                        return None;
                    }
                    items.get(usize::try_from(at).ok()?)?
                }
                _ => return None,
            };
        }
        Some(current)
    }

    /// The path as a Jinja expression that means the same lookup (`files["0"]` style is never
    /// produced: indices stay numbers): `files[0]["name"]`.
    pub fn to_jinja(&self) -> String {
        let mut out = self.root.clone();
        for segment in &self.segments {
            match segment {
                Segment::Key(key) => {
                    out.push('[');
                    out.push_str(&serde_json::to_string(key).unwrap_or_default());
                    out.push(']');
                }
                Segment::Index(index) => {
                    out.push_str(&format!("[{index}]"));
                }
            }
        }
        out
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.root)?;
        for segment in &self.segments {
            match segment {
                Segment::Key(key) if key.bytes().all(is_ident_char) && !key.is_empty() => {
                    write!(f, ".{key}")?
                }
                Segment::Key(key) => write!(f, "[{key:?}]")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn all_three_spellings_reach_the_same_value() {
        let ctx = json!({"files": [{"name": "a.txt"}, {"name": "b.txt"}], "user": {"profile": {"name": "Alice"}}});
        let map = ctx.as_object().unwrap();
        for text in [
            "files/1/name",
            "files[1].name",
            "files.1.name",
            "files[-1]['name']",
        ] {
            let path = Path::parse(text).unwrap();
            assert_eq!(path.lookup_in(map), Some(&json!("b.txt")), "{text}");
        }
        let path = Path::parse("user.profile.name").unwrap();
        assert_eq!(path.lookup_in(map), Some(&json!("Alice")));
        assert_eq!(Path::parse("user.missing").unwrap().lookup_in(map), None);
        assert_eq!(Path::parse("files/2/name").unwrap().lookup_in(map), None);
        assert_eq!(
            Path::parse("files/1/name").unwrap().to_jinja(),
            "files[1][\"name\"]"
        );
    }

    #[test]
    fn rejects_what_is_not_a_path() {
        for text in ["", "1a", "a.", "a[", "a b", "a + b", "a.1b", "a['x]"] {
            assert!(Path::parse(text).is_err(), "{text:?}");
        }
    }
}
