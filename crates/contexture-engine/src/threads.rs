//! Operations on a stored thread that a caller asks for by name: create one, set its policy,
//! fork it, merge a fork back, restore what a replace (a compaction, a clear) covered,
//! search its messages. The CLI and the HTTP
//! API both call these, so one request gives the same events whichever door it came through.

use contexture_core::Message;
use contexture_core::compact::{RestoreError, restore_before};
use contexture_core::format::{FormatError, ItemFormat};
use contexture_core::thread::search::{SearchHit, SearchQuery};
use contexture_core::thread::{
    ContextReplace, EventKind, MergeError, MergeSpec, PolicyChange, ReplaceReason, StoreChange,
    Thread, ThreadPolicy, TooManyContexts, UnknownContext, context_name_problem,
};
use contexture_core::tokens::Encoding;
use contexture_store::{NewEvent, RequestRetention, RetentionError, Store, StoreError};
use serde_json::Value;

/// Why a thread operation did nothing.
#[derive(Debug, thiserror::Error)]
pub enum ThreadOpError {
    /// The store refused or failed (a missing thread is [`StoreError::NotFound`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The thread to merge from does not exist.
    #[error("no thread `{from}` to merge from")]
    NoMergeSource {
        /// The thread named as the source.
        from: String,
    },
    /// The merge cannot be planned (not a fork of the target, a conflict under `error`).
    #[error(transparent)]
    Merge(#[from] MergeError),
    /// The restore cannot be planned (no such replace event).
    #[error("cannot restore thread `{thread}`: {source}")]
    Restore {
        /// The thread.
        thread: String,
        /// What is wrong with the event named.
        #[source]
        source: RestoreError,
    },
    /// The retention policy given cannot be used.
    #[error("invalid retention policy: {source}")]
    Retention {
        /// What is wrong with it.
        #[source]
        source: RetentionError,
    },
    /// An operation names a context the thread does not have.
    #[error("{0}; a switch with `create` starts a new one")]
    UnknownContext(#[from] UnknownContext),
    /// A switch would start a context past the thread's limit.
    #[error(transparent)]
    TooManyContexts(#[from] TooManyContexts),
    /// A context name that cannot be used.
    #[error("invalid context name {context:?}: {problem}")]
    ContextName {
        /// The name given.
        context: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// An operation id already recorded a switch to another context.
    #[error(
        "op_id `{op_id}` already switched this thread to context `{first}`, not `{context}`: give a new op_id for another switch"
    )]
    OpIdReused {
        /// The operation id.
        op_id: String,
        /// The context its first switch went to.
        first: String,
        /// The context asked for now.
        context: String,
    },
    /// A search's query holds nothing to look for.
    #[error("the query is empty: give the text to look for")]
    EmptyQuery,
    /// The last message has no item in the format asked for.
    #[error("the last message has no items to take: {source}")]
    NoItem {
        /// Why it cannot be written as items.
        #[source]
        source: FormatError,
    },
    /// The thread policy given cannot be used.
    #[error("invalid thread policy: {field}: {problem}")]
    Policy {
        /// The policy's field at fault (such as `context.hysteresis.low`).
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ThreadOpError {
    /// The first problem of `policy`, as an error.
    fn check_policy(policy: &ThreadPolicy) -> Result<(), ThreadOpError> {
        match policy.problems().into_iter().next() {
            Some((field, problem)) => Err(ThreadOpError::Policy { field, problem }),
            None => Ok(()),
        }
    }
}

/// What a new thread starts with.
#[derive(Debug, Clone, Default)]
pub struct NewThread {
    /// A system prompt, stored before the messages.
    pub system: Option<String>,
    /// The first messages.
    pub messages: Vec<Message>,
    /// Free JSON kept in the thread's store under `metadata` (an empty object when `None`).
    pub metadata: Option<Value>,
    /// The thread's own retention policy for its request records.
    pub retention: Option<RequestRetention>,
    /// The thread's own policy for its requests (how they are fitted and compacted).
    pub policy: Option<ThreadPolicy>,
}

/// Creates thread `id` with its metadata, policy, system prompt and first messages in one
/// append, then its retention policy, and returns the last seq. Fails with
/// [`StoreError::AlreadyExists`] when the thread exists.
pub async fn create_thread<S: Store>(
    store: &S,
    id: &str,
    new: NewThread,
) -> Result<u64, ThreadOpError> {
    if store.exists(id).await? {
        return Err(StoreError::AlreadyExists { thread: id.into() }.into());
    }
    if let Some(retention) = &new.retention {
        retention
            .check()
            .map_err(|source| ThreadOpError::Retention { source })?;
    }
    if let Some(policy) = &new.policy {
        ThreadOpError::check_policy(policy)?;
    }
    let metadata = new
        .metadata
        .unwrap_or_else(|| Value::Object(Default::default()));
    let mut events = vec![NewEvent::new(EventKind::StoreChanged(StoreChange::Set {
        key: "metadata".into(),
        value: metadata,
    }))];
    if let Some(policy) = new.policy {
        events.push(NewEvent::new(EventKind::PolicySet(PolicyChange {
            policy: Some(policy),
        })));
    }
    let system = new.system.map(Message::system);
    events.extend(NewEvent::messages(
        system.into_iter().chain(new.messages),
        None,
    ));
    let seqs = store.append(id, events).await?;
    if new.retention.is_some() {
        store.set_retention(id, new.retention).await?;
    }
    Ok(seqs.last().copied().unwrap_or(0))
}

/// Sets the thread `id`'s own policy for its requests (or, with `None`, removes it: the
/// defaults apply again) as one `policy_set` event, and returns its seq. The policy is
/// checked first; a thread that does not exist is [`StoreError::NotFound`].
pub async fn set_thread_policy<S: Store>(
    store: &S,
    id: &str,
    policy: Option<ThreadPolicy>,
) -> Result<u64, ThreadOpError> {
    if let Some(policy) = &policy {
        ThreadOpError::check_policy(policy)?;
    }
    if !store.exists(id).await? {
        return Err(StoreError::NotFound { thread: id.into() }.into());
    }
    let event = NewEvent::new(EventKind::PolicySet(PolicyChange { policy }));
    Ok(store.append_one(id, event).await?)
}

/// [`set_thread_policy`], or, for a thread that is not there yet, [`create_thread`] with
/// the policy (a thread made meanwhile by another writer gets the policy set on it).
pub async fn set_thread_policy_starting<S: Store>(
    store: &S,
    id: &str,
    policy: Option<ThreadPolicy>,
) -> Result<u64, ThreadOpError> {
    match set_thread_policy(store, id, policy.clone()).await {
        Err(ThreadOpError::Store(StoreError::NotFound { .. })) => {
            let new = NewThread {
                policy: policy.clone(),
                ..NewThread::default()
            };
            match create_thread(store, id, new).await {
                Err(ThreadOpError::Store(StoreError::AlreadyExists { .. })) => {
                    set_thread_policy(store, id, policy).await
                }
                made => made,
            }
        }
        done => done,
    }
}

/// Messages appended to a thread by [`append_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Each message's seq, in order.
    pub seqs: Vec<u64>,
    /// The seq of the switch to the context named, when one was recorded with them.
    pub switch_seq: Option<u64>,
}

/// Appends `messages` to the thread `id` (created when missing) in one transaction, message
/// i keyed `KEY:i` when `key` is given (a retry stores nothing and gets the first seqs).
/// With `context`, the messages go to that context: unless it is already the active one,
/// a `context_switched` event to it comes first in the same transaction (keyed
/// `KEY:context`, its op id the same, so a retry switches once; while a request is in
/// flight the switch waits for it, like every context operation). The context must be one
/// the thread has: a new one is started by [`switch_context`] with `create`.
pub async fn append_messages<S: Store>(
    store: &S,
    id: &str,
    messages: Vec<Message>,
    key: Option<&str>,
    context: Option<&str>,
) -> Result<Appended, ThreadOpError> {
    let mut events = Vec::with_capacity(messages.len() + 1);
    if let Some(context) = context {
        check_context_name(context)?;
        let thread = match store.load(id).await {
            Ok(thread) => thread,
            Err(StoreError::NotFound { .. }) => Thread::new(id),
            Err(other) => return Err(other.into()),
        };
        thread.check_context(context)?;
        let settled = thread.active_context() == context && thread.queued_switch().is_none();
        if !settled {
            let op_id = key.map(|key| format!("{key}:context"));
            let mut event = NewEvent::new(EventKind::ContextSwitched {
                context: context.to_owned(),
                op_id: op_id.clone(),
            });
            event.idempotency_key = op_id;
            events.push(event);
        }
    }
    let switched = !events.is_empty();
    events.extend(NewEvent::messages(messages, key));
    let mut seqs = store.append(id, events).await?;
    let switch_seq = switched.then(|| seqs.remove(0));
    Ok(Appended { seqs, switch_seq })
}

/// Refuses a name that cannot be a context's.
fn check_context_name(context: &str) -> Result<(), ThreadOpError> {
    match context_name_problem(context) {
        Some(problem) => Err(ThreadOpError::ContextName {
            context: context.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// A switch [`switch_context`] recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switched {
    /// The `context_switched` event's seq.
    pub seq: u64,
    /// A request was in flight: the switch applies when it ends.
    pub queued: bool,
}

/// Switches the thread `id`'s active context to `context` as one `context_switched` event,
/// and says where it was recorded. Like the other context operations it waits for a request in flight
/// to end, and recorded again with the same `op_id` (a retry) it has no second effect. The
/// context must be one the thread has (`main`, or one a replace or a switch named) unless
/// `create` says to start a new one (which shows the whole history until it is replaced),
/// and a thread has at most `max_contexts` contexts.
pub async fn switch_context<S: Store>(
    store: &S,
    id: &str,
    context: &str,
    op_id: Option<String>,
    create: bool,
    max_contexts: usize,
) -> Result<Switched, ThreadOpError> {
    check_context_name(context)?;
    let thread = store.load(id).await?;
    let key = op_id.as_ref().map(|op_id| format!("{op_id}:switch"));
    if let (Some(op_id), Some(key)) = (&op_id, &key)
        && let Some(first) = store.keyed_event(id, key).await?
    {
        // A retry: nothing more is recorded, and the answer is the first one's (its switch
        // still waits while the same context is queued).
        return match &first.event.kind {
            EventKind::ContextSwitched { context: first, .. } if first != context => {
                Err(ThreadOpError::OpIdReused {
                    op_id: op_id.clone(),
                    first: first.clone(),
                    context: context.to_owned(),
                })
            }
            _ => Ok(Switched {
                seq: first.event.seq,
                queued: thread.queued_switch() == Some(context),
            }),
        };
    }
    if create {
        thread.check_room_for(context, max_contexts)?;
    } else {
        thread.check_context(context)?;
    }
    let queued = thread.in_flight().is_some();
    let mut event = NewEvent::new(EventKind::ContextSwitched {
        context: context.to_owned(),
        op_id,
    });
    // Two retries at once store one switch: the store keeps the first of a key.
    event.idempotency_key = key;
    let seq = store.append_one(id, event).await?;
    Ok(Switched { seq, queued })
}

/// The most hits a search answers, whatever it asks for.
pub const MAX_SEARCH_HITS: usize = 1_000;

/// The messages of thread `id` (its fork prefix included) that hold `query`, oldest first,
/// at most `limit` (capped at [`MAX_SEARCH_HITS`]); see [`SearchQuery`] for what is
/// searched and how. The events are read a page at a time and the search stops at its
/// limit, so it holds one page in memory, and reads as far into the log as its hits lie.
pub async fn search_thread<S: Store>(
    store: &S,
    id: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<SearchHit>, ThreadOpError> {
    const PAGE_EVENTS: usize = 256;
    const PAGE_BYTES: usize = 4 << 20;
    let query = SearchQuery::new(query).ok_or(ThreadOpError::EmptyQuery)?;
    if !store.exists(id).await? {
        return Err(StoreError::NotFound {
            thread: id.to_owned(),
        }
        .into());
    }
    let limit = limit.min(MAX_SEARCH_HITS);
    let mut hits = Vec::new();
    let mut after = 0;
    while hits.len() < limit {
        let page = store
            .events_page(id, after, PAGE_EVENTS, PAGE_BYTES)
            .await?;
        for event in &page.events {
            hits.extend(query.hits(event));
            after = event.seq;
        }
        if !page.more || page.events.is_empty() {
            break;
        }
    }
    hits.truncate(limit);
    Ok(hits)
}

/// Where a fork was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forked {
    /// The parent's last event the fork shares.
    pub at_seq: u64,
    /// The seq of the fork's `forked` event.
    pub forked_seq: u64,
}

/// Forks `parent` as `child` after the parent's event `at_seq` (default: its last event).
pub async fn fork_thread<S: Store>(
    store: &S,
    parent: &str,
    at_seq: Option<u64>,
    child: &str,
) -> Result<Forked, ThreadOpError> {
    let at_seq = match at_seq {
        Some(at) => at,
        // The tail read with no token budget decodes no history: the last seq is all it
        // needs (a missing parent is refused by the fork itself).
        None => {
            store
                .load_projection_tail(parent, Encoding::O200kBase, 0)
                .await?
                .last_seq
        }
    };
    let forked_seq = store.fork(parent, at_seq, child).await?;
    Ok(Forked { at_seq, forked_seq })
}

/// Merges the fork `from` back into `into` as one `merged` event and returns its seq.
pub async fn merge_thread<S: Store>(
    store: &S,
    into: &str,
    from: &str,
    spec: &MergeSpec,
) -> Result<u64, ThreadOpError> {
    let parent = store.load(into).await?;
    let child = match store.load(from).await {
        Ok(child) => child,
        Err(StoreError::NotFound { .. }) => {
            return Err(ThreadOpError::NoMergeSource { from: from.into() });
        }
        Err(error) => return Err(error.into()),
    };
    let event = parent.plan_merge(&child, spec)?;
    Ok(store.append_one(into, NewEvent::new(event)).await?)
}

/// Puts back the projection as it was just before the replace event `before` (messages
/// appended since stay), as one more replace event whose seq is returned. The operation's
/// id names the thread, the event restored and the log's length, so a second restore of the
/// same event later is a new operation.
pub async fn restore_thread<S: Store>(
    store: &S,
    thread: &str,
    before: u64,
) -> Result<u64, ThreadOpError> {
    let events = store.events(thread).await?;
    if events.is_empty() && !store.exists(thread).await? {
        return Err(StoreError::NotFound {
            thread: thread.into(),
        }
        .into());
    }
    let op_id = format!("{thread}/restore-before-{before}-at-{}", events.len() + 1);
    let restore =
        restore_before(&events, before, op_id).map_err(|source| ThreadOpError::Restore {
            thread: thread.into(),
            source,
        })?;
    Ok(store
        .append_one(thread, NewEvent::new(EventKind::ContextReplaced(restore)))
        .await?)
}

/// Takes the newest item off thread `id`'s active conversation in `format` and returns it
/// (the last message, or the last item of the last turn, whose other items stay), as one
/// replace event based on the thread's last seq, so messages appended meanwhile stay after
/// it; the log keeps the item. `None` (and nothing written) when the conversation is empty.
/// A thread that does not exist is [`StoreError::NotFound`]; a last message with no item in
/// `format` is [`ThreadOpError::NoItem`], with nothing written.
pub async fn pop_item<S: Store>(
    store: &S,
    id: &str,
    format: ItemFormat,
) -> Result<Option<Value>, ThreadOpError> {
    let popped = rewrite_last_message(store, id, |last| {
        format
            .split_last_item(last)
            .map_err(|source| ThreadOpError::NoItem { source })
    })
    .await?;
    Ok(popped.flatten())
}

/// Rewrites the last message of thread `id`'s active conversation into the messages
/// `rewrite` returns for it (with what else it returns), as one replace event based on the
/// thread's last seq. `None`, and nothing written, when the conversation is empty or
/// `rewrite` fails.
async fn rewrite_last_message<S: Store, T>(
    store: &S,
    id: &str,
    rewrite: impl FnOnce(&Message) -> Result<(Vec<Message>, T), ThreadOpError>,
) -> Result<Option<T>, ThreadOpError> {
    let thread = store.load(id).await?;
    let mut messages = thread.projection().messages;
    let Some(last) = messages.pop() else {
        return Ok(None);
    };
    let (rest, taken) = rewrite(&last)?;
    messages.extend(rest);
    let based_on = thread.last_seq();
    let replace = ContextReplace::new(
        format!("rewrite-last:{based_on}"),
        ReplaceReason::Manual,
        based_on,
        messages,
    )
    .in_context(thread.active_context());
    store
        .append_one(id, NewEvent::new(EventKind::ContextReplaced(replace)))
        .await?;
    Ok(Some(taken))
}

/// Empties thread `id`'s active conversation as one replace event (its system prompt and
/// pinned messages stay; the log keeps every message) and returns the event's seq, or
/// `None` when there was nothing to clear. A thread that does not exist is
/// [`StoreError::NotFound`].
pub async fn clear_thread<S: Store>(store: &S, id: &str) -> Result<Option<u64>, ThreadOpError> {
    let thread = store.load(id).await?;
    let messages = thread.projection().messages;
    if messages.is_empty() {
        return Ok(None);
    }
    let based_on = thread.last_seq();
    let replace = ContextReplace::clear(format!("clear:{based_on}"), based_on, &messages)
        .in_context(thread.active_context());
    let seq = store
        .append_one(id, NewEvent::new(EventKind::ContextReplaced(replace)))
        .await?;
    Ok(Some(seq))
}
