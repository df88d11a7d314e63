//! Property: whatever the workflow's flags, answer sizes and tool rounds, every request the
//! executor sends passes the provider-rule validator for its model's rules and fits its
//! limit, and the log replays to the state the run ended with. Cases: `PROPTEST_CASES`
//! (default 24; each case is a whole run on SQLite).

mod common;

use std::sync::Arc;

use common::{events, executor, requests, script, sqlite, start};
use contexture_core::fit::{Rules, validate};
use contexture_core::registry::Registry;
use contexture_store::Store;
use proptest::prelude::*;

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
        "assistants: [{{id: a, model: {model}, system_prompt: You are terse., tools: [lookup]}}]\n\
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

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn every_request_validates_and_fits(
        plan in proptest::collection::vec(step_plan(), 1..8),
        anthropic in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (model, rules) = if anthropic {
                ("claude-tiny", Rules::Anthropic)
            } else {
                ("gpt-tiny", Rules::OpenAi)
            };
            let (workflow, replies) = build(&plan, model);
            let (_dir, store) = sqlite().await;
            let provider = script(&replies);
            let exec = executor(store.clone(), provider.clone()).with_registry(registry());
            let out = start(&exec, &workflow, r#"{"topic": "start"}"#).await.unwrap();
            let log = events(&store, "run-1").await;
            let recorded = requests(&log);
            prop_assert_eq!(recorded.len(), provider.requests().len());
            for (n, request) in recorded.iter().enumerate() {
                prop_assert_eq!(validate(&request.messages, rules), vec![], "request {}", n);
                let breakdown = request.breakdown.as_ref().unwrap();
                prop_assert!(breakdown.fits(), "request {} uses {} of {}", n, breakdown.used, breakdown.limits.limit);
                prop_assert_eq!(&request.messages, &provider.requests()[n].messages);
            }
            // The log replays to what the run ended with.
            let thread = store.load("run-1").await.unwrap();
            prop_assert_eq!(thread.store(), out.context.as_map());
            Ok(())
        })?;
    }
}
