//! Threads: the append-only event log, projections, context operations,
//! fork and merge.
//!
//! "Context" here means a thread's *named context*: one line of history that a projection
//! shows (`main` unless an operation switched to another) and that context operations
//! (compact, clear, restore) replace. The workflow's key-value context store is
//! [`crate::context`]; a model's context window is [`crate::registry`]'s.
//!
//! A [`Thread`] is the fold of its events: [`Thread::apply`] takes the next event and updates
//! the state, with no I/O. Stores persist the events and rebuild a thread by replaying them
//! ([`Thread::replay`]). Everything a caller reads (the message [`Projection`], the key-value
//! store, usage, whether a request is in flight) is a pure function of the events.
//!
//! Rules the fold enforces:
//! - seqs start at 1 and have no gaps;
//! - a context operation ([`EventKind::ContextReplaced`], [`EventKind::ContextSwitched`])
//!   applies at once when no request is in flight, otherwise it is queued and applies, in
//!   order, when the last request in flight ends (whatever the outcome); an operation whose
//!   op id was seen before has no effect;
//! - requests may overlap: writers serialize a thread's turns, but a log written without
//!   that (or by a server that stopped mid-request) still replays. A request that starts
//!   while others are in flight joins them; an end names the request it ends, and an end of
//!   a request not in flight only counts its usage. Every sequence of events a store accepts
//!   replays, so a thread never becomes unreadable;
//! - a replace based on seq `S` keeps every message appended after `S`;
//! - system-like messages (system, developer) never enter the message list: the latest one in
//!   effect is the context's system prompt, so restoring a snapshot that starts with a system
//!   message replaces the prompt instead of duplicating it. A clear keeps the system prompt;
//! - a fork shares its parent's events up to the fork point (it does not copy them); its own
//!   log continues at `fork_seq + 1` with a [`EventKind::Forked`] event. A fork starts idle: a
//!   request in flight in the parent belongs to the parent, and operations the parent had
//!   queued apply in the fork at once.

mod merge;
mod projection;

pub mod event;
pub mod execution;
pub mod search;

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use serde_json::{Map, Value};

use crate::message::Message;

pub use event::{
    CancelRequest, CompactionFailure, ConflictPolicy, ContextReplace, DEFAULT_CONTEXT, Event,
    EventKind, EventType, Merge, MergePolicy, PolicyChange, Provenance, PrunedRequest,
    RecordedBudget, ReplaceReason, RequestEnd, RequestOutcome, RequestRecord, StoreChange,
    ThreadPolicy, Usage,
};
pub use execution::{
    FitRecord, PrefixReuse, RunEnd, RunLimits, RunStart, RunStatus, StepCompaction, StepEnd,
    StepFailure, StepMessage, StepStart,
};
pub use merge::{MergeError, MergeKeys, MergeSpec};
pub use projection::{ProjectedMessage, Projection};

/// The most contexts an [`UnknownContext`] names: a thread may have many, and an error
/// stays short.
pub const CONTEXTS_NAMED: usize = 20;

/// The contexts a thread may have by default (`main` included); a switch that would start
/// one more is refused ([`TooManyContexts`]).
pub const DEFAULT_MAX_CONTEXTS: usize = 64;

/// A context a thread does not have, named where one it has is needed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thread `{thread}` has no context `{context}` ({})", self.known_text())]
pub struct UnknownContext {
    /// The thread.
    pub thread: String,
    /// The context named.
    pub context: String,
    /// The first [`CONTEXTS_NAMED`] contexts it has, in name order.
    pub known: Vec<String>,
    /// How many contexts it has.
    pub count: usize,
}

impl UnknownContext {
    /// The contexts the thread has, as the error names them: all of them, or the first
    /// [`CONTEXTS_NAMED`] and how many there are.
    pub fn known_text(&self) -> String {
        if self.count > self.known.len() {
            format!(
                "it has {} contexts; the first {}: {}",
                self.count,
                self.known.len(),
                self.known.join(", ")
            )
        } else {
            format!("its contexts: {}", self.known.join(", "))
        }
    }
}

/// A context a thread cannot start: it has as many as it may.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "thread `{thread}` cannot start context `{context}`: it has {limit} contexts, the most it may; switch to one it has"
)]
pub struct TooManyContexts {
    /// The thread.
    pub thread: String,
    /// The context named.
    pub context: String,
    /// The most contexts a thread may have.
    pub limit: usize,
}

