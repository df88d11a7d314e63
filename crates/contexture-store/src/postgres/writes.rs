//! The PostgreSQL store's writes: appending events (one statement for plain ones, a locked
//! transaction otherwise), forking a thread (with the sizes its shared prefix brings),
//! deleting one, and folding an observation into a calibration.

use std::sync::LazyLock;
use std::time::SystemTime;

use contexture_core::calibration::{Calibration, Observation};
use contexture_core::thread::EventKind;
use deadpool_postgres::GenericClient;

use super::PgStore;
use super::execution_queue::finish_held;
use super::references;
use super::turn_queue;
use crate::calibration;
use crate::error::Action;
use crate::forks::{ForkPlan, PrefixSize, SizeRow};
use crate::record::{self, Row, ThreadLimits, db_bytes, db_seq, seq_of};
use crate::request_refs::REQUEST_STARTED;
use crate::{NewEvent, QueueHold, StoreError, TurnTicket, epoch_ms};

/// True for events whose validity depends on the seq they get, and for request records,
/// stored by reference to the events before them.
pub(super) fn needs_seq_check(event: &EventKind) -> bool {
    matches!(
        event,
        EventKind::ContextReplaced(_) | EventKind::Forked { .. } | EventKind::RequestStarted(_)
    )
}

/// What an append writes besides its events, in the same transaction.
#[derive(Debug, Clone, Copy)]
pub(super) enum AlsoWritten<'a> {
    /// Nothing else.
    Nothing,
    /// The run whose log the thread is finished in the queue as `outcome`, when `hold`
    /// still holds it (see [`crate::RunEndStore`]); else nothing is stored.
    RunFinished {
        hold: &'a QueueHold,
        outcome: &'a str,
    },
    /// The turn holding the thread leaves its queue (see
    /// [`crate::TurnQueueStore::append_leaving_turn`]).
    TurnLeft(TurnTicket),
}

/// The statement of [`append_fast`]: the upsert of the thread's row reserves the seqs, the
/// events are inserted with them; `leave` is a further part of it, or nothing.
fn fast_append_statement(leave: &str) -> String {
    format!(
        "WITH reserved AS (
             INSERT INTO threads (id, last_seq, created_at, updated_at, bytes, message_bytes)
             VALUES ($1, $2, $3, $3, $9, $11)
             ON CONFLICT (id) DO UPDATE
             SET last_seq = threads.last_seq + EXCLUDED.last_seq, updated_at = EXCLUDED.updated_at,
                 bytes = threads.bytes + EXCLUDED.bytes,
                 message_bytes = threads.message_bytes + EXCLUDED.message_bytes
             WHERE threads.last_seq + EXCLUDED.last_seq <= $7
               AND threads.bytes + EXCLUDED.bytes <= $8
             RETURNING last_seq){leave}
         INSERT INTO events
             (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
         SELECT $1, reserved.last_seq - $2 + e.ord, e.kind, e.body, e.tokens, NULL, $3, e.ordinary
         FROM reserved,
              UNNEST($4::text[], $5::text[], $6::text[], $10::smallint[])
                  WITH ORDINALITY AS e (kind, body, tokens, ordinary, ord)
         RETURNING seq"
    )
}

/// [`append_fast`]'s plain statement, built once rather than on every append.
static FAST_APPEND: LazyLock<String> = LazyLock::new(|| fast_append_statement(""));

/// [`append_fast`]'s statement that also leaves the thread's queue of turns (ticket `$12`)
/// when the events were inserted. A data-modifying part of a statement runs whether or not
/// the rest reads it.
static FAST_APPEND_LEAVING: LazyLock<String> = LazyLock::new(|| {
    fast_append_statement(
        ", left_queue AS (
             DELETE FROM turn_queue
             WHERE thread_id = $1 AND ticket = $12 AND EXISTS (SELECT 1 FROM reserved))",
    )
});

