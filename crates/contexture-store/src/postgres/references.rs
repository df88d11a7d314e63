//! Request records by reference in PostgreSQL (see [`crate::request_refs`]): what an append
//! reads to refer to, and what a read fetches to resolve references.

use contexture_core::thread::{Event, EventKind};
use deadpool_postgres::GenericClient;

use crate::StoreError;
use crate::error::Action;
use crate::record::{self, Row, db_seq, seq_of};
use crate::referable_cache::{DELETION_COUNT, Gathering, KeptBodies, ReferableCache};
use crate::request_refs::{Prior, Referable, Resolver, Unresolved};

/// The newest request records of a segment, newest first: `$1` the segment's thread, `$2`
/// its last seq to read, `$3` how many.
const RECENT_REQUESTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND kind = 'request_started'
     ORDER BY seq DESC LIMIT $3";

/// The message events of a segment from `$3` to `$4`; `$1`, `$2` as for [`RECENT_REQUESTS`].
const MESSAGE_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq >= $3 AND seq <= $4
       AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged')
     ORDER BY seq";

/// The events a request record may refer to (message events and request records), in a
/// segment from `$3` to `$4`; parameters as for [`MESSAGE_EVENTS`].
const REFERRED_EVENTS: &str = "SELECT seq, kind, body, tokens FROM events
     WHERE thread_id = $1 AND seq <= $2 AND seq >= $3 AND seq <= $4
       AND kind IN ('message_appended', 'step_message', 'context_replaced', 'merged',
                    'request_started')
     ORDER BY seq";

/// The newest request ends of a thread before `$2`, newest first, at most `$3`: found
/// through the index of events other than ordinary messages.
const RECENT_ENDS: &str = "SELECT seq, body FROM events
     WHERE thread_id = $1 AND ordinary_message IS NULL AND kind = 'request_ended' AND seq < $2
     ORDER BY seq DESC LIMIT $3";

/// Whether a fork of `$1` shares its events from `$2` on.
const FORKED_FROM: &str =
    "SELECT EXISTS (SELECT 1 FROM threads WHERE parent_id = $1 AND fork_seq >= $2)";

/// A stored row: seq, kind, body, tokens.
type StoredRow = (u64, String, String, Option<String>);

/// The rows `select` (with a segment's thread, its limit and two more parameters) finds in
/// `segments`, in seq order.
async fn rows_in(
    client: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    select: &str,
    from: u64,
    to: u64,
) -> Result<Vec<StoredRow>, StoreError> {
    let select = client
        .prepare_cached(select)
        .await
        .doing("prepare the event query")?;
    let mut rows = Vec::new();
    for (id, limit) in segments {
        let found = client
            .query(
                &select,
                &[
                    id,
                    &limit.map_or(i64::MAX, db_seq),
                    &db_seq(from),
                    &db_seq(to),
                ],
            )
            .await
            .doing("query events")?;
        for row in found {
            rows.push((
                seq_of(thread, row.get(0))?,
                row.get(1),
                row.get(2),
                row.get(3),
            ));
        }
    }
    Ok(rows)
}

/// Stores `row`, a `request_started` row that gets `seq` in `thread`, by reference to what
/// the thread holds before it: inside the append's transaction (which holds the thread's row
/// lock), so that what it refers to is what a read will find. Uses the message bodies kept
/// in `cache` for the thread, and gives back the ones to keep for its next record (with the
/// deletion count they were read under) once the append commits.
pub(super) async fn refer_request(
    client: &impl GenericClient,
    thread: &str,
    seq: u64,
    row: &mut Row,
    cache: &ReferableCache,
) -> Result<Option<(i64, KeptBodies)>, StoreError> {
    let EventKind::RequestStarted(record) = &row.event else {
        return Ok(None);
    };
    let segments = super::reads::chain(client, thread).await?;
    let select = client
        .prepare_cached(RECENT_REQUESTS)
        .await
        .doing("prepare the recent requests query")?;
    let mut recent = Vec::new();
    'segments: for (id, limit) in segments.iter().rev() {
        let found = client
            .query(
                &select,
                &[id, &limit.map_or(i64::MAX, db_seq), &Prior::RECENT],
            )
            .await
            .doing("query recent requests")?;
        for found in found {
            let at = seq_of(thread, found.get(0))?;
            let stored =
                record::decode_request(thread, at, found.get(1), found.get(2), found.get(3))?;
            recent.push((at, stored));
            if recent.len() as i64 >= Prior::RECENT {
                break 'segments;
            }
        }
    }
    let mut prior = Prior::from_recent(recent);
    for holder in prior.holders_needed() {
        let rows = rows_in(client, thread, &segments, REFERRED_EVENTS, holder, holder).await?;
        for (at, kind, body, tokens) in rows {
            if let (_, Some(Unresolved::Request(stored))) =
                record::decode_row(thread, at, &kind, &body, tokens.as_deref())?
            {
                prior.add_holder(at, *stored);
            }
        }
    }
    let mut referable = prior
        .referable()
        .map_err(|error| record::unserializable(thread, "a message", &error))?;
    let from = prior.first_seq();
    let to = seq.saturating_sub(1);
    let deletions: i64 = client
        .query_one(DELETION_COUNT, &[])
        .await
        .doing("read the deletion count")?
        .get(0);
    let kept = cache.take(thread, deletions, from);
    let mut gathering = Gathering::start(kept, from, to, &mut referable);
    add_messages(
        &mut referable,
        client,
        thread,
        &segments,
        gathering.read_from,
        to,
    )
    .await?;
    let (mut stored, missed) = referable
        .refer(record, &row.sent_bodies)
        .map_err(|error| record::unserializable(thread, "a message", &error))?;
    if missed && from > 1 {
        let mut before = Referable::default();
        let through = gathering.unread_before();
        add_messages(&mut before, client, thread, &segments, 1, through).await?;
        gathering.widen(&mut referable, before);
        stored = referable
            .refer(record, &row.sent_bodies)
            .map_err(|error| record::unserializable(thread, "a message", &error))?
            .0;
    }
    record::store_request(thread, row, &stored)?;
    Ok(Some((deletions, gathering.finish(&mut referable))))
}

