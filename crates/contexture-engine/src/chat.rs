//! A stateful chat turn: a thread keeps a conversation for a client that sends chat
//! completions (the server's OpenAI-compatible endpoint), and each turn goes through
//! [`ChatTurn`]:
//!
//! 0. The turn waits for its thread ([`crate::turns`]): turns on one thread run one at a
//!    time, in the order they arrived, so each is fitted with the answer of the one before.
//!    A request the thread still shows in flight was left by a server that stopped (it
//!    would hold the thread otherwise): its end is recorded as failed with the new turn.
//! 1. The request's new messages ([`new_messages`]) are checked ([`check_tool_results`]) and
//!    appended to the thread (each with the turn's idempotency key, when it has one) before
//!    anything is sent, so a failed call loses nothing the client said. A turn that cannot
//!    be fitted is refused first, with nothing stored. A turn with no key, no abandoned
//!    request to end, and no compaction that fires on the whole thread as read with its
//!    new messages stores them with its request's record (step 3) in one write, made only
//!    when nothing was written to the thread since it was read.
//! 2. The thread is compacted when the policy's trigger fires; a failed compaction replaces
//!    nothing and the request is still trimmed to fit.
//! 3. The projection is fitted to the model ([`crate::fitting`]) with the newest turn (the
//!    new messages after the last assistant message) kept whole, and the request is
//!    recorded (`request_started`) as it will be sent.
//! 4. However the call ends, [`TurnRecorder`] records it: the answer and its usage (counted
//!    and priced as every call's are) with the assistant message, in one transaction; or
//!    why it failed or was cut, with what had arrived.
//!
//! A turn sent again with its idempotency key ([`previous_attempt`]) is answered from the
//! thread when its first attempt was answered, and sent again when that attempt failed.
//!
//! Which messages are new: the request may carry the whole conversation (as stateless
//! clients do) or only the new turn. Messages up to and including the last one equal to the
//! thread's last message are taken as already stored; the rest are new. A system message
//! that differs from the thread's system prompt replaces it.

use std::sync::Arc;

use contexture_core::compact::CompactionPolicy;
use contexture_core::fit::{CutMemory, HistoryCut};
use contexture_core::format::openai;
use contexture_core::format::openai_completion::CompletionAnswer;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::{
    EventKind, EventType, Projection, RecordedBudget, RequestEnd, RequestOutcome, RequestRecord,
    ThreadPolicy, Usage,
};
use contexture_core::tokens::{Encoding, message_tokens};
use contexture_core::{Content, Message, Part, Role};
use contexture_llm::passthrough::{Answer, PassthroughError};
use contexture_llm::wire::WireFormat;
use contexture_store::{
    EventOutline, KeyedEvent, NewEvent, ProjectionTail, Store, StoreError, TurnQueueStore,
};
use serde_json::Value;

use crate::calls::{answered_end, priced_end};
use crate::compaction::{
    CompactRequest, CompactionError, CompactionOutcome, Compactor, compact_stored,
};
use crate::fitting::{FitError, FitSettings, FittedRequest, ThreadFitError};
use crate::turns::TurnLease;

/// Why a chat turn cannot go ahead.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The request's messages are wrong; `field` names the request field.
    #[error("{message}")]
    Invalid {
        /// The request field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The turn cannot be fitted to the model's window.
    #[error(transparent)]
    Fit(#[from] FitError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The idempotency key was used for another request in this thread.
    #[error(
        "Idempotency-Key `{key}` was already used for another request in this thread; a retry must send the same body, a new request a new key"
    )]
    KeyReused {
        /// The key.
        key: String,
    },
    /// The idempotency key was used for something other than a chat turn in this thread.
    #[error("Idempotency-Key `{key}` was used for something else in this thread; send a new key")]
    KeyTaken {
        /// The key.
        key: String,
    },
    /// The point a turn continues from is not a request of the thread.
    #[error("the thread has no request recorded at seq {seq}")]
    UnknownPoint {
        /// The seq named.
        seq: u64,
    },
    /// The turn's first attempt has not ended yet.
    #[error(
        "the request with Idempotency-Key `{key}` is still being answered; retry when it has ended"
    )]
    InFlight {
        /// The key.
        key: String,
    },
}

/// The idempotency key of the request record of a keyed turn.
pub fn request_key(key: &str) -> String {
    format!("{key}:request")
}

/// The idempotency key of the answer of a keyed turn.
pub fn answer_key(key: &str) -> String {
    format!("{key}:answer")
}

/// Where a keyed turn stands in its thread.
#[derive(Debug)]
pub enum Attempt {
    /// The key is new: this is the first attempt.
    First,
    /// An earlier attempt with this body failed (or was abandoned): call again.
    Again,
    /// An earlier attempt with this body was answered.
    Answered(Box<StoredAnswer>),
}

/// The answer a keyed turn's first attempt stored.
#[derive(Debug)]
pub struct StoredAnswer {
    /// The assistant message.
    pub message: Message,
    /// How the call ended, when it was recorded.
    pub end: Option<RequestEnd>,
    /// The model the request named.
    pub model: String,
    /// The seq of the request's record in its thread.
    pub request_seq: u64,
}

impl StoredAnswer {
    /// The answer as a door renders it: the id of its request, and its finish reason as
    /// recorded, in OpenAI's words (else `tool_calls` or `stop`, by what the message holds).
    pub fn completion(&self) -> CompletionAnswer<'_> {
        let end = self.end.as_ref();
        CompletionAnswer {
            id: end.map_or("chatcmpl-replayed", |end| end.request_id.as_str()),
            model: &self.model,
            message: &self.message,
            finish_reason: contexture_core::format::openai_completion::finish_reason(
                end.and_then(|end| end.finish_reason.as_deref()),
                &self.message,
            ),
            usage: end.map(|end| end.usage),
        }
    }
}

/// Where the turn keyed `key`, whose request has the digest `digest`, stands in the stored
/// thread `thread`. An attempt with no recorded end is still being answered (a
/// [`ChatError::InFlight`]) until it is `abandon_after_secs` old at `now_ms` (milliseconds
/// since the Unix epoch): then its server is taken to have stopped, its end is recorded as
/// failed, and the turn is tried again. The caller makes sure no call of its own is still
/// answering the turn.
pub async fn previous_attempt<S: Store>(
    store: &S,
    thread: &str,
    key: &str,
    digest: &str,
    abandon_after_secs: f64,
    now_ms: i64,
) -> Result<Attempt, ChatError> {
    let Some(KeyedEvent {
        event: first,
        appended_at_ms,
    }) = store.keyed_event(thread, &request_key(key)).await?
    else {
        return Ok(Attempt::First);
    };
    let EventKind::RequestStarted(record) = &first.kind else {
        return Err(ChatError::KeyTaken { key: key.into() });
    };
    if record.client_digest.as_deref() != Some(digest) {
        return Err(ChatError::KeyReused { key: key.into() });
    }
    let answer = store.keyed_event(thread, &answer_key(key)).await?;
    let later = store.events_after(thread, first.seq).await?;
    let end = later.into_iter().find_map(|event| match event.kind {
        EventKind::RequestEnded(end) if end.request_id == record.request_id => Some(end),
        _ => None,
    });
    match (answer, end) {
        (Some(answer), end) => {
            let EventKind::MessageAppended { message } = answer.event.kind else {
                return Err(ChatError::KeyTaken { key: key.into() });
            };
            Ok(Attempt::Answered(Box::new(StoredAnswer {
                message,
                end,
                model: record.model.clone().unwrap_or_default(),
                request_seq: first.seq,
            })))
        }
        (None, Some(end)) if end.outcome != RequestOutcome::Completed => Ok(Attempt::Again),
        (None, Some(_)) => Err(ChatError::InFlight { key: key.into() }),
        (None, None) => {
            let age_secs = (now_ms - appended_at_ms) as f64 / 1000.0;
            if age_secs < abandon_after_secs {
                return Err(ChatError::InFlight { key: key.into() });
            }
            let end = RequestEnd::failed(
                &record.request_id,
                format!(
                    "abandoned: no end was recorded within {abandon_after_secs} s of its start (the server answering it stopped); a retry with its Idempotency-Key called again"
                ),
            );
            store
                .append_one(thread, NewEvent::new(EventKind::RequestEnded(end)))
                .await?;
            Ok(Attempt::Again)
        }
    }
}

