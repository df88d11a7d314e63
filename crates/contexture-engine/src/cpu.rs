//! CPU work off the async runtime: fitting a long thread (counting, truncating, trimming) is
//! work a request may make large, so a server runs it on tokio's blocking threads, at most
//! a bounded number at once, and at most a share of them for one key (a tenant): one
//! tenant's heavy reads then wait for each other, not for the runtime, and never take every
//! place from the others.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::per_key::SharedPerKey;

/// The most work [`CpuPool::run_weighed`] runs on the calling task. A fit's weight is its
/// message count plus a unit per 256 bytes of text still to be counted and per 4 KiB of
/// counted text ([`crate::fitting::fit_weight`]): work this small takes at most about a tenth of a
/// millisecond (the 500-message agent-loop call of the `loop_fit` benchmark fits in 100 µs),
/// not long enough to hold up the other requests of a runtime thread for long.
pub const INLINE_WEIGHT: usize = 512;

/// A bounded pool of places for CPU work, with a share per key.
#[derive(Debug)]
pub struct CpuPool {
    places: Arc<Semaphore>,
    share: usize,
    /// Each key's share, while any of its work waits or runs.
    shares: SharedPerKey<Semaphore>,
}

impl CpuPool {
    /// A pool of `places` places (at least 1), of which one key holds at most `share` (at
    /// least 1, at most `places`).
    pub fn new(places: usize, share: usize) -> CpuPool {
        let places = places.max(1);
        CpuPool {
            places: Arc::new(Semaphore::new(places)),
            share: share.clamp(1, places),
            shares: SharedPerKey::default(),
        }
    }

    /// A pool sized for this machine: twice its cores, half of them for one key.
    pub fn for_this_machine() -> CpuPool {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        CpuPool::new(cores * 2, cores)
    }

    /// Runs `work`, of about `weight` units (see [`INLINE_WEIGHT`]): on the calling task
    /// when it is small, else as [`CpuPool::run`] does. Handing work to a blocking thread
    /// and back costs two thread wake-ups, which a small fit does not: the server's append
    /// and fit benchmark on PostgreSQL made about 8% more pairs a second with small fits
    /// run where they were asked for.
    pub async fn run_weighed<R, F>(&self, key: &str, weight: usize, work: F) -> R
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        if weight <= INLINE_WEIGHT {
            work()
        } else {
            self.run(key, work).await
        }
    }

    /// Runs `work` on a blocking thread once `key` has a place of its share and the pool
    /// has one free, and returns what it returned.
    pub async fn run<R, F>(&self, key: &str, work: F) -> R
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let share = self.shares.get(key, || Semaphore::new(self.share));
        // Neither semaphore is ever closed, so both waits end with a permit.
        let _own = share.acquire().await.ok();
        let _place = self.places.acquire().await.ok();
        match tokio::task::spawn_blocking(work).await {
            Ok(result) => result,
            // The work panicked: the panic goes on in the caller, as if it had run there.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_key_holds_at_most_its_share_and_others_still_run() {
        let pool = Arc::new(CpuPool::new(4, 2));
        let busy = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut heavy = Vec::new();
        for _ in 0..6 {
            let (pool, busy, most) = (pool.clone(), busy.clone(), most.clone());
            heavy.push(tokio::spawn(async move {
                pool.run("acme", move || {
                    let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(50));
                    busy.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Another key is not held behind acme's six.
        let started = std::time::Instant::now();
        assert_eq!(pool.run("zeta", || 7).await, 7);
        assert!(
            started.elapsed() < Duration::from_millis(40),
            "{:?}",
            started.elapsed()
        );
        for task in heavy {
            task.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "acme's share");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_work_runs_on_the_caller_and_large_work_on_the_pool() {
        let pool = CpuPool::new(2, 1);
        let caller = std::thread::current().id();
        let small = pool
            .run_weighed("acme", INLINE_WEIGHT, move || std::thread::current().id())
            .await;
        assert_eq!(small, caller);
        let large = pool
            .run_weighed("acme", INLINE_WEIGHT + 1, move || {
                std::thread::current().id()
            })
            .await;
        assert_ne!(large, caller);
    }
}
