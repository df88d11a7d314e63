//! Retention of request records: how long a thread's `request_started` events keep the
//! messages their requests sent.
//!
//! Message events are never pruned: they are the conversation. A request record is what one
//! model call was sent, kept so that a call can be inspected and replayed; once it is older
//! than its thread's policy allows, the store removes its messages and keeps the rest of
//! the record (id, model, budget, breakdown, tools, step, purpose, the client's digest),
//! marked [`PrunedRequest`] with how many messages it sent. Its `request_ended` event
//! (usage, cost, outcome) is kept whole.
//!
//! A record that a kept record still takes a message from (a request record stores a
//! message no event holds once, and later records refer to it) is kept whole until nothing
//! kept refers to it, so every record that is not pruned still reads back exactly as sent.
//! Pruning rewrites a record in place: the one change to a thread's log after its append,
//! made by the operator's policy and never by a request.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use contexture_core::thread::PrunedRequest;
use serde::{Deserialize, Serialize};

use crate::request_refs::{Sent, StoredRequest};

/// Milliseconds in a day.
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// How many request records one transaction prunes at most, so that a thread with a long
/// history of records does not hold the store's writers (or a thread's row lock) for long.
pub(crate) const PRUNE_BATCH: usize = 32;

/// How long a thread's request records keep the messages they sent. A record is kept whole
/// while it passes every limit set: appended within the last `keep_days` days, and among
/// the thread's newest `keep_last` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRetention {
    /// Keep the records appended in the last this many days.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole_number"
    )]
    pub keep_days: Option<u32>,
    /// Keep the thread's newest this many records.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole_number"
    )]
    pub keep_last: Option<u64>,
}

/// An optional count, written as a whole number: `5`, or `5.0` as JSON Schema's integers
/// allow (what a client generated from the API's document may send).
fn whole_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    struct Count<T>(std::marker::PhantomData<T>);
    impl<'de, T: TryFrom<u64>> serde::de::Visitor<'de> for Count<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "a whole number of at most {}",
                std::any::type_name::<T>()
            )
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
            T::try_from(n)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
            }
        }

        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Self::Value, E> {
            // Exactly representable and whole: 2^53 bounds the integers an f64 holds.
            if n.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&n) {
                self.visit_u64(n as u64)
            } else {
                Err(E::invalid_value(serde::de::Unexpected::Float(n), &self))
            }
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    deserializer.deserialize_option(Count(std::marker::PhantomData))
}

/// A retention policy that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError {
    /// Neither limit was given.
    #[error("a retention policy needs `keep_days`, `keep_last` or both")]
    Empty,
    /// `keep_days` of 0 would prune a record as soon as it is written.
    #[error("`keep_days` must be at least 1 (0 would prune records as they are written)")]
    ZeroDays,
}

impl RequestRetention {
    /// A policy with the limits given, at least one of them.
    pub fn new(
        keep_days: Option<u32>,
        keep_last: Option<u64>,
    ) -> Result<RequestRetention, RetentionError> {
        let retention = RequestRetention {
            keep_days,
            keep_last,
        };
        retention.check()?;
        Ok(retention)
    }

    /// Checks a policy read from configuration or a request.
    pub fn check(&self) -> Result<(), RetentionError> {
        match (self.keep_days, self.keep_last) {
            (None, None) => Err(RetentionError::Empty),
            (Some(0), _) => Err(RetentionError::ZeroDays),
            _ => Ok(()),
        }
    }

    /// True when a record appended at `created_at_ms`, the `newer`-th newest of its thread
    /// (0 for the newest), is kept at `now_ms`.
    fn keeps(&self, created_at_ms: i64, newer: u64, now_ms: i64) -> bool {
        let recent = self.keep_days.is_none_or(|days| {
            created_at_ms >= now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS))
        });
        let among_last = self.keep_last.is_none_or(|last| newer < last);
        recent && among_last
    }
}

impl fmt::Display for RequestRetention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.keep_days, self.keep_last) {
            (Some(days), Some(last)) => write!(f, "{days} days and the last {last} records"),
            (Some(days), None) => write!(f, "{days} days"),
            (None, Some(last)) => write!(f, "the last {last} records"),
            (None, None) => write!(f, "everything"),
        }
    }
}

