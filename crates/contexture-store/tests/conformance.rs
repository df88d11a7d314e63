//! One conformance suite, run against SQLite and PostgreSQL: every store operation,
//! concurrency (8 writers x 1,000 appends to one thread), reopening, API keys, the health
//! check, and the API keys' migration applied to a database an older build left.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use common::Harness;
use contexture_core::calibration::Observation;
use contexture_core::fit::FitPolicy;
use contexture_core::thread::{
    CompactionFailure, ConflictPolicy, ContextReplace, Event, EventKind, MergePolicy, MergeSpec,
    PolicyChange, ReplaceReason, RequestEnd, RequestOutcome, RequestRecord, RunEnd, RunLimits,
    RunStart, RunStatus, StepCompaction, StepEnd, StepFailure, StepMessage, StepStart, StoreChange,
    Thread, ThreadError, ThreadPolicy, Usage,
};
use contexture_core::tokens::{Encoding, message_tokens};
use contexture_core::{Message, Role, ToolCall};
use contexture_store::{
    ApiKeyRecord, ApiKeyStore, ExecutionQueueStore, NewEvent, PRUNE_BATCH, PruneReport,
    QueueCounts, QueueHold, QueueState, RecentCursor, RequestRetention, RetentionRules,
    RunEndStore, Store, StoreError, ThreadInfo, TurnQueueStore,
};
use serde_json::json;

fn say(message: Message) -> NewEvent {
    NewEvent::new(EventKind::MessageAppended { message })
}

fn user(text: &str) -> NewEvent {
    say(Message::user(text))
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

async fn appends_get_gap_free_seqs_and_read_back_intact(h: &impl Harness) {
    let s = h.store();
    let tool_turn =
        Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", r#"{"q":"x"}"#)]);
    let batch = vec![
        say(Message::system("be brief")),
        user("héllo 👋"),
        say(tool_turn.clone()),
        say(Message::tool_result("c1", "found")),
    ];
    assert_eq!(s.append("t1", batch.clone()).await.unwrap(), [1, 2, 3, 4]);
    assert_eq!(s.append_one("t1", user("next")).await.unwrap(), 5);
    assert_eq!(s.append("t1", vec![]).await.unwrap(), Vec::<u64>::new());
    let events = s.events("t1").await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    for (event, sent) in events.iter().zip(batch.iter().chain([&user("next")])) {
        assert_eq!(event.kind, sent.kind);
    }
    // Token counts come back from the store, equal to a fresh count.
    for event in &events {
        let EventKind::MessageAppended { message } = &event.kind else {
            panic!("not a message")
        };
        for encoding in Encoding::ALL {
            let stored = message.cached_tokens(encoding).expect("count stored");
            let fresh = message_tokens(&message.clone_without_cache(), encoding);
            assert_eq!(stored, fresh, "seq {} {encoding}", event.seq);
        }
    }
    assert!(matches!(
        s.events("missing").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A message equal to `self` with an empty token cache.
trait Fresh {
    fn clone_without_cache(&self) -> Message;
}

impl Fresh for Message {
    fn clone_without_cache(&self) -> Message {
        let mut fresh = self.clone();
        fresh.touch();
        fresh
    }
}

async fn idempotency_keys_store_a_retry_once(h: &impl Harness) {
    let s = h.store();
    assert_eq!(
        s.append_one("t", user("a").with_key("k1")).await.unwrap(),
        1
    );
    assert_eq!(s.append_one("t", user("b")).await.unwrap(), 2);
    // A retry, even with another body, returns the first seq and stores nothing.
    assert_eq!(
        s.append_one("t", user("a again").with_key("k1"))
            .await
            .unwrap(),
        1
    );
    // Inside one batch, a repeated key maps to the same seq.
    let seqs = s
        .append(
            "t",
            vec![
                user("c").with_key("k2"),
                user("d"),
                user("c").with_key("k2"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(seqs, [3, 4, 3]);
    // Keys are per thread.
    assert_eq!(
        s.append_one("other", user("a").with_key("k1"))
            .await
            .unwrap(),
        1
    );
    let thread = s.load("t").await.unwrap();
    assert_eq!(texts(&thread.projection().messages), ["a", "b", "c", "d"]);
    // The event a key stored is found by it, in its own thread only.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let found = s.keyed_event("t", "k2").await.unwrap().unwrap();
    assert_eq!(found.event.seq, 3);
    assert!(
        matches!(&found.event.kind, EventKind::MessageAppended { message } if message.text() == "c")
    );
    // Appended moments ago, by this machine's clock.
    assert!(
        (before - 60_000..=before).contains(&found.appended_at_ms),
        "{found:?}"
    );
    assert_eq!(s.keyed_event("t", "k3").await.unwrap(), None);
    assert_eq!(s.keyed_event("other", "k2").await.unwrap(), None);
    assert_eq!(s.keyed_event("missing", "k1").await.unwrap(), None);
}

async fn invalid_batches_store_nothing(h: &impl Harness) {
    let s = h.store();
    s.append_one("t", user("a")).await.unwrap();
    let beyond = NewEvent::new(EventKind::ContextReplaced(ContextReplace::new(
        "op",
        ReplaceReason::Manual,
        3,
        vec![],
    )));
    let error = s.append("t", vec![user("b"), beyond]).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::InvalidEvent { thread, source: ThreadError::ReplaceBeyondLog { seq: 3, to_seq: 3 } } if thread == "t"),
        "{error}"
    );
    let forked = NewEvent::new(EventKind::Forked {
        parent: "x".into(),
        at_seq: 1,
    });
    assert!(matches!(
        s.append_one("t", forked).await,
        Err(StoreError::ForkedEventAppended { .. })
    ));
    assert_eq!(s.events("t").await.unwrap().len(), 1);
    assert_eq!(s.append_one("t", user("c")).await.unwrap(), 2);
}

async fn every_event_kind_round_trips_and_replays(h: &impl Harness) {
    let s = h.store();
    let kinds = vec![
        EventKind::MessageAppended {
            message: Message::system("sys"),
        },
        EventKind::MessageAppended {
            message: Message::user("u1").pinned(),
        },
        EventKind::MessageAppended {
            message: Message::assistant("a1"),
        },
        EventKind::RequestStarted(RequestRecord {
            request_id: "r1".into(),
            model: Some("gpt-4o".into()),
            messages: vec![Message::system("sys"), Message::user("u1")],
            budget: None,
            ..Default::default()
        }),
        EventKind::ContextReplaced(ContextReplace::new(
            "op1",
            ReplaceReason::Compaction,
            3,
            vec![Message::assistant("summary")],
        )),
        EventKind::MessageAppended {
            message: Message::user("u2"),
        },
        EventKind::RequestEnded(RequestEnd::new(
            "r1",
            RequestOutcome::Cancelled,
            Usage::new(7, 1),
        )),
        EventKind::StoreChanged(StoreChange::Set {
            key: "k".into(),
            value: json!({"deep": [1, 2]}),
        }),
        EventKind::StoreChanged(StoreChange::Unset { key: "gone".into() }),
        EventKind::ContextSwitched {
            context: "main".into(),
            op_id: Some("switch-1".into()),
        },
    ];
    let seqs = s
        .append("t", kinds.iter().cloned().map(NewEvent::new).collect())
        .await
        .unwrap();
    assert_eq!(seqs, (1..=10).collect::<Vec<u64>>());
    let events = s.events("t").await.unwrap();
    let expected: Vec<Event> = kinds
        .into_iter()
        .zip(1..)
        .map(|(k, seq)| Event::new(seq, k))
        .collect();
    assert_eq!(events, expected);
    let thread = s.load("t").await.unwrap();
    assert_eq!(thread.in_flight(), None);
    assert_eq!(
        texts(&thread.projection().to_messages()),
        ["sys", "summary", "u2"]
    );
    assert_eq!(thread.usage(), Usage::new(7, 1));
    assert_eq!(thread.store().get("k"), Some(&json!({"deep": [1, 2]})));
}

async fn execution_log_events_round_trip_with_token_counts(h: &impl Harness) {
    let s = h.store();
    let tool_turn =
        Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", r#"{"q":"x"}"#)]);
    let mut end = RequestEnd::new("r1", RequestOutcome::Completed, Usage::new(20, 5));
    end.reply = Some(tool_turn.clone());
    end.finish_reason = Some("tool_calls".into());
    end.cost_usd = Some(0.000_25);
    end.attempts = Some(2);
    let kinds = vec![
        EventKind::RunStarted(RunStart {
            workflow_file: "wf.yaml".into(),
            workflow_text: "states: [{id: a}]".into(),
            input: "{\"k\": 1}".into(),
            llm: Some("scripted:r.yaml".into()),
            parent_execution_id: Some("parent".into()),
            limits: RunLimits {
                max_tokens: Some(1000),
                max_cost_usd: Some(0.5),
                max_steps: None,
                max_seconds: Some(30.0),
            },
            conversation: Some("conversation:t:u:w".into()),
            from_client: true,
            user_context: serde_json::json!({"plan": "pro", "user": {"name": "Ada"}})
                .as_object()
                .cloned(),
        }),
        EventKind::StepStarted(StepStart {
            step: 1,
            state_id: "a".into(),
            item: Some(0),
            task: Some("do it".into()),
            arguments: Some(json!({"sql": "SELECT 1"})),
            child_execution_id: Some("x~child.1".into()),
            fork_thread: Some("x~a.fork.1".into()),
        }),
        EventKind::RequestStarted(RequestRecord {
            request_id: "r1".into(),
            messages: vec![Message::user("do it")],
            step: Some(1),
            tools: vec![json!({"type": "function", "function": {"name": "search"}})],
            ..Default::default()
        }),
        EventKind::RequestEnded(end),
        EventKind::StepMessage(StepMessage {
            step: 1,
            message: tool_turn,
        }),
        EventKind::StepMessage(StepMessage {
            step: 1,
            message: Message::tool_result("c1", "found"),
        }),
        EventKind::StepFinished(StepEnd {
            step: 1,
            state_id: "a".into(),
            item: Some(0),
            output: "done".into(),
            next: Some("b".into()),
            items: Some(vec![json!(1), json!({"x": 2})]),
            merge: Some(contexture_core::context::MergePolicy::Append),
            item_keys: Some(vec!["topic".into()]),
            item_concurrency: Some(3),
        }),
        EventKind::StepFailed(StepFailure {
            step: 2,
            state_id: "b".into(),
            error: "boom".into(),
        }),
        EventKind::RunEnded(RunEnd {
            status: RunStatus::Failed,
            output: None,
            error: Some("boom".into()),
        }),
        EventKind::CompactionFailed(CompactionFailure {
            from_seq: 1,
            to_seq: 4,
            step: None,
            summarizer: "gpt-4o-mini".into(),
            error: "HTTP 500 (after 3 attempts)".into(),
            attempts: 3,
        }),
        EventKind::StepCompacted(StepCompaction {
            step: 2,
            covered: 5,
            replacement: vec![Message::user("task"), Message::user("Summary: ...")],
            summarizer: "extractive".into(),
            tokens_before: 900,
            tokens_after: 40,
        }),
        EventKind::PolicySet(PolicyChange {
            policy: Some(ThreadPolicy {
                fit: Some(FitPolicy {
                    window: Some(8_000),
                    ..FitPolicy::default()
                }),
                compaction: None,
            }),
        }),
        EventKind::PolicySet(PolicyChange { policy: None }),
    ];
    let seqs = s
        .append("x", kinds.iter().cloned().map(NewEvent::new).collect())
        .await
        .unwrap();
    assert_eq!(seqs.len(), kinds.len());
    let events = s.events("x").await.unwrap();
    for (event, kind) in events.iter().zip(&kinds) {
        assert_eq!(&event.kind, kind);
        // Messages inside the events come back with their token counts.
        for message in event.kind.messages() {
            for encoding in Encoding::ALL {
                let fresh = message_tokens(&message.clone_without_cache(), encoding);
                assert_eq!(message.cached_tokens(encoding), Some(fresh));
            }
        }
    }
    // The execution log leaves the projection alone.
    let thread = s.load("x").await.unwrap();
    assert!(thread.projection().messages.is_empty());
    assert_eq!(thread.usage(), Usage::new(20, 5));
    assert_eq!(thread.policy(), None, "the last policy_set cleared it");
}

async fn a_threads_policy_is_read_with_its_tail_and_inherited_by_forks(h: &impl Harness) {
    let s = h.store();
    let policy = ThreadPolicy {
        fit: Some(FitPolicy {
            window: Some(4_000),
            ..FitPolicy::default()
        }),
        compaction: None,
    };
    let set =
        |policy: Option<ThreadPolicy>| NewEvent::new(EventKind::PolicySet(PolicyChange { policy }));
    s.append("p", vec![user("one"), set(Some(policy.clone()))])
        .await
        .unwrap();
    s.append("p", (0..40).map(|i| user(&format!("turn {i}"))).collect())
        .await
        .unwrap();
    // A tail of one message still carries the policy set before it.
    let tail = s
        .load_projection_tail("p", Encoding::O200kBase, 1)
        .await
        .unwrap();
    assert_eq!(tail.policy.as_ref(), Some(&policy));
    s.fork("p", 42, "p-fork").await.unwrap();
    s.append("p", vec![set(None)]).await.unwrap();
    let fork = s
        .load_projection_tail("p-fork", Encoding::O200kBase, 1)
        .await
        .unwrap();
    assert_eq!(fork.policy.as_ref(), Some(&policy), "the fork inherits it");
    let parent = s
        .load_projection_tail("p", Encoding::O200kBase, 1)
        .await
        .unwrap();
    assert_eq!(parent.policy, None, "cleared in the parent only");
    // The seq of the last request record comes with the tail.
    assert_eq!(parent.last_request, None);
}

async fn events_after_a_seq_are_the_rest_of_the_log(h: &impl Harness) {
    let s = h.store();
    s.append("p", (1..=5).map(|i| user(&format!("p{i}"))).collect())
        .await
        .unwrap();
    let seqs = |events: Vec<Event>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(s.events_after("p", 0).await.unwrap()), [1, 2, 3, 4, 5]);
    assert_eq!(seqs(s.events_after("p", 3).await.unwrap()), [4, 5]);
    assert!(s.events_after("p", 5).await.unwrap().is_empty());
    assert!(s.events_after("p", 99).await.unwrap().is_empty());
    // In a fork, the parent's shared prefix counts as the fork's own log.
    s.fork("p", 3, "c").await.unwrap();
    s.append_one("c", user("c5")).await.unwrap();
    assert_eq!(seqs(s.events_after("c", 2).await.unwrap()), [3, 4, 5]);
    assert_eq!(seqs(s.events_after("c", 4).await.unwrap()), [5]);
    assert_eq!(
        s.events_after("c", 0).await.unwrap(),
        s.events("c").await.unwrap()
    );
}

async fn forks_read_the_parent_prefix_without_copying(h: &impl Harness) {
    let s = h.store();
    s.append("p", (1..=5).map(|i| user(&format!("p{i}"))).collect())
        .await
        .unwrap();
    assert_eq!(s.fork("p", 3, "c").await.unwrap(), 4);
    assert_eq!(s.append_one("c", user("c5")).await.unwrap(), 5);
    assert_eq!(s.append_one("p", user("p6")).await.unwrap(), 6);
    let child = s.load("c").await.unwrap();
    assert_eq!(
        texts(&child.projection().messages),
        ["p1", "p2", "p3", "c5"]
    );
    assert_eq!(
        child.fork_point().map(|f| (f.parent.as_str(), f.at_seq)),
        Some(("p", 3))
    );

    // A fork of the fork, at a point inside the grandparent's part.
    assert_eq!(s.fork("c", 2, "g").await.unwrap(), 3);
    s.append_one("g", user("g4")).await.unwrap();
    let grandchild = s.load("g").await.unwrap();
    assert_eq!(texts(&grandchild.projection().messages), ["p1", "p2", "g4"]);
    // And one past the fork point.
    s.fork("c", 5, "g2").await.unwrap();
    assert_eq!(
        texts(&s.load("g2").await.unwrap().projection().messages),
        ["p1", "p2", "p3", "c5"]
    );
    // Fork before the first event.
    s.fork("p", 0, "empty").await.unwrap();
    assert!(
        s.load("empty")
            .await
            .unwrap()
            .projection()
            .messages
            .is_empty()
    );

    let errors = [
        (s.fork("nope", 0, "x").await, "NotFound"),
        (s.fork("p", 7, "x").await, "ForkBeyondEnd"),
        (s.fork("p", 1, "c").await, "AlreadyExists"),
        (s.fork("p", 1, "p").await, "AlreadyExists"),
    ];
    for (result, expected) in errors {
        let error = result.unwrap_err();
        assert!(format!("{error:?}").starts_with(expected), "{error:?}");
    }
}

async fn merges_are_events_on_the_parent(h: &impl Harness) {
    let s = h.store();
    s.append("p", vec![user("task")]).await.unwrap();
    s.fork("p", 1, "c").await.unwrap();
    s.append(
        "c",
        vec![
            NewEvent::new(EventKind::RequestStarted(RequestRecord {
                request_id: "r".into(),
                model: None,
                messages: vec![],
                budget: None,
                ..Default::default()
            })),
            NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                "r",
                RequestOutcome::Completed,
                Usage::new(11, 4),
            ))),
            say(Message::assistant("answer")),
            NewEvent::new(EventKind::StoreChanged(StoreChange::Set {
                key: "out".into(),
                value: json!(1),
            })),
        ],
    )
    .await
    .unwrap();
    let parent = s.load("p").await.unwrap();
    let child = s.load("c").await.unwrap();
    let spec = MergeSpec {
        policy: MergePolicy::SummaryOnly,
        conflict: ConflictPolicy::Error,
        keys: vec!["out".into()].into(),
    };
    let merge = parent.plan_merge(&child, &spec).unwrap();
    assert_eq!(
        s.append_one("p", NewEvent::new(merge).with_key("merge-c-6"))
            .await
            .unwrap(),
        2
    );
    let parent = s.load("p").await.unwrap();
    assert_eq!(texts(&parent.projection().messages), ["task", "answer"]);
    assert_eq!(parent.store().get("out"), Some(&json!(1)));
    assert_eq!(parent.usage(), Usage::new(11, 4));
    assert_eq!(parent.merged_through("c"), Some(6));
}

async fn list_describes_threads_and_forks(h: &impl Harness) {
    let s = h.store();
    s.append("b", vec![user("1"), user("2")]).await.unwrap();
    s.append("a", vec![user("1")]).await.unwrap();
    s.fork("b", 1, "b-fork").await.unwrap();
    let list = s.list().await.unwrap();
    let summary: Vec<_> = list
        .iter()
        .map(|t| (&*t.id, t.parent.as_deref(), t.fork_seq, t.last_seq))
        .collect();
    assert_eq!(
        summary,
        [
            ("a", None, None, 1),
            ("b", None, None, 2),
            ("b-fork", Some("b"), Some(1), 2)
        ]
    );
    assert!(
        list.iter()
            .all(|t| t.created_at_ms > 0 && t.updated_at_ms >= t.created_at_ms)
    );
}

async fn deleting_a_thread_with_forks_is_refused(h: &impl Harness) {
    let s = h.store();
    s.append("p", vec![user("1")]).await.unwrap();
    s.fork("p", 1, "c1").await.unwrap();
    s.fork("p", 0, "c2").await.unwrap();
    match s.delete("p").await {
        Err(StoreError::HasForks { thread, forks }) => {
            assert_eq!(thread, "p");
            assert_eq!(forks, ["c1", "c2"]);
        }
        other => panic!("expected HasForks, got {other:?}"),
    }
    assert_eq!(s.events("c1").await.unwrap().len(), 2);
    s.delete("c1").await.unwrap();
    s.delete("c2").await.unwrap();
    s.delete("p").await.unwrap();
    assert!(matches!(
        s.delete("p").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(s.list().await.unwrap().is_empty());
    // The id can be used again from scratch.
    assert_eq!(s.append_one("p", user("new")).await.unwrap(), 1);
}

async fn a_thread_exists_from_its_first_write_until_it_is_deleted(h: &impl Harness) {
    let s = h.store();
    let any = h.any();
    assert!(!s.exists("t").await.unwrap());
    assert!(!any.exists("t").await.unwrap());
    s.append_one("t", user("1")).await.unwrap();
    s.fork("t", 1, "t-fork").await.unwrap();
    for id in ["t", "t-fork"] {
        assert!(s.exists(id).await.unwrap(), "{id}");
        assert!(any.exists(id).await.unwrap(), "{id}");
    }
    // Ids are exact: a prefix, a longer id or another case is another thread.
    for id in ["", "T", "t-", "t-fork-2", "t/child"] {
        assert!(!s.exists(id).await.unwrap(), "{id:?}");
    }
    s.delete("t-fork").await.unwrap();
    assert!(!s.exists("t-fork").await.unwrap());
    assert!(s.exists("t").await.unwrap());
}

/// Appends to one thread racing deletes of it from another process: each append lands
/// before a delete (and goes with it) or after it (in a new thread of the same id); none
/// leaves events behind that a new thread would collide with or show.
async fn appends_racing_deletes_leave_no_events_behind(h: &impl Harness) {
    let s = h.store();
    let other = h.reopen().await;
    let appends = async {
        for i in 0..300 {
            s.append_one("r", user(&format!("a{i}"))).await.unwrap();
        }
    };
    let deletes = async {
        let mut deleted = 0;
        for _ in 0..300 {
            match other.delete("r").await {
                Ok(()) => deleted += 1,
                Err(StoreError::NotFound { .. }) => {}
                Err(error) => panic!("delete: {error}"),
            }
            tokio::task::yield_now().await;
        }
        deleted
    };
    let ((), deleted) = tokio::join!(appends, deletes);
    assert!(deleted > 0, "no delete met a thread");
    match s.delete("r").await {
        Ok(()) | Err(StoreError::NotFound { .. }) => {}
        Err(error) => panic!("delete: {error}"),
    }
    s.append_one("r", user("fresh")).await.unwrap();
    let events = other.events("r").await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].seq, 1);
    assert_projection_replays(s, "r", "after the race").await;
}

async fn pruning_removes_idle_threads_forks_first(h: &impl Harness) {
    let s = h.store();
    s.append("a", vec![user("1")]).await.unwrap();
    s.fork("a", 1, "a-fork").await.unwrap();
    s.append("c", vec![user("1")]).await.unwrap();
    s.fork("c", 1, "c-fork").await.unwrap();
    s.append("solo", vec![user("1")]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.append_one("c-fork", user("still active")).await.unwrap();
    s.append_one("fresh", user("new")).await.unwrap();

    let report = s.prune(cutoff).await.unwrap();
    assert_eq!(
        report,
        PruneReport {
            deleted: vec!["a-fork".into(), "solo".into(), "a".into()],
            kept_for_forks: vec!["c".into()],
        }
    );
    let ids: Vec<String> = s.list().await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(ids, ["c", "c-fork", "fresh"]);
    assert_eq!(
        texts(&s.load("c-fork").await.unwrap().projection().messages),
        ["1", "still active"]
    );
    // Nothing idle before the epoch.
    assert_eq!(
        s.prune(SystemTime::UNIX_EPOCH).await.unwrap(),
        PruneReport::default()
    );
}

async fn pruning_under_a_prefix_touches_only_its_threads(h: &impl Harness) {
    let s = h.store();
    s.append("acme/old", vec![user("1")]).await.unwrap();
    s.fork("acme/old", 1, "acme/old-fork").await.unwrap();
    s.append("acme/parent", vec![user("1")]).await.unwrap();
    s.fork("acme/parent", 1, "acme/parent-fork").await.unwrap();
    s.append("acme-co/old", vec![user("1")]).await.unwrap();
    s.append("zeta/old", vec![user("1")]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.append_one("acme/parent-fork", user("still active"))
        .await
        .unwrap();

    let report = s.prune_under("acme/", cutoff).await.unwrap();
    assert_eq!(
        report,
        PruneReport {
            deleted: vec!["acme/old-fork".into(), "acme/old".into()],
            kept_for_forks: vec!["acme/parent".into()],
        }
    );
    // The ids that only start like the prefix's, and the others, are left alone.
    let ids: Vec<String> = s.list().await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(
        ids,
        ["acme-co/old", "acme/parent", "acme/parent-fork", "zeta/old"]
    );
    // The whole store's pruning is the empty prefix's.
    let report = s.prune(cutoff).await.unwrap();
    assert_eq!(
        report.deleted,
        ["acme-co/old".to_owned(), "zeta/old".to_owned()]
    );
}

async fn reopening_keeps_everything(h: &impl Harness) {
    let s = h.store();
    s.append("t", vec![user("1"), user("2").with_key("k")])
        .await
        .unwrap();
    s.fork("t", 1, "f").await.unwrap();
    let before = s.events("t").await.unwrap();
    for _ in 0..2 {
        let again = h.reopen().await;
        assert_eq!(again.events("t").await.unwrap(), before);
        assert_eq!(again.events("f").await.unwrap().len(), 2);
        assert_eq!(
            again
                .append_one("t", user("2").with_key("k"))
                .await
                .unwrap(),
            2
        );
    }
    let again = h.reopen().await;
    assert_eq!(again.append_one("t", user("3")).await.unwrap(), 3);
    let loaded = again.load("t").await.unwrap();
    assert_eq!(texts(&loaded.projection().messages), ["1", "2", "3"]);
}

async fn concurrent_writers_get_unique_gap_free_seqs(h: &impl Harness) {
    const WRITERS: u64 = 8;
    const APPENDS: u64 = 1_000;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let store = h.store().clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::with_capacity(APPENDS as usize);
            for i in 0..APPENDS {
                let seq = store
                    .append_one("hot", user(&format!("w{writer}-{i}")))
                    .await
                    .expect("append");
                seqs.push(seq);
            }
            seqs
        }));
    }
    let mut all = BTreeSet::new();
    let mut by_writer = Vec::new();
    for task in tasks {
        let seqs = task.await.expect("writer task");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "a writer's seqs increase"
        );
        all.extend(seqs.iter().copied());
        by_writer.push(seqs);
    }
    assert_eq!(all.len() as u64, WRITERS * APPENDS, "no duplicate seq");
    assert_eq!(
        all.iter().copied().collect::<Vec<_>>(),
        (1..=WRITERS * APPENDS).collect::<Vec<_>>()
    );
    let events = h.store().events("hot").await.unwrap();
    assert_eq!(events.len() as u64, WRITERS * APPENDS);
    for (writer, seqs) in by_writer.iter().enumerate() {
        for (i, seq) in seqs.iter().enumerate() {
            let EventKind::MessageAppended { message } = &events[*seq as usize - 1].kind else {
                panic!("not a message")
            };
            assert_eq!(message.text(), format!("w{writer}-{i}"));
        }
    }
    let thread: Thread = h.store().load("hot").await.unwrap();
    assert_eq!(thread.last_seq(), WRITERS * APPENDS);
}