/// Appends events that need neither an idempotency lookup nor a seq-dependent check in one
/// statement (its own transaction): the upsert of the thread's row takes the row lock and
/// reserves the seqs, and the events are inserted with them; with `leaving`, that ticket
/// leaves the thread's queue of turns in the same statement, when the events are stored.
pub(super) async fn append_fast(
    client: &impl GenericClient,
    thread: &str,
    rows: Vec<Row>,
    now: i64,
    limits: ThreadLimits,
    leaving: Option<TurnTicket>,
) -> Result<Vec<u64>, StoreError> {
    let count = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let added: u64 = rows.iter().map(|row| record::body_bytes(&row.body)).sum();
    let added_messages: u64 = rows.iter().map(record::message_bytes).sum();
    record::check_room(thread, rows.len() as u64, limits.max_events)?;
    record::check_bytes(thread, added, limits.max_bytes)?;
    let cap = |limit: u64| {
        if limit == 0 {
            i64::MAX
        } else {
            db_bytes(limit)
        }
    };
    let mut kinds = Vec::with_capacity(rows.len());
    let mut bodies = Vec::with_capacity(rows.len());
    let mut tokens = Vec::with_capacity(rows.len());
    let mut ordinary = Vec::with_capacity(rows.len());
    for row in rows {
        kinds.push(row.kind);
        bodies.push(row.body);
        tokens.push(row.tokens);
        ordinary.push(row.ordinary_message.then_some(1i16));
    }
    let text = if leaving.is_some() {
        &*FAST_APPEND_LEAVING
    } else {
        &*FAST_APPEND
    };
    let statement = client
        .prepare_cached(text)
        .await
        .doing("prepare the append")?;
    let (max_events, max_bytes) = (cap(limits.max_events), cap(limits.max_bytes));
    let (added_bytes, added_message_bytes) = (db_bytes(added), db_bytes(added_messages));
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &thread,
        &count,
        &now,
        &kinds,
        &bodies,
        &tokens,
        &max_events,
        &max_bytes,
        &added_bytes,
        &ordinary,
        &added_message_bytes,
    ];
    if let Some(ticket) = &leaving {
        params.push(ticket);
    }
    let rows = client
        .query(&statement, &params)
        .await
        .doing("append events")?;
    // The thread's row was not updated (it would pass a limit), so nothing was inserted.
    if rows.is_empty() {
        let row = client
            .query_one(
                "SELECT last_seq, bytes FROM threads WHERE id = $1",
                &[&thread],
            )
            .await
            .doing("read the thread's size")?;
        let (last, bytes): (i64, i64) = (row.get(0), row.get(1));
        record::check_room(
            thread,
            seq_of(thread, last)? + count as u64,
            limits.max_events,
        )?;
        record::check_bytes(
            thread,
            u64::try_from(bytes).unwrap_or(0) + added,
            limits.max_bytes,
        )?;
        return Err(StoreError::ThreadFull {
            thread: thread.to_string(),
            max_events: limits.max_events,
        });
    }
    let mut seqs = rows
        .iter()
        .map(|row| seq_of(thread, row.get(0)))
        .collect::<Result<Vec<_>, _>>()?;
    seqs.sort_unstable();
    Ok(seqs)
}

/// The bytes of `thread`'s events and of its messages up to `at_seq`, its fork prefix
/// included: its sizes less its own events after `at_seq`, or, for a seq inside its prefix,
/// the parent's up to it.
pub(super) async fn sizes_through(
    client: &impl GenericClient,
    thread: &str,
    at_seq: u64,
) -> Result<(u64, u64), StoreError> {
    let mut walk = PrefixSize::new(thread, at_seq);
    loop {
        let row = client
            .query_one(
                "SELECT bytes, message_bytes, parent_id, fork_seq FROM threads WHERE id = $1",
                &[&walk.current()],
            )
            .await
            .doing("read the thread's size")?;
        let row: SizeRow = (row.get(0), row.get(1), row.get(2), row.get(3));
        if !walk.step(row)? {
            break;
        }
    }
    let (current, after) = (walk.current(), walk.measuring());
    let bytes_after: i64 = client
        .query_one(
            "SELECT COALESCE(SUM(octet_length(body)), 0)::BIGINT
             FROM events WHERE thread_id = $1 AND seq > $2",
            &[&current, &after],
        )
        .await
        .doing("measure the thread's later events")?
        .get(0);
    let later = client
        .query(
            "SELECT seq, kind, body FROM events WHERE thread_id = $1 AND seq > $2
               AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')",
            &[&current, &after],
        )
        .await
        .doing("read the thread's later messages")?;
    let mut messages_after = 0u64;
    for row in later {
        let seq = seq_of(current, row.get(0))?;
        messages_after += record::stored_message_bytes(current, seq, row.get(1), row.get(2))?;
    }
    Ok(walk.finish(bytes_after, messages_after))
}

/// Deletes `thread`'s rows and counts the deletion (which drops cached folds of it, in
/// every server: see [`crate::projection_cache`]), inside the caller's transaction, which
/// holds the thread row's lock (`FOR UPDATE`): no append can then add events the delete
/// would leave without their thread.
pub(super) async fn delete_thread(
    client: &impl GenericClient,
    thread: &str,
) -> Result<(), StoreError> {
    client
        .execute("UPDATE deletions SET count = count + 1 WHERE id = 1", &[])
        .await
        .doing("count the deletion")?;
    client
        .execute("DELETE FROM events WHERE thread_id = $1", &[&thread])
        .await
        .doing("delete events")?;
    client
        .execute("DELETE FROM threads WHERE id = $1", &[&thread])
        .await
        .doing("delete the thread")?;
    Ok(())
}

