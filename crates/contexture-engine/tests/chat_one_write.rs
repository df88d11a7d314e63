//! A chat turn with no idempotency key, and no compaction that fires on the thread as read,
//! stores its new messages and its request's record in one write, made only if nothing was
//! written to the thread since the turn read it; a write that comes in between is read
//! back, as when the messages are stored first.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::compact::{CompactionPolicy, Trigger};
use contexture_core::fit::FitPolicy;
use contexture_core::registry::Registry;
use contexture_core::thread::{Event, EventKind, Projection, RequestRecord, Thread};
use contexture_core::tokens::Encoding;
use contexture_core::{Message, Role};
use contexture_engine::chat::ChatTurn;
use contexture_engine::compaction::Compactor;
use contexture_engine::estimates::Learner;
use contexture_engine::fitting::{FitOverrides, FitSettings};
use contexture_engine::llm::{FixedRouter, Router};
use contexture_engine::turns::TurnQueue;
use contexture_llm::ScriptedProvider;
use contexture_store::{
    EventOutline, EventPage, KeyedEvent, NewEvent, ProjectionTail, PruneReport, RecentCursor,
    RequestRetention, RequestsPruned, SqliteStore, Store, StoreError, ThreadInfo,
};

/// A store that counts its appends, and that can let another writer's events land between
/// a turn's read and its write: the first conditional append appends `between` first.
struct Watched {
    inner: SqliteStore,
    appends: AtomicUsize,
    appends_after: AtomicUsize,
    between: Mutex<Option<Vec<NewEvent>>>,
}

impl Watched {
    fn new(inner: SqliteStore, between: Option<Vec<NewEvent>>) -> Watched {
        Watched {
            inner,
            appends: AtomicUsize::new(0),
            appends_after: AtomicUsize::new(0),
            between: Mutex::new(between),
        }
    }

    fn writes(&self) -> (usize, usize) {
        (
            self.appends.load(Ordering::SeqCst),
            self.appends_after.load(Ordering::SeqCst),
        )
    }
}

