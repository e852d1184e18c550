//! What [`Partitions::report`](super::Partitions::report) says of the
//! partitions: the layout in force and the replaced partitions still
//! draining, each with its load and its tenants' (the transport puts it on
//! the wire as `PartitionsResponse`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use bulkhead_partition::PartitionKind;

use super::super::queue::SchedulerView;

/// The device, the layout's epoch and every live partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartitionsReport {
    /// `cpu` or the GPU's name.
    pub device: String,
    /// What its compute units are: `cores` or `CUs`.
    pub unit: &'static str,
    pub compute_units: u32,
    /// KV-cache memory of the whole device.
    pub memory_bytes: u64,
    /// The epoch of the layout in force: 1 for the one the host starts
    /// with, one more for every change.
    pub epoch: u64,
    /// The layout's partitions, then the draining ones.
    pub partitions: Vec<PartitionReport>,
}

/// One partition and its load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartitionReport {
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

/// One tenant's use of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TenantReport {
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

/// The report of the partition `view` runs, without its host CPUs and lane
/// (`report` knows the backend and the lanes).
pub(super) fn partition_report(view: &SchedulerView, draining: bool) -> PartitionReport {
    let spec = &view.spec;
    let load = view.load.load();
    let tenants = spec
        .tenants
        .iter()
        .map(|t| t.tenant.as_str())
        .chain(load.tenants.keys().map(String::as_str))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .map(|tenant| {
            let planned = spec.tenants.iter().find(|t| t.tenant == tenant);
            let used = load.tenants.get(tenant).copied().unwrap_or_default();
            let queue = view.queue.of(tenant);
            TenantReport {
                tenant: tenant.to_string(),
                weight: planned.map_or(1, |t| t.weight),
                kv_blocks: used.kv_blocks,
                kv_bytes: used.kv_bytes,
                guaranteed_bytes: planned.map_or(0, |t| t.guaranteed_bytes),
                budget_bytes: planned.map_or(0, |t| t.budget_bytes),
                preemptions: used.preemptions,
                kv_refusals: used.kv_refusals,
                queued: queue.queued.load(Ordering::SeqCst),
                queue_guaranteed: queue.guaranteed,
                queue_refusals: queue.refusals.load(Ordering::Relaxed),
            }
        })
        .collect();
    PartitionReport {
        id: spec.id.clone(),
        kind: spec.kind,
        units: spec.units.clone(),
        memory_bytes: spec.memory_bytes,
        memory_used_bytes: load.kv_bytes_used,
        queued: view.counters.queued.load(Ordering::SeqCst),
        running: view.counters.running.load(Ordering::SeqCst),
        preemptions: load.preemptions,
        tenants,
        draining,
        host_cpus: Vec::new(),
        lane: None,
    }
}