/// One chat turn on a stored thread (see the module documentation).
pub struct ChatTurn<'a, S> {
    /// The store holding the thread.
    pub store: &'a S,
    /// The stored thread id.
    pub thread: &'a str,
    /// The model and the default fit policy (the thread's own takes its place).
    pub settings: FitSettings,
    /// The tool schemas sent with the request.
    pub tools: &'a [Value],
    /// The structured-output schema sent with the request (`response_format`), counted
    /// with the tools: the provider counts it in the request's tokens.
    pub response_format: Option<&'a Value>,
    /// The default compaction policy, when there is one (the thread's own takes its place).
    pub compaction: Option<&'a CompactionPolicy>,
    /// Who compacts.
    pub compactor: &'a Compactor,
    /// The turn's idempotency key, when it has one.
    pub key: Option<&'a str>,
    /// True when this is the keyed turn's first attempt (its request record takes the key).
    pub first_attempt: bool,
    /// The digest of the client's request, recorded for retries to compare.
    pub client_digest: Option<String>,
    /// Whose calibration of token estimates the answer feeds (the settings' model was
    /// calibrated with the same one).
    pub learner: crate::estimates::Learner,
    /// Where the fit runs: on this pool under this key's share, or (`None`) on the
    /// caller's task.
    pub cpu: Option<(&'a crate::cpu::CpuPool, String)>,
    /// A system prompt of this call only, sent before the thread's own and not stored.
    pub instructions: Option<&'a str>,
    /// Compact when the request passes this many tokens, whatever the policy's trigger,
    /// keeping at most half of it verbatim (the policy's other settings, or the defaults,
    /// apply).
    pub compact_threshold: Option<u64>,
    /// More instructions for the summary of that compaction.
    pub compact_instructions: Option<&'a str>,
    /// What the door keeps with the request's record ([`RequestRecord::client`]).
    pub client_record: Option<&'a Value>,
    /// False when the body the upstream gets leaves reasoning out (see
    /// [`contexture_llm::wire::ChatCall::sends_reasoning_to`]): the record counts what it
    /// left out.
    pub sends_reasoning: bool,
}

/// A turn ready to send: its fitted request, recorded, and its hold on the thread.
#[derive(Debug)]
pub struct PreparedTurn {
    /// The turn's hold on its thread, passed on to its recorder: no other turn of the
    /// thread starts until the call's end is recorded.
    pub lease: std::sync::Arc<TurnLease>,
    /// The request's messages, fitted and validated.
    pub fitted: FittedRequest,
    /// The recorded request's id.
    pub request_id: String,
    /// What compaction did, when its trigger fired.
    pub compaction: Option<Result<CompactionOutcome, CompactionError>>,
    /// The messages a compaction of this turn put in the place of the history it covered.
    pub summary: Option<Vec<Message>>,
    /// The seq of the request's record.
    pub request_seq: u64,
}

/// A chat turn as its thread recorded it.
#[derive(Debug, Clone)]
pub struct RecordedTurn {
    /// Its request's record.
    pub record: RequestRecord,
    /// How its call ended, when that was recorded.
    pub end: Option<RequestEnd>,
    /// Its answer, when it got one.
    pub answer: Option<Message>,
    /// The point of the thread after the turn: its answer's seq, or for a turn that got
    /// none, its end's (or its request's, when it has no end).
    pub point: u64,
}

/// The chat turn whose request `thread` recorded at `request_seq`
/// ([`ChatError::UnknownPoint`] when no request was recorded there, or it was deleted).
pub async fn recorded_turn<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<RecordedTurn, ChatError> {
    // A request's end and answer are appended right after it, its turn holding the thread:
    // one read holds the whole turn, its outlines say where it ends.
    let through = request_seq.saturating_add(2);
    let events = store
        .events_through(thread, request_seq.saturating_sub(1), through)
        .await?;
    let outlines = events.iter().map(EventOutline::of).collect();
    let point = turn_outline(outlines, request_seq, through)?.point;
    check_not_deleted(store, thread, request_seq).await?;
    let mut events = events.into_iter().take_while(|event| event.seq <= point);
    let record = match events.next().map(|event| (event.seq, event.kind)) {
        Some((seq, EventKind::RequestStarted(record))) if seq == request_seq => record,
        _ => return Err(ChatError::UnknownPoint { seq: request_seq }),
    };
    let mut turn = RecordedTurn {
        record,
        end: None,
        answer: None,
        point,
    };
    for event in events {
        match event.kind {
            EventKind::RequestEnded(end) => turn.end = Some(end),
            EventKind::MessageAppended { message } => turn.answer = Some(message),
            _ => {}
        }
    }
    Ok(turn)
}

/// The point of `thread` after the chat turn whose request it recorded at `request_seq`
/// ([`RecordedTurn::point`]; [`ChatError::UnknownPoint`] when no request was recorded
/// there, or it was deleted), read without decoding the turn.
pub async fn turn_point<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<u64, ChatError> {
    Ok(outline_turn(store, thread, request_seq, 0).await?.point)
}

/// Where a turn continuing the chat turn whose request `thread` recorded at `request_seq`
/// goes on: the point after that turn ([`RecordedTurn::point`]), and whether the thread went
/// on after it (see [`is_newest`]). The turn and what follows it are read together, as
/// outlines (nothing of them decoded), so that continuing the newest turn costs one short
/// read of the log whatever the thread's length.
pub async fn continued_point<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<(u64, bool), ChatError> {
    const FOLLOWING: u64 = 8;
    let turn = outline_turn(store, thread, request_seq, FOLLOWING).await?;
    let mut last = turn.point;
    for outline in &turn.following {
        if goes_on(outline.event_type) {
            return Ok((turn.point, true));
        }
        last = outline.seq;
    }
    // Only what was not read yet is left to look at.
    let went_on = turn
        .following
        .last()
        .is_some_and(|outline| outline.seq >= turn.read_through)
        && went_on_after(store, thread, last).await?;
    Ok((turn.point, went_on))
}

/// A chat turn found from the outlines of its events ([`outline_turn`]).
struct TurnOutline {
    /// The point of the thread after the turn ([`RecordedTurn::point`]).
    point: u64,
    /// The outlines read after the point.
    following: Vec<EventOutline>,
    /// The last seq the read covered.
    read_through: u64,
}

