//! Instruction counts of fitting one call of a long agent loop under valgrind's callgrind
//! (through gungraun): the call of the `loop_fit` criterion benchmark (a step of 250 tool
//! uses, 500 messages, on gpt-4o-mini with a 16,000-token window, clearing with hysteresis,
//! every count cached and the cut memory the previous call left). A count is deterministic for
//! a given build, so CI fails on a regression past the hard limit (a little above the count
//! it was measured at; see "Instruction counts in CI" in docs/benchmarks.md) without the
//! noise of timing.
//!
//! Run: `cargo bench -p contexture-engine --bench instructions` (needs valgrind and
//! `gungraun-runner` 0.20.0 on the PATH).

use std::hint::black_box;

use contexture_core::Message;
use contexture_core::budget::BudgetPolicy;
use contexture_core::fit::{ClearPolicy, CutMemory, Hysteresis, Strategy};
use contexture_core::registry::{ModelInfo, Registry};
use contexture_engine::fitting::{FitTarget, fit_request_in_loop};
use gungraun::{
    Callgrind, EventKind, LibraryBenchmarkConfig, library_benchmark, library_benchmark_group, main,
};
use serde_json::Value;

/// The allocator the `contexture` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/loop_step.rs"]
mod loop_step;
use loop_step::{USES, own};

/// Everything one call of the loop is fitted from, owned (the fit borrows it).
struct LoopCall {
    model: ModelInfo,
    policy: BudgetPolicy,
    clear: ClearPolicy,
    hysteresis: Hysteresis,
    tools: Vec<Value>,
    system: Message,
    messages: Vec<Message>,
    memory: CutMemory,
}

impl LoopCall {
    fn fit(&self, memory: &mut CutMemory) -> usize {
        let target = FitTarget {
            enabled: true,
            model: &self.model,
            policy: &self.policy,
            strategy: Strategy::Last,
            rules: self.model.rules(),
            tools: &self.tools,
            clear: Some(&self.clear),
            truncate: None,
            hysteresis: Some(&self.hysteresis),
            thinking: None,
            shape: None,
        };
        fit_request_in_loop(
            Some(&self.system),
            Vec::new(),
            &self.messages,
            &target,
            memory,
        )
        .expect("the call fits")
        .messages
        .len()
    }
}

/// The loop as it ran up to its last call: every call before it fitted in turn, each counting
/// its new messages once and leaving its cut memory to the next.
fn loop_before_last_call() -> LoopCall {
    let model = ModelInfo {
        context_window: 16_000,
        ..Registry::builtin().resolve("gpt-4o-mini")
    };
    let mut call = LoopCall {
        model,
        policy: BudgetPolicy {
            budget_ratio: 1.0,
            reserve_output: Some(1_000),
        },
        clear: ClearPolicy {
            trigger_tokens: Some(9_000),
            trigger_tool_uses: None,
            min_cleared: None,
            keep: 3,
            clear_at_least: Some(2_000),
            exclude_tools: Vec::new(),
            clear_inputs: true.into(),
        },
        hysteresis: Hysteresis {
            high: 0.9,
            low: 0.6,
        },
        tools: vec![
            serde_json::json!({"type": "function", "function": {"name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}),
        ],
        system: Message::system("You are a research agent. Use the search tool."),
        messages: own(USES),
        memory: CutMemory::default(),
    };
    let all = std::mem::take(&mut call.messages);
    let mut memory = CutMemory::default();
    for calls in 1..USES {
        call.messages = all[..1 + 2 * calls].to_vec();
        call.fit(&mut memory);
    }
    call.messages = all;
    call.memory = memory;
    call
}

/// A limit `slack` percent above `measured` instructions.
fn limit(measured: u64, slack: u64) -> LibraryBenchmarkConfig {
    let mut config = LibraryBenchmarkConfig::default();
    config
        .tool(Callgrind::default().hard_limits([(EventKind::Ir, measured * (100 + slack) / 100)]));
    config
}

#[library_benchmark]
#[bench::call_500_messages(setup = loop_before_last_call, config = limit(1_022_700, 2))]
fn loop_call(call: LoopCall) -> usize {
    let mut memory = call.memory.clone();
    black_box(call.fit(&mut memory))
}

library_benchmark_group!(name = loop_fit, benchmarks = [loop_call]);

main!(library_benchmark_groups = loop_fit);
