//! Instruction counts of the engine's hot paths under valgrind's callgrind (through gungraun):
//! fitting one call of a long agent loop, the call of the `loop_fit` criterion benchmark (a
//! step of 250 tool uses, 500 messages, on gpt-4o-mini with a 16,000-token window, clearing
//! with hysteresis, every count cached and the cut memory the previous call left); and the
//! engine's part of a chat turn on a 200-turn thread (see `common/chat_thread.rs`), its
//! request holding the whole conversation or only the new question. A count is deterministic for
//! a given build, so CI fails on a regression past the hard limit (a little above the count
//! it was measured at; see "Instruction counts in CI" in docs/benchmarks.md) without the
//! noise of timing.
//!
//! Run: `cargo bench -p contexture-engine --bench instructions` (needs valgrind and
//! `gungraun-runner` 0.20.0 on the PATH).

use std::hint::black_box;

use contexture_core::fit::CutMemory;
use gungraun::{
    Callgrind, EventKind, LibraryBenchmarkConfig, library_benchmark, library_benchmark_group, main,
};

/// The allocator the `contexture` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/loop_step.rs"]
mod loop_step;
use loop_step::LoopStep;

#[path = "common/chat_thread.rs"]
mod chat_thread;
use chat_thread::ChatTurnInput;

/// The step, and the cut memory its calls before the last left.
fn loop_before_last_call() -> (LoopStep, CutMemory) {
    let step = LoopStep::new();
    let memory = step.memory_before_last_call();
    (step, memory)
}

/// A limit `slack` percent above `measured` instructions.
fn limit(measured: u64, slack: u64) -> LibraryBenchmarkConfig {
    let mut config = LibraryBenchmarkConfig::default();
    config
        .tool(Callgrind::default().hard_limits([(EventKind::Ir, measured * (100 + slack) / 100)]));
    config
}

#[library_benchmark]
#[bench::call_500_messages(setup = loop_before_last_call, config = limit(952_500, 2))]
fn loop_call((step, mut memory): (LoopStep, CutMemory)) -> usize {
    black_box(step.fit(step.messages.len(), &mut memory).messages.len())
}

#[library_benchmark]
#[bench::whole_conversation(setup = ChatTurnInput::new, args = (true), config = limit(238_200, 2))]
#[bench::new_question(setup = ChatTurnInput::new, args = (false), config = limit(139_300, 2))]
fn chat_turn(turn: ChatTurnInput) -> usize {
    black_box(turn.run())
}

library_benchmark_group!(name = loop_fit, benchmarks = [loop_call]);
library_benchmark_group!(name = chat_turns, benchmarks = [chat_turn]);

main!(library_benchmark_groups = loop_fit, chat_turns);
