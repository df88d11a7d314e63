//! Forks planned apart from the queries each backend runs: the segments a fork's events are
//! read from ([`ForkChain`]), the checks a new fork passes and the event it starts with
//! ([`ForkPlan`]), and the sizes its shared prefix brings ([`PrefixSize`]). Each backend
//! reads the rows these ask for and hands them back, so that both stores plan forks the
//! same way.

use crate::{StoreError, record};

/// Walks a fork chain from a thread up to its root. The store looks up the link (parent and
/// fork point) of [`ForkChain::current`] and hands it to [`ForkChain::step`] until the walk
/// ends; [`ForkChain::segments`] then lists the threads to read, root first, each with the
/// last seq to read from it (`None`: all of its own events).
pub(crate) struct ForkChain {
    thread: String,
    current: String,
    limit: Option<u64>,
    segments: Vec<(String, Option<u64>)>,
}

impl ForkChain {
    pub(crate) fn new(thread: &str) -> ForkChain {
        ForkChain {
            thread: thread.to_string(),
            current: thread.to_string(),
            limit: None,
            segments: Vec::new(),
        }
    }

    /// The thread whose link is needed next.
    pub(crate) fn current(&self) -> &str {
        &self.current
    }

    /// Records the current thread's link (`None`: no such thread); true when the walk goes on
    /// to the parent.
    pub(crate) fn step(
        &mut self,
        link: Option<(Option<String>, Option<i64>)>,
    ) -> Result<bool, StoreError> {
        let Some((parent, fork_seq)) = link else {
            return Err(if self.segments.is_empty() {
                StoreError::NotFound {
                    thread: self.thread.clone(),
                }
            } else {
                StoreError::Corrupt {
                    thread: self.thread.clone(),
                    seq: 0,
                    detail: format!("ancestor `{}` is missing", self.current),
                }
            });
        };
        self.segments.push((self.current.clone(), self.limit));
        match (parent, fork_seq) {
            (Some(parent), Some(fork_seq)) => {
                let fork_seq = record::seq_of(&self.thread, fork_seq)?;
                self.limit = Some(self.limit.map_or(fork_seq, |l| l.min(fork_seq)));
                self.current = parent;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The segments to read, root first.
    pub(crate) fn segments(mut self) -> Vec<(String, Option<u64>)> {
        self.segments.reverse();
        self.segments
    }
}

/// A new fork: checked against its parent, and what it starts with.
pub(crate) struct ForkPlan {
    /// The seq of the fork's first event (its `forked` event).
    pub seq: u64,
    /// The `forked` event's body.
    pub body: String,
}

impl ForkPlan {
    /// A fork of `parent`, whose last seq is `last` (`None`: no such thread), at `at_seq`.
    pub(crate) fn new(
        parent: &str,
        at_seq: u64,
        last: Option<i64>,
    ) -> Result<ForkPlan, StoreError> {
        let last = record::seq_of(
            parent,
            last.ok_or_else(|| StoreError::NotFound {
                thread: parent.to_string(),
            })?,
        )?;
        if at_seq > last {
            return Err(StoreError::ForkBeyondEnd {
                parent: parent.to_string(),
                at_seq,
                last_seq: last,
            });
        }
        Ok(ForkPlan {
            seq: at_seq + 1,
            body: record::forked_body(parent, at_seq),
        })
    }

    /// The fork's sizes (bytes of events, bytes of messages): its parent's through the fork
    /// point ([`PrefixSize`]), and its `forked` event.
    pub(crate) fn sizes(&self, prefix: (u64, u64)) -> (u64, u64) {
        (prefix.0 + record::body_bytes(&self.body), prefix.1)
    }
}

/// The bytes of a thread's events and of its messages up to a seq, its fork prefix included:
/// the sizes of the thread that holds the seq less its own events after it. The store reads
/// the size row of [`PrefixSize::current`] and hands it to [`PrefixSize::step`] until the
/// thread that holds the seq is found, then measures that thread's events after the seq
/// ([`PrefixSize::measuring`]) and hands their sizes to [`PrefixSize::finish`].
pub(crate) struct PrefixSize {
    current: String,
    at_seq: u64,
    sizes: (i64, i64),
}

/// A thread's size row: its bytes of events and of messages, its parent and fork point.
pub(crate) type SizeRow = (i64, i64, Option<String>, Option<i64>);

impl PrefixSize {
    /// The sizes of `thread` through `at_seq`.
    pub(crate) fn new(thread: &str, at_seq: u64) -> PrefixSize {
        PrefixSize {
            current: thread.to_owned(),
            at_seq,
            sizes: (0, 0),
        }
    }

    /// The thread whose size row is needed next, or whose later events are measured.
    pub(crate) fn current(&self) -> &str {
        &self.current
    }

    /// The seq after which [`PrefixSize::current`]'s events are measured.
    pub(crate) fn measuring(&self) -> i64 {
        record::db_seq(self.at_seq)
    }

    /// Takes the current thread's size row; true when the walk goes on to its parent (the
    /// seq is in its fork prefix), false when its own events hold the seq.
    pub(crate) fn step(&mut self, row: SizeRow) -> Result<bool, StoreError> {
        let (bytes, message_bytes, parent, fork_seq) = row;
        if let (Some(parent), Some(fork_seq)) = (parent, fork_seq)
            && self.at_seq <= record::seq_of(&self.current, fork_seq)?
        {
            self.current = parent;
            return Ok(true);
        }
        self.sizes = (bytes, message_bytes);
        Ok(false)
    }

    /// The sizes, given the bytes of the current thread's events after the seq and of the
    /// messages among them.
    pub(crate) fn finish(self, bytes_after: i64, message_bytes_after: u64) -> (u64, u64) {
        let (bytes, message_bytes) = self.sizes;
        (
            u64::try_from(bytes - bytes_after).unwrap_or(0),
            u64::try_from(message_bytes)
                .unwrap_or(0)
                .saturating_sub(message_bytes_after),
        )
    }
}
