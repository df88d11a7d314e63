//! The PostgreSQL store's shared rate limits: [`RateLimitStore`] over the unlogged
//! `rate_limits` table, one statement per request on the database's clock.

use std::time::Duration;

use super::PgStore;
use crate::error::Action;
use crate::rate_limits::RateLimit;
use crate::{RateLimitStore, StoreError};

/// The database's clock in microseconds since the Unix epoch.
const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

impl RateLimitStore for PgStore {
    async fn take_rate_token(
        &self,
        key: &str,
        limit: RateLimit,
    ) -> Result<Result<(), Duration>, StoreError> {
        let client = self.pool.get().await?;
        let interval = limit.interval_us();
        let tolerance = limit.tolerance_us();
        // Admitted: the key's time moves on by one interval (from now, when it fell
        // behind) and is returned. Refused: nothing changes, and the key's time and the
        // clock come back to say how long to wait.
        let row = client
            .query_one(
                &format!(
                    "WITH clock AS (SELECT {NOW_US} AS now), \
                     taken AS ( \
                       INSERT INTO rate_limits AS r (key, tat_us) \
                       SELECT $1, clock.now + $2 FROM clock \
                       ON CONFLICT (key) DO UPDATE \
                         SET tat_us = greatest(r.tat_us, (SELECT now FROM clock)) + $2 \
                         WHERE greatest(r.tat_us, (SELECT now FROM clock)) + $2 \
                               - (SELECT now FROM clock) <= $3 \
                       RETURNING tat_us) \
                     SELECT (SELECT count(*) FROM taken), \
                            (SELECT tat_us FROM rate_limits WHERE key = $1), \
                            (SELECT now FROM clock)"
                ),
                &[&key, &interval, &tolerance],
            )
            .await
            .doing("take a request from a rate limit")?;
        let taken: i64 = row.get(0);
        if taken > 0 {
            return Ok(Ok(()));
        }
        let tat: Option<i64> = row.get(1);
        let now: i64 = row.get(2);
        Ok(Err(limit
            .wait(tat.unwrap_or(now), now)
            .max(Duration::from_micros(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limits::sharing_tests::two_servers_admit_the_rate_not_twice_it;
    use crate::testing::{pg_store, pg_url};

    #[tokio::test]
    async fn two_servers_together_admit_the_rate_not_twice_it() {
        let Some((first, schema)) = pg_store("ctx_rate").await else {
            return;
        };
        let second = PgStore::open_in_schema(&pg_url(), &schema).await.unwrap();
        two_servers_admit_the_rate_not_twice_it(&first, &second, "key-1").await;
        let limit = RateLimit {
            per_second: 20.0,
            burst: 5,
        };
        // Another key has its own bucket.
        assert_eq!(
            second.take_rate_token("key-2", limit).await.unwrap(),
            Ok(())
        );
        first.drop_schema().await.unwrap();
    }
}