/// Which policy applies to a thread without one of its own: the policy of the longest
/// prefix of its id that has one (a tenant's `TENANT/`, say), else the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionRules {
    /// The policy of threads that no prefix matches (`None`: keep their records).
    pub default: Option<RequestRetention>,
    /// Policies by thread id prefix.
    pub by_prefix: BTreeMap<String, RequestRetention>,
}

impl RetentionRules {
    /// The rules with `default` alone.
    pub fn with_default(default: Option<RequestRetention>) -> RetentionRules {
        RetentionRules {
            default,
            by_prefix: BTreeMap::new(),
        }
    }

    /// Builder: `retention` for the threads of `tenant` (every thread of its view of the
    /// store, conversations and executions included) that have no policy of their own.
    pub fn with_tenant(mut self, tenant: &crate::Tenant, retention: RequestRetention) -> Self {
        self.by_prefix.insert(tenant.id_prefix(), retention);
        self
    }

    /// The policy for `thread` when it has none of its own.
    pub fn for_thread(&self, thread: &str) -> Option<&RequestRetention> {
        self.by_prefix
            .iter()
            .filter(|(prefix, _)| thread.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, retention)| retention)
            .or(self.default.as_ref())
    }
}

/// What pruning one thread's request records did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestsPruned {
    /// Records whose messages were removed.
    pub records: u64,
    /// Records past the policy kept whole because a kept record takes a message from them.
    pub kept_for_references: u64,
    /// Bytes of event bodies freed.
    pub bytes: u64,
}

/// What [`crate::Store::prune_requests`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestPruneReport {
    /// Threads that had a policy (their own or the rules').
    pub threads: u64,
    /// Records whose messages were removed, in all.
    pub records: u64,
    /// Bytes of event bodies freed, in all.
    pub bytes: u64,
    /// Each thread where something was pruned or kept for references.
    pub by_thread: BTreeMap<String, RequestsPruned>,
}

impl RequestPruneReport {
    /// Adds one thread's result.
    pub(crate) fn add(&mut self, thread: &str, pruned: RequestsPruned) {
        self.threads += 1;
        self.records += pruned.records;
        self.bytes += pruned.bytes;
        if pruned.records > 0 || pruned.kept_for_references > 0 {
            self.by_thread.insert(thread.to_string(), pruned);
        }
    }
}

/// One of a thread's own request records, as the pruning reads it.
#[derive(Debug)]
pub(crate) struct StoredRecord {
    /// Its seq.
    pub seq: u64,
    /// When it was appended, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The bytes of its stored body.
    pub body_bytes: u64,
    /// The record as stored.
    pub stored: StoredRequest,
}

impl StoredRequest {
    /// True when a retention policy removed this record's messages.
    pub(crate) fn is_pruned(&self) -> bool {
        self.record.pruned.is_some()
            || self
                .change
                .as_ref()
                .is_some_and(|change| change.patch.get("pruned").is_some_and(|v| !v.is_null()))
    }

    /// The seqs of the request records this one takes inline messages from.
    pub(crate) fn holders(&self) -> impl Iterator<Item = u64> + '_ {
        self.sent.iter().filter_map(|item| match item {
            Sent::Earlier(at) => Some(at.seq),
            _ => None,
        })
    }

    /// The spans of seqs (inclusive) whose message events this record's runs cover.
    pub(crate) fn run_spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.sent.iter().filter_map(|item| match item {
            Sent::Run(from, to) => Some((from.seq, to.seq)),
            _ => None,
        })
    }

    /// How many messages this record sent, given how many messages each message event its
    /// runs cover holds.
    pub(crate) fn sent_count(&self, held: &BTreeMap<u64, u64>) -> u64 {
        self.sent
            .iter()
            .map(|item| match item {
                Sent::Inline(_) | Sent::Earlier(_) => 1,
                Sent::Run(from, to) if from.seq == to.seq => (to.index - from.index + 1) as u64,
                Sent::Run(from, to) => {
                    let first = held.get(&from.seq).copied().unwrap_or(0);
                    let between: u64 = held.range(from.seq + 1..to.seq).map(|(_, n)| n).sum();
                    first.saturating_sub(from.index as u64) + between + to.index as u64 + 1
                }
            })
            .sum()
    }

    /// This record with its messages removed, marked as pruned.
    pub(crate) fn pruned(mut self, pruned: PrunedRequest) -> Result<StoredRequest, String> {
        self.sent.clear();
        match &mut self.change {
            Some(change) => {
                let mark = serde_json::to_value(pruned).map_err(|error| error.to_string())?;
                change.patch.insert("pruned".into(), mark);
            }
            None => self.record.pruned = Some(pruned),
        }
        Ok(self)
    }
}

