//! The events of a thread's log.
//!
//! A thread is an append-only sequence of [`Event`]s numbered 1, 2, 3, ... without gaps.
//! Nothing ever edits or removes an event: a context operation is itself an event, and the
//! message view a model sees is computed from the log (see [`crate::thread::Projection`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::BudgetBreakdown;
use crate::compact::CompactionPolicy;
use crate::fit::FitPolicy;
use crate::message::Message;
use crate::thread::execution::{
    FitRecord, RunEnd, RunStart, StepCompaction, StepEnd, StepFailure, StepMessage, StepStart,
};

/// The name of the context a thread starts with.
pub const DEFAULT_CONTEXT: &str = "main";

fn default_context() -> String {
    DEFAULT_CONTEXT.to_string()
}

fn is_default_context(name: &str) -> bool {
    name == DEFAULT_CONTEXT
}

/// One entry of a thread's log: its position and what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The position in the thread's log, starting at 1, without gaps.
    pub seq: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// An event at `seq`.
    pub fn new(seq: u64, kind: EventKind) -> Event {
        Event { seq, kind }
    }
}

/// What an event records.
// A request record is the largest event by far (its messages are on the heap either way);
// a box would cost an allocation per record read for a few hundred bytes per event held.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A message was added to the conversation.
    MessageAppended {
        /// The message.
        message: Message,
    },
    /// A context operation (replace, clear, restore, compaction) on a named context. It takes
    /// effect at once when no request is in flight, otherwise when the request ends, in the
    /// order the operations were recorded.
    ContextReplaced(ContextReplace),
    /// The active named context changes: the next call sees `context`. Like the other
    /// context operations, it takes effect at once when no request is in flight, otherwise
    /// when the request ends, in the order the operations were recorded.
    ContextSwitched {
        /// The context that becomes active.
        context: String,
        /// The operation's id: a switch recorded again with the same id (a retry) is
        /// applied once. Ids are unique among a thread's context operations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        op_id: Option<String>,
    },
    /// The thread's key-value store changed.
    StoreChanged(StoreChange),
    /// This thread was forked from `parent` after the parent's event `at_seq`. It is the
    /// first event of a fork, at `at_seq + 1`; the events before it are the parent's.
    Forked {
        /// The thread forked from.
        parent: String,
        /// The last parent event this thread shares.
        at_seq: u64,
    },
    /// A fork was merged back into this thread.
    Merged(Merge),
    /// A request to a model began: exactly what was sent, and under which budget.
    RequestStarted(RequestRecord),
    /// The request in flight ended. Queued context operations apply now.
    RequestEnded(RequestEnd),
    /// A workflow run began (the first event of an execution's thread).
    RunStarted(RunStart),
    /// A workflow step began.
    StepStarted(StepStart),
    /// A message of a step's own log (tool calls and their results).
    StepMessage(StepMessage),
    /// A step's own tool loop was compacted: its oldest messages are stood for by a
    /// replacement in its next requests (its log keeps them).
    StepCompacted(StepCompaction),
    /// A workflow step ended with an output.
    StepFinished(StepEnd),
    /// A workflow step failed.
    StepFailed(StepFailure),
    /// A workflow run ended.
    RunEnded(RunEnd),
    /// Someone asked for the execution to stop. The executor running it ends its step and
    /// the run as cancelled; a run not running is cancelled when it would resume.
    CancelRequested(CancelRequest),
    /// A compaction was attempted and replaced nothing (its summarizer failed or returned
    /// nothing); the thread goes on uncompacted.
    CompactionFailed(CompactionFailure),
    /// The thread's own policy for its requests was set (or, with none, cleared): the next
    /// requests on it are fitted and compacted by it instead of the server's defaults.
    PolicySet(PolicyChange),
    /// A client deleted the chat turn whose request was recorded at `request_seq` (a stored
    /// response): reads of it answer that there is none, and it cannot be continued. The
    /// conversation's messages stay: later turns were fitted with them.
    RequestDeleted {
        /// The seq of the request's record.
        request_seq: u64,
    },
}

