//! Fitting one call of a long agent loop: a step whose own messages are its task and 250
//! tool uses (500 messages, results of about 1,500 tokens each, 375,000 in all), on
//! gpt-4o-mini with a 16,000-token window (`context.window`), clearing old results and
//! their inputs (`trigger_tokens` 9,000, `keep` 3, `clear_at_least` 2,000) with hysteresis
//! (`high` 0.9, `low` 0.6). Every
//! message's token count is cached (counted once when it entered the loop), and the loop's
//! cut memory is the one the previous call left, as in a running step.
//!
//! Run: `cargo bench -p contexture-engine --bench loop_fit` (the target: under 50 µs).
//!
//! - `loop_fit/call_500_messages`: `fit_request_in_loop`, the whole fitting of the call:
//!   earlier cuts applied again, the marks checked, the own messages kept, trimming,
//!   validation for the model's rules, the budget breakdown.
//! - `loop_fit/copy_501_messages`: copying and dropping the 501 messages the call sends, the
//!   floor of any fit that returns its request as owned messages.

use std::hint::black_box;

use contexture_core::Message;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// The allocator the `contexture` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/loop_step.rs"]
mod loop_step;
use loop_step::LoopStep;

fn loop_fit(c: &mut Criterion) {
    let step = LoopStep::new();
    let memory = step.memory_before_last_call();
    let mut group = c.benchmark_group("loop_fit");
    group.bench_function("call_500_messages", |b| {
        b.iter_batched(
            || memory.clone(),
            // The request is dropped inside the timing, as the copy below is. The memory is
            // handed back and dropped outside it: a loop keeps its one memory from call to
            // call. One call per batch: a batch of many keeps every request and memory until
            // it ends, and the fresh pages they take would be timed as the fit's.
            |mut memory| {
                let fitted = step.fit(step.messages.len(), &mut memory);
                black_box(&fitted);
                drop(fitted);
                memory
            },
            BatchSize::PerIteration,
        )
    });
    // The floor of a fit that returns the request as owned messages: copying (and dropping)
    // the 501 messages it sends, nothing else.
    let sent: Vec<Message> = std::iter::once(step.system.clone())
        .chain(step.messages.iter().cloned())
        .collect();
    group.bench_function("copy_501_messages", |b| b.iter(|| black_box(sent.clone())));
    group.finish();
}

criterion_group!(benches, loop_fit);
criterion_main!(benches);