/// Which of a thread's records to prune.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PrunePlan {
    /// The seqs of the records to prune now (at most the limit planned with), in order.
    pub prune: Vec<u64>,
    /// True when more records are to be pruned after these.
    pub more: bool,
    /// Records past the policy kept whole for the references of kept ones.
    pub kept_for_references: u64,
    /// The seq below which every record of the thread is pruned once this plan is carried
    /// out: where the next pruning starts reading.
    pub floor: u64,
}

/// Plans the pruning of a thread's records from `floor` on (`records`, in seq order; every
/// record below `floor` is pruned already) under `retention` at `now_ms`, at most `limit`
/// of them. `referred` holds the seqs of this thread's records that its forks' records take
/// messages from.
pub(crate) fn plan(
    retention: &RequestRetention,
    records: &[StoredRecord],
    referred: &BTreeSet<u64>,
    floor: u64,
    now_ms: i64,
    limit: usize,
) -> PrunePlan {
    let by_seq: HashMap<u64, &StoredRecord> = records.iter().map(|r| (r.seq, r)).collect();
    let count = records.len() as u64;
    let kept: BTreeSet<u64> = records
        .iter()
        .enumerate()
        .filter(|(i, record)| retention.keeps(record.created_at_ms, count - 1 - *i as u64, now_ms))
        .map(|(_, record)| record.seq)
        .collect();
    // Every record a kept one takes a message from, and the ones those take from.
    let mut needed: BTreeSet<u64> = BTreeSet::new();
    let mut work: Vec<u64> = referred.iter().copied().collect();
    for seq in &kept {
        work.extend(by_seq[seq].stored.holders());
    }
    while let Some(seq) = work.pop() {
        let Some(record) = by_seq.get(&seq) else {
            continue;
        };
        if needed.insert(seq) {
            work.extend(record.stored.holders());
        }
    }
    let mut plan = PrunePlan {
        floor,
        ..PrunePlan::default()
    };
    let mut first_unpruned = None;
    for record in records {
        let pruned = record.stored.is_pruned();
        let keep = kept.contains(&record.seq) || needed.contains(&record.seq);
        if !pruned && !keep {
            if plan.prune.len() < limit {
                plan.prune.push(record.seq);
                continue;
            }
            plan.more = true;
        }
        if !pruned && !kept.contains(&record.seq) && needed.contains(&record.seq) {
            plan.kept_for_references += 1;
        }
        if !pruned && first_unpruned.is_none() {
            first_unpruned = Some(record.seq);
        }
    }
    plan.floor = match first_unpruned {
        Some(seq) => seq,
        None => records.last().map_or(floor, |record| record.seq + 1),
    };
    plan
}

/// The seqs of `holder_thread`'s records (at or below `limit`) that `records`, a fork's,
/// take messages from.
pub(crate) fn referred_from_fork(
    records: impl IntoIterator<Item = StoredRequest>,
    limit: u64,
    referred: &mut BTreeSet<u64>,
) {
    for record in records {
        referred.extend(record.holders().filter(|seq| *seq <= limit));
    }
}

/// The span of seqs (inclusive) whose message events the records `plan` prunes cover: how
/// many messages each holds is what [`rewrites`] needs to know.
pub(crate) fn held_span(plan: &PrunePlan, records: &[StoredRecord]) -> Option<(u64, u64)> {
    let pruned: BTreeSet<u64> = plan.prune.iter().copied().collect();
    records
        .iter()
        .filter(|record| pruned.contains(&record.seq))
        .flat_map(|record| record.stored.run_spans())
        .reduce(|(from, to), (f, t)| (from.min(f), to.max(t)))
}

/// A record's new body.
#[derive(Debug)]
pub(crate) struct Rewrite {
    /// The record's seq.
    pub seq: u64,
    /// Its pruned body.
    pub body: String,
    /// The bytes its body gets shorter by.
    pub freed: u64,
}

