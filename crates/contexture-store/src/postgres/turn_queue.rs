//! The PostgreSQL store's queue of turns: [`TurnQueueStore`] over the `turn_queue` table, one
//! or two statements per call on a pooled connection. Heartbeats are the database's clock,
//! so the servers sharing it need not agree on the time.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use super::PgStore;
use super::writes::AlsoWritten;
use crate::error::Action;
use crate::turn_queue::lease_ms;
use crate::{JoinedTurn, NewEvent, StoreError, TurnQueueStore, TurnTicket};

/// The database's clock in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

impl TurnQueueStore for PgStore {
    async fn join_turn_queue(&self, thread: &str) -> Result<JoinedTurn, StoreError> {
        let mut client = self.pool.get().await?;
        // Tickets come from a sequence, and a sequence hands out numbers before their rows
        // commit: two joins could commit in the other order, and the later ticket, counting
        // the turns ahead before the earlier one's row is visible, would hold the thread
        // together with it. Joins of one thread take a lock held until their commit, so
        // tickets become visible in the order they were numbered.
        let tx = client
            .transaction()
            .await
            .doing("begin joining a thread's turn queue")?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('contexture-turns:' || current_schema() || ':' || $1))",
            &[&thread],
        )
        .await
        .doing("order the joins of a thread's turn queue")?;
        // Counted in the same statement, whose snapshot is taken with the lock held: every
        // earlier join of the thread has committed.
        let row = tx
            .query_one(
                &format!(
                    "WITH joined AS ( \
                         INSERT INTO turn_queue (thread_id, heartbeat_at) VALUES ($1, {NOW_MS}) \
                         RETURNING ticket) \
                     SELECT joined.ticket, \
                            (SELECT count(*) FROM turn_queue q \
                             WHERE q.thread_id = $1 AND q.ticket < joined.ticket) \
                     FROM joined"
                ),
                &[&thread],
            )
            .await
            .doing("join a thread's turn queue")?;
        tx.commit()
            .await
            .doing("commit joining a thread's turn queue")?;
        Ok(JoinedTurn {
            ticket: row.get(0),
            ahead: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
        })
    }

    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> Result<Option<u64>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM turn_queue WHERE ticket = $2 AND thread_id = $1), \
                        (SELECT count(*) FROM turn_queue WHERE thread_id = $1 AND ticket < $2)",
                &[&thread, &ticket],
            )
            .await
            .doing("count the turns ahead")?;
        let queued: bool = row.get(0);
        let ahead: i64 = row.get(1);
        Ok(queued.then(|| u64::try_from(ahead).unwrap_or(0)))
    }

    async fn renew_turn(
        &self,
        thread: &str,
        ticket: TurnTicket,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let lease = lease_ms(lease);
        client
            .execute(
                &format!(
                    "DELETE FROM turn_queue WHERE thread_id = $1 AND ticket <> $2 \
                     AND heartbeat_at < {NOW_MS} - $3"
                ),
                &[&thread, &ticket, &lease],
            )
            .await
            .doing("remove lapsed turns")?;
        let renewed = client
            .execute(
                &format!(
                    "UPDATE turn_queue SET heartbeat_at = {NOW_MS} WHERE ticket = $2 AND thread_id = $1"
                ),
                &[&thread, &ticket],
            )
            .await
            .doing("renew a turn")?;
        Ok(renewed == 1)
    }

    async fn leave_turn_queue(&self, thread: &str, ticket: TurnTicket) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        leave(&client, thread, ticket).await
    }

    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: TurnTicket,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_events_with(thread, events, None, AlsoWritten::TurnLeft(ticket))
            .await
    }
}

/// Removes `ticket` from `thread`'s queue (in the caller's transaction, if any).
pub(super) async fn leave(
    client: &impl GenericClient,
    thread: &str,
    ticket: TurnTicket,
) -> Result<(), StoreError> {
    client
        .execute(
            "DELETE FROM turn_queue WHERE ticket = $2 AND thread_id = $1",
            &[&thread, &ticket],
        )
        .await
        .doing("leave a thread's turn queue")?;
    Ok(())
}