/// Adds the message events of `thread` from `from` to `to` to `referable`.
async fn add_messages(
    referable: &mut Referable,
    client: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    from: u64,
    to: u64,
) -> Result<(), StoreError> {
    if from > to {
        return Ok(());
    }
    for (at, kind, body, _) in rows_in(client, thread, segments, MESSAGE_EVENTS, from, to).await? {
        referable.push(at, record::message_bodies(thread, at, &kind, &body)?);
    }
    Ok(())
}

/// The events of `rows` (decoded from a read of the events after `read_after`), every
/// request record's references resolved, fetching what they refer to before the read.
pub(super) async fn resolve(
    client: &impl GenericClient,
    thread: &str,
    segments: &[(String, Option<u64>)],
    rows: Vec<(Event, Option<Unresolved>)>,
    read_after: u64,
) -> Result<Vec<Event>, StoreError> {
    let mut resolver = Resolver::new(rows);
    for (from, to) in resolver.missing(read_after) {
        let mut fetched = Vec::new();
        for (at, kind, body, tokens) in
            rows_in(client, thread, segments, REFERRED_EVENTS, from, to).await?
        {
            fetched.push(record::decode_row(
                thread,
                at,
                &kind,
                &body,
                tokens.as_deref(),
            )?);
        }
        resolver.add_fetched(fetched);
    }
    for (owner, end, seq) in resolver.replies_past_forks(segments) {
        let own = [(owner.to_string(), None)];
        for (at, kind, body, tokens) in
            rows_in(client, thread, &own, REFERRED_EVENTS, seq, seq).await?
        {
            let (event, _) = record::decode_row(thread, at, &kind, &body, tokens.as_deref())?;
            resolver.add_reply_past_fork(end, &event);
        }
    }
    resolver.resolve(thread)
}

/// Stores the reply of a step's last request end by reference to `row`, the step's answer
/// that gets `seq` in `thread` (see [`record::shared_reply`]), when one of the thread's
/// newest request ends holds it and no fork shares that end: inside the append's
/// transaction, which holds the thread's row lock. Returns the bytes the end no longer takes.
pub(super) async fn share_answer(
    client: &impl GenericClient,
    thread: &str,
    seq: u64,
    row: &Row,
) -> Result<u64, StoreError> {
    let EventKind::MessageAppended { message } = &row.event else {
        return Ok(0);
    };
    let select = client
        .prepare_cached(RECENT_ENDS)
        .await
        .doing("prepare the request ends' query")?;
    let ends = client
        .query(&select, &[&thread, &db_seq(seq), &record::ANSWER_LOOKBACK])
        .await
        .doing("query the request ends")?;
    for end in ends {
        let end_seq = seq_of(thread, end.get(0))?;
        let body: String = end.get(1);
        let Some(shared) = record::shared_reply(thread, end_seq, &body, seq, message)? else {
            continue;
        };
        let forked: bool = client
            .query_one(FORKED_FROM, &[&thread, &db_seq(end_seq)])
            .await
            .doing("look for forks")?
            .get(0);
        if forked {
            return Ok(0);
        }
        client
            .execute(
                "UPDATE events SET body = $3, tokens = NULL WHERE thread_id = $1 AND seq = $2",
                &[&thread, &db_seq(end_seq), &shared],
            )
            .await
            .doing("store the request end's reply by reference")?;
        return Ok(record::body_bytes(&body).saturating_sub(record::body_bytes(&shared)));
    }
    Ok(0)
}
