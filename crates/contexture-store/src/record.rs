//! The stored form of an event: its type name, a JSON body and the token counts of the
//! messages it carries. Shared by both stores.
//!
//! - `kind`: the event's type name (`message_appended`, ...);
//! - `body`: for `message_appended`, the message in Contexture's storage form; otherwise the
//!   whole event (without its seq) as JSON. Kept as text, byte for byte;
//! - `tokens`: for events carrying messages, each message's counts per encoding, messages
//!   separated by `;`: the counts in a fixed order of encodings separated by `,` (`12,11`
//!   for cl100k_base, then o200k_base), or one number when they agree (`12`); rows of earlier
//!   versions name each encoding (`cl100k_base=12,o200k_base=11`). Counted once at append
//!   time, restored on load.

use contexture_core::Message;
use contexture_core::thread::{Event, EventKind, EventType, RequestEnd, StepEnd};
use contexture_core::tokens::{Encoding, message_tokens};

use crate::request_refs::{MESSAGE_EVENT_KINDS, REQUEST_STARTED, StoredRequest, Unresolved};
use crate::untyped_bodies::{typed, untyped};
use crate::{NewEvent, StoreError};

/// The type name of message events, stored with the message alone as the body.
const MESSAGE_APPENDED: &str = "message_appended";

/// The type name of request ends.
const REQUEST_ENDED: &str = "request_ended";

/// How a request end whose reply is the next event's message says so.
const REPLY_IN_NEXT: &str = r#""reply_in_next":true"#;

/// How a request end whose reply is, without its metadata, the message of an event a few
/// events after it says so: `"reply_in": N`, the message being N events on. Written when a
/// step's answer joins the shared history with the step's end (see [`shared_reply`]).
const REPLY_IN: &str = r#""reply_in":"#;

/// The type name of step ends.
const STEP_FINISHED: &str = "step_finished";

/// How a step end whose output is the text of an assistant message a few events before it
/// says so: `"output_in": N`, the message being N events back.
const OUTPUT_IN: &str = r#""output_in":"#;

/// An event ready to be written.
pub(crate) struct Row {
    /// The event's type name.
    pub kind: &'static str,
    /// The JSON body.
    pub body: String,
    /// The token counts, when the event carries messages.
    pub tokens: Option<String>,
    /// True for a message event whose message is not a system or developer message.
    pub ordinary_message: bool,
    /// The bytes of the messages it holds as a message event (see [`message_bytes`]).
    pub message_bytes: u64,
    /// The idempotency key.
    pub key: Option<String>,
    /// True for the assistant message a step's end of the same append takes its output from
    /// (see [`share_outputs`]): the step's last request end may hold the same text, which the
    /// append then stores by reference to this message (see [`shared_reply`]).
    pub step_answer: bool,
    /// For a request record, each message it sent serialized on its own: what the append
    /// compares with the thread's messages. Made with the rest of the encoding, before the
    /// write, rather than on SQLite's writer thread, whose time every write shares.
    pub sent_bodies: Vec<String>,
    /// The event, for checks that need its seq.
    pub event: EventKind,
}

/// The error for something of `thread` that could not be serialized (`what`, in words).
pub(crate) fn unserializable(thread: &str, what: &str, error: &serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        thread: thread.to_string(),
        seq: 0,
        detail: format!("cannot serialize {what}: {error}"),
    }
}

/// Decodes a row that must hold a request record (a `request_started` row).
pub(crate) fn decode_request(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
    tokens: Option<&str>,
) -> Result<StoredRequest, StoreError> {
    match decode_row(thread, seq, kind, body, tokens)? {
        (_, Some(Unresolved::Request(stored))) => Ok(*stored),
        _ => Err(StoreError::Corrupt {
            thread: thread.to_string(),
            seq,
            detail: format!("read as a request record but stored as `{kind}`"),
        }),
    }
}

/// Encodes `event` for writing, counting its messages' tokens.
pub(crate) fn encode(thread: &str, event: NewEvent) -> Result<Row, StoreError> {
    if matches!(event.kind, EventKind::Forked { .. }) {
        return Err(StoreError::ForkedEventAppended {
            thread: thread.to_string(),
        });
    }
    let body = match &event.kind {
        EventKind::MessageAppended { message } => serde_json::to_string(message),
        // Written by [`store_request`] inside the append, once the store has found what the
        // record refers to; until then it has no body.
        EventKind::RequestStarted(_) => Ok(String::new()),
        other => serde_json::to_string(other).map(|json| untyped(other.type_name(), json)),
    }
    .map_err(|error| unserializable(thread, "the event", &error))?;
    let ordinary_message = matches!(
        &event.kind,
        EventKind::MessageAppended { message } if !message.role.is_system_like()
    );
    let message_bytes = match &event.kind {
        EventKind::MessageAppended { .. } => body_bytes(&body),
        kind if MESSAGE_EVENT_KINDS.contains(&kind.type_name()) => kind
            .messages()
            .into_iter()
            .map(|message| serde_json::to_string(message).map(|text| body_bytes(&text)))
            .sum::<Result<u64, _>>()
            .map_err(|error| unserializable(thread, "a message", &error))?,
        _ => 0,
    };
    Ok(Row {
        ordinary_message,
        message_bytes,
        kind: event.kind.type_name(),
        body,
        // A request record's inline messages are counted once the store has found which
        // messages it refers to instead ([`store_request`]).
        tokens: match &event.kind {
            EventKind::RequestStarted(_) => None,
            kind => count(kind),
        },
        key: event.idempotency_key,
        step_answer: false,
        sent_bodies: match &event.kind {
            EventKind::RequestStarted(record) => record
                .messages
                .iter()
                .map(serde_json::to_string)
                .collect::<Result<_, _>>()
                .map_err(|error| unserializable(thread, "a message", &error))?,
            _ => Vec::new(),
        },
        event: event.kind,
    })
}

