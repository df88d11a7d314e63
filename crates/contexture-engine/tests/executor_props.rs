//! Property: whatever the workflow's flags, answer sizes and tool rounds, every request the
//! executor sends passes the provider-rule validator for its model's rules and fits its
//! limit, is recorded exactly as the provider received it (a hook cuts long tool results in
//! some calls' views; the history is compacted when it grows), and the log replays to the
//! state the run ended with. Cases: `PROPTEST_CASES` (default 24; each case is a whole run,
//! on SQLite, and on PostgreSQL for every third case).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{events, executor, requests, script, sqlite, start};
use contexture_core::Message;
use contexture_core::fit::{Rules, validate};
use contexture_core::registry::Registry;
use contexture_core::thread::EventKind;
use contexture_engine::hooks::{BeforeCall, CallInfo, Hook, HookError};
use contexture_store::{Store, testing};
use proptest::prelude::*;

/// Cuts the tool results of every other call's view to their first 8 characters: what the
/// provider gets is not what the thread holds, and the record must say what it got.
struct CutResults;

impl Hook for CutResults {
    fn name(&self) -> &str {
        "cut-results"
    }

    fn before_llm_call(
        &self,
        call: &CallInfo,
        messages: &[Message],
    ) -> Result<BeforeCall, HookError> {
        if call.round.is_multiple_of(2) || !messages.iter().any(|m| m.tool_call_id.is_some()) {
            return Ok(BeforeCall::Continue);
        }
        let view = messages
            .iter()
            .map(|message| {
                let mut message = message.clone();
                if message.tool_call_id.is_some() {
                    let text: String = message.text().chars().take(8).collect();
                    message.set_text(format!("{text} [cut]"));
                }
                message
            })
            .collect();
        Ok(BeforeCall::View(view))
    }
}

#[derive(Debug, Clone)]
struct StepPlan {
    tool_rounds: usize,
    answer_words: usize,
    include: bool,
    clear_prior: bool,
    keep_current: bool,
}

fn step_plan() -> impl Strategy<Value = StepPlan> {
    (
        0..3usize,
        1..120usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(tool_rounds, answer_words, include, clear_prior, keep_current)| StepPlan {
                tool_rounds,
                answer_words,
                include,
                clear_prior: clear_prior && include,
                keep_current,
            },
        )
}

fn registry() -> Arc<Registry> {
    let mut registry = Registry::builtin();
    registry
        .apply_toml(
            r#"
[models."gpt-tiny"]
provider = "openai"
context_window = 1500
max_output_tokens = 300
encoding = "o200k_base"

[models."claude-tiny"]
provider = "anthropic"
context_window = 1500
max_output_tokens = 300
encoding = "o200k_base"
"#,
            "tiny.toml",
        )
        .unwrap();
    Arc::new(registry)
}

/// The workflow and the script of replies for a plan.
fn build(plan: &[StepPlan], model: &str) -> (String, String) {
    let mut workflow = format!(
        "assistants: [{{id: a, model: {model}, system_prompt: You are terse., tools: [lookup], \
         compaction: {{trigger: {{messages: 9}}, keep: {{messages: 3}}}}}}]\n\
         tools: [{{id: lookup, description: Look up., response: 'value {{{{ arguments.q }}}}'}}]\nstates:\n"
    );
    let mut replies = String::from("replies:\n");
    for (n, step) in plan.iter().enumerate() {
        let next = if n + 1 == plan.len() {
            "end".to_owned()
        } else {
            format!("s{}", n + 1)
        };
        workflow += &format!(
            "  - id: s{n}\n    assistant_id: a\n    task: 'Part {n} of {{{{ topic | default(\"x\") }}}}'\n    next:\n      state_id: {next}\n      include_in_llm_history: {}\n      clear_prior_messages: {}\n      clear_context_store: {}\n",
            step.include,
            step.clear_prior,
            if step.keep_current {
                "keep_current"
            } else {
                "false"
            },
        );
        for round in 0..step.tool_rounds {
            replies += &format!(
                "  - tool_calls: [{{id: c{n}_{round}, name: lookup, arguments: {{q: '{n}-{round}'}}}}]\n"
            );
        }
        replies += &format!(
            "  - content: '{{\"topic\": \"t{n}\", \"text\": \"{}\"}}'\n",
            "word ".repeat(step.answer_words).trim_end()
        );
    }
    (workflow, replies)
}

