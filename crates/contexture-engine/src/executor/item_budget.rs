//! The token and cost budgets of an iteration whose items run at once.
//!
//! Each item runs in its own copy of the run and sees only what it recorded itself, so one
//! copy cannot tell from its log what the others spent or are about to spend. The items
//! share a ledger instead: what the run had recorded, what each item spent that is not
//! recorded yet, and what each item's call in flight may still spend (its request and the
//! most its reply may take). A call starts only when all of that together leaves room for
//! it, and it reserves its maximum in the same step, so calls in flight together can never
//! pass the budget; its end replaces the reservation with what it really spent.
//!
//! A call that the spending alone leaves room for, but the others' reservations do not,
//! waits for one of them to end rather than fail or start with a shorter reply: each call
//! then gets the reply limit it would get had the items run one at a time, and a budget is
//! refused only when what was really spent fills it. Once the budget is tight (a call's
//! reply would be shortened, or it has no room at all), a call goes ahead only for the
//! earliest item still running and the later ones wait: near its end a budget is spent in
//! item order, as one item at a time spends it, whichever item's call happened to come
//! first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::tree_budget::Spent;

/// The ledger the items of one iteration share.
#[derive(Debug, Default)]
pub(crate) struct ItemLedger {
    entries: Mutex<Entries>,
    /// Woken when a reservation is released: a call waiting for room looks again.
    released: Notify,
}

/// What a call decides from the ledger (see [`ItemLedger::reserve`]).
pub(crate) enum Decision<T> {
    /// It starts, reserving what it may spend at most.
    Start(T, Spent),
    /// It waits for a reservation to be released.
    Wait,
}

#[derive(Debug, Default)]
struct Entries {
    /// What the run's tree had spent by its last recorded item.
    recorded: Spent,
    /// The items started and not yet recorded, by item index.
    items: BTreeMap<usize, ItemSpending>,
}

/// One item's part of the ledger.
#[derive(Debug, Default, Clone, Copy)]
struct ItemSpending {
    /// What its copy of the run had spent when it was taken (the run's recorded spending).
    base: Spent,
    /// What it spent since: held in its copy, not recorded yet.
    unrecorded: Spent,
    /// What its call in flight may still spend.
    reserved: Spent,
    /// It has stopped (it will spend nothing more).
    done: bool,
}

impl ItemLedger {
    /// A ledger for an iteration whose run's tree has spent `recorded` so far.
    pub fn new(recorded: Spent) -> Arc<ItemLedger> {
        Arc::new(ItemLedger {
            entries: Mutex::new(Entries {
                recorded,
                items: BTreeMap::new(),
            }),
            released: Notify::new(),
        })
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Every update leaves the ledger whole, so one that panicked left nothing half-done.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters item `item`, whose copy of the run is taken now (from the recorded run).
    pub fn join(&self, item: usize) {
        let mut entries = self.entries();
        let base = entries.recorded;
        entries.items.insert(
            item,
            ItemSpending {
                base,
                ..ItemSpending::default()
            },
        );
    }

    /// What the whole tree has spent or may spend, as item `item` must count it: its own
    /// copy's spending (`own`, what its log holds), what the other items spent and not
    /// recorded, and what their calls in flight may still spend.
    pub fn seen_by(&self, item: usize, own: Spent) -> Spent {
        seen_by(&self.entries(), item, own)
    }

    /// Decides item `item`'s next call and reserves what it may spend, in one step:
    /// `decide` gets the spending as [`ItemLedger::seen_by`] counts it, the spending
    /// without the other calls' reservations, and whether `item` is the earliest item
    /// still running; it starts the call, refuses it, or waits until a reservation is
    /// released or an item stops to decide again. A wait always ends when `decide` starts
    /// or refuses the earliest item's call whenever no other item holds a reservation:
    /// only a call in flight holds one, and an earlier item always stops.
    pub async fn reserve<T, E>(
        &self,
        item: usize,
        own: Spent,
        mut decide: impl FnMut(Spent, Spent, bool) -> Result<Decision<T>, E>,
    ) -> Result<T, E> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the ledger is read, so a release in between is not missed.
            released.as_mut().enable();
            {
                let mut entries = self.entries();
                let counted = seen_by(&entries, item, own);
                let spent = counted.minus(reserved_by_others(&entries, item));
                let earliest = !entries
                    .items
                    .range(..item)
                    .any(|(_, spending)| !spending.done);
                if let Decision::Start(answer, reserved) = decide(counted, spent, earliest)? {
                    if let Some(spending) = entries.items.get_mut(&item) {
                        spending.reserved = reserved;
                    }
                    return Ok(answer);
                }
            }
            released.await;
        }
    }

    /// Item `item` stopped: whatever it reserved is released.
    pub fn finished(&self, item: usize) {
        if let Some(spending) = self.entries().items.get_mut(&item) {
            spending.reserved = Spent::default();
            spending.done = true;
        }
        self.released.notify_waiters();
    }

    /// Item `item`'s copy now holds `own`; when `call_ended`, its call in flight ended and
    /// its reservation is released (what it spent is in `own`).
    pub fn held(&self, item: usize, own: Spent, call_ended: bool) {
        let mut entries = self.entries();
        if let Some(spending) = entries.items.get_mut(&item) {
            spending.unrecorded = own.minus(spending.base);
            if call_ended {
                spending.reserved = Spent::default();
            }
        }
        drop(entries);
        if call_ended {
            self.released.notify_waiters();
        }
    }

    /// Item `item`'s events are recorded in the run, whose tree has now spent `recorded`.
    pub fn recorded(&self, item: usize, recorded: Spent) {
        let mut entries = self.entries();
        entries.items.remove(&item);
        entries.recorded = recorded;
        drop(entries);
        self.released.notify_waiters();
    }
}

