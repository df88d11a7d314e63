//! Fitting a 100,000-message tool-calling history (about 30M tokens) to an 8,000-token
//! budget, with every message's count already cached.
//!
//! Run: `cargo bench -p contexture-core --bench fit`.
//!
//! - `fit/indexed_*`: [`IndexedHistory::fit`] on a prepared index (the target: < 100 µs);
//!   the kept messages are cloned into the result, so this is the whole call.
//! - `fit/slice_last`: [`trim`] on a plain slice with counts cached (segments the history
//!   on every call, so it is O(n) without tokenizing).
//! - `fit/index_build`: building the index from messages whose counts are cached.

use std::hint::black_box;
use std::time::Duration;

use contexture_core::fit::{IndexedHistory, Rules, Strategy, TrimOptions, trim};
use contexture_core::{Encoding, Message, TokenCounter, ToolCall};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

const MESSAGES: usize = 100_000;
const BUDGET: u32 = 8_000;
const COUNTER: TokenCounter = TokenCounter::exact(Encoding::O200kBase);

fn words(n: usize, seed: usize) -> String {
    const VOCABULARY: [&str; 12] = [
        "context", "window", "tool", "result", "search", "the", "model", "reply", "budget",
        "token", "history", "engine",
    ];
    let mut text = String::new();
    for i in 0..n {
        text.push_str(VOCABULARY[(i * 7 + seed) % VOCABULARY.len()]);
        text.push(if i % 16 == 15 { '\n' } else { ' ' });
    }
    text
}

/// User question, assistant call, tool result, assistant answer: about 300 tokens a message
/// on average. Templates are counted once; clones carry the cached count.
fn history() -> Vec<Message> {
    let user = Message::user(words(150, 1));
    let answer = Message::assistant(words(110, 3));
    let result_text = words(900, 2);
    let mut messages = vec![Message::system("You are a research agent. Use the tools.")];
    for template in [&user, &answer] {
        COUNTER.count_message(template);
    }
    let mut turn = 0;
    while messages.len() < MESSAGES {
        let id = format!("call_{turn}");
        let call = Message::assistant_tool_calls(vec![ToolCall::new(
            id.clone(),
            "search",
            r#"{"query":"context window budget"}"#,
        )]);
        let result = Message::tool_result(id, result_text.clone());
        messages.extend([user.clone(), call, result, answer.clone()]);
        turn += 1;
    }
    messages.truncate(MESSAGES);
    // A tool unit cut by the truncation would leave a call without its result.
    while messages.last().is_some_and(|m| !m.tool_calls.is_empty()) {
        messages.pop();
    }
    for message in &messages {
        COUNTER.count_message(message);
    }
    messages
}

fn bench(c: &mut Criterion) {
    let messages = history();
    let history = IndexedHistory::from_messages(messages.clone(), COUNTER);
    eprintln!(
        "history: {} messages, {} tokens",
        history.messages().len(),
        history.message_tokens()
    );
    let last = TrimOptions::new(BUDGET);
    let fitted = history.fit(&last).expect("fits");
    eprintln!(
        "fit last: kept {} messages, {} tokens after",
        fitted.messages.len(),
        fitted.tokens_after
    );

    let mut group = c.benchmark_group("fit");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("indexed_last_100k_to_8000", |b| {
        b.iter(|| history.fit(black_box(&last)).unwrap())
    });
    let anthropic = TrimOptions {
        rules: Rules::Anthropic,
        ..TrimOptions::new(BUDGET)
    };
    group.bench_function("indexed_last_anthropic_100k_to_8000", |b| {
        b.iter(|| history.fit(black_box(&anthropic)).unwrap())
    });
    let hysteresis = TrimOptions {
        low_water: Some(BUDGET / 2),
        ..TrimOptions::new(BUDGET)
    };
    group.bench_function("indexed_last_hysteresis_100k_to_8000_4000", |b| {
        b.iter(|| history.fit(black_box(&hysteresis)).unwrap())
    });
    let first = TrimOptions {
        strategy: Strategy::First,
        ..TrimOptions::new(BUDGET)
    };
    group.bench_function("indexed_first_100k_to_8000", |b| {
        b.iter(|| history.fit(black_box(&first)).unwrap())
    });
    let head_tail = TrimOptions {
        strategy: Strategy::HeadTail { head: 2 },
        ..TrimOptions::new(BUDGET)
    };
    group.bench_function("indexed_head_tail_100k_to_8000", |b| {
        b.iter(|| history.fit(black_box(&head_tail)).unwrap())
    });
    group.bench_function("slice_last_100k_to_8000", |b| {
        b.iter(|| trim(black_box(&messages), &last, &COUNTER).unwrap())
    });
    group.bench_function("index_build_100k", |b| {
        b.iter_batched(
            || messages.clone(),
            |messages| IndexedHistory::from_messages(messages, COUNTER),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
