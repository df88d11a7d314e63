//! Store benchmarks.
//!
//! Run: `cargo bench -p contexture-store --bench store -- --measurement-time 5 --warm-up-time 1 --sample-size 10`
//!
//! - `append/{sqlite,postgres}/1_writer`: one durable append (one message, its own
//!   transaction, acknowledged after commit) at a time; throughput in appends/s.
//! - `append/{sqlite,postgres}/8_writers`: 8 tasks appending to the same thread at once; an
//!   iteration is one append by each writer (8 appends).
//! - `append/{sqlite,postgres}/8_writers_8_threads`: the same, each writer on a thread of its
//!   own.
//! - `append/sqlite/raw_1_writer`: the floor under `1_writer`, plain rusqlite on a file of its
//!   own with the store's settings (WAL, `synchronous = FULL`): one insert of a row like an
//!   appended message's (thread, seq, kind, JSON body) per transaction, the statement cached.
//! - `load_fit/sqlite/100k`: load a 100,000-event thread from SQLite (events read and
//!   decoded, token counts restored from the store, replayed into a thread), project it and
//!   fit the projection to an 8,000-token budget. Nothing is tokenized.
//!
//! PostgreSQL is reached at `CONTEXTURE_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a temporary schema; its benchmarks are
//! skipped with a message when it is unreachable.

use std::hint::black_box;
use std::time::{Duration, Instant};

use contexture_core::Message;
use contexture_core::fit::{TrimOptions, trim};
use contexture_core::registry::Registry;
use contexture_core::thread::{ContextReplace, EventKind, ReplaceReason};
use contexture_store::{NewEvent, PgStore, SqliteStore, Store};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;

const WRITERS: u64 = 8;
const EVENTS: u64 = 100_000;
const BUDGET: u32 = 8_000;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("contexture-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn message(i: u64) -> NewEvent {
    let text = format!(
        "Message {i}: the assistant looked up the context window of the model and found the \
         budget sufficient for {} more turns.",
        i % 97
    );
    let message = if i.is_multiple_of(2) {
        Message::user(text)
    } else {
        Message::assistant(text)
    };
    NewEvent::new(EventKind::MessageAppended { message })
}

/// One writer: `iters` appends in sequence.
async fn one_writer(store: &impl Store, thread: &str, iters: u64) -> Duration {
    let start = Instant::now();
    for i in 0..iters {
        store.append_one(thread, message(i)).await.expect("append");
    }
    start.elapsed()
}

/// Eight writers at once: `iters` appends each, to `thread`, or each to a thread of its own
/// (`thread` and its number) when `own_threads`.
async fn eight_writers<S: Store + Clone + 'static>(
    store: &S,
    thread: &str,
    iters: u64,
    own_threads: bool,
) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            let thread = match own_threads {
                true => format!("{thread}-{writer}"),
                false => thread.to_string(),
            };
            tokio::spawn(async move {
                for i in 0..iters {
                    store.append_one(&thread, message(i)).await.expect("append");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer");
    }
    start.elapsed()
}

fn bench_appends<S: Store + Clone + 'static>(
    c: &mut Criterion,
    runtime: &Runtime,
    backend: &str,
    store: &S,
) {
    let mut group = c.benchmark_group(format!("append/{backend}"));
    group.throughput(Throughput::Elements(1));
    group.bench_function("1_writer", |b| {
        b.iter_custom(|iters| runtime.block_on(one_writer(store, "bench-one", iters)))
    });
    group.throughput(Throughput::Elements(WRITERS));
    group.bench_function("8_writers", |b| {
        b.iter_custom(|iters| runtime.block_on(eight_writers(store, "bench-eight", iters, false)))
    });
    group.bench_function("8_writers_8_threads", |b| {
        b.iter_custom(|iters| runtime.block_on(eight_writers(store, "bench-own", iters, true)))
    });
    group.finish();
}

/// Plain rusqlite with the store's durability settings: one row like an appended message's
/// per transaction.
fn raw_sqlite_appends(c: &mut Criterion, dir: &std::path::Path) {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).expect("open raw sqlite");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         CREATE TABLE events (thread_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, \
         body TEXT NOT NULL, PRIMARY KEY (thread_id, seq));",
    )
    .expect("raw schema");
    let mut seq = 0u64;
    let mut group = c.benchmark_group("append/sqlite");
    group.throughput(Throughput::Elements(1));
    group.bench_function("raw_1_writer", |b| {
        b.iter(|| {
            seq += 1;
            let NewEvent { kind, .. } = message(seq);
            let body = serde_json::to_string(&kind).expect("body");
            let tx = conn.unchecked_transaction().expect("begin");
            tx.prepare_cached(
                "INSERT INTO events (thread_id, seq, kind, body) VALUES ('raw', ?1, 'message', ?2)",
            )
            .expect("prepare")
            .execute(rusqlite::params![seq as i64, body])
            .expect("insert");
            tx.commit().expect("commit");
        })
    });
    group.finish();
}

