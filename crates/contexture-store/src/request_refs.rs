//! Request records by reference: how a `request_started` event is stored without copying the
//! messages its thread already holds.
//!
//! A request mostly sends messages its thread's own events hold: a chat turn sends the
//! conversation so far, an agent's next call the previous call's messages and the tool results
//! since. Copied into every record, they would make a thread's storage grow with the square
//! of its length. The stored record lists what was sent as items instead (its `sent` field):
//! - a **run** `[from_seq, from_index, to_seq, to_index]`: every message the thread's message
//!   events ([`MESSAGE_EVENT_KINDS`]) hold from one address to the other, in order; an
//!   address is an event's seq and the message's index among that event's messages;
//! - an **earlier** item `[seq, index]`: the `index`-th message stored inline by the request
//!   record at `seq` (a rendered system prompt that no event holds, say);
//! - an **inline** message (a JSON object) for anything else, stored as it was sent.
//!
//! The record's other fields (model, tools, budget, breakdown, ...) are mostly those of the
//! thread's earlier requests: a record is stored as its change from an earlier one, a
//! **base** (`"base": seq`), when that is shorter: a JSON merge patch of the base's fields,
//! which always names the request's id. A base is itself stored whole, so a record resolves
//! in one step. Either way, the numbers that follow from the record's other fields are left
//! out and named in a mark ([`crate::derived_numbers`]).
//!
//! The store finds the references itself, inside the append's transaction, by comparing each
//! message's stored JSON byte for byte with what the thread holds ([`Referable`]): a
//! reference is only ever written for a message that reads back identical. Reads resolve the
//! references ([`Resolver`]), fetching the events they point to when the read does not
//! include them, so a record reads back exactly as it was sent. A record stored whole (its
//! `messages` field), as earlier versions wrote them, reads as before.

use std::collections::{BTreeMap, HashMap};

use contexture_core::Message;
use contexture_core::thread::{Event, EventKind, RequestRecord};
use serde_json::{Map, Value};

use crate::derived_numbers::Derived;

/// The events whose messages a run covers, the order of a thread's messages: a request's
/// history is these events' messages, in the order the thread holds them.
pub(crate) const MESSAGE_EVENT_KINDS: [&str; 4] = [
    "message_appended",
    "step_message",
    "context_replaced",
    "merged",
];

/// The type name of request records.
pub(crate) const REQUEST_STARTED: &str = "request_started";

/// Where a message is: its event's seq and its index among the event's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Address {
    /// The event's seq.
    pub seq: u64,
    /// The message's index among the event's messages.
    pub index: usize,
}

/// One item of a stored request's message list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sent {
    /// A message stored as it was sent.
    Inline(Box<Message>),
    /// The messages of the message events from the first address to the second, inclusive.
    Run(Address, Address),
    /// A message an earlier request record stores inline: its seq and the message's index
    /// among that record's inline messages.
    Earlier(Address),
}

/// A request record as stored, before its references are resolved: the record without its
/// messages, the items it sent, and, for a record stored as a change of an earlier one, that
/// change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredRequest {
    /// The record, `messages` empty; for a record stored as a change, only its id until
    /// the change is applied to its base.
    pub record: RequestRecord,
    /// What was sent, in order.
    pub sent: Vec<Sent>,
    /// For a record stored as a change of an earlier one, that change.
    pub change: Option<Change>,
}

/// A record stored as its change from an earlier record, its base.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    /// The seq of the base, a record stored whole.
    pub base: u64,
    /// A JSON merge patch of the base's fields, without the numbers `derived` marks.
    pub patch: Map<String, Value>,
    /// The record's numbers that follow from its other fields once the patch is applied.
    pub derived: Derived,
}

/// A record's fields as stored (its messages and type left out).
fn record_fields(record: &RequestRecord) -> Result<Map<String, Value>, serde_json::Error> {
    let shell = RequestRecord {
        messages: Vec::new(),
        ..record.clone()
    };
    let Value::Object(mut fields) = serde_json::to_value(EventKind::RequestStarted(shell))? else {
        unreachable!("an event serializes as an object");
    };
    fields.remove("type");
    fields.remove("messages");
    Ok(fields)
}

