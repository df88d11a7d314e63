//! Token counting throughput: `Encoding::count` (ASCII pieces cut without the regex, counts
//! of short pieces remembered, bpe-openai's byte-pair encoding) against bpe-openai's own
//! `Tokenizer::count` and tiktoken-rs' `encode_ordinary`, in the same run, on a 10 MiB text
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

/// CPU time this thread has used, from `/proc/thread-self/stat` (Linux; `None` elsewhere).
/// Unlike wall time it does not count the time the thread waited for a core, so it stays
/// meaningful on a machine shared with other work. The kernel reports it in ticks of 1/100 s
/// (USER_HZ), which is fine for runs of a second or so.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    // After the command name: state is field 3, utime field 14 and stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Times the counters alternately, [`PAIRED_ROUNDS`] times each, and prints the best wall
/// and CPU throughput of each and how many times faster the first is than each other. On a
/// shared machine the load changes between criterion's back-to-back groups; alternating runs
/// and keeping each side's fastest run compares them under the same conditions.
fn paired_ratio(encoding: Encoding, counters: &[(&str, &dyn Fn() -> usize)], text: &str) {
    let time = |count: &dyn Fn() -> usize| {
        let cpu = thread_cpu_time();
        let start = Instant::now();
        black_box(count());
        let wall = start.elapsed();
        let cpu = cpu
            .zip(thread_cpu_time())
            .map_or(wall, |(before, after)| after.saturating_sub(before));
        (wall, cpu.max(Duration::from_millis(1)))
    };
    let mut best = vec![(Duration::MAX, Duration::MAX); counters.len()];
    for _ in 0..PAIRED_ROUNDS {
        for (side, (_, count)) in counters.iter().enumerate() {
            let (wall, cpu) = time(*count);
            best[side] = (best[side].0.min(wall), best[side].1.min(cpu));
        }
    }
    let mib_per_s =
        |elapsed: Duration| text.len() as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64();
    let (first_wall, first_cpu) = best[0];
    let sides: Vec<String> = counters
        .iter()
        .zip(&best)
        .map(|((name, _), (wall, cpu))| {
            format!(
                "{name} wall {:.1} MiB/s cpu {:.1} MiB/s ({:.2}x / {:.2}x)",
                mib_per_s(*wall),
                mib_per_s(*cpu),
                wall.as_secs_f64() / first_wall.as_secs_f64(),
                cpu.as_secs_f64() / first_cpu.as_secs_f64(),
            )
        })
        .collect();
    println!(
        "{encoding} paired, best of {PAIRED_ROUNDS} alternating runs (time against {}): {}",
        counters[0].0,
        sides.join("; ")
    );
}

fn plain_bpe_openai(encoding: Encoding) -> &'static bpe_openai::Tokenizer {
    match encoding {
        Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        Encoding::O200kBase => bpe_openai::o200k_base(),
    }
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
        let plain = plain_bpe_openai(encoding);
        assert_eq!(tokens, plain.count(text.as_str()), "{encoding}");
        paired_ratio(
            encoding,
            &[
                ("contexture", &|| encoding.count(black_box(&text))),
                ("bpe-openai", &|| plain.count(black_box(text.as_str()))),
                ("tiktoken-rs", &|| {
                    tiktoken.encode_ordinary(black_box(&text)).len()
                }),
            ],
            &text,
        );
        group.bench_with_input(
            BenchmarkId::new("contexture", encoding.name()),
            &text,
            |b, text| b.iter(|| encoding.count(black_box(text))),
        );
        group.bench_with_input(
            BenchmarkId::new("bpe-openai", encoding.name()),
            &text,
            |b, text| b.iter(|| plain.count(black_box(text.as_str()))),
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