/// The type of an [`EventKind`], without what the event holds: what a read that only needs
/// a thread's shape (which events are where) decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// [`EventKind::MessageAppended`].
    MessageAppended,
    /// [`EventKind::ContextReplaced`].
    ContextReplaced,
    /// [`EventKind::ContextSwitched`].
    ContextSwitched,
    /// [`EventKind::StoreChanged`].
    StoreChanged,
    /// [`EventKind::Forked`].
    Forked,
    /// [`EventKind::Merged`].
    Merged,
    /// [`EventKind::RequestStarted`].
    RequestStarted,
    /// [`EventKind::RequestEnded`].
    RequestEnded,
    /// [`EventKind::RunStarted`].
    RunStarted,
    /// [`EventKind::StepStarted`].
    StepStarted,
    /// [`EventKind::StepMessage`].
    StepMessage,
    /// [`EventKind::StepCompacted`].
    StepCompacted,
    /// [`EventKind::StepFinished`].
    StepFinished,
    /// [`EventKind::StepFailed`].
    StepFailed,
    /// [`EventKind::RunEnded`].
    RunEnded,
    /// [`EventKind::CompactionFailed`].
    CompactionFailed,
    /// [`EventKind::CancelRequested`].
    CancelRequested,
    /// [`EventKind::PolicySet`].
    PolicySet,
    /// [`EventKind::RequestDeleted`].
    RequestDeleted,
}

impl EventType {
    /// Every type, in the order [`EventKind`] declares them.
    pub const ALL: [EventType; 19] = [
        EventType::MessageAppended,
        EventType::ContextReplaced,
        EventType::ContextSwitched,
        EventType::StoreChanged,
        EventType::Forked,
        EventType::Merged,
        EventType::RequestStarted,
        EventType::RequestEnded,
        EventType::RunStarted,
        EventType::StepStarted,
        EventType::StepMessage,
        EventType::StepCompacted,
        EventType::StepFinished,
        EventType::StepFailed,
        EventType::RunEnded,
        EventType::CompactionFailed,
        EventType::CancelRequested,
        EventType::PolicySet,
        EventType::RequestDeleted,
    ];

