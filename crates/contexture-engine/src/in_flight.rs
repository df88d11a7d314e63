//! Work in flight apart from any request (a chat turn that goes on after its client left,
//! the recording of a stream): counted so a shutdown can wait for it, and told when the
//! shutdown stops waiting, so that it records how it ended before the process exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Counts work in flight, so a shutdown can wait for it, and tells that work when the
/// shutdown stops waiting.
#[derive(Debug)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            stop: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// One piece of work in flight; dropping it ends it.
#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    /// Starts a piece of work.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// Tells the work in flight that the server stops now: it records what it has and ends.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// True once [`InFlight::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves once [`InFlight::stop`] is called.
    pub async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        // The sender lives as long as `self`: waiting cannot fail while it is borrowed.
        let _ = stop.wait_for(|stopping| *stopping).await;
    }

    /// Resolves once no work is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
