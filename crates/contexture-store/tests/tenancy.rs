//! A tenant's view of a store ([`Scoped`]) behaves exactly as a store of its own: for
//! random sequences of operations by two tenants on one shared store, every answer a
//! tenant gets (values and errors) is the answer an unshared store gives the same
//! operations, so nothing one tenant writes is visible to the other; and the ids inside
//! events come back as the tenant wrote them while the shared store holds them scoped.

mod common;

use common::Harness;
use contexture_core::Message;
use contexture_core::thread::{CancelRequest, Event, EventKind, RunLimits, RunStart};
use contexture_store::{
    NewEvent, RecentCursor, Scoped, SqliteStore, Store, StoreError, Tenant, ThreadInfo,
    TurnQueueStore,
};
use proptest::prelude::*;

use contexture_store::testing::TempDir;

/// What a tenant does.
#[derive(Debug, Clone)]
enum Op {
    /// Appends a user message to thread `thread`.
    Append { thread: usize, text: String },
    /// Records that thread `thread` was cancelled as part of thread `from`'s cancellation (an
    /// event that names another thread).
    Cascade { thread: usize, from: usize },
    /// Forks `parent` after `at_seq` as `child`.
    Fork {
        parent: usize,
        at_seq: u64,
        child: usize,
    },
    /// Deletes `thread`.
    Delete { thread: usize },
}

/// The ids tenants use: both tenants use the same ones, so a leak would be seen.
const IDS: [&str; 5] = ["t", "t/fork", "conversation:alice:wf", "other", "x"];

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS.len();
    prop_oneof![
        4 => (id.clone(), "[a-z]{1,8}").prop_map(|(thread, text)| Op::Append { thread, text }),
        1 => (id.clone(), id.clone()).prop_map(|(thread, from)| Op::Cascade { thread, from }),
        2 => (id.clone(), 0u64..5, id.clone())
            .prop_map(|(parent, at_seq, child)| Op::Fork { parent, at_seq, child }),
        1 => id.prop_map(|thread| Op::Delete { thread }),
    ]
}

/// What an operation answered, comparable across stores.
fn answer<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Ok(value) => format!("ok {value:?}"),
        Err(error) => format!("error {error}"),
    }
}

async fn apply(store: &impl Store, op: &Op) -> String {
    match op {
        Op::Append { thread, text } => {
            let event = NewEvent::new(EventKind::MessageAppended {
                message: Message::user(text.as_str()),
            });
            answer(store.append(IDS[*thread], vec![event]).await)
        }
        Op::Cascade { thread, from } => {
            let event = NewEvent::new(EventKind::CancelRequested(CancelRequest {
                reason: None,
                cascaded_from: Some(IDS[*from].to_owned()),
            }));
            answer(store.append(IDS[*thread], vec![event]).await)
        }
        Op::Fork {
            parent,
            at_seq,
            child,
        } => answer(store.fork(IDS[*parent], *at_seq, IDS[*child]).await),
        Op::Delete { thread } => answer(store.delete(IDS[*thread]).await),
    }
}

/// Everything a tenant can read of its threads.
async fn everything(store: &impl Store) -> Vec<String> {
    let mut seen = Vec::new();
    for info in store.list().await.expect("list") {
        seen.push(format!(
            "{} parent {:?} at {:?} last {}",
            info.id, info.parent, info.fork_seq, info.last_seq
        ));
    }
    // Searched past the tenant's prefix: the tenants' names (`acme`, `acme2`) match nothing
    // of theirs, `t` what holds it. Compared as sets, as the forks below.
    for contains in ["t", "acme", "/"] {
        let mut recent: Vec<String> = store
            .list_recent("", contains, None, 100)
            .await
            .expect("list recent")
            .into_iter()
            .map(|i| format!("{} parent {:?}", i.id, i.parent))
            .collect();
        recent.sort();
        seen.push(format!("recent holding {contains:?}: {recent:?}"));
    }
    for id in IDS {
        seen.push(format!("{id} exists {}", answer(store.exists(id).await)));
        seen.push(format!("{id} events {}", answer(store.events(id).await)));
        let info = store.thread_info(id).await.expect("thread info");
        seen.push(format!(
            "{id} info {:?}",
            info.map(|i| (i.id, i.parent, i.execution))
        ));
        // Forks made in one millisecond are in id order: compared as sets, so that the
        // two stores' clocks need not agree.
        let forks = store.forks_of(id).await.map(|forks| {
            let mut forks: Vec<(String, Option<String>)> =
                forks.into_iter().map(|f| (f.id, f.parent)).collect();
            forks.sort();
            forks
        });
        seen.push(format!("{id} forks {}", answer(forks)));
        seen.push(format!(
            "{id} tail {}",
            answer(
                store
                    .load_projection_tail(id, contexture_core::tokens::Encoding::O200kBase, 10)
                    .await
                    .map(|tail| (tail.last_seq, tail.fork, tail.projection.messages.len()))
            )
        ));
    }
    seen
}