/// A record's fields as a base of later records: without its retention mark, which a
/// record stored as a change of it does not share (the base may be pruned after it).
fn base_fields(record: &RequestRecord) -> Result<Map<String, Value>, serde_json::Error> {
    let mut fields = record_fields(record)?;
    fields.remove("pruned");
    Ok(fields)
}

/// The JSON merge patch that turns `base` into `target` (objects are changed key by key,
/// anything else replaced whole, a key `target` lacks removed with `null`).
fn merge_patch(base: &Map<String, Value>, target: &Map<String, Value>) -> Map<String, Value> {
    let mut patch = Map::new();
    for (key, value) in target {
        match (base.get(key), value) {
            (Some(held), _) if held == value => {}
            (Some(Value::Object(held)), Value::Object(wanted)) => {
                patch.insert(key.clone(), Value::Object(merge_patch(held, wanted)));
            }
            _ => {
                patch.insert(key.clone(), value.clone());
            }
        }
    }
    for key in base.keys() {
        if !target.contains_key(key) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    patch
}

/// `base` with `patch` applied (a JSON merge patch).
fn apply_patch(base: &Map<String, Value>, patch: &Map<String, Value>) -> Map<String, Value> {
    let mut merged = base.clone();
    for (key, change) in patch {
        match change {
            Value::Null => {
                merged.remove(key);
            }
            Value::Object(inner) => {
                let held = match merged.get(key) {
                    Some(Value::Object(held)) => held.clone(),
                    _ => Map::new(),
                };
                merged.insert(key.clone(), Value::Object(apply_patch(&held, inner)));
            }
            other => {
                merged.insert(key.clone(), other.clone());
            }
        }
    }
    merged
}

/// A record from its stored fields.
fn record_from_fields(mut fields: Map<String, Value>) -> Result<RequestRecord, String> {
    fields.insert("type".into(), Value::String(REQUEST_STARTED.into()));
    fields.insert("messages".into(), Value::Array(Vec::new()));
    match serde_json::from_value(Value::Object(fields)) {
        Ok(EventKind::RequestStarted(record)) => Ok(record),
        Ok(other) => Err(format!(
            "stored as `{REQUEST_STARTED}` but the body is a `{}`",
            other.type_name()
        )),
        Err(error) => Err(error.to_string()),
    }
}

/// What a decoded row leaves to resolve.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unresolved {
    /// A request record's references (see [`StoredRequest`]).
    Request(Box<StoredRequest>),
    /// A request's end whose reply is the message of the event right after it (stored as
    /// `"reply_in_next": true`): the engine appends a reply that goes into the thread or
    /// the step's log with the request's end, so it is stored there only.
    ReplyInNext,
    /// A request's end whose reply is, without its metadata, the message of the event this
    /// many events after it (stored as `"reply_in": N`): a step's last call ends with the
    /// step's answer, which the step's end appends to the shared history tagged with the step;
    /// the append stores the text with the message only.
    ReplyIn(u64),
    /// A step's end whose output is the text of the assistant message this many events
    /// before it (stored as `"output_in": N`): the engine appends a step's answer to the
    /// shared history with the step's end, so it is stored there only.
    OutputIn(u64),
}

impl Unresolved {
    /// The spans of seqs (inclusive) a row at `seq` refers into.
    fn spans(&self, seq: u64) -> Vec<(u64, u64)> {
        match self {
            Unresolved::Request(stored) if stored.is_whole() => Vec::new(),
            Unresolved::Request(stored) => stored.spans().collect(),
            Unresolved::ReplyInNext => vec![(seq + 1, seq + 1)],
            Unresolved::ReplyIn(on) => vec![(seq + on, seq + on)],
            Unresolved::OutputIn(back) => vec![(seq - back, seq - back)],
        }
    }
}

