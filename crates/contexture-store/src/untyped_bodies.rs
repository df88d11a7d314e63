//! Event bodies without their type: a row's `kind` column names the event's type, so the
//! body leaves out the `"type"` key that serializing an event puts first.
//!
//! Rows written before bodies left it out still hold it; a read tells the two apart by how
//! the body starts and gives the decoder the typed form either way.

use std::borrow::Cow;

/// The key and value serializing an event of `kind` starts its object with (after `{`).
fn type_key(kind: &str) -> String {
    format!(r#""type":"{kind}""#)
}

/// `json`, an event of `kind` serialized, without its leading `"type"` key; unchanged when it
/// does not start with it.
pub(crate) fn untyped(kind: &str, mut json: String) -> String {
    let key = type_key(kind);
    if json.starts_with('{') && json[1..].starts_with(&key) {
        let mut end = 1 + key.len();
        if json[end..].starts_with(',') {
            end += 1;
        }
        json.replace_range(1..end, "");
    }
    json
}

/// `body`, a stored event of `kind`, with its `"type"` key: as it is when it holds it (a row
/// written before bodies left it out), else with the key put back first.
pub(crate) fn typed<'a>(kind: &str, body: &'a str) -> Cow<'a, str> {
    let Some(fields) = body.strip_prefix('{') else {
        // Not an object: the decoder reports it as it is.
        return Cow::Borrowed(body);
    };
    if fields.starts_with(r#""type":"#) {
        return Cow::Borrowed(body);
    }
    let key = type_key(kind);
    let separator = if fields.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    Cow::Owned(format!("{{{key}{separator}{fields}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, Usage};

    #[test]
    fn a_body_leaves_its_type_out_and_reads_back_typed() {
        let end = EventKind::RequestEnded(RequestEnd::new(
            "r1",
            RequestOutcome::Completed,
            Usage::new(3, 4),
        ));
        let json = serde_json::to_string(&end).unwrap();
        let stored = untyped("request_ended", json.clone());
        assert!(stored.starts_with(r#"{"request_id":"r1","#), "{stored}");
        assert_eq!(
            stored.len(),
            json.len() - r#""type":"request_ended","#.len()
        );
        assert_eq!(typed("request_ended", &stored), json);
        let read: EventKind = serde_json::from_str(&typed("request_ended", &stored)).unwrap();
        assert_eq!(read, end);
    }

    #[test]
    fn bodies_written_with_their_type_read_as_they_are() {
        let old = r#"{"type":"run_ended","status":"completed"}"#;
        assert!(matches!(typed("run_ended", old), Cow::Borrowed(body) if body == old));
        // A body of another type is left for the decoder to refuse against the kind.
        let other = r#"{"type":"x","a":1}"#;
        assert_eq!(typed("run_ended", other), other);
        assert_eq!(untyped("run_ended", other.to_string()), other);
    }

    #[test]
    fn an_event_with_no_fields_but_its_type_is_an_empty_object() {
        let stored = untyped("paused", r#"{"type":"paused"}"#.to_string());
        assert_eq!(stored, "{}");
        assert_eq!(typed("paused", &stored), r#"{"type":"paused"}"#);
    }

    #[test]
    fn what_is_not_an_object_is_left_to_the_decoder() {
        for body in ["", "[1]", "null", "\"text\""] {
            assert_eq!(typed("run_ended", body), body);
        }
    }
}