async fn projection_loads_match_full_replays(h: &impl Harness) {
    let s = h.store();
    let replace = |op: &str, to_seq: u64, text: &str| {
        NewEvent::new(EventKind::ContextReplaced(ContextReplace::new(
            op,
            ReplaceReason::Compaction,
            to_seq,
            vec![Message::assistant(text)],
        )))
    };
    let mut log = vec![say(Message::system("be brief"))];
    log.extend((2..=40).map(|i| user(&format!("m{i}"))));
    log.push(replace("c1", 30, "summary of 1..30"));
    log.extend((42..=60).map(|i| user(&format!("m{i}"))));
    log.push(say(Message::system("be briefer")));
    log.push(NewEvent::new(EventKind::RequestStarted(RequestRecord {
        request_id: "r1".into(),
        model: None,
        messages: Vec::new(),
        budget: None,
        ..Default::default()
    })));
    // Queued behind the request: it takes effect at the request's end.
    log.push(replace("c2", 55, "summary of 1..55"));
    log.push(user("during the request"));
    log.push(NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
        "r1",
        RequestOutcome::Completed,
        Usage::new(10, 2),
    ))));
    log.push(user("after"));
    s.append("long", log).await.unwrap();
    s.fork("long", 45, "branch").await.unwrap();
    s.append_one("branch", user("branch only")).await.unwrap();
    for thread in ["long", "branch"] {
        let lazy = s.load_projection(thread).await.unwrap();
        let full = s.load(thread).await.unwrap().projection();
        assert_eq!(lazy, full, "{thread}");
        for (a, b) in lazy.messages.iter().zip(&full.messages) {
            assert_eq!(
                a.cached_tokens(Encoding::O200kBase),
                b.cached_tokens(Encoding::O200kBase)
            );
        }
    }
    let long = s.load_projection("long").await.unwrap();
    assert_eq!(
        long.system.as_ref().map(Message::text).as_deref(),
        Some("be briefer")
    );
    assert_eq!(long.messages[0].text(), "summary of 1..55");
    assert!(matches!(
        s.load_projection("missing").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// Asserts that the projection `s` loads for `thread` is the full replay's.
async fn assert_projection_replays(s: &impl Store, thread: &str, case: &str) {
    let lazy = s.load_projection(thread).await.unwrap();
    let full = s.load(thread).await.unwrap().projection();
    assert_eq!(lazy, full, "{case}");
}

/// A store may keep folds of threads it has read (the SQLite store does): its projections
/// must stay the full replay's through appends, compactions, forks, and deletes and
/// re-creations of the same id, its own or another process's.
async fn repeated_projection_loads_follow_every_change(h: &impl Harness) {
    let s = h.store();
    let other = h.reopen().await;
    let replace = |op: &str, to_seq: u64| {
        NewEvent::new(EventKind::ContextReplaced(ContextReplace::new(
            op,
            ReplaceReason::Compaction,
            to_seq,
            vec![Message::assistant(format!("summary of 1..{to_seq}"))],
        )))
    };
    s.append_one("t", say(Message::system("be brief")))
        .await
        .unwrap();
    for i in 2..=40u64 {
        let event = if i % 10 == 0 {
            replace(&format!("c{i}"), i - 3)
        } else {
            user(&format!("m{i}"))
        };
        // Every third append comes from the other process.
        if i % 3 == 0 {
            other.append_one("t", event).await.unwrap();
        } else {
            s.append_one("t", event).await.unwrap();
        }
        assert_projection_replays(s, "t", &format!("after event {i}")).await;
    }
    // A fork read after its parent, then both grow.
    s.fork("t", 25, "f").await.unwrap();
    assert_projection_replays(s, "f", "fork").await;
    s.append_one("f", user("fork only")).await.unwrap();
    s.append_one("t", user("parent only")).await.unwrap();
    assert_projection_replays(s, "f", "fork grown").await;
    assert_projection_replays(s, "t", "parent grown").await;
    let parent = s.load_projection("t").await.unwrap();
    assert!(!texts(&parent.messages).contains(&"fork only".to_string()));

    // Deleted by the other process and made again with the same id: as long as before,
    // shorter, and longer.
    s.delete("f").await.unwrap();
    for (round, length) in [(1, 41u64), (2, 3), (3, 60)] {
        let last = s.load("t").await.unwrap().last_seq();
        other.delete("t").await.unwrap();
        let events = (1..=length)
            .map(|i| user(&format!("round {round} message {i}")))
            .collect();
        other.append("t", events).await.unwrap();
        assert_projection_replays(s, "t", &format!("re-made ({length} events after {last})")).await;
        let projection = s.load_projection("t").await.unwrap();
        assert_eq!(
            projection.messages.last().map(Message::text),
            Some(format!("round {round} message {length}"))
        );
    }
    // Deleted by this process, then by pruning in the other.
    s.delete("t").await.unwrap();
    assert!(matches!(
        s.load_projection("t").await,
        Err(StoreError::NotFound { .. })
    ));
    s.append_one("t", user("again")).await.unwrap();
    assert_projection_replays(s, "t", "re-made by this process").await;
    let report = other
        .prune(SystemTime::now() + Duration::from_secs(60))
        .await
        .unwrap();
    assert!(report.deleted.contains(&"t".to_string()));
    assert!(matches!(
        s.load_projection("t").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// The ids of `keys`, in order.
fn ids(keys: &[ApiKeyRecord]) -> Vec<&str> {
    keys.iter().map(|k| &*k.id).collect()
}

/// Asserts that `result` is [`StoreError::KeyExists`] naming `id`.
fn assert_key_exists<T: std::fmt::Debug>(result: Result<T, StoreError>, id: &str, case: &str) {
    match result {
        Err(StoreError::KeyExists { id: named }) => assert_eq!(named, id, "{case}"),
        other => panic!("{case}: expected KeyExists, got {other:?}"),
    }
}

async fn api_keys_are_found_by_hash(h: &impl Harness) {
    let s = h.store();
    let created = s
        .create_api_key("ck_1", "acme", "ci", "hash-1")
        .await
        .unwrap();
    assert_eq!(
        (
            &*created.id,
            created.tenant.as_str(),
            &*created.name,
            created.revoked_at_ms
        ),
        ("ck_1", "acme", "ci", None)
    );
    assert!(created.created_at_ms > 0);
    s.create_api_key("ck_2", "acme", "laptop", "hash-2")
        .await
        .unwrap();
    s.create_api_key("ck_3", "globex", "ci", "hash-3")
        .await
        .unwrap();
    let table = [
        ("hash-1", Some("ck_1")),
        ("hash-2", Some("ck_2")),
        ("hash-3", Some("ck_3")),
        ("unknown", None),
        ("", None),
        ("HASH-1", None),
        ("hash-", None),
        ("ck_1", None),
    ];
    for (hash, expected) in table {
        let found = s.api_key_by_hash(hash).await.unwrap();
        assert_eq!(found.as_ref().map(|k| &*k.id), expected, "{hash}");
    }
    assert_eq!(s.api_key_by_hash("hash-1").await.unwrap(), Some(created));
}

async fn duplicate_api_key_ids_and_hashes_are_refused(h: &impl Harness) {
    let s = h.store();
    let original = s
        .create_api_key("ck_1", "acme", "ci", "hash-1")
        .await
        .unwrap();
    let table = [
        ("same id", "ck_1", "hash-2"),
        ("same hash", "ck_2", "hash-1"),
        ("same id and hash", "ck_1", "hash-1"),
    ];
    for (case, id, hash) in table {
        assert_key_exists(
            s.create_api_key(id, "globex", "intruder", hash).await,
            id,
            case,
        );
    }
    // Nothing was overwritten, nothing was added.
    assert_eq!(
        s.list_api_keys(None).await.unwrap(),
        std::slice::from_ref(&original)
    );
    assert_eq!(s.api_key_by_hash("hash-1").await.unwrap(), Some(original));
    assert_eq!(s.api_key_by_hash("hash-2").await.unwrap(), None);
    // A revoked key keeps its id and its hash.
    assert!(s.revoke_api_key("ck_1").await.unwrap());
    assert_key_exists(
        s.create_api_key("ck_1", "acme", "again", "hash-9").await,
        "ck_1",
        "revoked id",
    );
    assert_key_exists(
        s.create_api_key("ck_9", "acme", "again", "hash-1").await,
        "ck_9",
        "revoked hash",
    );
    assert_eq!(s.api_key_by_hash("hash-1").await.unwrap(), None);
    // Racing creations of one hash: exactly one wins.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = h.store().clone();
        tasks.push(tokio::spawn(async move {
            store
                .create_api_key(&format!("ck_race_{i}"), "acme", "race", "hash-race")
                .await
        }));
    }
    let mut won = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.expect("creating task") {
            Ok(record) => won.push(record),
            Err(error) => assert_key_exists(Err::<(), _>(error), &format!("ck_race_{i}"), "race"),
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(
        s.api_key_by_hash("hash-race").await.unwrap(),
        Some(won.remove(0))
    );
    assert_eq!(s.list_api_keys(None).await.unwrap().len(), 2);
}

async fn api_keys_are_listed_by_tenant_oldest_first(h: &impl Harness) {
    let s = h.store();
    assert!(s.list_api_keys(None).await.unwrap().is_empty());
    // Ids deliberately out of creation order.
    let creations = [
        ("ck_c", "acme", "first"),
        ("ck_a", "globex", "second"),
        ("ck_b", "acme", "third"),
        ("ck_0", "acme", "fourth"),
        ("ck_z", "globex", "fifth"),
    ];
    let mut created = Vec::new();
    for (i, (id, tenant, name)) in creations.into_iter().enumerate() {
        created.push(
            s.create_api_key(id, tenant, name, &format!("hash-{i}"))
                .await
                .unwrap(),
        );
    }
    let table: [(Option<&str>, &[&str]); 5] = [
        (None, &["ck_c", "ck_a", "ck_b", "ck_0", "ck_z"]),
        (Some("acme"), &["ck_c", "ck_b", "ck_0"]),
        (Some("globex"), &["ck_a", "ck_z"]),
        (Some("initech"), &[]),
        (Some(""), &[]),
    ];
    for (tenant, expected) in table {
        let listed = s.list_api_keys(tenant).await.unwrap();
        assert_eq!(ids(&listed), expected, "{tenant:?}");
        for key in &listed {
            assert!(created.contains(key), "{key:?}");
        }
        assert!(
            listed
                .windows(2)
                .all(|w| w[0].created_at_ms <= w[1].created_at_ms)
        );
    }
    // Keys outlive the process that created them.
    let again = h.reopen().await;
    assert_eq!(again.list_api_keys(None).await.unwrap(), created);
    // Keys created in the same millisecond (written directly: the store's clock cannot be
    // stopped) are listed in insertion order, not by id.
    h.execute_raw(
        "INSERT INTO api_keys (id, tenant, name, key_hash, created_at) VALUES
             ('ck_tie_c', 'tied', 'first', 'hash-tie-c', 1000);
         INSERT INTO api_keys (id, tenant, name, key_hash, created_at) VALUES
             ('ck_tie_a', 'tied', 'second', 'hash-tie-a', 1000);
         INSERT INTO api_keys (id, tenant, name, key_hash, created_at) VALUES
             ('ck_tie_b', 'tied', 'third', 'hash-tie-b', 1000);",
    )
    .await;
    let tied = s.list_api_keys(Some("tied")).await.unwrap();
    assert_eq!(ids(&tied), ["ck_tie_c", "ck_tie_a", "ck_tie_b"]);
    let all = s.list_api_keys(None).await.unwrap();
    assert_eq!(ids(&all[..3]), ["ck_tie_c", "ck_tie_a", "ck_tie_b"]);
}

async fn revoked_api_keys_are_listed_but_not_found(h: &impl Harness) {
    let s = h.store();
    s.create_api_key("ck_1", "acme", "ci", "hash-1")
        .await
        .unwrap();
    s.create_api_key("ck_2", "acme", "laptop", "hash-2")
        .await
        .unwrap();
    assert!(s.revoke_api_key("ck_1").await.unwrap());
    assert_eq!(s.api_key_by_hash("hash-1").await.unwrap(), None);
    assert_eq!(
        s.api_key_by_hash("hash-2")
            .await
            .unwrap()
            .map(|k| k.id)
            .as_deref(),
        Some("ck_2")
    );
    let listed = s.list_api_keys(Some("acme")).await.unwrap();
    assert_eq!(ids(&listed), ["ck_1", "ck_2"]);
    let revoked_at = listed[0].revoked_at_ms.expect("ck_1 is revoked");
    assert!(revoked_at >= listed[0].created_at_ms);
    assert_eq!(listed[1].revoked_at_ms, None);
    // (id, revoked now): a second revoke, an unknown id, then the other key twice.
    let table = [
        ("ck_1", false),
        ("unknown", false),
        ("", false),
        ("hash-2", false),
        ("ck_2", true),
        ("ck_2", false),
    ];
    for (id, expected) in table {
        assert_eq!(s.revoke_api_key(id).await.unwrap(), expected, "{id}");
    }
    let listed = s.list_api_keys(None).await.unwrap();
    assert_eq!(ids(&listed), ["ck_1", "ck_2"]);
    // A second revoke leaves the first revocation's time alone.
    assert_eq!(listed[0].revoked_at_ms, Some(revoked_at));
    assert!(listed[1].revoked_at_ms.is_some());
    assert_eq!(s.api_key_by_hash("hash-2").await.unwrap(), None);
    // Revocations outlive the process.
    assert_eq!(h.reopen().await.list_api_keys(None).await.unwrap(), listed);
}

async fn ping_answers(h: &impl Harness) {
    h.store().ping().await.unwrap();
    h.reopen().await.ping().await.unwrap();
    // Many at once, as readiness probes racing writes would.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = h.store().clone();
        tasks.push(tokio::spawn(async move {
            store.ping().await?;
            store.append_one("t", user(&format!("m{i}"))).await?;
            store.ping().await
        }));
    }
    for task in tasks {
        task.await.expect("ping task").unwrap();
    }
}

async fn a_full_thread_refuses_appends_and_stores_nothing_of_them(h: &impl Harness) {
    let s = h.any();
    s.set_max_thread_events(Some(3));
    assert_eq!(
        s.append("t", vec![user("a"), user("b")]).await.unwrap(),
        [1, 2]
    );
    // Plain and keyed batches that would pass the limit store nothing.
    for batch in [
        vec![user("c"), user("d")],
        vec![user("c").with_key("k1"), user("d").with_key("k2")],
    ] {
        match s.append("t", batch).await {
            Err(StoreError::ThreadFull { thread, max_events }) => {
                assert_eq!((thread.as_str(), max_events), ("t", 3));
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    assert_eq!(s.events("t").await.unwrap().len(), 2);
    assert_eq!(s.append_one("t", user("c")).await.unwrap(), 3);
    assert!(matches!(
        s.append_one("t", user("d").with_key("k3")).await,
        Err(StoreError::ThreadFull { .. })
    ));
    // A new thread is held to it too, and other threads are not touched.
    assert!(matches!(
        s.append("new", vec![user("1"), user("2"), user("3"), user("4")])
            .await,
        Err(StoreError::ThreadFull { .. })
    ));
    assert_eq!(s.append_one("other", user("x")).await.unwrap(), 1);
    s.set_max_thread_events(None);
    assert_eq!(s.append_one("t", user("d")).await.unwrap(), 4);
}

async fn threads_are_listed_by_prefix_a_page_at_a_time(h: &impl Harness) {
    let s = h.store();
    for id in [
        "acme/b", "acme/a", "acme/c", "acme0", "acmeX/z", "globex/a", "acme/é",
    ] {
        s.append_one(id, user("x")).await.unwrap();
    }
    let ids = |page: Vec<contexture_store::ThreadInfo>| -> Vec<String> {
        page.into_iter().map(|info| info.id).collect()
    };
    assert_eq!(
        ids(s.list_page("acme/", "", 2).await.unwrap()),
        ["acme/a", "acme/b"]
    );
    assert_eq!(
        ids(s.list_page("acme/", "acme/b", 2).await.unwrap()),
        ["acme/c", "acme/é"]
    );
    assert!(s.list_page("acme/", "acme/é", 2).await.unwrap().is_empty());
    assert_eq!(
        ids(s.list_page("globex/", "", 10).await.unwrap()),
        ["globex/a"]
    );
    assert_eq!(s.list_page("", "", 100).await.unwrap().len(), 7);
    assert_eq!(
        ids(s.list().await.unwrap()),
        ids(s.list_page("", "", 100).await.unwrap())
    );
}

async fn any_store_delegates_api_keys_and_ping(h: &impl Harness) {
    let any = h.any();
    any.ping().await.unwrap();
    let created = any
        .create_api_key("ck_1", "acme", "ci", "hash-1")
        .await
        .unwrap();
    // The same database underneath.
    assert_eq!(
        h.store().api_key_by_hash("hash-1").await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        any.api_key_by_hash("hash-1").await.unwrap(),
        Some(created.clone())
    );
    assert_key_exists(
        any.create_api_key("ck_2", "acme", "ci", "hash-1").await,
        "ck_2",
        "any",
    );
    assert_eq!(any.list_api_keys(Some("acme")).await.unwrap(), [created]);
    assert!(any.list_api_keys(Some("globex")).await.unwrap().is_empty());
    assert!(any.revoke_api_key("ck_1").await.unwrap());
    assert!(!any.revoke_api_key("ck_1").await.unwrap());
    assert_eq!(any.api_key_by_hash("hash-1").await.unwrap(), None);
}

/// A model family's calibration: absent until observed; each observation taken in once,
/// whoever writes concurrently; bounded by the window; kept across a reopen; the same
/// through `AnyStore`.
async fn calibrations_take_every_observation_once_and_stay_bounded(h: &impl Harness) {
    let s = h.store();
    assert_eq!(s.calibration("claude-").await.unwrap(), None);
    let seen = |estimated: u64, reported: u64| Observation {
        estimated,
        reported,
    };
    s.observe_calibration("claude-", seen(1000, 1100))
        .await
        .unwrap();
    s.observe_calibration("claude-", seen(1000, 1200))
        .await
        .unwrap();
    let now = s
        .observe_calibration("claude-", seen(2000, 2100))
        .await
        .unwrap();
    assert_eq!(now.factor(), Some(1.2));
    assert_eq!(s.calibration("claude-").await.unwrap(), Some(now.clone()));
    // Ignored and refused ones change what the row counts, never what it keeps.
    let after = s
        .observe_calibration("claude-", seen(1000, 9000))
        .await
        .unwrap();
    assert_eq!(after.observations, now.observations);
    assert_eq!(after.outliers, 1);
    assert_eq!(h.any().calibration("claude-").await.unwrap(), Some(after));
    assert_eq!(s.calibration("gemini-").await.unwrap(), None, "per family");

    const WRITERS: u64 = 8;
    const EACH: u64 = 20;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let store = h.store().clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                store
                    .observe_calibration("gemini-", seen(1000, 1000 + writer * 10 + i))
                    .await
                    .expect("observe");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer task");
    }
    let gemini = s.calibration("gemini-").await.unwrap().unwrap();
    assert_eq!(gemini.kept, WRITERS * EACH, "no observation is lost");
    assert_eq!(
        gemini.observations.len(),
        contexture_core::calibration::WINDOW
    );
    let again = h.reopen().await;
    assert_eq!(again.calibration("gemini-").await.unwrap(), Some(gemini));
}

/// Event bodies as an older build stored them.
const OLD_ONE: &str = r#"{"role":"user","content":"1"}"#;
const OLD_TWO: &str = r#"{"role":"user","content":"2"}"#;
const OLD_THREE: &str = r#"{"role":"user","content":"3"}"#;
const OLD_FORK_F: &str = r#"{"type":"forked","parent":"t","at_seq":1}"#;
const OLD_FORK_G: &str = r#"{"type":"forked","parent":"f","at_seq":2}"#;
const OLD_STEP: &str =
    r#"{"type":"step_message","step":1,"message":{"role":"user","content":"4"}}"#;
const OLD_REPLACE: &str = r#"{"type":"context_replaced","op_id":"o","reason":"manual","from_seq":1,"to_seq":1,"replacement":[{"role":"user","content":"5"},{"role":"assistant","content":"6"}]}"#;

/// Run on a database an older build left (migrations before the API keys' only): opening it
/// with this build applies the new migration only, and keeps its threads.
async fn api_key_migration_applies_to_an_older_database<H: Harness>(h: &H) {
    let previous = H::BEFORE_API_KEYS;
    let old = h.store();
    let before = h.schema_versions().await;
    let versions = |rows: &[(u32, i64)]| rows.iter().map(|(v, _)| *v).collect::<Vec<_>>();
    assert_eq!(versions(&before), (1..=previous).collect::<Vec<_>>());
    // No API keys table yet.
    let missing = old.list_api_keys(None).await;
    assert!(
        matches!(missing, Err(StoreError::Database { .. })),
        "{missing:?}"
    );
    // The rows an older build wrote: a thread, a keyed message, and a fork of a fork.
    h.execute_raw(&format!(
        "INSERT INTO threads (id, parent_id, fork_seq, last_seq, created_at, updated_at) VALUES
             ('t', NULL, NULL, 2, 0, 0), ('f', 't', 1, 2, 0, 0), ('g', 'f', 2, 4, 0, 0),
             ('e', NULL, NULL, 2, 0, 0);
         INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at) VALUES
             ('t', 1, 'message_appended', '{OLD_ONE}', NULL, NULL, 0),
             ('t', 2, 'message_appended', '{OLD_TWO}', NULL, 'k', 0),
             ('f', 2, 'forked', '{OLD_FORK_F}', NULL, NULL, 0),
             ('g', 3, 'forked', '{OLD_FORK_G}', NULL, NULL, 0),
             ('g', 4, 'message_appended', '{OLD_THREE}', NULL, NULL, 0),
             ('e', 1, 'step_message', '{OLD_STEP}', NULL, NULL, 0),
             ('e', 2, 'context_replaced', '{OLD_REPLACE}', NULL, NULL, 0);"
    ))
    .await;
    let events = old.events("t").await.unwrap();
    assert_eq!(
        texts(&old.load("g").await.unwrap().projection().messages),
        ["1", "3"]
    );
    // So that a migration applied again would show in its `applied_at`.
    tokio::time::sleep(Duration::from_millis(5)).await;

    let new = h.reopen().await;
    let after = h.schema_versions().await;
    // The older rows are untouched; only the newer migrations were applied, in order.
    assert_eq!(after[..before.len()], before[..]);
    let applied = versions(&after[before.len()..]);
    assert_eq!(applied.first(), Some(&(previous + 1)), "{applied:?}");
    assert!(applied.windows(2).all(|w| w[1] == w[0] + 1), "{applied:?}");
    // The threads are intact and go on.
    assert_eq!(new.events("t").await.unwrap(), events);
    assert_eq!(new.events("f").await.unwrap().len(), 2);
    // Their messages were marked as the projection reads need.
    for thread in ["t", "f", "g"] {
        assert_eq!(
            new.load_projection(thread).await.unwrap(),
            new.load(thread).await.unwrap().projection()
        );
        let whole = new.load(thread).await.unwrap().projection().messages;
        let tail = new
            .load_projection_tail(thread, Encoding::Cl100kBase, 0)
            .await
            .unwrap();
        // The newest message at least (a store may read more of a short thread).
        assert!(!tail.projection.messages.is_empty());
        assert_eq!(tail.projection.messages[..], whole[tail.unread..]);
    }
    // Their sizes were counted when the sizes came: each thread's own events and its fork
    // prefix.
    let sizes: Vec<(String, u64)> = new
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|thread| (thread.id, thread.bytes))
        .collect();
    let message_sizes: Vec<(String, u64)> = new
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|thread| (thread.id, thread.message_bytes))
        .collect();
    let len = |body: &str| body.len() as u64;
    assert_eq!(
        sizes,
        [
            ("e".to_owned(), len(OLD_STEP) + len(OLD_REPLACE)),
            ("f".to_owned(), len(OLD_ONE) + len(OLD_FORK_F)),
            (
                "g".to_owned(),
                len(OLD_ONE) + len(OLD_FORK_F) + len(OLD_FORK_G) + len(OLD_THREE)
            ),
            ("t".to_owned(), len(OLD_ONE) + len(OLD_TWO)),
        ]
    );
    // Every message event's messages, each as stored on its own.
    let step_and_replacement = [
        r#"{"role":"user","content":"4"}"#,
        r#"{"role":"user","content":"5"}"#,
        r#"{"role":"assistant","content":"6"}"#,
    ];
    assert_eq!(
        message_sizes,
        [
            (
                "e".to_owned(),
                step_and_replacement.iter().map(|m| len(m)).sum()
            ),
            ("f".to_owned(), len(OLD_ONE)),
            ("g".to_owned(), len(OLD_ONE) + len(OLD_THREE)),
            ("t".to_owned(), len(OLD_ONE) + len(OLD_TWO)),
        ]
    );
    assert_eq!(
        new.append_one("t", user("2").with_key("k")).await.unwrap(),
        2
    );
    assert_eq!(new.append_one("t", user("3")).await.unwrap(), 3);
    // The new table works.
    let key = new
        .create_api_key("ck_1", "acme", "ci", "hash-1")
        .await
        .unwrap();
    assert_eq!(new.api_key_by_hash("hash-1").await.unwrap(), Some(key));
    new.ping().await.unwrap();

    // Opening again applies nothing.
    h.reopen().await;
    assert_eq!(h.schema_versions().await, after);
    // The older build refuses the newer database instead of using it.
    match h.open_at_version(previous).await {
        Err(StoreError::SchemaTooNew { found, known, .. }) => {
            assert_eq!((found, known), (*applied.last().unwrap(), previous));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

/// The bytes of `id`'s events, as the thread list reports them.
async fn size_of(s: &impl Store, id: &str) -> u64 {
    sizes_of(s, id).await.0
}

/// The bytes of `id`'s events and of its messages, as the thread list reports them.
async fn sizes_of(s: &impl Store, id: &str) -> (u64, u64) {
    let info = s
        .thread_info(id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no thread {id}"));
    (info.bytes, info.message_bytes)
}

async fn sizes_count_a_threads_events_and_its_fork_prefix(h: &impl Harness) {
    let s = h.store();
    s.append_one("t", user("a")).await.unwrap();
    let t1 = size_of(s, "t").await;
    s.append_one("t", user("bb").with_key("k")).await.unwrap();
    let t2 = size_of(s, "t").await;
    // A keyed retry stores nothing and adds nothing.
    s.append_one("t", user("bb").with_key("k")).await.unwrap();
    assert_eq!(size_of(s, "t").await, t2);
    s.append_one("t", user("ccc")).await.unwrap();
    let t3 = size_of(s, "t").await;
    assert!(0 < t1 && t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
    // Each message's body grows by its text: the sizes are the stored bytes.
    assert_eq!((t3 - t2) - (t2 - t1), 1);

    s.fork("t", 2, "f").await.unwrap();
    s.fork("t", 3, "g").await.unwrap();
    // At a seq inside f's prefix: t's first event, then the forked event.
    s.fork("f", 1, "h").await.unwrap();
    let forked = size_of(s, "f").await - t2;
    assert!(forked > 0);
    // The forked events have bodies of one length (one-letter parents, one-digit seqs).
    assert_eq!(size_of(s, "g").await, t3 + forked);
    assert_eq!(size_of(s, "h").await, t1 + forked);
    // The parent does not change.
    assert_eq!(size_of(s, "t").await, t3);
    // A fork grows on its own.
    s.append_one("f", user("a")).await.unwrap();
    assert_eq!(size_of(s, "f").await, t2 + forked + t1);
}

async fn message_bytes_count_a_threads_messages_each_once(h: &impl Harness) {
    let s = h.store();
    let body = |text: &str| serde_json::to_string(&Message::user(text)).unwrap().len() as u64;
    s.append("t", vec![user("a"), user("bb")]).await.unwrap();
    assert_eq!(
        sizes_of(s, "t").await,
        (body("a") + body("bb"), body("a") + body("bb"))
    );
    // Events that are not messages count in the thread's bytes only, on either path of an
    // append (keyed or not).
    let change = || {
        NewEvent::new(EventKind::StoreChanged(StoreChange::Set {
            key: "k".into(),
            value: json!("a value"),
        }))
    };
    s.append_one("t", change()).await.unwrap();
    s.append("t", vec![change().with_key("c"), user("ccc").with_key("m")])
        .await
        .unwrap();
    let (bytes, messages) = sizes_of(s, "t").await;
    let texts = body("a") + body("bb") + body("ccc");
    assert_eq!(messages, texts);
    assert!(bytes > messages, "{bytes} {messages}");
    // A fork carries its prefix's messages; its forked event is not one.
    s.fork("t", 2, "f").await.unwrap();
    assert_eq!(sizes_of(s, "f").await.1, body("a") + body("bb"));
    s.fork("t", 5, "g").await.unwrap();
    assert_eq!(sizes_of(s, "g").await.1, texts);
    s.append_one("f", user("dddd")).await.unwrap();
    assert_eq!(
        sizes_of(s, "f").await.1,
        body("a") + body("bb") + body("dddd")
    );
    assert_eq!(sizes_of(s, "t").await, (bytes, messages));
    // Every message event's messages count, each serialized on its own: a step's and a
    // replacement's too, in the thread and in a fork's prefix.
    let json = |message: &Message| serde_json::to_string(message).unwrap().len() as u64;
    let step = NewEvent::new(EventKind::StepMessage(StepMessage {
        step: 1,
        message: Message::user("e"),
    }));
    let replacement = vec![Message::user("ff"), Message::assistant("g")];
    let replace = NewEvent::new(EventKind::ContextReplaced(ContextReplace::new(
        "op",
        ReplaceReason::Manual,
        6,
        replacement.clone(),
    )));
    s.append("t", vec![step, replace]).await.unwrap();
    let replaced: u64 = replacement.iter().map(json).sum();
    assert_eq!(sizes_of(s, "t").await.1, texts + body("e") + replaced);
    s.fork("t", 6, "h").await.unwrap();
    assert_eq!(sizes_of(s, "h").await.1, texts + body("e"));
}

async fn a_thread_past_its_bytes_refuses_appends_and_stores_nothing_of_them(h: &impl Harness) {
    let s = h.any();
    s.append("t", vec![user("a"), user("b")]).await.unwrap();
    let full = size_of(&s, "t").await;
    s.set_max_thread_bytes(Some(full + 10));
    for batch in [
        vec![user(&"x".repeat(20))],
        vec![user(&"x".repeat(20)).with_key("k1")],
        vec![user("c"), user(&"x".repeat(20))],
    ] {
        match s.append("t", batch).await {
            Err(StoreError::ThreadTooLarge { thread, max_bytes }) => {
                assert_eq!((thread.as_str(), max_bytes), ("t", full + 10));
            }
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(s.events("t").await.unwrap().len(), 2, "nothing was stored");
        assert_eq!(size_of(&s, "t").await, full);
    }
    // A new thread is held to it too, on one append and across appends.
    assert!(matches!(
        s.append("new", vec![user(&"x".repeat(200))]).await,
        Err(StoreError::ThreadTooLarge { .. })
    ));
    // A fork counts the prefix it shares.
    s.fork("t", 2, "f").await.unwrap();
    assert!(matches!(
        s.append_one("f", user(&"x".repeat(20))).await,
        Err(StoreError::ThreadTooLarge { .. })
    ));
    // Within the limit, appends go on.
    assert_eq!(s.append_one("other", user("x")).await.unwrap(), 1);
    s.set_max_thread_bytes(None);
    assert_eq!(s.append_one("t", user(&"x".repeat(20))).await.unwrap(), 3);
}

/// How many of `full`'s messages a read of its tail past `tokens` leaves unread: up to the
/// newest message where the counts, added up from the end, pass `tokens`, and the tool
/// results that would then start it (their call is not read).
fn expected_unread(full: &[Message], tokens: u64) -> usize {
    let mut counted = 0;
    for (at, message) in full.iter().enumerate().rev() {
        counted += u64::from(message_tokens(message, Encoding::Cl100kBase));
        if counted > tokens {
            let orphans = full[at..]
                .iter()
                .take_while(|message| message.role == Role::Tool)
                .count();
            return at + orphans;
        }
    }
    0
}

async fn a_projection_read_from_its_end_holds_the_newest_messages_past_the_budget(
    h: &impl Harness,
) {
    let s = h.store();
    // Longer than a store keeps whole: a system prompt, then questions, tool calls and
    // their results; then a fork that goes on.
    let turn = |i: usize| match i % 3 {
        0 => user(&format!("question {i}")),
        1 => say(Message::assistant_tool_calls(vec![ToolCall::new(
            format!("c{i}"),
            "search",
            "{}",
        )])),
        _ => say(Message::tool_result(
            format!("c{}", i - 1),
            format!("result {i}"),
        )),
    };
    s.append_one("long", say(Message::system("be brief")))
        .await
        .unwrap();
    for chunk in 0..24 {
        let batch = (chunk * 1000..(chunk + 1) * 1000).map(turn).collect();
        s.append("long", batch).await.unwrap();
    }
    s.fork("long", 24_001, "fork").await.unwrap();
    s.append(
        "fork",
        (0..10).map(|i| user(&format!("more {i}"))).collect(),
    )
    .await
    .unwrap();
    for thread in ["long", "fork"] {
        let full = s.load_projection(thread).await.unwrap();
        for tokens in [0, 5, 99, 1_000, 20_000] {
            let tail = s
                .load_projection_tail(thread, Encoding::Cl100kBase, tokens)
                .await
                .unwrap();
            assert_eq!(tail.projection.system, full.system);
            assert_eq!(tail.projection.context, full.context);
            assert_eq!(
                tail.unread,
                expected_unread(&full.messages, tokens),
                "{thread} past {tokens} tokens"
            );
            assert_eq!(tail.projection.messages[..], full.messages[tail.unread..]);
        }
        // A budget past everything reads it all.
        let all = s
            .load_projection_tail(thread, Encoding::Cl100kBase, u64::MAX)
            .await
            .unwrap();
        assert_eq!((all.unread, all.projection), (0, full));
    }
    assert!(matches!(
        s.load_projection_tail("missing", Encoding::Cl100kBase, 10)
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A conversation of `turns` turns on `thread`, each request sending a rendered system
/// prompt (inline, a different one each turn, so that every record holds a few kilobytes of
/// its own) and the whole conversation so far.
async fn conversation_with_requests(
    s: &impl Store,
    thread: &str,
    turns: usize,
) -> Vec<RequestRecord> {
    let mut history: Vec<Message> = Vec::new();
    let mut records = Vec::new();
    for turn in 0..turns {
        let question = Message::user(format!("question {turn}"));
        s.append_one(thread, say(question.clone())).await.unwrap();
        history.push(question);
        let mut sent = vec![Message::system(format!(
            "rendered prompt {turn}: {}",
            "x".repeat(6000)
        ))];
        sent.extend(history.iter().cloned());
        let record = RequestRecord {
            request_id: format!("{thread}-r{turn}"),
            model: Some("gpt-4o".into()),
            messages: sent,
            ..Default::default()
        };
        let answer = Message::assistant(format!("answer {turn}"));
        s.append(
            thread,
            vec![
                NewEvent::new(EventKind::RequestStarted(record.clone())),
                NewEvent::new(EventKind::RequestEnded(RequestEnd {
                    reply: Some(answer.clone()),
                    ..RequestEnd::new(
                        record.request_id.clone(),
                        RequestOutcome::Completed,
                        Usage::new(5, 2),
                    )
                })),
                say(answer.clone()),
            ],
        )
        .await
        .unwrap();
        history.push(answer);
        records.push(record);
    }
    records
}

/// The request records of `thread` as read back.
async fn records_of(s: &impl Store, thread: &str) -> Vec<RequestRecord> {
    s.events(thread)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::RequestStarted(record) => Some(record),
            _ => None,
        })
        .collect()
}

/// Every event of `thread` but its request records.
async fn other_events(s: &impl Store, thread: &str) -> Vec<Event> {
    s.events(thread)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| !matches!(e.kind, EventKind::RequestStarted(_)))
        .collect()
}

async fn retention_policies_are_stored_with_the_thread(h: &impl Harness) {
    let s = h.store();
    // A thread whose id another one's starts with, listed after it.
    s.append_one("kept-too", user("hi")).await.unwrap();
    s.append_one("kept", user("hi")).await.unwrap();
    let policy = RequestRetention::new(Some(30), Some(100)).unwrap();
    s.set_retention("kept", Some(policy)).await.unwrap();
    let info = s.thread_info("kept").await.unwrap().expect("the thread");
    assert_eq!((&*info.id, info.retention), ("kept", Some(policy)));
    let listed = s.list().await.unwrap();
    assert_eq!(listed.iter().find(|t| t.id == "kept"), Some(&info));
    assert_eq!(
        s.thread_info("kept-too").await.unwrap().unwrap().retention,
        None
    );
    s.set_retention("kept", None).await.unwrap();
    assert_eq!(
        s.thread_info("kept").await.unwrap().unwrap().retention,
        None
    );
    assert_eq!(s.thread_info("kep").await.unwrap(), None);
    assert_eq!(s.thread_info("missing").await.unwrap(), None);
    assert!(matches!(
        s.set_retention("missing", Some(policy)).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(!s.exists("missing").await.unwrap(), "nothing was created");
}

async fn pruning_request_records_keeps_the_policy_and_every_message(h: &impl Harness) {
    let s = h.store();
    let records = conversation_with_requests(s, "chat", 6).await;
    let messages_before = other_events(s, "chat").await;
    let (bytes_before, message_bytes) = sizes_of(s, "chat").await;
    let last_two = RequestRetention::new(None, Some(2)).unwrap();
    let report = s
        .prune_thread_requests("chat", &last_two, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(report.records, 4, "{report:?}");
    let read = records_of(s, "chat").await;
    assert_eq!(read[4..], records[4..], "the last two read back as sent");
    for (got, sent) in read[..4].iter().zip(&records) {
        let mark = got.pruned.expect("pruned");
        assert_eq!(mark.messages, sent.messages.len() as u64);
        assert!(got.messages.is_empty());
        assert_eq!(got.request_id, sent.request_id);
        assert_eq!(got.model, sent.model);
    }
    let messages_after = other_events(s, "chat").await;
    assert_eq!(
        messages_after, messages_before,
        "every other event is untouched"
    );
    let (bytes_after, message_bytes_after) = sizes_of(s, "chat").await;
    assert_eq!(message_bytes_after, message_bytes);
    assert_eq!(bytes_before - bytes_after, report.bytes);
    assert!(report.bytes > 4 * 6000, "{report:?}");
    // Nothing more to do; a new record reads back as sent.
    let again = s
        .prune_thread_requests("chat", &last_two, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(again.records, 0);
    let more = conversation_with_requests(s, "chat", 1).await;
    assert_eq!(records_of(s, "chat").await.last(), more.last());

    // Days: nothing is older than a day now; everything is, two days on.
    conversation_with_requests(s, "aged", 3).await;
    let a_day = RequestRetention::new(Some(1), None).unwrap();
    let now = SystemTime::now();
    let report = s.prune_thread_requests("aged", &a_day, now).await.unwrap();
    assert_eq!(report.records, 0);
    let later = now + Duration::from_secs(2 * 24 * 3600);
    let report = s
        .prune_thread_requests("aged", &a_day, later)
        .await
        .unwrap();
    assert_eq!(report.records, 3);
    assert!(
        records_of(s, "aged")
            .await
            .iter()
            .all(|r| r.pruned.is_some())
    );
    assert!(matches!(
        s.prune_thread_requests("missing", &a_day, now).await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn pruning_follows_each_threads_policy_then_the_rules(h: &impl Harness) {
    let s = h.store();
    for thread in ["acme/a", "acme/own", "beta/b", "gamma/c"] {
        conversation_with_requests(s, thread, 3).await;
    }
    s.set_retention(
        "acme/own",
        Some(RequestRetention::new(None, Some(2)).unwrap()),
    )
    .await
    .unwrap();
    let rules = RetentionRules {
        default: Some(RequestRetention::new(None, Some(1)).unwrap()),
        by_prefix: [
            (
                "acme/".to_string(),
                RequestRetention::new(None, Some(0)).unwrap(),
            ),
            (
                "beta/".to_string(),
                RequestRetention::new(Some(365), None).unwrap(),
            ),
        ]
        .into(),
    };
    let report = s.prune_requests(&rules, SystemTime::now()).await.unwrap();
    let pruned = |thread: &str| report.by_thread.get(thread).map_or(0, |r| r.records);
    assert_eq!(pruned("acme/a"), 3, "the tenant's rule: {report:?}");
    assert_eq!(pruned("acme/own"), 1, "the thread's own policy wins");
    assert_eq!(pruned("beta/b"), 0, "a year keeps everything");
    assert_eq!(pruned("gamma/c"), 2, "the default");
    assert_eq!(report.threads, 4);
    assert_eq!(report.records, 6);
    let none = s
        .prune_requests(&RetentionRules::default(), SystemTime::now())
        .await
        .unwrap();
    assert_eq!(
        (none.threads, none.records),
        (1, 0),
        "only acme/own has a policy"
    );
}

async fn pruning_keeps_what_a_fork_still_sends(h: &impl Harness) {
    let s = h.store();
    // The parent's first record holds a rendered prompt that a fork's request sends again:
    // the fork's record refers to it.
    let parent = conversation_with_requests(s, "parent", 1).await;
    s.fork("parent", 3, "child").await.unwrap();
    let system = parent[0].messages[0].clone();
    let child_record = RequestRecord {
        request_id: "child-r".into(),
        model: Some("gpt-4o".into()),
        messages: vec![system, Message::user("question 0")],
        ..Default::default()
    };
    s.append_one(
        "child",
        NewEvent::new(EventKind::RequestStarted(child_record.clone())),
    )
    .await
    .unwrap();
    let none = RequestRetention::new(None, Some(0)).unwrap();
    let report = s
        .prune_thread_requests("parent", &none, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(
        (report.records, report.kept_for_references),
        (0, 1),
        "{report:?}"
    );
    assert_eq!(
        records_of(s, "child").await,
        [parent[0].clone(), child_record]
    );
    // Once the fork's record is pruned, so is the parent's.
    s.prune_thread_requests("child", &none, SystemTime::now())
        .await
        .unwrap();
    let report = s
        .prune_thread_requests("parent", &none, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(report.records, 1);
    let (child_bytes, _) = sizes_of(s, "child").await;
    let child_events: u64 = s.events("child").await.unwrap().len() as u64;
    assert!(
        child_events == 5 && child_bytes < 6000,
        "the fork's size follows: {child_bytes}"
    );
}

async fn pruning_while_requests_are_appended_leaves_every_record_readable(h: &impl Harness) {
    let s = h.store();
    // Each request sends the same rendered prompt, stored inline once and then taken from
    // the newest record that holds it: appends made while the pruning runs refer to records
    // that a plan made a moment before would prune.
    let prompt = Message::system(format!("rendered: {}", "z".repeat(3000)));
    let request = |n: usize| {
        EventKind::RequestStarted(RequestRecord {
            request_id: format!("r{n}"),
            messages: vec![prompt.clone(), Message::user(format!("q{n}"))],
            ..Default::default()
        })
    };
    let append = |n: usize| {
        let events = vec![
            user(&format!("q{n}")),
            NewEvent::new(request(n)),
            NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                format!("r{n}"),
                RequestOutcome::Completed,
                Usage::new(1, 1),
            ))),
        ];
        async move { s.append("busy", events).await.unwrap() }
    };
    for n in 0..100 {
        append(n).await;
    }
    let none = RequestRetention::new(None, Some(0)).unwrap();
    for round in 0..5 {
        let writes = async {
            for n in 0..20 {
                append(100 + round * 20 + n).await;
            }
        };
        let (pruned, ()) = tokio::join!(
            s.prune_thread_requests("busy", &none, SystemTime::now()),
            writes
        );
        pruned.unwrap();
        let records = records_of(s, "busy").await;
        assert_eq!(records.len(), 120 + round * 20);
        for (n, record) in records.iter().enumerate() {
            match record.pruned {
                Some(mark) => assert_eq!(mark.messages, 2, "record {n}"),
                None => {
                    assert_eq!(
                        EventKind::RequestStarted(record.clone()),
                        request(n),
                        "record {n}"
                    )
                }
            }
        }
    }
    let report = s
        .prune_thread_requests("busy", &none, SystemTime::now())
        .await
        .unwrap();
    let records = records_of(s, "busy").await;
    assert!(records.iter().all(|r| r.pruned.is_some()), "{report:?}");
}

async fn turns_hold_a_thread_one_at_a_time_in_the_order_they_joined(h: &impl Harness) {
    let lease = Duration::from_secs(30);
    let s = h.store();
    // A second process sharing the database, as a second server would.
    let other = h.reopen().await;
    let a = s.join_turn_queue("t").await.unwrap();
    let b = other.join_turn_queue("t").await.unwrap();
    let c = s.join_turn_queue("t").await.unwrap();
    let x = other.join_turn_queue("u").await.unwrap();
    // Each join counted the turns ahead of it as it joined.
    assert_eq!((a.ahead, b.ahead, c.ahead, x.ahead), (0, 1, 2, 0));
    let (a, b, c, x) = (a.ticket, b.ticket, c.ticket, x.ticket);
    assert!(
        a < b && b < c,
        "tickets in the order turns joined: {a} {b} {c}"
    );
    assert_eq!(s.turns_ahead("t", a).await.unwrap(), Some(0));
    assert_eq!(other.turns_ahead("t", b).await.unwrap(), Some(1));
    assert_eq!(s.turns_ahead("t", c).await.unwrap(), Some(2));
    assert_eq!(
        s.turns_ahead("u", x).await.unwrap(),
        Some(0),
        "each thread has a queue of its own"
    );
    assert_eq!(
        s.turns_ahead("u", a).await.unwrap(),
        None,
        "a ticket is its thread's"
    );
    // Renewals within the lease remove nobody.
    assert!(other.renew_turn("t", b, lease).await.unwrap());
    assert!(s.renew_turn("t", c, lease).await.unwrap());
    assert_eq!(other.turns_ahead("t", b).await.unwrap(), Some(1));
    s.leave_turn_queue("t", a).await.unwrap();
    s.leave_turn_queue("t", a).await.unwrap();
    assert_eq!(s.turns_ahead("t", a).await.unwrap(), None);
    assert_eq!(other.turns_ahead("t", b).await.unwrap(), Some(0));
    // A turn not renewed within the lease (its server stopped) is removed by the next
    // renewal of another turn of its thread, and only of its thread.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let short = Duration::from_millis(20);
    assert!(s.renew_turn("t", c, short).await.unwrap());
    assert_eq!(other.turns_ahead("t", b).await.unwrap(), None, "b lapsed");
    assert!(!other.renew_turn("t", b, lease).await.unwrap());
    assert_eq!(s.turns_ahead("t", c).await.unwrap(), Some(0));
    assert_eq!(s.turns_ahead("u", x).await.unwrap(), Some(0));
    // A run still waiting can be finished (cancelled) before any server takes it; a taken
    // one cannot.
    s.enqueue_execution("run-e", "acme", &json!(null))
        .await
        .unwrap();
    assert!(
        other
            .finish_queued_execution("run-e", "cancelled")
            .await
            .unwrap()
    );
    let cancelled = s.queued_execution("run-e").await.unwrap().unwrap();
    assert_eq!(cancelled.state, QueueState::Finished);
    assert_eq!(cancelled.outcome.as_deref(), Some("cancelled"));
    assert!(
        s.claim_executions("node-5", 5, 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        !s.finish_queued_execution("run-a", "cancelled")
            .await
            .unwrap()
    );

    // Through either backend of `AnyStore` alike.
    let any = h.any();
    let d = any.join_turn_queue("t").await.unwrap();
    assert_eq!(d.ahead, 1);
    let d = d.ticket;
    assert_eq!(any.turns_ahead("t", d).await.unwrap(), Some(1));
    assert!(any.renew_turn("t", d, lease).await.unwrap());
    any.leave_turn_queue("t", c).await.unwrap();
    assert_eq!(any.turns_ahead("t", d).await.unwrap(), Some(0));
}

async fn turns_joining_at_once_from_two_processes_let_one_hold_the_thread(h: &impl Harness) {
    // Joins at once from two processes: however their writes interleave, exactly one
    // ticket finds no turn ahead of it while nobody leaves (a ticket numbered earlier but
    // made visible later must not let a later one hold the thread beside it).
    let other = h.reopen().await;
    for round in 0..40 {
        let thread = format!("race-{round}");
        let mut joins = tokio::task::JoinSet::new();
        for i in 0..6 {
            let store = if i % 2 == 0 {
                h.store().clone()
            } else {
                other.clone()
            };
            let thread = thread.clone();
            joins.spawn(async move {
                let joined = store.join_turn_queue(&thread).await.unwrap();
                let ahead = store.turns_ahead(&thread, joined.ticket).await.unwrap();
                // Nobody leaves: the count at the join is the count after it.
                assert_eq!(ahead, Some(joined.ahead));
                ahead
            });
        }
        let mut holding = 0;
        while let Some(ahead) = joins.join_next().await {
            if ahead.unwrap() == Some(0) {
                holding += 1;
            }
        }
        assert_eq!(
            holding, 1,
            "round {round}: {holding} turns held the thread at once"
        );
    }
}

async fn finished_runs_leave_the_queue_once_kept_long_enough_and_no_other_run_does(
    h: &impl Harness,
) {
    let s = h.store();
    let other = h.reopen().await;
    let lease = Duration::from_secs(30);
    for id in ["done-1", "done-2", "held", "waiting"] {
        s.enqueue_execution(id, "acme", &json!({"workflow": id}))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let claims = s.claim_executions("node-1", 3, 10, lease).await.unwrap();
    assert_eq!(claims.len(), 3);
    for claim in &claims[..2] {
        assert!(
            s.finish_execution(&claim.id, "node-1", claim.epoch, "completed")
                .await
                .unwrap()
        );
    }
    // Finished a moment ago: kept for an hour, nothing goes.
    assert_eq!(
        other
            .prune_finished_executions(Duration::from_secs(3_600))
            .await
            .unwrap(),
        0
    );
    assert!(s.queued_execution("done-1").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Kept for less than they have been finished: both go, the held and the waiting run stay.
    assert_eq!(
        other
            .prune_finished_executions(Duration::from_millis(10))
            .await
            .unwrap(),
        2
    );
    assert_eq!(s.queued_execution("done-1").await.unwrap(), None);
    assert_eq!(s.queued_execution("done-2").await.unwrap(), None);
    let held = s.queued_execution("held").await.unwrap().unwrap();
    assert_eq!(held.state, QueueState::Running);
    assert_eq!(
        s.queued_execution("waiting").await.unwrap().unwrap().state,
        QueueState::Queued
    );
    assert_eq!(
        s.execution_queue_counts().await.unwrap(),
        QueueCounts {
            queued: 1,
            running: 1,
            lapsed: 0,
            finished: 0
        }
    );
    // The held run finishes and is pruned in its turn, through either backend alike; more
    // than a batch of finished runs goes in one call.
    assert!(
        s.finish_execution("held", "node-1", claims[2].epoch, "failed")
            .await
            .unwrap()
    );
    let many = usize::try_from(PRUNE_BATCH).unwrap() + 5;
    for i in 0..many {
        let id = format!("cancelled-{i}");
        s.enqueue_execution(&id, "acme", &json!(null))
            .await
            .unwrap();
        assert!(s.finish_queued_execution(&id, "cancelled").await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let any = h.any();
    assert_eq!(
        any.prune_finished_executions(Duration::from_millis(10))
            .await
            .unwrap(),
        many as u64 + 1
    );
    assert_eq!(s.execution_queue_counts().await.unwrap().finished, 0);
    assert_eq!(s.execution_queue_counts().await.unwrap().queued, 1);
    // A kept time past any clock prunes nothing and does not overflow.
    assert_eq!(s.prune_finished_executions(Duration::MAX).await.unwrap(), 0);
}

async fn a_turns_last_write_leaves_its_queue_only_when_its_events_are_stored(h: &impl Harness) {
    let s = h.any();
    s.set_max_thread_events(Some(4));
    let first = s.join_turn_queue("t").await.unwrap().ticket;
    let second = s.join_turn_queue("t").await.unwrap().ticket;
    let other_thread = s.join_turn_queue("u").await.unwrap().ticket;
    assert_eq!(s.turns_ahead("t", second).await.unwrap(), Some(1));
    // Plain events (one statement on PostgreSQL) and keyed ones (a transaction).
    assert_eq!(
        s.append_leaving_turn("t", vec![user("a"), user("b")], first)
            .await
            .unwrap(),
        [1, 2]
    );
    assert_eq!(s.turns_ahead("t", first).await.unwrap(), None);
    assert_eq!(s.turns_ahead("t", second).await.unwrap(), Some(0));
    // Events that are not stored leave the ticket where it was.
    for batch in [
        vec![user("c"), user("d"), user("e")],
        vec![
            user("c").with_key("k1"),
            user("d").with_key("k2"),
            user("e"),
        ],
    ] {
        assert!(matches!(
            s.append_leaving_turn("t", batch, second).await,
            Err(StoreError::ThreadFull { .. })
        ));
        assert_eq!(s.turns_ahead("t", second).await.unwrap(), Some(0));
    }
    assert_eq!(
        s.append_leaving_turn("t", vec![user("c").with_key("k1")], second)
            .await
            .unwrap(),
        [3]
    );
    assert_eq!(s.turns_ahead("t", second).await.unwrap(), None);
    assert_eq!(
        texts(&s.load("t").await.unwrap().projection().messages),
        ["a", "b", "c"]
    );
    // Another thread's queue is its own, and a ticket of another thread is not left.
    s.append_leaving_turn("t", vec![user("d")], other_thread)
        .await
        .unwrap();
    assert_eq!(s.turns_ahead("u", other_thread).await.unwrap(), Some(0));
    // Through a tenant's view the queue is the tenant's thread's.
    let acme = s
        .clone()
        .scoped(contexture_store::Tenant::new("acme").unwrap());
    let ticket = acme.join_turn_queue("t").await.unwrap().ticket;
    assert_eq!(
        acme.append_leaving_turn("t", vec![user("x")], ticket)
            .await
            .unwrap(),
        [1]
    );
    assert_eq!(acme.turns_ahead("t", ticket).await.unwrap(), None);
    assert_eq!(s.events("acme/t").await.unwrap().len(), 1);
    s.set_max_thread_events(None);
}

async fn a_conditional_append_stores_only_on_the_thread_it_was_built_on(h: &impl Harness) {
    let s = h.any();
    let first = s.append("t", vec![user("a"), user("b")]).await.unwrap();
    assert_eq!(first, [1, 2]);
    // Built on seq 1, but the thread moved on to 2: nothing of it is stored, whichever way
    // the store writes it (plain, keyed, or with a record stored by reference).
    for batch in [
        vec![user("late")],
        vec![user("late").with_key("k")],
        vec![
            user("late"),
            NewEvent::new(EventKind::RequestStarted(RequestRecord {
                request_id: "r".into(),
                messages: vec![Message::user("a"), Message::user("late")],
                ..Default::default()
            })),
        ],
    ] {
        let refused = s.append_after("t", 1, batch).await;
        assert!(
            matches!(
                &refused,
                Err(StoreError::Moved { thread, expected: 1, last_seq: 2 }) if thread == "t"
            ),
            "{refused:?}"
        );
    }
    assert_eq!(s.events("t").await.unwrap().len(), 2);
    assert!(s.keyed_event("t", "k").await.unwrap().is_none());
    // Built on the last event: the new messages and a record that refers to them are
    // stored in one write, and the record reads back whole.
    let record = RequestRecord {
        request_id: "r".into(),
        messages: vec![Message::user("a"), Message::user("b"), Message::user("c")],
        input_from: Some(3),
        ..Default::default()
    };
    let stored = s
        .append_after(
            "t",
            2,
            vec![
                user("c"),
                NewEvent::new(EventKind::RequestStarted(record.clone())),
            ],
        )
        .await
        .unwrap();
    assert_eq!(stored, [3, 4]);
    let events = s.events("t").await.unwrap();
    assert!(matches!(&events[3].kind, EventKind::RequestStarted(read) if *read == record));
    // A thread that does not exist is created only by a write built on nothing (seq 0).
    let refused = s.append_after("fresh", 3, vec![user("x")]).await;
    assert!(
        matches!(refused, Err(StoreError::Moved { last_seq: 0, .. })),
        "{refused:?}"
    );
    assert!(
        !s.exists("fresh").await.unwrap(),
        "a refused write creates nothing"
    );
    assert_eq!(
        s.append_after("fresh", 0, vec![user("x")]).await.unwrap(),
        [1]
    );
    // Through a tenant's view the seqs are the tenant's thread's, and so is the error.
    let acme = s
        .clone()
        .scoped(contexture_store::Tenant::new("acme").unwrap());
    assert_eq!(
        acme.append_after("t", 0, vec![user("y")]).await.unwrap(),
        [1]
    );
    let refused = acme.append_after("t", 0, vec![user("z")]).await;
    assert!(
        matches!(&refused, Err(StoreError::Moved { thread, last_seq: 1, .. }) if thread == "t"),
        "{refused:?}"
    );
    assert_eq!(s.events("acme/t").await.unwrap().len(), 1);
}

fn run_ended(status: RunStatus) -> NewEvent {
    NewEvent::new(EventKind::RunEnded(RunEnd {
        status,
        output: None,
        error: None,
    }))
}

async fn a_runs_end_and_its_finish_in_the_queue_are_one_write_by_its_holder_only(h: &impl Harness) {
    let s = h.store();
    let other = h.reopen().await;
    let lease = Duration::from_secs(30);
    s.enqueue_execution("run-e", "acme", &json!({}))
        .await
        .unwrap();
    s.append("run-e", vec![user("started")]).await.unwrap();
    let first = s.claim_executions("node-1", 1, 10, lease).await.unwrap();
    let held = QueueHold {
        node: "node-1".into(),
        epoch: first[0].epoch,
    };
    // The holder loses the run: its lease is given up and another server claims it.
    assert!(
        s.release_execution("run-e", "node-1", held.epoch)
            .await
            .unwrap()
    );
    let second = other
        .claim_executions("node-2", 1, 10, lease)
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    // The earlier holder's end is refused whole: neither the event nor the finish is stored.
    let refused = s
        .append_ending_run(
            "run-e",
            vec![run_ended(RunStatus::Completed)],
            &held,
            "completed",
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { ref execution }) if execution == "run-e"),
        "{refused:?}"
    );
    assert_eq!(s.events("run-e").await.unwrap().len(), 1);
    let row = s.queued_execution("run-e").await.unwrap().unwrap();
    assert_eq!(row.state, QueueState::Running);
    assert_eq!(row.owner.as_deref(), Some("node-2"));
    // The holder's end: the event and the finish at once.
    let holder = QueueHold {
        node: "node-2".into(),
        epoch: second[0].epoch,
    };
    let seqs = other
        .append_ending_run(
            "run-e",
            vec![user("last words"), run_ended(RunStatus::Failed)],
            &holder,
            "failed",
        )
        .await
        .unwrap();
    assert_eq!(seqs, [2, 3]);
    let row = s.queued_execution("run-e").await.unwrap().unwrap();
    assert_eq!(row.state, QueueState::Finished);
    assert_eq!(row.outcome.as_deref(), Some("failed"));
    assert!(row.finished_at_ms.is_some());
    // A finished run takes no second end, and is never claimed again.
    assert!(matches!(
        other
            .append_ending_run(
                "run-e",
                vec![run_ended(RunStatus::Completed)],
                &holder,
                "completed"
            )
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(s.events("run-e").await.unwrap().len(), 3);
    assert!(
        s.claim_executions("node-3", 5, 10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    // A run never queued has no holder: its end is refused too.
    assert!(matches!(
        s.append_ending_run(
            "never-queued",
            vec![run_ended(RunStatus::Completed)],
            &holder,
            "completed"
        )
        .await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(!s.exists("never-queued").await.unwrap());
    // The same through a tenant's view: the run's id in the queue is its id in the store.
    let scoped = h
        .any()
        .scoped(contexture_store::Tenant::new("acme").unwrap());
    s.enqueue_execution("acme/run-t", "acme", &json!({}))
        .await
        .unwrap();
    let third = s.claim_executions("node-1", 1, 10, lease).await.unwrap();
    let hold = QueueHold {
        node: "node-1".into(),
        epoch: third[0].epoch,
    };
    scoped
        .append_ending_run(
            "run-t",
            vec![run_ended(RunStatus::Cancelled)],
            &hold,
            "cancelled",
        )
        .await
        .unwrap();
    let row = s.queued_execution("acme/run-t").await.unwrap().unwrap();
    assert_eq!(
        (row.state, row.outcome.as_deref()),
        (QueueState::Finished, Some("cancelled"))
    );
    assert_eq!(scoped.events("run-t").await.unwrap().len(), 1);
}

async fn a_runs_failures_are_counted_by_its_holder_only_and_it_waits_before_its_next_claim(
    h: &impl Harness,
) {
    let s = h.store();
    let other = h.reopen().await;
    let lease = Duration::from_secs(30);
    s.enqueue_execution("run-f", "acme", &json!({}))
        .await
        .unwrap();
    assert_eq!(
        s.queued_execution("run-f").await.unwrap().unwrap().failures,
        0
    );
    // Not held by anyone: nothing to count.
    assert_eq!(
        s.count_execution_failure("run-f", "node-1", 1, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    let claim = s.claim_executions("node-1", 1, 10, lease).await.unwrap();
    let epoch = claim[0].epoch;
    // Another server, or the holder with another epoch, counts nothing.
    assert_eq!(
        other
            .count_execution_failure("run-f", "node-2", epoch, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.count_execution_failure("run-f", "node-1", epoch + 1, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    // The holder's count: the run waits its retry time before anyone claims it again.
    assert_eq!(
        s.count_execution_failure("run-f", "node-1", epoch, Duration::from_millis(300))
            .await
            .unwrap(),
        Some(1)
    );
    assert!(
        other
            .claim_executions("node-2", 5, 10, lease)
            .await
            .unwrap()
            .is_empty(),
        "claimed before its retry time"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = other
        .claim_executions("node-2", 5, 10, lease)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert!(again[0].adopted && again[0].epoch > epoch);
    assert_eq!(again[0].failures, 1, "the claim says how many so far");
    // The count stays with the run across claims, and the new holder adds to it.
    assert_eq!(
        other
            .count_execution_failure("run-f", "node-2", again[0].epoch, Duration::ZERO)
            .await
            .unwrap(),
        Some(2)
    );
    let row = s.queued_execution("run-f").await.unwrap().unwrap();
    assert_eq!((row.failures, row.attempts), (2, 2));
    // A finished run counts nothing more (claimed once its retry time, now, has passed).
    tokio::time::sleep(Duration::from_millis(10)).await;
    let last = s.claim_executions("node-1", 1, 10, lease).await.unwrap();
    assert!(
        s.finish_execution("run-f", "node-1", last[0].epoch, "failed")
            .await
            .unwrap()
    );
    assert_eq!(
        s.count_execution_failure("run-f", "node-1", last[0].epoch, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
}

async fn executions_are_claimed_oldest_first_held_by_one_server_and_adopted_when_a_lease_runs_out(
    h: &impl Harness,
) {
    let s = h.store();
    // A second process sharing the database, as a second server would.
    let other = h.reopen().await;
    let lease = Duration::from_secs(30);
    for (id, tenant) in [("run-a", "acme"), ("run-b", "acme"), ("run-c", "globex")] {
        s.enqueue_execution(id, tenant, &json!({"workflow": id}))
            .await
            .unwrap();
        // Enqueued in this order, whatever the clock's resolution.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert!(matches!(
        other.enqueue_execution("run-a", "acme", &json!({})).await,
        Err(StoreError::AlreadyExists { .. })
    ));
    let queued = s.queued_execution("run-b").await.unwrap().unwrap();
    assert_eq!(queued.state, QueueState::Queued);
    assert_eq!((queued.attempts, queued.owner.as_deref()), (0, None));
    assert_eq!(queued.request, json!({"workflow": "run-b"}));
    assert_eq!(s.queued_execution("nope").await.unwrap(), None);

    // Oldest first, up to the claim's count.
    let first = s.claim_executions("node-1", 1, 10, lease).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].id, "run-a");
    assert!(!first[0].adopted);
    assert_eq!(first[0].request, json!({"workflow": "run-a"}));
    // A tenant at its limit gets nothing more: the next claim skips run-b for run-c.
    let second = other.claim_executions("node-2", 5, 1, lease).await.unwrap();
    let ids: Vec<&str> = second.iter().map(|claim| claim.id.as_str()).collect();
    assert_eq!(ids, ["run-c"]);
    // A held run is nobody else's.
    let third = other
        .claim_executions("node-2", 5, 10, lease)
        .await
        .unwrap();
    let ids: Vec<&str> = third.iter().map(|claim| claim.id.as_str()).collect();
    assert_eq!(ids, ["run-b"]);
    assert!(
        other
            .claim_executions("node-3", 5, 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    let held = s.queued_execution("run-a").await.unwrap().unwrap();
    assert_eq!(held.state, QueueState::Running);
    assert_eq!(held.owner.as_deref(), Some("node-1"));
    assert!(held.lease_live);

    // Renewals by the holder, with its epoch, succeed; anybody else's do nothing.
    let a = &first[0];
    assert!(
        s.renew_execution("run-a", "node-1", a.epoch, lease)
            .await
            .unwrap()
    );
    assert!(
        !other
            .renew_execution("run-a", "node-2", a.epoch, lease)
            .await
            .unwrap()
    );
    assert!(
        !s.renew_execution("run-a", "node-1", a.epoch + 1, lease)
            .await
            .unwrap()
    );

    // A lease that runs out cannot be renewed, and the next claim adopts the run with a new
    // epoch; the earlier holder's finish then does nothing.
    let short = Duration::from_millis(20);
    let b = &third[0];
    assert!(
        other
            .renew_execution("run-b", "node-2", b.epoch, short)
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        !s.queued_execution("run-b")
            .await
            .unwrap()
            .unwrap()
            .lease_live
    );
    assert!(
        !other
            .renew_execution("run-b", "node-2", b.epoch, lease)
            .await
            .unwrap()
    );
    let adopted = s.claim_executions("node-1", 5, 10, lease).await.unwrap();
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0].id, "run-b");
    assert!(adopted[0].adopted);
    assert!(adopted[0].epoch > b.epoch);
    assert!(
        !other
            .finish_execution("run-b", "node-2", b.epoch, "completed")
            .await
            .unwrap()
    );
    let row = s.queued_execution("run-b").await.unwrap().unwrap();
    assert_eq!((row.attempts, row.owner.as_deref()), (2, Some("node-1")));

    // A finish by the holder ends the run for good.
    assert!(
        s.finish_execution("run-b", "node-1", adopted[0].epoch, "completed")
            .await
            .unwrap()
    );
    assert!(
        !s.finish_execution("run-b", "node-1", adopted[0].epoch, "failed")
            .await
            .unwrap()
    );
    let done = s.queued_execution("run-b").await.unwrap().unwrap();
    assert_eq!(done.state, QueueState::Finished);
    assert_eq!(done.outcome.as_deref(), Some("completed"));
    assert!(!done.lease_live && done.finished_at_ms.is_some());
    assert!(
        !s.renew_execution("run-b", "node-1", adopted[0].epoch, lease)
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert!(
        s.claim_executions("node-9", 5, 10, short)
            .await
            .unwrap()
            .is_empty()
    );

    // The queue's counts: run-a and run-c held, run-b finished.
    assert_eq!(
        other.execution_queue_counts().await.unwrap(),
        QueueCounts {
            queued: 0,
            running: 2,
            lapsed: 0,
            finished: 1
        }
    );
    // A server shutting down releases its run: the next claim adopts it at once, and the
    // earlier holder can neither release nor renew it again.
    assert!(
        s.release_execution("run-a", "node-1", a.epoch)
            .await
            .unwrap()
    );
    assert_eq!(s.execution_queue_counts().await.unwrap().lapsed, 1);
    let taken = other
        .claim_executions("node-2", 5, 10, lease)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(taken[0].id == "run-a" && taken[0].adopted);
    assert!(
        !s.release_execution("run-a", "node-1", a.epoch)
            .await
            .unwrap()
    );
    assert!(
        !s.renew_execution("run-a", "node-1", a.epoch, lease)
            .await
            .unwrap()
    );

    // A run still waiting can be finished (cancelled) before any server takes it; a taken
    // one cannot.
    s.enqueue_execution("run-e", "acme", &json!(null))
        .await
        .unwrap();
    assert!(
        other
            .finish_queued_execution("run-e", "cancelled")
            .await
            .unwrap()
    );
    let cancelled = s.queued_execution("run-e").await.unwrap().unwrap();
    assert_eq!(cancelled.state, QueueState::Finished);
    assert_eq!(cancelled.outcome.as_deref(), Some("cancelled"));
    assert!(
        s.claim_executions("node-5", 5, 10, lease)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        !s.finish_queued_execution("run-a", "cancelled")
            .await
            .unwrap()
    );

    // Through either backend of `AnyStore` alike.
    let any = h.any();
    assert_eq!(any.execution_queue_counts().await.unwrap().running, 2);
    assert_eq!(any.execution_queue_counts().await.unwrap().finished, 2);
    any.enqueue_execution("run-d", "globex", &json!(null))
        .await
        .unwrap();
    let claims = any.claim_executions("node-4", 5, 10, lease).await.unwrap();
    assert_eq!(claims.len(), 1);
    assert!(
        any.renew_execution("run-d", "node-4", claims[0].epoch, lease)
            .await
            .unwrap()
    );
    assert!(
        any.finish_execution("run-d", "node-4", claims[0].epoch, "cancelled")
            .await
            .unwrap()
    );
    assert_eq!(
        any.queued_execution("run-d").await.unwrap().unwrap().state,
        QueueState::Finished
    );
}

async fn claims_racing_from_two_processes_hold_each_run_once_and_the_tenant_limit(
    h: &impl Harness,
) {
    // Four claimers in two processes take a tenant's 40 runs at once: every run is taken
    // once, and never more than the limit of the tenant's leases live at a time.
    let other = h.reopen().await;
    let lease = Duration::from_secs(30);
    for n in 0..40 {
        h.store()
            .enqueue_execution(&format!("race-{n:02}"), "acme", &json!({"n": n}))
            .await
            .unwrap();
    }
    let limit = 3;
    let mut taken = Vec::new();
    loop {
        let mut claims = tokio::task::JoinSet::new();
        for i in 0..4 {
            let store = if i % 2 == 0 {
                h.store().clone()
            } else {
                other.clone()
            };
            claims.spawn(async move {
                let node = format!("node-{i}");
                let claimed = store
                    .claim_executions(&node, 2, limit, lease)
                    .await
                    .unwrap();
                (node, claimed)
            });
        }
        let mut round = Vec::new();
        while let Some(claimed) = claims.join_next().await {
            let (node, claimed) = claimed.unwrap();
            round.extend(claimed.into_iter().map(|claim| (node.clone(), claim)));
        }
        assert!(
            round.len() <= limit,
            "{} leases of one tenant at once, over its limit of {limit}",
            round.len()
        );
        if round.is_empty() {
            break;
        }
        for (node, claim) in round {
            assert!(
                other
                    .finish_execution(&claim.id, &node, claim.epoch, "completed")
                    .await
                    .unwrap(),
                "{} finished by the node that claimed it",
                claim.id
            );
            taken.push(claim.id);
        }
    }
    taken.sort();
    let expected: Vec<String> = (0..40).map(|n| format!("race-{n:02}")).collect();
    assert_eq!(taken, expected, "every run taken exactly once");
}

/// Every page of `thread` after 0, with at most `limit` events and `max_bytes` bytes each.
async fn pages_of(s: &impl Store, thread: &str, limit: usize, max_bytes: usize) -> Vec<Vec<Event>> {
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let page = s
            .events_page(thread, after, limit, max_bytes)
            .await
            .unwrap();
        assert!(page.events.len() <= limit);
        assert!(
            !page.events.is_empty() || !page.more,
            "an empty page says there is more"
        );
        let bytes: usize = page
            .events
            .iter()
            .map(|event| serde_json::to_vec(event).unwrap().len())
            .sum();
        if page.events.len() > 1 {
            assert!(bytes <= max_bytes, "{bytes} bytes in a page of {max_bytes}");
        }
        let more = page.more;
        if let Some(last) = page.events.last() {
            after = last.seq;
        }
        pages.push(page.events);
        if !more {
            return pages;
        }
    }
}

async fn event_pages_hold_every_event_once_within_their_count_and_bytes(h: &impl Harness) {
    let s = h.store();
    // Request records resolved in full (each as large as the history it sent), their
    // replies in the next event, at every position against the read's chunks.
    conversation_with_requests(s, "paged", 20).await;
    s.fork("paged", 30, "paged-fork").await.unwrap();
    conversation_with_requests(s, "paged-fork", 5).await;
    for thread in ["paged", "paged-fork"] {
        let all = s.events(thread).await.unwrap();
        for (limit, max_bytes) in [(1000, usize::MAX), (7, usize::MAX), (1000, 20_000), (5, 1)] {
            let pages = pages_of(s, thread, limit, max_bytes).await;
            let read: Vec<Event> = pages.iter().flatten().cloned().collect();
            assert_eq!(read, all, "{thread}: limit {limit}, {max_bytes} bytes");
            if max_bytes == 1 {
                assert!(pages.iter().all(|page| page.len() == 1), "one event a page");
            }
        }
        // A page after the end is empty; of a thread that does not exist, an error.
        let last = all.last().unwrap().seq;
        let page = s.events_page(thread, last, 10, usize::MAX).await.unwrap();
        assert!(page.events.is_empty() && !page.more);
    }
    assert!(matches!(
        s.events_page("nothing", 0, 10, usize::MAX).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A `run_started` event, as an execution's log begins.
fn run_started() -> NewEvent {
    NewEvent::new(EventKind::RunStarted(RunStart {
        workflow_file: "wf.yaml".into(),
        workflow_text: "states: [{id: a}]".into(),
        input: "go".into(),
        llm: None,
        parent_execution_id: None,
        limits: RunLimits::default(),
        conversation: None,
        from_client: false,
        user_context: None,
    }))
}

/// The ids of `page`, in order.
fn ids_of(page: &[ThreadInfo]) -> Vec<&str> {
    page.iter().map(|info| info.id.as_str()).collect()
}

/// Every page of `list_recent(prefix, contains, ..)`, `limit` threads a page, each after the
/// last of the one before, until a short page.
async fn recent_pages(
    s: &impl Store,
    prefix: &str,
    contains: &str,
    limit: usize,
) -> Vec<Vec<ThreadInfo>> {
    let mut pages: Vec<Vec<ThreadInfo>> = Vec::new();
    loop {
        let before = pages
            .last()
            .and_then(|page| page.last())
            .map(RecentCursor::after);
        let page = s
            .list_recent(prefix, contains, before.as_ref(), limit)
            .await
            .unwrap();
        let done = page.len() < limit;
        pages.push(page);
        if done {
            return pages;
        }
        assert!(pages.len() <= 100, "pages never end");
    }
}

/// Threads newest first: by last append, ties by id in byte order, descending; pages from
/// a cursor cover every thread once; `contains` is a literal, ASCII-case-insensitive
/// substring of the id past the prefix; the prefix bounds the list. The same through
/// `AnyStore`, and each summary as `list_page` gives it.
async fn recent_threads_are_listed_newest_first_a_page_at_a_time(h: &impl Harness) {
    let s = h.store();
    // (id, last append): several in one millisecond, ids that hold LIKE's wildcards and
    // its usual escape, letters of both cases, ids around the prefix.
    let threads = [
        ("acme/a", 1000),
        ("acme/b", 1000),
        ("acme/c", 1000),
        ("acme/d", 3000),
        ("acme/MiXeD", 2000),
        ("acme/100%", 500),
        ("acme/1000", 400),
        ("acme/a_b", 300),
        ("acme/axb", 300),
        ("acme/back\\slash", 200),
        ("acme/Été", 100),
        ("acme0", 5000),
        ("acmeX/z", 5000),
        ("globex/acme", 4000),
    ];
    for (id, _) in threads {
        s.append_one(id, user("x")).await.unwrap();
    }
    // The times are written directly: the store's clock cannot be stopped.
    let times: String = threads
        .iter()
        .map(|(id, at)| format!("UPDATE threads SET updated_at = {at} WHERE id = '{id}';"))
        .collect();
    h.execute_raw(&times).await;
    let newest_first = [
        "acme/d",
        "acme/MiXeD",
        "acme/c",
        "acme/b",
        "acme/a",
        "acme/100%",
        "acme/1000",
        // `x` is above `_` in byte order, whatever the database's collation says.
        "acme/axb",
        "acme/a_b",
        "acme/back\\slash",
        "acme/Été",
    ];
    let all = s.list_recent("acme/", "", None, 100).await.unwrap();
    assert_eq!(ids_of(&all), newest_first);
    for info in &all {
        let listed = s.list_page(&info.id, "", 1).await.unwrap();
        assert_eq!(listed.first(), Some(info), "{}", info.id);
    }
    let any = h.any();
    assert_eq!(any.list_recent("acme/", "", None, 100).await.unwrap(), all);
    // Pages of any size cover every thread once, in the same order.
    for limit in [1, 2, 3, 5, 11, 12] {
        let pages = recent_pages(s, "acme/", "", limit).await;
        assert!(pages.iter().all(|page| page.len() <= limit));
        let walked: Vec<ThreadInfo> = pages.into_iter().flatten().collect();
        assert_eq!(walked, all, "pages of {limit}");
    }
    assert!(
        s.list_recent("acme/", "", None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    // A cursor among threads of one millisecond goes on with the next id down.
    let cursor = RecentCursor {
        updated_at_ms: 1000,
        id: "acme/b".into(),
    };
    assert_eq!(
        ids_of(&s.list_recent("acme/", "", Some(&cursor), 2).await.unwrap()),
        ["acme/a", "acme/100%"]
    );
    let past_the_end = RecentCursor {
        updated_at_ms: 100,
        id: "acme/Été".into(),
    };
    assert!(
        s.list_recent("acme/", "", Some(&past_the_end), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // `contains` is a literal substring: wildcards and escapes are characters like others.
    let matching = async |prefix: &str, contains: &str| -> Vec<String> {
        let page = s.list_recent(prefix, contains, None, 100).await.unwrap();
        page.into_iter().map(|info| info.id).collect()
    };
    assert_eq!(matching("acme/", "%").await, ["acme/100%"]);
    assert_eq!(matching("acme/", "_").await, ["acme/a_b"]);
    assert_eq!(matching("acme/", "\\").await, ["acme/back\\slash"]);
    assert_eq!(matching("acme/", "0%").await, ["acme/100%"]);
    // ASCII letters match in either case; other letters as they are.
    assert_eq!(matching("acme/", "mixed").await, ["acme/MiXeD"]);
    assert_eq!(matching("acme/", "MIXED").await, ["acme/MiXeD"]);
    assert_eq!(matching("acme/", "Été").await, ["acme/Été"]);
    assert_eq!(matching("acme/", "ÉTé").await, ["acme/Été"]);
    assert!(matching("acme/", "été").await.is_empty());
    assert!(matching("acme/", "TÉ").await.is_empty());
    assert_eq!(
        matching("acme/", "A").await,
        ["acme/a", "acme/axb", "acme/a_b", "acme/back\\slash"]
    );
    // Only the part past the prefix is searched.
    assert!(matching("acme/", "acme").await.is_empty());
    assert!(matching("acme/", "/").await.is_empty());
    assert_eq!(matching("globex/", "acme").await, ["globex/acme"]);
    assert_eq!(matching("", "acme").await.len(), threads.len());
    assert!(matching("acme/", "nothing").await.is_empty());
    // Pages of a search follow each other too.
    let pages = recent_pages(s, "acme/", "a", 1).await;
    let walked: Vec<ThreadInfo> = pages.into_iter().flatten().collect();
    assert_eq!(
        ids_of(&walked),
        ["acme/a", "acme/axb", "acme/a_b", "acme/back\\slash"]
    );
    // The prefix bounds the list, and is a prefix of ids, not of path segments.
    assert_eq!(
        matching("acme", "").await,
        [&["acmeX/z", "acme0"][..], &newest_first[..]].concat()
    );
    assert_eq!(
        matching("acme/a", "").await,
        ["acme/a", "acme/axb", "acme/a_b"]
    );
    assert_eq!(
        matching("", "").await,
        [&["acmeX/z", "acme0", "globex/acme"][..], &newest_first[..],].concat()
    );
    assert!(matching("nobody/", "").await.is_empty());
}

/// A thread is an execution's log when its own first event starts a run: not when a run
/// starts later, not for a fork of an execution. Every read of a summary says the same,
/// and the flag stays out of the JSON.
async fn an_execution_is_a_thread_whose_first_event_starts_a_run(h: &impl Harness) {
    let s = h.store();
    s.append("run", vec![run_started(), user("step")])
        .await
        .unwrap();
    s.append("late", vec![user("first"), run_started()])
        .await
        .unwrap();
    s.append_one("chat", user("hello")).await.unwrap();
    s.fork("run", 1, "run-fork").await.unwrap();
    s.fork("run", 0, "run-fork-0").await.unwrap();
    let expected = [
        ("chat", false),
        ("late", false),
        ("run", true),
        ("run-fork", false),
        ("run-fork-0", false),
    ];
    let flags = |page: &[ThreadInfo]| -> Vec<(String, bool)> {
        let mut flags: Vec<(String, bool)> = page
            .iter()
            .map(|info| (info.id.clone(), info.execution))
            .collect();
        flags.sort();
        flags
    };
    let expected: Vec<(String, bool)> = expected
        .iter()
        .map(|(id, execution)| (id.to_string(), *execution))
        .collect();
    let any = h.any();
    assert_eq!(flags(&s.list().await.unwrap()), expected);
    assert_eq!(flags(&any.list().await.unwrap()), expected);
    assert_eq!(
        flags(&s.list_recent("", "", None, 100).await.unwrap()),
        expected
    );
    assert_eq!(
        flags(&any.list_recent("", "", None, 100).await.unwrap()),
        expected
    );
    for (id, execution) in &expected {
        let info = s.thread_info(id).await.unwrap().unwrap();
        assert_eq!(info.execution, *execution, "{id}");
        assert_eq!(any.thread_info(id).await.unwrap().unwrap(), info);
    }
    assert_eq!(
        flags(&s.forks_of("run").await.unwrap()),
        expected[3..].to_vec()
    );
    // A page of ids that starts inside the list reads the flag too.
    assert_eq!(
        flags(&s.list_page("", "late", 1).await.unwrap()),
        [("run".to_string(), true)]
    );
    let json = serde_json::to_value(s.thread_info("run").await.unwrap().unwrap()).unwrap();
    assert!(json.get("execution").is_none(), "{json}");
    assert_eq!(json["id"], "run");
}

/// A thread's forks oldest first (by creation, ties by id), each summarized as
/// `thread_info` does; a fork of a fork is its parent's, not its grandparent's; none for a
/// thread without forks; `NotFound` for a thread that does not exist. The same through
/// `AnyStore`.
async fn forks_are_listed_oldest_first(h: &impl Harness) {
    let s = h.store();
    s.append("p", vec![user("1"), user("2")]).await.unwrap();
    s.fork("p", 2, "p-z").await.unwrap();
    s.fork("p", 1, "p-a").await.unwrap();
    s.fork("p", 0, "p-m").await.unwrap();
    s.fork("p-z", 3, "p-z-1").await.unwrap();
    s.append_one("p-z", user("3")).await.unwrap();
    s.append_one("lonely", user("x")).await.unwrap();
    s.append_one("p2", user("x")).await.unwrap();
    s.fork("p2", 1, "p2-fork").await.unwrap();
    // Creation times written directly (the store's clock cannot be stopped): two forks of
    // one millisecond, and a grandchild older than them all.
    h.execute_raw(
        "UPDATE threads SET created_at = 1000 WHERE id IN ('p-z', 'p-m');
         UPDATE threads SET created_at = 2000 WHERE id = 'p-a';
         UPDATE threads SET created_at = 500 WHERE id = 'p-z-1';",
    )
    .await;
    let forks = s.forks_of("p").await.unwrap();
    assert_eq!(ids_of(&forks), ["p-m", "p-z", "p-a"]);
    for fork in &forks {
        assert_eq!(fork.parent.as_deref(), Some("p"));
        assert_eq!(Some(fork), s.thread_info(&fork.id).await.unwrap().as_ref());
    }
    assert_eq!(
        forks
            .iter()
            .map(|f| (f.fork_seq, f.last_seq))
            .collect::<Vec<_>>(),
        [(Some(0), 1), (Some(2), 4), (Some(1), 2)]
    );
    let nested = s.forks_of("p-z").await.unwrap();
    assert_eq!(ids_of(&nested), ["p-z-1"]);
    assert_eq!(nested[0].parent.as_deref(), Some("p-z"));
    assert_eq!(nested[0].fork_seq, Some(3));
    assert_eq!(ids_of(&s.forks_of("p2").await.unwrap()), ["p2-fork"]);
    for leaf in ["lonely", "p-a", "p-z-1", "p2-fork"] {
        assert!(s.forks_of(leaf).await.unwrap().is_empty(), "{leaf}");
    }
    for missing in ["missing", "p-", "P", ""] {
        match s.forks_of(missing).await {
            Err(StoreError::NotFound { thread }) => assert_eq!(thread, missing),
            other => panic!("{missing:?}: expected NotFound, got {other:?}"),
        }
    }
    let any = h.any();
    assert_eq!(any.forks_of("p").await.unwrap(), forks);
    assert!(matches!(
        any.forks_of("missing").await,
        Err(StoreError::NotFound { .. })
    ));
    // Once its forks are gone, a thread has none; once it is gone, it is not found.
    for fork in ["p-z-1", "p-z", "p-a", "p-m"] {
        s.delete(fork).await.unwrap();
    }
    assert!(s.forks_of("p").await.unwrap().is_empty());
    s.delete("p").await.unwrap();
    assert!(matches!(
        s.forks_of("p").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A step's end whose output is the answer the same append put into the shared history
/// reads back whole, from a read of the whole log or of the end alone; an output no message
/// of the append holds, one held by a message that has an idempotency key, and an end whose
/// values hold a key named as the store's mark, read back as they were.
async fn a_step_output_the_history_holds_reads_back_whole(h: &impl Harness) {
    let s = h.store();
    let answer = "The report, part one.";
    let end = |step: u64, output: &str| StepEnd {
        step,
        state_id: format!("s{step}"),
        item: None,
        output: output.into(),
        next: Some("next".into()),
        items: Some(vec![json!({"output_in": 2}), json!("\"output_in\":1")]),
        merge: None,
        item_keys: None,
        item_concurrency: None,
    };
    let batch = vec![
        user("Write part one."),
        say(Message::assistant(answer)),
        NewEvent::new(EventKind::StoreChanged(StoreChange::Set {
            key: "part".into(),
            value: json!(1),
        })),
        NewEvent::new(EventKind::StepFinished(end(1, answer))),
    ];
    s.append("t", batch).await.unwrap();
    let others = vec![
        say(Message::assistant("Another answer.")),
        NewEvent::new(EventKind::StepFinished(end(2, "Not in the history."))),
        say(Message::assistant("Keyed.")).with_key("k1"),
        NewEvent::new(EventKind::StepFinished(end(3, "Keyed."))),
        say(Message::assistant("Twice.")),
        NewEvent::new(EventKind::StepFinished(end(4, "Twice."))),
        NewEvent::new(EventKind::StepFinished(end(5, "Twice."))),
    ];
    s.append("t", others).await.unwrap();
    let events = s.events("t").await.unwrap();
    let outputs: Vec<(u64, String)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepFinished(end) => Some((event.seq, end.output.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        outputs,
        [
            (4, answer.to_owned()),
            (6, "Not in the history.".to_owned()),
            (8, "Keyed.".to_owned()),
            (10, "Twice.".to_owned()),
            (11, "Twice.".to_owned()),
        ]
    );
    for (seq, output) in &outputs {
        let alone = s.events_through("t", seq - 1, *seq).await.unwrap();
        assert_eq!(alone.len(), 1);
        let EventKind::StepFinished(read) = &alone[0].kind else {
            panic!("{:?}", alone[0]);
        };
        assert_eq!(&read.output, output, "the end at {seq} read alone");
        assert_eq!(read, &end(read.step, output));
    }
}

/// A step's last request end whose reply is the step's answer, which the step's end appends
/// to the shared history tagged with the step, holds it by reference to that message (a
/// change of the message's row shows in the end) and reads back whole, with the log or alone,
/// from its thread and from a fork made between the end and the answer; an end a fork shares
/// before the answer is appended keeps its reply.
async fn a_step_answer_its_last_call_ended_with_is_stored_once(h: &impl Harness) {
    let s = h.store();
    let answer = "The report, part one.";
    let end = RequestEnd {
        request_id: "run/step-1/call-0".into(),
        outcome: RequestOutcome::Completed,
        usage: Usage::default(),
        usage_estimated: false,
        reply: Some(Message::assistant(answer)),
        finish_reason: Some("stop".into()),
        error: None,
        cost_usd: Some(0.5),
        attempts: None,
    };
    let mut tagged = Message::assistant(answer);
    tagged.metadata.origin_step = Some("s1".into());
    let step_end = StepEnd {
        step: 1,
        state_id: "s1".into(),
        item: None,
        output: answer.into(),
        next: Some("next".into()),
        items: None,
        merge: None,
        item_keys: None,
        item_concurrency: None,
    };
    for thread in ["a", "b"] {
        let ended = NewEvent::new(EventKind::RequestEnded(end.clone()));
        s.append(thread, vec![ended]).await.unwrap();
    }
    s.fork("b", 1, "b-early").await.unwrap();
    for thread in ["a", "b"] {
        let batch = vec![
            user("Write part one."),
            say(tagged.clone()),
            NewEvent::new(EventKind::StepFinished(step_end.clone())),
        ];
        assert_eq!(s.append(thread, batch).await.unwrap(), [2, 3, 4]);
    }
    s.fork("a", 2, "a-late").await.unwrap();
    s.append("a-late", vec![say(Message::assistant("Another answer."))])
        .await
        .unwrap();
    for thread in ["a", "b", "a-late", "b-early"] {
        let events = s.events(thread).await.unwrap();
        assert_eq!(
            events[0].kind,
            EventKind::RequestEnded(end.clone()),
            "{thread}"
        );
        let alone = s.events_through(thread, 0, 1).await.unwrap();
        assert_eq!(
            alone[0].kind,
            EventKind::RequestEnded(end.clone()),
            "{thread}"
        );
    }
    let answered = s.events("a").await.unwrap();
    assert_eq!(
        answered[2].kind,
        EventKind::MessageAppended {
            message: tagged.clone()
        }
    );
    assert_eq!(answered[3].kind, EventKind::StepFinished(step_end));
    h.execute_raw(
        r#"UPDATE events SET body = '{"role":"assistant","content":"Changed.","metadata":{"origin_step":"s1"}}'
           WHERE thread_id IN ('a', 'b') AND seq = 3"#,
    )
    .await;
    let reply = |events: Vec<Event>| match &events[0].kind {
        EventKind::RequestEnded(end) => end.reply.as_ref().map(Message::text),
        other => panic!("{other:?}"),
    };
    assert_eq!(reply(s.events("a").await.unwrap()).unwrap(), "Changed.");
    assert_eq!(
        reply(s.events("a-late").await.unwrap()).unwrap(),
        "Changed."
    );
    assert_eq!(reply(s.events("b").await.unwrap()).unwrap(), answer);
}

macro_rules! conformance {
    (
        fresh: [$($name:ident),* $(,)?],
        before_api_keys: [$($old:ident),* $(,)?] $(,)?
    ) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let harness = crate::common::Sqlite::new().await;
                    super::$name(&harness).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $old() {
                    let harness = crate::common::Sqlite::before_api_keys().await;
                    super::$old(&harness).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let Some(harness) = crate::common::Pg::new().await else { return };
                    super::$name(&harness).await;
                    harness.cleanup().await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $old() {
                    let Some(harness) = crate::common::Pg::before_api_keys().await else {
                        return;
                    };
                    super::$old(&harness).await;
                    harness.cleanup().await;
                }
            )*
        }
    };
}

conformance!(
    fresh: [
    appends_get_gap_free_seqs_and_read_back_intact,
    idempotency_keys_store_a_retry_once,
    invalid_batches_store_nothing,
    every_event_kind_round_trips_and_replays,
    execution_log_events_round_trip_with_token_counts,
    a_step_output_the_history_holds_reads_back_whole,
    a_step_answer_its_last_call_ended_with_is_stored_once,
    events_after_a_seq_are_the_rest_of_the_log,
    a_threads_policy_is_read_with_its_tail_and_inherited_by_forks,
    forks_read_the_parent_prefix_without_copying,
    merges_are_events_on_the_parent,
    list_describes_threads_and_forks,
    deleting_a_thread_with_forks_is_refused,
    a_thread_exists_from_its_first_write_until_it_is_deleted,
    appends_racing_deletes_leave_no_events_behind,
    pruning_removes_idle_threads_forks_first,
    pruning_under_a_prefix_touches_only_its_threads,
    reopening_keeps_everything,
    concurrent_writers_get_unique_gap_free_seqs,
    projection_loads_match_full_replays,
    repeated_projection_loads_follow_every_change,
    api_keys_are_found_by_hash,
    duplicate_api_key_ids_and_hashes_are_refused,
    api_keys_are_listed_by_tenant_oldest_first,
    revoked_api_keys_are_listed_but_not_found,
    ping_answers,
    any_store_delegates_api_keys_and_ping,
    a_full_thread_refuses_appends_and_stores_nothing_of_them,
    sizes_count_a_threads_events_and_its_fork_prefix,
    a_thread_past_its_bytes_refuses_appends_and_stores_nothing_of_them,
    message_bytes_count_a_threads_messages_each_once,
    a_projection_read_from_its_end_holds_the_newest_messages_past_the_budget,
    threads_are_listed_by_prefix_a_page_at_a_time,
    retention_policies_are_stored_with_the_thread,
    pruning_request_records_keeps_the_policy_and_every_message,
    pruning_follows_each_threads_policy_then_the_rules,
    pruning_keeps_what_a_fork_still_sends,
    pruning_while_requests_are_appended_leaves_every_record_readable,
    calibrations_take_every_observation_once_and_stay_bounded,
    turns_hold_a_thread_one_at_a_time_in_the_order_they_joined,
    turns_joining_at_once_from_two_processes_let_one_hold_the_thread,
    event_pages_hold_every_event_once_within_their_count_and_bytes,
    recent_threads_are_listed_newest_first_a_page_at_a_time,
    an_execution_is_a_thread_whose_first_event_starts_a_run,
    forks_are_listed_oldest_first,
    executions_are_claimed_oldest_first_held_by_one_server_and_adopted_when_a_lease_runs_out,
    finished_runs_leave_the_queue_once_kept_long_enough_and_no_other_run_does,
    claims_racing_from_two_processes_hold_each_run_once_and_the_tenant_limit,
    a_runs_failures_are_counted_by_its_holder_only_and_it_waits_before_its_next_claim,
    a_runs_end_and_its_finish_in_the_queue_are_one_write_by_its_holder_only,
    a_turns_last_write_leaves_its_queue_only_when_its_events_are_stored,
    a_conditional_append_stores_only_on_the_thread_it_was_built_on,
    ],
    before_api_keys: [api_key_migration_applies_to_an_older_database],
);