async fn two_tenants_on_one_store(ops: Vec<(bool, Op)>) {
    let dir = TempDir::new("contexture-tenancy");
    let shared = SqliteStore::open(dir.join("shared.db")).await.unwrap();
    let tenants = [Tenant::new("acme").unwrap(), Tenant::new("acme2").unwrap()];
    let views = tenants
        .clone()
        .map(|tenant| Scoped::new(shared.clone(), tenant));
    let alone = [
        SqliteStore::open(dir.join("acme.db")).await.unwrap(),
        SqliteStore::open(dir.join("acme2.db")).await.unwrap(),
    ];
    for (second, op) in &ops {
        let who = usize::from(*second);
        let through_view = apply(&views[who], op).await;
        let by_itself = apply(&alone[who], op).await;
        assert_eq!(through_view, by_itself, "{op:?} by {}", tenants[who]);
    }
    for who in 0..2 {
        assert_eq!(
            everything(&views[who]).await,
            everything(&alone[who]).await,
            "what {} reads",
            tenants[who]
        );
    }
    // The shared store holds each tenant's threads under its name, and the ids inside their
    // events scoped too.
    for info in shared.list().await.unwrap() {
        let tenant = contexture_store::tenant_of(&info.id).expect("every id has a tenant");
        for event in shared.events(&info.id).await.unwrap() {
            let mut kind = event.kind;
            for id in kind.thread_ids_mut() {
                assert!(
                    id.starts_with(&tenant.id_prefix()),
                    "{id} in {} is scoped",
                    info.id
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_tenants_view_is_a_store_of_its_own(ops in proptest::collection::vec((any::<bool>(), op()), 1..40)) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(two_tenants_on_one_store(ops));
    }
}

#[tokio::test]
async fn pruning_through_a_view_touches_only_the_tenants_threads() {
    let dir = TempDir::new("contexture-tenancy");
    let shared = SqliteStore::open(dir.join("shared.db")).await.unwrap();
    let acme = shared.clone().scoped(Tenant::new("acme").unwrap());
    let other = shared.clone().scoped(Tenant::new("other").unwrap());
    let say = || {
        vec![NewEvent::new(EventKind::MessageAppended {
            message: Message::user("hi"),
        })]
    };
    for store in [&acme, &other] {
        store.append("old", say()).await.unwrap();
        store.append("parent", say()).await.unwrap();
        store.fork("parent", 1, "parent/kept").await.unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let cut = std::time::SystemTime::now();
    acme.append("parent/kept", say()).await.unwrap();
    let report = acme.prune(cut).await.unwrap();
    assert_eq!(report.deleted, vec!["old".to_owned()]);
    assert_eq!(report.kept_for_forks, vec!["parent".to_owned()]);
    let left: Vec<String> = shared
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(
        left,
        [
            "acme/parent",
            "acme/parent/kept",
            "other/old",
            "other/parent",
            "other/parent/kept"
        ]
    );
}

/// The conversation thread the release before tenant-scoped conversations kept for tenant
/// `acme`'s user `alice` of workflow `support`.
const OLD_CONVERSATION: &str = "conversation:acme:alice:support";

/// Writes what that release wrote for two runs that continued a conversation: the
/// conversation's thread (outside every tenant's ids), the tenant's execution naming it, and
/// a turn waiting in the conversation's queue.
async fn write_as_the_release_before(store: &(impl Store + TurnQueueStore)) -> Vec<Event> {
    let turn = |text: &str| {
        NewEvent::new(EventKind::MessageAppended {
            message: Message::user(text),
        })
    };
    store
        .append(
            OLD_CONVERSATION,
            vec![turn("first question"), turn("second")],
        )
        .await
        .unwrap();
    let start: EventKind = serde_json::from_value(serde_json::json!({
        "type": "run_started",
        "workflow_file": "support.yaml",
        "workflow_text": "name: support\nstates: []",
        "input": "second",
        "conversation": OLD_CONVERSATION,
    }))
    .unwrap();
    store
        .append("acme/run-2", vec![NewEvent::new(start)])
        .await
        .unwrap();
    store.join_turn_queue(OLD_CONVERSATION).await.unwrap();
    store.events(OLD_CONVERSATION).await.unwrap()
}

/// Checks the migrated store: the conversation is the tenant's, whole, reachable, listed,
/// and covered by the tenant's retention rule; another tenant does not see it.
async fn check_moved_under_the_tenant(
    store: &(impl Store + TurnQueueStore + Clone),
    old_events: Vec<Event>,
    old_bytes: u64,
) {
    let acme = store.clone().scoped(Tenant::new("acme").unwrap());
    let ids: Vec<String> = acme
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["conversation:alice:support", "run-2"]);
    assert!(!store.exists(OLD_CONVERSATION).await.unwrap());
    assert_eq!(
        acme.events("conversation:alice:support").await.unwrap(),
        old_events
    );
    let info = acme
        .thread_info("conversation:alice:support")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.bytes, old_bytes, "the stored size is still right");
    let run = acme.events("run-2").await.unwrap();
    let EventKind::RunStarted(start) = &run[0].kind else {
        panic!("{run:?}")
    };
    assert_eq!(
        start.conversation.as_deref(),
        Some("conversation:alice:support")
    );
    // The turn that waited is still first in the conversation's queue.
    let ticket = acme
        .join_turn_queue("conversation:alice:support")
        .await
        .unwrap()
        .ticket;
    assert_eq!(
        acme.turns_ahead("conversation:alice:support", ticket)
            .await
            .unwrap(),
        Some(1)
    );
    let rules = contexture_store::RetentionRules::with_default(None).with_tenant(
        acme.tenant(),
        contexture_store::RequestRetention::new(None, Some(1)).unwrap(),
    );
    assert!(
        rules
            .for_thread(&acme.global_id("conversation:alice:support"))
            .is_some()
    );
    let other = store.clone().scoped(Tenant::new("other").unwrap());
    assert!(other.list().await.unwrap().is_empty());
    assert!(matches!(
        other.events("conversation:alice:support").await,
        Err(StoreError::NotFound { .. })
    ));
    // Its tenant can erase it.
    acme.delete("conversation:alice:support").await.unwrap();
    assert!(!acme.exists("conversation:alice:support").await.unwrap());
}

#[tokio::test]
async fn sqlite_conversation_threads_move_under_their_tenant() {
    let dir = TempDir::new("contexture-tenancy");
    let path = dir.join("threads.db");
    let old = contexture_store::testing::open_sqlite_at_version(&path, 11).unwrap();
    let events = write_as_the_release_before(&old).await;
    let bytes = old
        .thread_info(OLD_CONVERSATION)
        .await
        .unwrap()
        .unwrap()
        .bytes;
    drop(old);
    let new = SqliteStore::open(&path).await.unwrap();
    check_moved_under_the_tenant(&new, events, bytes).await;
}

#[tokio::test]
async fn postgres_conversation_threads_move_under_their_tenant() {
    let Some((old, schema)) =
        contexture_store::testing::pg_store_at_version("ctx_tenancy", 10).await
    else {
        return;
    };
    let events = write_as_the_release_before(&old).await;
    let bytes = old
        .thread_info(OLD_CONVERSATION)
        .await
        .unwrap()
        .unwrap()
        .bytes;
    let new =
        contexture_store::PgStore::open_in_schema(&contexture_store::testing::pg_url(), &schema)
            .await
            .unwrap();
    check_moved_under_the_tenant(&new, events, bytes).await;
    new.drop_schema().await.unwrap();
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

fn ids_of(page: &[ThreadInfo]) -> Vec<&str> {
    page.iter().map(|info| info.id.as_str()).collect()
}

/// Through a tenant's view (over the store itself and over `AnyStore`), the recent threads
/// and the forks are the tenant's only, their ids and parents as the tenant knows them;
/// `contains` is looked for past the tenant's prefix, so the tenant's name matches only the
/// ids that hold it themselves; a cursor is given and taken in the tenant's ids.
async fn a_tenants_recent_threads_and_forks_are_its_own(h: &impl Harness) {
    let shared = h.store().clone();
    let say = || {
        vec![NewEvent::new(EventKind::MessageAppended {
            message: Message::user("hi"),
        })]
    };
    // `acme2` starts with `acme`: the other tenant's stored ids hold the first's name.
    let acme = shared.clone().scoped(Tenant::new("acme").unwrap());
    let other = shared.clone().scoped(Tenant::new("acme2").unwrap());
    for view in [&acme, &other] {
        view.append("t1", say()).await.unwrap();
        view.append("t2", say()).await.unwrap();
        view.append("run", vec![run_started()]).await.unwrap();
        view.fork("t1", 1, "t1/fork").await.unwrap();
    }
    acme.append("acme-notes", say()).await.unwrap();
    // Times written directly (the store's clock cannot be stopped), the other tenant's
    // threads between the tenant's.
    let mut times = String::new();
    for (tenant, offset) in [("acme", 0), ("acme2", 5)] {
        for (id, at) in [("t1", 100), ("t2", 300), ("run", 200), ("t1/fork", 400)] {
            times += &format!(
                "UPDATE threads SET updated_at = {} WHERE id = '{tenant}/{id}';",
                at + offset
            );
        }
    }
    times += "UPDATE threads SET updated_at = 250 WHERE id = 'acme/acme-notes';";
    h.execute_raw(&times).await;

    let any = h.any().scoped(Tenant::new("acme").unwrap());
    let newest_first = ["t1/fork", "t2", "acme-notes", "run", "t1"];
    let all = acme.list_recent("", "", None, 100).await.unwrap();
    assert_eq!(ids_of(&all), newest_first);
    assert_eq!(any.list_recent("", "", None, 100).await.unwrap(), all);
    let fork = &all[0];
    assert_eq!(fork.parent.as_deref(), Some("t1"));
    let executions: Vec<&str> = all
        .iter()
        .filter(|info| info.execution)
        .map(|info| info.id.as_str())
        .collect();
    assert_eq!(executions, ["run"]);
    for info in &all {
        assert_eq!(
            acme.thread_info(&info.id).await.unwrap().as_ref(),
            Some(info)
        );
    }
    // Pages follow each other in the tenant's ids, a thread at a time.
    let mut walked: Vec<ThreadInfo> = Vec::new();
    loop {
        let before = walked.last().map(RecentCursor::after);
        let page = acme.list_recent("", "", before.as_ref(), 1).await.unwrap();
        if page.is_empty() {
            break;
        }
        walked.extend(page);
    }
    assert_eq!(walked, all);
    let cursor = RecentCursor {
        updated_at_ms: 250,
        id: "acme-notes".into(),
    };
    assert_eq!(
        ids_of(&any.list_recent("", "", Some(&cursor), 10).await.unwrap()),
        ["run", "t1"]
    );
    // The tenant's name matches what holds it past the prefix, nothing else of the
    // tenant's; the other tenant, whose stored ids all hold `acme`, finds nothing.
    searches_past_the_tenant(&acme).await;
    searches_past_the_tenant(&any).await;
    assert!(
        other
            .list_recent("", "acme", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ids_of(&other.list_recent("", "", None, 100).await.unwrap()),
        ["t1/fork", "t2", "run", "t1"]
    );
    // The whole store sees both tenants' threads, their names in their ids.
    assert_eq!(
        shared
            .list_recent("", "acme", None, 100)
            .await
            .unwrap()
            .len(),
        9
    );
    // Forks: the tenant's, named as it knows them; another tenant's thread is not found.
    forks_through_the_view(&acme).await;
    forks_through_the_view(&any).await;
    assert!(matches!(
        other.forks_of("acme-notes").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        other.forks_of("../acme/t1").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// What `acme`'s view (of [`a_tenants_recent_threads_and_forks_are_its_own`]) finds by
/// searching: only past its prefix.
async fn searches_past_the_tenant(view: &impl Store) {
    assert_eq!(
        ids_of(&view.list_recent("", "acme", None, 100).await.unwrap()),
        ["acme-notes"]
    );
    assert!(
        view.list_recent("", "ACME/", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ids_of(&view.list_recent("t", "/", None, 100).await.unwrap()),
        ["t1/fork"]
    );
    assert!(
        view.list_recent("t1", "t1", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The forks `acme`'s view (of [`a_tenants_recent_threads_and_forks_are_its_own`]) lists.
async fn forks_through_the_view(view: &impl Store) {
    let forks = view.forks_of("t1").await.unwrap();
    assert_eq!(ids_of(&forks), ["t1/fork"]);
    assert_eq!(forks[0].parent.as_deref(), Some("t1"));
    assert!(!forks[0].execution);
    assert!(view.forks_of("run").await.unwrap().is_empty());
    match view.forks_of("missing").await {
        Err(StoreError::NotFound { thread }) => assert_eq!(thread, "missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_tenants_recent_threads_and_forks_are_its_own() {
    let harness = common::Sqlite::new().await;
    a_tenants_recent_threads_and_forks_are_its_own(&harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_tenants_recent_threads_and_forks_are_its_own() {
    let Some(harness) = common::Pg::new().await else {
        return;
    };
    a_tenants_recent_threads_and_forks_are_its_own(&harness).await;
    harness.cleanup().await;
}
