//! The SQLite store's queue of turns: [`TurnQueueStore`] over the `turn_queue` table. Joining,
//! renewing and leaving are writes batched by the writer thread like any other, but not
//! synced to disk on their own: a ticket lapses by itself, and a crash of the machine that
//! loses one also ends the turn it stood for. Where a ticket stands is a read.

use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use crate::error::Action;
use crate::turn_queue::lease_ms;
use crate::{JoinedTurn, NewEvent, StoreError, TurnQueueStore, TurnTicket, epoch_ms};

impl TurnQueueStore for SqliteStore {
    async fn join_turn_queue(&self, thread: &str) -> Result<JoinedTurn, StoreError> {
        let thread = thread.to_owned();
        let now = epoch_ms(SystemTime::now());
        // One writer at a time on the file, every process's: the turns counted are all those
        // that joined before.
        self.write_lapsing(move |tx| {
            let ticket: TurnTicket = tx
                .prepare_cached(
                    "INSERT INTO turn_queue (thread_id, heartbeat_at) VALUES (?1, ?2) RETURNING ticket",
                )
                .doing("prepare the turn queue insert")?
                .query_row(params![thread, now], |row| row.get(0))
                .doing("join a thread's turn queue")?;
            let ahead = count_ahead(tx, &thread, ticket)?;
            Ok(JoinedTurn { ticket, ahead })
        })
        .await
    }

    async fn turns_ahead(
        &self,
        thread: &str,
        ticket: TurnTicket,
    ) -> Result<Option<u64>, StoreError> {
        let thread = thread.to_owned();
        self.read(move |conn| {
            let queued: Option<i64> = conn
                .prepare_cached(
                    "SELECT ticket FROM turn_queue WHERE ticket = ?1 AND thread_id = ?2",
                )
                .doing("prepare the turn queue lookup")?
                .query_row(params![ticket, thread], |row| row.get(0))
                .optional()
                .doing("find a turn's ticket")?;
            if queued.is_none() {
                return Ok(None);
            }
            count_ahead(conn, &thread, ticket).map(Some)
        })
        .await
    }

    async fn renew_turn(
        &self,
        thread: &str,
        ticket: TurnTicket,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let thread = thread.to_owned();
        let now = epoch_ms(SystemTime::now());
        let lapsed_before = now.saturating_sub(lease_ms(lease));
        self.write_lapsing(move |tx| {
            tx.prepare_cached(
                "DELETE FROM turn_queue WHERE thread_id = ?1 AND ticket <> ?2 AND heartbeat_at < ?3",
            )
            .doing("prepare the lapsed turns' removal")?
            .execute(params![thread, ticket, lapsed_before])
            .doing("remove lapsed turns")?;
            let renewed = tx
                .prepare_cached(
                    "UPDATE turn_queue SET heartbeat_at = ?3 WHERE ticket = ?2 AND thread_id = ?1",
                )
                .doing("prepare the turn renewal")?
                .execute(params![thread, ticket, now])
                .doing("renew a turn")?;
            Ok(renewed == 1)
        })
        .await
    }

    async fn leave_turn_queue(&self, thread: &str, ticket: TurnTicket) -> Result<(), StoreError> {
        let thread = thread.to_owned();
        self.write_lapsing(move |tx| leave(tx, &thread, ticket))
            .await
    }

    async fn append_leaving_turn(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        ticket: TurnTicket,
    ) -> Result<Vec<u64>, StoreError> {
        let queue = thread.to_owned();
        self.append_then(thread, events, move |tx| leave(tx, &queue, ticket))
            .await
    }
}

/// How many turns of `thread` are ahead of `ticket`.
fn count_ahead(conn: &Connection, thread: &str, ticket: TurnTicket) -> Result<u64, StoreError> {
    let ahead: i64 = conn
        .prepare_cached("SELECT count(*) FROM turn_queue WHERE thread_id = ?1 AND ticket < ?2")
        .doing("prepare the turn queue count")?
        .query_row(params![thread, ticket], |row| row.get(0))
        .doing("count the turns ahead")?;
    Ok(u64::try_from(ahead).unwrap_or(0))
}

/// Removes `ticket` from `thread`'s queue, inside the caller's write.
fn leave(tx: &Connection, thread: &str, ticket: TurnTicket) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM turn_queue WHERE ticket = ?2 AND thread_id = ?1")
        .doing("prepare the turn queue removal")?
        .execute(params![thread, ticket])
        .doing("leave a thread's turn queue")?;
    Ok(())
}
