//! A JSON array of chat messages given as command input, split into its elements and read a
//! message at a time. A named file is read twice: once a part at a time to check it as JSON
//! and find where each element is, then only the elements asked for, from where they are; so
//! it is never held whole, and a fit that keeps the end of a long history holds about what it
//! keeps. Standard input cannot be read twice and is held.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, anyhow, bail};
use contexture_core::Message;
use contexture_core::format::openai_raw::{
    ArraySplitter, ElementSpan, SplitError, element_message,
};

use super::input;

/// The elements of a message array read from a file or standard input.
pub struct MessageArray {
    source: String,
    held: Held,
}

/// Where the elements' text is.
enum Held {
    /// In a file, read again element by element; its length and modification time when it
    /// was split, to notice a change between the two reads.
    File {
        file: File,
        path: PathBuf,
        spans: Vec<ElementSpan>,
        stamp: (u64, Option<SystemTime>),
    },
    /// In memory (standard input).
    Text {
        text: String,
        spans: Vec<ElementSpan>,
    },
}

impl MessageArray {
    /// Reads `path` (standard input when `None` or `-`) and splits it; a text that is not
    /// a JSON array, or not JSON, is an error with its line and column.
    pub fn read(path: Option<&Path>) -> Result<MessageArray> {
        let source = input::describe(path);
        let named = path.filter(|path| path.as_os_str() != "-");
        let held = match named {
            Some(path) => {
                let file =
                    File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
                let stamp = stamp(&file, path)?;
                // Split from the handle the messages are read back from: the same file even
                // if its path is given to another meanwhile.
                let mut splitter = ArraySplitter::new();
                input::read_reader_in_parts(&file, Some(path), |part| {
                    splitter
                        .feed(part)
                        .map_err(|error| split_error(&source, error))
                })?;
                let spans = splitter
                    .finish()
                    .map_err(|error| split_error(&source, error))?;
                Held::File {
                    file,
                    path: path.to_owned(),
                    spans,
                    stamp,
                }
            }
            None => {
                let text = input::read_text(None)?;
                let spans = split_whole(&text).map_err(|error| split_error(&source, error))?;
                Held::Text { text, spans }
            }
        };
        Ok(MessageArray { source, held })
    }

    /// How many elements the array has.
    pub fn len(&self) -> usize {
        self.spans().len()
    }

    fn spans(&self) -> &[ElementSpan] {
        match &self.held {
            Held::File { spans, .. } | Held::Text { spans, .. } => spans,
        }
    }

    /// Element `index` read as a message; a problem with its fields names it as
    /// `messages[<index>].<field>`.
    pub fn message(&self, index: usize) -> Result<Message> {
        let Some(span) = self.spans().get(index) else {
            bail!("{}: has no message {index}", self.source);
        };
        match &self.held {
            Held::Text { text, .. } => {
                let start = span.start as usize;
                Ok(element_message(&text[start..start + span.len], index)?)
            }
            Held::File { file, path, .. } => {
                let mut bytes = vec![0; span.len];
                let mut reader = file;
                reader
                    .seek(SeekFrom::Start(span.start))
                    .and_then(|_| reader.read_exact(&mut bytes))
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let element = String::from_utf8(bytes).map_err(|_| self.changed())?;
                Ok(element_message(&element, index)?)
            }
        }
    }

    /// Every element read as a message, in order.
    pub fn messages(&self) -> Result<Vec<Message>> {
        (0..self.len()).map(|index| self.message(index)).collect()
    }

    /// An error when the file changed after it was split: what was read of it since may
    /// not be what was checked.
    pub fn check_unchanged(&self) -> Result<()> {
        match &self.held {
            Held::File {
                file, path, stamp, ..
            } if self::stamp(file, path)? != *stamp => Err(self.changed()),
            _ => Ok(()),
        }
    }

    fn changed(&self) -> anyhow::Error {
        anyhow!(
            "{}: the file changed while it was read; run again once it is written",
            self.source
        )
    }
}

/// A file's length and modification time.
fn stamp(file: &File, path: &Path) -> Result<(u64, Option<SystemTime>)> {
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok((metadata.len(), metadata.modified().ok()))
}

/// The spans of `text`'s elements, split whole.
fn split_whole(text: &str) -> Result<Vec<ElementSpan>, SplitError> {
    let mut splitter = ArraySplitter::new();
    splitter.feed(text)?;
    splitter.finish()
}

/// A split's `error` in reading `source`, in the words of the other JSON inputs' errors.
fn split_error(source: &str, error: SplitError) -> anyhow::Error {
    match error {
        SplitError::NotAnArray { .. } => {
            anyhow!("{source}: not a chat message array: expected a JSON array of messages")
        }
        SplitError::Syntax {
            reason,
            line,
            column,
        } => anyhow!("{source}: invalid JSON at line {line}, column {column}: {reason}"),
    }
}
