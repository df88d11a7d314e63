//! The keyed chat turns this process is answering. A retry of a turn whose first attempt has
//! not ended is refused while this process still answers it, and taken over once the
//! attempt is older than the abandon time with nothing here answering it (the process that
//! took it stopped): the registry is what tells those apart.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The turns being answered, by (stored thread id, Idempotency-Key).
#[derive(Debug, Default)]
pub struct KeyedTurns(Mutex<HashSet<(String, String)>>);

/// The claim on one keyed turn; dropping it releases the turn.
#[derive(Debug)]
pub struct TurnClaim {
    turns: Arc<KeyedTurns>,
    turn: (String, String),
}

impl KeyedTurns {
    /// Claims the turn keyed `key` in `thread`, or `None` when this server is answering it
    /// already.
    pub fn claim(self: &Arc<Self>, thread: &str, key: &str) -> Option<TurnClaim> {
        let turn = (thread.to_owned(), key.to_owned());
        if !self.lock().insert(turn.clone()) {
            return None;
        }
        Some(TurnClaim {
            turns: self.clone(),
            turn,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for TurnClaim {
    fn drop(&mut self) {
        self.turns.lock().remove(&self.turn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_claimed_once_until_its_claim_is_dropped() {
        let turns = Arc::new(KeyedTurns::default());
        let claim = turns.claim("acme/t", "k1").expect("a new turn");
        assert!(turns.claim("acme/t", "k1").is_none());
        assert!(turns.claim("acme/t", "k2").is_some());
        assert!(turns.claim("zeta/t", "k1").is_some());
        drop(claim);
        assert!(turns.claim("acme/t", "k1").is_some());
    }
}
