//! One partition's part of [`Partitions::report`](super::Partitions::report):
//! its load and its tenants', read from the scheduler that runs it.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use bulkhead_partition::{PartitionReport, TenantReport};

use super::super::queue::SchedulerView;

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
        device_errors: load.device_errors,
        tenants,
        draining,
        host_cpus: Vec::new(),
        lane: None,
    }
}
