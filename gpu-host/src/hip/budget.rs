//! Per-partition device-memory budgets, enforced by our allocator layer:
//! HIP memory pools' `maxSize` is only a cooperative cap, so every device
//! allocation is charged to a [`MemoryBudget`] first and refused past it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bulkhead_partition::format_bytes;

/// Allocations are charged in whole GPU pages (4 KiB), so a flood of tiny
/// buffers is counted like the pages it occupies rather than as almost
/// nothing.
pub const BUDGET_GRANULE_BYTES: u64 = 4096;

/// A partition's device-memory budget. Shared (`Arc`) by everything that
/// allocates for the partition; safe to charge from many threads.
#[derive(Debug)]
pub struct MemoryBudget {
    partition: String,
    limit_bytes: u64,
    used_bytes: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit_bytes` for the partition named `partition` (the
    /// name is only for messages).
    pub fn new(partition: impl Into<String>, limit_bytes: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            partition: partition.into(),
            limit_bytes,
            used_bytes: AtomicU64::new(0),
        })
    }

    /// The partition this budget belongs to.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// The most it will grant, in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Bytes charged by live reservations.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }

    /// Bytes a new reservation could still get.
    pub fn available_bytes(&self) -> u64 {
        self.limit_bytes.saturating_sub(self.used_bytes())
    }

    /// Charges `bytes` (rounded up to [`BUDGET_GRANULE_BYTES`]) until the
    /// returned reservation is dropped, or refuses if the budget cannot
    /// hold them. All or nothing: a refused request charges nothing.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, BudgetError> {
        let charged = charged_bytes(bytes).ok_or_else(|| self.exceeded(bytes, u64::MAX))?;
        let update = self
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(charged)
                    .filter(|total| *total <= self.limit_bytes)
            });
        match update {
            Ok(_) => Ok(Reservation {
                budget: Arc::clone(self),
                bytes: charged,
            }),
            Err(used) => Err(self.exceeded(bytes, used)),
        }
    }

    fn exceeded(&self, requested: u64, used: u64) -> BudgetError {
        BudgetError::Exceeded {
            partition: self.partition.clone(),
            requested_bytes: requested,
            used_bytes: used,
            limit_bytes: self.limit_bytes,
        }
    }
}

/// `bytes` rounded up to whole granules; `None` if that overflows.
fn charged_bytes(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(BUDGET_GRANULE_BYTES)
}

/// Bytes charged to a budget; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Reservation {
    /// The bytes charged (the request rounded up to whole granules).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The budget charged.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .used_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A refused reservation: whose budget, what was asked, what it held.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "partition {partition:?} cannot allocate {}: {} of its {} device-memory budget \
         is in use, {} left",
        format_bytes(*requested_bytes),
        format_bytes(*used_bytes),
        format_bytes(*limit_bytes),
        format_bytes(limit_bytes.saturating_sub(*used_bytes))
    )]
    Exceeded {
        partition: String,
        requested_bytes: u64,
        used_bytes: u64,
        limit_bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_charged_in_granules_and_given_back_on_drop() {
        let budget = MemoryBudget::new("tenant-a", 64 << 10);
        let one = budget.reserve(1).unwrap();
        assert_eq!(one.bytes(), 4096, "one byte costs a page");
        let exact = budget.reserve(8192).unwrap();
        assert_eq!(exact.bytes(), 8192);
        assert_eq!(budget.used_bytes(), 12 << 10);
        assert_eq!(budget.available_bytes(), 52 << 10);
        drop(one);
        assert_eq!(budget.used_bytes(), 8 << 10);
        drop(exact);
        assert_eq!(budget.used_bytes(), 0);
        assert_eq!(budget.reserve(0).unwrap().bytes(), 0);
    }

    #[test]
    fn a_request_past_the_limit_is_refused_whole_with_the_numbers() {
        let budget = MemoryBudget::new("tenant-a", 1 << 20);
        let held = budget.reserve(768 << 10).unwrap();
        let err = budget.reserve(512 << 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "partition \"tenant-a\" cannot allocate 512KiB: 768KiB of its 1MiB \
             device-memory budget is in use, 256KiB left"
        );
        assert_eq!(budget.used_bytes(), 768 << 10, "a refusal charges nothing");
        // Exactly what is left still fits.
        let rest = budget.reserve(256 << 10).unwrap();
        assert_eq!(budget.available_bytes(), 0);
        drop((held, rest));
        assert!(budget.reserve(u64::MAX).is_err(), "overflow is a refusal");
        assert!(budget.reserve((1 << 20) + 1).is_err());
    }

    #[test]
    fn concurrent_reservations_never_overshoot_the_limit() {
        // 8 threads race for 64 granules of a 40-granule budget: exactly
        // 40 succeed, whatever the interleaving.
        let budget = MemoryBudget::new("shared", 40 * BUDGET_GRANULE_BYTES);
        let granted: Vec<Vec<Reservation>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let budget = Arc::clone(&budget);
                    scope.spawn(move || {
                        (0..8)
                            .filter_map(|_| budget.reserve(BUDGET_GRANULE_BYTES).ok())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let count: usize = granted.iter().map(Vec::len).sum();
        assert_eq!(count, 40);
        assert_eq!(budget.used_bytes(), budget.limit_bytes());
        drop(granted);
        assert_eq!(budget.used_bytes(), 0);
    }
}