/// The new bodies of the records `plan` prunes, given how many messages each message event
/// in [`held_span`] holds.
pub(crate) fn rewrites(
    thread: &str,
    plan: &PrunePlan,
    records: Vec<StoredRecord>,
    held: &BTreeMap<u64, u64>,
    now_ms: i64,
) -> Result<Vec<Rewrite>, crate::StoreError> {
    let pruned: BTreeSet<u64> = plan.prune.iter().copied().collect();
    let mut rewrites = Vec::with_capacity(pruned.len());
    for record in records {
        if !pruned.contains(&record.seq) {
            continue;
        }
        let body = pruned_body(record.stored, held, now_ms).map_err(|detail| {
            crate::StoreError::Corrupt {
                thread: thread.to_string(),
                seq: record.seq,
                detail: format!("its request record cannot be pruned: {detail}"),
            }
        })?;
        let freed = record
            .body_bytes
            .saturating_sub(crate::record::body_bytes(&body));
        rewrites.push(Rewrite {
            seq: record.seq,
            body,
            freed,
        });
    }
    Ok(rewrites)
}

/// The bytes `rewrites` free at or below `limit`: what a fork made at `limit` shares of it.
pub(crate) fn freed_through(rewrites: &[Rewrite], limit: u64) -> u64 {
    rewrites
        .iter()
        .filter(|rewrite| rewrite.seq <= limit)
        .map(|rewrite| rewrite.freed)
        .sum()
}

/// The number of messages a message event's row holds, from its `tokens` column (one entry
/// per message).
pub(crate) fn messages_held(tokens: Option<&str>) -> u64 {
    tokens.map_or(0, |tokens| tokens.split(';').count() as u64)
}

/// The pruned form of a `request_started` row: its new body.
pub(crate) fn pruned_body(
    stored: StoredRequest,
    held: &BTreeMap<u64, u64>,
    at_ms: i64,
) -> Result<String, String> {
    let messages = stored.sent_count(held);
    let pruned = stored.pruned(PrunedRequest { messages, at_ms })?;
    pruned.to_body().map_err(|error| error.to_string())
}

/// Reads a thread's stored retention policy (the `retention` column).
pub(crate) fn parse_stored(
    thread: &str,
    text: Option<&str>,
) -> Result<Option<RequestRetention>, crate::StoreError> {
    let Some(text) = text else { return Ok(None) };
    serde_json::from_str::<RequestRetention>(text)
        .map(Some)
        .map_err(|error| crate::StoreError::Corrupt {
            thread: thread.to_string(),
            seq: 0,
            detail: format!("its retention policy `{text}` does not read: {error}"),
        })
}