/// Finds the chat turn whose request `thread` recorded at `request_seq` from the outlines of
/// its events, reading up to `following` outlines after it.
async fn outline_turn<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
    following: u64,
) -> Result<TurnOutline, ChatError> {
    // A request's end and answer are appended right after it, its turn holding the thread.
    let through = request_seq.saturating_add(2 + following);
    let outlines = store
        .outlines_through(thread, request_seq.saturating_sub(1), through)
        .await?;
    let turn = turn_outline(outlines, request_seq, through)?;
    check_not_deleted(store, thread, request_seq).await?;
    Ok(turn)
}

/// The chat turn whose request was recorded at `request_seq`, found in `outlines` (the
/// outlines from that seq on, read through `through`).
fn turn_outline(
    outlines: Vec<EventOutline>,
    request_seq: u64,
    through: u64,
) -> Result<TurnOutline, ChatError> {
    let mut outlines = outlines.into_iter().peekable();
    let request_id = match outlines.next() {
        Some(EventOutline {
            seq,
            event_type: EventType::RequestStarted,
            request_id: Some(request_id),
        }) if seq == request_seq => request_id,
        _ => return Err(ChatError::UnknownPoint { seq: request_seq }),
    };
    let mut point = request_seq;
    let (mut ended, mut answered) = (false, false);
    while let Some(outline) = outlines.next_if(|outline| match outline.event_type {
        EventType::RequestEnded => {
            !ended && outline.request_id.as_deref() == Some(request_id.as_str())
        }
        EventType::MessageAppended => ended && !answered,
        _ => false,
    }) {
        point = outline.seq;
        match outline.event_type {
            EventType::RequestEnded => ended = true,
            _ => answered = true,
        }
    }
    Ok(TurnOutline {
        point,
        following: outlines.collect(),
        read_through: through,
    })
}

/// [`ChatError::UnknownPoint`] when the turn whose request was recorded at `request_seq`
/// was deleted (its mark is found by its key, without reading the thread after it).
async fn check_not_deleted<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<(), ChatError> {
    match store
        .keyed_event(thread, &deletion_key(request_seq))
        .await?
    {
        Some(_) => Err(ChatError::UnknownPoint { seq: request_seq }),
        None => Ok(()),
    }
}

/// True when nothing of the conversation followed the answer of the turn whose request
/// `thread` recorded at `request_seq` (a deleted response's mark, a request that brought
/// nothing, a compaction do not count): a turn continuing it continues the thread itself.
pub async fn is_newest<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<bool, ChatError> {
    Ok(!continued_point(store, thread, request_seq).await?.1)
}

/// True when an event after a turn's answer carries the conversation on (see [`is_newest`]):
/// anything but a request's record or end, a deletion mark, a compaction or its failure.
fn goes_on(event_type: EventType) -> bool {
    !matches!(
        event_type,
        EventType::RequestDeleted
            | EventType::RequestStarted
            | EventType::RequestEnded
            | EventType::ContextReplaced
            | EventType::CompactionFailed
    )
}

/// True when `thread` went on after its event `point` (see [`is_newest`]).
pub(crate) async fn went_on_after<S: Store>(
    store: &S,
    thread: &str,
    point: u64,
) -> Result<bool, ChatError> {
    const PAGE: u64 = 32;
    let mut after = point;
    loop {
        let page = store
            .outlines_through(thread, after, after.saturating_add(PAGE))
            .await?;
        if page.iter().any(|outline| goes_on(outline.event_type)) {
            return Ok(true);
        }
        // Seqs have no gaps: a page short of full is the thread's end.
        if (page.len() as u64) < PAGE {
            return Ok(false);
        }
        after = after.saturating_add(PAGE);
    }
}

/// The idempotency key of the deletion of the turn whose request was recorded at `seq`:
/// a read of the turn finds it by its key, without reading the thread after it.
fn deletion_key(seq: u64) -> String {
    format!("deleted:{seq}")
}

/// Deletes the chat turn whose request `thread` recorded at `request_seq` (see
/// [`EventKind::RequestDeleted`]): [`ChatError::UnknownPoint`] when there is none (or it was
/// deleted already). The caller holds the thread, so that no turn of it is in flight.
pub async fn delete_recorded_turn<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
) -> Result<u64, ChatError> {
    turn_point(store, thread, request_seq).await?;
    let deletion = NewEvent::new(EventKind::RequestDeleted { request_seq })
        .with_key(deletion_key(request_seq));
    Ok(store.append_one(thread, deletion).await?)
}

/// What a recorded turn brought: its input and what a compaction it ran put in the place
/// of the history.
#[derive(Debug, Clone, Default)]
pub struct TurnInput {
    /// The messages it brought, as its thread holds them.
    pub messages: Vec<Message>,
    /// The messages that stand for the history its compaction covered, when it compacted.
    pub summary: Option<Vec<Message>>,
}

/// What the turn whose request `record` was recorded at `request_seq` of `thread` brought.
pub async fn turn_input<S: Store>(
    store: &S,
    thread: &str,
    request_seq: u64,
    record: &RequestRecord,
) -> Result<TurnInput, ChatError> {
    let Some(from) = record.input_from else {
        return Ok(TurnInput::default());
    };
    let events = store
        .events_through(thread, from.saturating_sub(1), request_seq)
        .await?;
    let mut input = TurnInput::default();
    for event in events {
        match event.kind {
            EventKind::MessageAppended { message } => input.messages.push(message),
            EventKind::ContextReplaced(op) => input.summary = Some(op.replacement),
            _ => {}
        }
    }
    Ok(input)
}

/// Where the newest turn of a request's new messages starts: after their last assistant
/// message (at 0 when they hold none). Only it is kept whole; new messages before it (a
/// history a stateless client sends whole for the first time) are history like the
/// thread's own, fitted the same way.
fn newest_turn_start(turns: &[Message]) -> usize {
    turns
        .iter()
        .rposition(|message| message.role == Role::Assistant)
        .map_or(0, |at| at + 1)
}

/// How many reasoning parts `messages` hold, when they hold any.
fn reasoning_parts(messages: &[Message]) -> Option<u32> {
    let count = messages
        .iter()
        .filter_map(|message| match &message.content {
            Some(Content::Parts(parts)) => Some(parts),
            _ => None,
        })
        .flatten()
        .filter(|part| matches!(part, Part::Reasoning { .. }))
        .count();
    (count > 0).then(|| u32::try_from(count).unwrap_or(u32::MAX))
}

/// The system prompt a call is sent: its own instructions, then the thread's prompt.
fn call_system(instructions: Option<&str>, system: Option<Message>) -> Option<Message> {
    match (instructions, system) {
        (None, system) => system,
        (Some(instructions), None) => Some(Message::system(instructions)),
        (Some(instructions), Some(system)) => Some(Message::system(format!(
            "{instructions}\n\n{}",
            system.text()
        ))),
    }
}