impl PgStore {
    pub(super) async fn append_events(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_events_with(thread, events, None, AlsoWritten::Nothing)
            .await
    }

    /// Appends `events` to `thread` and writes `also` in the same transaction; with
    /// `after`, only when the thread's last seq is still that ([`StoreError::Moved`]).
    pub(super) async fn append_events_with(
        &self,
        thread: &str,
        events: Vec<NewEvent>,
        after: Option<u64>,
        also: AlsoWritten<'_>,
    ) -> Result<Vec<u64>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows = record::encode_batch(thread, events)?;
        let now = epoch_ms(SystemTime::now());
        let limits = self.limits();
        let mut client = self.pool.get().await?;
        let fast = after.is_none()
            && rows
                .iter()
                .all(|row| row.key.is_none() && !row.step_answer && !needs_seq_check(&row.event));
        match also {
            AlsoWritten::Nothing if fast => {
                return append_fast(&client, thread, rows, now, limits, None).await;
            }
            AlsoWritten::TurnLeft(ticket) if fast => {
                return append_fast(&client, thread, rows, now, limits, Some(ticket)).await;
            }
            _ => {}
        }
        let tx = client.transaction().await.doing("begin an append")?;
        // One round trip creates the thread or takes its row's lock (an upsert's update
        // locks the row as `FOR UPDATE` does), and reads its last seq and sizes.
        let lock = tx
            .prepare_cached(
                "INSERT INTO threads (id, last_seq, created_at, updated_at) VALUES ($1, 0, $2, $2)
                 ON CONFLICT (id) DO UPDATE SET last_seq = threads.last_seq
                 RETURNING last_seq, bytes, message_bytes",
            )
            .await
            .doing("prepare the thread's creation")?;
        let row = tx
            .query_one(&lock, &[&thread, &now])
            .await
            .doing("create or lock the thread")?;
        let mut last = seq_of(thread, row.get(0))?;
        if let Some(expected) = after
            && expected != last
        {
            // Dropping the transaction rolls back the thread's creation, if it made it.
            return Err(StoreError::Moved {
                thread: thread.to_owned(),
                expected,
                last_seq: last,
            });
        }
        let mut bytes = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let mut message_bytes = u64::try_from(row.get::<_, i64>(2)).unwrap_or(0);
        let find = tx
            .prepare_cached("SELECT seq FROM events WHERE thread_id = $1 AND idempotency_key = $2")
            .await
            .doing("prepare the idempotency lookup")?;
        let insert = tx
            .prepare_cached(
                "INSERT INTO events
                     (thread_id, seq, kind, body, tokens, idempotency_key, created_at, ordinary_message)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .doing("prepare the insert")?;
        let mut seqs = Vec::with_capacity(rows.len());
        // The bodies a record was compared with, kept once the append has committed.
        let mut to_keep = Vec::new();
        for mut row in rows {
            if let Some(key) = &row.key {
                let stored = tx
                    .query_opt(&find, &[&thread, key])
                    .await
                    .doing("look up the idempotency key")?;
                if let Some(stored) = stored {
                    seqs.push(seq_of(thread, stored.get(0))?);
                    continue;
                }
            }
            let seq = last + 1;
            if row.kind == REQUEST_STARTED {
                let kept =
                    references::refer_request(&tx, thread, seq, &mut row, &self.referable).await?;
                to_keep.extend(kept);
            }
            // On an error the transaction is dropped: nothing of this append is stored.
            limits.admit(thread, seq, &mut bytes, &row)?;
            if row.step_answer {
                let saved = references::share_answer(&tx, thread, seq, &row).await?;
                bytes = bytes.saturating_sub(saved);
            }
            message_bytes += record::message_bytes(&row);
            tx.execute(
                &insert,
                &[
                    &thread,
                    &db_seq(seq),
                    &row.kind,
                    &row.body,
                    &row.tokens,
                    &row.key,
                    &now,
                    &row.ordinary_message.then_some(1i16),
                ],
            )
            .await
            .doing("insert the event")?;
            last = seq;
            seqs.push(seq);
        }
        tx.execute(
            "UPDATE threads SET last_seq = $2, updated_at = $3, bytes = $4, message_bytes = $5
             WHERE id = $1",
            &[
                &thread,
                &db_seq(last),
                &now,
                &db_bytes(bytes),
                &db_bytes(message_bytes),
            ],
        )
        .await
        .doing("update the thread")?;
        match also {
            AlsoWritten::Nothing => {}
            AlsoWritten::RunFinished { hold, outcome } => {
                if !finish_held(&tx, thread, &hold.node, hold.epoch, outcome).await? {
                    // Dropping the transaction rolls the append back.
                    return Err(StoreError::LeaseLost {
                        execution: thread.to_owned(),
                    });
                }
            }
            AlsoWritten::TurnLeft(ticket) => turn_queue::leave(&tx, thread, ticket).await?,
        }
        tx.commit().await.doing("commit the append")?;
        for (deletions, kept) in to_keep {
            self.referable.put(thread, deletions, kept);
        }
        Ok(seqs)
    }

