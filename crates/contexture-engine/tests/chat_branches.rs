//! Chat turns that continue from an earlier answer (a branch when the thread went on past
//! it), that carry instructions of their own, that store nothing, and that ask for a
//! compaction past a threshold: what the upstream is sent and what the thread keeps.

use crate::chat_turns::{service, service_with, turn};
use crate::common::sqlite;

use contexture_core::Role;
use contexture_core::fit::FitPolicy;
use contexture_core::thread::EventKind;
use contexture_engine::chat::ChatError;
use contexture_engine::chat_service::{ChatService, TurnAnswer, TurnError, TurnPlace, TurnRequest};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::{SqliteStore, Store, Tenant};
use serde_json::{Value, json};

/// Runs `request`, reads its whole answer, and returns where it was recorded.
async fn answered(chat: &ChatService<SqliteStore>, request: TurnRequest) -> TurnPlace {
    match chat.turn(request).await {
        Ok(TurnAnswer::Upstream { response, place }) => {
            response.body.collect().await.unwrap();
            place
        }
        Ok(TurnAnswer::Replayed { .. }) => panic!("an upstream answer, not a replay"),
        Ok(TurnAnswer::Compacted { .. }) => panic!("an upstream answer, not a pause"),
        Err(error) => panic!("the turn failed: {error}"),
    }
}

/// A turn asking `question` on thread `porto` after the request recorded at `seq`.
fn continuing(question: &str, seq: u64) -> TurnRequest {
    let mut request = turn(question, false);
    request.continues = Some(seq);
    request
}

/// The conversation of `thread` (its messages' roles and texts, a fork's parent's first).
async fn conversation(store: &SqliteStore, thread: &str) -> Vec<(Role, String)> {
    let events = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .events(thread)
        .await
        .unwrap();
    events
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::MessageAppended { message } => Some((message.role, message.text())),
            _ => None,
        })
        .collect()
}

fn said(pairs: &[(Role, &str)]) -> Vec<(Role, String)> {
    pairs
        .iter()
        .map(|(role, text)| (*role, (*text).to_owned()))
        .collect()
}

/// The texts of the messages the upstream's `call`th call was sent.
fn sent(upstream: &FakeUpstream, call: usize) -> Vec<Value> {
    let calls = upstream.calls();
    calls[call].json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["content"].clone())
        .collect()
}

#[tokio::test]
async fn a_turn_continuing_an_earlier_answer_branches_when_the_thread_went_on() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    for reply in [
        "Rainy.",
        "Windy.",
        "Sunny in the branch.",
        "Still sunny.",
        "Calm.",
    ] {
        upstream.push(Reply::text(reply));
    }
    let chat = service(store.clone(), &upstream);

    let first = answered(&chat, turn("Weather in Porto?", false)).await;
    assert_eq!(first.thread, "porto");
    assert_eq!(first.branched_after, None);
    let first_seq = first.request_seq.unwrap();
    let second = answered(&chat, continuing("And tomorrow?", first_seq)).await;
    assert_eq!(
        (second.thread.as_str(), second.branched_after),
        ("porto", None),
        "the newest answer is continued on the thread"
    );

    // Continuing the first answer again: the thread went on, so this is a branch.
    let branch = answered(&chat, continuing("And on Sunday?", first_seq)).await;
    assert!(branch.thread.starts_with("porto~"), "{}", branch.thread);
    let point = branch.branched_after.expect("a branch");
    assert_eq!(
        sent(&upstream, 2),
        [
            json!("Weather in Porto?"),
            json!([{"type": "text", "text": "Rainy."}]),
            json!("And on Sunday?")
        ],
        "the branch sees the thread as it stood after the first answer"
    );
    assert_eq!(
        conversation(&store, "porto").await,
        said(&[
            (Role::User, "Weather in Porto?"),
            (Role::Assistant, "Rainy."),
            (Role::User, "And tomorrow?"),
            (Role::Assistant, "Windy."),
        ]),
        "the thread is untouched"
    );
    assert_eq!(
        conversation(&store, &branch.thread).await,
        said(&[
            (Role::User, "Weather in Porto?"),
            (Role::Assistant, "Rainy."),
            (Role::User, "And on Sunday?"),
            (Role::Assistant, "Sunny in the branch."),
        ])
    );
    let info = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .thread_info(&branch.thread)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.parent.as_deref(), info.fork_seq),
        (Some("porto"), Some(point))
    );

    // The branch's newest answer is continued on the branch; the thread's on the thread.
    let mut on_branch = continuing("And Monday?", branch.request_seq.unwrap());
    on_branch.thread = branch.thread.clone();
    let again = answered(&chat, on_branch).await;
    assert_eq!(
        (again.thread.as_str(), again.branched_after),
        (branch.thread.as_str(), None)
    );
    let last = answered(&chat, continuing("Wind?", second.request_seq.unwrap())).await;
    assert_eq!((last.thread.as_str(), last.branched_after), ("porto", None));

    // A point that is not a request of the thread is refused.
    let refused = chat.turn(continuing("Hm?", 1)).await;
    assert!(
        matches!(
            refused,
            Err(TurnError::Chat(ChatError::UnknownPoint { seq: 1 }))
        ),
        "{:?}",
        refused.err()
    );
}

