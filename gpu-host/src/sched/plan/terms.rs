//! The terms a planner works to: its limits, each tenant's share, and
//! the numbers it reports.

use std::time::Duration;

use bulkhead_partition::DEFAULT_KV_WAIT;

/// Limits of one batcher.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Sequences holding KV at once. More than `max_rows` lets each step
    /// choose its rows fairly across tenants instead of running whichever
    /// sequences got in first.
    pub max_running: usize,
    /// Decode rows one step runs, at most.
    pub max_rows: usize,
    /// Blocks in the model's KV pool.
    pub kv_blocks: u32,
}

/// How one tenant shares a batcher's pool (from its partition's plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantShare {
    /// Deficit round robin weight (tokens per turn ∝ weight); at least 1.
    pub weight: u32,
    /// Blocks of its own (`hbm`): guaranteed, and the most it may hold.
    /// `None`: a weighted part of the blocks no tenant owns.
    pub own_blocks: Option<u64>,
    /// How long a request that fits the tenant's budget, but not what its
    /// other sequences leave of it, waits to be admitted before it is
    /// refused (`kv_budget_exceeded`).
    pub kv_wait: Duration,
    /// The most decode rows of a step it gets while other tenants have
    /// sequences left out (a shared tenant's `cus` or `share` of the
    /// pool); `None`: no cap.
    pub max_rows: Option<usize>,
}

impl Default for TenantShare {
    /// A tenant the plan does not list.
    fn default() -> Self {
        TenantShare {
            weight: 1,
            own_blocks: None,
            kv_wait: DEFAULT_KV_WAIT,
            max_rows: None,
        }
    }
}

/// What one tenant did in a batch since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounts {
    /// Blocks its sequences hold now.
    pub held_blocks: u64,
    /// Its sequences preempted (blocks taken back, recomputed later).
    pub preemptions: u64,
    /// Its requests refused because they could never fit its budget.
    pub kv_refusals: u64,
}

/// Per-tenant counts are kept for at most this many tenants not in the
/// plan (names come from callers); past it only the totals count them.
pub(super) const MAX_UNLISTED_COUNTED: usize = 1024;

/// Numbers for `Health` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Sequences waiting to join.
    pub waiting: usize,
    /// Sequences holding KV (running or preempted for recompute).
    pub running: usize,
    pub kv_blocks_used: u32,
    pub kv_blocks_total: u32,
    /// Sequences preempted (blocks taken back, recomputed later) so far.
    pub preemptions: u64,
    /// Requests refused because they could never fit their tenant's budget.
    pub kv_refusals: u64,
}
