//! The PostgreSQL store's reads, each in one snapshot: a thread's events along its fork
//! chain, its projection (whole, or read from its end), a keyed event, the thread list and
//! the stored calibrations.

use contexture_core::calibration::Calibration;
use contexture_core::thread::Event;
use contexture_core::tokens::Encoding;
use deadpool_postgres::GenericClient;
use tokio_postgres::IsolationLevel;

use super::PgStore;
use super::references;
use crate::calibration;
use crate::error::Action;
use crate::forks::ForkChain;
use crate::projection_cache;
use crate::record::{self, db_seq, seq_of};
use crate::tail::{TailStart, fold_sparse, watermark_of};
use crate::{EventOutline, KeyedEvent, ProjectionTail, RecentCursor, StoreError, ThreadInfo};

/// The segments to read for `thread`, root first (see the SQLite store).
pub(super) async fn chain(
    client: &impl GenericClient,
    thread: &str,
) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    walk_chain(client, ForkChain::new(thread)).await
}

/// The rest of `walk`, read a link at a time.
async fn walk_chain(
    client: &impl GenericClient,
    mut walk: ForkChain,
) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    loop {
        let link = client
            .query_opt(
                "SELECT parent_id, fork_seq FROM threads WHERE id = $1",
                &[&walk.current()],
            )
            .await
            .doing("read the thread")?
            .map(|row| (row.get(0), row.get(1)));
        if !walk.step(link)? {
            return Ok(walk.segments());
        }
    }
}

/// Every event of a segment: `$1` the segment's thread, `$2` its last seq to read, `$3` the
/// seq to read after.
pub(super) const ALL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 ORDER BY seq";

/// The events other than ordinary messages (through the `events_special` index);
/// parameters as for [`ALL_EVENTS`].
pub(super) const SPECIAL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND ordinary_message IS NULL
     ORDER BY seq";

/// The ordinary messages; parameters as for [`ALL_EVENTS`].
pub(super) const ORDINARY_MESSAGES: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND ordinary_message = 1
     ORDER BY seq";

/// The events `select` (one of [`ALL_EVENTS`], [`SPECIAL_EVENTS`], [`ORDINARY_MESSAGES`])
/// finds in `segments` (of `thread`'s chain) with seq above `after`, in order.
///
/// Decoded for a fold (see [`record::decode_for_fold`]): the reads that use this fold
/// projections, which need no record's messages and no end's reply.
pub(super) async fn events_in(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
) -> Result<Vec<Event>, StoreError> {
    decoded_in(tx, thread, segments, select, after, record::decode_for_fold).await
}

/// The rows `select` finds (as for [`events_in`]), each decoded by `decode`.
pub(super) async fn decoded_in<T>(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
    decode: impl Fn(&str, u64, &str, &str, Option<&str>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let select = tx
        .prepare_cached(select)
        .await
        .doing("prepare the event query")?;
    let mut events = Vec::new();
    for (id, limit) in segments {
        let rows = tx
            .query(
                &select,
                &[id, &limit.map_or(i64::MAX, db_seq), &db_seq(after)],
            )
            .await
            .doing("query events")?;
        events.reserve(rows.len());
        for row in rows {
            let seq = seq_of(thread, row.get(0))?;
            events.push(decode(thread, seq, row.get(1), row.get(2), row.get(3))?);
        }
    }
    Ok(events)
}

/// A read-only transaction that sees one snapshot of the database (repeatable read).
pub(super) async fn snapshot(
    client: &mut deadpool_postgres::Client,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .doing("begin a read")
}

/// The projection of `thread`, whole (`tail` `None`) or read from its end (see
/// [`Store::load_projection_tail`]).
///
/// A fold of it kept in the store's cache from an earlier read is brought up to date with
/// the events after it, read in one statement with the thread's last seq and the deletion
/// count (see [`crate::projection_cache`]): one round trip. Otherwise it is read in one
/// snapshot: the events other than ordinary messages, then the ordinary messages after the
/// active context's anchor; a thread short enough to keep is read whole and kept, a longer
/// one only from where the stored counts of its newest messages under the encoding, added
/// up, pass the tokens asked for (a partial fold is never kept).
pub(super) async fn read_projection_tail(
    store: &PgStore,
    thread: &str,
    tail: Option<(Encoding, u64)>,
) -> Result<ProjectionTail, StoreError> {
    if let Some(kept_through) = store.projections.kept_through(thread)
        && let Some(whole) = read_from_kept(store, thread, kept_through).await?
    {
        return Ok(whole);
    }
    let mut client = store.pool.get().await?;
    let tx = snapshot(&mut client).await?;
    let (segments, state) = chain_with_state(&tx, thread).await?;
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0).await?;
    let watermark = watermark_of(&special);
    let keep = state.last_seq <= projection_cache::MAX_EVENTS_PER_FOLD;
    let (start, unread) = match tail {
        Some((encoding, tokens)) if !keep => {
            tail_start(&tx, thread, &segments, watermark, encoding, tokens).await?
        }
        _ => (1, 0),
    };
    let skipped_through = start.saturating_sub(1).max(watermark);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, skipped_through).await?;
    tx.commit().await.doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, skipped_through)?;
    let read = ProjectionTail::from_fold(&fold, unread);
    if keep {
        // Read whole (`start` 1, nothing unread): the fold can serve the next read.
        store.projections.put(thread, state.deletions, fold);
    }
    Ok(read)
}