/// The events of one append, encoded: each serialized and counted, a request end's reply
/// and a step end's output stored once (see [`share_replies`], [`share_outputs`]).
pub(crate) fn encode_batch(thread: &str, events: Vec<NewEvent>) -> Result<Vec<Row>, StoreError> {
    let mut rows = events
        .into_iter()
        .map(|event| encode(thread, event))
        .collect::<Result<Vec<_>, _>>()?;
    share_replies(thread, &mut rows)?;
    share_outputs(thread, &mut rows)?;
    Ok(rows)
}

/// Stores each step end's output once: when an earlier row of the batch is the assistant
/// message whose text is the output (a step whose answer joins the shared history appends
/// it with its end), and neither that row nor any after it up to the end has an idempotency
/// key (so they are stored one after the other, whatever else the batch holds), the end
/// says how many events back its output is.
pub(crate) fn share_outputs(thread: &str, rows: &mut [Row]) -> Result<(), StoreError> {
    for i in 0..rows.len() {
        let EventKind::StepFinished(end) = &rows[i].event else {
            continue;
        };
        if rows[i].key.is_some() {
            continue;
        }
        let found = rows[..i]
            .iter()
            .rev()
            .take_while(|row| row.key.is_none())
            .position(|row| match &row.event {
                EventKind::MessageAppended { message } => {
                    message.role == contexture_core::Role::Assistant
                        && matches!(&message.content, Some(contexture_core::Content::Text(text)) if **text == *end.output)
                }
                _ => false,
            });
        let Some(position) = found else { continue };
        let back = position + 1;
        rows[i - back].step_answer = true;
        let shell = StepEnd {
            output: String::new(),
            ..end.clone()
        };
        let mut value = serde_json::to_value(EventKind::StepFinished(shell))
            .map_err(|error| unserializable(thread, "a step's end", &error))?;
        if let serde_json::Value::Object(fields) = &mut value {
            fields.insert("output_in".into(), serde_json::Value::from(back));
        }
        rows[i].body = serde_json::to_string(&value)
            .map(|json| untyped(STEP_FINISHED, json))
            .map_err(|error| unserializable(thread, "a step's end", &error))?;
    }
    Ok(())
}

/// Stores each request end's reply once: when the next row of the batch is a message event
/// holding the same message and has no idempotency key (so it is stored right after the
/// end, whatever else the batch holds), the end says that its reply is there.
pub(crate) fn share_replies(thread: &str, rows: &mut [Row]) -> Result<(), StoreError> {
    let unserializable =
        |error: serde_json::Error| unserializable(thread, "a request's end", &error);
    for i in 1..rows.len() {
        let (before, after) = rows.split_at_mut(i);
        let (row, next) = (&mut before[i - 1], &after[0]);
        let EventKind::RequestEnded(end) = &row.event else {
            continue;
        };
        let held = match &next.event {
            EventKind::MessageAppended { message } => message,
            EventKind::StepMessage(step) => &step.message,
            _ => continue,
        };
        let Some(reply) = &end.reply else { continue };
        if next.key.is_some()
            || serde_json::to_string(reply).map_err(unserializable)?
                != serde_json::to_string(held).map_err(unserializable)?
        {
            continue;
        }
        let shell = RequestEnd {
            reply: None,
            ..end.clone()
        };
        let mut value =
            serde_json::to_value(EventKind::RequestEnded(shell)).map_err(unserializable)?;
        if let serde_json::Value::Object(fields) = &mut value {
            fields.insert("reply_in_next".into(), serde_json::Value::Bool(true));
        }
        row.body = untyped(
            REQUEST_ENDED,
            serde_json::to_string(&value).map_err(unserializable)?,
        );
        row.tokens = None;
    }
    Ok(())
}

/// How many of a thread's newest request ends an append of a step's answer looks through
/// for one holding it: the step's last call ended a few events before its end, after the
/// calls that iteration items running at once may have ended meanwhile.
pub(crate) const ANSWER_LOOKBACK: i64 = 4;

/// The body to store in place of `body`, the stored request end at `end_seq` of `thread`,
/// when its reply is `answer` (the message an append gives `answer_seq`) without its
/// metadata: the end without its reply, saying how many events on the reply is (`"reply_in":
/// N`). `None` when the end holds no reply, another one, or already refers to its reply.
///
/// A step's last call ends with the step's answer, which the step's end then appends to the
/// shared history tagged with the step; stored this way, the text is held by the message
/// alone, and the end reads back exactly as it was written.
pub(crate) fn shared_reply(
    thread: &str,
    end_seq: u64,
    body: &str,
    answer_seq: u64,
    answer: &Message,
) -> Result<Option<String>, StoreError> {
    if answer_seq <= end_seq || body.contains(REPLY_IN_NEXT) || body.contains(REPLY_IN) {
        return Ok(None);
    }
    let event: EventKind =
        parse_stored(&typed(REQUEST_ENDED, body)).map_err(|detail| StoreError::Corrupt {
            thread: thread.to_string(),
            seq: end_seq,
            detail,
        })?;
    let EventKind::RequestEnded(end) = event else {
        return Ok(None);
    };
    let Some(reply) = &end.reply else {
        return Ok(None);
    };
    let unserializable =
        |error: serde_json::Error| unserializable(thread, "a request's end", &error);
    let mut bare = answer.clone();
    bare.metadata = contexture_core::Metadata::default();
    if serde_json::to_string(reply).map_err(unserializable)?
        != serde_json::to_string(&bare).map_err(unserializable)?
    {
        return Ok(None);
    }
    let shell = RequestEnd { reply: None, ..end };
    let mut value = serde_json::to_value(EventKind::RequestEnded(shell)).map_err(unserializable)?;
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert(
            "reply_in".into(),
            serde_json::Value::from(answer_seq - end_seq),
        );
    }
    serde_json::to_string(&value)
        .map(|json| Some(untyped(REQUEST_ENDED, json)))
        .map_err(unserializable)
}

