//! The partitions report on the wire: `bulkhead_partition`'s
//! [`PartitionsReport`] to and from [`v1::PartitionsResponse`], the one
//! place either side converts it. The wire's `generation` is the layout's
//! epoch, its `cores` a partition's units, and an empty `lane` no lane.

use bulkhead_partition::{PartitionKind, PartitionReport, PartitionsReport, TenantReport};

use crate::v1;

/// A count as the wire's `u32` (saturating: nothing real gets near it).
fn small(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn count(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl From<PartitionsReport> for v1::PartitionsResponse {
    fn from(report: PartitionsReport) -> v1::PartitionsResponse {
        let tenant = |t: TenantReport| v1::TenantUsage {
            tenant: t.tenant,
            weight: t.weight,
            kv_blocks: t.kv_blocks,
            kv_bytes: t.kv_bytes,
            guaranteed_bytes: t.guaranteed_bytes,
            budget_bytes: t.budget_bytes,
            preemptions: t.preemptions,
            kv_refusals: t.kv_refusals,
            queued: small(t.queued),
            queue_guaranteed: small(t.queue_guaranteed),
            queue_refusals: t.queue_refusals,
        };
        let partition = |p: PartitionReport| v1::PartitionInfo {
            id: p.id,
            kind: p.kind.as_str().to_string(),
            cores: p.units,
            memory_bytes: p.memory_bytes,
            memory_used_bytes: p.memory_used_bytes,
            queued: small(p.queued),
            running: small(p.running),
            preemptions: p.preemptions,
            device_errors: p.device_errors,
            tenants: p.tenants.into_iter().map(tenant).collect(),
            draining: p.draining,
            host_cpus: p.host_cpus.into_iter().map(small).collect(),
            lane: p.lane.unwrap_or_default(),
        };
        v1::PartitionsResponse {
            device: report.device,
            unit: report.unit,
            compute_units: report.compute_units,
            memory_bytes: report.memory_bytes,
            generation: report.epoch,
            isolation: report.isolation,
            partitions: report.partitions.into_iter().map(partition).collect(),
        }
    }
}

/// The report a host sent, or which partition has a kind this side does
/// not know.
impl TryFrom<v1::PartitionsResponse> for PartitionsReport {
    type Error = String;

    fn try_from(r: v1::PartitionsResponse) -> Result<PartitionsReport, String> {
        let tenant = |t: v1::TenantUsage| TenantReport {
            tenant: t.tenant,
            weight: t.weight,
            kv_blocks: t.kv_blocks,
            kv_bytes: t.kv_bytes,
            guaranteed_bytes: t.guaranteed_bytes,
            budget_bytes: t.budget_bytes,
            preemptions: t.preemptions,
            kv_refusals: t.kv_refusals,
            queued: count(t.queued),
            queue_guaranteed: count(t.queue_guaranteed),
            queue_refusals: t.queue_refusals,
        };
        let partition = |p: v1::PartitionInfo| {
            let kind = PartitionKind::from_name(&p.kind).ok_or_else(|| {
                format!(
                    "partition {:?}: unknown kind {:?} (dedicated or shared)",
                    p.id, p.kind
                )
            })?;
            Ok(PartitionReport {
                id: p.id,
                kind,
                units: p.cores,
                memory_bytes: p.memory_bytes,
                memory_used_bytes: p.memory_used_bytes,
                queued: count(p.queued),
                running: count(p.running),
                preemptions: p.preemptions,
                device_errors: p.device_errors,
                tenants: p.tenants.into_iter().map(tenant).collect(),
                draining: p.draining,
                host_cpus: p.host_cpus.into_iter().map(count).collect(),
                lane: Some(p.lane).filter(|l| !l.is_empty()),
            })
        };
        Ok(PartitionsReport {
            device: r.device,
            unit: r.unit,
            compute_units: r.compute_units,
            memory_bytes: r.memory_bytes,
            epoch: r.generation,
            isolation: r.isolation,
            partitions: r
                .partitions
                .into_iter()
                .map(partition)
                .collect::<Result<_, String>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn report() -> PartitionsReport {
        let acme = TenantReport {
            tenant: "acme".into(),
            weight: 2,
            kv_blocks: 3,
            kv_bytes: 3 << 16,
            guaranteed_bytes: GIB,
            budget_bytes: 2 * GIB,
            preemptions: 4,
            kv_refusals: 5,
            queued: 6,
            queue_guaranteed: 7,
            queue_refusals: 8,
        };
        let dedicated = PartitionReport {
            id: "dedicated:acme".into(),
            kind: PartitionKind::Dedicated,
            units: vec![0],
            memory_bytes: GIB,
            memory_used_bytes: 3 << 16,
            queued: 6,
            running: 1,
            preemptions: 4,
            device_errors: 9,
            tenants: vec![acme],
            draining: false,
            host_cpus: vec![3],
            lane: Some("unix:/run/h.sock.lane0".into()),
        };
        let shared = PartitionReport {
            id: "shared".into(),
            kind: PartitionKind::Shared,
            units: vec![1],
            memory_bytes: 3 * GIB,
            memory_used_bytes: 0,
            queued: 0,
            running: 0,
            preemptions: 0,
            device_errors: 0,
            tenants: Vec::new(),
            draining: true,
            host_cpus: Vec::new(),
            lane: None,
        };
        PartitionsReport {
            device: "cpu".into(),
            unit: "cores".into(),
            compute_units: 2,
            memory_bytes: 4 * GIB,
            epoch: 3,
            partitions: vec![dedicated, shared],
            isolation: "pinned cores".into(),
        }
    }

    #[test]
    fn every_field_reaches_the_wire_under_its_wire_name() {
        let wire = v1::PartitionsResponse::from(report());
        assert_eq!(
            (wire.device.as_str(), wire.unit.as_str(), wire.compute_units),
            ("cpu", "cores", 2)
        );
        assert_eq!((wire.memory_bytes, wire.generation), (4 * GIB, 3));
        assert_eq!(wire.isolation, "pinned cores");
        let [first, second] = &wire.partitions[..] else {
            panic!("{wire:?}");
        };
        assert_eq!(
            *first,
            v1::PartitionInfo {
                id: "dedicated:acme".into(),
                kind: "dedicated".into(),
                cores: vec![0],
                memory_bytes: GIB,
                memory_used_bytes: 3 << 16,
                queued: 6,
                running: 1,
                preemptions: 4,
                tenants: vec![v1::TenantUsage {
                    tenant: "acme".into(),
                    weight: 2,
                    kv_blocks: 3,
                    kv_bytes: 3 << 16,
                    guaranteed_bytes: GIB,
                    budget_bytes: 2 * GIB,
                    preemptions: 4,
                    kv_refusals: 5,
                    queued: 6,
                    queue_guaranteed: 7,
                    queue_refusals: 8,
                }],
                draining: false,
                host_cpus: vec![3],
                lane: "unix:/run/h.sock.lane0".into(),
                device_errors: 9,
            }
        );
        assert_eq!(
            (second.kind.as_str(), second.draining, second.lane.as_str()),
            ("shared", true, "")
        );
    }

    #[test]
    fn a_report_comes_back_from_the_wire_unchanged() {
        let wire = v1::PartitionsResponse::from(report());
        assert_eq!(PartitionsReport::try_from(wire), Ok(report()));
    }

    #[test]
    fn an_unknown_partition_kind_is_named() {
        let mut wire = v1::PartitionsResponse::from(report());
        wire.partitions[1].kind = "exclusive".into();
        let error = PartitionsReport::try_from(wire).unwrap_err();
        assert!(
            error.contains("\"shared\"") && error.contains("\"exclusive\""),
            "{error}"
        );
    }
}