    /// The type's short name, as an event's `type` field holds it.
    pub fn name(self) -> &'static str {
        match self {
            EventType::MessageAppended => "message_appended",
            EventType::ContextReplaced => "context_replaced",
            EventType::ContextSwitched => "context_switched",
            EventType::StoreChanged => "store_changed",
            EventType::Forked => "forked",
            EventType::Merged => "merged",
            EventType::RequestStarted => "request_started",
            EventType::RequestEnded => "request_ended",
            EventType::RunStarted => "run_started",
            EventType::StepStarted => "step_started",
            EventType::StepMessage => "step_message",
            EventType::StepCompacted => "step_compacted",
            EventType::StepFinished => "step_finished",
            EventType::StepFailed => "step_failed",
            EventType::RunEnded => "run_ended",
            EventType::CompactionFailed => "compaction_failed",
            EventType::CancelRequested => "cancel_requested",
            EventType::PolicySet => "policy_set",
            EventType::RequestDeleted => "request_deleted",
        }
    }

    /// The type named `name` ([`EventType::name`]), if there is one.
    pub fn from_name(name: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl EventKind {
    /// The short name of the event's type, as serialized in its `type` field.
    pub fn type_name(&self) -> &'static str {
        self.event_type().name()
    }

    /// The event's type, without what it holds.
    pub fn event_type(&self) -> EventType {
        match self {
            EventKind::MessageAppended { .. } => EventType::MessageAppended,
            EventKind::ContextReplaced(_) => EventType::ContextReplaced,
            EventKind::ContextSwitched { .. } => EventType::ContextSwitched,
            EventKind::StoreChanged(_) => EventType::StoreChanged,
            EventKind::Forked { .. } => EventType::Forked,
            EventKind::Merged(_) => EventType::Merged,
            EventKind::RequestStarted(_) => EventType::RequestStarted,
            EventKind::RequestEnded(_) => EventType::RequestEnded,
            EventKind::RunStarted(_) => EventType::RunStarted,
            EventKind::StepStarted(_) => EventType::StepStarted,
            EventKind::StepMessage(_) => EventType::StepMessage,
            EventKind::StepCompacted(_) => EventType::StepCompacted,
            EventKind::StepFinished(_) => EventType::StepFinished,
            EventKind::StepFailed(_) => EventType::StepFailed,
            EventKind::RunEnded(_) => EventType::RunEnded,
            EventKind::CompactionFailed(_) => EventType::CompactionFailed,
            EventKind::CancelRequested(_) => EventType::CancelRequested,
            EventKind::PolicySet(_) => EventType::PolicySet,
            EventKind::RequestDeleted { .. } => EventType::RequestDeleted,
        }
    }

    /// Every message the event carries, in a fixed order (used by stores to save and restore
    /// per-message token counts).
    pub fn messages(&self) -> Vec<&Message> {
        match self {
            EventKind::MessageAppended { message } => vec![message],
            EventKind::ContextReplaced(replace) => replace.replacement.iter().collect(),
            EventKind::Merged(merge) => merge.messages.iter().collect(),
            EventKind::RequestStarted(record) => record.messages.iter().collect(),
            EventKind::StepMessage(step) => vec![&step.message],
            EventKind::StepCompacted(compaction) => compaction.replacement.iter().collect(),
            EventKind::RequestEnded(end) => end.reply.iter().collect(),
            EventKind::ContextSwitched { .. }
            | EventKind::StoreChanged(_)
            | EventKind::Forked { .. }
            | EventKind::RunStarted(_)
            | EventKind::StepStarted(_)
            | EventKind::StepFinished(_)
            | EventKind::StepFailed(_)
            | EventKind::RunEnded(_)
            | EventKind::CompactionFailed(_)
            | EventKind::CancelRequested(_)
            | EventKind::PolicySet(_)
            | EventKind::RequestDeleted { .. } => Vec::new(),
        }
    }

    /// The fields of the event that name another thread or execution (a fork's parent, a
    /// merged fork, a run's parent execution and conversation, a step's sub-workflow and
    /// fork, the execution a cancellation cascades from), for a view of the store that maps
    /// ids (a tenant's) to change them all in one place.
    pub fn thread_ids_mut(&mut self) -> Vec<&mut String> {
        match self {
            EventKind::Forked { parent, .. } => vec![parent],
            EventKind::Merged(merge) => vec![&mut merge.child],
            EventKind::RunStarted(start) => start
                .parent_execution_id
                .iter_mut()
                .chain(start.conversation.iter_mut())
                .collect(),
            EventKind::StepStarted(start) => start
                .child_execution_id
                .iter_mut()
                .chain(start.fork_thread.iter_mut())
                .collect(),
            EventKind::CancelRequested(cancel) => cancel.cascaded_from.iter_mut().collect(),
            EventKind::MessageAppended { .. }
            | EventKind::ContextReplaced(_)
            | EventKind::ContextSwitched { .. }
            | EventKind::StoreChanged(_)
            | EventKind::RequestStarted(_)
            | EventKind::RequestEnded(_)
            | EventKind::StepMessage(_)
            | EventKind::StepCompacted(_)
            | EventKind::StepFinished(_)
            | EventKind::StepFailed(_)
            | EventKind::RunEnded(_)
            | EventKind::CompactionFailed(_)
            | EventKind::PolicySet(_)
            | EventKind::RequestDeleted { .. } => Vec::new(),
        }
    }

    /// The operation id of a context operation, which makes it idempotent.
    pub fn op_id(&self) -> Option<&str> {
        match self {
            EventKind::ContextReplaced(replace) => Some(&replace.op_id),
            _ => None,
        }
    }
}

