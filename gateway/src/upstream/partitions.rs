//! Partitions on the gpu-host: the tenant set sent (`SetPartitions`, by
//! `crate::reconcile`), the layout read back (`Partitions`) for `GET
//! /admin/v1/partitions`, and a watcher that turns it into
//! `bulkhead_partition_*` metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bulkhead_partition::TenantRequest;
use bulkhead_protocol::v1::{self, PartitionsRequest, SetPartitionsRequest};
use prometheus_client::metrics::counter::Counter;
use tokio::task::JoinHandle;

use super::{Upstream, UpstreamError, UpstreamState};
use crate::metrics::{Metrics, PartitionLabels, PartitionTenantLabels};

/// How often the watcher reads the host's partitions for the metrics.
pub const PARTITION_POLL: Duration = Duration::from_secs(1);

impl Upstream {
    /// Sends the tenant set; true when the host's layout changed. Does not
    /// wait for the host: callers call it when it is up.
    pub async fn set_partitions(&self, tenants: &[TenantRequest]) -> Result<bool, UpstreamError> {
        let tenants = tenants.iter().map(v1::TenantGpu::from).collect();
        let mut client = self.client.clone();
        let response = client
            .set_partitions(SetPartitionsRequest { tenants })
            .await?;
        let changed = response.into_inner().changed;
        if changed {
            self.layout_changed.notify_one();
        }
        Ok(changed)
    }

    /// The host's partitions now, without waiting for a restart.
    pub async fn partitions(&self) -> Result<PartitionsReport, UpstreamError> {
        Ok(PartitionsReport::from(self.fetch_partitions().await?))
    }

    async fn fetch_partitions(&self) -> Result<v1::PartitionsResponse, UpstreamError> {
        if self.state() != UpstreamState::Ready {
            return Err(UpstreamError::Unavailable("restarting".into()));
        }
        let mut client = self.client.clone();
        Ok(client.partitions(PartitionsRequest {}).await?.into_inner())
    }
}

/// The host's partitions as `Partitions` reports them.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionsReport {
    /// `cpu` or the GPU's name.
    pub device: String,
    /// `cores` or `CUs`.
    pub unit: String,
    pub compute_units: u32,
    /// KV-cache memory of the whole device.
    pub memory_bytes: u64,
    /// Bumped by every layout change (1 for the host's first).
    pub generation: u64,
    pub partitions: Vec<PartitionReport>,
}

/// One partition: its units, memory and load.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionReport {
    /// `dedicated:TENANT` or `shared`.
    pub id: String,
    /// `dedicated` or `shared`.
    pub kind: String,
    /// Core ids (CU ids on a GPU) its workers run on.
    pub cores: Vec<u32>,
    /// The host's CPUs its threads run on (empty on a GPU).
    pub host_cpus: Vec<u32>,
    pub memory_bytes: u64,
    pub memory_used_bytes: u64,
    pub queued: u32,
    pub running: u32,
    pub preemptions: u64,
    /// Of a replaced layout, still finishing its streams.
    pub draining: bool,
    pub tenants: Vec<TenantReport>,
}

/// One tenant's use of its partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantReport {
    pub tenant: String,
    pub weight: u32,
    pub kv_blocks: u64,
    pub kv_bytes: u64,
    pub guaranteed_bytes: u64,
    pub budget_bytes: u64,
    pub preemptions: u64,
    pub kv_refusals: u64,
    pub queued: u32,
    pub queue_guaranteed: u32,
    pub queue_refusals: u64,
}