impl<S: Store> ChatTurn<'_, S> {
    /// What the request's tokens are counted with besides its messages: the tool schemas
    /// and the structured-output schema.
    fn counted_schemas(&self) -> Vec<Value> {
        self.tools
            .iter()
            .chain(self.response_format)
            .cloned()
            .collect()
    }

    /// Steps 1 to 3 of the turn for the request's messages `requested`, holding the thread
    /// with `lease` (step 0, [`crate::turns::TurnQueue::wait_for_turn`]): stores what is
    /// new, compacts when the trigger fires, fits, and records the request as `request_id`.
    ///
    /// A turn with no idempotency key and no abandoned request to end, whose compaction (if
    /// any) does not fire on the whole thread as read plus its new messages, is fitted on
    /// them and stores its new messages with the request's record in one write, made only
    /// if nothing was written to the thread since it was read ([`Store::append_after`]);
    /// otherwise, or when something was, the new messages are stored first and the thread
    /// read back.
    pub async fn prepare(
        &self,
        requested: Vec<Message>,
        request_id: String,
        lease: TurnLease,
    ) -> Result<PreparedTurn, ChatError> {
        let mut settings = self.settings.clone();
        let schemas: Arc<[Value]> = self.counted_schemas().into();
        let own_tokens = newest_turn_tokens(&requested, settings.model.counter.encoding());
        let loaded = settings
            .load_adopting(self.store, self.thread, own_tokens)
            .await;
        let mut tail = match loaded {
            Ok(tail) => tail,
            Err(ThreadFitError::Store(StoreError::NotFound { .. })) => ProjectionTail::empty(),
            Err(ThreadFitError::Store(error)) => return Err(error.into()),
            Err(ThreadFitError::Fit(error)) => return Err(error.into()),
        };
        let start = TurnStart {
            settings,
            schemas,
            own_tokens,
            request_id,
            lease,
        };
        let compaction = self.compaction_policy(tail.policy.take());
        if self.key.is_none() && tail.in_flight.is_empty() {
            return self
                .prepare_in_one_write(start, tail, requested, compaction)
                .await;
        }
        let TurnPlan {
            new, newest_turn, ..
        } = plan_turn(
            &start.settings,
            tail.projection,
            requested,
            self.instructions,
            &start.schemas,
            compaction.is_some(),
        )?;
        let ended = tail.in_flight.len();
        let brought = !new.is_empty();
        let mut events: Vec<NewEvent> = tail.in_flight.into_iter().map(abandoned_end).collect();
        events.extend(NewEvent::messages(new, self.key));
        let stored = StoredTurn {
            events,
            ended,
            brought,
            newest_turn,
        };
        self.store_then_fit(start, compaction, stored).await
    }

    /// The compaction the turn considers: the thread's own policy's (`policy`), else the
    /// turn's, with the request's threshold over either.
    fn compaction_policy(&self, policy: Option<ThreadPolicy>) -> Option<CompactionPolicy> {
        let mut compaction = policy
            .and_then(|policy| policy.compaction)
            .or_else(|| self.compaction.cloned());
        if let Some(tokens) = self.compact_threshold {
            let mut asked = compaction.unwrap_or_default();
            asked.trigger = contexture_core::compact::Trigger {
                tokens: Some(tokens),
                ..Default::default()
            };
            // What stays verbatim leaves room under the threshold, so that the compacted
            // request is well below it.
            let half = tokens / 2;
            asked.keep.tokens = Some(asked.keep.tokens.map_or(half, |kept| kept.min(half)));
            if let Some(instructions) = self.compact_instructions {
                asked.prompt = Some(contexture_core::compact::with_instructions(
                    asked
                        .prompt
                        .as_deref()
                        .unwrap_or(contexture_core::compact::DEFAULT_PROMPT),
                    instructions,
                ));
            }
            compaction = Some(asked);
        }
        compaction
    }

    /// The turn fitted on `tail` (the thread as read, `settings` following its policy) with
    /// the request's new messages after it, its new messages and request record stored in
    /// one write if the thread is still as read; else as [`ChatTurn::store_then_fit`] does.
    /// The tail of the thread read back after the messages' append would be the same
    /// messages, or fewer of the oldest: a fit reads a history from its end, and reports
    /// the whole history's indices, so it is the same fit.
    ///
    /// With a `compaction` to consider, that holds only when the tail is the whole thread
    /// (the trigger counts it all) and the trigger does not fire on it with the new
    /// messages: the thread read back would show the same, and nothing would be compacted.
    /// Otherwise the turn is checked as [`plan_turn`] checks it and goes the other way,
    /// where the trigger is evaluated on the thread read back and the compaction runs.
    async fn prepare_in_one_write(
        &self,
        start: TurnStart,
        tail: ProjectionTail,
        requested: Vec<Message>,
        compaction: Option<CompactionPolicy>,
    ) -> Result<PreparedTurn, ChatError> {
        let read_up_to = tail.last_seq;
        let SplitTurn {
            new,
            history,
            newest_turn,
        } = split_turn(tail.projection, requested, self.instructions)?;
        let brought = !new.is_empty();
        let newest_turn_len = newest_turn.len();
        let mut messages = history.messages;
        messages.extend(newest_turn);
        let tail = ProjectionTail {
            projection: Projection {
                messages,
                ..history
            },
            last_seq: read_up_to.saturating_add(u64::try_from(new.len()).unwrap_or(u64::MAX)),
            ..tail
        };
        // The other way, when this one cannot be taken: the new messages stored first.
        let stored_first = |new: Vec<Message>| StoredTurn {
            brought,
            events: NewEvent::messages(new, None),
            ended: 0,
            newest_turn: newest_turn_len,
        };
        if let Some(policy) = &compaction {
            let whole = tail.unread == 0;
            if !whole || compaction_fires(policy, &start, &tail).is_some() {
                let mut history = tail.projection;
                let newest_turn = history
                    .messages
                    .split_off(history.messages.len() - newest_turn_len);
                check_fits(&start.settings, history, &newest_turn, &start.schemas, true)?;
                return self
                    .store_then_fit(start, compaction, stored_first(new))
                    .await;
            }
        }
        let fitted = self.fit_tail(&start, tail, newest_turn_len).await?;
        let input_from = brought.then(|| read_up_to + 1);
        let record = self.request_record(&start, &fitted, input_from);
        let mut events = NewEvent::messages(new.iter().cloned(), None);
        events.push(NewEvent::new(EventKind::RequestStarted(record)));
        let seqs = match self
            .store
            .append_after(self.thread, read_up_to, events)
            .await
        {
            Ok(seqs) => seqs,
            Err(StoreError::Moved { .. }) => {
                // Another write came after the read: the turn is fitted on the thread as it
                // is after its messages are stored.
                return self
                    .store_then_fit(start, compaction, stored_first(new))
                    .await;
            }
            Err(error) => return Err(error.into()),
        };
        let request_seq = seqs.last().copied().ok_or_else(|| StoreError::Corrupt {
            thread: self.thread.to_owned(),
            seq: read_up_to,
            detail: "an append returned no seq".into(),
        })?;
        Ok(PreparedTurn {
            lease: std::sync::Arc::new(start.lease),
            fitted,
            request_id: start.request_id,
            compaction: None,
            summary: None,
            request_seq,
        })
    }

    /// Steps 1 to 3 after the turn's plan: stores `stored`'s events, reads the thread back,
    /// compacts when `compaction`'s trigger fires, fits, and records the request.
    async fn store_then_fit(
        &self,
        start: TurnStart,
        compaction: Option<CompactionPolicy>,
        stored: StoredTurn,
    ) -> Result<PreparedTurn, ChatError> {
        let StoredTurn {
            events,
            ended,
            brought,
            newest_turn,
        } = stored;
        // A cut thread must still be over the token trigger, as the whole thread is.
        let compaction_tokens = compaction
            .as_ref()
            .and_then(|policy| policy.trigger.tokens)
            .map_or(0, |tokens| tokens.saturating_add(1));
        let load = || {
            start
                .settings
                .load(self.store, self.thread, start.own_tokens, compaction_tokens)
        };
        let mut input_from = None;
        if !events.is_empty() {
            let seqs = self.store.append(self.thread, events).await?;
            input_from = seqs.get(ended).copied().filter(|_| brought);
        }

        let mut tail = load().await?;
        tail.projection.system = call_system(self.instructions, tail.projection.system.take());
        let mut compacted = None;
        let mut summary = None;
        if let Some(policy) = &compaction
            && let Some(reason) = compaction_fires(policy, &start, &tail)
        {
            let request = CompactRequest::new(policy.clone(), reason);
            let outcome = compact_stored(self.compactor, self.store, self.thread, &request)
                .await
                .map(|report| report.outcome);
            if let Ok(CompactionOutcome::Compacted { replace_seq, .. }) = &outcome {
                summary = self.replacement(*replace_seq).await?;
                tail = load().await?;
                tail.projection.system =
                    call_system(self.instructions, tail.projection.system.take());
            }
            compacted = Some(outcome);
        }

        let fitted = self.fit_tail(&start, tail, newest_turn).await?;
        let record = self.request_record(&start, &fitted, input_from);
        let started = NewEvent::new(EventKind::RequestStarted(record));
        let started = match self.key {
            Some(key) if self.first_attempt => started.with_key(request_key(key)),
            _ => started,
        };
        let request_seq = self.store.append_one(self.thread, started).await?;
        Ok(PreparedTurn {
            lease: std::sync::Arc::new(start.lease),
            fitted,
            request_id: start.request_id,
            compaction: compacted,
            summary,
            request_seq,
        })
    }

    /// Step 3's fit of `tail`, whose last `newest_turn` messages are the newest turn, with
    /// the cuts carried from the thread's last request; on the CPU pool when the turn has
    /// one.
    async fn fit_tail(
        &self,
        start: &TurnStart,
        tail: ProjectionTail,
        newest_turn: usize,
    ) -> Result<FittedRequest, ChatError> {
        let (settings, schemas) = (&start.settings, &start.schemas);
        let last_request = tail.last_request;
        let split = tail.projection.messages.len().saturating_sub(newest_turn);
        let mut memory = if settings.policy.shrinks() {
            let hysteresis = settings.policy.hysteresis.is_some();
            self.carried_cuts(last_request, &tail.projection.messages[..split], hysteresis)
                .await?
        } else {
            CutMemory::default()
        };
        Ok(match &self.cpu {
            Some((pool, key)) => {
                let settings = settings.clone();
                let schemas = Arc::clone(schemas);
                let encoding = settings.model.counter.encoding();
                let weight = crate::fitting::fit_weight(&tail.projection.messages, encoding);
                pool.run_weighed(key, weight, move || {
                    fit_turn(&settings, tail, newest_turn, &schemas, &mut memory)
                })
                .await?
            }
            None => fit_turn(settings, tail, newest_turn, schemas, &mut memory)?,
        })
    }

    /// The record of the request `fitted`, as it will be sent.
    fn request_record(
        &self,
        start: &TurnStart,
        fitted: &FittedRequest,
        input_from: Option<u64>,
    ) -> RequestRecord {
        RequestRecord {
            request_id: start.request_id.clone(),
            model: Some(start.settings.model.id.clone()),
            messages: fitted.messages.clone(),
            budget: Some(RecordedBudget {
                context_window: fitted.limits.context_window,
                max_output_tokens: fitted.limits.reserve_output,
                input_tokens: fitted.breakdown.used,
            }),
            tools: self.tools.to_vec(),
            breakdown: Some(fitted.breakdown.clone()),
            fit: Some(fitted.fit.clone()),
            purpose: Some("chat".into()),
            client_digest: self.client_digest.clone(),
            input_from,
            client: self.client_record.cloned(),
            reasoning_not_sent: if self.sends_reasoning {
                None
            } else {
                reasoning_parts(&fitted.messages)
            },
            ..RequestRecord::default()
        }
    }

    /// The messages the context replace at `seq` put in the place of what it covered.
    async fn replacement(&self, seq: u64) -> Result<Option<Vec<Message>>, ChatError> {
        let events = self.store.events_through(self.thread, seq - 1, seq).await?;
        Ok(events.into_iter().find_map(|event| match event.kind {
            EventKind::ContextReplaced(op) => Some(op.replacement),
            _ => None,
        }))
    }

    /// The turn for the request's messages `requested` with nothing stored: the thread
    /// as it stands after its event `through` (`None`: all of it; a thread that does not
    /// exist is empty) with the request's new messages, fitted by the thread's own policy
    /// (else the settings') and validated. Nothing is compacted (a compaction writes).
    pub async fn fit_unrecorded(
        &self,
        requested: Vec<Message>,
        through: Option<u64>,
    ) -> Result<FittedRequest, ChatError> {
        let events = match through {
            Some(seq) => self.store.events_through(self.thread, 0, seq).await,
            None => self.store.events(self.thread).await,
        };
        let mut settings = self.settings.clone();
        let stored = match events {
            Ok(events) => {
                let thread = contexture_core::thread::Thread::replay(self.thread, events).map_err(
                    |source| StoreError::Replay {
                        thread: self.thread.to_owned(),
                        source,
                    },
                )?;
                // The thread's own fit policy, as of the point continued, as a stored turn's.
                if let Some(policy) = thread.policy().and_then(|policy| policy.fit.as_ref()) {
                    settings.adopt(policy).map_err(FitError::from)?;
                }
                thread.projection()
            }
            Err(StoreError::NotFound { .. }) => Projection {
                context: "main".into(),
                system: None,
                messages: Vec::new(),
            },
            Err(error) => return Err(error.into()),
        };
        let plan = plan_turn(
            &settings,
            stored,
            requested,
            self.instructions,
            &self.counted_schemas(),
            false,
        )?;
        Ok(plan.preview)
    }

    /// What the thread's previous request cut, for a policy that cuts the same way from one
    /// request to the next: the results it cleared, and with hysteresis, the history it left
    /// out (found again by its first kept message in `history`, the history being fitted).
    /// A thread's turns are one loop across requests, and servers keep nothing between them,
    /// so this comes from the request's record.
    async fn carried_cuts(
        &self,
        last_request: Option<u64>,
        history: &[Message],
        hysteresis: bool,
    ) -> Result<CutMemory, ChatError> {
        let mut memory = CutMemory::default();
        let Some(seq) = last_request else {
            return Ok(memory);
        };
        let events = self.store.events_after(self.thread, seq - 1).await?;
        let Some(EventKind::RequestStarted(record)) =
            events.into_iter().next().map(|event| event.kind)
        else {
            return Ok(memory);
        };
        if let Some(fit) = &record.fit {
            memory.cleared = fit
                .cleared
                .iter()
                .map(|result| result.tool_call_id.clone())
                .collect();
        }
        if hysteresis {
            let first_kept = record
                .messages
                .iter()
                .find(|message| !message.role.is_system_like());
            if let Some(first_kept) = first_kept
                && let Some(dropped) = history.iter().position(|message| message == first_kept)
                && dropped > 0
            {
                memory.history_dropped = Some(HistoryCut {
                    dropped,
                    length: history.len(),
                    first_kept: Some(first_kept.clone()),
                });
            }
        }
        Ok(memory)
    }

    /// What records how the call of `prepared` ends.
    pub fn recorder(&self, prepared: &PreparedTurn) -> TurnRecorder<S>
    where
        S: Clone,
    {
        TurnRecorder {
            lease: std::sync::Arc::clone(&prepared.lease),
            learner: self.learner.clone(),
            store: self.store.clone(),
            thread: self.thread.to_owned(),
            request_id: prepared.request_id.clone(),
            answer_key: self.key.map(answer_key),
            model: self.settings.model.clone(),
            input_tokens: prepared.fitted.breakdown.used,
            estimated: crate::estimates::uncalibrated_estimate(
                &self.settings.model,
                &prepared.fitted.messages,
                &self.counted_schemas(),
            ),
        }
    }
}

