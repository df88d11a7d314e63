//! The SQLite store's reads: a thread's events along its fork chain, its projection (whole,
//! or read from its end), its forks, the thread list (by id or newest first) and the stored
//! calibrations.

use contexture_core::calibration::Calibration;
use contexture_core::thread::Event;
use contexture_core::tokens::Encoding;
use rusqlite::{Connection, OptionalExtension, params};

use super::references;
use crate::calibration;
use crate::error::Action;
use crate::forks::ForkChain;
use crate::projection_cache::{self, ProjectionCache};
use crate::record::{self, db_seq, seq_of};
use crate::tail::{TailStart, fold_sparse, watermark_of};
use crate::{EventOutline, KeyedEvent, ProjectionTail, RecentCursor, StoreError, ThreadInfo};

/// The calibration stored for `model`, if any.
pub(super) fn stored_calibration(
    conn: &Connection,
    model: &str,
) -> Result<Option<Calibration>, StoreError> {
    let text: Option<String> = conn
        .prepare_cached("SELECT calibration FROM model_calibrations WHERE model = ?1")
        .doing("prepare the calibration query")?
        .query_row(params![model], |row| row.get(0))
        .optional()
        .doing("read a calibration")?;
    text.map(|text| calibration::from_stored(model, &text))
        .transpose()
}

/// The segments to read for `thread`, root first: each thread with the last seq to read
/// from it (`None`: all of its own events).
pub(super) fn chain(
    conn: &Connection,
    thread: &str,
) -> Result<Vec<(String, Option<u64>)>, StoreError> {
    let mut walk = ForkChain::new(thread);
    loop {
        let link: Option<(Option<String>, Option<i64>)> = conn
            .prepare_cached("SELECT parent_id, fork_seq FROM threads WHERE id = ?1")
            .doing("prepare the thread query")?
            .query_row([walk.current()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .doing("read the thread")?;
        if !walk.step(link)? {
            return Ok(walk.segments());
        }
    }
}

/// The events of `thread` (its fork chain's shared prefix included) with seq above `after`.
pub(super) fn read_events(
    conn: &mut Connection,
    thread: &str,
    after: u64,
    through: u64,
) -> Result<Vec<Event>, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let segments = chain(&tx, thread)?;
    let rows = decoded_in(
        &tx,
        thread,
        &record::segments_through(&segments, through),
        ALL_EVENTS,
        after,
        record::decode_row,
    )?;
    let events = references::resolve(&tx, thread, &segments, rows, after)?;
    tx.commit().doing("end the read")?;
    Ok(events)
}

/// The outlines of `thread`'s events (its fork chain's shared prefix included) with seq
/// above `after` and at most `through` (see [`record::outline`]): only a request's record
/// or end has its body read.
pub(super) fn read_outlines(
    conn: &mut Connection,
    thread: &str,
    after: u64,
    through: u64,
) -> Result<Vec<EventOutline>, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let segments = chain(&tx, thread)?;
    let sql = format!(
        "SELECT seq, kind, CASE WHEN kind IN ({}) THEN body END FROM events
         WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 ORDER BY seq",
        record::OUTLINED_BODIES
    );
    let mut select = tx.prepare_cached(&sql).doing("prepare the outline query")?;
    let mut outlines = Vec::new();
    for (id, limit) in record::segments_through(&segments, through) {
        let mut rows = select
            .query(params![id, limit.map_or(i64::MAX, db_seq), db_seq(after)])
            .doing("query event outlines")?;
        while let Some(row) = rows.next().doing("read an event outline")? {
            let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
            let kind = row
                .get_ref(1)
                .and_then(|v| Ok(v.as_str()?))
                .doing("read a kind")?;
            let body = row
                .get_ref(2)
                .and_then(|v| Ok(v.as_str_or_null()?))
                .doing("read a body")?;
            outlines.push(record::outline(thread, seq, kind, body)?);
        }
    }
    drop(select);
    tx.commit().doing("end the read")?;
    Ok(outlines)
}

