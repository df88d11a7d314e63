//! What one tenant may hold open at once in this process: chat turns in flight, running
//! executions, open event streams. Each is a slot taken when the work starts and given back
//! when it ends (the turn's end is recorded, the run finishes, the stream closes or its
//! client goes away); past the limit, a [`SlotsFull`] names the limit and its setting.
//! Counts are per process: with several servers behind a balancer, a tenant may hold up to
//! the limit on each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A tenant holds all the slots of one kind of work already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this tenant already has {limit} {what} on this server, the most allowed (`{setting}`); retry when one ends"
)]
pub struct SlotsFull {
    /// The most a tenant may hold.
    pub limit: usize,
    /// What is held (`running executions`).
    pub what: &'static str,
    /// The setting that raises the limit.
    pub setting: &'static str,
}

/// The slots of one kind of work, per tenant.
#[derive(Debug)]
pub struct TenantSlots {
    limit: usize,
    what: &'static str,
    setting: &'static str,
    held: Mutex<HashMap<String, usize>>,
}

/// One slot held; dropping it gives the slot back.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<TenantSlots>,
    tenant: String,
}

impl TenantSlots {
    /// At most `limit` of `what` (`running executions`) per tenant; `setting` is the
    /// configuration key that raises it, named in the 429.
    pub fn new(limit: usize, what: &'static str, setting: &'static str) -> Arc<TenantSlots> {
        Arc::new(TenantSlots {
            limit,
            what,
            setting,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a slot for `tenant`, unless it holds the limit already.
    pub fn take(self: &Arc<Self>, tenant: &str) -> Result<Slot, SlotsFull> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = held.entry(tenant.to_owned()).or_default();
        if *count >= self.limit {
            return Err(SlotsFull {
                limit: self.limit,
                what: self.what,
                setting: self.setting,
            });
        }
        *count += 1;
        Ok(Slot {
            slots: self.clone(),
            tenant: tenant.to_owned(),
        })
    }

    /// How many slots `tenant` holds.
    pub fn held(&self, tenant: &str) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self
            .slots
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_per_tenant_and_come_back_when_dropped() {
        let slots = TenantSlots::new(2, "open event streams", "limits.max_event_streams");
        let a1 = slots.take("a").unwrap();
        let _a2 = slots.take("a").unwrap();
        let error = slots.take("a").unwrap_err().to_string();
        assert!(
            error.contains("2 open event streams") && error.contains("`limits.max_event_streams`"),
            "{error}"
        );
        let _b = slots.take("b").unwrap();
        drop(a1);
        assert_eq!(slots.held("a"), 1);
        let _a3 = slots.take("a").unwrap();
    }
}