/// A thread's own policy for the requests made on it: how they are fitted and when the
/// thread is compacted. What it leaves out is the defaults' (a server's configuration).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadPolicy {
    /// How requests are fitted to the model's window (a window here may only lower the
    /// model's); the key `context`, as an assistant's.
    #[serde(
        default,
        rename = "context",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub fit: Option<FitPolicy>,
    /// When and how the thread is compacted before a request.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub compaction: Option<CompactionPolicy>,
}

impl ThreadPolicy {
    /// What is wrong with the policy, as `(field, problem)` pairs (the field's path, such
    /// as `context.clear_tool_results.keep`).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if let Some(fit) = &self.fit {
            for (field, problem) in fit.problems() {
                problems.push((format!("context.{field}"), problem));
            }
        }
        if let Some(compaction) = &self.compaction {
            for (field, problem) in compaction.problems() {
                problems.push((format!("compaction.{field}"), problem));
            }
        }
        problems
    }
}

/// A thread's policy set, or cleared (`policy` absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyChange {
    /// The policy from now on; none: the defaults again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<ThreadPolicy>,
}

/// Why a context was replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplaceReason {
    /// A summary replaced older messages.
    Compaction,
    /// A caller replaced the messages by hand.
    Manual,
    /// A snapshot taken earlier was put back.
    Restore,
    /// The conversation was emptied (pinned messages are kept by [`ContextReplace::clear`]).
    Clear,
}

/// Where a replacement came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The model that wrote a summary, for compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer_model: Option<String>,
    /// A hash of the prompt given to the summarizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_hash: Option<String>,
    /// The seq of the event a restored snapshot was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_seq: Option<u64>,
}

/// A context operation: replace the messages covered by `from_seq..=to_seq` of a named
/// context with `replacement`. Messages appended after `to_seq` (the seq the operation was
/// based on) are kept, even when the operation is applied later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextReplace {
    /// The operation's id; a second operation with the same id has no effect.
    pub op_id: String,
    /// The named context it applies to.
    #[serde(
        default = "default_context",
        skip_serializing_if = "is_default_context"
    )]
    pub context: String,
    /// Why.
    pub reason: ReplaceReason,
    /// The first seq covered.
    pub from_seq: u64,
    /// The last seq covered: the seq the operation was based on.
    pub to_seq: u64,
    /// The messages that stand for the covered ones.
    pub replacement: Vec<Message>,
    /// Where the replacement came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

impl ContextReplace {
    /// A replace of the main context covering `1..=based_on`.
    pub fn new(
        op_id: impl Into<String>,
        reason: ReplaceReason,
        based_on: u64,
        replacement: Vec<Message>,
    ) -> ContextReplace {
        ContextReplace {
            op_id: op_id.into(),
            context: default_context(),
            reason,
            from_seq: 1,
            to_seq: based_on,
            replacement,
            provenance: None,
        }
    }

    /// A clear of the main context based on `based_on` that keeps the pinned messages of
    /// `current` (the view the caller saw at `based_on`).
    pub fn clear(op_id: impl Into<String>, based_on: u64, current: &[Message]) -> ContextReplace {
        let pinned = current.iter().filter(|m| m.is_pinned()).cloned().collect();
        ContextReplace::new(op_id, ReplaceReason::Clear, based_on, pinned)
    }

    /// Builder: applies the operation to the named context `context`.
    pub fn in_context(mut self, context: impl Into<String>) -> ContextReplace {
        self.context = context.into();
        self
    }

    /// Builder: records where the replacement came from.
    pub fn with_provenance(mut self, provenance: Provenance) -> ContextReplace {
        self.provenance = Some(provenance);
        self
    }
}

