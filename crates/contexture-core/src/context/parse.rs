//! Parsing a step's output, and what the parsed output contributes to the
//! store.
//!
//! The parser tries, in order: the whole (trimmed) text as JSON; as a Python literal
//! ([`super::pylit`]); the first ```` ```json ```` fence, then the first `~~~json` fence (their
//! content as JSON, else as a Python literal); the first balanced JSON object or array inside
//! prose (strings and escapes respected, nested objects found whole); else the text itself as
//! a plain string. Parsing never fails: what each stage found wrong is kept in
//! [`ParsedOutput::notes`], so an unterminated fence or a 10,000-deep nesting is reported
//! clearly while the step still gets a value.
//!
//! Every stage is linear in the input (the prose search has a work budget proportional to the
//! input), so a 10 MB output parses in well under a second.

use serde::Serialize;
use serde_json::{Map, Value};

use super::pylit;

/// Which stage of the parser produced the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// The whole output was JSON.
    Json,
    /// The whole output was a Python literal.
    PythonLiteral,
    /// The content of a ```` ```json ```` fence.
    BacktickFence,
    /// The content of a `~~~json` fence.
    TildeFence,
    /// The first balanced JSON object or array inside prose.
    EmbeddedJson,
    /// Nothing structured was found; the value is the text.
    PlainText,
}

/// A parsed step output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParsedOutput {
    /// The parsed value, or the text as a JSON string for plain text.
    pub value: Value,
    /// Which stage found it.
    pub format: OutputFormat,
    /// The output text exactly as given (what `output_key` stores for scalars and strings).
    #[serde(skip)]
    pub raw: String,
    /// Why earlier stages did not apply, when that is worth telling (invalid fence content, an
    /// unterminated fence, too deep nesting, a prose search that gave up).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Why an output given as bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "output is not valid UTF-8: invalid byte at offset {offset} (line {line}, column {column})"
)]
pub struct InvalidUtf8 {
    /// Byte offset of the first invalid byte.
    pub offset: usize,
    /// 1-based line of that byte.
    pub line: usize,
    /// 1-based column (in bytes) of that byte.
    pub column: usize,
}

/// Parses an output given as bytes; invalid UTF-8 is an error naming the first bad byte.
pub fn parse_output_bytes(bytes: &[u8]) -> Result<ParsedOutput, InvalidUtf8> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(parse_output(text)),
        Err(error) => {
            let offset = error.valid_up_to();
            let valid = &bytes[..offset];
            let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = offset - valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
            Err(InvalidUtf8 {
                offset,
                line,
                column,
            })
        }
    }
}

/// Parses a step output (see the module documentation for the order of attempts).
pub fn parse_output(text: &str) -> ParsedOutput {
    let mut notes = Vec::new();
    let done = |value, format, notes| ParsedOutput {
        value,
        format,
        raw: text.to_owned(),
        notes,
    };
    let trimmed = text.trim();
    let json_error = match serde_json::from_str::<Value>(trimmed) {
        Ok(value) => return done(value, OutputFormat::Json, notes),
        Err(error) => error,
    };
    let looks_structured = trimmed.starts_with(['{', '[', '(', '\'', '"']);
    match pylit::parse(trimmed) {
        Ok(value) => return done(value, OutputFormat::PythonLiteral, notes),
        Err(py_error) => {
            if looks_structured {
                notes.push(format!("not JSON: {json_error}"));
                notes.push(format!("not a Python literal: {py_error}"));
            }
        }
    }
    for (fence, format) in [
        ("```", OutputFormat::BacktickFence),
        ("~~~", OutputFormat::TildeFence),
    ] {
        match find_fence(text, fence) {
            Fence::None => {}
            Fence::Unterminated { line } => notes.push(format!(
                "{fence}json fence opened at line {line} is never closed"
            )),
            Fence::Found { content, line } => {
                let content = content.trim();
                match serde_json::from_str::<Value>(content) {
                    Ok(value) => return done(value, format, notes),
                    Err(json_error) => match pylit::parse(content) {
                        Ok(value) => return done(value, format, notes),
                        Err(_) => notes.push(format!(
                            "{fence}json fence at line {line} does not hold valid JSON: {json_error}"
                        )),
                    },
                }
            }
        }
    }
    if let Some(value) = find_embedded_json(text, &mut notes) {
        return done(value, OutputFormat::EmbeddedJson, notes);
    }
    done(
        Value::String(text.to_owned()),
        OutputFormat::PlainText,
        notes,
    )
}

