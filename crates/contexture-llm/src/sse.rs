//! A server-sent events decoder: bytes in, `(event, data)` pairs out. Pure, so it is tested
//! on every way a stream can be split into chunks.

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field, when given.
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

/// Decodes a byte stream fed in arbitrary chunks. Lines are split on `\n` bytes only, so a
/// chunk boundary inside a UTF-8 character is harmless: the character is decoded once its
/// line is complete.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    /// The start of a line that is not complete yet.
    buffer: Vec<u8>,
    /// How many bytes of `buffer` are known to hold no newline, so that feeding a long line
    /// in small chunks does not scan it again and again.
    scanned: usize,
    event: Option<String>,
    data: Vec<String>,
}

impl SseDecoder {
    /// Feeds a chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = self.buffer[from..].iter().position(|&b| b == b'\n') {
            let end = from + offset;
            let mut line = &self.buffer[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
            start = end + 1;
            from = start;
        }
        self.buffer.drain(..start);
        self.scanned = self.buffer.len();
        events
    }

    /// Ends the stream; returns a last event that was not followed by a blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        self.scanned = 0;
        if !self.buffer.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.buffer)).into_owned();
            self.line(rest.trim_end_matches('\r'));
        }
        self.dispatch()
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => self.data.push(value.to_owned()),
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if self.data.is_empty() {
            return None;
        }
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data).join("\n"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":\ndata: 2}\r\n\r\ndata: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("message_start".into()),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: None,
                data: "{\"b\":\n2}".into(),
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
            },
        ]
    }

    #[test]
    fn decodes_whole_stream() {
        let mut decoder = SseDecoder::default();
        let mut events = decoder.feed(STREAM.as_bytes());
        events.extend(decoder.finish());
        assert_eq!(events, expected());
    }

    #[test]
    fn decodes_any_split() {
        let bytes = STREAM.as_bytes();
        for split in 0..bytes.len() {
            let mut decoder = SseDecoder::default();
            let mut events = decoder.feed(&bytes[..split]);
            events.extend(decoder.feed(&bytes[split..]));
            events.extend(decoder.finish());
            assert_eq!(events, expected(), "split at {split}");
        }
    }

    #[test]
    fn decodes_byte_by_byte_across_multibyte_characters() {
        let stream = "data: {\"t\":\"ol\u{e1} \u{1f30d}\"}\n\ndata: [DONE]\n\n";
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for byte in stream.as_bytes() {
            events.extend(decoder.feed(std::slice::from_ref(byte)));
        }
        events.extend(decoder.finish());
        let data: Vec<&str> = events.iter().map(|event| event.data.as_str()).collect();
        assert_eq!(data, ["{\"t\":\"ol\u{e1} \u{1f30d}\"}", "[DONE]"]);
    }

    #[test]
    fn last_event_without_blank_line() {
        let mut decoder = SseDecoder::default();
        assert!(decoder.feed(b"data: x").is_empty());
        assert_eq!(
            decoder.finish(),
            Some(SseEvent {
                event: None,
                data: "x".into()
            })
        );
    }
}