/// What makes `context` unusable as a context name (empty, over 200 characters, a
/// character that does not show: see [`crate::names`]), if anything.
pub fn context_name_problem(context: &str) -> Option<&'static str> {
    if context.trim().is_empty() {
        Some("it is empty")
    } else if context.chars().count() > 200 {
        Some("it has more than 200 characters")
    } else if crate::names::hidden_char(context).is_some() {
        Some("it contains control or invisible characters")
    } else {
        None
    }
}

/// An event that cannot follow the thread's current state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadError {
    /// The event's seq is not the next one.
    #[error("thread `{thread}`: event seq {found} out of order, expected {expected}")]
    SeqOutOfOrder {
        /// The thread.
        thread: String,
        /// The next seq.
        expected: u64,
        /// The seq the event carried.
        found: u64,
    },
    /// A context operation is based on a seq at or after its own.
    #[error(
        "event {seq}: a context operation cannot be based on seq {to_seq}, which is not before it"
    )]
    ReplaceBeyondLog {
        /// The operation's seq.
        seq: u64,
        /// The seq it claims to be based on.
        to_seq: u64,
    },
    /// A context operation's covered range is malformed.
    #[error(
        "event {seq}: covered range {from_seq}..={to_seq} is invalid (from_seq must be between 1 and to_seq + 1)"
    )]
    BadRange {
        /// The operation's seq.
        seq: u64,
        /// First covered seq.
        from_seq: u64,
        /// Last covered seq.
        to_seq: u64,
    },
    /// A `forked` event is not where a fork's own log begins.
    #[error("event {seq}: a `forked` event at fork point {at_seq} must have seq {}", at_seq + 1)]
    MisplacedFork {
        /// The event's seq.
        seq: u64,
        /// The fork point it names.
        at_seq: u64,
    },
}

