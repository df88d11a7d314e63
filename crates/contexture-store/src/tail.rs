//! Reading a projection without decoding all of a long thread: the fold of a log whose
//! messages that cannot reach the projection were skipped, and where a projection read from
//! its end starts.

use contexture_core::Role;
use contexture_core::thread::{
    Event, EventKind, ForkPoint, Projection, Thread, ThreadPolicy, projection_watermark,
};
use contexture_core::tokens::Encoding;
use serde_json::{Map, Value};

use crate::StoreError;
use crate::record;

/// A projection read from its end ([`crate::Store::load_projection_tail`]), with the thread's state
/// that does not depend on which messages were read.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionTail {
    /// The projection, without its `unread` oldest ordinary messages.
    pub projection: Projection,
    /// How many of the active context's oldest ordinary messages were not read.
    pub unread: usize,
    /// The seq of the thread's last event.
    pub last_seq: u64,
    /// The thread's context store.
    pub store: Map<String, Value>,
    /// Where the thread was forked from, when it is a fork.
    pub fork: Option<ForkPoint>,
    /// The thread's own policy for its requests, when one is set.
    pub policy: Option<ThreadPolicy>,
    /// The seq of the thread's last request record, when it has one.
    pub last_request: Option<u64>,
    /// The requests in flight, oldest first (see [`Thread::requests_in_flight`]).
    pub in_flight: Vec<String>,
}

impl ProjectionTail {
    /// The tail of a thread with no events (one that does not exist yet): the default
    /// context, empty.
    pub fn empty() -> ProjectionTail {
        ProjectionTail {
            projection: Projection {
                context: contexture_core::thread::DEFAULT_CONTEXT.to_owned(),
                system: None,
                messages: Vec::new(),
            },
            unread: 0,
            last_seq: 0,
            store: Map::new(),
            fork: None,
            policy: None,
            last_request: None,
            in_flight: Vec::new(),
        }
    }

    /// The tail of `fold`, a thread folded with its `unread` oldest ordinary messages left
    /// out. Tool results left at the head of a cut projection are dropped too: the call they
    /// answer was not read, so they could never be sent (a fit never reaches the cut), and a
    /// projection that starts with them would be an orphan's. They count as unread.
    pub(crate) fn from_fold(fold: &Thread, unread: usize) -> ProjectionTail {
        let mut projection = fold.projection();
        let orphans = if unread == 0 {
            0
        } else {
            projection
                .messages
                .iter()
                .take_while(|message| message.role == Role::Tool)
                .count()
        };
        projection.messages.drain(..orphans);
        ProjectionTail {
            projection,
            unread: unread + orphans,
            last_seq: fold.last_seq(),
            store: fold.store().clone(),
            fork: fold.fork_point().cloned(),
            policy: fold.policy().cloned(),
            last_request: fold.last_request(),
            in_flight: fold.requests_in_flight().to_vec(),
        }
    }
}

/// The active context's anchor in a log whose events other than ordinary messages are
/// `special` ([`projection_watermark`]): ordinary messages at or below it cannot reach the
/// projection, so they need not be read.
pub(crate) fn watermark_of(special: &[Event]) -> u64 {
    projection_watermark(
        special
            .iter()
            .filter(|event| !matches!(event.kind, EventKind::MessageAppended { .. }))
            .map(|event| (event.seq, &event.kind)),
    )
}

/// Folds a thread from its `special` events (every event but ordinary messages) and the
/// ordinary `messages` that were read, both in seq order; every other seq is an ordinary
/// message that was not read, which only seqs at or below `skipped_through` may be. Seqs
/// are gap-free, so a missing seq above it is a gap in the log.
pub(crate) fn fold_sparse(
    thread: &str,
    special: Vec<Event>,
    messages: Vec<Event>,
    skipped_through: u64,
) -> Result<Thread, StoreError> {
    let replay_error = |source| StoreError::Replay {
        thread: thread.to_string(),
        source,
    };
    let mut fold = Thread::new(thread);
    let mut special = special.into_iter().peekable();
    let mut messages = messages.into_iter().peekable();
    loop {
        let seq = fold.last_seq() + 1;
        if let Some(event) = special.next_if(|event| event.seq == seq) {
            fold.apply(event).map_err(replay_error)?;
        } else if let Some(event) = messages.next_if(|event| event.seq == seq) {
            fold.apply(event).map_err(replay_error)?;
        } else if seq <= skipped_through {
            fold.apply_elided(seq).map_err(replay_error)?;
        } else if special.peek().is_some() || messages.peek().is_some() {
            return Err(StoreError::Corrupt {
                thread: thread.to_string(),
                seq,
                detail: "the event log has a gap".into(),
            });
        } else {
            return Ok(fold);
        }
    }
}

/// Adds up the stored token counts of ordinary messages, newest first, until they pass a
/// budget: the message where that happens starts the tail.
pub(crate) struct TailStart {
    encoding: Encoding,
    tokens: u64,
    counted: u64,
    start: Option<u64>,
}

impl TailStart {
    /// A tail whose messages' counts under `encoding` must pass `tokens`.
    pub(crate) fn new(encoding: Encoding, tokens: u64) -> TailStart {
        TailStart {
            encoding,
            tokens,
            counted: 0,
            start: None,
        }
    }

    /// Counts the message at `seq` (the next older one) with its `tokens` column; true once
    /// the tail is complete (no older message is needed).
    pub(crate) fn add(&mut self, seq: u64, tokens: Option<&str>) -> bool {
        self.counted += record::stored_message_tokens(tokens, self.encoding);
        if self.counted > self.tokens {
            self.start = Some(seq);
        }
        self.start.is_some()
    }

    /// The seq of the oldest message the tail holds, when older ones are not needed
    /// (`None`: every message is).
    pub(crate) fn start(&self) -> Option<u64> {
        self.start
    }
}
