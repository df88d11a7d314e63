//! A JSON array of chat-completions messages checked as JSON and split into its elements,
//! each read into a [`Message`] only when asked for. A fit that keeps the end of a long
//! history reads only that end (see the engine's `FitSettings::fit_read_back`), so the
//! history costs about what is kept, not what was given.
//!
//! [`ArraySplitter`] takes the text a part at a time and keeps only where each element is
//! ([`ElementSpan`]), so a reader that can read a span again (a file) never holds the whole
//! array; [`RawMessages`] splits a text held in memory.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::FormatError;
use super::openai;
use crate::message::Message;

/// Where one element of the array is in the whole text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementSpan {
    /// The byte offset of its first byte.
    pub start: u64,
    /// Its length in bytes.
    pub len: usize,
}

/// What is wrong with the text as a JSON array, and where (lines and byte columns from 1,
/// as serde_json counts them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The text holds JSON (or starts to) that is not an array.
    #[error("expected a JSON array at line {line}, column {column}")]
    NotAnArray {
        /// The line of the first byte that is not whitespace.
        line: usize,
        /// Its column.
        column: usize,
    },
    /// The text is not valid JSON.
    #[error("{reason} at line {line}, column {column}")]
    Syntax {
        /// What is wrong, in serde_json's words.
        reason: String,
        /// The line of the problem.
        line: usize,
        /// Its column.
        column: usize,
    },
}

/// Where the splitter is in the array's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expecting {
    /// Whitespace, then `[`.
    Array,
    /// An element or `]` (just after `[`).
    FirstElement,
    /// An element (after `,`).
    Element,
    /// `,` or `]` (after an element).
    CommaOrEnd,
    /// Whitespace only (after `]`).
    Nothing,
}

/// Splits a JSON array given a part at a time into its elements' spans, checking every
/// element as JSON (serde_json's checks, element by element) and the array's own syntax.
///
/// Only the text of an element cut by the end of a part is carried to the next parts, so the
/// memory it takes is bounded by a part and about twice the longest element, not the array.
#[derive(Debug)]
pub struct ArraySplitter {
    expecting: Expecting,
    /// Text of earlier parts not consumed yet: the start of an element cut by a part's end.
    carried: String,
    /// The offset in the whole text of the next byte not consumed.
    offset: u64,
    /// The line of that byte, and the offset its line starts at.
    line: usize,
    line_start: u64,
    /// How long `carried` must grow before an element cut short is parsed again: each retry
    /// waits for twice the text, so a long element is parsed a bounded number of times.
    retry_at: usize,
    spans: Vec<ElementSpan>,
}

impl Default for ArraySplitter {
    fn default() -> Self {
        ArraySplitter::new()
    }
}

impl ArraySplitter {
    /// A splitter at the start of the text.
    pub fn new() -> ArraySplitter {
        ArraySplitter {
            expecting: Expecting::Array,
            carried: String::new(),
            offset: 0,
            line: 1,
            line_start: 0,
            retry_at: 0,
            spans: Vec::new(),
        }
    }

    /// The spans of the elements of `text`, a whole array held in memory.
    pub fn split(text: &str) -> Result<Vec<ElementSpan>, SplitError> {
        let mut splitter = ArraySplitter::new();
        splitter.feed(text)?;
        splitter.finish()
    }

    /// Takes the next part of the text.
    pub fn feed(&mut self, part: &str) -> Result<(), SplitError> {
        if self.carried.is_empty() {
            let consumed = self.scan(part, false)?;
            self.carried.push_str(&part[consumed..]);
            self.retry_at = 2 * self.carried.len();
            return Ok(());
        }
        self.carried.push_str(part);
        if self.carried.len() < self.retry_at {
            return Ok(());
        }
        let carried = std::mem::take(&mut self.carried);
        let consumed = self.scan(&carried, false)?;
        self.carried = carried;
        self.carried.drain(..consumed);
        self.retry_at = 2 * self.carried.len();
        Ok(())
    }

