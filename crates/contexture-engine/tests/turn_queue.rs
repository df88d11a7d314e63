//! The queue of turns on a thread, over a real SQLite store: turns hold their thread one at
//! a time in the order they joined, the next is woken as soon as one leaves, a wait is
//! bounded, and a ticket its server stopped renewing lapses after the lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use contexture_engine::turns::{TurnQueue, TurnWaitError};
use contexture_store::testing::TempDir;
use contexture_store::{SqliteStore, TurnQueueStore};

async fn store(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(dir.join("turns.db")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_hold_the_thread_one_at_a_time_in_arrival_order() {
    let dir = TempDir::new("contexture-turn-queue");
    let store = store(&dir).await;
    let queue = Arc::new(TurnQueue::default());
    let holding = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (store, queue, holding, order) = (
            store.clone(),
            Arc::clone(&queue),
            Arc::clone(&holding),
            Arc::clone(&order),
        );
        tasks.push(tokio::spawn(async move {
            let lease = queue
                .wait_for_turn(&store, "t", Duration::from_secs(10))
                .await
                .unwrap();
            assert_eq!(
                holding.fetch_add(1, Ordering::SeqCst),
                0,
                "two turns hold t"
            );
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            drop(lease);
        }));
        // Each joins before the next is sent.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_is_woken_when_one_leaves_and_another_thread_never_waits() {
    let dir = TempDir::new("contexture-turn-queue");
    let store = store(&dir).await;
    // A poll far longer than the test: only the wake-up can let the second turn in.
    let queue = Arc::new(TurnQueue::with_timing(
        Duration::from_secs(30),
        Duration::from_secs(60),
    ));
    let first = queue
        .wait_for_turn(&store, "t", Duration::from_secs(1))
        .await
        .unwrap();
    let elsewhere = queue
        .wait_for_turn(&store, "u", Duration::from_millis(10))
        .await
        .expect("another thread's turn does not wait");
    let second = tokio::spawn({
        let (store, queue) = (store.clone(), Arc::clone(&queue));
        async move {
            let started = Instant::now();
            let lease = queue
                .wait_for_turn(&store, "t", Duration::from_secs(5))
                .await
                .unwrap();
            (started.elapsed(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(first);
    let (waited, _lease) = second.await.unwrap();
    assert!(
        waited < Duration::from_millis(1000),
        "woken {waited:?} after it joined"
    );
    drop(elsewhere);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_its_limit_leaves_the_queue() {
    let dir = TempDir::new("contexture-turn-queue");
    let store = store(&dir).await;
    let queue = TurnQueue::with_timing(Duration::from_secs(30), Duration::from_millis(20));
    let holder = queue
        .wait_for_turn(&store, "t", Duration::from_secs(1))
        .await
        .unwrap();
    let error = queue
        .wait_for_turn(&store, "t", Duration::from_millis(150))
        .await
        .unwrap_err();
    let TurnWaitError::TimedOut { ahead, waited, .. } = &error else {
        panic!("{error}")
    };
    assert_eq!(*ahead, 1);
    assert!(*waited >= Duration::from_millis(150), "{waited:?}");
    assert!(error.to_string().contains("nothing was stored"), "{error}");
    drop(holder);
    // The refused turn left no ticket behind: the next one holds the thread at once.
    let next = queue
        .wait_for_turn(&store, "t", Duration::from_millis(500))
        .await
        .expect("the queue is empty again");
    assert_eq!(
        store.turns_ahead("t", next.ticket()).await.unwrap(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_no_server_renews_lapses_after_the_lease() {
    let dir = TempDir::new("contexture-turn-queue");
    let store = store(&dir).await;
    // A server that joined and stopped: its ticket is never renewed.
    let stopped = store.join_turn_queue("t").await.unwrap().ticket;
    let lease = Duration::from_millis(300);
    let queue = TurnQueue::with_timing(lease, Duration::from_millis(20));
    let started = Instant::now();
    let held = queue
        .wait_for_turn(&store, "t", Duration::from_secs(5))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(waited >= lease, "held after {waited:?}, within the lease");
    assert!(waited < lease * 4, "held after {waited:?}");
    assert_eq!(store.turns_ahead("t", stopped).await.unwrap(), None);
    // The holder's own ticket is renewed while it holds the thread: a turn longer than the
    // lease keeps its place.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(
        store.turns_ahead("t", held.ticket()).await.unwrap(),
        Some(0)
    );
    let other = TurnQueue::with_timing(lease, Duration::from_millis(20));
    assert!(
        other.wait_for_turn(&store, "t", lease * 2).await.is_err(),
        "a renewed holder is never removed"
    );
}

/// A store whose tickets take a while to come back once taken: a caller that stops waiting
/// meanwhile has joined without knowing its ticket.
#[derive(Clone)]
struct SlowToAnswer(SqliteStore);

impl TurnQueueStore for SlowToAnswer {
    async fn join_turn_queue(
        &self,
        thread: &str,
    ) -> Result<contexture_store::JoinedTurn, contexture_store::StoreError> {
        let joined = self.0.join_turn_queue(thread).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(joined)
    }
    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: i64,
    ) -> Result<Option<u64>, contexture_store::StoreError> {
        self.0.turns_ahead(thread, ticket).await
    }
    async fn renew_turn(
        &self,
        thread: &str,
        ticket: i64,
        lease: Duration,
    ) -> Result<bool, contexture_store::StoreError> {
        self.0.renew_turn(thread, ticket, lease).await
    }
    async fn leave_turn_queue(
        &self,
        thread: &str,
        ticket: i64,
    ) -> Result<(), contexture_store::StoreError> {
        self.0.leave_turn_queue(thread, ticket).await
    }
    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<contexture_store::NewEvent>,
        ticket: i64,
    ) -> Result<Vec<u64>, contexture_store::StoreError> {
        self.0.append_leaving_turn(thread, events, ticket).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_stops_waiting_gives_its_place_back_at_once() {
    let dir = TempDir::new("contexture-turn-queue");
    let store = SlowToAnswer(store(&dir).await);
    let queue = Arc::new(TurnQueue::with_timing(
        Duration::from_secs(30),
        Duration::from_millis(20),
    ));
    let holder = queue
        .wait_for_turn(&store, "t", Duration::from_secs(1))
        .await
        .unwrap();
    // Waiters whose clients leave, while their ticket is being taken and after.
    for delay in [30u64, 150] {
        let waiting = tokio::spawn({
            let (store, queue) = (store.clone(), Arc::clone(&queue));
            async move {
                let _ = queue
                    .wait_for_turn(&store, "t", Duration::from_secs(10))
                    .await;
            }
        });
        tokio::time::sleep(Duration::from_millis(delay)).await;
        waiting.abort();
        let _ = waiting.await;
    }
    drop(holder);
    // No ticket is left behind to hold the thread until it lapses.
    let next = queue
        .wait_for_turn(&store, "t", Duration::from_secs(2))
        .await
        .expect("the thread is free within moments, not after the lease");
    drop(next);
}