/// Every event of a segment: `?1` the segment's thread, `?2` its last seq to read, `?3`
/// the seq to read after.
pub(super) const ALL_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 ORDER BY seq";

/// The events other than ordinary messages, through the `events_special` index (the
/// messages are not even scanned); parameters as for [`ALL_EVENTS`].
pub(super) const SPECIAL_EVENTS: &str =
    "SELECT seq, kind, body, tokens FROM events INDEXED BY events_special
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message IS NULL
     ORDER BY seq";

/// The ordinary messages; parameters as for [`ALL_EVENTS`].
pub(super) const ORDINARY_MESSAGES: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message = 1
     ORDER BY seq";

/// The events `select` (one of [`ALL_EVENTS`], [`SPECIAL_EVENTS`], [`ORDINARY_MESSAGES`])
/// finds in `segments` (of `thread`'s chain) with seq above `after`, in order.
///
/// Decoded for a fold (see [`record::decode_for_fold`]): the reads that use this fold
/// projections, which need no record's messages and no end's reply.
pub(super) fn events_in(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
) -> Result<Vec<Event>, StoreError> {
    decoded_in(tx, thread, segments, select, after, record::decode_for_fold)
}

/// The rows `select` finds (as for [`events_in`]), each decoded by `decode`.
pub(super) fn decoded_in<T>(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    after: u64,
    decode: impl Fn(&str, u64, &str, &str, Option<&str>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut select = tx.prepare_cached(select).doing("prepare the event query")?;
    let mut events = Vec::new();
    for (id, limit) in segments {
        let mut rows = select
            .query(params![id, limit.map_or(i64::MAX, db_seq), db_seq(after)])
            .doing("query events")?;
        while let Some(row) = rows.next().doing("read an event")? {
            let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
            let text = |index: usize| row.get_ref(index).and_then(|v| Ok(v.as_str()?));
            let kind = text(1).doing("read a kind")?;
            let body = text(2).doing("read a body")?;
            let tokens = row
                .get_ref(3)
                .and_then(|v| Ok(v.as_str_or_null()?))
                .doing("read token counts")?;
            events.push(decode(thread, seq, kind, body, tokens)?);
        }
    }
    Ok(events)
}

/// The projection of `thread`'s active context, decoding only what can reach it: first the
/// events other than ordinary messages (found through the `events_special` index, so the
/// messages are not even scanned), then the ordinary messages after the active context's
/// anchor (see [`contexture_core::thread::projection_watermark`]). Seqs are gap-free, so
/// every seq that is neither is an ordinary message the anchor covers.
///
/// A fold kept in `cache` from an earlier read is brought up to date with the events after
/// it instead (see [`projection_cache`]); the fold read here is kept for the next read.
pub(super) fn read_projection(
    conn: &mut Connection,
    thread: &str,
    cache: &ProjectionCache,
) -> Result<ProjectionTail, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let segments = chain(&tx, thread)?;
    let (last_seq, deletions): (i64, i64) = tx
        .prepare_cached(
            "SELECT t.last_seq, d.count FROM threads t, deletions d WHERE t.id = ?1 AND d.id = 1",
        )
        .doing("prepare the thread's state query")?
        .query_row([thread], |r| Ok((r.get(0)?, r.get(1)?)))
        .doing("read the thread's last seq")?;
    let last_seq = seq_of(thread, last_seq)?;
    let replay_error = |source| StoreError::Replay {
        thread: thread.to_string(),
        source,
    };
    if let Some(mut fold) = cache.take(thread, deletions, last_seq) {
        for event in events_in(&tx, thread, &segments, ALL_EVENTS, fold.last_seq())? {
            fold.apply(event).map_err(replay_error)?;
        }
        tx.commit().doing("end the read")?;
        let whole = ProjectionTail::from_fold(&fold, 0);
        cache.put(thread, deletions, fold);
        return Ok(whole);
    }
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0)?;
    let watermark = watermark_of(&special);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, watermark)?;
    tx.commit().doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, watermark)?;
    let whole = ProjectionTail::from_fold(&fold, 0);
    cache.put(thread, deletions, fold);
    Ok(whole)
}