/// A change of the thread's key-value store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StoreChange {
    /// `key` now holds `value`.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: Value,
    },
    /// `key` no longer exists.
    Unset {
        /// The key.
        key: String,
    },
    /// Every key was removed.
    Cleared,
}

/// What a merge brings back from a fork.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergePolicy {
    /// The messages the fork appended (after the fork point or its previous merge): the
    /// default.
    #[default]
    AppendMessages,
    /// Only the fork's last assistant message, as its summary.
    SummaryOnly,
    /// Only declared keys of the fork's store (no messages).
    OutputKeys,
}

/// What a merge does when a key it brings back already holds a different value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictPolicy {
    /// The fork's value replaces the parent's: the default.
    #[default]
    ChildWins,
    /// The parent's value is kept.
    ParentWins,
    /// The merge fails.
    Error,
    /// The values are kept together in a list: the parent's (or its items, when it is a list)
    /// followed by the fork's.
    Append,
}

/// A merge of a fork into this thread, as recorded in the parent's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Merge {
    /// The fork merged.
    pub child: String,
    /// The fork's last seq this merge covers; a later merge of the same fork starts after it.
    pub child_seq: u64,
    /// What was brought back.
    pub policy: MergePolicy,
    /// How key conflicts were resolved.
    pub conflict: ConflictPolicy,
    /// The messages added to this thread's conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// The store changes applied to this thread, after conflict resolution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub store_changes: Vec<StoreChange>,
    /// Tokens the fork spent on its own requests since the fork point (or its previous
    /// merge); the parent's prefix is never counted twice.
    #[serde(default)]
    pub usage: Usage,
    /// Dollars the fork's calls cost at known prices, when the merge knows (a workflow
    /// step run on a fork); counted once, in the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// One of the fork's calls spent tokens at no known price: the parent's total is then
    /// unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cost_unknown: bool,
}

/// Exactly what one model call was sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request's id.
    pub request_id: String,
    /// The model called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The messages sent, in order.
    pub messages: Vec<Message>,
    /// The budget the request was fitted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RecordedBudget>,
    /// The workflow step that made the request, for an execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The tool schemas sent with the messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    /// The request's tokens part by part (system, tools, history, reserve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<BudgetBreakdown>,
    /// What fitting the request to the window left out, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitRecord>,
    /// Why the call was made, when it is not a conversation turn (`compaction` for a
    /// summarizer's call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    /// For a request a client sent with an idempotency key: the SHA-256 of its body (hex),
    /// so that a retry is told apart from another request that reuses the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_digest: Option<String>,
    /// Set when a retention policy removed the messages the request sent (`messages` is
    /// then empty): the record keeps everything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<PrunedRequest>,
    /// For a chat turn that brought new messages: the seq of the first (they run up to the
    /// record), so that the turn's input can be read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_from: Option<u64>,
    /// What the door the request came through keeps of it to answer reads of it later (the
    /// Responses door: the request's fields a response object echoes), as that door wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<Value>,
    /// How many reasoning parts of `messages` the upstream was not sent, when there were
    /// any: its format has no place for them (chat completions has no reasoning input), so
    /// the body left them out; the thread keeps them beside their turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_not_sent: Option<u32>,
}

/// What a retention policy removed from a request record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedRequest {
    /// How many messages the request sent.
    pub messages: u64,
    /// When they were removed, in milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// A request to cancel an execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The ancestor whose cancellation this one cascades from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascaded_from: Option<String>,
}

/// A compaction that replaced nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionFailure {
    /// The first seq it would have covered (for a step's own loop: the position of its
    /// first message there, from 1).
    pub from_seq: u64,
    /// The last seq it would have covered (for a step's loop: its last message's position).
    pub to_seq: u64,
    /// The step whose own loop it would have compacted, when it was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The summarizer it used.
    pub summarizer: String,
    /// What went wrong, after every retry.
    pub error: String,
    /// How many summaries were attempted.
    pub attempts: u32,
}

