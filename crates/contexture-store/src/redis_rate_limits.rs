//! Request rate limits held in Redis: for servers that share their limits through a Redis
//! server rather than through their database (servers on SQLite each, or a PostgreSQL
//! cluster whose database should not take a statement per request).
//!
//! The bucket is the same generic cell rate algorithm as PostgreSQL's (see
//! [`crate::RateLimitStore`]), and Redis decides it the same way: one script, which Redis
//! runs alone (no other command runs between its read and its write), reads the key's
//! theoretical arrival time, admits or refuses against Redis's own clock (`TIME`, so that
//! the servers' clocks never enter into it), and records. A key lives in Redis only while
//! its time is ahead of the clock (and a second more): past that, a missing key and a
//! stored one admit alike, so idle keys cost nothing.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::rate_limits::{RateLimit, wait_for};
use crate::{RateLimitStore, StoreError};

/// What each key is stored under, before the caller's key: the limits of one deployment
/// stay apart from whatever else the Redis server holds.
pub const REDIS_KEY_PREFIX: &str = "contexture:rate:";

/// The longest a request waits for Redis to answer, or to connect, before the caller falls
/// back (a server then judges by its own bucket: see the server's rate limiter).
const TIMEOUT: Duration = Duration::from_secs(1);

/// Times in the script are Lua numbers (doubles): an interval or a tolerance is kept under
/// this (about 35 years in microseconds), so that every sum stays an exact integer. A rate
/// slower than one request in that long admits its burst, then nothing, as it would anyway.
const MAX_SPAN_US: i64 = 1 << 50;

/// Admits or refuses one request: `KEYS[1]` the key, `ARGV` the interval and the tolerance
/// in microseconds. Returns `{admitted (1 or 0), the key's time, Redis's clock}`.
const TAKE_TOKEN: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '') or now
local next = math.max(tat, now) + interval
if next - now > tolerance then
  return {0, tat, now}
end
redis.call('SET', KEYS[1], string.format('%d', next),
  'PX', string.format('%d', math.floor((next - now) / 1000) + 1000))
return {1, next, now}
";

/// Shared rate limits in one Redis server (see the module documentation). Clones share
/// the connection.
#[derive(Clone)]
pub struct RedisRateLimits {
    connection: ConnectionManager,
    script: std::sync::Arc<redis::Script>,
}

impl std::fmt::Debug for RedisRateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRateLimits").finish_non_exhaustive()
    }
}

impl RedisRateLimits {
    /// Connects to the Redis server at `url` (`redis://host:port[/db]`, or `rediss://` for
    /// TLS where the build has it), checking that it answers. The connection reconnects by
    /// itself after Redis restarts.
    pub async fn connect(url: &str) -> Result<RedisRateLimits, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|error| StoreError::database("redis", "read the Redis URL", error))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(1);
        let mut connection = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|error| StoreError::database("redis", "connect to Redis", error))?;
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .map_err(|error| StoreError::database("redis", "connect to Redis", error))?;
        Ok(RedisRateLimits {
            connection,
            script: std::sync::Arc::new(redis::Script::new(TAKE_TOKEN)),
        })
    }
}

impl RateLimitStore for RedisRateLimits {
    async fn take_rate_token(
        &self,
        key: &str,
        limit: RateLimit,
    ) -> Result<Result<(), Duration>, StoreError> {
        let interval = limit.interval_us().min(MAX_SPAN_US);
        let tolerance = limit.tolerance_us().min(MAX_SPAN_US);
        let mut connection = self.connection.clone();
        let (admitted, tat, now): (i64, i64, i64) = self
            .script
            .key(format!("{REDIS_KEY_PREFIX}{key}"))
            .arg(interval)
            .arg(tolerance)
            .invoke_async(&mut connection)
            .await
            .map_err(|error| {
                StoreError::database("redis", "take a request from a rate limit", error)
            })?;
        if admitted == 1 {
            return Ok(Ok(()));
        }
        Ok(Err(
            wait_for(interval, tolerance, tat, now).max(Duration::from_micros(1))
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::rate_limits::sharing_tests::two_servers_admit_the_rate_not_twice_it;
    use crate::testing::redis_url;

    async fn connect() -> Option<RedisRateLimits> {
        let url = redis_url()?;
        Some(RedisRateLimits::connect(&url).await.unwrap())
    }

    /// A key of its own per test run: the tests share the machine's Redis.
    fn fresh_key(name: &str) -> String {
        format!(
            "test-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }

    #[tokio::test]
    async fn two_servers_together_admit_the_rate_not_twice_it() {
        let Some(first) = connect().await else {
            return;
        };
        let second = connect().await.unwrap();
        two_servers_admit_the_rate_not_twice_it(&first, &second, &fresh_key("rate")).await;
        let limit = RateLimit {
            per_second: 20.0,
            burst: 5,
        };
        // Another key has its own bucket.
        assert_eq!(
            second
                .take_rate_token(&fresh_key("other"), limit)
                .await
                .unwrap(),
            Ok(())
        );
    }

    #[tokio::test]
    async fn a_refusal_says_how_long_and_keys_of_any_bytes_stay_apart() {
        let Some(store) = connect().await else {
            return;
        };
        let limit = RateLimit {
            per_second: 2.0,
            burst: 1,
        };
        // Keys that look like patterns, separators or commands are keys like any other.
        let base = fresh_key("hostile");
        let keys = [
            format!("{base}*"),
            format!("{base}\n*1\r\n$4\r\nPING"),
            format!("{base} '; redis.call('FLUSHALL') --"),
            format!("{base}{}", "k".repeat(10_000)),
        ];
        for key in &keys {
            assert_eq!(store.take_rate_token(key, limit).await.unwrap(), Ok(()));
        }
        for key in &keys {
            let wait = store
                .take_rate_token(key, limit)
                .await
                .unwrap()
                .unwrap_err();
            assert!(
                wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
                "{wait:?}"
            );
        }
        // The key expires once its time is past: nothing is left behind for an idle key.
        let mut connection = store.connection.clone();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{REDIS_KEY_PREFIX}{}", keys[0]))
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!((1_000..=1_500).contains(&ttl), "expires in {ttl} ms");
        // A rate far too slow to count in doubles still admits its burst, then refuses.
        let slow = RateLimit {
            per_second: 1e-30,
            burst: 1,
        };
        let key = fresh_key("slow");
        assert_eq!(store.take_rate_token(&key, slow).await.unwrap(), Ok(()));
        let wait = store
            .take_rate_token(&key, slow)
            .await
            .unwrap()
            .unwrap_err();
        assert!(wait > Duration::from_secs(3600 * 24 * 365), "{wait:?}");
    }

    #[tokio::test]
    async fn a_server_that_does_not_answer_is_an_error_not_a_hang() {
        // A port nothing listens on.
        let started = Instant::now();
        let error = RedisRateLimits::connect("redis://127.0.0.1:9/")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("connect to Redis"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let error = RedisRateLimits::connect("http://example")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("Redis URL"), "{error}");
    }
}