    /// Ends the text: the spans of every element, in order.
    pub fn finish(mut self) -> Result<Vec<ElementSpan>, SplitError> {
        let carried = std::mem::take(&mut self.carried);
        let consumed = self.scan(&carried, true)?;
        let end = &carried[consumed..];
        let reason = match self.expecting {
            Expecting::Nothing => return Ok(self.spans),
            Expecting::Array | Expecting::Element => "EOF while parsing a value",
            Expecting::FirstElement | Expecting::CommaOrEnd => "EOF while parsing a list",
        };
        // As serde_json places it: at the last byte (column 0 after a final newline).
        let (line, column) = self.position(end, end.len());
        Err(SplitError::Syntax {
            reason: reason.to_owned(),
            line,
            column: column - 1,
        })
    }

    /// Consumes what it can of `text` (which starts at `self.offset`): the bytes it
    /// consumed. Unless `last`, an element that reaches the end of `text` is left for more
    /// text, since it may be cut (a number, or an object whose end is in the next part).
    fn scan(&mut self, text: &str, last: bool) -> Result<usize, SplitError> {
        let bytes = text.as_bytes();
        let mut at = 0;
        let result = loop {
            while at < bytes.len() && matches!(bytes[at], b' ' | b'\n' | b'\r' | b'\t') {
                at += 1;
            }
            if at == bytes.len() {
                break Ok(at);
            }
            match (self.expecting, bytes[at]) {
                (Expecting::Array, b'[') => {
                    self.expecting = Expecting::FirstElement;
                    at += 1;
                }
                (Expecting::Array, _) => {
                    // Not an array: when it is not JSON either, that is what is said of it.
                    let rest = &text[at..];
                    let mut deserializer = serde_json::Deserializer::from_str(rest);
                    if let Err(error) = <&RawValue>::deserialize(&mut deserializer)
                        && !reaches_end(rest, &error)
                    {
                        break Err(self.element_error(text, at, &error));
                    }
                    let (line, column) = self.position(text, at);
                    break Err(SplitError::NotAnArray { line, column });
                }
                (Expecting::FirstElement | Expecting::CommaOrEnd, b']') => {
                    self.expecting = Expecting::Nothing;
                    at += 1;
                }
                (Expecting::Element, b']') => break Err(self.syntax(text, at, "trailing comma")),
                (Expecting::FirstElement | Expecting::Element, _) => {
                    let rest = &text[at..];
                    let mut deserializer = serde_json::Deserializer::from_str(rest);
                    match <&RawValue>::deserialize(&mut deserializer) {
                        Ok(raw) => {
                            let element = raw.get();
                            let start = at + (element.as_ptr() as usize - rest.as_ptr() as usize);
                            let end = start + element.len();
                            if end == bytes.len() && !last {
                                break Ok(at);
                            }
                            self.spans.push(ElementSpan {
                                start: self.offset + start as u64,
                                len: element.len(),
                            });
                            self.expecting = Expecting::CommaOrEnd;
                            at = end;
                        }
                        // More text may complete what the part cut (`-` of `-1`, `tru`):
                        // a problem at the part's end is looked at again with more text.
                        Err(error) if !last && reaches_end(rest, &error) => break Ok(at),
                        Err(error) => break Err(self.element_error(text, at, &error)),
                    }
                }
                (Expecting::CommaOrEnd, b',') => {
                    self.expecting = Expecting::Element;
                    at += 1;
                }
                (Expecting::CommaOrEnd, _) => {
                    break Err(self.syntax(text, at, "expected `,` or `]`"));
                }
                (Expecting::Nothing, _) => break Err(self.syntax(text, at, "trailing characters")),
            }
        };
        let consumed = result?;
        for (index, _) in bytes[..consumed]
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte == b'\n')
        {
            self.line += 1;
            self.line_start = self.offset + index as u64 + 1;
        }
        self.offset += consumed as u64;
        Ok(consumed)
    }

    /// The line and column of byte `at` of `text` (which starts at `self.offset`).
    fn position(&self, text: &str, at: usize) -> (usize, usize) {
        let before = &text.as_bytes()[..at];
        let lines = before.iter().filter(|byte| **byte == b'\n').count();
        let column = match before.iter().rposition(|byte| *byte == b'\n') {
            Some(newline) => at - newline,
            None => (self.offset - self.line_start) as usize + at + 1,
        };
        (self.line + lines, column)
    }

    fn syntax(&self, text: &str, at: usize, reason: &str) -> SplitError {
        let (line, column) = self.position(text, at);
        SplitError::Syntax {
            reason: reason.to_owned(),
            line,
            column,
        }
    }

    /// serde_json's `error` in the element that starts at byte `at` of `text`, placed in the
    /// whole text.
    fn element_error(&self, text: &str, at: usize, error: &serde_json::Error) -> SplitError {
        let (line, column) = self.position(text, at);
        SplitError::Syntax {
            reason: strip_position(&error.to_string()).to_owned(),
            line: line + error.line() - 1,
            column: match error.line() {
                1 => column + error.column() - 1,
                _ => error.column(),
            },
        }
    }
}

