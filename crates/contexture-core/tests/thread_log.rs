//! The thread fold: seqs, projection, context operations with busy semantics, named contexts,
//! fork and merge.

use contexture_core::thread::{
    ConflictPolicy, ContextReplace, Event, EventKind, MergeError, MergeKeys, MergePolicy,
    MergeSpec, Provenance, ReplaceReason, RequestEnd, RequestOutcome, RequestRecord, StoreChange,
    Thread, ThreadError, Usage,
};
use contexture_core::{Message, Role};
use serde_json::json;

/// A log under construction: assigns the next seq to each event.
#[derive(Default)]
struct Log {
    events: Vec<Event>,
}

impl Log {
    fn push(&mut self, kind: EventKind) -> u64 {
        let seq = self.events.len() as u64 + 1;
        self.events.push(Event::new(seq, kind));
        seq
    }

    fn say(&mut self, message: Message) -> u64 {
        self.push(EventKind::MessageAppended { message })
    }

    fn replace(&mut self, op: ContextReplace) -> u64 {
        self.push(EventKind::ContextReplaced(op))
    }

    fn start(&mut self, id: &str) -> u64 {
        self.push(EventKind::RequestStarted(RequestRecord {
            request_id: id.into(),
            model: Some("gpt-4o".into()),
            messages: vec![Message::user("sent")],
            budget: None,
            ..Default::default()
        }))
    }

    fn end(&mut self, id: &str, outcome: RequestOutcome, usage: Usage) -> u64 {
        self.push(EventKind::RequestEnded(RequestEnd::new(id, outcome, usage)))
    }

    fn set(&mut self, key: &str, value: serde_json::Value) -> u64 {
        self.push(EventKind::StoreChanged(StoreChange::Set {
            key: key.into(),
            value,
        }))
    }

