//! Crash safety: a child process appends in a loop and prints each acknowledged seq; it is
//! killed with SIGKILL at random moments; after each kill the store is reopened (no repair
//! step) and every acknowledged event must be present and intact, with no gap in the seqs.
//!
//! Then several processes append to one thread at once and must get gap-free, unique seqs.
//!
//! Runs without the test harness: the same executable is the parent (no argument) and, with
//! `CONTEXTURE_CRASH_CHILD` set to a database path, the child.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use contexture_core::Message;
use contexture_core::thread::EventKind;
use contexture_store::{NewEvent, SqliteStore, Store};

const CHILD_DB: &str = "CONTEXTURE_CRASH_CHILD";
const CHILD_RUN: &str = "CONTEXTURE_CRASH_RUN";
const CHILD_LIMIT: &str = "CONTEXTURE_CRASH_LIMIT";
const CHILD_THREAD: &str = "CONTEXTURE_CRASH_THREAD";
const PROCESSES: u32 = 4;
const PER_PROCESS: u64 = 150;
const KILL_POINTS: u32 = 24;
const THREAD: &str = "crash";

fn main() {
    match std::env::var(CHILD_DB) {
        Ok(path) => child(&path),
        Err(_) => parent(),
    }
}

fn text(run: u32, i: u64) -> String {
    format!("run{run}-msg{i}-{}", "x".repeat((i % 7) as usize * 10))
}

/// Appends forever (or until `CONTEXTURE_CRASH_LIMIT` events), alternating single events and
/// batches of three, printing `ACK seq text` for each event once its transaction committed.
fn child(path: &str) {
    let run: u32 = std::env::var(CHILD_RUN)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = SqliteStore::open(path)
            .await
            .expect("child opens the store");
        let mut out = std::io::stdout().lock();
        let limit: u64 = std::env::var(CHILD_LIMIT)
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or(u64::MAX);
        let thread = std::env::var(CHILD_THREAD).unwrap_or_else(|_| THREAD.to_string());
        let mut i = 0u64;
        while i < limit {
            let size = if i.is_multiple_of(2) { 1 } else { 3 };
            let texts: Vec<String> = (i..i + size).map(|k| text(run, k)).collect();
            let events = texts
                .iter()
                .map(|t| {
                    NewEvent::new(EventKind::MessageAppended {
                        message: Message::user(t.clone()),
                    })
                })
                .collect();
            let seqs = store.append(&thread, events).await.expect("child append");
            for (seq, text) in seqs.iter().zip(&texts) {
                writeln!(out, "ACK {seq} {text}").expect("write ack");
            }
            out.flush().expect("flush acks");
            i += size;
        }
    });
}

/// A small xorshift generator: the test needs varied kill delays, not quality randomness.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn parent() {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("contexture-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db = dir.join("crash.db");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    println!(
        "crash test: seed {seed}, {KILL_POINTS} kill points, database {}",
        db.display()
    );
    let mut rng = Rng(seed);
    let exe = std::env::current_exe().expect("own executable");
    let mut acked: Vec<(u64, String)> = Vec::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    for run in 0..KILL_POINTS {
        let mut child = Command::new(&exe)
            .env(CHILD_DB, &db)
            .env(CHILD_RUN, run.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("child stdout");
        let (lines_tx, lines_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Kill at a random moment: every sixth run during start-up (opening, migrating),
        // the others at a random point after the first acknowledged append.
        let mut lines = Vec::new();
        let delay = if run % 6 == 5 {
            Duration::from_millis(rng.below(40))
        } else {
            let first = lines_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the child acknowledges an append");
            lines.push(first);
            Duration::from_millis(rng.below(120))
        };
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        assert!(!status.success(), "the child was killed");
        reader.join().expect("reader thread");
        lines.extend(lines_rx.try_iter());
        let before = acked.len();
        for line in lines {
            let mut parts = line.splitn(3, ' ');
            let (Some("ACK"), Some(seq), Some(text)) = (parts.next(), parts.next(), parts.next())
            else {
                panic!("unexpected child output {line:?}");
            };
            acked.push((seq.parse().expect("seq"), text.to_string()));
        }

        // Reopen as a new process would, with no repair step, and check every ack.
        let events = runtime.block_on(async {
            let store = SqliteStore::open(&db)
                .await
                .expect("the store opens after a crash");
            match store.events(THREAD).await {
                Ok(events) => events,
                Err(contexture_store::StoreError::NotFound { .. }) => Vec::new(),
                Err(error) => panic!("reading after a crash failed: {error}"),
            }
        });
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event.seq, i as u64 + 1, "seqs are gap-free after run {run}");
        }
        for (seq, text) in &acked {
            let event = events
                .get(*seq as usize - 1)
                .unwrap_or_else(|| panic!("acknowledged seq {seq} lost after run {run}"));
            let EventKind::MessageAppended { message } = &event.kind else {
                panic!("seq {seq} is not a message")
            };
            assert_eq!(&message.text(), text, "seq {seq} intact after run {run}");
        }
        println!(
            "kill point {run:>2}: {:>3} ms after {}, {:>4} new acks, {:>5} events stored",
            delay.as_millis(),
            if run % 6 == 5 { "spawn" } else { "first ack" },
            acked.len() - before,
            events.len()
        );
    }
    assert!(
        acked.len() > KILL_POINTS as usize,
        "the children acknowledged appends"
    );
    several_processes(&exe, &db, &runtime);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "crash test passed: {} acks checked in {:?}",
        acked.len(),
        started.elapsed()
    );
}

/// `PROCESSES` children append `PER_PROCESS` events each to one thread at the same time.
fn several_processes(
    exe: &std::path::Path,
    db: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
) {
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            Command::new(exe)
                .env(CHILD_DB, db)
                .env(CHILD_RUN, (1_000 + p).to_string())
                .env(CHILD_LIMIT, PER_PROCESS.to_string())
                .env(CHILD_THREAD, "multi")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a writer process")
        })
        .collect();
    let mut acked = Vec::new();
    for child in children {
        let output = child.wait_with_output().expect("wait for a writer");
        assert!(output.status.success(), "a writer process failed");
        for line in String::from_utf8(output.stdout).expect("UTF-8").lines() {
            let mut parts = line.splitn(3, ' ');
            let (Some("ACK"), Some(seq), Some(text)) = (parts.next(), parts.next(), parts.next())
            else {
                panic!("unexpected writer output {line:?}");
            };
            acked.push((seq.parse::<u64>().expect("seq"), text.to_string()));
        }
    }
    acked.sort();
    let seqs: Vec<u64> = acked.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        seqs,
        (1..=acked.len() as u64).collect::<Vec<_>>(),
        "unique, gap-free seqs across processes"
    );
    let events = runtime.block_on(async {
        let store = SqliteStore::open(db).await.expect("open");
        store.events("multi").await.expect("events")
    });
    assert_eq!(events.len(), acked.len());
    for (event, (_, text)) in events.iter().zip(&acked) {
        let EventKind::MessageAppended { message } = &event.kind else {
            panic!("not a message")
        };
        assert_eq!(&message.text(), text);
    }
    println!(
        "{PROCESSES} processes appended {} events with gap-free seqs",
        acked.len()
    );
}
