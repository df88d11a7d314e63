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
use crate::record::{self, db_seq, seq_of};
use crate::tail::{TailStart, fold_sparse, watermark_of};
use crate::{EventOutline, KeyedEvent, ProjectionTail, RecentCursor, StoreError, ThreadInfo};

/// The segments to read for `thread`, root first (see the SQLite store).
pub(super) async fn chain(
    client: &impl GenericClient,
    thread: &str,
) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    let mut walk = ForkChain::new(thread);
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
/// A request record's references are left unresolved (see [`record::decode`]): the reads
/// that use this fold projections, which need no record's messages.
pub(super) async fn events_in(
    tx: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
) -> Result<Vec<Event>, StoreError> {
    decoded_in(tx, thread, segments, select, after, record::decode).await
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

/// The projection of `thread` read from its end (see [`Store::load_projection_tail`]), in
/// one snapshot: the events other than ordinary messages, then the ordinary messages after
/// the active context's anchor, from where their stored counts under `encoding`, added up
/// from the newest, pass `tokens` (all of them without `tail`).
pub(super) async fn read_projection_tail(
    store: &PgStore,
    thread: &str,
    tail: Option<(Encoding, u64)>,
) -> Result<ProjectionTail, StoreError> {
    let mut client = store.pool.get().await?;
    let tx = snapshot(&mut client).await?;
    let segments = chain(&tx, thread).await?;
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0).await?;
    let watermark = watermark_of(&special);
    let (start, unread) = match tail {
        Some((encoding, tokens)) => {
            tail_start(&tx, thread, &segments, watermark, encoding, tokens).await?
        }
        None => (1, 0),
    };
    let skipped_through = start.saturating_sub(1).max(watermark);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, skipped_through).await?;
    tx.commit().await.doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, skipped_through)?;
    Ok(ProjectionTail::from_fold(&fold, unread))
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