/// The projection of `thread` read from its end (see [`Store::load_projection_tail`]): a
/// thread whose fold is kept, or that is short enough to keep, is read whole (and kept);
/// a longer one decodes its special events, then only the ordinary messages from where
/// their stored token counts, added up from the newest, pass `tokens`. A partial fold is
/// never kept: the cache holds whole projections only.
pub(super) fn read_projection_tail(
    conn: &mut Connection,
    thread: &str,
    cache: &ProjectionCache,
    encoding: Encoding,
    tokens: u64,
) -> Result<ProjectionTail, StoreError> {
    let whole = |conn: &mut Connection| read_projection(conn, thread, cache);
    if cache.holds(thread) {
        return whole(conn);
    }
    let tx = conn.transaction().doing("begin a read")?;
    let last_seq: Option<i64> = tx
        .prepare_cached("SELECT last_seq FROM threads WHERE id = ?1")
        .doing("prepare the thread's state query")?
        .query_row([thread], |r| r.get(0))
        .optional()
        .doing("read the thread's last seq")?;
    if last_seq.is_none_or(|last| last <= db_seq(projection_cache::MAX_EVENTS_PER_FOLD)) {
        drop(tx);
        return whole(conn);
    }
    let segments = chain(&tx, thread)?;
    let special = events_in(&tx, thread, &segments, SPECIAL_EVENTS, 0)?;
    let watermark = watermark_of(&special);
    let (start, unread) = tail_start(&tx, thread, &segments, watermark, encoding, tokens)?;
    let unread_below = start.saturating_sub(1).max(watermark);
    let messages = events_in(&tx, thread, &segments, ORDINARY_MESSAGES, unread_below)?;
    tx.commit().doing("end the read")?;
    let fold = fold_sparse(thread, special, messages, unread_below)?;
    Ok(ProjectionTail::from_fold(&fold, unread))
}

/// Where the tail of `thread`'s ordinary messages after `watermark` starts: the seq of the
/// oldest message to read, the newest ones' stored counts under `encoding` passing `tokens`
/// from there (1: read them all), and how many older ones are left unread. Only seqs and
/// counts are read, newest first, and the reading stops there.
pub(super) fn tail_start(
    tx: &Connection,
    thread: &str,
    segments: &[(String, Option<u64>)],
    watermark: u64,
    encoding: Encoding,
    tokens: u64,
) -> Result<(u64, usize), StoreError> {
    let mut newest_first = tx
        .prepare_cached(
            "SELECT seq, tokens FROM events
             WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND ordinary_message = 1
             ORDER BY seq DESC",
        )
        .doing("prepare the tail query")?;
    let mut tail = TailStart::new(encoding, tokens);
    'segments: for (id, limit) in segments.iter().rev() {
        let mut rows = newest_first
            .query(params![
                id,
                limit.map_or(i64::MAX, db_seq),
                db_seq(watermark)
            ])
            .doing("read the tail")?;
        while let Some(row) = rows.next().doing("read a message's count")? {
            let seq = seq_of(thread, row.get(0).doing("read a seq")?)?;
            let stored = row
                .get_ref(1)
                .and_then(|v| Ok(v.as_str_or_null()?))
                .doing("read token counts")?;
            if tail.add(seq, stored) {
                break 'segments;
            }
        }
    }
    let Some(start) = tail.start() else {
        return Ok((1, 0));
    };
    let mut count = tx
        .prepare_cached(
            "SELECT count(*) FROM events
             WHERE thread_id = ?1 AND seq <= ?2 AND seq > ?3 AND seq < ?4 AND ordinary_message = 1",
        )
        .doing("prepare the unread count")?;
    let mut unread: i64 = 0;
    for (id, limit) in segments {
        unread += count
            .query_row(
                params![
                    id,
                    limit.map_or(i64::MAX, db_seq),
                    db_seq(watermark),
                    db_seq(start)
                ],
                |r| r.get::<_, i64>(0),
            )
            .doing("count the unread messages")?;
    }
    Ok((start, usize::try_from(unread).unwrap_or(usize::MAX)))
}

