//! Queued and running counts, the host's and each partition's, that a
//! request moves as it waits, runs and leaves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Load numbers shared with `Health` (the host's) and `Partitions` (each
/// partition's).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Accepted, not yet in a batch.
    pub queued: AtomicUsize,
    /// In a batch, holding KV cache.
    pub running: AtomicUsize,
}

/// The host's counters, those of the partition a request was routed to and
/// its tenant's waiting count there ([`super::shares`]), moved together.
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    pub host: Arc<Counters>,
    pub partition: Arc<Counters>,
    pub tenant_queued: Arc<AtomicUsize>,
}

impl Counted {
    fn each(&self) -> [&Counters; 2] {
        [&self.host, &self.partition]
    }

    /// An accepted request left without reaching a batch (or was never sent).
    pub(crate) fn unqueue(&self) {
        for c in self.each() {
            c.queued.fetch_sub(1, Ordering::SeqCst);
        }
        self.tenant_queued.fetch_sub(1, Ordering::SeqCst);
    }

    pub(super) fn start(&self) {
        for c in self.each() {
            c.queued.fetch_sub(1, Ordering::SeqCst);
            c.running.fetch_add(1, Ordering::SeqCst);
        }
        self.tenant_queued.fetch_sub(1, Ordering::SeqCst);
    }

    pub(super) fn stop(&self) {
        for c in self.each() {
            c.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
