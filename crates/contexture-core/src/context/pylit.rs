//! A parser for Python literals, the subset `ast.literal_eval` accepts, producing JSON values.
//!
//! LLMs often answer with a Python dict (`{'a': True, 'b': None}`) instead of JSON. This is a
//! hand-written recursive-descent parser for that language: strings with single, double and
//! triple quotes, the `r` and `u` prefixes, every escape CPython knows except `\N{...}`,
//! adjacent strings concatenated; integers (decimal, hex, octal, binary, underscores) and
//! floats with an optional sign; `True`, `False`, `None`; lists, tuples, dicts and sets,
//! nested, with trailing commas, spread over several lines, with `#` comments.
//!
//! Mapping to JSON: tuples and sets become arrays (a set keeps its first-seen order, duplicates
//! dropped); dict keys that are numbers, booleans or `None` become strings as `json.dumps`
//! writes them (`1` -> `"1"`, `True` -> `"true"`, `None` -> `"null"`); an integer beyond the
//! `u64`/`i64` range becomes the nearest float. Bytes, f-strings, complex numbers and any name
//! other than the three constants are errors, as they are for `literal_eval` (or have no JSON
//! form).
//!
//! Nesting is limited to [`MAX_DEPTH`] levels, CPython's own parser limit, so a hostile
//! 10,000-deep input ends in an error rather than a stack overflow.

use serde_json::{Map, Number, Value};

/// Deepest nesting of brackets accepted (CPython's tokenizer stops at 200 too).
pub const MAX_DEPTH: usize = 200;

/// Why a text is not a Python literal, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at line {line}, column {column}")]
pub struct PyLiteralError {
    /// What was wrong.
    pub message: String,
    /// 1-based line of the offending character.
    pub line: usize,
    /// 1-based column (in characters) of the offending character.
    pub column: usize,
}

/// Parses `text` as one Python literal (leading and trailing whitespace allowed). A top-level
/// comma-separated sequence (`1, 2`) is a tuple, as in Python's eval mode.
pub fn parse(text: &str) -> Result<Value, PyLiteralError> {
    let mut parser = Parser {
        src: text,
        pos: 0,
        infinity: infinity_mark(text),
        infinities: Vec::new(),
    };
    let value = parser.literal()?;
    // A float out of range has no JSON form, unless a later duplicate dict key replaced it
    // (Python keeps a key's last value): only one still in the value is an error.
    if let Some(&at) = parser.infinities.first()
        && holds(&value, &parser.infinity)
    {
        return Err(parser.error_at(at, "float out of range (infinity has no JSON form)"));
    }
    Ok(value)
}

/// What stands for a float out of range while `text` is parsed: a string no literal of
/// `text` can hold (it names a hash of `text` itself, after a NUL).
fn infinity_mark(text: &str) -> String {
    use std::hash::Hasher;
    let mut hasher = rustc_hash::FxHasher::default();
    hasher.write(text.as_bytes());
    format!("\u{0}pylit-infinity-{:016x}", hasher.finish())
}

/// True when `value` holds `mark`, as a string or an object key, at any depth.
fn holds(value: &Value, mark: &str) -> bool {
    match value {
        Value::String(text) => text == mark,
        Value::Array(items) => items.iter().any(|item| holds(item, mark)),
        Value::Object(map) => map
            .iter()
            .any(|(key, item)| key == mark || holds(item, mark)),
        _ => false,
    }
}

impl Parser<'_> {
    /// The whole text as one literal (a top-level comma-separated sequence is a tuple).
    fn literal(&mut self) -> Result<Value, PyLiteralError> {
        let parser = self;
        parser.skip_trivia();
        if parser.at_end() {
            return Err(parser.error("empty input"));
        }
        let first = parser.value(0)?;
        parser.skip_trivia();
        if parser.peek() == Some(b',') {
            let mut items = vec![first];
            while parser.eat(b',') {
                parser.skip_trivia();
                if parser.at_end() {
                    break;
                }
                items.push(parser.value(0)?);
                parser.skip_trivia();
            }
            parser.skip_trivia();
            if !parser.at_end() {
                return Err(parser.error("unexpected text after the literal"));
            }
            return Ok(Value::Array(items));
        }
        if !parser.at_end() {
            return Err(parser.error("unexpected text after the literal"));
        }
        Ok(first)
    }
}