impl StoredRequest {
    /// A record stored whole: every message inline.
    pub(crate) fn whole(mut record: RequestRecord) -> StoredRequest {
        let sent = std::mem::take(&mut record.messages)
            .into_iter()
            .map(|message| Sent::Inline(Box::new(message)))
            .collect();
        StoredRequest {
            record,
            sent,
            change: None,
        }
    }

    /// The messages stored inline, in order.
    pub(crate) fn inline(&self) -> impl Iterator<Item = &Message> {
        self.sent.iter().filter_map(|item| match item {
            Sent::Inline(message) => Some(&**message),
            _ => None,
        })
    }

    /// True when every message is stored inline and the fields with them (nothing to
    /// resolve).
    fn is_whole(&self) -> bool {
        self.change.is_none() && self.sent.iter().all(|item| matches!(item, Sent::Inline(_)))
    }

    /// The smallest seq a run of this record starts at.
    fn first_run_seq(&self) -> Option<u64> {
        self.sent
            .iter()
            .filter_map(|item| match item {
                Sent::Run(from, _) => Some(from.seq),
                _ => None,
            })
            .min()
    }

    /// The spans of seqs (inclusive) whose events this record's references point into.
    fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let items = self.sent.iter().filter_map(|item| match item {
            Sent::Inline(_) => None,
            Sent::Run(from, to) => Some((from.seq, to.seq)),
            Sent::Earlier(at) => Some((at.seq, at.seq)),
        });
        items.chain(
            self.change
                .as_ref()
                .map(|change| (change.base, change.base)),
        )
    }

    /// The record as stored: a JSON body with `sent` in place of `messages`, and for a
    /// record stored as a change, the change and its `base`.
    pub(crate) fn to_body(&self) -> Result<String, serde_json::Error> {
        // Without its type, as every event body is stored (the row's kind names it).
        let mut fields = Map::new();
        let derived = match &self.change {
            Some(change) => {
                fields.extend(change.patch.clone());
                change.derived
            }
            None => {
                let mut whole = record_fields(&self.record)?;
                let derived = Derived::of(&whole);
                derived.strip(&mut whole, false);
                fields.extend(whole);
                derived
            }
        };
        let mut sent = Vec::with_capacity(self.sent.len());
        for item in &self.sent {
            sent.push(match item {
                Sent::Inline(message) => serde_json::to_value(message)?,
                Sent::Run(from, to) => serde_json::json!([from.seq, from.index, to.seq, to.index]),
                Sent::Earlier(at) => serde_json::json!([at.seq, at.index]),
            });
        }
        fields.insert("sent".into(), Value::Array(sent));
        if let Some(change) = &self.change {
            fields.insert("base".into(), change.base.into());
        }
        if let Some(mark) = derived.to_stored() {
            fields.insert("d".into(), mark);
        }
        serde_json::to_string(&Value::Object(fields))
    }

    /// Reads a stored request body (parsed), in either form.
    pub(crate) fn from_body(value: Value) -> Result<StoredRequest, String> {
        let Value::Object(mut fields) = value else {
            return Err("the body is not a JSON object".into());
        };
        let Some(sent) = fields.remove("sent") else {
            return match serde_json::from_value(Value::Object(fields)) {
                Ok(EventKind::RequestStarted(record)) => Ok(StoredRequest::whole(record)),
                Ok(other) => Err(format!(
                    "stored as `{REQUEST_STARTED}` but the body is a `{}`",
                    other.type_name()
                )),
                Err(error) => Err(error.to_string()),
            };
        };
        let base = match fields.remove("base") {
            None => None,
            Some(seq) => Some(
                seq.as_u64()
                    .ok_or_else(|| format!("`base` is not a seq: {seq}"))?,
            ),
        };
        let derived = match fields.remove("d") {
            None => Derived::NONE,
            Some(mark) => Derived::from_stored(&mark)?,
        };
        match fields.remove("type") {
            None => {}
            Some(Value::String(kind)) if kind == REQUEST_STARTED => {}
            other => return Err(format!("stored as `{REQUEST_STARTED}` but typed {other:?}")),
        }
        let (record, change) = match base {
            None => {
                derived.restore(&mut fields)?;
                (record_from_fields(fields)?, None)
            }
            Some(base) => {
                // Until the change is applied to its base, the record is its id.
                let request_id = match fields.get("request_id") {
                    Some(Value::String(id)) => id.clone(),
                    _ => return Err("a change of an earlier record names no `request_id`".into()),
                };
                let record = RequestRecord {
                    request_id,
                    ..RequestRecord::default()
                };
                let change = Change {
                    base,
                    patch: fields,
                    derived,
                };
                (record, Some(change))
            }
        };
        let Value::Array(items) = sent else {
            return Err("`sent` is not a list".into());
        };
        let sent = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| sent_item(item).map_err(|error| format!("`sent[{i}]`: {error}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(StoredRequest {
            record,
            sent,
            change,
        })
    }
}