/// Refuses the event that would get `seq` in `thread` past the store's limit of
/// `max_events` per thread (0: no limit).
pub(crate) fn check_room(thread: &str, seq: u64, max_events: u64) -> Result<(), StoreError> {
    if max_events > 0 && seq > max_events {
        return Err(StoreError::ThreadFull {
            thread: thread.to_string(),
            max_events,
        });
    }
    Ok(())
}

/// The most one thread may hold (0: no limit on that measure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ThreadLimits {
    /// Events, its fork prefix included.
    pub max_events: u64,
    /// Bytes of event bodies, its fork prefix included.
    pub max_bytes: u64,
}

impl ThreadLimits {
    /// Admits `row` as event `seq` of `thread`, whose events take `bytes` before it (counted
    /// in on success): refused past either limit, or when the event is not valid at `seq`.
    pub(crate) fn admit(
        &self,
        thread: &str,
        seq: u64,
        bytes: &mut u64,
        row: &Row,
    ) -> Result<(), StoreError> {
        check_room(thread, seq, self.max_events)?;
        if row.body.is_empty() {
            return Err(StoreError::Corrupt {
                thread: thread.to_string(),
                seq,
                detail: format!("a `{}` event reached the insert without a body", row.kind),
            });
        }
        *bytes += body_bytes(&row.body);
        check_bytes(thread, *bytes, self.max_bytes)?;
        row.event
            .check_at(seq)
            .map_err(|source| StoreError::InvalidEvent {
                thread: thread.to_string(),
                source,
            })
    }
}

/// Refuses an append that would take `thread` to `bytes` of events, past the store's limit
/// of `max_bytes` (0: no limit).
pub(crate) fn check_bytes(thread: &str, bytes: u64, max_bytes: u64) -> Result<(), StoreError> {
    if max_bytes > 0 && bytes > max_bytes {
        return Err(StoreError::ThreadTooLarge {
            thread: thread.to_string(),
            max_bytes,
        });
    }
    Ok(())
}

/// The bytes `body` adds to a thread.
pub(crate) fn body_bytes(body: &str) -> u64 {
    body.len() as u64
}

/// The bytes `row` adds to a thread's messages, the text it holds: for a message event
/// (see [`MESSAGE_EVENT_KINDS`]), each of its messages serialized on its own (for a
/// `message_appended` event, its body); 0 for any other event.
pub(crate) fn message_bytes(row: &Row) -> u64 {
    row.message_bytes
}

/// [`message_bytes`] of a stored row.
pub(crate) fn stored_message_bytes(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
) -> Result<u64, StoreError> {
    if kind == MESSAGE_APPENDED {
        return Ok(body_bytes(body));
    }
    if !MESSAGE_EVENT_KINDS.contains(&kind) {
        return Ok(0);
    }
    Ok(message_bodies(thread, seq, kind, body)?
        .iter()
        .map(|text| body_bytes(text))
        .sum())
}

/// Encodes the `forked` event [`crate::Store::fork`] writes.
pub(crate) fn forked_body(parent: &str, at_seq: u64) -> String {
    // Without its type, as every event body is stored (see [`untyped`]).
    serde_json::json!({"parent": parent, "at_seq": at_seq}).to_string()
}

/// Stores `row`, a `request_started` row, as `stored`: the record with references in place
/// of what its thread holds, and the token counts of its inline messages alone.
pub(crate) fn store_request(
    thread: &str,
    row: &mut Row,
    stored: &StoredRequest,
) -> Result<(), StoreError> {
    row.body = stored
        .to_body()
        .map_err(|error| unserializable(thread, "the request record", &error))?;
    row.tokens = count_messages(stored.inline().collect());
    Ok(())
}

/// The messages a message event's row holds, each as stored on its own (the JSON a request
/// record compares with): a `message_appended` body as it is, the others' messages
/// serialized from the decoded event.
pub(crate) fn message_bodies(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
) -> Result<Vec<String>, StoreError> {
    if kind == MESSAGE_APPENDED {
        return Ok(vec![body.to_string()]);
    }
    let event = decode(thread, seq, kind, body, None)?;
    event
        .kind
        .messages()
        .into_iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| StoreError::Corrupt {
            thread: thread.to_string(),
            seq,
            detail: format!("cannot serialize a message: {error}"),
        })
}

fn count(event: &EventKind) -> Option<String> {
    count_messages(event.messages())
}