/// A dict key before it is turned into a JSON object key.
enum Key {
    Text(String),
    Other(Value),
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// What stands for a float out of range until the whole value is read.
    infinity: String,
    /// Where floats out of range were read.
    infinities: Vec<usize>,
}

impl Parser<'_> {
    fn bytes(&self) -> &[u8] {
        self.src.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<u8> {
        self.bytes().get(self.pos + offset).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn error_at(&self, pos: usize, message: impl Into<String>) -> PyLiteralError {
        let before = &self.src[..pos.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        PyLiteralError {
            message: message.into(),
            line,
            column,
        }
    }

    fn error(&self, message: impl Into<String>) -> PyLiteralError {
        self.error_at(self.pos, message)
    }

    /// Skips whitespace, newlines, `#` comments and backslash line continuations.
    fn skip_trivia(&mut self) {
        while let Some(byte) = self.peek() {
            match byte {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => self.pos += 1,
                b'#' => {
                    while let Some(b) = self.peek() {
                        if b == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                b'\\' if matches!(self.peek_at(1), Some(b'\n')) => self.pos += 2,
                b'\\' if self.peek_at(1) == Some(b'\r') && self.peek_at(2) == Some(b'\n') => {
                    self.pos += 3
                }
                _ => break,
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, PyLiteralError> {
        self.skip_trivia();
        let Some(byte) = self.peek() else {
            return Err(self.error("unexpected end of input, expected a value"));
        };
        match byte {
            b'[' | b'(' | b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
                }
                match byte {
                    b'[' => self.list(depth + 1),
                    b'(' => self.tuple(depth + 1),
                    _ => self.dict_or_set(depth + 1),
                }
            }
            b'\'' | b'"' => self.strings(),
            b'-' | b'+' | b'0'..=b'9' | b'.' => self.number(),
            b if b.is_ascii_alphabetic() || b == b'_' => self.name_or_prefixed_string(),
            _ => Err(self.error(format!(
                "unexpected character {:?}",
                self.src[self.pos..].chars().next().unwrap_or('?')
            ))),
        }
    }

    /// Parses comma-separated values up to `close`, allowing a trailing comma.
    fn sequence(&mut self, close: u8, depth: usize) -> Result<(Vec<Value>, bool), PyLiteralError> {
        let mut items = Vec::new();
        let mut saw_comma = false;
        loop {
            self.skip_trivia();
            if self.eat(close) {
                return Ok((items, saw_comma));
            }
            if self.at_end() {
                return Err(self.error(format!("unclosed bracket, expected '{}'", close as char)));
            }
            if !items.is_empty() {
                if !self.eat(b',') {
                    return Err(self.error(format!("expected ',' or '{}'", close as char)));
                }
                saw_comma = true;
                self.skip_trivia();
                if self.eat(close) {
                    return Ok((items, saw_comma));
                }
            }
            if self.at_end() {
                return Err(self.error(format!("unclosed bracket, expected '{}'", close as char)));
            }
            items.push(self.value(depth)?);
        }
    }

    fn list(&mut self, depth: usize) -> Result<Value, PyLiteralError> {
        self.pos += 1;
        Ok(Value::Array(self.sequence(b']', depth)?.0))
    }

    fn tuple(&mut self, depth: usize) -> Result<Value, PyLiteralError> {
        let open = self.pos;
        self.pos += 1;
        let (mut items, saw_comma) = self.sequence(b')', depth)?;
        if items.len() == 1 && !saw_comma {
            // `(x)` is just a parenthesised x.
            return Ok(items.pop().unwrap_or(Value::Null));
        }
        if items.is_empty() && saw_comma {
            return Err(self.error_at(open, "invalid tuple"));
        }
        Ok(Value::Array(items))
    }

    fn dict_or_set(&mut self, depth: usize) -> Result<Value, PyLiteralError> {
        self.pos += 1;
        self.skip_trivia();
        if self.eat(b'}') {
            return Ok(Value::Object(Map::new()));
        }
        let first_pos = self.pos;
        let first = self.value(depth)?;
        self.skip_trivia();
        if self.peek() != Some(b':') {
            return self.set_rest(first, depth);
        }
        let mut map = Map::new();
        let mut key = self.key(first, first_pos)?;
        loop {
            self.skip_trivia();
            if !self.eat(b':') {
                return Err(self.error("expected ':' after a dict key"));
            }
            let value = self.value(depth)?;
            map.insert(key, value);
            self.skip_trivia();
            if self.eat(b'}') {
                return Ok(Value::Object(map));
            }
            if self.at_end() {
                return Err(self.error("unclosed dict, expected '}'"));
            }
            if !self.eat(b',') {
                return Err(self.error("expected ',' or '}' in a dict"));
            }
            self.skip_trivia();
            if self.eat(b'}') {
                return Ok(Value::Object(map));
            }
            if self.at_end() {
                return Err(self.error("unclosed dict, expected '}'"));
            }
            let key_pos = self.pos;
            let raw = self.value(depth)?;
            key = self.key(raw, key_pos)?;
        }
    }

    fn set_rest(&mut self, first: Value, depth: usize) -> Result<Value, PyLiteralError> {
        let mut items = vec![first];
        loop {
            self.skip_trivia();
            if self.eat(b'}') {
                break;
            }
            if self.at_end() {
                return Err(self.error("unclosed set, expected '}'"));
            }
            if !self.eat(b',') {
                return Err(self.error("expected ',' or '}' in a set"));
            }
            self.skip_trivia();
            if self.eat(b'}') {
                break;
            }
            if self.at_end() {
                return Err(self.error("unclosed set, expected '}'"));
            }
            let item = self.value(depth)?;
            if !items.contains(&item) {
                items.push(item);
            }
        }
        Ok(Value::Array(items))
    }

    /// Turns a parsed dict key into a JSON object key the way `json.dumps` does.
    fn key(&self, raw: Value, pos: usize) -> Result<String, PyLiteralError> {
        let key = match raw {
            Value::String(text) => Key::Text(text),
            other => Key::Other(other),
        };
        match key {
            Key::Text(text) => Ok(text),
            Key::Other(Value::Bool(b)) => Ok(b.to_string()),
            Key::Other(Value::Null) => Ok("null".to_owned()),
            Key::Other(Value::Number(n)) => Ok(n.to_string()),
            Key::Other(_) => Err(self.error_at(
                pos,
                "a dict key must be a string, number, True, False or None to map to JSON",
            )),
        }
    }

    fn name_or_prefixed_string(&mut self) -> Result<Value, PyLiteralError> {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if b.is_ascii_alphanumeric() || b == b'_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        let word = &self.src[start..self.pos];
        if matches!(self.peek(), Some(b'\'' | b'"')) && word.len() <= 2 {
            let lower = word.to_ascii_lowercase();
            if lower.contains('b') {
                return Err(self.error_at(start, "bytes literals have no JSON form"));
            }
            if lower.contains('f') {
                return Err(self.error_at(start, "f-strings are not literals"));
            }
            if matches!(lower.as_str(), "r" | "u") {
                self.pos = start;
                return self.strings();
            }
        }
        match word {
            "True" => Ok(Value::Bool(true)),
            "False" => Ok(Value::Bool(false)),
            "None" => Ok(Value::Null),
            "set" if self.src[self.pos..].starts_with("()") => {
                self.pos += 2;
                Ok(Value::Array(Vec::new()))
            }
            _ => Err(self.error_at(
                start,
                format!("name {word:?} is not a literal (only True, False and None are)"),
            )),
        }
    }

    /// One or more adjacent string literals, concatenated.
    fn strings(&mut self) -> Result<Value, PyLiteralError> {
        let mut out = String::new();
        loop {
            self.string(&mut out)?;
            let save = self.pos;
            self.skip_trivia();
            let next_is_string = match self.peek() {
                Some(b'\'' | b'"') => true,
                Some(b'r' | b'R' | b'u' | b'U') => matches!(self.peek_at(1), Some(b'\'' | b'"')),
                _ => false,
            };
            if !next_is_string {
                self.pos = save;
                return Ok(Value::String(out));
            }
        }
    }

    fn string(&mut self, out: &mut String) -> Result<(), PyLiteralError> {
        let start = self.pos;
        let mut raw = false;
        while let Some(b) = self.peek() {
            match b {
                b'r' | b'R' => raw = true,
                b'u' | b'U' => {}
                b'b' | b'B' => return Err(self.error("bytes literals have no JSON form")),
                b'f' | b'F' => return Err(self.error("f-strings are not literals")),
                _ => break,
            }
            self.pos += 1;
        }
        let quote = self.peek().ok_or_else(|| self.error("expected a quote"))?;
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.pos += if triple { 3 } else { 1 };
        loop {
            let Some(b) = self.peek() else {
                return Err(self.error_at(start, "unterminated string literal"));
            };
            if b == quote {
                if !triple {
                    self.pos += 1;
                    return Ok(());
                }
                if self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote) {
                    self.pos += 3;
                    return Ok(());
                }
                out.push(quote as char);
                self.pos += 1;
                continue;
            }
            if b == b'\n' && !triple {
                return Err(self.error_at(start, "unterminated string literal (line break)"));
            }
            if b == b'\\' {
                if raw {
                    // In a raw string a backslash escapes nothing but keeps the next character
                    // from ending the string.
                    out.push('\\');
                    self.pos += 1;
                    if let Some(c) = self.src[self.pos..].chars().next() {
                        out.push(c);
                        self.pos += c.len_utf8();
                    }
                    continue;
                }
                self.escape(out)?;
                continue;
            }
            let rest = &self.src[self.pos..];
            // Copy a run of ordinary characters at once.
            let run = rest.find([quote as char, '\\', '\n']).unwrap_or(rest.len());
            let run = run.max(1).min(rest.len());
            let run = if rest.is_char_boundary(run) {
                run
            } else {
                rest.chars().next().map_or(1, char::len_utf8)
            };
            out.push_str(&rest[..run]);
            self.pos += run;
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), PyLiteralError> {
        let at = self.pos;
        self.pos += 1;
        let Some(c) = self.src[self.pos..].chars().next() else {
            return Err(self.error_at(at, "unterminated string literal"));
        };
        self.pos += c.len_utf8();
        let simple = match c {
            '\n' => Some(None),
            '\r' => {
                self.eat(b'\n');
                Some(None)
            }
            '\\' => Some(Some('\\')),
            '\'' => Some(Some('\'')),
            '"' => Some(Some('"')),
            'a' => Some(Some('\x07')),
            'b' => Some(Some('\x08')),
            'f' => Some(Some('\x0c')),
            'n' => Some(Some('\n')),
            'r' => Some(Some('\r')),
            't' => Some(Some('\t')),
            'v' => Some(Some('\x0b')),
            _ => None,
        };
        if let Some(ch) = simple {
            out.extend(ch);
            return Ok(());
        }
        let code = match c {
            '0'..='7' => {
                let mut value = c as u32 - '0' as u32;
                for _ in 0..2 {
                    match self.peek() {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            self.pos += 1;
                        }
                        _ => break,
                    }
                }
                value
            }
            'x' => self.hex_digits(2, at)?,
            'u' => self.hex_digits(4, at)?,
            'U' => self.hex_digits(8, at)?,
            'N' => return Err(self.error_at(at, "\\N{...} escapes are not supported")),
            other => {
                // Python keeps unknown escapes as they are.
                out.push('\\');
                out.push(other);
                return Ok(());
            }
        };
        let ch = char::from_u32(code).ok_or_else(|| {
            self.error_at(
                at,
                format!("escape gives U+{code:04X}, which is not a Unicode scalar value"),
            )
        })?;
        out.push(ch);
        Ok(())
    }

    fn hex_digits(&mut self, count: usize, at: usize) -> Result<u32, PyLiteralError> {
        let digits = self.src.get(self.pos..self.pos + count).unwrap_or("");
        if digits.len() != count || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.error_at(at, format!("truncated escape: expected {count} hex digits")));
        }
        self.pos += count;
        u32::from_str_radix(digits, 16).map_err(|_| self.error_at(at, "invalid hex escape"))
    }

    fn number(&mut self) -> Result<Value, PyLiteralError> {
        let start = self.pos;
        let mut negative = false;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            negative = self.peek() == Some(b'-');
            self.pos += 1;
            self.skip_trivia();
        }
        let body_start = self.pos;
        let rest = self.bytes();
        let radix = if rest.get(body_start) == Some(&b'0') {
            match rest.get(body_start + 1) {
                Some(b'x' | b'X') => 16,
                Some(b'o' | b'O') => 8,
                Some(b'b' | b'B') => 2,
                _ => 10,
            }
        } else {
            10
        };
        if radix != 10 {
            self.pos += 2;
            // Python allows one underscore right after the prefix: `0x_FF`, `0b_1`.
            if self.peek() == Some(b'_')
                && self.peek_at(1).is_some_and(|b| (b as char).is_digit(radix))
            {
                self.pos += 1;
            }
            let digits = self.digits(|b| (b as char).is_digit(radix));
            if digits.is_empty() {
                return Err(self.error_at(start, "invalid number literal"));
            }
            self.reject_suffix(start)?;
            return self.integer(&digits, radix, negative, start);
        }
        let int_part = self.digits(|b| b.is_ascii_digit());
        let mut is_float = false;
        let mut text = int_part.clone();
        if self.peek() == Some(b'.') {
            is_float = true;
            self.pos += 1;
            text.push('.');
            let frac = self.digits(|b| b.is_ascii_digit());
            if int_part.is_empty() && frac.is_empty() {
                return Err(self.error_at(start, "invalid number literal"));
            }
            text.push_str(&frac);
        } else if int_part.is_empty() {
            return Err(self.error_at(start, "expected a number"));
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            let mut exp = String::from("e");
            if matches!(self.peek(), Some(b'-' | b'+')) {
                exp.push(self.peek().unwrap_or(b'+') as char);
                self.pos += 1;
            }
            let digits = self.digits(|b| b.is_ascii_digit());
            if digits.is_empty() {
                self.pos = save;
                return Err(self.error_at(start, "invalid exponent in a number literal"));
            }
            exp.push_str(&digits);
            text.push_str(&exp);
            is_float = true;
        }
        if matches!(self.peek(), Some(b'j' | b'J')) {
            return Err(self.error_at(start, "complex numbers have no JSON form"));
        }
        self.reject_suffix(start)?;
        if !is_float {
            if int_part.len() > 1
                && int_part.bytes().any(|b| b != b'0')
                && int_part.starts_with('0')
            {
                return Err(self.error_at(
                    body_start,
                    "leading zeros in a decimal integer are not permitted",
                ));
            }
            return self.integer(&int_part, 10, negative, start);
        }
        let value: f64 = text
            .parse()
            .map_err(|_| self.error_at(start, "invalid float literal"))?;
        let value = if negative { -value } else { value };
        match Number::from_f64(value) {
            Some(number) => Ok(Value::Number(number)),
            None => {
                self.infinities.push(start);
                Ok(Value::String(self.infinity.clone()))
            }
        }
    }

    /// Reads digits accepted by `accept`, with single underscores between them.
    fn digits(&mut self, accept: impl Fn(u8) -> bool) -> String {
        let mut out = String::new();
        while let Some(b) = self.peek() {
            if accept(b) {
                out.push(b as char);
                self.pos += 1;
            } else if b == b'_' && !out.is_empty() && self.peek_at(1).is_some_and(&accept) {
                self.pos += 1;
            } else {
                break;
            }
        }
        out
    }

    fn reject_suffix(&self, start: usize) -> Result<(), PyLiteralError> {
        match self.peek() {
            Some(b) if b.is_ascii_alphanumeric() || b == b'_' => {
                Err(self.error_at(start, "invalid number literal"))
            }
            _ => Ok(()),
        }
    }

    fn integer(
        &self,
        digits: &str,
        radix: u32,
        negative: bool,
        start: usize,
    ) -> Result<Value, PyLiteralError> {
        if let Ok(magnitude) = u64::from_str_radix(digits, radix) {
            if !negative {
                return Ok(Value::Number(magnitude.into()));
            }
            if magnitude <= i64::MAX as u64 {
                return Ok(Value::Number((-(magnitude as i64)).into()));
            }
            if magnitude == i64::MAX as u64 + 1 {
                return Ok(Value::Number(i64::MIN.into()));
            }
        }
        // Beyond 64 bits: the nearest float, as JSON readers in most languages would give.
        let mut value = 0f64;
        for d in digits.chars() {
            value = value * f64::from(radix) + f64::from(d.to_digit(radix).unwrap_or(0));
        }
        let value = if negative { -value } else { value };
        Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| self.error_at(start, "integer too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_float_out_of_range_is_an_error_unless_a_later_duplicate_key_replaced_it() {
        // Python keeps a dict key's last value: the infinity is gone, as in CPython.
        assert_eq!(parse("{'': -1e999, '': 'x'}").unwrap(), json!({"": "x"}));
        for text in [
            "1e999",
            "[1, -2e400]",
            "{'a': {'b': 1e999}}",
            "{1e999: 1}",
            "{1e999, 2}",
        ] {
            let error = parse(text).unwrap_err();
            assert_eq!(
                error.message, "float out of range (infinity has no JSON form)",
                "{text}"
            );
        }
        assert_eq!(parse("[1, -2e400]").unwrap_err().column, 5);
    }

    #[test]
    fn parses_the_common_shapes() {
        let cases = [
            (
                "{'a': True, 'b': None, 'c': False}",
                json!({"a": true, "b": null, "c": false}),
            ),
            ("[1, 2, 3,]", json!([1, 2, 3])),
            ("(1,)", json!([1])),
            ("()", json!([])),
            ("(1)", json!(1)),
            ("1, 2", json!([1, 2])),
            ("'a' \"b\" '''c'''", json!("abc")),
            ("r'\\n'", json!("\\n")),
            ("'\\x41\\u00e9\\101'", json!("Aé\u{41}")),
            ("-1_000", json!(-1000)),
            ("0x1F", json!(31)),
            ("0x_3C12", json!(15378)),
            ("0o_16644", json!(7588)),
            ("0b_1_0", json!(2)),
            ("1.5e3", json!(1500.0)),
            (
                "{1: 'x', None: 'y', True: 'z'}",
                json!({"1": "x", "null": "y", "true": "z"}),
            ),
            ("{1, 2, 1}", json!([1, 2])),
            ("{'a': [\n  1, # one\n  2,\n],}", json!({"a": [1, 2]})),
            ("'''multi\nline'''", json!("multi\nline")),
            ("'\\q'", json!("\\q")),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input).unwrap(), expected, "input {input:?}");
        }
    }

    #[test]
    fn rejects_non_literals_with_a_position() {
        let cases = [
            ("foo", "name \"foo\" is not a literal"),
            ("{'a': 1", "unclosed dict"),
            ("'abc", "unterminated string"),
            ("b'x'", "bytes literals"),
            ("1j", "complex numbers"),
            ("007", "leading zeros"),
            ("0x__1", "invalid number literal"),
            ("0x_", "invalid number literal"),
            ("[1 2]", "expected ','"),
            ("", "empty input"),
        ];
        for (input, message) in cases {
            let error = parse(input).unwrap_err();
            assert!(error.message.contains(message), "{input:?}: {error}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let error = parse(&text).unwrap_err();
        assert!(error.message.contains("nesting deeper than 200"), "{error}");
        assert_eq!(error.column, 201);
    }
}