fn sent_item(item: Value) -> Result<Sent, String> {
    let numbers = |items: &[Value]| -> Result<Vec<u64>, String> {
        items
            .iter()
            .map(|n| n.as_u64().ok_or_else(|| format!("`{n}` is not a position")))
            .collect()
    };
    let index = |n: u64| usize::try_from(n).map_err(|_| format!("index {n} is out of range"));
    match item {
        Value::Object(_) => serde_json::from_value(item)
            .map(|message| Sent::Inline(Box::new(message)))
            .map_err(|error| error.to_string()),
        Value::Array(items) => match numbers(&items)?.as_slice() {
            &[seq, at] => Ok(Sent::Earlier(Address {
                seq,
                index: index(at)?,
            })),
            &[from_seq, from_index, to_seq, to_index] => {
                let from = Address {
                    seq: from_seq,
                    index: index(from_index)?,
                };
                let to = Address {
                    seq: to_seq,
                    index: index(to_index)?,
                };
                if from > to {
                    return Err(format!(
                        "a run from {from_seq}.{from_index} back to {to_seq}.{to_index}"
                    ));
                }
                Ok(Sent::Run(from, to))
            }
            other => Err(format!("a reference of {} numbers", other.len())),
        },
        other => Err(format!("`{other}` is neither a message nor a reference")),
    }
}

/// The messages an event holds, with their addresses, when it is a message event.
fn addressed(event: &Event) -> impl Iterator<Item = (Address, &Message)> {
    let messages = if MESSAGE_EVENT_KINDS.contains(&event.kind.type_name()) {
        event.kind.messages()
    } else {
        Vec::new()
    };
    let seq = event.seq;
    messages
        .into_iter()
        .enumerate()
        .map(move |(index, message)| (Address { seq, index }, message))
}

/// What a new request record can refer to, gathered by a store inside its append.
#[derive(Debug, Default)]
pub(crate) struct Referable {
    /// The message events' messages as stored, in address order, with none missing between
    /// the first and the last.
    messages: Vec<(Address, String)>,
    /// The newest earlier record's inline messages and the ones it refers to, as stored.
    earlier: Vec<(Address, String)>,
    /// The record a new one may be stored as a change of: its seq and its fields.
    base: Option<(u64, Map<String, Value>)>,
}

/// What a store reads of a thread's earlier request records before it refers to them: the
/// newest few, newest first, and the records they take messages or fields from.
#[derive(Debug, Default)]
pub(crate) struct Prior {
    recent: Vec<(u64, StoredRequest)>,
    holders: HashMap<u64, StoredRequest>,
}

impl Prior {
    /// How many of a thread's newest request records [`Prior::from_recent`] looks at.
    pub(crate) const RECENT: i64 = 4;

    /// The newest request records (at most [`Prior::RECENT`], newest first).
    pub(crate) fn from_recent(recent: Vec<(u64, StoredRequest)>) -> Prior {
        Prior {
            recent,
            holders: HashMap::new(),
        }
    }