/// A thread's last seq and the database's deletion count, read with the first link of its
/// fork chain.
struct ThreadState {
    last_seq: u64,
    deletions: i64,
}

/// [`chain`], whose first query also reads the thread's [`ThreadState`] in the same
/// snapshot.
async fn chain_with_state(
    client: &impl GenericClient,
    thread: &str,
) -> Result<(Vec<(String, Option<u64>)>, ThreadState), StoreError> {
    let first = client
        .prepare_cached(
            "SELECT t.parent_id, t.fork_seq, t.last_seq, d.count
             FROM threads t, deletions d WHERE t.id = $1 AND d.id = 1",
        )
        .await
        .doing("prepare the thread's state query")?;
    let row = client
        .query_opt(&first, &[&thread])
        .await
        .doing("read the thread")?;
    let Some(row) = row else {
        return Err(StoreError::NotFound {
            thread: thread.to_owned(),
        });
    };
    let state = ThreadState {
        last_seq: seq_of(thread, row.get(2))?,
        deletions: row.get(3),
    };
    let mut walk = ForkChain::new(thread);
    if !walk.step(Some((row.get(0), row.get(1))))? {
        return Ok((walk.segments(), state));
    }
    Ok((walk_chain(client, walk).await?, state))
}

/// The projection of `thread` from the fold of it the cache keeps through seq
/// `kept_through`, brought up to date in one statement (one snapshot): the thread's last
/// seq, the deletion count, and the events after the fold. `None` when the fold cannot be
/// used (a delete since, another reader holding it, a thread gone): the caller reads in
/// full.
async fn read_from_kept(
    store: &PgStore,
    thread: &str,
    kept_through: u64,
) -> Result<Option<ProjectionTail>, StoreError> {
    let client = store.pool.get().await?;
    // The events after a fold are the thread's own (not its fork parent's): a fork's own
    // events start right after its fork seq, and a fold of a fork holds at least the fork's
    // first event. The fork seq is read to hold to that.
    let select = client
        .prepare_cached(
            "SELECT d.count, t.last_seq, t.fork_seq, e.seq, e.kind, e.body, e.tokens
             FROM deletions d
             JOIN threads t ON t.id = $1
             LEFT JOIN events e ON e.thread_id = t.id AND e.seq > $2 AND e.seq <= t.last_seq
             WHERE d.id = 1",
        )
        .await
        .doing("prepare the read of a kept projection")?;
    let mut rows = client
        .query(&select, &[&thread, &db_seq(kept_through)])
        .await
        .doing("read the events after a kept projection")?;
    // Put in order here rather than by the statement: a sort in the database costs it more
    // than the handful of rows a kept fold lacks costs the server.
    rows.sort_by_key(|row| row.get::<_, Option<i64>>(3));
    let Some(first) = rows.first() else {
        // No such thread (deleted since it was kept): nothing to keep of it.
        store.projections.forget(thread);
        return Ok(None);
    };
    let deletions: i64 = first.get(0);
    let last_seq = seq_of(thread, first.get(1))?;
    let fork_seq: Option<i64> = first.get(2);
    if fork_seq.is_some_and(|fork_seq| db_seq(kept_through) <= fork_seq) {
        return Ok(None);
    }
    let Some(mut fold) = store.projections.take(thread, deletions, last_seq) else {
        return Ok(None);
    };
    if fold.last_seq() < kept_through {
        // Replaced meanwhile by an older read's fold: the events read do not reach it.
        return Ok(None);
    }
    for row in &rows {
        let Some(seq) = row.get::<_, Option<i64>>(3) else {
            continue;
        };
        let seq = seq_of(thread, seq)?;
        if seq <= fold.last_seq() {
            continue;
        }
        let event = record::decode(thread, seq, row.get(4), row.get(5), row.get(6))?;
        fold.apply(event).map_err(|source| StoreError::Replay {
            thread: thread.to_string(),
            source,
        })?;
    }
    let whole = ProjectionTail::from_fold(&fold, 0);
    store.projections.put(thread, deletions, fold);
    Ok(Some(whole))
}

