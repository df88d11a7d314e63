//! What a chat turn costs to record when every request sends the whole conversation.
//!
//! Run: `cargo bench -p contexture-store --bench request_records -- --measurement-time 5 --warm-up-time 1 --sample-size 20`
//!
//! A conversation of 1,000 messages (500 turns, messages of 40 to 1,000 bytes: `testing::prose`,
//! the same texts as `benches/storage/langgraph_chat.py` writes with LangGraph's SQLite checkpointer) is
//! appended to a SQLite store as the chat endpoint appends it: the question with the request
//! record (every message so far), then the request's end with the answer. Printed first: the
//! database's bytes on disk per byte of message text. Then, timed:
//!
//! - `request_records/sqlite/chat_turn_at_1000_messages`: the 501st turn (two durable appends;
//!   the record stored by reference to the thread's messages, found byte for byte), on a fork
//!   of the conversation made before the clock starts;
//! - `request_records/sqlite/read_records_at_1000_messages`: read the thread back with every
//!   record resolved (500 records of up to 1,000 messages each);
//! - `request_records/sqlite/prune_200_records`: a retention policy that keeps none prunes
//!   the 200 records of an agent's thread (each holding a rendered prompt of 6 KB of its
//!   own, 1.3 MB in all), in batches of 128 per transaction, the free pages given back;
//!   meanwhile another task appends a message every millisecond, and the longest any of
//!   those appends waited is printed after the group (what pruning costs writers).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use contexture_core::Message;
use contexture_core::thread::{EventKind, RequestEnd, RequestOutcome, RequestRecord, Usage};
use contexture_store::testing::{self, message_length, prose};
use contexture_store::{NewEvent, RequestRetention, SqliteStore, Store};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

const TURNS: usize = 500;

/// Appends turn `turn` to `thread`, whose messages so far are `history`.
async fn turn(store: &SqliteStore, thread: &str, history: &mut Vec<Message>, turn: usize) {
    let question = Message::user(prose(turn, message_length(turn)));
    history.push(question.clone());
    let id = format!("chat-{turn}");
    let record = RequestRecord {
        request_id: id.clone(),
        model: Some("gpt-4o-mini".into()),
        messages: history.clone(),
        purpose: Some("chat".into()),
        ..RequestRecord::default()
    };
    store
        .append(
            thread,
            vec![
                NewEvent::new(EventKind::MessageAppended { message: question }),
                NewEvent::new(EventKind::RequestStarted(record)),
            ],
        )
        .await
        .expect("append the question");
    let answer = Message::assistant(prose(turn + TURNS, message_length(turn + TURNS)));
    store
        .append(
            thread,
            vec![
                NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                    id,
                    RequestOutcome::Completed,
                    Usage::new(10, 10),
                ))),
                NewEvent::new(EventKind::MessageAppended {
                    message: answer.clone(),
                }),
            ],
        )
        .await
        .expect("append the answer");
    history.push(answer);
}

fn records(c: &mut Criterion) {
    let runtime = Runtime::new().expect("a runtime");
    let dir = testing::TempDir::new("contexture-bench-records");
    let path = dir.join("chat.db");
    let store = runtime
        .block_on(SqliteStore::open(&path))
        .expect("open the store");
    let mut history = Vec::new();
    runtime.block_on(async {
        for n in 0..TURNS {
            turn(&store, "chat", &mut history, n).await;
        }
    });
    let info = runtime
        .block_on(store.thread_info("chat"))
        .expect("read the thread")
        .expect("the thread");
    let disk = testing::sqlite_disk_bytes(&path);
    println!(
        "1,000 messages: {} bytes of message text, {} bytes of events, {disk} bytes on disk \
         ({:.2}x the text)",
        info.message_bytes,
        info.bytes,
        disk as f64 / info.message_bytes as f64
    );
    let mut group = c.benchmark_group("request_records/sqlite");
    // Each timed turn goes to a fork of the conversation at its 1,000th message (made before
    // the clock starts), so that every one is the 501st turn.
    let mut forks = 0usize;
    group.bench_function("chat_turn_at_1000_messages", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                forks += 1;
                let fork = format!("fork-{forks}");
                runtime
                    .block_on(store.fork("chat", info.last_seq, &fork))
                    .expect("fork");
                let mut sent = history.clone();
                let start = Instant::now();
                runtime.block_on(turn(&store, &fork, &mut sent, TURNS));
                spent += start.elapsed();
            }
            spent
        })
    });
    group.bench_function("read_records_at_1000_messages", |b| {
        b.iter(|| black_box(runtime.block_on(store.events("chat")).expect("read")))
    });
    group.sample_size(10);
    let mut agents = 0usize;
    let mut worst_wait = Duration::ZERO;
    let mut probes = 0usize;
    group.bench_function("prune_200_records", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                agents += 1;
                let thread = format!("agent-{agents}");
                runtime.block_on(agent(&store, &thread, 200));
                let stop = Arc::new(AtomicBool::new(false));
                let probe = runtime.spawn(probe_appends(store.clone(), stop.clone()));
                let start = Instant::now();
                let pruned = runtime
                    .block_on(store.prune_thread_requests(
                        &thread,
                        &RequestRetention::new(None, Some(0)).expect("a policy"),
                        SystemTime::now(),
                    ))
                    .expect("prune");
                spent += start.elapsed();
                assert_eq!(pruned.records, 200);
                stop.store(true, Ordering::Relaxed);
                let (waits, worst) = runtime.block_on(probe).expect("the probe");
                probes += waits;
                worst_wait = worst_wait.max(worst);
            }
            spent
        })
    });
    group.finish();
    println!(
        "while pruning: the longest of {probes} appends waited {:.2} ms",
        worst_wait.as_secs_f64() * 1e3
    );
}

/// An agent's thread of `calls` calls, each request sending a rendered prompt of its own
/// (6 KB, stored inline) and the task.
async fn agent(store: &SqliteStore, thread: &str, calls: usize) {
    for call in 0..calls {
        let task = Message::user(format!("task {call}"));
        let record = RequestRecord {
            request_id: format!("{thread}-{call}"),
            model: Some("gpt-4o-mini".into()),
            messages: vec![Message::system(prose(call, 6_000)), task.clone()],
            ..RequestRecord::default()
        };
        store
            .append(
                thread,
                vec![
                    NewEvent::new(EventKind::MessageAppended { message: task }),
                    NewEvent::new(EventKind::RequestStarted(record)),
                    NewEvent::new(EventKind::RequestEnded(RequestEnd::new(
                        format!("{thread}-{call}"),
                        RequestOutcome::Completed,
                        Usage::new(10, 10),
                    ))),
                ],
            )
            .await
            .expect("append a call");
    }
}

/// Appends a message every millisecond until `stop`: how many, and the longest wait.
async fn probe_appends(store: SqliteStore, stop: Arc<AtomicBool>) -> (usize, Duration) {
    let (mut count, mut worst) = (0, Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        store
            .append_one(
                "probe",
                NewEvent::new(EventKind::MessageAppended {
                    message: Message::user("probe"),
                }),
            )
            .await
            .expect("a probe append");
        worst = worst.max(start.elapsed());
        count += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (count, worst)
}

criterion_group!(benches, records);
criterion_main!(benches);