fn reserved_by_others(entries: &Entries, item: usize) -> Spent {
    entries
        .items
        .iter()
        .filter(|(index, _)| **index != item)
        .fold(Spent::default(), |sum, (_, spending)| {
            sum.plus(spending.reserved)
        })
}

fn seen_by(entries: &Entries, item: usize, own: Spent) -> Spent {
    let others = entries
        .items
        .iter()
        .filter(|(index, _)| **index != item)
        .fold(Spent::default(), |sum, (_, spending)| {
            sum.plus(spending.unrecorded).plus(spending.reserved)
        });
    let own_unrecorded = entries
        .items
        .get(&item)
        .map_or(Spent::default(), |spending| own.minus(spending.base));
    let mut seen = entries.recorded.plus(own_unrecorded).plus(others);
    // Steps are counted by position, not by the ledger.
    seen.steps = own.steps;
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(tokens: u64) -> Spent {
        Spent {
            tokens,
            ..Spent::default()
        }
    }

    #[tokio::test]
    async fn items_count_each_others_spending_and_reservations_once() {
        let ledger = ItemLedger::new(tokens(100));
        ledger.join(0);
        ledger.join(1);
        // Item 0 reserves 50 for a call; item 1 sees it.
        ledger
            .reserve(0, tokens(100), |counted, spent, _| {
                assert_eq!((counted.tokens, spent.tokens), (100, 100));
                Ok::<_, ()>(Decision::Start((), tokens(50)))
            })
            .await
            .unwrap();
        assert_eq!(ledger.seen_by(1, tokens(100)).tokens, 150);
        // Its call ends having spent 30: the reservation gives way to the spending.
        ledger.held(0, tokens(130), true);
        assert_eq!(ledger.seen_by(1, tokens(100)).tokens, 130);
        assert_eq!(ledger.seen_by(0, tokens(130)).tokens, 130);
        // Recorded: the run holds it, the ledger no longer counts it apart.
        ledger.recorded(0, tokens(130));
        assert_eq!(ledger.seen_by(1, tokens(100)).tokens, 130);
        // A later item's copy is taken from the recorded run.
        ledger.join(2);
        assert_eq!(ledger.seen_by(2, tokens(130)).tokens, 130);
        ledger.held(1, tokens(110), true);
        assert_eq!(ledger.seen_by(2, tokens(130)).tokens, 140);
    }

    #[tokio::test]
    async fn a_refused_call_reserves_nothing() {
        let ledger = ItemLedger::new(tokens(0));
        ledger.join(0);
        ledger.join(1);
        let refused: Result<(), &str> = ledger.reserve(0, tokens(0), |_, _, _| Err("over")).await;
        assert!(refused.is_err());
        assert_eq!(ledger.seen_by(1, tokens(0)).tokens, 0);
    }

    #[tokio::test]
    async fn a_call_waits_for_a_reservation_to_end_and_then_sees_what_was_spent() {
        let ledger = ItemLedger::new(tokens(0));
        ledger.join(0);
        ledger.join(1);
        // Budget 100: item 0 reserves 80; item 1 wants 40, so it waits.
        let decide = |counted: Spent, spent: Spent, _earliest: bool| {
            assert!(spent.tokens + 40 <= 100, "the spending alone leaves room");
            Ok::<_, ()>(if counted.tokens + 40 <= 100 {
                Decision::Start(counted.tokens, tokens(40))
            } else {
                Decision::Wait
            })
        };
        ledger
            .reserve(0, tokens(0), |_, _, _| {
                Ok::<_, ()>(Decision::Start((), tokens(80)))
            })
            .await
            .unwrap();
        let waiting = {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.reserve(1, tokens(0), decide).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "80 + 40 would pass 100");
        // Item 0's call spent 10.
        ledger.held(0, tokens(10), true);
        assert_eq!(waiting.await.unwrap(), Ok(10));
        assert_eq!(ledger.seen_by(0, tokens(10)).tokens, 50);
    }

    #[tokio::test]
    async fn a_later_item_waits_for_the_earlier_ones_to_stop_when_it_asks() {
        let ledger = ItemLedger::new(tokens(0));
        ledger.join(0);
        ledger.join(1);
        let later = {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                ledger
                    .reserve(1, tokens(0), |_, _, earliest| {
                        Ok::<_, ()>(if earliest {
                            Decision::Start((), tokens(5))
                        } else {
                            Decision::Wait
                        })
                    })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!later.is_finished(), "item 0 still runs");
        ledger.finished(0);
        assert_eq!(later.await.unwrap(), Ok(()));
    }
}
