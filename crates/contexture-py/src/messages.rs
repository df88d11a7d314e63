//! Message lists in and out, in the OpenAI chat format (a list of message dicts) or the
//! Anthropic Messages format (a list of turns, or a dict with `system` and `messages`).

use contexture_core::format::{anthropic, openai, responses};
use contexture_core::{Encoding, Message};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use serde_json::{Map, Value};
use std::collections::HashMap;

use crate::errors::{Kind, error, from_error};
use crate::json::{to_json, to_python};

/// The wire format of a message list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI chat completions: a list of `{"role", "content", ...}` dicts.
    OpenAi,
    /// Anthropic Messages: a list of turns, or `{"system": ..., "messages": [...]}`.
    Anthropic,
    /// OpenAI Responses items (`message`, `function_call`, `function_call_output`,
    /// `reasoning`, ...): what the Agents SDK's sessions hold.
    Responses,
}

impl Format {
    /// The format a `format=` argument names.
    pub fn parse(name: &str) -> PyResult<Format> {
        match name {
            "openai" => Ok(Format::OpenAi),
            "anthropic" => Ok(Format::Anthropic),
            "responses" => Ok(Format::Responses),
            other => Err(error(
                Kind::Input,
                format!(
                    "format: unknown message format `{other}` (expected openai, anthropic or responses)"
                ),
            )),
        }
    }
}

/// A message list read from Python, with the shape it came in (written back the same way).
pub struct Read {
    /// The messages, a system prompt first when there is one.
    pub messages: Vec<Message>,
    /// The format.
    pub format: Format,
    /// True when an Anthropic list came as a body dict (`system` + `messages`).
    pub body: bool,
    /// The objects given, one per message, when each message came as one object (an
    /// OpenAI list): a message written back unchanged is its own object again.
    pub given: Option<Given>,
}

/// The message objects a list was read from, and the messages read from them with their
/// places in it.
pub struct Given {
    objects: Py<PyTuple>,
    messages: Vec<(usize, Message)>,
}

impl Given {
    /// For each of `written`, the index of the given message it is, unchanged (`None` for
    /// one the operation made or changed).
    pub fn sources(&self, written: &[Message]) -> Vec<Option<usize>> {
        let index: HashMap<_, usize> = self
            .messages
            .iter()
            .map(|(place, message)| (message.identity(), *place))
            .collect();
        written
            .iter()
            .map(|message| index.get(&message.identity()).copied())
            .collect()
    }
}

impl Read {
    /// The shape of an OpenAI list read message by message.
    pub fn from_given(given: Given) -> Read {
        Read {
            messages: Vec::new(),
            format: Format::OpenAi,
            body: false,
            given: Some(given),
        }
    }

    /// Takes the messages as they are now as the given ones (after marking some pinned,
    /// which gives them fields of their own).
    pub fn refresh_given(&mut self) {
        if let Some(given) = &mut self.given {
            given.messages = self.messages.iter().cloned().enumerate().collect();
        }
    }

    /// The shape of a list written in `format` that was not read first (a thread's
    /// messages): a plain list.
    pub fn shape(format: Format) -> Read {
        Read {
            messages: Vec::new(),
            format,
            body: false,
            given: None,
        }
    }
}

/// Reads `messages` in `format`; errors name the message and field.
pub fn read(messages: &Bound<'_, PyAny>, format: Format) -> PyResult<Read> {
    // A list is read from a snapshot of its items: the objects written back are the ones
    // read, whatever another thread does to the list meanwhile.
    let snapshot = match messages.cast::<PyList>() {
        Ok(list) if format == Format::OpenAi => Some(list.to_tuple()),
        _ => None,
    };
    let value = match &snapshot {
        Some(items) => to_json(items.as_any(), "messages")?,
        None => to_json(messages, "messages")?,
    };
    let (parsed, body) = match format {
        Format::OpenAi => (openai::parse_messages(&value), false),
        Format::Responses => (responses::parse_items(&value, "messages"), false),
        Format::Anthropic => match value {
            Value::Array(_) => {
                let mut body = Map::new();
                body.insert("messages".into(), value);
                (anthropic::parse_request(&Value::Object(body)), false)
            }
            body => (anthropic::parse_request(&body), true),
        },
    };
    let messages = parsed.map_err(|problem| from_error(Kind::Input, &problem))?;
    let given = snapshot.map(|objects| Given {
        objects: objects.unbind(),
        messages: messages.iter().cloned().enumerate().collect(),
    });
    Ok(Read {
        messages,
        format,
        body,
        given,
    })
}