/// What [`TurnRecorder::completion`] made of a response.
#[derive(Debug)]
pub enum CompletionRecord {
    /// The answer and its end were stored.
    Answered,
    /// The body held no answer: the call was recorded as failed (`recorded` says whether
    /// that record was stored).
    Unreadable {
        /// The failed call's record, stored or not.
        recorded: Result<(), StoreError>,
    },
}

/// Why a call the server's shutdown stopped ended.
pub const SHUT_DOWN: &str = "the server shut down before the answer ended";

/// Records how a turn's call ended in its thread.
#[derive(Debug, Clone)]
pub struct TurnRecorder<S> {
    /// Held until the last copy of the recorder is dropped, after the end is recorded; its
    /// ticket leaves the thread's queue with the end.
    lease: std::sync::Arc<TurnLease>,
    learner: crate::estimates::Learner,
    store: S,
    thread: String,
    request_id: String,
    answer_key: Option<String>,
    model: ModelInfo,
    input_tokens: u32,
    /// The request under the model's uncalibrated estimate, for its calibration.
    estimated: u64,
}

impl<S: Store + TurnQueueStore> TurnRecorder<S> {
    /// The answer: the request's end (its usage, or the request's and the reply's counts
    /// when the upstream reported none, and its cost) and the assistant message, in one
    /// transaction.
    pub async fn answered(&self, answer: Answer) -> Result<(), StoreError> {
        let usage = answer.usage;
        crate::estimates::observe(
            &self.store,
            &self.model,
            &self.learner,
            self.estimated,
            usage,
        )
        .await?;
        let mut end = answered_end(
            &self.request_id,
            &answer.message,
            usage,
            &self.model,
            self.input_tokens,
        );
        // The reply is not copied into the record: it is the message appended with it.
        end.finish_reason = answer.finish_reason;
        let answer = NewEvent::new(EventKind::MessageAppended {
            message: answer.message,
        });
        let answer = match &self.answer_key {
            Some(key) => answer.with_key(key.clone()),
            None => answer,
        };
        let events = vec![NewEvent::new(EventKind::RequestEnded(end)), answer];
        self.append_last(events).await
    }

