//! How one partition's queue is shared among its tenants.
//!
//! A partition's queue holds `capacity` waiting requests (accepted, not yet
//! running in a batch); a dedicated partition's is its tenant's alone.
//! In the shared pool each tenant the plan lists is **guaranteed** its
//! weighted part of the capacity (at least one) and may borrow beyond it
//! while the partition's queue has room; a request within its tenant's
//! guarantee is accepted even when borrowers have filled the queue. So a
//! tenant that floods fills the queue only with what others leave, and
//! never takes away another's guaranteed part. Tenants the plan does not
//! list (a host driven by no gateway) have no guarantee and only borrow.
//! At most `capacity` plus the sum of the guarantees (at most twice the
//! capacity, plus one per tenant for rounding) wait in a partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::error::SchedError;
use super::scheduler::PartitionSpec;

/// One tenant's part of a partition's queue.
#[derive(Debug, Default)]
pub(crate) struct TenantQueue {
    /// Requests it may always have waiting.
    pub guaranteed: usize,
    /// Its requests waiting now.
    pub queued: Arc<AtomicUsize>,
    /// Its requests refused because its part and the free room were used.
    pub refusals: AtomicU64,
}

/// A partition's queue, shared as the module says.
#[derive(Debug)]
pub(crate) struct QueueShares {
    partition: String,
    capacity: usize,
    tenants: BTreeMap<String, TenantQueue>,
    unlisted: TenantQueue,
}

impl QueueShares {
    /// The shares of `spec`'s tenants in a queue of `capacity`.
    pub(crate) fn new(spec: &PartitionSpec, capacity: usize) -> QueueShares {
        let weights: Vec<(&str, u64)> = spec
            .tenants
            .iter()
            .map(|t| (t.tenant.as_str(), u64::from(t.weight.max(1))))
            .collect();
        let tenants = guarantees(capacity, &weights)
            .into_iter()
            .map(|(tenant, guaranteed)| {
                let queue = TenantQueue {
                    guaranteed,
                    ..TenantQueue::default()
                };
                (tenant.to_string(), queue)
            })
            .collect();
        QueueShares {
            partition: spec.id.clone(),
            capacity,
            tenants,
            unlisted: TenantQueue::default(),
        }
    }

    /// The queue of `tenant` (the unlisted tenants' common one if the plan
    /// does not name it).
    pub(crate) fn of(&self, tenant: &str) -> &TenantQueue {
        self.tenants.get(tenant).unwrap_or(&self.unlisted)
    }

    /// Counts one more waiting request of `tenant` in its queue and in
    /// `partition_queued` (the partition's count), or refuses it when the
    /// tenant is past its guarantee and the partition's queue is full.
    /// Both counts go up first and come back down on a refusal, so two
    /// requests racing for the last place cannot both take it.
    pub(crate) fn enter(
        &self,
        tenant: &str,
        partition_queued: &AtomicUsize,
    ) -> Result<Arc<AtomicUsize>, SchedError> {
        let queue = self.of(tenant);
        let mine = queue.queued.fetch_add(1, Ordering::SeqCst);
        let all = partition_queued.fetch_add(1, Ordering::SeqCst);
        if mine < queue.guaranteed || all < self.capacity {
            return Ok(Arc::clone(&queue.queued));
        }
        queue.queued.fetch_sub(1, Ordering::SeqCst);
        partition_queued.fetch_sub(1, Ordering::SeqCst);
        queue.refusals.fetch_add(1, Ordering::Relaxed);
        Err(SchedError::QueueFull {
            partition: self.partition.clone(),
            capacity: self.capacity,
            tenant: tenant.to_string(),
            waiting: mine,
            guaranteed: queue.guaranteed,
        })
    }
}

/// Each tenant's guaranteed part of `capacity`, by weight, rounded down
/// and at least one.
fn guarantees<'a>(capacity: usize, weights: &[(&'a str, u64)]) -> Vec<(&'a str, usize)> {
    let total: u128 = weights.iter().map(|&(_, w)| u128::from(w)).sum();
    weights
        .iter()
        .map(|&(tenant, weight)| {
            let part = (capacity as u128 * u128::from(weight))
                .checked_div(total)
                .unwrap_or(0);
            (tenant, usize::try_from(part).unwrap_or(capacity).max(1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bulkhead_partition::{PartitionKind, TenantSlot};

    use super::*;

    fn spec(kind: PartitionKind, tenants: &[(&str, u32)]) -> PartitionSpec {
        PartitionSpec {
            id: "shared".to_string(),
            kind,
            units: vec![0],
            cpus: vec![0],
            memory_bytes: 1 << 20,
            tenants: tenants
                .iter()
                .map(|&(tenant, weight)| TenantSlot {
                    tenant: tenant.to_string(),
                    weight,
                    guaranteed_bytes: 0,
                    budget_bytes: 0,
                    owns_memory: false,
                    max_cus: 1,
                    kv_wait: Duration::from_secs(1),
                })
                .collect(),
        }
    }

    #[test]
    fn guarantees_follow_weights_and_are_never_zero() {
        assert_eq!(
            guarantees(64, &[("a", 1), ("b", 3)]),
            [("a", 16), ("b", 48)]
        );
        assert_eq!(
            guarantees(4, &[("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)]),
            [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)]
        );
        assert_eq!(guarantees(8, &[("alone", 7)]), [("alone", 8)]);
        assert!(guarantees(8, &[]).is_empty());
    }

    #[test]
    fn a_flooding_tenant_borrows_the_free_room_but_never_anothers_guarantee() {
        let shares = QueueShares::new(&spec(PartitionKind::Shared, &[("a", 1), ("b", 1)]), 8);
        let all = AtomicUsize::new(0);
        // `a` takes its 4 and borrows the 4 `b` is not using.
        let held: Vec<_> = (0..8).map(|_| shares.enter("a", &all).unwrap()).collect();
        let refused = shares.enter("a", &all).unwrap_err();
        assert!(
            matches!(refused, SchedError::QueueFull { .. }),
            "{refused:?}"
        );
        assert!(
            refused
                .to_string()
                .contains("tenant `a` has 8 requests waiting, its guaranteed part is 4"),
            "{refused:?}"
        );
        assert_eq!(shares.of("a").refusals.load(Ordering::Relaxed), 1);
        // The queue is full, yet `b` still gets its guaranteed 4...
        for _ in 0..4 {
            shares.enter("b", &all).unwrap();
        }
        // ...and no more while it is full.
        assert!(shares.enter("b", &all).is_err());
        assert_eq!(all.load(Ordering::SeqCst), 12);
        assert_eq!(shares.of("a").queued.load(Ordering::SeqCst), 8);
        assert_eq!(shares.of("b").queued.load(Ordering::SeqCst), 4);
        drop(held);
        // Unlisted tenants only borrow: none fits a full queue.
        assert!(shares.enter("stranger", &all).is_err());
        assert_eq!(shares.of("stranger").guaranteed, 0);
    }

    #[test]
    fn a_host_with_no_plan_shares_its_queue_first_come() {
        let shares = QueueShares::new(&spec(PartitionKind::Shared, &[]), 3);
        let all = AtomicUsize::new(0);
        for tenant in ["x", "y", "x"] {
            shares.enter(tenant, &all).unwrap();
        }
        assert!(shares.enter("y", &all).is_err());
    }

    #[test]
    fn a_dedicated_tenant_is_guaranteed_the_whole_queue() {
        let shares = QueueShares::new(&spec(PartitionKind::Dedicated, &[("own", 1)]), 5);
        assert_eq!(shares.of("own").guaranteed, 5);
    }
}