pub(super) fn forks_of(conn: &Connection, thread: &str) -> Result<Vec<String>, StoreError> {
    let mut select = conn
        .prepare_cached("SELECT id FROM threads WHERE parent_id = ?1 ORDER BY id")
        .doing("prepare the fork query")?;
    let forks = select
        .query_map([thread], |r| r.get(0))
        .doing("list forks")?
        .collect::<Result<Vec<String>, _>>()
        .doing("read a fork id")?;
    Ok(forks)
}

/// The events whose idempotency key is `key`, with its request record's references resolved.
pub(super) fn keyed_event(
    conn: &mut Connection,
    thread: &str,
    key: &str,
) -> Result<Option<KeyedEvent>, StoreError> {
    let tx = conn.transaction().doing("begin a read")?;
    let row = tx
        .prepare_cached(
            "SELECT seq, kind, body, tokens, created_at FROM events
             WHERE thread_id = ?1 AND idempotency_key = ?2",
        )
        .doing("prepare the idempotency lookup")?
        .query_row(params![thread, key], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
            ))
        })
        .optional()
        .doing("look up the idempotency key")?;
    let Some((seq, kind, body, tokens, appended_at_ms)) = row else {
        return Ok(None);
    };
    let seq = seq_of(thread, seq)?;
    let decoded = record::decode_row(thread, seq, &kind, &body, tokens.as_deref())?;
    let segments = chain(&tx, thread)?;
    let mut events = references::resolve(&tx, thread, &segments, vec![decoded], seq - 1)?;
    tx.commit().doing("end the read")?;
    Ok(events.pop().map(|event| KeyedEvent {
        event,
        appended_at_ms,
    }))
}

