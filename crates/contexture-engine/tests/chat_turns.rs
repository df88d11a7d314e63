//! The chat turn operation with upstreams of either wire format: a call read from an
//! OpenAI-format client runs as a turn against an Anthropic upstream (the fake, over real
//! HTTP), whole and streamed, and the thread records the answer as it does for an
//! OpenAI-compatible one.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::sqlite;
use contexture_core::compact::CompactionPolicy;
use contexture_core::fit::FitPolicy;
use contexture_core::registry::Registry;
use contexture_core::thread::{EventKind, RequestOutcome};
use contexture_core::{Message, Role};
use contexture_engine::chat_service::{
    ChatLimits, ChatObserver, ChatParts, ChatService, TurnAnswer, TurnRequest,
};
use contexture_engine::compaction::{CompactionError, CompactionOutcome, Compactor};
use contexture_engine::cpu::CpuPool;
use contexture_engine::fitting::{FitOverrides, FittedRequest};
use contexture_engine::in_flight::InFlight;
use contexture_engine::llm::{FixedRouter, Router};
use contexture_engine::tenant_slots::TenantSlots;
use contexture_engine::turns::TurnQueue;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_llm::{
    ChatCall, ClientFormat, ClientRequest, Passthrough, ScriptedProvider, UpstreamBody,
    UpstreamConfig, Upstreams, WireFormat,
};
use contexture_store::{SqliteStore, Store, StoreError, Tenant};
use serde_json::{Value, json};

struct Quiet;

impl ChatObserver for Quiet {
    fn compacted(&self, _: &str, _: &Result<CompactionOutcome, CompactionError>) {}
    fn request_fitted(&self, _: &FittedRequest) {}
    fn recording_failed(&self, tenant: &str, error: &StoreError) {
        panic!("{tenant}: a turn's end was not recorded: {error}");
    }
}

pub(crate) fn service(store: SqliteStore, upstream: &FakeUpstream) -> ChatService<SqliteStore> {
    service_with(store, upstream, FitPolicy::default(), None)
}

fn service_fitting(
    store: SqliteStore,
    upstream: &FakeUpstream,
    fit_policy: FitPolicy,
) -> ChatService<SqliteStore> {
    service_with(store, upstream, fit_policy, None)
}

pub(crate) fn service_with(
    store: SqliteStore,
    upstream: &FakeUpstream,
    fit_policy: FitPolicy,
    compaction: Option<CompactionPolicy>,
) -> ChatService<SqliteStore> {
    let mut config = UpstreamConfig::speaking(
        WireFormat::AnthropicMessages,
        upstream.origin(),
        Some("sk-ant-test".to_owned()),
    );
    config.retries = 0;
    let registry = Arc::new(Registry::builtin());
    let summarizer = Arc::new(FixedRouter::new(Arc::new(ScriptedProvider::texts(["-"]))));
    ChatService::new(ChatParts {
        store,
        upstreams: Upstreams::new(Arc::new(Passthrough::new(config).unwrap())),
        registry: registry.clone(),
        fit_policy,
        compactor: Arc::new(Compactor::new(summarizer as Arc<dyn Router>, registry)),
        compaction,
        cpu: Arc::new(CpuPool::new(2, 2)),
        turns: Arc::new(TurnQueue::default()),
        slots: TenantSlots::new(4, "chat turns", "limits.max_chat_turns"),
        in_flight: Arc::new(InFlight::default()),
        limits: ChatLimits {
            turn_wait: Duration::from_secs(5),
            abandon_after_secs: 60.0,
        },
        observer: Arc::new(Quiet),
    })
}