impl Store for Watched {
    async fn append(&self, thread: &str, events: Vec<NewEvent>) -> Result<Vec<u64>, StoreError> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        self.inner.append(thread, events).await
    }

    async fn append_after(
        &self,
        thread: &str,
        after: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        self.appends_after.fetch_add(1, Ordering::SeqCst);
        let between = self.between.lock().unwrap().take();
        if let Some(between) = between {
            self.inner.append(thread, between).await?;
        }
        self.inner.append_after(thread, after, events).await
    }

    async fn events(&self, thread: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.events(thread).await
    }

    async fn exists(&self, thread: &str) -> Result<bool, StoreError> {
        self.inner.exists(thread).await
    }

    async fn events_after(&self, thread: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        self.inner.events_after(thread, after).await
    }

    async fn events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_through(thread, after, through).await
    }

    async fn outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        self.inner.outlines_through(thread, after, through).await
    }

    async fn events_page(
        &self,
        thread: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<EventPage, StoreError> {
        self.inner
            .events_page(thread, after, limit, max_bytes)
            .await
    }

    async fn keyed_event(&self, thread: &str, key: &str) -> Result<Option<KeyedEvent>, StoreError> {
        self.inner.keyed_event(thread, key).await
    }

    async fn fork(&self, parent: &str, at_seq: u64, child: &str) -> Result<u64, StoreError> {
        self.inner.fork(parent, at_seq, child).await
    }

    async fn list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner.list_page(prefix, after, limit).await
    }

    async fn list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner
            .list_recent(prefix, contains, before, limit)
            .await
    }

    async fn forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        self.inner.forks_of(thread).await
    }

    async fn delete(&self, thread: &str) -> Result<(), StoreError> {
        self.inner.delete(thread).await
    }

    async fn prune_under(
        &self,
        prefix: &str,
        idle_before: SystemTime,
    ) -> Result<PruneReport, StoreError> {
        self.inner.prune_under(prefix, idle_before).await
    }

    async fn set_retention(
        &self,
        thread: &str,
        retention: Option<RequestRetention>,
    ) -> Result<(), StoreError> {
        self.inner.set_retention(thread, retention).await
    }

    async fn prune_thread_requests(
        &self,
        thread: &str,
        retention: &RequestRetention,
        now: SystemTime,
    ) -> Result<RequestsPruned, StoreError> {
        self.inner
            .prune_thread_requests(thread, retention, now)
            .await
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, StoreError> {
        self.inner.calibration(model).await
    }

    async fn observe_calibration(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        self.inner.observe_calibration(model, observation).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn load_projection(&self, thread: &str) -> Result<Projection, StoreError> {
        self.inner.load_projection(thread).await
    }

    async fn load_projection_tail(
        &self,
        thread: &str,
        encoding: Encoding,
        tokens: u64,
    ) -> Result<ProjectionTail, StoreError> {
        self.inner
            .load_projection_tail(thread, encoding, tokens)
            .await
    }

    async fn load(&self, thread: &str) -> Result<Thread, StoreError> {
        self.inner.load(thread).await
    }
}

/// A thread of `turns` questions and answers.
fn conversation(turns: usize) -> Vec<NewEvent> {
    let mut messages = vec![Message::system("You answer in one sentence.")];
    for turn in 0..turns {
        messages.push(Message::user(format!(
            "Question {turn}: what is {turn} squared?"
        )));
        messages.push(Message::assistant(format!("It is {}.", turn * turn)));
    }
    NewEvent::messages(messages, None)
}

/// Prepares one turn asking `question` on `thread` of `store`, for gpt-4o-mini.
async fn prepare(
    store: &Watched,
    thread: &str,
    question: &str,
) -> contexture_engine::chat::PreparedTurn {
    prepare_for(store, thread, question, None).await
}

/// Prepares one turn asking `question` on `thread` of `store`, for gpt-4o-mini with a
/// context window of `window` tokens when given.
async fn prepare_for(
    store: &Watched,
    thread: &str,
    question: &str,
    window: Option<u32>,
) -> contexture_engine::chat::PreparedTurn {
    prepare_with(store, thread, question, window, None).await
}

/// [`prepare_for`], with `compaction` to consider.
async fn prepare_with(
    store: &Watched,
    thread: &str,
    question: &str,
    window: Option<u32>,
    compaction: Option<&CompactionPolicy>,
) -> contexture_engine::chat::PreparedTurn {
    let registry = Arc::new(Registry::builtin());
    let mut model = registry.resolve("gpt-4o-mini");
    if let Some(window) = window {
        model.context_window = window;
    }
    let settings = FitSettings::new(model, FitPolicy::default(), FitOverrides::default())
        .expect("the default policy fits the model");
    let summarizer = Arc::new(FixedRouter::new(Arc::new(ScriptedProvider::texts(["-"]))));
    let compactor = Compactor::new(summarizer as Arc<dyn Router>, registry);
    let lease = TurnQueue::default()
        .wait_for_turn(&store.inner, thread, Duration::from_secs(5))
        .await
        .expect("the thread is free");
    let turn = ChatTurn {
        store,
        thread,
        settings,
        tools: &[],
        response_format: None,
        compaction,
        compactor: &compactor,
        key: None,
        first_attempt: false,
        client_digest: None,
        learner: Learner::ReadOnly,
        cpu: None,
        instructions: None,
        compact_threshold: None,
        compact_instructions: None,
        client_record: None,
        sends_reasoning: true,
    };
    turn.prepare(vec![Message::user(question)], "req-1".to_owned(), lease)
        .await
        .expect("the turn is prepared")
}

/// The record stored at `seq` of `thread`.
async fn record_at(store: &SqliteStore, thread: &str, seq: u64) -> RequestRecord {
    let events = store.events_through(thread, seq - 1, seq).await.unwrap();
    match events.into_iter().next().map(|event| event.kind) {
        Some(EventKind::RequestStarted(record)) => record,
        other => panic!("no request record at {seq}: {other:?}"),
    }
}

fn user_text(message: &Message) -> Option<String> {
    (message.role == Role::User).then(|| message.text())
}

#[tokio::test]
async fn a_turns_messages_and_its_record_are_one_write() {
    let (_dir, inner) = common::sqlite().await;
    let seqs = inner.append("t", conversation(3)).await.unwrap();
    let last = *seqs.last().unwrap();
    let store = Watched::new(inner, None);

    let prepared = prepare(&store, "t", "And 3 squared?").await;

    assert_eq!(
        store.writes(),
        (0, 1),
        "one conditional write, nothing else"
    );
    assert_eq!(prepared.request_seq, last + 2);
    let events = store.inner.events_after("t", last).await.unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(
        &events[0].kind,
        EventKind::MessageAppended { message } if user_text(message).as_deref() == Some("And 3 squared?")
    ));
    let record = record_at(&store.inner, "t", last + 2).await;
    assert_eq!(
        record.input_from,
        Some(last + 1),
        "the record names its input"
    );
    let sent: Vec<Option<String>> = record.messages.iter().map(user_text).collect();
    assert_eq!(
        sent.iter().flatten().last().map(String::as_str),
        Some("And 3 squared?")
    );
    // The record holds what is sent: the stored thread, its new question last.
    assert_eq!(record.messages, prepared.fitted.messages);
    assert_eq!(
        record.messages.len(),
        1 + 6 + 1,
        "system, history, question"
    );
}