/// True when `thread` exists.
pub(super) fn exists(conn: &Connection, thread: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT 1 FROM threads WHERE id = ?1")
        .doing("prepare the thread query")?
        .exists([thread])
        .doing("read the thread")
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
fn thread_info(row: &rusqlite::Row<'_>) -> Result<ThreadInfo, StoreError> {
    let id: String = row.get(0).doing("read a thread's id")?;
    let retention: Option<String> = row.get(8).doing("read a thread")?;
    let fork_seq: Option<i64> = row.get(2).doing("read a thread")?;
    let bytes: i64 = row.get(6).doing("read a thread")?;
    let message_bytes: i64 = row.get(7).doing("read a thread")?;
    Ok(ThreadInfo {
        retention: crate::retention::parse_stored(&id, retention.as_deref())?,
        fork_seq: fork_seq.map(|s| seq_of(&id, s)).transpose()?,
        last_seq: seq_of(&id, row.get(3).doing("read a thread")?)?,
        parent: row.get(1).doing("read a thread")?,
        created_at_ms: row.get(4).doing("read a thread")?,
        updated_at_ms: row.get(5).doing("read a thread")?,
        bytes: u64::try_from(bytes).unwrap_or(0),
        message_bytes: u64::try_from(message_bytes).unwrap_or(0),
        execution: row.get(9).doing("read a thread")?,
        id,
    })
}

/// The summaries of every row `rows` holds.
fn thread_infos(mut rows: rusqlite::Rows<'_>) -> Result<Vec<ThreadInfo>, StoreError> {
    let mut infos = Vec::new();
    while let Some(row) = rows.next().doing("read a thread")? {
        infos.push(thread_info(row)?);
    }
    Ok(infos)
}

/// The threads whose ids start with `prefix`, after `after`, `limit` at most, in id order.
pub(super) fn list_page(
    conn: &Connection,
    prefix: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<ThreadInfo>, StoreError> {
    let end = crate::prefix_end(prefix);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // Read in id order from the primary key's index, so the first-event lookups are made
    // for the page's threads only.
    let mut select = conn
        .prepare_cached(concat!(
            "SELECT ",
            thread_columns!(),
            " FROM threads t WHERE t.id >= ?1 AND t.id > ?2 AND (?3 IS NULL OR t.id < ?3)
             ORDER BY t.id LIMIT ?4"
        ))
        .doing("prepare the thread list")?;
    thread_infos(
        select
            .query(params![prefix, after, end, limit])
            .doing("list threads")?,
    )
}

/// The page of threads [`Store::list_recent`] describes. The page is chosen first and its
/// threads' first events looked up after (a materialized page): were the lookups in the
/// query that sorts, they would be made for every thread under the prefix.
pub(super) fn list_recent(
    conn: &Connection,
    prefix: &str,
    contains: &str,
    before: Option<&RecentCursor>,
    limit: usize,
) -> Result<Vec<ThreadInfo>, StoreError> {
    let end = crate::prefix_end(prefix);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let contains = crate::ascii_folded(contains);
    let past_prefix = crate::past_prefix(prefix);
    // `lower` folds ASCII letters only (SQLite built without its ICU extension, as the
    // bundled one is), as the PostgreSQL store does; `instr` takes `contains` as it is,
    // wildcards and all. The cursor is a row value, so that the `threads_recent`
    // index starts right after it; without one the query has no such bound.
    let sql = format!(
        "WITH page AS MATERIALIZED (
             SELECT id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes,
                    message_bytes, retention
             FROM threads
             WHERE id >= ?1 AND (?2 IS NULL OR id < ?2)
               AND (?4 = '' OR instr(lower(substr(id, ?3)), ?4) > 0)
               {}
             ORDER BY updated_at DESC, id DESC LIMIT ?5)
         SELECT {} FROM page t ORDER BY t.updated_at DESC, t.id DESC",
        if before.is_some() {
            "AND (updated_at, id) < (?6, ?7)"
        } else {
            ""
        },
        thread_columns!(),
    );
    let mut select = conn
        .prepare_cached(&sql)
        .doing("prepare the recent threads' list")?;
    let rows = match before {
        Some(cursor) => select.query(params![
            prefix,
            end,
            past_prefix,
            contains,
            limit,
            cursor.updated_at_ms,
            cursor.id
        ]),
        None => select.query(params![prefix, end, past_prefix, contains, limit]),
    }
    .doing("list recent threads")?;
    thread_infos(rows)
}

/// The forks of `thread`, oldest first ([`Store::forks_of`]), in one query: the thread
/// itself is the outer row, so that a thread without forks (one row of NULLs) is told apart
/// from one that does not exist (no row).
pub(super) fn fork_infos(conn: &Connection, thread: &str) -> Result<Vec<ThreadInfo>, StoreError> {
    // A fork is never an execution's log: its own first event is the fork's, so the
    // execution column is plain false.
    let mut select = conn
        .prepare_cached(
            "SELECT t.id, t.parent_id, t.fork_seq, t.last_seq, t.created_at, t.updated_at,
                    t.bytes, t.message_bytes, t.retention, 0
             FROM threads p LEFT JOIN threads t ON t.parent_id = p.id
             WHERE p.id = ?1 ORDER BY t.created_at, t.id",
        )
        .doing("prepare the fork list")?;
    let mut rows = select.query([thread]).doing("list forks")?;
    let mut forks = Vec::new();
    let mut found = false;
    while let Some(row) = rows.next().doing("read a fork")? {
        found = true;
        let fork: Option<String> = row.get(0).doing("read a fork's id")?;
        if fork.is_some() {
            forks.push(thread_info(row)?);
        }
    }
    if !found {
        return Err(StoreError::NotFound {
            thread: thread.to_owned(),
        });
    }
    Ok(forks)
}