    /// A whole (not streamed) successful response's `body`, in `format`: its answer, or why it holds
    /// none. An error is an answer that could not be stored; a body that holds no answer is
    /// recorded as a failed call, and whether that record was stored is
    /// [`CompletionRecord::Unreadable`]'s to tell (the response goes back to the client
    /// either way).
    pub async fn completion(
        &self,
        format: WireFormat,
        body: &[u8],
    ) -> Result<CompletionRecord, StoreError> {
        match contexture_llm::passthrough::AnswerAccumulator::from_body(format, body) {
            Ok(answer) => self
                .answered(answer)
                .await
                .map(|()| CompletionRecord::Answered),
            Err(error) => Ok(CompletionRecord::Unreadable {
                recorded: self.failed(error.to_string()).await,
            }),
        }
    }

    /// A streamed answer's end as the stream's recorder saw it; `stopping` when the server
    /// was shutting down. Whatever did not end whole appends nothing to the conversation
    /// (the client never saw the whole answer), and is recorded with what had arrived and
    /// its usage: the request was sent, so its input tokens (as counted) and the tokens of
    /// what arrived are spent, estimated.
    pub async fn stream_ended(
        &self,
        outcome: Result<Answer, PassthroughError>,
        stopping: bool,
    ) -> Result<(), StoreError> {
        let (outcome, error, partial) = match outcome {
            // An answer that ended whole is kept, even as the server stopped.
            Ok(answer) => return self.answered(answer).await,
            Err(
                PassthroughError::Interrupted { partial } | PassthroughError::Truncated { partial },
            ) if stopping => (RequestOutcome::Cancelled, SHUT_DOWN.to_owned(), partial),
            Err(_) if stopping => (RequestOutcome::Cancelled, SHUT_DOWN.to_owned(), None),
            Err(PassthroughError::Interrupted { partial }) => (
                RequestOutcome::Cancelled,
                "the client went away before the streamed answer ended".to_owned(),
                partial,
            ),
            Err(error @ PassthroughError::Truncated { .. }) => {
                let text = error.to_string();
                let PassthroughError::Truncated { partial } = error else {
                    unreachable!("matched above")
                };
                (RequestOutcome::Failed, text, partial)
            }
            Err(error) => (RequestOutcome::Failed, error.to_string(), None),
        };
        let partial = partial.map(|message| *message);
        let output = partial
            .as_ref()
            .map_or(0, |message| self.model.counter.count_message(message));
        let usage = Usage::new(u64::from(self.input_tokens), u64::from(output));
        let mut end = priced_end(&self.request_id, outcome, usage, true, &self.model);
        end.error = Some(error);
        end.reply = partial;
        self.record_end(end).await
    }

    /// A failed call: recorded, and nothing appended to the conversation.
    pub async fn failed(&self, error: String) -> Result<(), StoreError> {
        self.ended(RequestOutcome::Failed, error).await
    }

    /// A call the server's shutdown stopped before an answer began.
    pub async fn stopped(&self) -> Result<(), StoreError> {
        self.ended(RequestOutcome::Cancelled, SHUT_DOWN.to_owned())
            .await
    }

    /// A call that ended before an answer began: nothing is known to be spent.
    async fn ended(&self, outcome: RequestOutcome, error: String) -> Result<(), StoreError> {
        let mut end = RequestEnd::new(&self.request_id, outcome, Usage::default());
        end.error = Some(error);
        self.record_end(end).await
    }

    async fn record_end(&self, end: RequestEnd) -> Result<(), StoreError> {
        self.append_last(vec![NewEvent::new(EventKind::RequestEnded(end))])
            .await
    }

    /// Appends the turn's end, its last write: the turn's ticket leaves the thread's queue
    /// in the same write (one commit fewer per turn), and the next turn may begin once it
    /// is stored. A recorder whose lease holds another thread appends alone.
    async fn append_last(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        if self.lease.thread() != self.thread {
            return self.store.append(&self.thread, events).await.map(|_| ());
        }
        self.store
            .append_leaving_turn(&self.thread, events, self.lease.ticket())
            .await?;
        self.lease.left_with_write();
        Ok(())
    }
}