/// The token budget a request was built under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedBudget {
    /// The model's context window.
    pub context_window: u32,
    /// Tokens reserved for the reply.
    pub max_output_tokens: u32,
    /// Tokens the input was counted at.
    pub input_tokens: u32,
}

/// How a request ended, as recorded in the `request_ended` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestEnd {
    /// The id of the request that ended.
    pub request_id: String,
    /// How it ended.
    pub outcome: RequestOutcome,
    /// Tokens the provider reported for the request.
    #[serde(default)]
    pub usage: Usage,
    /// True when the provider reported no usage and `usage` was counted here instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usage_estimated: bool,
    /// What the model answered, exactly as received, for a completed request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Message>,
    /// Why the provider stopped generating (`stop`, `length`, `tool_calls`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// What went wrong, for a failed or cancelled request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The request's cost in US dollars at the model's list price, when the price is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// How many HTTP attempts the call took (retries included), when more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

impl RequestEnd {
    /// The call's cost when it is known: its `cost_usd`, or nothing spent when no token was
    /// (a call that failed before any); `None` when it spent tokens at no known price, which
    /// makes any total it is part of unknown.
    pub fn known_cost_usd(&self) -> Option<f64> {
        match self.cost_usd {
            Some(cost) => Some(cost),
            None if self.usage.input_tokens + self.usage.output_tokens == 0 => Some(0.0),
            None => None,
        }
    }

    /// The end of `request_id` with `outcome` and `usage`, and nothing else recorded.
    pub fn new(request_id: impl Into<String>, outcome: RequestOutcome, usage: Usage) -> RequestEnd {
        RequestEnd {
            request_id: request_id.into(),
            outcome,
            usage,
            usage_estimated: false,
            reply: None,
            finish_reason: None,
            error: None,
            cost_usd: None,
            attempts: None,
        }
    }

    /// The end of `request_id` as failed, with no usage, and why.
    pub fn failed(request_id: impl Into<String>, error: impl Into<String>) -> RequestEnd {
        RequestEnd {
            error: Some(error.into()),
            ..RequestEnd::new(request_id, RequestOutcome::Failed, Usage::default())
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestOutcome {
    /// The model answered.
    Completed,
    /// The call failed.
    Failed,
    /// The call was cancelled.
    Cancelled,
}

/// Tokens spent, as reported by providers. Read from scripts and records as
/// `input_tokens`/`output_tokens`, or in OpenAI's words, `prompt_tokens`/`completion_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default, alias = "prompt_tokens")]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default, alias = "completion_tokens")]
    pub output_tokens: u64,
}

impl Usage {
    /// Usage of `input_tokens` in and `output_tokens` out.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
        }
    }

    /// Input and output together (saturating).
    pub fn total(self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The sum of two usages (saturating).
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }

    /// This usage less `other` (saturating at zero).
    pub fn minus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_sub(other.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(other.output_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_type_is_found_by_its_name_and_no_two_share_one() {
        let mut names = std::collections::HashSet::new();
        for kind in EventType::ALL {
            assert_eq!(EventType::from_name(kind.name()), Some(kind));
            assert!(names.insert(kind.name()), "{} twice", kind.name());
        }
        assert_eq!(EventType::from_name("message"), None);
        assert_eq!(EventType::from_name(""), None);
    }

    #[test]
    fn an_events_type_name_is_its_serialized_type() {
        let kinds = [
            EventKind::MessageAppended {
                message: Message::user("hi"),
            },
            EventKind::ContextSwitched {
                context: "other".into(),
                op_id: None,
            },
            EventKind::Forked {
                parent: "p".into(),
                at_seq: 3,
            },
            EventKind::RequestDeleted { request_seq: 2 },
        ];
        for kind in kinds {
            let value = serde_json::to_value(&kind).unwrap();
            assert_eq!(value["type"], kind.event_type().name());
        }
    }
}