#[tokio::test]
async fn a_turn_on_a_new_thread_creates_it_in_its_one_write() {
    let (_dir, inner) = common::sqlite().await;
    let store = Watched::new(inner, None);

    let prepared = prepare(&store, "new", "Hello?").await;

    assert_eq!(store.writes(), (0, 1));
    assert_eq!(prepared.request_seq, 2);
    let record = record_at(&store.inner, "new", 2).await;
    assert_eq!(record.input_from, Some(1));
    assert_eq!(record.messages, vec![Message::user("Hello?")]);
}

#[tokio::test]
async fn a_write_between_the_turns_read_and_its_write_is_read_back_before_the_fit() {
    let (_dir, inner) = common::sqlite().await;
    let seqs = inner.append("t", conversation(3)).await.unwrap();
    let last = *seqs.last().unwrap();
    // Another writer (the thread's own API, say) appends while the turn is being fitted.
    let between = NewEvent::messages([Message::user("A note appended meanwhile.")], None);
    let store = Watched::new(inner, Some(between));

    let prepared = prepare(&store, "t", "And 3 squared?").await;

    // The conditional write was refused whole; the messages were then stored, the thread
    // read back and the record written, as a turn that stores its messages first does.
    assert_eq!(store.writes(), (2, 1));
    let events = store.inner.events_after("t", last).await.unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .map(|event| match &event.kind {
            EventKind::MessageAppended { .. } => "message",
            EventKind::RequestStarted(_) => "request",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["message", "message", "request"],
        "nothing stored twice"
    );
    assert_eq!(prepared.request_seq, last + 3);
    let record = record_at(&store.inner, "t", last + 3).await;
    assert_eq!(
        record.input_from,
        Some(last + 2),
        "the question, after the note"
    );
    let asked: Vec<String> = record.messages.iter().filter_map(user_text).collect();
    assert_eq!(
        asked[asked.len() - 2..],
        ["A note appended meanwhile.", "And 3 squared?"],
        "the fit saw the write that came in between"
    );
}

#[tokio::test]
async fn a_turn_sent_the_other_way_by_a_write_in_between_is_fitted_as_one_that_read_after_it() {
    // A window far smaller than the thread, and a long question: the thread is read only
    // back as far as the fit can reach, the question's own tokens included.
    let window = Some(2_000);
    let question = format!(
        "Now go through every answer again: {}",
        "and then ".repeat(150)
    );
    let note = || NewEvent::messages([Message::user("A note appended meanwhile.")], None);

    // The note is stored before the turn reads the thread: the turn's one write.
    let (_a, inner) = common::sqlite().await;
    inner.append("t", conversation(150)).await.unwrap();
    inner.append("t", note()).await.unwrap();
    let read_after = Watched::new(inner, None);
    let one_write = prepare_for(&read_after, "t", &question, window).await;
    assert_eq!(read_after.writes(), (0, 1));

    // The note lands between the turn's read and its write: the turn stores its question
    // and reads the thread back.
    let (_b, inner) = common::sqlite().await;
    inner.append("t", conversation(150)).await.unwrap();
    let between = Watched::new(inner, Some(note()));
    let other_way = prepare_for(&between, "t", &question, window).await;
    assert_eq!(between.writes(), (2, 1));

    assert_eq!(one_write.request_seq, other_way.request_seq);
    let (a, b) = (
        record_at(&read_after.inner, "t", one_write.request_seq).await,
        record_at(&between.inner, "t", other_way.request_seq).await,
    );
    assert!(
        a.messages.len() < 1 + 300,
        "the fit left history out ({} messages sent)",
        a.messages.len()
    );
    assert_eq!(a, b, "the same request, fitted and recorded the same");
    assert_eq!(one_write.fitted.fit, other_way.fitted.fit);
}

/// A compaction that fires once a request passes `tokens` tokens.
fn compaction_over(tokens: u64) -> CompactionPolicy {
    CompactionPolicy {
        trigger: Trigger {
            tokens: Some(tokens),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn a_turn_whose_compaction_does_not_fire_is_one_write_recorded_as_without_one() {
    let (_a, inner) = common::sqlite().await;
    inner.append("t", conversation(3)).await.unwrap();
    let plain = Watched::new(inner, None);
    let without = prepare(&plain, "t", "And 3 squared?").await;

    let (_b, inner) = common::sqlite().await;
    inner.append("t", conversation(3)).await.unwrap();
    let configured = Watched::new(inner, None);
    let policy = compaction_over(100_000);
    let with = prepare_with(&configured, "t", "And 3 squared?", None, Some(&policy)).await;

    assert_eq!(
        configured.writes(),
        (0, 1),
        "one conditional write, nothing else"
    );
    assert!(with.compaction.is_none(), "nothing was compacted");
    assert_eq!(with.request_seq, without.request_seq);
    assert_eq!(
        record_at(&configured.inner, "t", with.request_seq).await,
        record_at(&plain.inner, "t", without.request_seq).await,
        "the same request, fitted and recorded the same"
    );
}

#[tokio::test]
async fn a_turn_whose_compaction_fires_on_the_thread_as_read_stores_first_and_compacts() {
    let (_dir, inner) = common::sqlite().await;
    let seqs = inner.append("t", conversation(30)).await.unwrap();
    let last = *seqs.last().unwrap();
    let store = Watched::new(inner, None);
    let policy = compaction_over(200);

    let prepared = prepare_with(&store, "t", "And 30 squared?", None, Some(&policy)).await;

    let (appends, conditional) = store.writes();
    assert_eq!(conditional, 0, "no conditional write");
    assert!(
        appends >= 2,
        "the question, then the record ({appends} appends)"
    );
    assert!(prepared.compaction.is_some(), "the trigger fired");
    // The question was stored before the compaction, and the record names it.
    let events = store.inner.events_after("t", last).await.unwrap();
    assert!(matches!(
        &events[0].kind,
        EventKind::MessageAppended { message } if user_text(message).as_deref() == Some("And 30 squared?")
    ));
    let record = record_at(&store.inner, "t", prepared.request_seq).await;
    assert_eq!(record.input_from, Some(last + 1));
}