fn count_messages(messages: Vec<&Message>) -> Option<String> {
    if messages.is_empty() {
        return None;
    }
    let mut text = String::new();
    for (i, message) in messages.into_iter().enumerate() {
        if i > 0 {
            text.push(';');
        }
        let counts = STORED_ORDER.map(|encoding| message_tokens(message, encoding));
        if counts.iter().all(|count| *count == counts[0]) {
            text.push_str(&counts[0].to_string());
            continue;
        }
        for (j, count) in counts.iter().enumerate() {
            if j > 0 {
                text.push(',');
            }
            text.push_str(&count.to_string());
        }
    }
    Some(text)
}

/// The encodings whose counts a `tokens` column holds by position, in this order: their
/// names would take most of the column (`cl100k_base=12,o200k_base=12` for `12`). An
/// encoding added later is appended, or stored as `name=count`.
const STORED_ORDER: [Encoding; 2] = [Encoding::Cl100kBase, Encoding::O200kBase];

/// The counts of one message as stored (`12`: every encoding of [`STORED_ORDER`] counts 12;
/// `12,13`: one count per encoding of it, in order; `name=count` pairs, as earlier versions
/// wrote them), each with its encoding; `None` for a count under an encoding this build
/// does not know (it would be recomputed). An error names what is malformed.
fn parse_counts(
    counts: &str,
) -> impl Iterator<Item = Result<Option<(Encoding, u32)>, String>> + '_ {
    // One number stands for every encoding in the stored order; otherwise each pair is read
    // in place (this runs for every message a read restores, so nothing is collected).
    let shared = !counts.contains(',') && !counts.contains('=');
    let each = if shared {
        STORED_ORDER.len()
    } else {
        counts.matches(',').count() + 1
    };
    counts
        .split(',')
        .cycle()
        .take(each)
        .enumerate()
        .map(|(i, pair)| {
            let bad = || format!("bad token count `{pair}`");
            match pair.split_once('=') {
                Some((name, n)) => {
                    let n = n.parse::<u32>().map_err(|_| bad())?;
                    Ok(Encoding::from_name(name).ok().map(|encoding| (encoding, n)))
                }
                None => {
                    let n = pair.parse::<u32>().map_err(|_| bad())?;
                    let encoding = STORED_ORDER.get(i).ok_or_else(bad)?;
                    Ok(Some((*encoding, n)))
                }
            }
        })
}

/// The stored token count under `encoding` of an event that holds one message (its
/// `tokens` column), without decoding the event; 0 when none is stored for it.
pub(crate) fn stored_message_tokens(tokens: Option<&str>, encoding: Encoding) -> u64 {
    tokens
        .and_then(|tokens| tokens.split(';').next())
        .and_then(|counts| {
            parse_counts(counts).find_map(|parsed| match parsed {
                Ok(Some((stored, n))) if stored == encoding => Some(u64::from(n)),
                _ => None,
            })
        })
        .unwrap_or(0)
}

/// How deep a stored body may nest. Whatever was written could be parsed when it was sent
/// (parsers stop at about 128 levels, and the server at 64), but wrapping it in an event (a
/// request record holds messages) adds levels: a read must not fail where the write did not.
const MAX_STORED_DEPTH: usize = 256;