static CASE: AtomicUsize = AtomicUsize::new(0);

/// Runs `workflow` on `store` with the provider answering `replies`, and checks the property.
async fn check_run<S: Store + Clone>(
    store: S,
    workflow: &str,
    replies: &str,
    rules: Rules,
) -> Result<(), TestCaseError> {
    let provider = script(replies);
    let exec = executor(store.clone(), provider.clone())
        .with_registry(registry())
        .with_hook(Arc::new(CutResults));
    let out = start(&exec, workflow, r#"{"topic": "start"}"#)
        .await
        .unwrap();
    let log = events(&store, "run-1").await;
    let recorded = requests(&log);
    let received = provider.requests();
    // The summarizer's calls are recorded too, in the order they were made.
    prop_assert_eq!(recorded.len(), received.len());
    for (n, request) in recorded.iter().enumerate() {
        prop_assert_eq!(&request.messages, &received[n].messages, "request {}", n);
        if request.purpose.as_deref() == Some("compaction") {
            continue;
        }
        prop_assert_eq!(validate(&request.messages, rules), vec![], "request {}", n);
        let breakdown = request.breakdown.as_ref().unwrap();
        prop_assert!(
            breakdown.fits(),
            "request {} uses {} of {}",
            n,
            breakdown.used,
            breakdown.limits.limit
        );
    }
    if log
        .iter()
        .any(|e| matches!(e.kind, EventKind::ContextReplaced(_)))
    {
        COMPACTED.fetch_add(1, Ordering::Relaxed);
    }
    let cut = recorded
        .iter()
        .flat_map(|request| &request.messages)
        .filter(|message| message.text().ends_with("[cut]"))
        .count();
    CUT.fetch_add(cut, Ordering::Relaxed);
    // The log replays to what the run ended with.
    let thread = store.load("run-1").await.unwrap();
    prop_assert_eq!(thread.store(), out.store.as_map());
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

/// Over all cases: runs on PostgreSQL, runs whose history was compacted, and calls whose
/// view the hook cut, so that the property is known to have covered them.
static ON_POSTGRES: AtomicUsize = AtomicUsize::new(0);
static COMPACTED: AtomicUsize = AtomicUsize::new(0);
static CUT: AtomicUsize = AtomicUsize::new(0);

#[test]
fn every_request_validates_and_fits() {
    // A fixed seed: the cases, and so what they cover, are the same on every machine.
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig::with_cases(cases()),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let strategy = (proptest::collection::vec(step_plan(), 1..8), any::<bool>());
    runner
        .run(&strategy, |(plan, anthropic)| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let (model, rules) = if anthropic {
                    ("claude-tiny", Rules::Anthropic)
                } else {
                    ("gpt-tiny", Rules::OpenAi)
                };
                let (workflow, replies) = build(&plan, model);
                let case = CASE.fetch_add(1, Ordering::Relaxed);
                if case % 3 == 2
                    && let Some((store, _)) = testing::pg_store("ctx_props").await
                {
                    ON_POSTGRES.fetch_add(1, Ordering::Relaxed);
                    let result = check_run(store.clone(), &workflow, &replies, rules).await;
                    store.drop_schema().await.unwrap();
                    return result;
                }
                let (_dir, store) = sqlite().await;
                check_run(store, &workflow, &replies, rules).await
            })
        })
        .unwrap();
    for (what, counter) in [
        ("a run on PostgreSQL", &ON_POSTGRES),
        ("a compacted history", &COMPACTED),
        ("a view the hook cut", &CUT),
    ] {
        assert!(
            counter.load(Ordering::Relaxed) > 0
                || (what == "a run on PostgreSQL" && !testing::in_ci()),
            "no case had {what}: the property did not cover it"
        );
    }
}