/// True when serde_json's `error` in reading `text` is at its last byte or past it: more
/// text might have made it no error.
fn reaches_end(text: &str, error: &serde_json::Error) -> bool {
    if error.is_eof() {
        return true;
    }
    let line_start = match error.line() {
        1 => Some(0),
        line => text
            .bytes()
            .enumerate()
            .filter(|(_, byte)| *byte == b'\n')
            .nth(line - 2)
            .map(|(newline, _)| newline + 1),
    };
    line_start.is_some_and(|start| start + error.column() >= text.len())
}

/// The elements of a JSON array of chat-completions messages held in memory, as the text
/// they were given in. Splitting checks the whole text as JSON; an element's shape as a
/// message is checked when it is read.
#[derive(Debug, Clone)]
pub struct RawMessages<'a> {
    text: &'a str,
    spans: Vec<ElementSpan>,
}

impl<'a> RawMessages<'a> {
    /// Splits `text`, a JSON array, into its elements.
    pub fn split(text: &'a str) -> Result<RawMessages<'a>, SplitError> {
        Ok(RawMessages {
            text,
            spans: ArraySplitter::split(text)?,
        })
    }

    /// How many elements the array has.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when the array is empty.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Element `index` read as a message (see [`element_message`]).
    pub fn message(&self, index: usize) -> Result<Message, FormatError> {
        let Some(span) = self.spans.get(index) else {
            return Err(FormatError::MissingField {
                path: format!("messages[{index}]"),
            });
        };
        let start = span.start as usize;
        element_message(&self.text[start..start + span.len], index)
    }

    /// Every element read as a message, in order.
    pub fn messages(&self) -> Result<Vec<Message>, FormatError> {
        (0..self.len()).map(|index| self.message(index)).collect()
    }
}

/// Element `index` of a message array, `element` its text (one an [`ArraySplitter`] found),
/// read as a message (see [`openai::parse_message_at`]); errors name the place as
/// `messages[<index>].<field>`.
pub fn element_message(element: &str, index: usize) -> Result<Message, FormatError> {
    let path = format!("messages[{index}]");
    // The element was checked as JSON when the array was split; reading it as a tree can
    // still pass serde_json's nesting limit, which is then its problem.
    let value: Value = serde_json::from_str(element).map_err(|error| FormatError::Invalid {
        path: path.clone(),
        reason: strip_position(&error.to_string()).to_owned(),
    })?;
    openai::parse_message_at(&value, &path)
}

/// serde_json appends " at line L column C" to its messages; within an element the place
/// is the element's path instead.
fn strip_position(message: &str) -> &str {
    message
        .rfind(" at line ")
        .map_or(message, |index| &message[..index])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use proptest::prelude::*;

    #[test]
    fn elements_are_read_when_asked_for_and_name_their_place() {
        let text = r#"[{"role": "system", "content": "Be brief."},
            {"role": "wizard", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "hello \"there\""}]}]"#;
        let raw = RawMessages::split(text).unwrap();
        assert_eq!(raw.len(), 3);
        assert_eq!(raw.message(0).unwrap().role, Role::System);
        assert_eq!(raw.message(2).unwrap().role, Role::User);
        let problem = raw.message(1).unwrap_err();
        assert_eq!(problem.path(), "messages[1].role");
        assert_eq!(raw.message(3).unwrap_err().path(), "messages[3]");
        assert!(raw.messages().is_err());
    }

    #[test]
    fn a_split_reads_each_element_as_the_whole_array_is_read() {
        let text = r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}], "refusal": null}]"#;
        let whole = openai::parse_messages(&serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(RawMessages::split(text).unwrap().messages().unwrap(), whole);
    }

    /// Where a split of `text` puts its problem, as (line, column, reason).
    fn problem(text: &str) -> (usize, usize, String) {
        match RawMessages::split(text).unwrap_err() {
            SplitError::Syntax {
                reason,
                line,
                column,
            } => (line, column, reason),
            SplitError::NotAnArray { line, column } => (line, column, "not an array".into()),
        }
    }

    /// `text` split as parts of `size` bytes, stopping at the first error.
    fn split_in_parts(text: &str, size: usize) -> Result<Vec<ElementSpan>, SplitError> {
        let mut splitter = ArraySplitter::new();
        for part in text.as_bytes().chunks(size) {
            splitter.feed(std::str::from_utf8(part).unwrap())?;
        }
        splitter.finish()
    }

    #[test]
    fn bad_json_anywhere_and_a_text_that_is_not_an_array_are_errors_with_a_place() {
        let problems = [
            (
                "[{\"role\": \"user\"},\n {\"role\": }]",
                (2, 11, "expected value"),
            ),
            (r#"{"role": "user"}"#, (1, 1, "not an array")),
            ("\n\n  7", (3, 3, "not an array")),
            ("[1, 2", (1, 5, "EOF while parsing a list")),
            ("  ", (1, 2, "EOF while parsing a value")),
            ("[1,]", (1, 4, "trailing comma")),
            ("[1 2]", (1, 4, "expected `,` or `]`")),
            ("[1]\n x", (2, 2, "trailing characters")),
            ("[{\"a\": 1,}]", (1, 10, "key must be a string")),
            ("hello", (1, 1, "expected value")),
            ("[1,", (1, 3, "EOF while parsing a value")),
            ("[\n", (2, 0, "EOF while parsing a list")),
        ];
        for (text, (line, column, reason)) in problems {
            assert_eq!(problem(text), (line, column, reason.to_owned()), "{text:?}");
        }
    }

    #[test]
    fn serde_json_places_the_same_problems_where_the_splitter_does() {
        for text in [
            "[{\"role\": \"user\"},\n {\"role\": }]",
            "[1, 2",
            "[1,]",
            "[1 2]",
            "[1]\n x",
            "[{\"a\": [1, 2,\n 3, ]}]",
            "[\n\n  {\"a\": tru}]",
            "[\"a\nb\"]",
            "  ",
            "[1,\n",
            "[ -",
            "[{\"a\": 1,}]",
            "hello",
            "[1,",
            "[\n",
        ] {
            let theirs = serde_json::from_str::<Vec<&RawValue>>(text).unwrap_err();
            let (line, column, _) = problem(text);
            assert_eq!((line, column), (theirs.line(), theirs.column()), "{text:?}");
        }
    }

    #[test]
    fn a_text_given_in_parts_splits_as_it_does_whole() {
        let text = "  [ {\"role\": \"user\", \"content\": \"a \\\"quoted\\\" \\u00e9 word\"},\n\
            12345 , -0.5e3,\"s\", [[], {}] ,true, null ,\n{\"role\": \"assistant\"}  ] \n";
        let whole = RawMessages::split(text).unwrap().spans;
        assert_eq!(whole.len(), 8);
        for size in 1..text.len() {
            assert_eq!(
                split_in_parts(text, size).unwrap(),
                whole,
                "parts of {size} bytes"
            );
        }
        let bad = "[{\"a\": 1},\n {\"b\": 2}, \n {\"c\" 3}]";
        let expected = problem(bad);
        for size in 1..bad.len() {
            let found = split_in_parts(bad, size).unwrap_err();
            let SplitError::Syntax { line, column, .. } = found else {
                panic!("{found}");
            };
            assert_eq!(
                (line, column),
                (expected.0, expected.1),
                "parts of {size} bytes"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Any text, cut into parts anywhere, splits into exactly the elements serde_json
        /// finds, or fails where serde_json fails.
        #[test]
        fn parts_split_as_serde_json_reads_the_whole(
            elements in proptest::collection::vec(
                proptest::prop_oneof![
                    "[a-z ]{0,12}".prop_map(|text| serde_json::to_string(&text).unwrap()),
                    proptest::num::i64::ANY.prop_map(|number| number.to_string()),
                    "[a-z\\\\\"]{0,6}".prop_map(|text| format!("{{\"content\": {}}}", serde_json::to_string(&text).unwrap())),
                    proptest::strategy::Just("[1, {\"a\": [null]}]".to_owned()),
                ],
                0..6,
            ),
            gaps in proptest::collection::vec("[ \n\t]{0,2}", 8),
            cut in 1usize..40,
            damage in proptest::option::of((0usize..200, proptest::sample::select(vec!['x', ',', ']', '"', '{']))),
        ) {
            let mut text = format!("{}[", gaps[0]);
            for (index, element) in elements.iter().enumerate() {
                if index > 0 {
                    text.push(',');
                }
                text.push_str(&gaps[1 + index % 6]);
                text.push_str(element);
            }
            text.push(']');
            text.push_str(&gaps[7]);
            if let Some((place, character)) = damage {
                let place = place % (text.len() + 1);
                text.insert(place, character);
            }
            let split = split_in_parts(&text, cut);
            match (serde_json::from_str::<Vec<&RawValue>>(&text), split) {
                (Ok(theirs), Ok(spans)) => {
                    let ours: Vec<&str> = spans
                        .iter()
                        .map(|span| &text[span.start as usize..span.start as usize + span.len])
                        .collect();
                    let theirs: Vec<&str> = theirs.iter().map(|raw| raw.get()).collect();
                    prop_assert_eq!(ours, theirs);
                }
                // Not an array: serde_json says so of the type, the splitter of the JSON
                // (when it is not JSON) or of the type.
                (Err(_), Err(_)) if !text.trim_start().starts_with('[') => {}
                (Err(theirs), Err(SplitError::Syntax { line, column, .. })) => {
                    prop_assert_eq!((line, column), (theirs.line(), theirs.column()));
                }
                (theirs, ours) => prop_assert!(false, "serde_json: {:?}, splitter: {:?}", theirs.map(|v| v.len()), ours),
            }
        }
    }

    #[test]
    fn nesting_past_the_json_limit_in_an_element_is_a_format_error() {
        let deep = format!(
            r#"[{{"role": "user", "content": "x", "meta": {}0{}}}]"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let raw = RawMessages::split(&deep).unwrap();
        let problem = raw.message(0).unwrap_err();
        assert_eq!(problem.path(), "messages[0]");
        assert!(problem.to_string().contains("recursion limit"), "{problem}");
    }
}