    /// The seqs of records the newest one takes messages or fields from, to be read and
    /// given to [`Prior::add_holder`].
    pub(crate) fn holders_needed(&self) -> Vec<u64> {
        let Some((_, newest)) = self.recent.first() else {
            return Vec::new();
        };
        let mut seqs: Vec<u64> = newest
            .sent
            .iter()
            .filter_map(|item| match item {
                Sent::Earlier(at) => Some(at.seq),
                _ => None,
            })
            .chain(newest.change.as_ref().map(|change| change.base))
            .filter(|seq| !self.holders.contains_key(seq))
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs
    }

    /// A record the newest one takes messages or fields from.
    pub(crate) fn add_holder(&mut self, seq: u64, record: StoredRequest) {
        self.holders.insert(seq, record);
    }

    /// The first seq whose message events a new record is likely to send: where the recent
    /// records' runs start (1 when none of them has a run).
    pub(crate) fn first_seq(&self) -> u64 {
        self.recent
            .iter()
            .filter_map(|(_, record)| record.first_run_seq())
            .min()
            .unwrap_or(1)
    }

    /// The newest record's messages a new record may refer to, as stored, and its base.
    pub(crate) fn referable(&self) -> Result<Referable, serde_json::Error> {
        let mut referable = Referable::default();
        let Some((seq, newest)) = self.recent.first() else {
            return Ok(referable);
        };
        let mut inline = 0;
        for item in &newest.sent {
            match item {
                Sent::Inline(message) => {
                    let at = Address {
                        seq: *seq,
                        index: inline,
                    };
                    referable
                        .earlier
                        .push((at, serde_json::to_string(message)?));
                    inline += 1;
                }
                Sent::Earlier(at) => {
                    let held = self
                        .holders
                        .get(&at.seq)
                        .and_then(|holder| holder.inline().nth(at.index));
                    if let Some(message) = held {
                        referable
                            .earlier
                            .push((*at, serde_json::to_string(message)?));
                    }
                }
                Sent::Run(..) => {}
            }
        }
        // The newest record's own base, or the newest record when it is stored whole: bases
        // are stored whole, so that a record resolves in one step.
        referable.base = match &newest.change {
            None => Some((*seq, base_fields(&newest.record)?)),
            Some(change) => match self.holders.get(&change.base) {
                Some(held) if held.change.is_none() => {
                    Some((change.base, base_fields(&held.record)?))
                }
                _ => None,
            },
        };
        Ok(referable)
    }
}

impl Referable {
    /// Adds a message event's messages, as stored: events are added in seq order, and none
    /// between the first and the last may be left out.
    pub(crate) fn push(&mut self, seq: u64, bodies: Vec<String>) {
        for (index, body) in bodies.into_iter().enumerate() {
            self.messages.push((Address { seq, index }, body));
        }
    }

    /// Puts the message events of `before` (all before this one's first) ahead of this one's.
    pub(crate) fn prepend(&mut self, mut before: Referable) {
        before.messages.append(&mut self.messages);
        self.messages = before.messages;
    }

    /// Adds message events' messages as stored, already addressed: as [`Referable::push`].
    pub(crate) fn extend(&mut self, messages: Vec<(Address, String)>) {
        if self.messages.is_empty() {
            self.messages = messages;
        } else {
            self.messages.extend(messages);
        }
    }

    /// Takes out the message events' messages, in address order.
    pub(crate) fn take_messages(&mut self) -> Vec<(Address, String)> {
        std::mem::take(&mut self.messages)
    }