#[tokio::test]
async fn a_keyed_turn_on_a_branch_is_answered_from_the_branch_when_sent_again() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    for reply in ["Rainy.", "Windy.", "Branch answer."] {
        upstream.push(Reply::text(reply));
    }
    let chat = service(store.clone(), &upstream);
    let first = answered(&chat, turn("Weather in Porto?", false)).await;
    answered(&chat, turn("And tomorrow?", false)).await;

    let keyed = || {
        let mut request = continuing("And on Sunday?", first.request_seq.unwrap());
        request.key = Some(("key-1".to_owned(), "digest-1".to_owned()));
        request
    };
    let branch = answered(&chat, keyed()).await;
    assert!(branch.branched_after.is_some());
    match chat.turn(keyed()).await {
        Ok(TurnAnswer::Replayed { answer, thread }) => {
            assert_eq!(thread, branch.thread);
            assert_eq!(answer.message.text(), "Branch answer.");
            assert_eq!(Some(answer.request_seq), branch.request_seq);
        }
        Ok(TurnAnswer::Upstream { .. } | TurnAnswer::Compacted { .. }) => {
            panic!("sent again instead of replayed")
        }
        Err(error) => panic!("{error}"),
    }
    assert_eq!(upstream.calls().len(), 3, "the retry called nothing");
}

#[tokio::test]
async fn instructions_are_the_calls_own_and_are_not_stored() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Chuvoso."));
    upstream.push(Reply::text("Windy."));
    let chat = service(store.clone(), &upstream);
    let mut request = turn("Weather in Porto?", false);
    request.instructions = Some("Answer in Portuguese.".to_owned());
    answered(&chat, request).await;
    answered(&chat, turn("And tomorrow?", false)).await;

    let calls = upstream.calls();
    assert_eq!(calls[0].json["system"], "Answer in Portuguese.");
    assert_eq!(
        calls[1].json.get("system"),
        None,
        "the next call has no instructions"
    );
    let events = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .events("porto")
        .await
        .unwrap();
    assert!(
        events.iter().all(|event| !matches!(
            &event.kind,
            EventKind::MessageAppended { message } if message.role.is_system_like()
        )),
        "no system message was stored"
    );
}

#[tokio::test]
async fn a_turn_that_stores_nothing_sees_the_thread_and_leaves_it_as_it_was() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Rainy."));
    upstream.push(Reply::text("Windy."));
    upstream.push(Reply::text("Not kept."));
    let chat = service(store.clone(), &upstream);
    let first = answered(&chat, turn("Weather in Porto?", false)).await;
    answered(&chat, turn("And tomorrow?", false)).await;
    let before = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .events("porto")
        .await
        .unwrap();

    let mut request = continuing("And on Sunday?", first.request_seq.unwrap());
    request.store = false;
    let place = answered(&chat, request).await;
    assert_eq!(place.request_seq, None);
    assert_eq!(
        sent(&upstream, 2),
        [
            json!("Weather in Porto?"),
            json!([{"type": "text", "text": "Rainy."}]),
            json!("And on Sunday?")
        ]
    );
    let after = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .events("porto")
        .await
        .unwrap();
    assert_eq!(before, after, "nothing was stored");

    // A thread that does not exist is not created.
    let mut request = turn("Hello?", false);
    request.thread = "nowhere".to_owned();
    request.store = false;
    upstream.push(Reply::text("Hi."));
    answered(&chat, request).await;
    let exists = store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .exists("nowhere")
        .await
        .unwrap();
    assert!(!exists);

    // A key means nothing to a turn that keeps nothing.
    let mut keyed = turn("Hello?", false);
    keyed.store = false;
    keyed.key = Some(("k".to_owned(), "d".to_owned()));
    assert!(matches!(
        chat.turn(keyed).await,
        Err(TurnError::Chat(ChatError::Invalid {
            field: "Idempotency-Key",
            ..
        }))
    ));
}