    fn thread(&self, id: &str) -> Thread {
        Thread::replay(id, self.events.clone()).expect("valid log")
    }
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

#[test]
fn seqs_must_follow_without_gaps() {
    let mut thread = Thread::new("t");
    let appended = |seq| {
        Event::new(
            seq,
            EventKind::MessageAppended {
                message: Message::user("x"),
            },
        )
    };
    assert_eq!(
        thread.apply(appended(2)),
        Err(ThreadError::SeqOutOfOrder {
            thread: "t".into(),
            expected: 1,
            found: 2
        })
    );
    thread.apply(appended(1)).unwrap();
    assert!(thread.apply(appended(1)).is_err());
    thread.apply(appended(2)).unwrap();
    assert_eq!(thread.last_seq(), 2);
}

#[test]
fn malformed_context_operations_are_rejected() {
    let table = [
        (3, 3, 1, "ReplaceBeyondLog"),
        (3, 5, 1, "ReplaceBeyondLog"),
        (3, 1, 0, "BadRange"),
        (3, 1, 3, "BadRange"),
    ];
    for (seq, to_seq, from_seq, expected) in table {
        let mut op = ContextReplace::new("op", ReplaceReason::Manual, to_seq, vec![]);
        op.from_seq = from_seq;
        let error = EventKind::ContextReplaced(op).check_at(seq).unwrap_err();
        assert!(format!("{error:?}").starts_with(expected), "{error:?}");
    }
    let fork = EventKind::Forked {
        parent: "p".into(),
        at_seq: 4,
    };
    assert_eq!(
        fork.check_at(3),
        Err(ThreadError::MisplacedFork { seq: 3, at_seq: 4 })
    );
    assert!(fork.check_at(5).is_ok());
}

#[test]
fn projection_is_last_anchor_plus_later_messages() {
    let mut log = Log::default();
    log.say(Message::system("be brief"));
    log.say(Message::user("u1"));
    let a1 = log.say(Message::assistant("a1"));
    log.say(Message::user("u2"));
    log.replace(
        ContextReplace::new(
            "c1",
            ReplaceReason::Compaction,
            a1,
            vec![Message::assistant("summary")],
        )
        .with_provenance(Provenance {
            summarizer_model: Some("gpt-4o-mini".into()),
            prompt_hash: Some("abc".into()),
            snapshot_seq: None,
        }),
    );
    log.say(Message::assistant("a2"));
    let thread = log.thread("t");
    let view = thread.projection();
    assert_eq!(
        view.system.as_ref().map(Message::text).as_deref(),
        Some("be brief")
    );
    assert_eq!(texts(&view.messages), ["summary", "u2", "a2"]);
    assert_eq!(
        texts(&view.to_messages()),
        ["be brief", "summary", "u2", "a2"]
    );

    // A limit keeps the last n conversation messages; the system prompt is not counted.
    let table = [
        (0, vec![]),
        (1, vec!["a2"]),
        (2, vec!["u2", "a2"]),
        (3, vec!["summary", "u2", "a2"]),
        (9, vec!["summary", "u2", "a2"]),
    ];
    for (limit, expected) in table {
        let view = thread.projection_of("main", Some(limit));
        assert_eq!(texts(&view.messages), expected, "limit {limit}");
        assert!(view.system.is_some());
    }
}

#[test]
fn restoring_a_snapshot_with_a_system_message_never_duplicates_the_prompt() {
    let mut log = Log::default();
    log.say(Message::system("old prompt"));
    log.say(Message::user("u1"));
    log.say(Message::system("new prompt"));
    let base = log.say(Message::assistant("a1"));
    log.replace(ContextReplace::new(
        "r1",
        ReplaceReason::Restore,
        base,
        vec![Message::system("snapshot prompt"), Message::user("snap u")],
    ));
    let view = log.thread("t").projection();
    let all = view.to_messages();
    assert_eq!(all.iter().filter(|m| m.role.is_system_like()).count(), 1);
    assert_eq!(texts(&all), ["snapshot prompt", "snap u"]);

    // A later replace without a system message keeps the restored prompt.
    let base = log.say(Message::user("u2"));
    log.replace(ContextReplace::new(
        "c1",
        ReplaceReason::Compaction,
        base,
        vec![Message::assistant("sum")],
    ));
    let all = log.thread("t").projection().to_messages();
    assert_eq!(texts(&all), ["snapshot prompt", "sum"]);

    // An appended system message after that becomes the prompt, still only once.
    log.say(Message::system("latest"));
    let all = log.thread("t").projection().to_messages();
    assert_eq!(texts(&all), ["latest", "sum"]);
}

#[test]
fn clear_keeps_pinned_messages_and_the_system_prompt() {
    let mut log = Log::default();
    log.say(Message::system("sys"));
    log.say(Message::user("keep me").pinned());
    let base = log.say(Message::assistant("drop me"));
    let current = log.thread("t").projection().messages;
    log.replace(ContextReplace::clear("clr", base, &current));
    log.say(Message::user("after"));
    let all = log.thread("t").projection().to_messages();
    assert_eq!(texts(&all), ["sys", "keep me", "after"]);
}

#[test]
fn operations_queue_while_a_request_is_in_flight_and_apply_in_order_when_it_ends() {
    for outcome in [
        RequestOutcome::Completed,
        RequestOutcome::Failed,
        RequestOutcome::Cancelled,
    ] {
        let mut log = Log::default();
        log.say(Message::user("u1"));
        let s = log.say(Message::assistant("a1"));
        log.start("req1");
        log.replace(ContextReplace::new(
            "op1",
            ReplaceReason::Compaction,
            s,
            vec![Message::assistant("first")],
        ));
        log.say(Message::user("u2 while busy"));
        log.replace(ContextReplace::new(
            "op2",
            ReplaceReason::Manual,
            s,
            vec![Message::assistant("second")],
        ));

        let busy = log.thread("t");
        assert_eq!(busy.in_flight(), Some("req1"));
        assert_eq!(busy.queued_ops().count(), 2);
        assert_eq!(
            texts(&busy.projection().messages),
            ["u1", "a1", "u2 while busy"],
            "{outcome:?}"
        );

        log.end("req1", outcome, Usage::new(10, 2));
        let idle = log.thread("t");
        assert_eq!(idle.in_flight(), None);
        assert_eq!(idle.queued_ops().count(), 0);
        // Both applied in order (the second is the last anchor); the message appended after
        // the base seq survives both.
        assert_eq!(
            texts(&idle.projection().messages),
            ["second", "u2 while busy"],
            "{outcome:?}"
        );
        assert_eq!(idle.usage(), Usage::new(10, 2));
    }
}

#[test]
fn operations_apply_at_once_when_idle_and_are_idempotent_by_op_id() {
    let mut log = Log::default();
    let s = log.say(Message::user("u1"));
    log.replace(ContextReplace::new(
        "op",
        ReplaceReason::Manual,
        s,
        vec![Message::user("replaced")],
    ));
    log.say(Message::user("u2"));
    // The same op id again (a retry) has no effect, even with a different body.
    log.replace(ContextReplace::new("op", ReplaceReason::Clear, 3, vec![]));
    let thread = log.thread("t");
    assert_eq!(texts(&thread.projection().messages), ["replaced", "u2"]);
}

#[test]
fn overlapping_requests_replay_and_operations_wait_for_the_last_one() {
    // Turns that were not serialized: two requests in flight at once, an end of a request
    // that is not in flight, and a replace that arrives while both are in flight.
    let mut log = Log::default();
    let s = log.say(Message::user("u1"));
    log.start("a");
    log.start("b");
    log.replace(ContextReplace::new(
        "op",
        ReplaceReason::Manual,
        s,
        vec![Message::assistant("summary")],
    ));
    log.end("stray", RequestOutcome::Failed, Usage::new(1, 0));
    log.end("a", RequestOutcome::Completed, Usage::new(10, 2));
    let busy = log.thread("t");
    assert_eq!(busy.requests_in_flight(), ["b"]);
    assert_eq!(busy.queued_ops().count(), 1, "b is still in flight");
    log.say(Message::assistant("answer a"));
    log.end("b", RequestOutcome::Completed, Usage::new(20, 3));
    log.say(Message::assistant("answer b"));
    let idle = log.thread("t");
    assert_eq!(idle.in_flight(), None);
    assert_eq!(idle.queued_ops().count(), 0);
    assert_eq!(
        texts(&idle.projection().messages),
        ["summary", "answer a", "answer b"]
    );
    // Every end counts its usage, the stray one too.
    assert_eq!(idle.usage(), Usage::new(31, 5));
}

#[test]
fn named_contexts_have_their_own_anchors_and_a_switch_changes_the_active_one() {
    let mut log = Log::default();
    log.say(Message::user("u1"));
    let s = log.say(Message::assistant("a1"));
    log.replace(
        ContextReplace::new(
            "brief",
            ReplaceReason::Compaction,
            s,
            vec![Message::assistant("short")],
        )
        .in_context("brief"),
    );
    log.say(Message::user("u2"));
    let thread = log.thread("t");
    assert_eq!(thread.active_context(), "main");
    assert_eq!(texts(&thread.projection().messages), ["u1", "a1", "u2"]);
    assert_eq!(
        texts(&thread.projection_of("brief", None).messages),
        ["short", "u2"]
    );

    log.push(EventKind::ContextSwitched {
        context: "brief".into(),
        op_id: None,
    });
    let thread = log.thread("t");
    assert_eq!(thread.active_context(), "brief");
    assert_eq!(texts(&thread.projection().messages), ["short", "u2"]);
    assert_eq!(
        thread.contexts().into_iter().collect::<Vec<_>>(),
        ["brief", "main"]
    );
}

/// A switch is a context operation like a replace: recorded while a request is in flight,
/// it waits for the request to end (the request was built from the context it started
/// with); recorded again with the same op id (a retry), it has no second effect.
#[test]
fn a_switch_waits_for_the_request_in_flight_and_applies_once_per_op_id() {
    let switch = |context: &str, op: &str| EventKind::ContextSwitched {
        context: context.into(),
        op_id: Some(op.into()),
    };
    // Where the active context's projection starts, as a store reads it from the events.
    let watermark = |log: &Log| {
        contexture_core::thread::projection_watermark(
            log.events
                .iter()
                .filter(|event| !matches!(event.kind, EventKind::MessageAppended { .. }))
                .map(|event| (event.seq, &event.kind)),
        )
    };
    let mut log = Log::default();
    let s = log.say(Message::user("u1"));
    log.replace(
        ContextReplace::new("d", ReplaceReason::Manual, s, vec![Message::user("draft")])
            .in_context("drafts"),
    );
    log.start("req");
    log.push(switch("drafts", "op-1"));
    let thread = log.thread("t");
    assert_eq!(thread.active_context(), "main", "deferred while in flight");
    assert_eq!(thread.queued_switch(), Some("drafts"));
    assert_eq!(watermark(&log), 0);
    log.end("req", RequestOutcome::Completed, Usage::new(1, 1));
    let thread = log.thread("t");
    assert_eq!(thread.active_context(), "drafts");
    assert_eq!(thread.queued_switch(), None);
    assert_eq!(texts(&thread.projection().messages), ["draft"]);
    assert_eq!(watermark(&log), s);
    // Back to main, then a retry of the first switch: it was applied once already.
    log.push(switch("main", "op-2"));
    log.push(switch("drafts", "op-1"));
    assert_eq!(log.thread("t").active_context(), "main");
    assert_eq!(watermark(&log), 0);
}

#[test]
fn store_changes_fold_in_order() {
    let mut log = Log::default();
    log.set("a", json!(1));
    log.set("b", json!("x"));
    log.push(EventKind::StoreChanged(StoreChange::Unset {
        key: "a".into(),
    }));
    log.set("c", json!([1]));
    assert_eq!(
        serde_json::Value::Object(log.thread("t").store().clone()),
        json!({"b": "x", "c": [1]})
    );
    log.push(EventKind::StoreChanged(StoreChange::Cleared));
    assert!(log.thread("t").store().is_empty());
}

/// A parent with a prefix, and a fork of it at `at`, replayed the way a store does it: the
/// parent's events up to the fork point, then the fork's own.
fn forked(parent: &Log, at: u64, own: impl FnOnce(&mut Log)) -> Thread {
    let mut log = Log {
        events: parent.events[..at as usize].to_vec(),
    };
    log.push(EventKind::Forked {
        parent: "p".into(),
        at_seq: at,
    });
    own(&mut log);
    log.thread("c")
}

#[test]
fn a_fork_reads_the_parent_prefix_only() {
    let mut parent = Log::default();
    parent.say(Message::user("shared"));
    parent.set("k", json!("parent"));
    parent.say(Message::user("parent only"));
    let child = forked(&parent, 2, |log| {
        log.say(Message::assistant("child only"));
    });
    assert_eq!(
        child.fork_point().map(|f| (f.parent.as_str(), f.at_seq)),
        Some(("p", 2))
    );
    assert_eq!(child.last_seq(), 4);
    assert_eq!(
        texts(&child.projection().messages),
        ["shared", "child only"]
    );
    assert_eq!(child.store().get("k"), Some(&json!("parent")));
}

#[test]
fn a_fork_starts_idle_and_applies_operations_the_parent_had_queued() {
    let mut parent = Log::default();
    let s = parent.say(Message::user("u1"));
    parent.start("req");
    parent.replace(ContextReplace::new(
        "op",
        ReplaceReason::Manual,
        s,
        vec![Message::user("r")],
    ));
    let child = forked(&parent, 3, |_| {});
    assert_eq!(child.in_flight(), None);
    assert_eq!(texts(&child.projection().messages), ["r"]);
}

fn spec(policy: MergePolicy, conflict: ConflictPolicy, keys: &[&str]) -> MergeSpec {
    MergeSpec {
        policy,
        conflict,
        keys: MergeKeys::Listed(keys.iter().map(|k| k.to_string()).collect()),
    }
}

#[test]
fn merge_policies_bring_back_what_they_declare() {
    let mut parent = Log::default();
    parent.say(Message::user("task"));
    let child = forked(&parent, 1, |log| {
        log.say(Message::user("sub question"));
        log.say(Message::assistant("draft"));
        log.say(Message::assistant("final answer"));
        log.set("result", json!(42));
    });
    let p = parent.thread("p");

    let append = p
        .plan_merge(
            &child,
            &spec(MergePolicy::AppendMessages, ConflictPolicy::Error, &[]),
        )
        .unwrap();
    let summary = p
        .plan_merge(
            &child,
            &spec(MergePolicy::SummaryOnly, ConflictPolicy::Error, &[]),
        )
        .unwrap();
    let keys = p
        .plan_merge(
            &child,
            &spec(MergePolicy::OutputKeys, ConflictPolicy::Error, &["result"]),
        )
        .unwrap();
    let table = [
        (
            append,
            vec!["task", "sub question", "draft", "final answer"],
            json!({}),
        ),
        (summary, vec!["task", "final answer"], json!({})),
        (keys, vec!["task"], json!({"result": 42})),
    ];
    for (event, messages, store) in table {
        let mut merged = parent.events.clone();
        merged.push(Event::new(2, event));
        let thread = Thread::replay("p", merged).unwrap();
        assert_eq!(texts(&thread.projection().messages), messages);
        assert_eq!(serde_json::Value::Object(thread.store().clone()), store);
        assert_eq!(thread.merged_through("c"), Some(6));
    }
}

#[test]
fn key_conflicts_resolve_by_policy() {
    let mut parent = Log::default();
    parent.set("k", json!("p"));
    parent.set("same", json!(1));
    let child = forked(&parent, 2, |log| {
        log.set("k", json!("c"));
        log.set("only_child", json!("new"));
    });
    parent.set("k", json!("p2"));
    let p = parent.thread("p");
    let table = [
        (ConflictPolicy::ChildWins, Some(json!("c"))),
        (ConflictPolicy::ParentWins, Some(json!("p2"))),
        (ConflictPolicy::Append, Some(json!(["p2", "c"]))),
        (ConflictPolicy::Error, None),
    ];
    // The listed keys, then every key of the fork (`keys: all`), under each policy.
    for (conflict, expected) in table {
        for keys in [
            MergeKeys::Listed(vec!["k".into(), "same".into()]),
            MergeKeys::All,
        ] {
            let all = keys == MergeKeys::All;
            let result = p.plan_merge(
                &child,
                &MergeSpec {
                    policy: MergePolicy::OutputKeys,
                    conflict,
                    keys,
                },
            );
            match &expected {
                Some(value) => {
                    let mut merged = parent.events.clone();
                    merged.push(Event::new(4, result.unwrap()));
                    let thread = Thread::replay("p", merged).unwrap();
                    assert_eq!(thread.store().get("k"), Some(value), "{conflict:?}");
                    assert_eq!(thread.store().get("same"), Some(&json!(1)));
                    // Only the fork held `only_child`: all keys bring it, whatever the policy.
                    assert_eq!(
                        thread.store().get("only_child"),
                        all.then_some(&json!("new")),
                        "{conflict:?}"
                    );
                }
                None => assert_eq!(
                    result.unwrap_err(),
                    MergeError::KeyConflict {
                        key: "k".into(),
                        parent_value: "\"p2\"".into(),
                        child_value: "\"c\"".into()
                    }
                ),
            }
        }
    }
}

#[test]
fn merge_errors_are_typed() {
    let mut parent = Log::default();
    parent.say(Message::user("task"));
    let p = parent.thread("p");
    let empty_fork = forked(&parent, 1, |_| {});
    let no_assistant = forked(&parent, 1, |log| {
        log.say(Message::user("only a user turn"));
    });
    let stranger = parent.thread("s");
    let table: Vec<(&Thread, MergeSpec, MergeError)> = vec![
        (
            &stranger,
            spec(MergePolicy::AppendMessages, ConflictPolicy::Error, &[]),
            MergeError::NotAFork {
                parent: "p".into(),
                child: "s".into(),
            },
        ),
        (
            &empty_fork,
            spec(MergePolicy::AppendMessages, ConflictPolicy::Error, &[]),
            MergeError::NothingToMerge {
                child: "c".into(),
                since: 2,
            },
        ),
        (
            &no_assistant,
            spec(MergePolicy::SummaryOnly, ConflictPolicy::Error, &[]),
            MergeError::NoSummary {
                child: "c".into(),
                since: 2,
            },
        ),
        (
            &no_assistant,
            spec(MergePolicy::OutputKeys, ConflictPolicy::Error, &[]),
            MergeError::NoKeys,
        ),
        (
            &no_assistant,
            spec(MergePolicy::OutputKeys, ConflictPolicy::Error, &["out"]),
            MergeError::MissingKey {
                child: "c".into(),
                key: "out".into(),
            },
        ),
    ];
    for (child, spec, expected) in table {
        assert_eq!(p.plan_merge(child, &spec).unwrap_err(), expected);
    }
}

#[test]
fn usage_is_counted_once_across_fork_and_merges() {
    let mut parent = Log::default();
    parent.start("p1");
    parent.end("p1", RequestOutcome::Completed, Usage::new(100, 10));
    let mut child_log = Log {
        events: parent.events.clone(),
    };
    child_log.push(EventKind::Forked {
        parent: "p".into(),
        at_seq: 2,
    });
    child_log.start("c1");
    child_log.end("c1", RequestOutcome::Completed, Usage::new(30, 3));
    child_log.say(Message::assistant("done"));
    let child = child_log.thread("c");
    assert_eq!(child.usage(), Usage::new(130, 13));
    assert_eq!(child.own_usage(), Usage::new(30, 3));

    let append = spec(MergePolicy::AppendMessages, ConflictPolicy::Error, &[]);
    let first = parent.thread("p").plan_merge(&child, &append).unwrap();
    parent.push(first);
    let p = parent.thread("p");
    assert_eq!(p.usage(), Usage::new(130, 13));
    // Merging again with nothing new is refused rather than counted twice.
    assert!(matches!(
        p.plan_merge(&child, &append),
        Err(MergeError::NothingToMerge { .. })
    ));

    // A second merge brings back only what happened since the first.
    child_log.start("c2");
    child_log.end("c2", RequestOutcome::Failed, Usage::new(5, 0));
    child_log.say(Message::assistant("more"));
    let child = child_log.thread("c");
    let second = p.plan_merge(&child, &append).unwrap();
    let EventKind::Merged(merge) = &second else {
        panic!("not a merge")
    };
    assert_eq!(merge.usage, Usage::new(5, 0));
    assert_eq!(texts(&merge.messages), ["more"]);
    parent.push(second);
    let p = parent.thread("p");
    assert_eq!(p.usage(), Usage::new(135, 13));
    assert_eq!(texts(&p.projection().messages), ["done", "more"]);
}

#[test]
fn system_messages_from_a_fork_are_not_merged_into_the_conversation() {
    let mut parent = Log::default();
    parent.say(Message::system("parent prompt"));
    let child = forked(&parent, 1, |log| {
        log.say(Message::system("child prompt"));
        log.say(Message::assistant("answer"));
    });
    let merge = parent
        .thread("p")
        .plan_merge(
            &child,
            &spec(MergePolicy::AppendMessages, ConflictPolicy::Error, &[]),
        )
        .unwrap();
    parent.push(merge);
    let all = parent.thread("p").projection().to_messages();
    assert_eq!(
        all.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::System, Role::Assistant]
    );
    assert_eq!(all[0].text(), "parent prompt");
}

#[test]
fn the_storage_form_of_events_is_stable() {
    let mut log = Log::default();
    log.say(Message::system("sys"));
    let s = log.say(Message::user("hi"));
    log.start("req");
    log.replace(ContextReplace::new(
        "op",
        ReplaceReason::Compaction,
        s,
        vec![Message::assistant("sum")],
    ));
    log.end("req", RequestOutcome::Completed, Usage::new(3, 1));
    log.set("k", json!({"v": true}));
    log.push(EventKind::ContextSwitched {
        context: "alt".into(),
        op_id: None,
    });
    let lines: Vec<String> = log
        .events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    for line in &lines {
        let back: Event = serde_json::from_str(line).unwrap();
        assert_eq!(&serde_json::to_string(&back).unwrap(), line);
    }
    insta::assert_snapshot!(lines.join("\n"));
}