/// Writes `messages` back in the format and shape `read` came in.
pub fn write<'py>(
    py: Python<'py>,
    messages: &[Message],
    shape: &Read,
) -> PyResult<Bound<'py, PyAny>> {
    match shape.format {
        Format::Responses => {
            let list = PyList::empty(py);
            for item in responses::to_items(messages) {
                list.append(to_python(py, &item)?)?;
            }
            Ok(list.into_any())
        }
        Format::OpenAi => {
            let list = PyList::empty(py);
            let sources = shape.given.as_ref().map(|given| given.sources(messages));
            for (place, message) in messages.iter().enumerate() {
                let source = sources.as_ref().and_then(|sources| sources[place]);
                match (source, &shape.given) {
                    (Some(index), Some(given)) => {
                        list.append(given.objects.bind(py).get_item(index)?)?
                    }
                    _ => list.append(to_python(py, &openai::to_value(message))?)?,
                }
            }
            Ok(list.into_any())
        }
        Format::Anthropic => {
            let body = anthropic::to_request(messages)
                .map_err(|problem| from_error(Kind::Input, &problem))?;
            match (&body, shape.body) {
                (Value::Object(map), false) if !map.contains_key("system") => {
                    to_python(py, map.get("messages").unwrap_or(&Value::Null))
                }
                _ => to_python(py, &body),
            }
        }
    }
}

/// Refuses `counts` that do not give one count per message.
pub fn check_counts(counts: &[u32], messages: usize) -> PyResult<()> {
    if counts.len() == messages {
        return Ok(());
    }
    Err(error(
        Kind::Input,
        format!(
            "counts: {} counts for {messages} messages (one per message)",
            counts.len()
        ),
    ))
}

/// An OpenAI message list read one message at a time, from a snapshot of its items, each
/// message when it is asked for (a fit reads a long history from its end and stops where
/// older messages can no longer matter).
pub struct Reader<'py> {
    objects: Bound<'py, PyTuple>,
    counts: Option<Vec<u32>>,
    encoding: Encoding,
    /// Turns an object of the list into a message dict when it is read (the LangChain
    /// adapter's messages).
    convert: Option<Bound<'py, PyAny>>,
    read: Vec<(usize, Message)>,
}

impl<'py> Reader<'py> {
    /// A reader of `list`; `counts`, when given, are the messages' tokens in `encoding`;
    /// `convert`, when given, turns each object read into a message dict.
    pub fn new(
        list: &Bound<'py, PyList>,
        counts: Option<Vec<u32>>,
        encoding: Encoding,
        convert: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Reader<'py>> {
        let objects = list.to_tuple();
        if let Some(counts) = &counts {
            check_counts(counts, objects.len())?;
        }
        Ok(Reader {
            objects,
            counts,
            encoding,
            convert,
            read: Vec::new(),
        })
    }

    /// How many messages the list holds.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// What was read, for writing kept messages back as the objects given.
    pub fn into_given(self) -> Given {
        Given {
            objects: self.objects.unbind(),
            messages: self.read,
        }
    }

    /// Message `place` of the list, read (converted, checked, its count set) and
    /// remembered as read.
    pub fn at(&mut self, place: usize) -> PyResult<Message> {
        let path = format!("messages[{place}]");
        let mut object = self.objects.get_item(place)?;
        if let Some(convert) = &self.convert {
            object = convert.call1((object,))?;
        }
        let value = to_json(&object, &path)?;
        let message = openai::parse_message_at(&value, &path)
            .map_err(|problem| from_error(Kind::Input, &problem))?;
        if let Some(counts) = &self.counts {
            message.set_cached_tokens(self.encoding, counts[place]);
        }
        self.read.push((place, message.clone()));
        Ok(message)
    }
}

/// Converts `messages` from the `source` format to the `target` one (`openai`,
/// `anthropic` or `responses`): read as the source's wire format, written as the target's,
/// with what one format holds and the other has no place for kept where the target can
/// carry it.
#[pyfunction]
#[pyo3(signature = (messages, *, source="openai", target="openai"))]
pub fn convert<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    source: &str,
    target: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let read = read(messages, Format::parse(source)?)?;
    write(py, &read.messages, &Read::shape(Format::parse(target)?))
}