/// A policy as the `retention` column stores it.
pub(crate) fn to_stored(retention: Option<&RequestRetention>) -> Option<String> {
    retention.map(|retention| {
        serde_json::to_string(retention).unwrap_or_else(|_| unreachable!("two optional numbers"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_refs::Address;
    use contexture_core::thread::RequestRecord;

    fn record(seq: u64, created_at_ms: i64, sent: Vec<Sent>) -> StoredRecord {
        StoredRecord {
            seq,
            created_at_ms,
            body_bytes: 0,
            stored: StoredRequest {
                record: RequestRecord {
                    request_id: format!("r{seq}"),
                    ..RequestRecord::default()
                },
                sent,
                change: None,
            },
        }
    }

    fn run(from: u64, to: u64) -> Sent {
        Sent::Run(
            Address {
                seq: from,
                index: 0,
            },
            Address { seq: to, index: 0 },
        )
    }

    fn earlier(seq: u64) -> Sent {
        Sent::Earlier(Address { seq, index: 0 })
    }

    fn last(n: u64) -> RequestRetention {
        RequestRetention::new(None, Some(n)).unwrap()
    }

    #[test]
    fn policies_are_checked() {
        assert_eq!(
            RequestRetention::new(None, None),
            Err(RetentionError::Empty)
        );
        assert_eq!(
            RequestRetention::new(Some(0), None),
            Err(RetentionError::ZeroDays)
        );
        assert!(RequestRetention::new(Some(1), Some(0)).is_ok());
        let whole: RequestRetention =
            serde_json::from_str(r#"{"keep_days": 3.0, "keep_last": null}"#).unwrap();
        assert_eq!(whole, RequestRetention::new(Some(3), None).unwrap());
        for bad in [
            r#"{"keep_days": 1.5}"#,
            r#"{"keep_days": -1}"#,
            r#"{"keep_days": 4294967296}"#,
            r#"{"keep_last": "10"}"#,
        ] {
            assert!(
                serde_json::from_str::<RequestRetention>(bad).is_err(),
                "{bad}"
            );
        }
        let text = r#"{"keep_days":3,"keep_lsat":2}"#;
        let error = serde_json::from_str::<RequestRetention>(text).unwrap_err();
        assert!(error.to_string().contains("keep_lsat"), "{error}");
    }

    #[test]
    fn the_last_n_records_are_kept() {
        let records: Vec<_> = (1..=5).map(|i| record(i * 2, 0, vec![run(1, i)])).collect();
        let plan = plan(&last(2), &records, &BTreeSet::new(), 0, 0, PRUNE_BATCH);
        assert_eq!(plan.prune, vec![2, 4, 6]);
        assert_eq!(plan.floor, 8);
        assert!(!plan.more);
    }

    #[test]
    fn records_older_than_the_days_are_pruned_and_both_limits_apply() {
        let day = DAY_MS;
        let now = 10 * day;
        let records = vec![
            record(1, day, vec![]),
            record(2, 8 * day, vec![]),
            record(3, 9 * day, vec![]),
            record(4, 10 * day, vec![]),
        ];
        let days = RequestRetention::new(Some(3), None).unwrap();
        assert_eq!(
            plan(&days, &records, &BTreeSet::new(), 0, now, PRUNE_BATCH).prune,
            vec![1]
        );
        let both = RequestRetention::new(Some(3), Some(2)).unwrap();
        assert_eq!(
            plan(&both, &records, &BTreeSet::new(), 0, now, PRUNE_BATCH).prune,
            vec![1, 2]
        );
    }

    #[test]
    fn records_that_kept_ones_take_messages_from_are_kept_with_their_own_holders() {
        let records = vec![
            record(1, 0, vec![]),
            record(2, 0, vec![earlier(1)]),
            record(3, 0, vec![]),
            record(4, 0, vec![earlier(2)]),
            record(5, 0, vec![earlier(2)]),
        ];
        let plan = plan(&last(1), &records, &BTreeSet::new(), 0, 0, PRUNE_BATCH);
        assert_eq!(plan.prune, vec![3, 4]);
        assert_eq!(plan.kept_for_references, 2);
        assert_eq!(plan.floor, 1);
    }

    #[test]
    fn records_a_fork_refers_to_are_kept() {
        let records = vec![record(1, 0, vec![]), record(2, 0, vec![])];
        let plan = plan(&last(0), &records, &BTreeSet::from([1]), 0, 0, PRUNE_BATCH);
        assert_eq!(plan.prune, vec![2]);
        assert_eq!(plan.floor, 1);
    }

    #[test]
    fn pruned_records_are_left_alone_and_a_long_history_goes_in_batches() {
        let mut records: Vec<_> = (1..=(PRUNE_BATCH as u64 + 3))
            .map(|i| record(i, 0, vec![]))
            .collect();
        records[0].stored.record.pruned = Some(PrunedRequest {
            messages: 1,
            at_ms: 0,
        });
        let first = plan(&last(1), &records, &BTreeSet::new(), 0, 0, PRUNE_BATCH);
        assert_eq!(first.prune.len(), PRUNE_BATCH);
        assert_eq!(first.prune[0], 2);
        assert!(first.more);
        assert_eq!(first.floor, PRUNE_BATCH as u64 + 2);
    }

    #[test]
    fn a_run_counts_every_message_it_covers() {
        let held = BTreeMap::from([(3, 2), (4, 1), (6, 3), (9, 1)]);
        let one = record(10, 0, vec![run(4, 4)]);
        assert_eq!(one.stored.sent_count(&held), 1);
        let stored = StoredRequest {
            sent: vec![
                Sent::Run(Address { seq: 3, index: 1 }, Address { seq: 6, index: 1 }),
                earlier(2),
                Sent::Inline(Box::new(contexture_core::Message::user("hi"))),
            ],
            ..one.stored
        };
        // 3.1, 4.0, 6.0, 6.1, then the earlier and the inline message.
        assert_eq!(stored.sent_count(&held), 6);
    }

    #[test]
    fn rules_pick_the_longest_prefix_then_the_default() {
        let rules = RetentionRules {
            default: Some(last(10)),
            by_prefix: BTreeMap::from([("acme/".into(), last(3)), ("acme/big".into(), last(1))]),
        };
        assert_eq!(rules.for_thread("other/t"), Some(&last(10)));
        assert_eq!(rules.for_thread("acme/t"), Some(&last(3)));
        assert_eq!(rules.for_thread("acme/big-1"), Some(&last(1)));
        assert_eq!(RetentionRules::default().for_thread("t"), None);
    }
}
