//! Reading command input: a named file or standard input, as UTF-8 text or JSON, with errors
//! that say where the input came from and what was wrong with it.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, anyhow};

/// Where an input came from, for error messages.
pub fn describe(path: Option<&Path>) -> String {
    match path {
        Some(path) if path != Path::new("-") => path.display().to_string(),
        _ => "standard input".to_owned(),
    }
}

/// Reads `path`, or standard input when `path` is `None` or `-`, as raw bytes.
pub fn read_bytes(path: Option<&Path>) -> Result<Vec<u8>> {
    let path = path.filter(|p| p.as_os_str() != "-");
    let mut bytes = Vec::new();
    match path {
        Some(path) => {
            bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("cannot read standard input")?;
        }
    }
    Ok(bytes)
}

/// Reads `path` (or standard input) as UTF-8 text; invalid UTF-8 is an error naming the byte
/// offset, line and column of the first bad byte.
pub fn read_text(path: Option<&Path>) -> Result<String> {
    let bytes = read_bytes(path)?;
    String::from_utf8(bytes).map_err(|error| {
        let offset = error.utf8_error().valid_up_to();
        let valid = &error.as_bytes()[..offset];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = offset - valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        anyhow!(
            "{}: not valid UTF-8 at byte {offset} (line {line}, column {column})",
            describe(path)
        )
    })
}

/// Bytes read at a time by [`read_text_in_parts`].
const PART_BYTES: usize = 1 << 20;

/// Reads `path` (or standard input) as UTF-8 text a part at a time, handing each part to
/// `take`: memory stays bounded however large the input is. Parts end at character
/// boundaries; an error `take` returns stops the reading. Invalid UTF-8 is an error naming the
/// byte offset, line and column of the first bad byte, as [`read_text`] reports it.
pub fn read_text_in_parts(path: Option<&Path>, take: impl FnMut(&str) -> Result<()>) -> Result<()> {
    let named = path.filter(|p| p.as_os_str() != "-");
    let reader: Box<dyn Read> = match named {
        Some(path) => Box::new(
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
        ),
        None => Box::new(std::io::stdin().lock()),
    };
    read_reader_in_parts(reader, path, take)
}

/// [`read_text_in_parts`] of what `reader` gives, `path` naming it in errors (standard input
/// when `None`).
pub fn read_reader_in_parts(
    mut reader: impl Read,
    path: Option<&Path>,
    mut take: impl FnMut(&str) -> Result<()>,
) -> Result<()> {
    let mut buffer = vec![0u8; PART_BYTES];
    // Bytes of a character cut by the last read, carried to the front of the buffer.
    let mut carried = 0;
    // Where the buffer starts in the input, and the lines before it, for error positions.
    let (mut offset, mut lines, mut line_start) = (0usize, 1usize, 0usize);
    loop {
        let read = loop {
            match reader.read(&mut buffer[carried..]) {
                Ok(read) => break read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    return Err(error).with_context(|| format!("cannot read {}", describe(path)));
                }
            }
        };
        let filled = carried + read;
        let (valid, bad) = match std::str::from_utf8(&buffer[..filled]) {
            Ok(text) => (text, false),
            Err(error) => {
                let valid_up_to = error.valid_up_to();
                // A character cut at the end of what was read is fine unless the input ended.
                let cut_short = error.error_len().is_none() && read > 0;
                let text = std::str::from_utf8(&buffer[..valid_up_to]).unwrap_or_default();
                (text, !cut_short)
            }
        };
        if !valid.is_empty() {
            take(valid)?;
        }
        for (at, _) in valid.bytes().enumerate().filter(|(_, byte)| *byte == b'\n') {
            lines += 1;
            line_start = offset + at + 1;
        }
        let used = valid.len();
        if bad {
            let at = offset + used;
            return Err(anyhow!(
                "{}: not valid UTF-8 at byte {at} (line {lines}, column {})",
                describe(path),
                at - line_start + 1
            ));
        }
        if read == 0 {
            return Ok(());
        }
        buffer.copy_within(used..filled, 0);
        carried = filled - used;
        offset += used;
    }
}

/// Reads `path` (or standard input) as JSON and deserializes it; a syntax or shape error
/// names the line and column.
pub fn read_json<T: serde::de::DeserializeOwned>(path: Option<&Path>) -> Result<T> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|error| json_error(path, &error))
}

/// serde_json's `error` in reading the input from `path` (or standard input), with its line
/// and column.
pub fn json_error(path: Option<&Path>, error: &serde_json::Error) -> anyhow::Error {
    anyhow!(
        "{}: invalid JSON at line {}, column {}: {}",
        describe(path),
        error.line(),
        error.column(),
        strip_position(&error.to_string())
    )
}

/// Reads `path` (or standard input) as YAML (JSON too: it is YAML) and deserializes it; a
/// syntax or shape error is `FILE:LINE:COLUMN: what`.
pub fn read_yaml<T: serde::de::DeserializeOwned>(path: Option<&Path>) -> Result<T> {
    let text = read_text(path)?;
    yaml_serde::from_str(&text).map_err(|error| {
        let (line, column) = error
            .location()
            .map_or((1, 1), |location| (location.line(), location.column()));
        anyhow!("{}:{line}:{column}: {error}", describe(path))
    })
}

/// serde_json appends " at line L column C" to its messages; we print the position our way.
fn strip_position(message: &str) -> &str {
    message
        .rfind(" at line ")
        .map_or(message, |index| &message[..index])
}