impl EventKind {
    /// Checks the rules that depend only on the event and its seq (stores run this before
    /// accepting an append, without loading the thread).
    pub fn check_at(&self, seq: u64) -> Result<(), ThreadError> {
        match self {
            EventKind::ContextReplaced(op) => {
                if op.to_seq >= seq {
                    return Err(ThreadError::ReplaceBeyondLog {
                        seq,
                        to_seq: op.to_seq,
                    });
                }
                if op.from_seq == 0 || op.from_seq > op.to_seq + 1 {
                    return Err(ThreadError::BadRange {
                        seq,
                        from_seq: op.from_seq,
                        to_seq: op.to_seq,
                    });
                }
                Ok(())
            }
            EventKind::Forked { at_seq, .. } if *at_seq + 1 != seq => {
                Err(ThreadError::MisplacedFork {
                    seq,
                    at_seq: *at_seq,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Where a fork branched off its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkPoint {
    /// The parent thread.
    pub parent: String,
    /// The last parent event the fork shares.
    pub at_seq: u64,
}

/// A message of the conversation with the seq of the event that brought it.
#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    message: Message,
}

/// The last replace in effect in a context.
#[derive(Debug, Clone)]
struct Anchor {
    /// The first seq it covers.
    from_seq: u64,
    /// The seq it is based on: messages appended after it follow the replacement.
    to_seq: u64,
    /// The replacement's non-system messages.
    messages: Vec<Message>,
}

/// The state of one named context: its last replace in effect and its own system prompt.
#[derive(Debug, Clone, Default)]
struct ContextState {
    /// The last replace in effect: its covered range and its non-system messages.
    anchor: Option<Anchor>,
    /// The system prompt set by a replacement, with the order in which it took effect.
    system: Option<(u64, Message)>,
}

/// A context operation waiting for the request in flight to end.
#[derive(Debug, Clone)]
enum QueuedOp {
    Replace(ContextReplace),
    Switch(String),
}

/// A thread: the fold of its events. See the module documentation for the rules.
#[derive(Debug, Clone)]
pub struct Thread {
    id: String,
    fork: Option<ForkPoint>,
    last_seq: u64,
    entries: Vec<Entry>,
    /// The latest appended system-like message, with the order in which it took effect.
    system: Option<(u64, Message)>,
    contexts: BTreeMap<String, ContextState>,
    active: String,
    /// Every context a switch made active.
    switched_to: BTreeSet<String>,
    store: Map<String, Value>,
    /// The requests in flight, oldest first.
    in_flight: Vec<String>,
    queue: VecDeque<QueuedOp>,
    seen_ops: HashSet<String>,
    /// Usage per event (request ends and merges), by seq.
    usage_log: Vec<(u64, Usage)>,
    merged: BTreeMap<String, u64>,
    /// Counts effects (appended system messages and applied replaces) to order them.
    effects: u64,
    /// The thread's own policy, when one is set.
    policy: Option<ThreadPolicy>,
    /// The seq of the last request record.
    last_request: Option<u64>,
}

impl Thread {
    /// An empty thread.
    pub fn new(id: impl Into<String>) -> Thread {
        Thread {
            id: id.into(),
            fork: None,
            last_seq: 0,
            entries: Vec::new(),
            system: None,
            contexts: BTreeMap::new(),
            active: DEFAULT_CONTEXT.to_string(),
            switched_to: BTreeSet::new(),
            store: Map::new(),
            in_flight: Vec::new(),
            queue: VecDeque::new(),
            seen_ops: HashSet::new(),
            usage_log: Vec::new(),
            merged: BTreeMap::new(),
            effects: 0,
            policy: None,
            last_request: None,
        }
    }

    /// Replays `events` (the whole log, a fork's shared prefix included) into a thread.
    pub fn replay(
        id: impl Into<String>,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Thread, ThreadError> {
        let mut thread = Thread::new(id);
        for event in events {
            thread.apply(event)?;
        }
        Ok(thread)
    }

    /// The thread's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Every message this fold holds: its entries, its system prompt, and each context's
    /// replacement and system prompt. For sizing caches of folds by memory.
    pub fn held_messages(&self) -> impl Iterator<Item = &Message> + '_ {
        let contexts = self.contexts.values().flat_map(|state| {
            let anchored = state.anchor.iter().flat_map(|anchor| &anchor.messages);
            anchored.chain(state.system.iter().map(|(_, message)| message))
        });
        self.entries
            .iter()
            .map(|entry| &entry.message)
            .chain(self.system.iter().map(|(_, message)| message))
            .chain(contexts)
    }

    /// The seq of the last event applied (0 for an empty thread).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Where this thread was forked from, when it is a fork.
    pub fn fork_point(&self) -> Option<&ForkPoint> {
        self.fork.as_ref()
    }

    /// The oldest request in flight, if any.
    pub fn in_flight(&self) -> Option<&str> {
        self.in_flight.first().map(String::as_str)
    }

    /// Every request in flight, oldest first: more than one only in a log whose turns
    /// overlapped.
    pub fn requests_in_flight(&self) -> &[String] {
        &self.in_flight
    }

    /// Context replaces waiting for the request in flight to end, in order.
    pub fn queued_ops(&self) -> impl Iterator<Item = &ContextReplace> {
        self.queue.iter().filter_map(|op| match op {
            QueuedOp::Replace(op) => Some(op),
            QueuedOp::Switch(_) => None,
        })
    }

    /// The context that will be active once the request in flight ends, when a switch is
    /// waiting for it.
    pub fn queued_switch(&self) -> Option<&str> {
        self.queue.iter().rev().find_map(|op| match op {
            QueuedOp::Switch(context) => Some(context.as_str()),
            QueuedOp::Replace(_) => None,
        })
    }

    /// The active named context.
    pub fn active_context(&self) -> &str {
        &self.active
    }

    /// The named contexts that have been replaced or switched to, plus the default one.
    pub fn contexts(&self) -> BTreeSet<&str> {
        let mut names: BTreeSet<&str> = self.contexts.keys().map(String::as_str).collect();
        names.insert(DEFAULT_CONTEXT);
        names.extend(self.switched_to.iter().map(String::as_str));
        names
    }

    /// Fails unless `context` is one of the thread's [`Thread::contexts`].
    pub fn check_context(&self, context: &str) -> Result<(), UnknownContext> {
        let known = self.contexts();
        if known.contains(context) {
            return Ok(());
        }
        Err(UnknownContext {
            thread: self.id().to_owned(),
            context: context.to_owned(),
            count: known.len(),
            known: known
                .into_iter()
                .take(CONTEXTS_NAMED)
                .map(str::to_owned)
                .collect(),
        })
    }

    /// Fails when `context` would be a new context of a thread that has `limit` already.
    pub fn check_room_for(&self, context: &str, limit: usize) -> Result<(), TooManyContexts> {
        let known = self.contexts();
        if known.contains(context) || known.len() < limit {
            return Ok(());
        }
        Err(TooManyContexts {
            thread: self.id().to_owned(),
            context: context.to_owned(),
            limit,
        })
    }

    /// The thread's key-value store.
    pub fn store(&self) -> &Map<String, Value> {
        &self.store
    }

    /// The thread's own policy for its requests, when one is set (a fork inherits its
    /// parent's).
    pub fn policy(&self) -> Option<&ThreadPolicy> {
        self.policy.as_ref()
    }

    /// The seq of the thread's last request record, when it has one.
    pub fn last_request(&self) -> Option<u64> {
        self.last_request
    }

    /// All tokens spent: requests of this thread (its shared prefix included) and merged forks.
    pub fn usage(&self) -> Usage {
        self.usage_since(0)
    }

    /// Tokens spent by events after `seq`.
    pub fn usage_since(&self, seq: u64) -> Usage {
        self.usage_log
            .iter()
            .filter(|(at, _)| *at > seq)
            .fold(Usage::default(), |sum, (_, usage)| sum.plus(*usage))
    }

    /// Tokens spent by this thread's own events: for a fork, those after the fork point.
    pub fn own_usage(&self) -> Usage {
        self.usage_since(self.fork.as_ref().map_or(0, |f| f.at_seq))
    }

    /// The last seq of `child` merged into this thread, if it was ever merged.
    pub fn merged_through(&self, child: &str) -> Option<u64> {
        self.merged.get(child).copied()
    }

    /// Applies the next event.
    pub fn apply(&mut self, event: Event) -> Result<(), ThreadError> {
        let seq = event.seq;
        if seq != self.last_seq + 1 {
            return Err(ThreadError::SeqOutOfOrder {
                thread: self.id.clone(),
                expected: self.last_seq + 1,
                found: seq,
            });
        }
        event.kind.check_at(seq)?;
        match event.kind {
            EventKind::MessageAppended { message } => self.add_message(seq, message),
            EventKind::ContextReplaced(op) => {
                if self.seen_ops.insert(op.op_id.clone()) {
                    if !self.in_flight.is_empty() {
                        self.queue.push_back(QueuedOp::Replace(op));
                    } else {
                        self.apply_replace(op);
                    }
                }
            }
            EventKind::ContextSwitched { context, op_id } => {
                let fresh = op_id.is_none_or(|op_id| self.seen_ops.insert(op_id));
                if fresh {
                    if !self.in_flight.is_empty() {
                        self.queue.push_back(QueuedOp::Switch(context));
                    } else {
                        self.switch_to(context);
                    }
                }
            }
            EventKind::StoreChanged(change) => self.change_store(change),
            EventKind::Forked { parent, at_seq } => {
                self.fork = Some(ForkPoint { parent, at_seq });
                self.in_flight.clear();
                self.drain_queue();
            }
            EventKind::Merged(merge) => {
                for message in merge.messages {
                    self.add_message(seq, message);
                }
                for change in merge.store_changes {
                    self.change_store(change);
                }
                self.usage_log.push((seq, merge.usage));
                self.merged.insert(merge.child, merge.child_seq);
            }
            EventKind::RequestStarted(record) => {
                if !self.in_flight.contains(&record.request_id) {
                    self.in_flight.push(record.request_id);
                }
                self.last_request = Some(seq);
            }
            EventKind::RequestEnded(end) => {
                self.usage_log.push((seq, end.usage));
                if let Some(at) = self.in_flight.iter().position(|id| *id == end.request_id) {
                    self.in_flight.remove(at);
                    if self.in_flight.is_empty() {
                        self.drain_queue();
                    }
                }
            }
            // The execution log is read by the executor; it leaves the projection alone.
            EventKind::RunStarted(_)
            | EventKind::StepStarted(_)
            | EventKind::StepMessage(_)
            | EventKind::StepCompacted(_)
            | EventKind::StepFinished(_)
            | EventKind::StepFailed(_)
            | EventKind::RunEnded(_)
            | EventKind::CompactionFailed(_)
            | EventKind::CancelRequested(_) => {}
            EventKind::PolicySet(change) => self.policy = change.policy,
            // A deleted response's turn stays in the conversation.
            EventKind::RequestDeleted { .. } => {}
        }
        self.last_seq = seq;
        Ok(())
    }

    /// Applies a message event whose body was not loaded because it cannot reach the
    /// projection: its seq is at or below [`projection_watermark`] of the log and it is not
    /// a system or developer message. Only [`Thread::projection`] (of the active context) and
    /// the non-message state (store, usage, requests) stay exact on a thread built this way;
    /// [`Thread::replay`] is the way to get everything.
    pub fn apply_elided(&mut self, seq: u64) -> Result<(), ThreadError> {
        if seq != self.last_seq + 1 {
            return Err(ThreadError::SeqOutOfOrder {
                thread: self.id.clone(),
                expected: self.last_seq + 1,
                found: seq,
            });
        }
        self.last_seq = seq;
        Ok(())
    }

    fn add_message(&mut self, seq: u64, message: Message) {
        if message.role.is_system_like() {
            self.effects += 1;
            self.system = Some((self.effects, message));
        } else {
            self.entries.push(Entry { seq, message });
        }
    }

    fn apply_replace(&mut self, op: ContextReplace) {
        self.effects += 1;
        let order = self.effects;
        let state = self.contexts.entry(op.context).or_default();
        let mut kept = Vec::with_capacity(op.replacement.len());
        for message in op.replacement {
            if message.role.is_system_like() {
                state.system = Some((order, message));
            } else {
                kept.push(message);
            }
        }
        state.anchor = Some(Anchor {
            from_seq: op.from_seq,
            to_seq: op.to_seq,
            messages: kept,
        });
    }

    fn switch_to(&mut self, context: String) {
        self.switched_to.insert(context.clone());
        self.active = context;
    }

    fn drain_queue(&mut self) {
        while let Some(op) = self.queue.pop_front() {
            match op {
                QueuedOp::Replace(op) => self.apply_replace(op),
                QueuedOp::Switch(context) => self.switch_to(context),
            }
        }
    }

    fn change_store(&mut self, change: StoreChange) {
        match change {
            StoreChange::Set { key, value } => {
                self.store.insert(key, value);
            }
            StoreChange::Unset { key } => {
                self.store.shift_remove(&key);
            }
            StoreChange::Cleared => self.store.clear(),
        }
    }

    /// The messages appended after `seq` (merged messages included), system ones excluded.
    fn messages_after(&self, seq: u64) -> &[Entry] {
        let start = self.entries.partition_point(|entry| entry.seq <= seq);
        &self.entries[start..]
    }
}

/// The highest seq at or below which ordinary (non-system) messages cannot appear in the
/// projection of the thread's active context once all `events` are applied: the base seq of
/// that context's last replace in effect, or 0 when it has none.
///
/// `events` are the log's events other than `message_appended` ones, in order (message
/// events never move an anchor). A store uses this to load a long thread for its projection
/// while decoding only the messages after the anchor ([`Thread::apply_elided`]).
pub fn projection_watermark<'a>(events: impl IntoIterator<Item = (u64, &'a EventKind)>) -> u64 {
    let mut active = DEFAULT_CONTEXT.to_string();
    let mut bases: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut queue: Vec<Result<&ContextReplace, &str>> = Vec::new();
    let mut in_flight: Vec<&str> = Vec::new();
    // Mirrors the fold's rules for when a replace or a switch takes effect (see
    // `Thread::apply`); a queued switch is `Err(context)`.
    for (_, kind) in events {
        match kind {
            EventKind::ContextReplaced(op) => {
                if seen.insert(op.op_id.as_str()) {
                    if !in_flight.is_empty() {
                        queue.push(Ok(op));
                    } else {
                        bases.insert(op.context.as_str(), op.to_seq);
                    }
                }
            }
            EventKind::ContextSwitched { context, op_id } => {
                if op_id.as_deref().is_none_or(|op_id| seen.insert(op_id)) {
                    if !in_flight.is_empty() {
                        queue.push(Err(context.as_str()));
                    } else {
                        active = context.clone();
                    }
                }
            }
            EventKind::RequestStarted(record) => {
                if !in_flight.contains(&record.request_id.as_str()) {
                    in_flight.push(record.request_id.as_str());
                }
            }
            EventKind::RequestEnded(end) => {
                let before = in_flight.len();
                in_flight.retain(|id| *id != end.request_id);
                if before > 0 && in_flight.is_empty() {
                    apply_queued(&mut queue, &mut bases, &mut active);
                }
            }
            EventKind::Forked { .. } => {
                in_flight.clear();
                apply_queued(&mut queue, &mut bases, &mut active);
            }
            EventKind::MessageAppended { .. }
            | EventKind::StoreChanged(_)
            | EventKind::Merged(_)
            | EventKind::RunStarted(_)
            | EventKind::StepStarted(_)
            | EventKind::StepMessage(_)
            | EventKind::StepCompacted(_)
            | EventKind::StepFinished(_)
            | EventKind::StepFailed(_)
            | EventKind::RunEnded(_)
            | EventKind::CompactionFailed(_)
            | EventKind::CancelRequested(_)
            | EventKind::PolicySet(_)
            | EventKind::RequestDeleted { .. } => {}
        }
    }
    bases.get(active.as_str()).copied().unwrap_or(0)
}

/// Applies the operations `projection_watermark` queued while requests were in flight.
fn apply_queued<'a>(
    queue: &mut Vec<Result<&'a ContextReplace, &'a str>>,
    bases: &mut BTreeMap<&'a str, u64>,
    active: &mut String,
) {
    for op in queue.drain(..) {
        match op {
            Ok(op) => {
                bases.insert(op.context.as_str(), op.to_seq);
            }
            Err(context) => *active = context.to_owned(),
        }
    }
}
