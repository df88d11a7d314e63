//! Request rate limits shared by every server on a database: one bucket per key, held in the
//! database and judged by its clock, so that several servers together admit the configured
//! rate rather than each admitting it. The bucket is the generic cell rate algorithm
//! (GCRA): a key's state is one time, its *theoretical arrival time*; a request is admitted
//! when, moved on by one emission interval, that time is at most the burst's worth of
//! intervals ahead of now. One statement decides and records, so concurrent requests
//! through different servers never both take the last place.

use std::future::Future;
use std::time::Duration;

use crate::StoreError;

/// A limit: `per_second` requests sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second, sustained (above 0).
    pub per_second: f64,
    /// Requests admitted at once (at least 1).
    pub burst: u32,
}

impl RateLimit {
    /// The time one request takes of the rate, in microseconds (at least 1).
    pub fn interval_us(&self) -> i64 {
        let interval = (1_000_000.0 / self.per_second).round();
        if interval.is_finite() && interval >= 1.0 {
            interval.min(i64::MAX as f64 / 4.0) as i64
        } else {
            1
        }
    }

    /// How far ahead of now a key's theoretical arrival time may run, in microseconds.
    pub fn tolerance_us(&self) -> i64 {
        self.interval_us()
            .saturating_mul(i64::from(self.burst.max(1)))
    }

    /// The wait before a request is admitted, for a key whose theoretical arrival time is
    /// `tat_us` at `now_us` (zero when it would be admitted now).
    pub fn wait(&self, tat_us: i64, now_us: i64) -> Duration {
        wait_for(self.interval_us(), self.tolerance_us(), tat_us, now_us)
    }
}

/// [`RateLimit::wait`] for a bucket of `interval_us` and `tolerance_us` (which a store may
/// have narrowed to what it can count).
pub(crate) fn wait_for(interval_us: i64, tolerance_us: i64, tat_us: i64, now_us: i64) -> Duration {
    let next = tat_us.max(now_us).saturating_add(interval_us);
    let ahead = next.saturating_sub(tolerance_us).saturating_sub(now_us);
    Duration::from_micros(u64::try_from(ahead).unwrap_or(0))
}

/// Storage of shared rate limits (see the module documentation).
pub trait RateLimitStore: Send + Sync {
    /// Admits one request of `key` under `limit` (`Ok(Ok(()))`, recorded), or says how long
    /// until one would be (`Ok(Err(wait))`, nothing recorded).
    fn take_rate_token(
        &self,
        key: &str,
        limit: RateLimit,
    ) -> impl Future<Output = Result<Result<(), Duration>, StoreError>> + Send;
}

/// What every store of shared limits is tested for, with the servers that share it.
#[cfg(test)]
pub(crate) mod sharing_tests {
    use std::time::{Duration, Instant};

    use super::{RateLimit, RateLimitStore};

    /// Drives `key` for 1.5 s from two stores of one shared limit (as two servers would),
    /// four tasks each, and checks that together they admit the limit's burst and rate,
    /// within 10%, not twice it.
    pub(crate) async fn two_servers_admit_the_rate_not_twice_it<S>(first: &S, second: &S, key: &str)
    where
        S: RateLimitStore + Clone + 'static,
    {
        let limit = RateLimit {
            per_second: 20.0,
            burst: 5,
        };
        let started = Instant::now();
        let run = Duration::from_millis(1500);
        let mut tasks = Vec::new();
        for store in [first, second] {
            for _ in 0..4 {
                let store = store.clone();
                let key = key.to_owned();
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u32;
                    while started.elapsed() < run {
                        match store.take_rate_token(&key, limit).await.unwrap() {
                            Ok(()) => admitted += 1,
                            Err(wait) => {
                                tokio::time::sleep(wait.min(Duration::from_millis(20))).await
                            }
                        }
                    }
                    admitted
                }));
            }
        }
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let allowed = f64::from(limit.burst) + limit.per_second * elapsed;
        assert!(
            f64::from(admitted) <= allowed + 1.0 && f64::from(admitted) >= allowed * 0.9 - 1.0,
            "admitted {admitted} in {elapsed:.2} s; the limit allows {allowed:.1}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_admits_its_burst_then_one_request_an_interval() {
        let limit = RateLimit {
            per_second: 4.0,
            burst: 2,
        };
        assert_eq!(limit.interval_us(), 250_000);
        assert_eq!(limit.tolerance_us(), 500_000);
        let now = 1_000_000_000;
        // A fresh key (its time in the past) is admitted.
        assert_eq!(limit.wait(0, now), Duration::ZERO);
        // After one request, one more fits the burst.
        assert_eq!(limit.wait(now + 250_000, now), Duration::ZERO);
        // After two, the next waits one interval.
        assert_eq!(
            limit.wait(now + 500_000, now),
            Duration::from_micros(250_000)
        );
        assert_eq!(limit.wait(now + 500_000, now + 250_000), Duration::ZERO);
    }

    #[test]
    fn extreme_rates_stay_in_range() {
        let fast = RateLimit {
            per_second: 1e12,
            burst: u32::MAX,
        };
        assert_eq!(fast.interval_us(), 1);
        assert_eq!(
            fast.wait(i64::MAX, 0),
            Duration::from_micros((i64::MAX - i64::from(u32::MAX)) as u64)
        );
        let slow = RateLimit {
            per_second: 1e-30,
            burst: 1,
        };
        assert!(slow.interval_us() > 0);
        // The first request is admitted; the next waits (a very long time).
        assert_eq!(slow.wait(0, 0), Duration::ZERO);
        assert!(slow.wait(slow.interval_us(), 0) > Duration::from_secs(1));
    }
}
