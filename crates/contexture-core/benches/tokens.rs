//! Token counting throughput (PRODUCT.md F2, issue point 7): bpe-openai through
//! `Encoding::count` against tiktoken-rs' `encode_ordinary`, in the same run, on a 10 MiB text
//! of mixed prose and source code, for cl100k_base and o200k_base.
//!
//! The text is built deterministically from files shipped in the repository (this crate's
//! sources and test samples, and the prose in `benches/data/`); nothing is downloaded.
//!
//! Run: `cargo bench -p contexture-core --bench tokens`

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use contexture_core::Encoding;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use tiktoken_rs::CoreBPE;

/// The size of the benchmark text in bytes.
const TARGET_BYTES: usize = 10 * 1024 * 1024;

const PROSE: &[&str] = &[
    include_str!("data/prose_engineering.md"),
    include_str!("data/prose_story.md"),
    include_str!("data/prose_release_notes.md"),
];

const CODE: &[(&str, &str)] = &[
    ("rust", include_str!("../src/lib.rs")),
    ("rust", include_str!("../src/message.rs")),
    ("rust", include_str!("../src/tokens.rs")),
    ("rust", include_str!("../src/format.rs")),
    ("rust", include_str!("../src/format/openai.rs")),
    ("rust", include_str!("../src/format/anthropic.rs")),
    ("rust", include_str!("../tests/tokens_oracle.rs")),
    ("rust", include_str!("../tests/format_roundtrip.rs")),
    (
        "json",
        include_str!("../tests/data/formats/anthropic_agent_loop.json"),
    ),
    (
        "json",
        include_str!("../tests/data/formats/openai_multimodal.json"),
    ),
];

/// Prose and code interleaved, the pairing rotated every round so that neighbouring chunks
/// differ, numbered sections in between, cut to [`TARGET_BYTES`] at a character boundary.
fn corpus() -> String {
    let mut text = String::with_capacity(TARGET_BYTES + 256 * 1024);
    let mut round = 0usize;
    while text.len() < TARGET_BYTES {
        for (index, (language, code)) in CODE.iter().enumerate() {
            let prose = PROSE[(index + round) % PROSE.len()];
            let _ = write!(text, "\n\n## Section {round}.{index}\n\n{prose}\n");
            let second = PROSE[(index + 2 * round + 1) % PROSE.len()];
            text.push_str(second);
            let _ = write!(text, "\n```{language}\n{code}\n```\n");
        }
        round += 1;
    }
    let mut end = TARGET_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

fn oracle(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
    }
}

/// Rounds of the paired measurement.
const PAIRED_ROUNDS: usize = 5;

/// Times both counters alternately, [`PAIRED_ROUNDS`] times each, and prints the best
/// throughput of each and their ratio. On a shared machine the load changes between
/// criterion's back-to-back groups; alternating runs and keeping each side's fastest run
/// compares the two under the same conditions.
fn paired_ratio(encoding: Encoding, tiktoken: &CoreBPE, text: &str) {
    let time = |count: &dyn Fn() -> usize| {
        let start = Instant::now();
        black_box(count());
        start.elapsed()
    };
    let mut best = [Duration::MAX; 2];
    for _ in 0..PAIRED_ROUNDS {
        best[0] = best[0].min(time(&|| encoding.count(black_box(text))));
        best[1] = best[1].min(time(&|| tiktoken.encode_ordinary(black_box(text)).len()));
    }
    let mib_per_s =
        |elapsed: Duration| text.len() as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64();
    println!(
        "{encoding} paired (best of {PAIRED_ROUNDS} alternating runs): bpe-openai {:.1} MiB/s, \
         tiktoken-rs {:.1} MiB/s, ratio {:.2}x",
        mib_per_s(best[0]),
        mib_per_s(best[1]),
        best[1].as_secs_f64() / best[0].as_secs_f64()
    );
}

fn counting_throughput(c: &mut Criterion) {
    let text = corpus();
    let mut group = c.benchmark_group("count_10MiB_prose_and_code");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(text.len() as u64));
    for encoding in Encoding::ALL {
        let tiktoken = oracle(encoding);
        // Both sides must count the same tokens, or the comparison means nothing.
        let tokens = encoding.count(&text);
        assert_eq!(tokens, tiktoken.encode_ordinary(&text).len(), "{encoding}");
        println!(
            "{encoding}: {} bytes, {tokens} tokens ({:.2} bytes/token)",
            text.len(),
            text.len() as f64 / tokens as f64
        );
        paired_ratio(encoding, tiktoken, &text);
        group.bench_with_input(
            BenchmarkId::new("bpe-openai", encoding.name()),
            &text,
            |b, text| b.iter(|| encoding.count(black_box(text))),
        );
        group.bench_with_input(
            BenchmarkId::new("tiktoken-rs", encoding.name()),
            &text,
            |b, text| b.iter(|| tiktoken.encode_ordinary(black_box(text)).len()),
        );
    }
    group.finish();
}

criterion_group!(benches, counting_throughput);
criterion_main!(benches);