/// A turn as the chat-completions door reads one.
pub(crate) fn turn(question: &str, stream: bool) -> TurnRequest {
    let messages = vec![Message::user(question)];
    let body = json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": question}],
        "stream": stream
    });
    let Value::Object(body) = body else {
        unreachable!()
    };
    TurnRequest {
        tenant: Tenant::new("acme").unwrap(),
        thread: "porto".to_owned(),
        overrides: FitOverrides::default(),
        messages,
        call: ChatCall {
            model: "claude-sonnet-4-5".to_owned(),
            tools: Vec::new(),
            response_format: None,
            max_tokens: None,
            stream,
            client: ClientRequest {
                format: ClientFormat::OPENAI_CHAT,
                body,
            },
        },
        reply_budget: None,
        choices: None,
        key: None,
        continues: None,
        instructions: None,
        store: true,
        compact_threshold: None,
        compacts_request: false,
        compact_instructions: None,
        pause_after_compaction: false,
        client_record: None,
    }
}

#[tokio::test]
async fn turns_against_an_anthropic_upstream_are_recorded_whole_and_streamed() {
    let (_dir, store) = sqlite().await;
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Rainy.").usage(20, 3));
    upstream.push(Reply::text_in_pieces(["Take ", "an umbrella."]).usage(31, 5));
    let chat = service(store.clone(), &upstream);

    let TurnAnswer::Upstream {
        response: first, ..
    } = chat.turn(turn("Weather in Porto?", false)).await.unwrap()
    else {
        panic!("an upstream answer")
    };
    assert_eq!(first.format, WireFormat::AnthropicMessages);
    first.body.collect().await.unwrap();

    let TurnAnswer::Upstream {
        response: second, ..
    } = chat.turn(turn("And tomorrow?", true)).await.unwrap()
    else {
        panic!("an upstream answer")
    };
    assert!(matches!(second.body, UpstreamBody::Stream(_)));
    // The stream ends once its answer is stored.
    second.body.collect().await.unwrap();

    // The second call carried the first turn's answer, in Anthropic's format.
    let calls = upstream.calls();
    assert_eq!(calls[1].path, "/v1/messages");
    assert_eq!(
        calls[1].json["messages"],
        json!([
            {"role": "user", "content": "Weather in Porto?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Rainy."}]},
            {"role": "user", "content": "And tomorrow?"}
        ])
    );

    let thread = store.scoped(Tenant::new("acme").unwrap());
    let events = thread.events("porto").await.unwrap();
    let said: Vec<(Role, String)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::MessageAppended { message } => Some((message.role, message.text())),
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        [
            (Role::User, "Weather in Porto?".to_owned()),
            (Role::Assistant, "Rainy.".to_owned()),
            (Role::User, "And tomorrow?".to_owned()),
            (Role::Assistant, "Take an umbrella.".to_owned()),
        ]
    );
    let ends: Vec<(RequestOutcome, u64, bool)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::RequestEnded(end) => {
                Some((end.outcome, end.usage.output_tokens, end.usage_estimated))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        ends,
        [
            (RequestOutcome::Completed, 3, false),
            (RequestOutcome::Completed, 5, false)
        ]
    );
}

/// `turns` question-and-answer exchanges about node-7, each message the phrase repeated
/// `repeat` times (five tokens a phrase).
fn exchanges(turns: usize, repeat: usize) -> Vec<contexture_store::NewEvent> {
    contexture_store::NewEvent::messages(
        (0..turns).flat_map(|n| {
            [
                Message::user(format!("Q{n} {}", "why is node-7 slow? ".repeat(repeat))),
                Message::assistant(format!("A{n} {}", "the disk queue grew. ".repeat(repeat))),
            ]
        }),
        None,
    )
}