#[tokio::test]
async fn a_compaction_threshold_compacts_the_turn_and_says_what_stands_for_the_history() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text(
        "Rainy, and it will stay rainy all week long in Porto.",
    ));
    upstream.push(Reply::text("Windy."));
    let chat = service_with(store.clone(), &upstream, FitPolicy::default(), None);
    let first = answered(
        &chat,
        turn("Weather in Porto this week, day by day?", false),
    )
    .await;
    assert_eq!(first.summary, None);
    let mut request = turn("And tomorrow?", false);
    request.compact_threshold = Some(10);
    let place = answered(&chat, request).await;
    let summary = place.summary.expect("the turn compacted");
    let texts: Vec<String> = summary.iter().map(|message| message.text()).collect();
    assert!(
        texts.iter().any(|text| text.contains('-')),
        "the summarizer's text stands for the history: {texts:?}"
    );
}

#[tokio::test]
async fn a_turn_that_stores_nothing_is_fitted_by_the_threads_own_policy() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Rainy."));
    upstream.push(Reply::text("Not kept."));
    let chat = service(store.clone(), &upstream);
    answered(&chat, turn("Weather in Porto?", false)).await;
    // The thread's own policy: its system prompt goes as a user message.
    let policy: contexture_core::thread::ThreadPolicy =
        serde_json::from_value(json!({"context": {"system_role": "user"}})).unwrap();
    store
        .clone()
        .scoped(Tenant::new("acme").unwrap())
        .append_one(
            "porto",
            contexture_store::NewEvent::new(EventKind::PolicySet(
                contexture_core::thread::PolicyChange {
                    policy: Some(policy),
                },
            )),
        )
        .await
        .unwrap();
    let mut request = turn("And tomorrow?", false);
    request.store = false;
    request.instructions = Some("Answer in Portuguese.".to_owned());
    answered(&chat, request).await;
    let call = &upstream.calls()[1].json;
    assert_eq!(call.get("system"), None, "{call}");
    assert!(
        call["messages"][0]["content"]
            .to_string()
            .contains("Answer in Portuguese."),
        "{call}"
    );
}

#[tokio::test]
async fn an_answer_is_the_newest_until_the_conversation_goes_on_however_many_marks_follow_it() {
    use contexture_core::Message;
    use contexture_engine::chat::{continued_point, is_newest};
    use contexture_store::NewEvent;
    // (marks after the answer, then a message?) -> went on. Past 8 marks the read of the
    // turn does not reach the message: the rest of the log is read after it.
    let table = [
        (0, false, false),
        (0, true, true),
        (3, false, false),
        (3, true, true),
        (8, true, true),
        (20, false, false),
        (20, true, true),
    ];
    for (marks, message, went_on) in table {
        let (_dir, store) = sqlite().await;
        let upstream = FakeUpstream::start().await;
        let chat = service(store.clone(), &upstream);
        let first = answered(&chat, turn("Weather in Porto?", false)).await;
        let seq = first.request_seq.unwrap();
        let scoped = store.clone().scoped(Tenant::new("acme").unwrap());
        let mut events: Vec<NewEvent> = (0..marks)
            .map(|n| {
                NewEvent::new(EventKind::RequestDeleted {
                    request_seq: 1_000 + n,
                })
            })
            .collect();
        if message {
            events.push(NewEvent::new(EventKind::MessageAppended {
                message: Message::user("And tomorrow?"),
            }));
        }
        if !events.is_empty() {
            scoped.append("porto", events).await.unwrap();
        }
        let (point, found) = continued_point(&scoped, "porto", seq).await.unwrap();
        assert_eq!(found, went_on, "{marks} marks, message {message}");
        assert_eq!(point, seq + 2, "the point is the answer's");
        assert_eq!(is_newest(&scoped, "porto", seq).await.unwrap(), !went_on);
    }
}