fn appends(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let dir = temp_dir("append");
    let sqlite = runtime
        .block_on(SqliteStore::open(dir.join("bench.db")))
        .expect("open sqlite");
    bench_appends(c, &runtime, "sqlite", &sqlite);
    raw_sqlite_appends(c, &dir);
    let _ = std::fs::remove_dir_all(&dir);

    let url = std::env::var("CONTEXTURE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let schema = format!("ctx_bench_{}", std::process::id());
    match runtime.block_on(PgStore::open_in_schema(&url, &schema)) {
        Ok(pg) => {
            bench_appends(c, &runtime, "postgres", &pg);
            runtime
                .block_on(pg.drop_schema())
                .expect("drop the bench schema");
        }
        Err(error) => eprintln!("!!! SKIPPING PostgreSQL benchmarks: {url} unreachable: {error}"),
    }
}

fn load_fit(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let dir = temp_dir("load");
    let store = runtime
        .block_on(SqliteStore::open(dir.join("bench.db")))
        .expect("open sqlite");
    runtime.block_on(async {
        let mut next = 1;
        while next <= EVENTS {
            let batch: Vec<NewEvent> = (next..(next + 1_000).min(EVENTS + 1))
                .map(|seq| {
                    // A compaction every 10,000 events, covering all but the last 1,000.
                    if seq.is_multiple_of(10_000) && seq < EVENTS {
                        NewEvent::new(EventKind::ContextReplaced(ContextReplace::new(
                            format!("compact-{seq}"),
                            ReplaceReason::Compaction,
                            seq - 1_000,
                            vec![Message::assistant(format!(
                                "Summary of events 1..{}",
                                seq - 1_000
                            ))],
                        )))
                    } else {
                        message(seq)
                    }
                })
                .collect();
            next += batch.len() as u64;
            store.append("big", batch).await.expect("append a batch");
        }
    });
    let model = Registry::builtin().resolve("gpt-4o");
    let mut group = c.benchmark_group("load_fit/sqlite");
    // What a model call does: load the projection (only messages after the last compaction
    // are decoded) and fit it with the stored counts.
    group.bench_function("100k", |b| {
        b.iter(|| {
            let projection = runtime
                .block_on(store.load_projection("big"))
                .expect("load");
            let messages = projection.into_messages();
            let fitted = trim(&messages, &TrimOptions::new(BUDGET), &model.counter).expect("fit");
            black_box(fitted.messages.len())
        })
    });
    // The same through a full replay of every event, for comparison.
    group.bench_function("100k_full_replay", |b| {
        b.iter(|| {
            let thread = runtime.block_on(store.load("big")).expect("load");
            let messages = thread.projection().into_messages();
            let fitted = trim(&messages, &TrimOptions::new(BUDGET), &model.counter).expect("fit");
            black_box(fitted.messages.len())
        })
    });
    group.bench_function("100k_events_only", |b| {
        b.iter(|| black_box(runtime.block_on(store.events("big")).expect("events").len()))
    });
    // Where the time goes: raw row reads, and row reads plus JSON decoding of the bodies.
    let path = dir.join("bench.db");
    let raw = |decode: bool| {
        let conn = rusqlite::Connection::open(&path).expect("open");
        let mut select = conn
            .prepare(
                "SELECT seq, kind, body, tokens FROM events WHERE thread_id = 'big' ORDER BY seq",
            )
            .expect("prepare");
        let mut rows = select.query([]).expect("query");
        let mut total = 0usize;
        while let Some(row) = rows.next().expect("row") {
            let body = row.get_ref(2).expect("body").as_str().expect("text");
            total += if decode {
                serde_json::from_str::<serde_json::Value>(body)
                    .map_or(0, |v| v.as_object().map_or(0, |o| o.len()))
            } else {
                body.len()
            };
        }
        total
    };
    group.bench_function("100k_rows_raw", |b| b.iter(|| black_box(raw(false))));
    group.bench_function("100k_rows_json_values", |b| b.iter(|| black_box(raw(true))));
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, appends, load_fit);
criterion_main!(benches);