/// Parses a stored body without serde_json's recursion limit (see [`MAX_STORED_DEPTH`]),
/// refusing one nested deeper than that bound instead of recursing into it.
fn parse_stored<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, String> {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for byte in body.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_STORED_DEPTH {
        return Err(format!(
            "the body nests {deepest} levels deep, more than the {MAX_STORED_DEPTH} a read follows"
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_str(body);
    deserializer.disable_recursion_limit();
    let value = T::deserialize(&mut deserializer).map_err(|error| error.to_string())?;
    deserializer.end().map_err(|error| error.to_string())?;
    Ok(value)
}

/// Decodes a stored event and restores its messages' token counts. A request record's
/// references are left unresolved: its messages are empty unless it was stored whole (see
/// [`decode_row`] for reads that resolve them).
pub(crate) fn decode(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
    tokens: Option<&str>,
) -> Result<Event, StoreError> {
    let (mut event, stored) = decode_row(thread, seq, kind, body, tokens)?;
    if let (EventKind::RequestStarted(record), Some(Unresolved::Request(stored))) =
        (&mut event.kind, stored)
        && stored
            .sent
            .iter()
            .all(|item| matches!(item, crate::request_refs::Sent::Inline(_)))
    {
        record.messages = stored.inline().cloned().collect();
    }
    Ok(event)
}

/// Decodes a stored event for a fold, which is all the reads of projections make: as
/// [`decode`], but a request's start is read for its id only and a request's end for its id,
/// outcome and usage, what a fold keeps of them. Their other fields (a record's budget, fit
/// and references; an end's reply) are skipped over, not built, since a thread's turns
/// bring two of them each.
pub(crate) fn decode_for_fold(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
    tokens: Option<&str>,
) -> Result<Event, StoreError> {
    /// What a fold keeps of a request's start: the `request_id` every stored form names.
    #[derive(serde::Deserialize)]
    struct Started {
        request_id: String,
    }
    /// What a fold keeps of a request's end.
    #[derive(serde::Deserialize)]
    struct Ended {
        request_id: String,
        outcome: contexture_core::thread::RequestOutcome,
        #[serde(default)]
        usage: contexture_core::thread::Usage,
    }
    let corrupt = |error: serde_json::Error| StoreError::Corrupt {
        thread: thread.to_string(),
        seq,
        detail: error.to_string(),
    };
    let event = match kind {
        REQUEST_STARTED => {
            let started: Started = serde_json::from_str(body).map_err(corrupt)?;
            EventKind::RequestStarted(contexture_core::thread::RequestRecord {
                request_id: started.request_id,
                ..Default::default()
            })
        }
        REQUEST_ENDED => {
            let ended: Ended = serde_json::from_str(body).map_err(corrupt)?;
            EventKind::RequestEnded(RequestEnd::new(
                ended.request_id,
                ended.outcome,
                ended.usage,
            ))
        }
        _ => return decode(thread, seq, kind, body, tokens),
    };
    Ok(Event::new(seq, event))
}

/// Decodes a stored event and restores its messages' token counts; with what it leaves for
/// [`crate::request_refs::Resolver`] to resolve: a request record's references (its messages
/// are left empty until then), a request end's reply stored in the next event.
pub(crate) fn decode_row(
    thread: &str,
    seq: u64,
    kind: &str,
    body: &str,
    tokens: Option<&str>,
) -> Result<(Event, Option<Unresolved>), StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        thread: thread.to_string(),
        seq,
        detail,
    };
    if kind == REQUEST_STARTED {
        let value: serde_json::Value = parse_stored(body).map_err(corrupt)?;
        let stored = StoredRequest::from_body(value).map_err(corrupt)?;
        if let Some(tokens) = tokens {
            restore_counts(tokens, stored.inline().collect()).map_err(corrupt)?;
        }
        let event = EventKind::RequestStarted(stored.record.clone());
        return Ok((
            Event::new(seq, event),
            Some(Unresolved::Request(Box::new(stored))),
        ));
    }
    // A message's body is the message itself; every other body is read with its type.
    let typed_body = if kind == MESSAGE_APPENDED {
        std::borrow::Cow::Borrowed(body)
    } else {
        typed(kind, body)
    };
    let body: &str = &typed_body;
    // Only a key can hold these characters unescaped: a string in JSON escapes its quotes.
    if kind == REQUEST_ENDED && (body.contains(REPLY_IN_NEXT) || body.contains(REPLY_IN)) {
        let mut value: serde_json::Value = parse_stored(body).map_err(corrupt)?;
        let fields = value.as_object_mut();
        let (next, later) = match fields {
            Some(fields) => (fields.remove("reply_in_next"), fields.remove("reply_in")),
            None => (None, None),
        };
        let later = later
            .map(|on| {
                on.as_u64()
                    .filter(|on| *on >= 1 && seq.checked_add(*on).is_some())
                    .ok_or_else(|| corrupt(format!("`reply_in` is {on}, not a count of events on")))
            })
            .transpose()?;
        let unresolved = match later {
            Some(on) => Some(Unresolved::ReplyIn(on)),
            None => next
                .is_some_and(|flag| flag == serde_json::Value::Bool(true))
                .then_some(Unresolved::ReplyInNext),
        };
        let event: EventKind = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        if event.type_name() != kind {
            return Err(corrupt(format!(
                "stored as `{kind}` but the body is a `{}`",
                event.type_name()
            )));
        }
        return Ok((Event::new(seq, event), unresolved));
    }
    // As for a reply: only a key can hold these characters unescaped; a key of the same name
    // inside the event's values is left where it is.
    if kind == STEP_FINISHED && body.contains(OUTPUT_IN) {
        let mut value: serde_json::Value = parse_stored(body).map_err(corrupt)?;
        let back = value
            .as_object_mut()
            .and_then(|fields| fields.remove("output_in"))
            .map(|back| {
                back.as_u64()
                    .filter(|back| (1..seq).contains(back))
                    .ok_or_else(|| corrupt(format!("`output_in` is {back}, not a seq before it")))
            })
            .transpose()?;
        let event: EventKind = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        if event.type_name() != kind {
            return Err(corrupt(format!(
                "stored as `{kind}` but the body is a `{}`",
                event.type_name()
            )));
        }
        return Ok((Event::new(seq, event), back.map(Unresolved::OutputIn)));
    }
    let event = if kind == MESSAGE_APPENDED {
        let message: Message = parse_stored(body).map_err(corrupt)?;
        EventKind::MessageAppended { message }
    } else {
        let event: EventKind = parse_stored(body).map_err(corrupt)?;
        if event.type_name() != kind {
            return Err(corrupt(format!(
                "stored as `{kind}` but the body is a `{}`",
                event.type_name()
            )));
        }
        event
    };
    if let Some(tokens) = tokens {
        restore_counts(tokens, event.messages()).map_err(corrupt)?;
    }
    Ok((Event::new(seq, event), None))
}

/// The bodies an outline read fetches ([`outline`]): a request's record's and end's, for
/// the request's id. As SQL, for the reads' `CASE WHEN kind IN (...)`.
pub(crate) const OUTLINED_BODIES: &str = "'request_started', 'request_ended'";

/// The outline of a stored event ([`crate::EventOutline`]): its type, and for a request's
/// record or end the request's id, read from `body` without decoding the rest of it (a
/// record's messages and fields stay unread). `body` is only needed for those two kinds.
pub(crate) fn outline(
    thread: &str,
    seq: u64,
    kind: &str,
    body: Option<&str>,
) -> Result<crate::EventOutline, StoreError> {
    /// The one field an outline reads of a request's record or end; serde skips the rest.
    #[derive(serde::Deserialize)]
    struct RequestId {
        request_id: String,
    }
    let corrupt = |detail: String| StoreError::Corrupt {
        thread: thread.to_string(),
        seq,
        detail,
    };
    let event_type = EventType::from_name(kind)
        .ok_or_else(|| corrupt(format!("stored as `{kind}`, which is no event type")))?;
    let request_id = match event_type {
        EventType::RequestStarted | EventType::RequestEnded => {
            let body = body.ok_or_else(|| corrupt(format!("a `{kind}` without a body")))?;
            let read: RequestId = parse_stored(body).map_err(corrupt)?;
            Some(read.request_id)
        }
        _ => None,
    };
    Ok(crate::EventOutline {
        seq,
        event_type,
        request_id,
    })
}

/// Puts the stored `tokens` column's counts into `messages`' caches.
fn restore_counts(tokens: &str, messages: Vec<&Message>) -> Result<(), String> {
    let counts: Vec<&str> = tokens.split(';').collect();
    if counts.len() != messages.len() {
        return Err(format!(
            "{} token counts for {} messages",
            counts.len(),
            messages.len()
        ));
    }
    for (message, counts) in messages.into_iter().zip(counts) {
        for parsed in parse_counts(counts) {
            if let Some((encoding, n)) = parsed? {
                message.set_cached_tokens(encoding, n);
            }
        }
    }
    Ok(())
}

/// Converts a database integer to a seq.
pub(crate) fn seq_of(thread: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt {
        thread: thread.to_string(),
        seq: 0,
        detail: format!("negative seq {value}"),
    })
}