/// The end of a request found in flight by a turn that holds its thread: no server is
/// answering it any more.
fn abandoned_end(request_id: String) -> NewEvent {
    let end = RequestEnd::failed(
        request_id,
        "abandoned: no end was recorded before the next turn on this thread began (the server answering it stopped)",
    );
    NewEvent::new(EventKind::RequestEnded(end))
}

/// Every tool result among the new messages answers a tool call that is still open: one the
/// thread's messages or an earlier new message made and nothing answered yet. A result that
/// answers nothing would be stored and then left out of every request.
pub fn check_tool_results(stored: &Projection, new: &[Message]) -> Result<(), ChatError> {
    let mut open: Vec<&str> = Vec::new();
    for message in &stored.messages {
        open.extend(message.tool_calls.iter().map(|call| &*call.id));
        if let Some(id) = &message.tool_call_id {
            open.retain(|open| *open != &**id);
        }
    }
    let invalid = |message: String| ChatError::Invalid {
        field: "messages",
        message,
    };
    for message in new {
        open.extend(message.tool_calls.iter().map(|call| &*call.id));
        if message.role != Role::Tool {
            continue;
        }
        let Some(id) = message.tool_call_id.as_deref() else {
            return Err(invalid(
                "messages: a tool message needs `tool_call_id`, the id of the call it answers"
                    .into(),
            ));
        };
        match open.iter().position(|open| *open == id) {
            Some(at) => {
                open.remove(at);
            }
            None => {
                return Err(invalid(format!(
                    "messages: the tool message for call `{id}` answers no open tool call: no assistant message in the thread or the request made it, or it was answered already"
                )));
            }
        }
    }
    Ok(())
}

/// Two messages are the same turn when they serialize alike in the OpenAI format.
fn same_turn(a: &Message, b: &Message) -> bool {
    a.role == b.role && comparable(a) == comparable(b)
}

/// `message` as turns are compared: its wire form with what a client may change when it
/// sends a turn back taken out. Anthropic's clients send an answer back as a list of
/// blocks (one text block for a plain answer) and mark blocks for their prompt cache
/// (`cache_control`); neither makes it another turn.
fn comparable(message: &Message) -> Value {
    let mut value = openai::to_value(message);
    if let Some(Value::Array(parts)) = value.get_mut("content") {
        for part in parts.iter_mut() {
            if let Value::Object(part) = part {
                part.remove("cache_control");
            }
        }
        if let [Value::Object(part)] = parts.as_slice()
            && part.len() == 2
            && part.get("type").and_then(Value::as_str) == Some("text")
            && let Some(text) = part.get("text").cloned()
        {
            value["content"] = text;
        }
    }
    value
}

/// What a turn carries from its first read to its request's record.
struct TurnStart {
    /// The model and the fit policy (the thread's own, when it has one).
    settings: FitSettings,
    /// The tool and structured-output schemas counted with the request.
    schemas: Arc<[Value]>,
    /// The tokens of the request's newest turn, which the thread's reads reach back for.
    own_tokens: u64,
    /// The id the request is recorded with.
    request_id: String,
    /// The turn's hold on its thread.
    lease: TurnLease,
}

/// What a turn that stores its messages before it is fitted stores first.
struct StoredTurn {
    /// The abandoned requests' ends, then the new messages.
    events: Vec<NewEvent>,
    /// How many of `events` are abandoned requests' ends.
    ended: usize,
    /// True when the request brought new messages.
    brought: bool,
    /// How many of the new messages, at their end, are the newest turn.
    newest_turn: usize,
}

/// What a request brings to its thread, found before anything of the turn is stored.
#[derive(Debug)]
pub struct TurnPlan {
    /// The request's messages the thread does not hold yet, in order: what the turn stores.
    pub new: Vec<Message>,
    /// How many of the new messages, at their end, are the newest turn: the messages after
    /// the last assistant one, system prompts aside, which the fit keeps whole.
    pub newest_turn: usize,
    /// The turn fitted to the thread as it was read, with nothing stored or compacted.
    pub preview: FittedRequest,
}

/// The tokens of the request's newest turn (its messages after its last assistant
/// message, system prompts aside): at least those of the new turns a turn keeps whole,
/// whatever the thread holds, so the thread is read far enough back for them. Only they
/// are counted: a stateless client sends the whole conversation again with every request,
/// and counting all of it each turn would cost as much as the rest of the turn.
pub fn newest_turn_tokens(requested: &[Message], encoding: Encoding) -> u64 {
    let after_last_answer = requested
        .iter()
        .rposition(|message| message.role == Role::Assistant)
        .map_or(0, |at| at + 1);
    requested[after_last_answer..]
        .iter()
        .filter(|message| !message.role.is_system_like())
        .map(|message| u64::from(message_tokens(message, encoding)))
        .sum()
}

/// The engine's part of a turn before anything is stored, for the request's messages
/// `requested` and the thread as `settings`' tail read shows it (`stored`): which messages
/// are new ([`new_messages`]), whether their tool results answer calls
/// ([`check_tool_results`]), and whether the turn can fit at all, with `instructions` (the
/// call's own system prompt) and `schemas` counted. Fitting fails only on what it must keep
/// (the system prompt, the newest turn, the tools), which compaction cannot shrink: a turn
/// that cannot fit is refused before anything of it is stored. With fitting off and a
/// compaction to run (`compacts`), only what compaction cannot shrink is checked.
pub fn plan_turn(
    settings: &FitSettings,
    stored: Projection,
    requested: Vec<Message>,
    instructions: Option<&str>,
    schemas: &[Value],
    compacts: bool,
) -> Result<TurnPlan, ChatError> {
    let SplitTurn {
        new,
        history,
        newest_turn,
    } = split_turn(stored, requested, instructions)?;
    let preview = check_fits(settings, history, &newest_turn, schemas, compacts)?;
    Ok(TurnPlan {
        new,
        newest_turn: newest_turn.len(),
        preview,
    })
}

/// Why `policy`'s trigger fires on `tail` (its system prompt and messages, with the
/// messages before them left unread counted as history) for the turn's model and schemas,
/// if it does. Both ways of a turn decide with this one call, so the one-write way is taken
/// only where the other would compact nothing.
fn compaction_fires(
    policy: &CompactionPolicy,
    start: &TurnStart,
    tail: &ProjectionTail,
) -> Option<String> {
    policy.trigger.fires_for(
        &start.settings.model,
        tail.projection
            .system
            .iter()
            .chain(&tail.projection.messages),
        tail.projection.messages.len() + tail.unread,
        &start.schemas,
    )
}

/// [`plan_turn`]'s check: `newest_turn` fitted after `history` by `settings`, with
/// `schemas` counted. With fitting off and a compaction to run (`compacts`), only what
/// compaction cannot shrink is checked.
fn check_fits(
    settings: &FitSettings,
    history: Projection,
    newest_turn: &[Message],
    schemas: &[Value],
    compacts: bool,
) -> Result<FittedRequest, ChatError> {
    Ok(if settings.policy.enabled || !compacts {
        settings.fit(history, newest_turn, schemas)?
    } else {
        // With fitting off the whole history counts, and the compaction that runs before
        // the request may still shrink it.
        let mut trimming = settings.clone();
        trimming.policy.enabled = true;
        trimming.fit(history, newest_turn, schemas)?
    })
}