/// Where the tail of `thread`'s ordinary messages after `watermark` starts (see
/// [`TailStart`]), read newest first a page of seqs and counts at a time, and how many older
/// messages are left unread; (1, 0) when every message is needed.
pub(super) async fn tail_start(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    watermark: u64,
    encoding: Encoding,
    tokens: u64,
) -> Result<(u64, usize), StoreError> {
    const PAGE: i64 = 512;
    let mut tail = TailStart::new(encoding, tokens);
    'segments: for (id, limit) in segments.iter().rev() {
        let mut below = limit.map_or(i64::MAX, |limit| db_seq(limit).saturating_add(1));
        loop {
            let rows = tx
                .query(
                    "SELECT seq, tokens FROM events
                     WHERE thread_id = $1 AND seq < $2 AND seq > $3 AND ordinary_message = 1
                     ORDER BY seq DESC LIMIT $4",
                    &[id, &below, &db_seq(watermark), &PAGE],
                )
                .await
                .doing("read the tail")?;
            let page = rows.len();
            for row in rows {
                let seq: i64 = row.get(0);
                below = seq;
                if tail.add(seq_of(thread, seq)?, row.get(1)) {
                    break 'segments;
                }
            }
            if page < PAGE as usize {
                break;
            }
        }
    }
    let Some(start) = tail.start() else {
        return Ok((1, 0));
    };
    let mut unread: i64 = 0;
    for (id, limit) in segments {
        unread += tx
            .query_one(
                "SELECT count(*) FROM events
                 WHERE thread_id = $1 AND seq <= $2 AND seq > $3 AND seq < $4
                   AND ordinary_message = 1",
                &[
                    id,
                    &limit.map_or(i64::MAX, db_seq),
                    &db_seq(watermark),
                    &db_seq(start),
                ],
            )
            .await
            .doing("count the unread messages")?
            .get::<_, i64>(0);
    }
    Ok((start, usize::try_from(unread).unwrap_or(usize::MAX)))
}

/// The columns a [`ThreadInfo`] is read from, in the order [`thread_info`] reads them, of
/// the threads table (or a page of it) named `t`; the last says whether the thread is an
/// execution's log. Its first event is found through the events' primary key, one lookup
/// for each thread read.
macro_rules! thread_columns {
    () => {
        "t.id, t.parent_id, t.fork_seq, t.last_seq, t.created_at, t.updated_at, t.bytes,
         t.message_bytes, t.retention,
         t.parent_id IS NULL AND EXISTS (
             SELECT 1 FROM events e
             WHERE e.thread_id = t.id AND e.seq = 1 AND e.kind = 'run_started')"
    };
}

