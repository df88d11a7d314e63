//! A JSON array of chat-completions messages checked as JSON and split into its elements,
//! each read into a [`Message`] only when asked for. A fit that keeps the end of a long
//! history reads only that end (see the engine's `FitSettings::fit_read_back`), so the
//! history costs about what is kept, not what was given.

use serde_json::Value;
use serde_json::value::RawValue;

use super::FormatError;
use super::openai;
use crate::message::Message;

/// The elements of a JSON array of chat-completions messages, as the text they were given
/// in. Splitting checks the whole text as JSON; an element's shape as a message is checked
/// when it is read.
#[derive(Debug, Clone)]
pub struct RawMessages<'a> {
    elements: Vec<&'a RawValue>,
}

impl<'a> RawMessages<'a> {
    /// Splits `text`, a JSON array, into its elements. A syntax error, or a text that is not
    /// an array, is serde_json's error, with its line and column.
    pub fn split(text: &'a str) -> Result<RawMessages<'a>, serde_json::Error> {
        Ok(RawMessages {
            elements: serde_json::from_str(text)?,
        })
    }

    /// How many elements the array has.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// True when the array is empty.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// Element `index` read as a message (see [`openai::parse_message_at`]); errors name
    /// the place as `messages[<index>].<field>`.
    pub fn message(&self, index: usize) -> Result<Message, FormatError> {
        let path = format!("messages[{index}]");
        let Some(element) = self.elements.get(index) else {
            return Err(FormatError::MissingField { path });
        };
        // The element was checked as JSON when the array was split; reading it as a tree
        // can still pass serde_json's nesting limit, which is then its problem.
        let value: Value =
            serde_json::from_str(element.get()).map_err(|error| FormatError::Invalid {
                path: path.clone(),
                reason: strip_position(&error.to_string()).to_owned(),
            })?;
        openai::parse_message_at(&value, &path)
    }

    /// Every element read as a message, in order.
    pub fn messages(&self) -> Result<Vec<Message>, FormatError> {
        (0..self.len()).map(|index| self.message(index)).collect()
    }
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

    #[test]
    fn bad_json_anywhere_and_a_text_that_is_not_an_array_are_errors_with_a_place() {
        let problem = RawMessages::split("[{\"role\": \"user\"},\n {\"role\": }]").unwrap_err();
        assert_eq!((problem.line(), problem.column()), (2, 11));
        let problem = RawMessages::split(r#"{"role": "user"}"#).unwrap_err();
        assert!(
            problem.to_string().contains("expected a sequence"),
            "{problem}"
        );
        assert!(RawMessages::split("[1, 2").is_err());
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
