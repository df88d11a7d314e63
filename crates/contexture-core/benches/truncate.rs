//! Truncating the oversized tool results of a request whose results are huge: 20 results of
//! about 2.9 MB each (58 MB in all), cut to 48 tokens each, their counts already cached
//! (as a store's messages carry them).
//!
//! Run: `cargo bench -p contexture-core --bench truncate`.
//!
//! - `truncate/cached_counts`: [`truncate_tool_results`] as every request runs it: the
//!   results' counts come from their cache and only their starts and ends are tokenized.
//! - `truncate/count_whole_texts`: the same cut, each result's text counted whole first
//!   (what one read of the 58 MB costs the tokenizer): the reference the ratio is taken
//!   against.

use std::hint::black_box;
use std::time::Duration;

use contexture_core::fit::truncate::{TruncatePolicy, truncate_tool_results};
use contexture_core::{Encoding, Message, TokenCounter, ToolCall};
use criterion::{Criterion, criterion_group, criterion_main};

const RESULTS: usize = 20;
const RESULT_BYTES: usize = 2_900_000;
const COUNTER: TokenCounter = TokenCounter::exact(Encoding::Cl100kBase);

/// A log-like text of about `bytes` bytes.
fn result_text(bytes: usize, seed: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut line = 0usize;
    while text.len() < bytes {
        text.push_str(&format!(
            "{:08} INFO request {} served in {} ms from cache shard {}\n",
            line,
            (line * 31 + seed) % 100_000,
            (line * 7) % 900,
            line % 16
        ));
        line += 1;
    }
    text
}

/// The loop: each call, then its huge result; every count cached, as loaded from a store.
fn messages() -> Vec<Message> {
    let mut messages = vec![Message::user("Find the slow requests.")];
    for i in 0..RESULTS {
        let id = format!("call-{i}");
        messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
            id.clone(),
            "logs",
            "{}",
        )]));
        messages.push(Message::tool_result(id, result_text(RESULT_BYTES, i)));
    }
    for message in &messages {
        COUNTER.count_message(message);
    }
    messages
}

fn bench(c: &mut Criterion) {
    let messages = messages();
    let policy = TruncatePolicy { max_tokens: 48 };
    let mut group = c.benchmark_group("truncate");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("cached_counts", |b| {
        b.iter(|| {
            black_box(truncate_tool_results(
                black_box(&messages),
                &policy,
                &COUNTER,
            ))
        })
    });
    group.bench_function("count_whole_texts", |b| {
        b.iter(|| {
            let counted: u32 = messages
                .iter()
                .map(|message| COUNTER.count_text(&message.text()))
                .sum();
            black_box(counted)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
