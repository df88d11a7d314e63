//! The messages that replace a compaction's covered part, and the restore that undoes a
//! compaction (or any context operation).

use super::plan::Plan;
use super::{NOTES_HEADING, NOTES_TAG, ORIGINAL_REQUEST_TAG, SUMMARY_HEADING};
use crate::budget::SUMMARY_TAG;
use crate::message::Message;
use crate::thread::{
    ContextReplace, Event, EventKind, ProjectedMessage, Provenance, ReplaceReason, Thread,
    ThreadError,
};

/// The replacement for `plan`'s covered part of `messages`: the original request (kept
/// verbatim and pinned; when only notes are kept, only if it was pinned already), the covered
/// pinned messages, the notes (pinned, verbatim), and the summary (tagged `summary`) when
/// there is one.
pub fn replacement(
    plan: &Plan,
    messages: &[ProjectedMessage],
    summary: Option<&str>,
    notes: Option<&str>,
) -> Vec<Message> {
    let mut replacement = Vec::new();
    if let Some(index) = plan.original_request
        && (summary.is_some() || messages[index].message.is_pinned())
    {
        let mut original = messages[index].message.clone();
        original.metadata.pinned = true;
        if !original
            .metadata
            .tags
            .iter()
            .any(|t| t == ORIGINAL_REQUEST_TAG)
        {
            original.metadata.tags.push(ORIGINAL_REQUEST_TAG.to_owned());
        }
        replacement.push(original);
    }
    replacement.extend(plan.verbatim.iter().map(|&i| messages[i].message.clone()));
    if let Some(notes) = notes.filter(|n| !n.trim().is_empty()) {
        let mut message = Message::user(format!("{NOTES_HEADING}\n{notes}"));
        message.metadata.pinned = true;
        message.metadata.tags.push(NOTES_TAG.to_owned());
        replacement.push(message);
    }
    if let Some(summary) = summary {
        let mut message = Message::user(format!("{SUMMARY_HEADING}\n{summary}"));
        message.metadata.tags.push(SUMMARY_TAG.to_owned());
        replacement.push(message);
    }
    replacement
}

/// The text of a summary message (without its heading).
pub fn summary_text(message: &Message) -> String {
    let text = message.text();
    text.strip_prefix(SUMMARY_HEADING)
        .map(|rest| rest.trim_start_matches('\n').to_owned())
        .unwrap_or(text)
}

/// Why a restore cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// No event has the seq.
    #[error("the thread has no event {seq}")]
    NoSuchEvent {
        /// The seq asked for.
        seq: u64,
    },
    /// The event is not a context operation.
    #[error(
        "event {seq} is a `{kind}`, not a context replace (compaction, clear, manual or restore)"
    )]
    NotAReplace {
        /// The seq asked for.
        seq: u64,
        /// Its type.
        kind: &'static str,
    },
    /// The log before the event does not replay.
    #[error(transparent)]
    Replay(#[from] ThreadError),
}

/// A context operation that puts back the projection as it was just before the replace at
/// `seq` (a compaction, a clear, ...), followed by every message appended since. Nothing is
/// deleted: the restore is one more replace event, and restoring it again is possible too.
/// `events` is the thread's whole log (a fork's shared prefix included).
pub fn restore_before(
    events: &[Event],
    seq: u64,
    op_id: impl Into<String>,
) -> Result<ContextReplace, RestoreError> {
    let event = events
        .iter()
        .find(|e| e.seq == seq)
        .ok_or(RestoreError::NoSuchEvent { seq })?;
    let EventKind::ContextReplaced(op) = &event.kind else {
        return Err(RestoreError::NotAReplace {
            seq,
            kind: event.kind.type_name(),
        });
    };
    let before = Thread::replay("restore", events.iter().filter(|e| e.seq < seq).cloned())?;
    let projection = before.projection_of(&op.context, None);
    let mut messages = Vec::new();
    // The operation's own system prompt, if it set one, is undone too.
    if op.replacement.iter().any(|m| m.role.is_system_like()) {
        messages.extend(projection.system);
    }
    messages.extend(projection.messages);
    Ok(
        ContextReplace::new(op_id, ReplaceReason::Restore, seq, messages)
            .in_context(op.context.clone())
            .with_provenance(Provenance {
                snapshot_seq: Some(seq - 1),
                ..Provenance::default()
            }),
    )
}