impl From<v1::PartitionsResponse> for PartitionsReport {
    fn from(r: v1::PartitionsResponse) -> PartitionsReport {
        let tenant = |t: v1::TenantUsage| TenantReport {
            tenant: t.tenant,
            weight: t.weight,
            kv_blocks: t.kv_blocks,
            kv_bytes: t.kv_bytes,
            guaranteed_bytes: t.guaranteed_bytes,
            budget_bytes: t.budget_bytes,
            preemptions: t.preemptions,
            kv_refusals: t.kv_refusals,
            queued: t.queued,
            queue_guaranteed: t.queue_guaranteed,
            queue_refusals: t.queue_refusals,
        };
        let partition = |p: v1::PartitionInfo| PartitionReport {
            id: p.id,
            kind: p.kind,
            cores: p.cores,
            host_cpus: p.host_cpus,
            memory_bytes: p.memory_bytes,
            memory_used_bytes: p.memory_used_bytes,
            queued: p.queued,
            running: p.running,
            preemptions: p.preemptions,
            draining: p.draining,
            tenants: p.tenants.into_iter().map(tenant).collect(),
        };
        PartitionsReport {
            device: r.device,
            unit: r.unit,
            compute_units: r.compute_units,
            memory_bytes: r.memory_bytes,
            generation: r.generation,
            partitions: r.partitions.into_iter().map(partition).collect(),
        }
    }
}

/// Host counters already added to the Prometheus counters, so each poll
/// adds only what is new (a host restart or a new layout starts them
/// again from 0, and then the whole new value is added).
#[derive(Debug, Default)]
pub(crate) struct PartitionCounters {
    preemptions: BTreeMap<PartitionLabels, u64>,
    refusals: BTreeMap<PartitionTenantLabels, u64>,
    /// The gauges' label sets at the last poll.
    partitions: BTreeSet<PartitionLabels>,
    tenants: BTreeSet<PartitionTenantLabels>,
}

impl PartitionCounters {
    /// Sets the gauges from `report` and advances the counters.
    pub(crate) fn observe(&mut self, report: &v1::PartitionsResponse, metrics: &Metrics) {
        // Draining partitions share ids with their successors: sum them.
        let mut gauges: BTreeMap<PartitionLabels, [i64; 4]> = BTreeMap::new();
        let mut blocks: BTreeMap<PartitionTenantLabels, i64> = BTreeMap::new();
        let mut preemptions: BTreeMap<PartitionLabels, u64> = BTreeMap::new();
        let mut refusals: BTreeMap<PartitionTenantLabels, u64> = BTreeMap::new();
        for p in &report.partitions {
            let labels = PartitionLabels {
                partition: p.id.clone(),
            };
            let g = gauges.entry(labels.clone()).or_default();
            g[0] += i64::from(p.running);
            g[1] += i64::from(p.queued);
            g[2] += i64::try_from(p.memory_used_bytes).unwrap_or(i64::MAX);
            if !p.draining {
                g[3] = i64::try_from(p.memory_bytes).unwrap_or(i64::MAX);
            }
            *preemptions.entry(labels).or_default() += p.preemptions;
            for t in &p.tenants {
                let labels = PartitionTenantLabels {
                    partition: p.id.clone(),
                    tenant: t.tenant.clone(),
                };
                *blocks.entry(labels.clone()).or_default() +=
                    i64::try_from(t.kv_blocks).unwrap_or(i64::MAX);
                *refusals.entry(labels).or_default() += t.kv_refusals;
            }
        }
        // Partitions and tenants gone from the layout leave the gauges.
        for gone in self.partitions.iter().filter(|l| !gauges.contains_key(*l)) {
            metrics.partition_running.remove(gone);
            metrics.partition_queued.remove(gone);
            metrics.partition_memory_used_bytes.remove(gone);
            metrics.partition_memory_bytes.remove(gone);
        }
        for gone in self.tenants.iter().filter(|l| !blocks.contains_key(*l)) {
            metrics.partition_kv_blocks.remove(gone);
        }
        self.partitions = gauges.keys().cloned().collect();
        self.tenants = blocks.keys().cloned().collect();
        for (labels, [running, queued, used, budget]) in &gauges {
            metrics
                .partition_running
                .get_or_create(labels)
                .set(*running);
            metrics.partition_queued.get_or_create(labels).set(*queued);
            metrics
                .partition_memory_used_bytes
                .get_or_create(labels)
                .set(*used);
            metrics
                .partition_memory_bytes
                .get_or_create(labels)
                .set(*budget);
        }
        for (labels, n) in &blocks {
            metrics.partition_kv_blocks.get_or_create(labels).set(*n);
        }
        for (labels, now) in preemptions {
            let counter = metrics.partition_preemptions.get_or_create(&labels);
            advance(&counter, self.preemptions.insert(labels, now), now);
        }
        for (labels, now) in refusals {
            let counter = metrics.partition_kv_refusals.get_or_create(&labels);
            advance(&counter, self.refusals.insert(labels, now), now);
        }
    }
}