/// With fitting off, a turn sends the whole stored history, and one whose history passes the
/// window is refused with its true size (the whole thread read, not the tail a fit reads),
/// before anything is sent or stored; unless a compaction policy applies, which shrinks the
/// history first.
#[tokio::test]
async fn with_fitting_off_a_turn_sends_the_whole_thread_or_is_refused_whole() {
    let off = FitPolicy {
        enabled: false,
        window: Some(3_000),
        ..FitPolicy::default()
    };
    let tenant = Tenant::new("acme").unwrap();
    for (turns, sent) in [(8, true), (40, false)] {
        let (_dir, store) = sqlite().await;
        // About 100 tokens per turn.
        let thread = store.clone().scoped(tenant.clone());
        thread.append("porto", exchanges(turns, 9)).await.unwrap();
        let stored = thread.events("porto").await.unwrap().len();
        let upstream = FakeUpstream::start().await;
        upstream.push(Reply::text("Rainy.").usage(20, 3));
        let chat = service_fitting(store.clone(), &upstream, off.clone());
        let answer = chat.turn(turn("Weather in Porto?", false)).await;
        if sent {
            let Ok(TurnAnswer::Upstream {
                response: answer, ..
            }) = answer
            else {
                panic!("an upstream answer")
            };
            answer.body.collect().await.unwrap();
            let messages = upstream.calls()[0].json["messages"]
                .as_array()
                .unwrap()
                .len();
            assert_eq!(messages, turns * 2 + 1);
        } else {
            let Err(error) = answer else {
                panic!("a refusal")
            };
            let text = error.to_string();
            let needs: u64 = text
                .split("needs ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{text}"));
            assert!(needs > 3_800, "the whole thread is counted: {text}");
            assert!(upstream.calls().is_empty());
            assert_eq!(thread.events("porto").await.unwrap().len(), stored);
        }
    }
    let (_dir, store) = sqlite().await;
    let thread = store.clone().scoped(tenant.clone());
    thread.append("porto", exchanges(40, 9)).await.unwrap();
    let upstream = FakeUpstream::start().await;
    upstream.push(Reply::text("Rainy.").usage(20, 3));
    let compaction: CompactionPolicy =
        toml::from_str("trigger = { tokens = 2000 }\nkeep = { messages = 2 }").unwrap();
    let chat = service_with(store.clone(), &upstream, off, Some(compaction));
    let Ok(TurnAnswer::Upstream {
        response: answer, ..
    }) = chat.turn(turn("Weather in Porto?", false)).await
    else {
        panic!("an upstream answer after the compaction")
    };
    answer.body.collect().await.unwrap();
    let sent = upstream.calls()[0].json["messages"]
        .as_array()
        .unwrap()
        .len();
    assert!(sent < 10, "{sent} messages sent");
}

/// A server's `[compaction]` or a thread's policy that names no trigger compacts a turn whose
/// request passes 10,000 tokens; with `trigger = {}` it never does on its own.
#[tokio::test]
async fn a_compaction_policy_without_a_trigger_compacts_a_turn_past_ten_thousand_tokens() {
    let tenant = Tenant::new("acme").unwrap();
    for (policy, compacts) in [
        ("keep = { messages = 2 }", true),
        ("keep = { messages = 2 }\ntrigger = {}", false),
    ] {
        let policy: CompactionPolicy = toml::from_str(policy).unwrap();
        let (_dir, store) = sqlite().await;
        // About 12,000 tokens of history.
        let thread = store.clone().scoped(tenant.clone());
        thread.append("porto", exchanges(60, 20)).await.unwrap();
        let upstream = FakeUpstream::start().await;
        upstream.push(Reply::text("Rainy.").usage(20, 3));
        let chat = service_with(store.clone(), &upstream, FitPolicy::default(), Some(policy));
        let Ok(TurnAnswer::Upstream {
            response: answer, ..
        }) = chat.turn(turn("Weather in Porto?", false)).await
        else {
            panic!("an upstream answer")
        };
        answer.body.collect().await.unwrap();
        let compacted = thread
            .events("porto")
            .await
            .unwrap()
            .iter()
            .any(|event| matches!(&event.kind, EventKind::ContextReplaced(_)));
        assert_eq!(compacted, compacts, "{compacts}");
        let sent = upstream.calls()[0].json["messages"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(sent < 20, compacts, "{sent} messages sent");
    }
}
