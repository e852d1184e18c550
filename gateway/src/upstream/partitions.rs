//! Partitions on the gpu-host: the tenant set sent (`SetPartitions`, by
//! `crate::reconcile`), the layout read back (`Partitions`) for `GET
//! /admin/v1/partitions`, and a watcher that turns it into
//! `bulkhead_partition_*` metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bulkhead_partition::{PartitionsReport, TenantRequest};
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
        if self.state() != UpstreamState::Ready {
            return Err(UpstreamError::Unavailable("restarting".into()));
        }
        let mut client = self.client.clone();
        let wire = client.partitions(PartitionsRequest {}).await?.into_inner();
        PartitionsReport::try_from(wire).map_err(UpstreamError::Protocol)
    }
}

/// Host counters already added to the Prometheus counters, so each poll
/// adds only what is new (a host restart or a new layout starts them
/// again from 0, and then the whole new value is added).
#[derive(Debug, Default)]
pub(crate) struct PartitionCounters {
    preemptions: BTreeMap<PartitionLabels, u64>,
    device_errors: BTreeMap<PartitionLabels, u64>,
    refusals: BTreeMap<PartitionTenantLabels, u64>,
    /// The gauges' label sets at the last poll.
    partitions: BTreeSet<PartitionLabels>,
    tenants: BTreeSet<PartitionTenantLabels>,
}

impl PartitionCounters {
    /// Sets the gauges from `report` and advances the counters.
    pub(crate) fn observe(&mut self, report: &PartitionsReport, metrics: &Metrics) {
        // Draining partitions share ids with their successors: sum them.
        let mut gauges: BTreeMap<PartitionLabels, [i64; 4]> = BTreeMap::new();
        let mut blocks: BTreeMap<PartitionTenantLabels, i64> = BTreeMap::new();
        let mut preemptions: BTreeMap<PartitionLabels, u64> = BTreeMap::new();
        let mut device_errors: BTreeMap<PartitionLabels, u64> = BTreeMap::new();
        let mut refusals: BTreeMap<PartitionTenantLabels, u64> = BTreeMap::new();
        for p in &report.partitions {
            let labels = PartitionLabels {
                partition: p.id.clone(),
            };
            let g = gauges.entry(labels.clone()).or_default();
            g[0] += i64::try_from(p.running).unwrap_or(i64::MAX);
            g[1] += i64::try_from(p.queued).unwrap_or(i64::MAX);
            g[2] += i64::try_from(p.memory_used_bytes).unwrap_or(i64::MAX);
            if !p.draining {
                g[3] = i64::try_from(p.memory_bytes).unwrap_or(i64::MAX);
            }
            *device_errors.entry(labels.clone()).or_default() += p.device_errors;
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
        for (labels, now) in device_errors {
            let counter = metrics.partition_device_errors.get_or_create(&labels);
            advance(&counter, self.device_errors.insert(labels, now), now);
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
/// Without `metrics` (one of several hosts: the partition gauges have no
/// host label) only `on_report` hears of it.
pub fn watch_partitions(
    upstream: Upstream,
    metrics: Option<Arc<Metrics>>,
    mut on_report: impl FnMut(&PartitionsReport) + Send + 'static,
) -> JoinHandle<()> {
    let metrics = metrics.unwrap_or_default();
    tokio::spawn(async move {
        let mut counters = PartitionCounters::default();
        let mut tick = tokio::time::interval(PARTITION_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = upstream.layout_changed.notified() => {}
            }
            if let Ok(report) = upstream.partitions().await {
                counters.observe(&report, &metrics);
                on_report(&report);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use bulkhead_partition::{PartitionKind, PartitionReport, TenantReport};

    use super::*;

    fn report(preemptions: u64, refusals: u64, draining: bool) -> PartitionsReport {
        let tenant = TenantReport {
            tenant: "acme".into(),
            kv_blocks: 7,
            kv_refusals: refusals,
            ..Default::default()
        };
        let mut partitions = vec![PartitionReport {
            id: "dedicated:acme".into(),
            kind: PartitionKind::Dedicated,
            units: vec![0],
            memory_bytes: 1 << 20,
            memory_used_bytes: 4096,
            queued: 1,
            running: 2,
            preemptions,
            device_errors: preemptions / 2,
            tenants: vec![tenant.clone()],
            draining: false,
            host_cpus: Vec::new(),
            lane: None,
        }];
        if draining {
            partitions.push(PartitionReport {
                draining: true,
                running: 1,
                preemptions: 1,
                tenants: vec![tenant],
                ..partitions[0].clone()
            });
        }
        PartitionsReport {
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
            "bulkhead_partition_device_errors_total{partition=\"dedicated:acme\"} 2",
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
        counters.observe(&PartitionsReport::default(), &metrics);
        assert!(!metrics.render().contains("bulkhead_partition_running{"));
    }
}