    /// The record as stored: runs and earlier items for what the thread holds byte for byte,
    /// the rest inline; and whether an ordinary message (not a system or developer one) was
    /// left inline, which a wider [`Referable`] might have found. `bodies` are the record's
    /// messages, each serialized on its own ([`crate::record::Row::sent_bodies`]).
    pub(crate) fn refer(
        &self,
        record: &RequestRecord,
        bodies: &[String],
    ) -> Result<(StoredRequest, bool), serde_json::Error> {
        assert_eq!(bodies.len(), record.messages.len(), "one body per message");
        // Built when a message does not go on from the last one referred to: a request
        // that sends a stretch of the thread in order never needs it.
        let mut positions: Option<HashMap<&str, Vec<usize>>> = None;
        let earlier: HashMap<&str, Address> = self
            .earlier
            .iter()
            .map(|(at, body)| (body.as_str(), *at))
            .collect();
        let mut sent: Vec<Sent> = Vec::with_capacity(record.messages.len());
        // The position in `messages` of the last message referred to.
        let mut cursor: Option<usize> = None;
        let mut missed_ordinary = false;
        for (message, body) in record.messages.iter().zip(bodies) {
            let next = cursor.map_or(0, |at| at + 1);
            if self
                .messages
                .get(next)
                .is_some_and(|(_, held)| *held == *body)
            {
                let at = self.messages[next].0;
                match sent.last_mut() {
                    Some(Sent::Run(_, to)) if cursor.is_some() => *to = at,
                    _ => sent.push(Sent::Run(at, at)),
                }
                cursor = Some(next);
                continue;
            }
            let positions = positions.get_or_insert_with(|| {
                let mut positions: HashMap<&str, Vec<usize>> = HashMap::new();
                for (position, (_, body)) in self.messages.iter().enumerate() {
                    positions.entry(body.as_str()).or_default().push(position);
                }
                positions
            });
            if let Some(found) = positions.get(body.as_str()) {
                // The first copy after the last message referred to, else the newest copy:
                // the one most likely to go on into a run.
                let position = found
                    .iter()
                    .copied()
                    .find(|p| *p >= next)
                    .unwrap_or(found[found.len() - 1]);
                let at = self.messages[position].0;
                sent.push(Sent::Run(at, at));
                cursor = Some(position);
                continue;
            }
            if let Some(at) = earlier.get(body.as_str()) {
                sent.push(Sent::Earlier(*at));
                continue;
            }
            missed_ordinary |= !message.role.is_system_like();
            sent.push(Sent::Inline(Box::new(message.clone())));
        }
        let stored = RequestRecord {
            messages: Vec::new(),
            ..record.clone()
        };
        let mut change = None;
        if let Some((base, held)) = &self.base {
            let target = record_fields(&stored)?;
            let derived = Derived::of(&target);
            let mut patch = merge_patch(held, &target);
            derived.strip(&mut patch, true);
            // A read that does not resolve the record (a projection's) still needs its id.
            if let Some(id) = target.get("request_id") {
                patch.insert("request_id".into(), id.clone());
            }
            let mut read_back = apply_patch(held, &patch);
            let mut whole = target.clone();
            derived.strip(&mut whole, false);
            if derived.restore(&mut read_back).is_ok()
                && read_back == target
                && serde_json::to_string(&patch)?.len() < serde_json::to_string(&whole)?.len()
            {
                change = Some(Change {
                    base: *base,
                    patch,
                    derived,
                });
            }
        }
        Ok((
            StoredRequest {
                record: stored,
                sent,
                change,
            },
            missed_ordinary,
        ))
    }
}

/// Resolves the references of the rows a read decoded.
///
/// A read first decodes its rows ([`Resolver::new`]), then fetches the events they refer to
/// that it did not read ([`Resolver::missing`], [`Resolver::add_fetched`]), then puts every
/// record's messages, fields and reply back ([`Resolver::resolve`]).
#[derive(Debug)]
pub(crate) struct Resolver {
    rows: Vec<(Event, Option<Unresolved>)>,
    spans: Vec<(u64, u64)>,
    fetched: Vec<(Event, Option<Unresolved>)>,
    /// Replies fetched from past a fork point, by the seq of their request's end: outside
    /// the chain's own seqs, which go on in the fork.
    past_forks: HashMap<u64, Message>,
}