/// Converts a byte count to a database integer.
pub(crate) fn db_bytes(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Converts a seq to a database integer.
pub(crate) fn db_seq(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A fork chain's segments (as the stores read them, root first, each with the last seq to
/// read from it) cut at `through`: what a read of the events up to `through` selects. The
/// references of what it selects are resolved through the whole chain.
pub(crate) fn segments_through(
    segments: &[(String, Option<u64>)],
    through: u64,
) -> Vec<(String, Option<u64>)> {
    segments
        .iter()
        .map(|(id, limit)| {
            (
                id.clone(),
                Some(limit.map_or(through, |limit| limit.min(through))),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step's end stores its output as the place of the assistant message of its append
    /// that holds it (the nearest before it), and as text otherwise.
    #[test]
    fn a_step_end_refers_to_the_answer_its_append_holds() {
        let end = |output: &str| {
            NewEvent::new(EventKind::StepFinished(StepEnd {
                step: 1,
                state_id: "s".into(),
                item: None,
                output: output.into(),
                next: None,
                items: None,
                merge: None,
                item_keys: None,
                item_concurrency: None,
            }))
        };
        let said = |message: Message| NewEvent::new(EventKind::MessageAppended { message });
        let answer = "A long answer that is stored once.";
        let rows = encode_batch(
            "t",
            vec![
                said(Message::assistant(answer)),
                said(Message::user(answer)),
                end(answer),
                end("elsewhere"),
            ],
        )
        .unwrap();
        assert!(
            rows[2].body.contains(r#""output_in":2"#),
            "{}",
            rows[2].body
        );
        assert!(!rows[2].body.contains(answer), "{}", rows[2].body);
        assert!(rows[3].body.contains("elsewhere"), "{}", rows[3].body);
        let (event, unresolved) = decode_row("t", 9, rows[2].kind, &rows[2].body, None).unwrap();
        assert_eq!(unresolved, Some(Unresolved::OutputIn(2)));
        assert!(matches!(event.kind, EventKind::StepFinished(end) if end.output.is_empty()));
        // A mark that points at or before the thread's start is corrupt.
        let body = rows[2].body.replace(r#""output_in":2"#, r#""output_in":9"#);
        assert!(decode_row("t", 9, rows[2].kind, &body, None).is_err());
    }

    /// A step's last request end stores its reply as the place of the step's answer when
    /// that answer is the reply tagged with its step, and reads back exactly; another
    /// answer, or an end already stored by reference, is left as it is.
    #[test]
    fn a_request_end_refers_to_the_answer_its_step_appended() {
        let reply = Message::assistant("The step's answer, stored once.");
        let end = RequestEnd {
            request_id: "run/step-1/call-0".into(),
            outcome: contexture_core::thread::RequestOutcome::Completed,
            usage: Default::default(),
            usage_estimated: false,
            reply: Some(reply.clone()),
            finish_reason: Some("stop".into()),
            error: None,
            cost_usd: None,
            attempts: None,
        };
        let body = serde_json::to_string(&EventKind::RequestEnded(end.clone())).unwrap();
        let mut answer = reply.clone();
        answer.metadata.origin_step = Some("s1".into());
        let shared = shared_reply("t", 3, &body, 5, &answer).unwrap().unwrap();
        assert!(shared.contains(r#""reply_in":2"#), "{shared}");
        assert!(!shared.contains("stored once"), "{shared}");
        let (event, unresolved) = decode_row("t", 3, REQUEST_ENDED, &shared, None).unwrap();
        assert_eq!(unresolved, Some(Unresolved::ReplyIn(2)));
        let answered = Event::new(
            5,
            EventKind::MessageAppended {
                message: answer.clone(),
            },
        );
        let mut resolver = crate::request_refs::Resolver::new(vec![(event, unresolved)]);
        assert_eq!(resolver.missing(2), vec![(5, 5)]);
        resolver.add_fetched(vec![(answered, None)]);
        let resolved = resolver.resolve("t").unwrap();
        assert_eq!(resolved[0].kind, EventKind::RequestEnded(end));
        // Another answer, an answer before the end, and an end already shared stay.
        let other = Message::assistant("Something else.");
        assert_eq!(shared_reply("t", 3, &body, 5, &other).unwrap(), None);
        assert_eq!(shared_reply("t", 3, &body, 3, &answer).unwrap(), None);
        assert_eq!(shared_reply("t", 3, &shared, 7, &answer).unwrap(), None);
        // A count that does not point on is corrupt.
        let body = shared.replace(r#""reply_in":2"#, r#""reply_in":0"#);
        assert!(decode_row("t", 3, REQUEST_ENDED, &body, None).is_err());
    }

    /// Token counts are stored by position, as one number when every encoding agrees, and
    /// read back from that form and from the named pairs earlier versions wrote; a count
    /// under an unknown encoding is skipped, a malformed one refused.
    #[test]
    fn token_counts_are_stored_by_position_and_read_in_every_form() {
        assert_eq!(
            STORED_ORDER.to_vec(),
            Encoding::ALL.to_vec(),
            "every encoding's count is stored"
        );
        let counted = |tokens: &str| {
            let message = Message::assistant("x");
            restore_counts(tokens, vec![&message])
                .map(|()| Encoding::ALL.map(|encoding| message.cached_tokens(encoding)))
        };
        assert_eq!(counted("12").unwrap(), [Some(12), Some(12)]);
        assert_eq!(counted("12,13").unwrap(), [Some(12), Some(13)]);
        assert_eq!(
            counted("cl100k_base=12,o200k_base=13").unwrap(),
            [Some(12), Some(13)]
        );
        assert_eq!(
            counted("o200k_base=13,p50k_base=9").unwrap(),
            [None, Some(13)]
        );
        for bad in ["", "x", "12,13,14", "cl100k_base=x", "-1", "12;13"] {
            assert!(counted(bad).is_err(), "{bad:?}");
        }
        assert_eq!(stored_message_tokens(Some("7;9"), Encoding::O200kBase), 7);
        assert_eq!(stored_message_tokens(Some("7,8"), Encoding::O200kBase), 8);
        assert_eq!(
            stored_message_tokens(Some("cl100k_base=5,o200k_base=6"), Encoding::O200kBase),
            6
        );
        assert_eq!(stored_message_tokens(None, Encoding::O200kBase), 0);
        let hello = Message::user("Hello there, how are you today?");
        let stored = count_messages(vec![&hello, &Message::assistant("")]).unwrap();
        assert!(!stored.contains('='), "{stored}");
        let read = Message::user("Hello there, how are you today?");
        restore_counts(stored.split(';').next().unwrap(), vec![&read]).unwrap();
        for encoding in Encoding::ALL {
            assert_eq!(
                read.cached_tokens(encoding),
                Some(message_tokens(&hello, encoding))
            );
        }
    }

    /// A message nested as deep as a request could carry (the JSON parser's own limit), then
    /// recorded inside a request record, reads back.
    #[test]
    fn deeply_nested_bodies_that_were_written_read_back() {
        let part = format!(
            r#"{{"role": "user", "content": [{{"type": "text", "text": "hi", "x": {}1{}}}]}}"#,
            "[".repeat(124),
            "]".repeat(124)
        );
        let message =
            contexture_core::format::openai::parse_message(&serde_json::from_str(&part).unwrap())
                .unwrap();
        let record = contexture_core::thread::RequestRecord {
            request_id: "r".into(),
            messages: vec![message.clone()],
            ..Default::default()
        };
        for kind in [
            EventKind::MessageAppended { message },
            EventKind::RequestStarted(record),
        ] {
            let mut row = encode("t", NewEvent::new(kind.clone())).unwrap();
            if let EventKind::RequestStarted(record) = &kind {
                store_request("t", &mut row, &StoredRequest::whole(record.clone())).unwrap();
            }
            let event = decode("t", 1, row.kind, &row.body, row.tokens.as_deref()).unwrap();
            assert_eq!(event.kind, kind);
        }
        let too_deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let error = parse_stored::<serde_json::Value>(&too_deep).unwrap_err();
        assert!(error.contains("300 levels"), "{error}");
    }

    /// Request records written before derived numbers (every number stored, no `"d"`) read
    /// as before, beside ones written after that leave them out; a mark no build writes is
    /// an error naming the record.
    #[test]
    fn records_with_and_without_derived_numbers_read_back_alike() {
        use crate::request_refs::Resolver;
        let numbers = |messages: u32| {
            serde_json::json!({
                "budget": {"context_window": 1000, "max_output_tokens": 100, "input_tokens": messages + 3},
                "breakdown": {
                    "model": "m", "exact": true, "encoding": "o200k_base",
                    "context_window": 1000, "budget_ratio": 1.0, "usable": 1000,
                    "reserve_output": 100, "limit": 900,
                    "system": 0, "tools": 0, "pinned": 0, "summary": 0,
                    "messages": messages, "reply_priming": 3,
                    "used": messages + 3, "remaining": 900 - i64::from(messages) - 3
                },
                "fit": {"limit": 900, "tokens_before": messages + 3, "tokens_after": messages + 3}
            })
        };
        let record = |id: &str, messages: u32| {
            let mut value = numbers(messages);
            value["type"] = "request_started".into();
            value["request_id"] = id.into();
            value["messages"] = serde_json::json!([{"role": "user", "content": "hi"}]);
            match serde_json::from_value(value).unwrap() {
                EventKind::RequestStarted(record) => record,
                other => panic!("{other:?}"),
            }
        };
        let said = serde_json::to_string(&Message::user("hi")).unwrap();
        let bodies = [
            (MESSAGE_APPENDED, said),
            // Before: a base stored whole and a change of it, every number stored.
            (REQUEST_STARTED, {
                let mut body = numbers(5);
                body["type"] = "request_started".into();
                body["request_id"] = "old-base".into();
                body["sent"] = serde_json::json!([[1, 0, 1, 0]]);
                body.to_string()
            }),
            (
                REQUEST_STARTED,
                r#"{"type":"request_started","request_id":"old-change","budget":{"input_tokens":9},"breakdown":{"messages":6,"used":9,"remaining":891},"fit":{"tokens_before":9,"tokens_after":9},"sent":[[1,0,1,0]],"base":2}"#.to_string(),
            ),
            // After: a change of the same base naming its derived numbers only.
            (
                REQUEST_STARTED,
                r#"{"type":"request_started","request_id":"new-change","breakdown":{"messages":7},"sent":[[1,0,1,0]],"base":2,"d":31}"#.to_string(),
            ),
            // After: a base stored whole without its derived numbers.
            (REQUEST_STARTED, {
                let mut stored = StoredRequest::whole(record("new-base", 8));
                stored.sent = vec![crate::request_refs::Sent::Run(
                    crate::request_refs::Address { seq: 1, index: 0 },
                    crate::request_refs::Address { seq: 1, index: 0 },
                )];
                let body = stored.to_body().unwrap();
                assert!(body.contains(r#""d":31"#) && !body.contains("used"), "{body}");
                body
            }),
        ];
        let rows = bodies
            .iter()
            .enumerate()
            .map(|(i, (kind, body))| decode_row("t", i as u64 + 1, kind, body, None).unwrap())
            .collect();
        let events = Resolver::new(rows).resolve("t").unwrap();
        let expected = [
            record("old-base", 5),
            record("old-change", 6),
            record("new-change", 7),
            record("new-base", 8),
        ];
        for (event, expected) in events[1..].iter().zip(expected) {
            assert_eq!(event.kind, EventKind::RequestStarted(expected));
        }
        let unknown = r#"{"type":"request_started","request_id":"r","sent":[],"d":99}"#;
        match decode_row("t", 6, REQUEST_STARTED, unknown, None) {
            Err(StoreError::Corrupt { seq: 6, detail, .. }) => {
                assert!(detail.contains("`d` is 99"), "{detail}")
            }
            other => panic!("expected a corrupt row, got {other:?}"),
        }
    }

    /// A fold's decode of a request's start and end keeps what the whole decode gives of
    /// them that a fold uses (id; id, outcome and usage), in every stored form; a body that
    /// is not one is an error naming the seq.
    #[test]
    fn a_fold_decodes_requests_as_the_whole_decode_does_for_what_it_keeps() {
        use contexture_core::thread::{RequestOutcome, RequestRecord, Usage};
        let record = RequestRecord {
            request_id: "r1".into(),
            model: Some("m".into()),
            messages: vec![Message::user("hi")],
            ..Default::default()
        };
        let whole = StoredRequest::whole(record.clone()).to_body().unwrap();
        let change = r#"{"type":"request_started","request_id":"r2","sent":[[1,0,1,0]],"base":2}"#;
        let end = |reply_in_next: bool| {
            let mut end = RequestEnd::new("r1", RequestOutcome::Failed, Usage::new(7, 9));
            end.reply = Some(Message::assistant("answer"));
            let mut value = serde_json::to_value(EventKind::RequestEnded(end)).unwrap();
            if reply_in_next {
                value["reply_in_next"] = true.into();
                value.as_object_mut().unwrap().remove("reply");
            }
            value.to_string()
        };
        for (kind, body) in [
            (REQUEST_STARTED, whole),
            (REQUEST_STARTED, change.to_string()),
            (REQUEST_ENDED, end(false)),
            (REQUEST_ENDED, end(true)),
        ] {
            let full = decode("t", 3, kind, &body, None).unwrap().kind;
            let folded = decode_for_fold("t", 3, kind, &body, None).unwrap().kind;
            match (full, folded) {
                (EventKind::RequestStarted(full), EventKind::RequestStarted(folded)) => {
                    assert_eq!(folded.request_id, full.request_id);
                }
                (EventKind::RequestEnded(full), EventKind::RequestEnded(folded)) => {
                    assert_eq!(
                        (&folded.request_id, &folded.outcome, folded.usage),
                        (&full.request_id, &full.outcome, full.usage)
                    );
                }
                other => panic!("different kinds: {other:?}"),
            }
        }
        for kind in [REQUEST_STARTED, REQUEST_ENDED] {
            match decode_for_fold("t", 3, kind, r#"{"type":"x"}"#, None) {
                Err(StoreError::Corrupt { seq: 3, detail, .. }) => {
                    assert!(detail.contains("request_id"), "{detail}")
                }
                other => panic!("expected a corrupt row, got {other:?}"),
            }
        }
    }

    /// SQLite's migration 0002 backfills `ordinary_message` from these body prefixes.
    #[test]
    fn message_bodies_start_with_their_role() {
        let encoded = |message: Message| {
            encode("t", NewEvent::new(EventKind::MessageAppended { message })).unwrap()
        };
        let system = encoded(Message::system("s"));
        assert!(system.body.starts_with(r#"{"role":"system""#) && !system.ordinary_message);
        let developer = encoded(Message::new(contexture_core::Role::Developer, "d"));
        assert!(
            developer.body.starts_with(r#"{"role":"developer""#) && !developer.ordinary_message
        );
        let user = encoded(Message::user("u"));
        assert!(user.body.starts_with(r#"{"role":"user""#) && user.ordinary_message);
    }
}
