//! What a host says of its partitions: the layout in force and the
//! replaced partitions still draining, each with its load and its
//! tenants'. The gpu-host builds it, `bulkhead-protocol` carries it, the
//! gateway reads it (admin API, metrics, connection lanes).

use crate::PartitionKind;

/// The device, the layout's epoch and every live partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionsReport {
    /// `cpu` or the GPU's name.
    pub device: String,
    /// What its compute units are: `cores` or `CUs`.
    pub unit: String,
    pub compute_units: u32,
    /// KV-cache memory of the whole device.
    pub memory_bytes: u64,
    /// The epoch of the layout in force: 1 for the one the host starts
    /// with, one more for every change.
    pub epoch: u64,
    /// The layout's partitions, then the draining ones.
    pub partitions: Vec<PartitionReport>,
    /// How dedicated partitions are kept apart on this device (`pinned
    /// cores`, `CU-masked streams`, `green contexts (...)`, `shared
    /// streams: ...`).
    pub isolation: String,
}

/// One partition and its load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReport {
    /// `dedicated:TENANT` or `shared`.
    pub id: String,
    pub kind: PartitionKind,
    /// Its compute units: core ids, CU ids on a GPU.
    pub units: Vec<u32>,
    /// Its KV-cache budget, and the bytes its blocks hold now (all models).
    pub memory_bytes: u64,
    pub memory_used_bytes: u64,
    /// Requests routed here and not yet in a batch.
    pub queued: usize,
    /// Sequences holding KV cache.
    pub running: usize,
    /// Sequences preempted so far.
    pub preemptions: u64,
    /// Steps its device failed so far (their requests got `device_error`).
    pub device_errors: u64,
    /// Its planned tenants and any other that has used it, by name.
    pub tenants: Vec<TenantReport>,
    /// Of a replaced layout, still finishing its streams.
    pub draining: bool,
    /// The host CPUs its threads run on; empty on a GPU, whose units are
    /// not CPUs.
    pub host_cpus: Vec<usize>,
    /// Where its tenant's I/O lane listens (`unix:PATH`, `tcp:HOST:PORT`):
    /// live dedicated partitions with a lane only.
    pub lane: Option<String>,
}

impl PartitionReport {
    /// The tenant of a dedicated partition (from its id).
    pub fn dedicated_tenant(&self) -> Option<&str> {
        match self.kind {
            PartitionKind::Dedicated => self.id.strip_prefix("dedicated:"),
            PartitionKind::Shared => None,
        }
    }
}

/// One tenant's use of a partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantReport {
    pub tenant: String,
    /// As planned (1 for a tenant the plan does not list).
    pub weight: u32,
    /// KV blocks its sequences hold now, all models, and their bytes.
    pub kv_blocks: u64,
    pub kv_bytes: u64,
    /// Its planned memory: always guaranteed, and the most it may hold (0
    /// when unlisted).
    pub guaranteed_bytes: u64,
    pub budget_bytes: u64,
    pub preemptions: u64,
    /// Requests refused because they could never fit its KV budget.
    pub kv_refusals: u64,
    /// Its requests waiting in the partition's queue, its guaranteed part
    /// of the queue, and requests refused because both were used (unlisted
    /// tenants share one count).
    pub queued: usize,
    pub queue_guaranteed: usize,
    pub queue_refusals: u64,
}