    pub(super) async fn fork_at(
        &self,
        parent: &str,
        at_seq: u64,
        child: &str,
    ) -> Result<u64, StoreError> {
        let now = epoch_ms(SystemTime::now());
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin a fork")?;
        let last = tx
            .query_opt(
                "SELECT last_seq FROM threads WHERE id = $1 FOR UPDATE",
                &[&parent],
            )
            .await
            .doing("lock the parent")?;
        let plan = ForkPlan::new(parent, at_seq, last.map(|row| row.get(0)))?;
        let (bytes, message_bytes) = plan.sizes(sizes_through(&tx, parent, at_seq).await?);
        let created = tx
            .execute(
                "INSERT INTO threads
                     (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes)
                 VALUES ($1, $2, $3, $4, $5, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
                &[
                    &child,
                    &parent,
                    &db_seq(at_seq),
                    &db_seq(plan.seq),
                    &now,
                    &db_bytes(bytes),
                    &db_bytes(message_bytes),
                ],
            )
            .await
            .doing("create the fork")?;
        if created == 0 {
            return Err(StoreError::AlreadyExists {
                thread: child.to_string(),
            });
        }
        tx.execute(
            "INSERT INTO events (thread_id, seq, kind, body, tokens, idempotency_key, created_at)
             VALUES ($1, $2, 'forked', $3, NULL, NULL, $4)",
            &[&child, &db_seq(plan.seq), &plan.body, &now],
        )
        .await
        .doing("record the fork")?;
        tx.commit().await.doing("commit the fork")?;
        Ok(plan.seq)
    }

    pub(super) async fn delete_unforked(&self, thread: &str) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await.doing("begin a delete")?;
        tx.query_opt("SELECT 1 FROM threads WHERE id = $1 FOR UPDATE", &[&thread])
            .await
            .doing("lock the thread")?
            .ok_or_else(|| StoreError::NotFound {
                thread: thread.to_string(),
            })?;
        let forks: Vec<String> = tx
            .query(
                "SELECT id FROM threads WHERE parent_id = $1 ORDER BY id",
                &[&thread],
            )
            .await
            .doing("list forks")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if !forks.is_empty() {
            return Err(StoreError::HasForks {
                thread: thread.to_string(),
                forks,
            });
        }
        delete_thread(&tx, thread).await?;
        tx.commit().await.doing("commit the delete")
    }

    pub(super) async fn observe(
        &self,
        model: &str,
        observation: Observation,
    ) -> Result<Calibration, StoreError> {
        let now = epoch_ms(SystemTime::now());
        let mut client = self.pool.get().await?;
        let tx = client
            .transaction()
            .await
            .doing("begin a calibration update")?;
        // The row exists (empty) before it is locked, so two first observations of a model
        // serialize on it like any later ones.
        tx.execute(
            "INSERT INTO model_calibrations (model, calibration, updated_at)
             VALUES ($1, $2, $3) ON CONFLICT (model) DO NOTHING",
            &[
                &model,
                &calibration::to_stored(&Calibration::default()),
                &now,
            ],
        )
        .await
        .doing("create a calibration")?;
        let row = tx
            .query_one(
                "SELECT calibration FROM model_calibrations WHERE model = $1 FOR UPDATE",
                &[&model],
            )
            .await
            .doing("lock a calibration")?;
        let mut current = calibration::from_stored(model, row.get(0))?;
        current.observe(observation);
        tx.execute(
            "UPDATE model_calibrations SET calibration = $2, updated_at = $3 WHERE model = $1",
            &[&model, &calibration::to_stored(&current), &now],
        )
        .await
        .doing("store a calibration")?;
        tx.commit().await.doing("commit a calibration")?;
        Ok(current)
    }
}