/// A request's messages against the thread as read.
#[derive(Debug)]
pub struct SplitTurn {
    /// The request's messages the thread does not hold yet, in order ([`new_messages`]).
    pub new: Vec<Message>,
    /// The thread as read with the new messages before the newest turn after it, and the
    /// call's system prompt: what the newest turn is fitted after.
    pub history: Projection,
    /// The newest turn: the new messages after the last assistant one, system prompts
    /// aside, which the fit keeps whole.
    pub newest_turn: Vec<Message>,
}

/// Splits the request's messages `requested` against `stored`, the thread as read: which
/// are new (their tool results checked, [`check_tool_results`]), the history they make
/// with it (a new system prompt replacing the stored one, `instructions` over both), and
/// the newest turn.
pub fn split_turn(
    stored: Projection,
    requested: Vec<Message>,
    instructions: Option<&str>,
) -> Result<SplitTurn, ChatError> {
    let new = new_messages(&stored, requested);
    check_tool_results(&stored, &new)?;
    let (new_system, new_turns): (Vec<&Message>, Vec<&Message>) = new
        .iter()
        .partition(|message| message.role.is_system_like());
    let mut earlier: Vec<Message> = new_turns.into_iter().cloned().collect();
    let newest_turn = earlier.split_off(newest_turn_start(&earlier));
    let mut messages = stored.messages;
    messages.extend(earlier);
    let history = Projection {
        context: stored.context,
        system: call_system(
            instructions,
            new_system
                .last()
                .map(|message| (*message).clone())
                .or(stored.system),
        ),
        messages,
    };
    Ok(SplitTurn {
        new,
        history,
        newest_turn,
    })
}

/// The engine's part of a turn after its messages are stored: the thread's `tail` as read
/// back, whose last `newest_turn` messages are the newest turn (kept whole), fitted by
/// `settings` with `schemas` counted, cutting again first what `memory` says the thread's
/// previous request cut.
pub fn fit_turn(
    settings: &FitSettings,
    mut tail: ProjectionTail,
    newest_turn: usize,
    schemas: &[Value],
    memory: &mut CutMemory,
) -> Result<FittedRequest, FitError> {
    let split = tail.projection.messages.len().saturating_sub(newest_turn);
    let own = tail.projection.messages.split_off(split);
    settings.fit_tail_in_loop(tail, &own, schemas, memory)
}

/// The request's messages that the thread does not hold yet (see the module docs).
pub fn new_messages(stored: &Projection, requested: Vec<Message>) -> Vec<Message> {
    let (system, turns): (Vec<Message>, Vec<Message>) = requested
        .into_iter()
        .partition(|message| message.role.is_system_like());
    let mut new = Vec::new();
    if let Some(system) = system.into_iter().last()
        && !stored
            .system
            .as_ref()
            .is_some_and(|current| same_turn(current, &system))
    {
        new.push(system);
    }
    let start = match stored.messages.last() {
        Some(last) => turns
            .iter()
            .rposition(|message| same_turn(message, last))
            .map_or(0, |at| at + 1),
        None => 0,
    };
    new.extend(turns.into_iter().skip(start));
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(system: Option<&str>, messages: Vec<Message>) -> Projection {
        Projection {
            context: "main".into(),
            system: system.map(Message::system),
            messages,
        }
    }

    #[test]
    fn a_turn_sent_back_as_one_text_block_or_marked_for_caching_is_the_same_turn() {
        let stored = projection(
            None,
            vec![Message::user("Hi"), Message::assistant("Hello!")],
        );
        let mut as_block = Message::assistant("");
        as_block.content = Some(contexture_core::Content::Parts(vec![
            contexture_core::Part::Text {
                text: "Hello!".into(),
                extra: serde_json::from_value(
                    serde_json::json!({"cache_control": {"type": "ephemeral"}}),
                )
                .unwrap(),
            },
        ]));
        let new = new_messages(
            &stored,
            vec![Message::user("Hi"), as_block, Message::user("Next?")],
        );
        assert_eq!(new.len(), 1, "{new:?}");
        assert_eq!(new[0].text(), "Next?");
        // Another text is another turn.
        let new = new_messages(
            &stored,
            vec![
                Message::user("Hi"),
                Message::assistant("Hello?"),
                Message::user("Next?"),
            ],
        );
        assert_eq!(new.len(), 3);
    }

    /// A conversation of `roles` (0 user, 1 assistant, 2 system), each message's text its
    /// place, so that no two are the same turn.
    fn conversation(roles: &[u8]) -> Vec<Message> {
        roles
            .iter()
            .enumerate()
            .map(|(at, role)| match role {
                0 => Message::user(format!("question {at} {}", "word ".repeat(at % 7))),
                1 => Message::assistant(format!("answer {at}")),
                _ => Message::system(format!("prompt {at}")),
            })
            .collect()
    }

    proptest::proptest! {
        /// The tokens a turn reads the thread for, counted from the request's newest turn
        /// only, cover the new messages the turn keeps whole, whatever part of the
        /// conversation the thread holds and the request sends again.
        #[test]
        fn the_newest_turn_of_a_request_covers_the_new_turns_kept_whole(
            roles in proptest::collection::vec(0u8..3, 1..14),
            stored_len in 0usize..14,
            resent_from in 0usize..14,
        ) {
            let whole = conversation(&roles);
            let stored_len = stored_len.min(whole.len());
            let stored_turns: Vec<Message> = whole[..stored_len]
                .iter()
                .filter(|message| !message.role.is_system_like())
                .cloned()
                .collect();
            let stored = projection(None, stored_turns);
            let requested = whole[resent_from.min(stored_len)..].to_vec();
            let settings = FitSettings::new(
                contexture_core::registry::Registry::builtin().resolve("gpt-4o-mini"),
                contexture_core::fit::FitPolicy::default(),
                crate::fitting::FitOverrides::default(),
            )
            .unwrap();
            let encoding = settings.model.counter.encoding();
            let read_for = newest_turn_tokens(&requested, encoding);
            let plan = plan_turn(&settings, stored, requested, None, &[], false).unwrap();
            let turns: Vec<&Message> = plan
                .new
                .iter()
                .filter(|message| !message.role.is_system_like())
                .collect();
            let kept_whole: u64 = turns[turns.len() - plan.newest_turn..]
                .iter()
                .map(|message| u64::from(message_tokens(message, encoding)))
                .sum();
            proptest::prop_assert!(
                read_for >= kept_whole,
                "read for {} tokens, the newest turn holds {}", read_for, kept_whole
            );
        }
    }

    #[test]
    fn a_resent_history_adds_only_its_new_turns() {
        let stored = projection(
            Some("Be brief."),
            vec![Message::user("Hi"), Message::assistant("Hello!")],
        );
        let full = vec![
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("What is 2+2?"),
        ];
        let new = new_messages(&stored, full);
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].text(), "What is 2+2?");
        // Only the new turn: all of it is new.
        let new = new_messages(&stored, vec![Message::user("And 3+3?")]);
        assert_eq!(new.len(), 1);
        // A different system prompt replaces the thread's.
        let new = new_messages(
            &stored,
            vec![Message::system("Be verbose."), Message::user("Hi again")],
        );
        assert_eq!(new.len(), 2);
        assert!(new[0].role.is_system_like());
        // An empty thread takes everything.
        assert_eq!(
            new_messages(
                &projection(None, vec![]),
                vec![Message::user("a"), Message::assistant("b")]
            )
            .len(),
            2
        );
    }
}
