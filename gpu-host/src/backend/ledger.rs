//! The transfer ledger: what one view of a device (a partition's, or the
//! model reservation's) asked of it: bytes copied each way, kernel
//! launches, synchronizations, allocations. Counted in [`BudgetedDevice`]
//! (`budgeted.rs`), the layer every device call of a partition goes
//! through, on a GPU and on the kernel emulator alike, so the emulator's
//! counts are the device's.
//!
//! Copies to the device and launches are queued on the view's stream
//! ([`KernelDevice`](bulkhead_kernels::hip::KernelDevice)); a read waits
//! for the stream and so counts as a synchronization, as does an explicit
//! `synchronize`.
//!
//! [`BudgetedDevice`]: super::BudgetedDevice

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts, read with [`Ledger::totals`].
#[derive(Debug, Default)]
pub struct Ledger {
    host_to_device_bytes: AtomicU64,
    device_to_host_bytes: AtomicU64,
    launches: AtomicU64,
    synchronizations: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
}

/// What a [`Ledger`] has counted, or (with [`Transfers::since`]) what
/// happened between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    pub host_to_device_bytes: u64,
    pub device_to_host_bytes: u64,
    pub launches: u64,
    pub synchronizations: u64,
    pub allocations: u64,
    pub frees: u64,
}

impl Transfers {
    /// Each count with its name (as `generate --json` prints them).
    pub fn named(&self) -> [(&'static str, u64); 6] {
        [
            ("host_to_device_bytes", self.host_to_device_bytes),
            ("device_to_host_bytes", self.device_to_host_bytes),
            ("launches", self.launches),
            ("synchronizations", self.synchronizations),
            ("allocations", self.allocations),
            ("frees", self.frees),
        ]
    }
}

impl Ledger {
    /// A copy of `bytes` to the device, queued.
    pub(crate) fn copied_to_device(&self, bytes: usize) {
        self.host_to_device_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A copy of `bytes` back to the host, which waits for the stream.
    pub(crate) fn copied_to_host(&self, bytes: usize) {
        self.device_to_host_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.synchronizations.fetch_add(1, Ordering::Relaxed);
    }

    /// A kernel launch, queued.
    pub(crate) fn launched(&self) {
        self.launches.fetch_add(1, Ordering::Relaxed);
    }

    /// A wait for the stream without a copy.
    pub(crate) fn synchronized(&self) {
        self.synchronizations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn allocated(&self) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn freed(&self) {
        self.frees.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn totals(&self) -> Transfers {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Transfers {
            host_to_device_bytes: read(&self.host_to_device_bytes),
            device_to_host_bytes: read(&self.device_to_host_bytes),
            launches: read(&self.launches),
            synchronizations: read(&self.synchronizations),
            allocations: read(&self.allocations),
            frees: read(&self.frees),
        }
    }
}

impl Transfers {
    /// What was counted after `earlier` (an earlier reading of the same
    /// ledger; a later one gives zeros, not an overflow).
    pub fn since(&self, earlier: &Transfers) -> Transfers {
        Transfers {
            host_to_device_bytes: self
                .host_to_device_bytes
                .saturating_sub(earlier.host_to_device_bytes),
            device_to_host_bytes: self
                .device_to_host_bytes
                .saturating_sub(earlier.device_to_host_bytes),
            launches: self.launches.saturating_sub(earlier.launches),
            synchronizations: self
                .synchronizations
                .saturating_sub(earlier.synchronizations),
            allocations: self.allocations.saturating_sub(earlier.allocations),
            frees: self.frees.saturating_sub(earlier.frees),
        }
    }
}