impl ParsedOutput {
    /// The (key, value) pairs this output contributes to the store when no `output_key` is set,
    /// in order: an object's root keys; each object of a list, in order (a later object's key
    /// follows an earlier one's, so the last wins when they are merged); nothing for a scalar, a
    /// string or a list without objects.
    pub fn contributions(&self) -> Vec<(String, Value)> {
        match &self.value {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Value::Array(items) => items
                .iter()
                .filter_map(Value::as_object)
                .flat_map(|map| map.iter().map(|(k, v)| (k.clone(), v.clone())))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The contributions merged into one map (last wins), as `contexture output parse` shows
    /// them.
    pub fn stored(&self) -> Map<String, Value> {
        let mut map = Map::new();
        for (key, value) in self.contributions() {
            map.insert(key, value);
        }
        map
    }

    /// True when the value is an object or a list (what `output_key` stores as parsed data
    /// rather than as raw text).
    pub fn is_structured(&self) -> bool {
        matches!(self.value, Value::Object(_) | Value::Array(_))
    }
}

enum Fence<'a> {
    None,
    Unterminated { line: usize },
    Found { content: &'a str, line: usize },
}

/// Finds the first `<marker>json` fence: the opening marker followed by `json` (any case) and
/// the end of its line; the content runs to the next marker that starts a line (after optional
/// indentation). Linear: every byte is looked at a bounded number of times.
fn find_fence<'a>(text: &'a str, marker: &str) -> Fence<'a> {
    let bytes = text.as_bytes();
    let skip_blanks = |mut i: usize| {
        while matches!(bytes.get(i), Some(b' ' | b'\t' | b'\r')) {
            i += 1;
        }
        i
    };
    let mut search = 0;
    while let Some(found) = text[search..].find(marker) {
        let open = search + found;
        let after = open + marker.len();
        search = after;
        let tag = skip_blanks(after);
        if !bytes
            .get(tag..tag + 4)
            .is_some_and(|t| t.eq_ignore_ascii_case(b"json"))
        {
            continue;
        }
        let tag_end = skip_blanks(tag + 4);
        if !matches!(bytes.get(tag_end), None | Some(b'\n')) {
            continue;
        }
        let line = text[..open].matches('\n').count() + 1;
        let body_start = (tag_end + 1).min(text.len());
        let mut scan = body_start;
        while let Some(found) = text[scan..].find(marker) {
            let close = scan + found;
            let mut back = close;
            while back > body_start && matches!(bytes[back - 1], b' ' | b'\t') {
                back -= 1;
            }
            if back == body_start || bytes[back - 1] == b'\n' {
                return Fence::Found {
                    content: &text[body_start..close],
                    line,
                };
            }
            scan = close + marker.len();
        }
        return Fence::Unterminated { line };
    }
    Fence::None
}

/// Finds the first balanced `{...}` or `[...]` in the text that parses as JSON.
///
/// One pass pairs every bracket with its match (brackets inside JSON strings are skipped once
/// a bracket is open); candidates are then tried in order of their start, so an outer object is
/// found whole before anything nested in it. The total length handed to the JSON parser is
/// capped at a multiple of the input length, which keeps hostile inputs linear.
fn find_embedded_json(text: &str, notes: &mut Vec<String>) -> Option<Value> {
    let bytes = text.as_bytes();
    let mut stack: Vec<(u8, usize)> = Vec::new();
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' if !stack.is_empty() => in_string = true,
                b'{' | b'[' => stack.push((b, i)),
                b'}' | b']' => {
                    let want = if b == b'}' { b'{' } else { b'[' };
                    match stack.last() {
                        Some(&(open, start)) if open == want => {
                            stack.pop();
                            pairs.push((start, i + 1));
                        }
                        // A stray closing bracket: everything open so far cannot be balanced.
                        _ => stack.clear(),
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    pairs.sort_unstable();
    let budget = bytes.len().saturating_mul(16).saturating_add(1 << 16);
    let mut spent = 0usize;
    // Spans inside one that is too deeply nested are parts of that structure, not JSON of
    // their own: they are skipped.
    let mut too_deep_until = 0usize;
    for (start, end) in pairs {
        if end <= too_deep_until {
            continue;
        }
        spent = spent.saturating_add(end - start);
        if spent > budget {
            notes.push(
                "gave up searching the prose for JSON: too many bracketed spans that are not JSON"
                    .to_owned(),
            );
            return None;
        }
        // Cheap rejection first: a JSON object's first token is a string or its end.
        if bytes[start] == b'{' {
            let first = bytes[start + 1..end]
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .copied();
            if !matches!(first, Some(b'"' | b'}')) {
                continue;
            }
        }
        match serde_json::from_str::<Value>(&text[start..end]) {
            Ok(value) => return Some(value),
            Err(error) if error.to_string().starts_with("recursion limit exceeded") => {
                too_deep_until = end;
            }
            Err(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prose_finds_the_outer_object_whole() {
        let parsed = parse_output("Result: {\"a\": {\"b\": 1}, \"s\": \"}{\"} done");
        assert_eq!(parsed.format, OutputFormat::EmbeddedJson);
        assert_eq!(parsed.value, json!({"a": {"b": 1}, "s": "}{"}));
    }

    #[test]
    fn an_inner_object_is_found_when_the_outer_span_is_not_json() {
        let parsed = parse_output("see {the result: {\"a\": 1}} ok");
        assert_eq!(parsed.value, json!({"a": 1}));
    }

    #[test]
    fn many_open_braces_stay_fast() {
        let text = "{ x ".repeat(2_500_000);
        let start = std::time::Instant::now();
        let parsed = parse_output(&text);
        assert_eq!(parsed.format, OutputFormat::PlainText);
        assert!(start.elapsed().as_secs() < 5);
    }
}
