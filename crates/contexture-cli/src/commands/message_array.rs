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
        stamp: Stamp,
    },
    /// In memory (standard input).
    Text {
        text: String,
        spans: Vec<ElementSpan>,
    },
}

impl MessageArray {
    /// Reads `path` (standard input when `None` or `-`) and splits it; a text that is not
    /// JSON is an error with its line and column, JSON that is not an array an error that
    /// says so. A named input that is no regular file (a pipe, a process substitution)
    /// cannot be read twice and is held, as standard input is.
    pub fn read(path: Option<&Path>) -> Result<MessageArray> {
        let source = input::describe(path);
        let named = path.filter(|path| path.as_os_str() != "-");
        let held = match named {
            Some(path) => {
                let file =
                    File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
                let stamp = stamp(&file, path)?;
                let mut splitter = ArraySplitter::new();
                // Split from the handle the messages are read back from: the same file even
                // if its path is given to another meanwhile.
                if stamp.regular {
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
                } else {
                    let mut text = String::new();
                    input::read_reader_in_parts(&file, Some(path), |part| {
                        text.push_str(part);
                        Ok(())
                    })?;
                    let spans =
                        ArraySplitter::split(&text).map_err(|error| split_error(&source, error))?;
                    Held::Text { text, spans }
                }
            }
            None => {
                let text = input::read_text(None)?;
                let spans =
                    ArraySplitter::split(&text).map_err(|error| split_error(&source, error))?;
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
                let read = reader
                    .seek(SeekFrom::Start(span.start))
                    .and_then(|_| reader.read_exact(&mut bytes));
                // A message that cannot be read back as it was checked: say so when the file
                // changed, which is then the cause.
                let read = read
                    .with_context(|| format!("cannot read {}", path.display()))
                    .and_then(|()| String::from_utf8(bytes).map_err(|_| self.changed()))
                    .and_then(|element| Ok(element_message(&element, index)?));
                if read.is_err() {
                    self.check_unchanged()?;
                }
                read
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

/// What tells a file's versions apart: its length and modification time, and whether it is
/// a regular file (one that can be read twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    regular: bool,
}

/// `file`'s stamp.
fn stamp(file: &File, path: &Path) -> Result<Stamp> {
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Stamp {
        len: metadata.len(),
        modified: metadata.modified().ok(),
        regular: metadata.is_file(),
    })
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