/// The summary a row of [`thread_columns`] gives.
fn thread_info(row: &tokio_postgres::Row) -> Result<ThreadInfo, StoreError> {
    let id: String = row.get(0);
    let retention: Option<String> = row.get(8);
    Ok(ThreadInfo {
        retention: crate::retention::parse_stored(&id, retention.as_deref())?,
        parent: row.get(1),
        fork_seq: row
            .get::<_, Option<i64>>(2)
            .map(|s| seq_of(&id, s))
            .transpose()?,
        last_seq: seq_of(&id, row.get(3))?,
        created_at_ms: row.get(4),
        updated_at_ms: row.get(5),
        bytes: u64::try_from(row.get::<_, i64>(6)).unwrap_or(0),
        message_bytes: u64::try_from(row.get::<_, i64>(7)).unwrap_or(0),
        execution: row.get(9),
        id,
    })
}

impl PgStore {
    pub(super) async fn read_keyed_event(
        &self,
        thread: &str,
        key: &str,
    ) -> Result<Option<KeyedEvent>, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = snapshot(&mut client).await?;
        let select = tx
            .prepare_cached(
                "SELECT seq, kind, body, tokens, created_at FROM events
                 WHERE thread_id = $1 AND idempotency_key = $2",
            )
            .await
            .doing("prepare the idempotency lookup")?;
        let Some(row) = tx
            .query_opt(&select, &[&thread, &key])
            .await
            .doing("look up the idempotency key")?
        else {
            return Ok(None);
        };
        let seq = seq_of(thread, row.get(0))?;
        let decoded = record::decode_row(thread, seq, row.get(1), row.get(2), row.get(3))?;
        let segments = chain(&tx, thread).await?;
        let mut events =
            references::resolve(&tx, thread, &segments, vec![decoded], seq - 1).await?;
        tx.commit().await.doing("end the read")?;
        Ok(events.pop().map(|event| KeyedEvent {
            event,
            appended_at_ms: row.get(4),
        }))
    }

    pub(super) async fn thread_exists(&self, thread: &str) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt("SELECT 1 FROM threads WHERE id = $1", &[&thread])
            .await
            .doing("read the thread")?;
        Ok(row.is_some())
    }

    pub(super) async fn read_events_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = snapshot(&mut client).await?;
        let segments = chain(&tx, thread).await?;
        let rows = decoded_in(
            &tx,
            thread,
            &record::segments_through(&segments, through),
            ALL_EVENTS,
            after,
            record::decode_row,
        )
        .await?;
        let events = references::resolve(&tx, thread, &segments, rows, after).await?;
        tx.commit().await.doing("end the read")?;
        Ok(events)
    }

    pub(super) async fn read_outlines_through(
        &self,
        thread: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<EventOutline>, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = snapshot(&mut client).await?;
        let segments = chain(&tx, thread).await?;
        let sql = format!(
            "SELECT seq, kind, CASE WHEN kind IN ({}) THEN body END FROM events
             WHERE thread_id = $1 AND seq <= $2 AND seq > $3 ORDER BY seq",
            record::OUTLINED_BODIES
        );
        let select = tx
            .prepare_cached(&sql)
            .await
            .doing("prepare the outline query")?;
        let mut outlines = Vec::new();
        for (id, limit) in record::segments_through(&segments, through) {
            let rows = tx
                .query(
                    &select,
                    &[&id, &limit.map_or(i64::MAX, db_seq), &db_seq(after)],
                )
                .await
                .doing("query event outlines")?;
            outlines.reserve(rows.len());
            for row in rows {
                let seq = seq_of(thread, row.get(0))?;
                let kind: &str = row.get(1);
                let body: Option<&str> = row.get(2);
                outlines.push(record::outline(thread, seq, kind, body)?);
            }
        }
        tx.commit().await.doing("end the read")?;
        Ok(outlines)
    }

    pub(super) async fn read_list_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let client = self.pool.get().await?;
        let end = crate::prefix_end(prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Byte order (the "C" collation), whatever the database's collation, so that a prefix
        // is one range and pages follow each other. The page is chosen before its threads'
        // first events are looked up, so that the lookups are made for its threads only.
        let rows = client
            .query(
                concat!(
                    "SELECT ",
                    thread_columns!(),
                    r#" FROM (SELECT id, parent_id, fork_seq, last_seq, created_at, updated_at,
                                     bytes, message_bytes, retention
                              FROM threads
                              WHERE id COLLATE "C" >= $1 AND id COLLATE "C" > $2
                                AND ($3::text IS NULL OR id COLLATE "C" < $3)
                              ORDER BY id COLLATE "C" LIMIT $4) t
                        ORDER BY t.id COLLATE "C""#
                ),
                &[&prefix, &after, &end, &limit],
            )
            .await
            .doing("list threads")?;
        rows.iter().map(thread_info).collect()
    }

    /// The page of threads [`Store::list_recent`] describes, chosen before its threads'
    /// first events are looked up (as for [`PgStore::read_list_page`]).
    pub(super) async fn read_list_recent(
        &self,
        prefix: &str,
        contains: &str,
        before: Option<&RecentCursor>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let client = self.pool.get().await?;
        let end = crate::prefix_end(prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let contains = crate::ascii_folded(contains);
        let past_prefix = i32::try_from(crate::past_prefix(prefix)).unwrap_or(i32::MAX);
        // `translate` folds ASCII letters only, whatever the database's locale (`lower`
        // would fold others too, unlike the SQLite store); `strpos` takes `contains` as it
        // is, wildcards and all. The cursor is a row value in the `threads_recent` index's
        // collation, so that the index starts right after it.
        let cursor = if before.is_some() {
            r#"AND (updated_at, id COLLATE "C") < ($6::bigint, $7::text)"#
        } else {
            ""
        };
        let sql = format!(
            r#"SELECT {columns}
               FROM (SELECT id, parent_id, fork_seq, last_seq, created_at, updated_at,
                            bytes, message_bytes, retention
                     FROM threads
                     WHERE id COLLATE "C" >= $1 AND ($2::text IS NULL OR id COLLATE "C" < $2)
                       AND ($4::text = '' OR strpos(translate(substr(id, $3::int),
                               'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
                               $4::text) > 0)
                       {cursor}
                     ORDER BY updated_at DESC, id COLLATE "C" DESC LIMIT $5) t
               ORDER BY t.updated_at DESC, t.id COLLATE "C" DESC"#,
            columns = thread_columns!(),
        );
        let rows = match before {
            Some(cursor) => {
                client
                    .query(
                        &sql,
                        &[
                            &prefix,
                            &end,
                            &past_prefix,
                            &contains,
                            &limit,
                            &cursor.updated_at_ms,
                            &cursor.id,
                        ],
                    )
                    .await
            }
            None => {
                client
                    .query(&sql, &[&prefix, &end, &past_prefix, &contains, &limit])
                    .await
            }
        }
        .doing("list recent threads")?;
        rows.iter().map(thread_info).collect()
    }

    /// The forks of `thread`, oldest first ([`Store::forks_of`]), in one query: the thread
    /// itself is the outer row, so that a thread without forks (one row of NULLs) is told
    /// apart from one that does not exist (no row).
    pub(super) async fn read_forks_of(&self, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        let client = self.pool.get().await?;
        // A fork is never an execution's log: its own first event is the fork's, so the
        // execution column is plain false.
        let rows = client
            .query(
                r#"SELECT t.id, t.parent_id, t.fork_seq, t.last_seq, t.created_at, t.updated_at,
                          t.bytes, t.message_bytes, t.retention, false
                   FROM threads p LEFT JOIN threads t ON t.parent_id = p.id
                   WHERE p.id = $1 ORDER BY t.created_at, t.id COLLATE "C""#,
                &[&thread],
            )
            .await
            .doing("list forks")?;
        if rows.is_empty() {
            return Err(StoreError::NotFound {
                thread: thread.to_owned(),
            });
        }
        rows.iter()
            .filter(|row| row.get::<_, Option<&str>>(0).is_some())
            .map(thread_info)
            .collect()
    }

    pub(super) async fn read_calibration(
        &self,
        model: &str,
    ) -> Result<Option<Calibration>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT calibration FROM model_calibrations WHERE model = $1",
                &[&model],
            )
            .await
            .doing("read a calibration")?;
        row.map(|row| calibration::from_stored(model, row.get(0)))
            .transpose()
    }
}