impl Resolver {
    /// The decoded rows of a read, in seq order: each event with what it leaves to resolve.
    pub(crate) fn new(rows: Vec<(Event, Option<Unresolved>)>) -> Resolver {
        let mut spans: Vec<(u64, u64)> = rows
            .iter()
            .filter_map(|(event, unresolved)| Some(unresolved.as_ref()?.spans(event.seq)))
            .flatten()
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (from, to) in spans {
            match merged.last_mut() {
                Some((_, end)) if from <= end.saturating_add(1) => *end = (*end).max(to),
                _ => merged.push((from, to)),
            }
        }
        Resolver {
            rows,
            spans: merged,
            fetched: Vec::new(),
            past_forks: HashMap::new(),
        }
    }

    /// The spans of seqs (inclusive) the rows refer to that the read did not cover (it read
    /// every event after `read_after` up to its last row): their message events and request
    /// records are to be fetched and given to [`Resolver::add_fetched`].
    pub(crate) fn missing(&self, read_after: u64) -> Vec<(u64, u64)> {
        let read_through = self.rows.last().map_or(read_after, |(event, _)| event.seq);
        let mut missing = Vec::new();
        for &(from, to) in &self.spans {
            if from <= read_after {
                missing.push((from, to.min(read_after)));
            }
            if to > read_through {
                missing.push((from.max(read_through + 1), to));
            }
        }
        missing
    }

    /// The request ends whose reply is in a later event of a thread the chain leaves before
    /// that event, each as the thread (of `segments`, a fork chain root first, as the stores
    /// read them), the end's seq and the seq of the reply's event: a fork made between an end
    /// and its reply shares the end, not the reply, which is then fetched from that thread and
    /// given to [`Resolver::add_reply_past_fork`].
    pub(crate) fn replies_past_forks<'a>(
        &self,
        segments: &'a [(String, Option<u64>)],
    ) -> Vec<(&'a str, u64, u64)> {
        self.rows
            .iter()
            .filter_map(|(event, unresolved)| {
                let seq = event.seq;
                let reply_at = match unresolved {
                    Some(Unresolved::ReplyInNext) => seq + 1,
                    Some(Unresolved::ReplyIn(on)) => seq + on,
                    _ => return None,
                };
                let (owner, limit) = segments
                    .iter()
                    .find(|(_, limit)| limit.is_none_or(|limit| seq <= limit))?;
                limit.is_some_and(|limit| limit < reply_at).then_some((
                    owner.as_str(),
                    seq,
                    reply_at,
                ))
            })
            .collect()
    }

    /// The event holding the reply of the request end at `end_seq`, read from a thread the
    /// chain leaves before it (see [`Resolver::replies_past_forks`]).
    pub(crate) fn add_reply_past_fork(&mut self, end_seq: u64, event: &Event) {
        if let Some((_, message)) = addressed(event).next() {
            self.past_forks.insert(end_seq, message.clone());
        }
    }

    /// Message events and request records fetched for [`Resolver::missing`].
    pub(crate) fn add_fetched(&mut self, rows: Vec<(Event, Option<Unresolved>)>) {
        self.fetched.extend(rows);
    }

    /// The events read, every request record's messages and fields and every reply resolved.
    pub(crate) fn resolve(self, thread: &str) -> Result<Vec<Event>, crate::StoreError> {
        let corrupt = |seq: u64, detail: String| crate::StoreError::Corrupt {
            thread: thread.to_string(),
            seq,
            detail,
        };
        let in_spans = |seq: u64| {
            let at = self.spans.partition_point(|(_, to)| *to < seq);
            self.spans.get(at).is_some_and(|(from, _)| *from <= seq)
        };
        let mut messages: BTreeMap<Address, Message> = BTreeMap::new();
        let mut requests: HashMap<u64, StoredRequest> = HashMap::new();
        for (event, unresolved) in self.fetched.iter().chain(&self.rows) {
            if !in_spans(event.seq) {
                continue;
            }
            for (at, message) in addressed(event) {
                messages.insert(at, message.clone());
            }
            if let Some(Unresolved::Request(stored)) = unresolved {
                requests.insert(event.seq, (**stored).clone());
            }
        }
        let mut events = Vec::with_capacity(self.rows.len());
        for (mut event, unresolved) in self.rows {
            let seq = event.seq;
            match (&mut event.kind, unresolved) {
                (EventKind::RequestStarted(record), Some(Unresolved::Request(stored))) => {
                    resolve_request(record, *stored, &messages, &requests)
                        .map_err(|detail| corrupt(seq, detail))?;
                }
                (EventKind::RequestEnded(end), Some(Unresolved::ReplyInNext)) => {
                    let next = Address {
                        seq: seq + 1,
                        index: 0,
                    };
                    let reply = self.past_forks.get(&seq).or_else(|| messages.get(&next));
                    let reply = reply.ok_or_else(|| {
                        corrupt(
                            seq,
                            "its reply is the next event's message, and the next event holds none"
                                .into(),
                        )
                    })?;
                    end.reply = Some(reply.clone());
                }
                (EventKind::RequestEnded(end), Some(Unresolved::ReplyIn(on))) => {
                    let at = Address {
                        seq: seq + on,
                        index: 0,
                    };
                    let reply = self.past_forks.get(&seq).or_else(|| messages.get(&at));
                    let mut reply = reply.cloned().ok_or_else(|| {
                        corrupt(
                            seq,
                            format!(
                                "its reply is the message at {}, and that event holds none",
                                at.seq
                            ),
                        )
                    })?;
                    reply.metadata = contexture_core::Metadata::default();
                    end.reply = Some(reply);
                }
                (EventKind::StepFinished(end), Some(Unresolved::OutputIn(back))) => {
                    let at = Address {
                        seq: seq - back,
                        index: 0,
                    };
                    match messages.get(&at).map(|message| &message.content) {
                        Some(Some(contexture_core::Content::Text(text))) => {
                            end.output = text.to_string();
                        }
                        _ => {
                            return Err(corrupt(
                                seq,
                                format!(
                                    "its output is the text of the message at {}, and that event holds no text message",
                                    at.seq
                                ),
                            ));
                        }
                    }
                }
                _ => {}
            }
            events.push(event);
        }
        Ok(events)
    }
}