/// Adds to `counter` what the host's count grew by since `before`.
fn advance(counter: &Counter, before: Option<u64>, now: u64) {
    let added = match before {
        Some(before) if now >= before => now - before,
        _ => now, // first seen, or counting again from 0
    };
    counter.inc_by(added);
}

/// Reads the host's partitions every [`PARTITION_POLL`], and at once after
/// this gateway changed the layout, into the metrics and `on_report`
/// (connection lanes), until the task is aborted.
pub fn watch_partitions(
    upstream: Upstream,
    metrics: Arc<Metrics>,
    mut on_report: impl FnMut(&v1::PartitionsResponse) + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut counters = PartitionCounters::default();
        let mut tick = tokio::time::interval(PARTITION_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = upstream.layout_changed.notified() => {}
            }
            if let Ok(report) = upstream.fetch_partitions().await {
                counters.observe(&report, &metrics);
                on_report(&report);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(preemptions: u64, refusals: u64, draining: bool) -> v1::PartitionsResponse {
        let tenant = v1::TenantUsage {
            tenant: "acme".into(),
            kv_blocks: 7,
            kv_refusals: refusals,
            ..Default::default()
        };
        let mut partitions = vec![v1::PartitionInfo {
            id: "dedicated:acme".into(),
            kind: "dedicated".into(),
            memory_bytes: 1 << 20,
            memory_used_bytes: 4096,
            running: 2,
            queued: 1,
            preemptions,
            tenants: vec![tenant.clone()],
            ..Default::default()
        }];
        if draining {
            partitions.push(v1::PartitionInfo {
                draining: true,
                running: 1,
                preemptions: 1,
                tenants: vec![tenant],
                ..partitions[0].clone()
            });
        }
        v1::PartitionsResponse {
            partitions,
            ..Default::default()
        }
    }

    #[test]
    fn gauges_follow_the_layout_and_counters_only_grow() {
        let metrics = Metrics::new();
        let mut counters = PartitionCounters::default();
        counters.observe(&report(3, 1, false), &metrics);
        counters.observe(&report(5, 1, false), &metrics);
        let text = metrics.render();
        for line in [
            "bulkhead_partition_running{partition=\"dedicated:acme\"} 2",
            "bulkhead_partition_queued{partition=\"dedicated:acme\"} 1",
            "bulkhead_partition_memory_bytes{partition=\"dedicated:acme\"} 1048576",
            "bulkhead_partition_memory_used_bytes{partition=\"dedicated:acme\"} 4096",
            "bulkhead_partition_kv_blocks{partition=\"dedicated:acme\",tenant=\"acme\"} 7",
            "bulkhead_partition_preemptions_total{partition=\"dedicated:acme\"} 5",
            "bulkhead_partition_kv_refusals_total{partition=\"dedicated:acme\",tenant=\"acme\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // A re-partition: the new scheduler counts from 0 again, the old one
        // drains; the counter keeps growing and the gauges add both up.
        counters.observe(&report(0, 0, true), &metrics);
        let text = metrics.render();
        assert!(text.contains("bulkhead_partition_running{partition=\"dedicated:acme\"} 3"));
        assert!(
            text.contains("bulkhead_partition_preemptions_total{partition=\"dedicated:acme\"} 6")
        );
        // A layout without the partition drops its gauges.
        counters.observe(&v1::PartitionsResponse::default(), &metrics);
        assert!(!metrics.render().contains("bulkhead_partition_running{"));
    }
}
