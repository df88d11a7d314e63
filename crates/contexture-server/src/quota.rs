//! What one tenant may hold open at once on this server: running executions and open event
//! streams. Each is a slot taken when the work starts and given back when it ends (the run
//! finishes, the stream closes or its client goes away); a request past the limit gets a 429
//! naming the limit and its setting. Counts are per server: with several servers behind a
//! balancer, a tenant may hold up to the limit on each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use crate::error::ApiError;

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

    /// Takes a slot for `tenant`, or a 429 when it holds the limit already.
    pub fn take(self: &Arc<Self>, tenant: &str) -> Result<Slot, ApiError> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = held.entry(tenant.to_owned()).or_default();
        if *count >= self.limit {
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "too_many_open",
                message: format!(
                    "this tenant already has {} {} on this server, the most allowed (`{}`); retry when one ends",
                    self.limit, self.what, self.setting
                ),
                param: None,
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
        let error = slots.take("a").unwrap_err();
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            error.message.contains("2 open event streams")
                && error.message.contains("`limits.max_event_streams`"),
            "{}",
            error.message
        );
        let _b = slots.take("b").unwrap();
        drop(a1);
        assert_eq!(slots.held("a"), 1);
        let _a3 = slots.take("a").unwrap();
    }
}