/// Puts `stored`'s messages and fields into `record`.
fn resolve_request(
    record: &mut RequestRecord,
    stored: StoredRequest,
    messages: &BTreeMap<Address, Message>,
    requests: &HashMap<u64, StoredRequest>,
) -> Result<(), String> {
    let mut sent = Vec::with_capacity(stored.sent.len());
    for item in stored.sent {
        match item {
            Sent::Inline(message) => sent.push(*message),
            Sent::Run(from, to) => {
                if !messages.contains_key(&from) || !messages.contains_key(&to) {
                    return Err(format!(
                        "a run refers to messages {}.{}..={}.{} the thread does not hold",
                        from.seq, from.index, to.seq, to.index
                    ));
                }
                sent.extend(messages.range(from..=to).map(|(_, m)| m.clone()));
            }
            Sent::Earlier(at) => {
                let held = requests
                    .get(&at.seq)
                    .and_then(|holder| holder.inline().nth(at.index))
                    .ok_or_else(|| {
                        format!(
                            "refers to inline message {} of a request record at {} that does not hold it",
                            at.index, at.seq
                        )
                    })?;
                sent.push(held.clone());
            }
        }
    }
    if let Some(Change {
        base,
        patch,
        derived,
    }) = &stored.change
    {
        let held = requests
            .get(base)
            .filter(|held| held.change.is_none())
            .ok_or_else(|| {
                format!("is a change of a request record at {base} that is not stored whole")
            })?;
        let fields = base_fields(&held.record).map_err(|error| error.to_string())?;
        let mut fields = apply_patch(&fields, patch);
        derived.restore(&mut fields)?;
        *record = record_from_fields(fields)?;
    }
    record.messages = sent;
    Ok(())
}
