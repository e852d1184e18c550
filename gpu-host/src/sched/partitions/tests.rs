//! Planning, routing and replacing layouts, without models (the serve
//! tests run generations through them).

use std::time::{Duration, Instant};

use bulkhead_partition::{Compute, CuSet, GpuRequest, Isolation};

use super::*;
use crate::backend::PartitionedDevice;
use crate::backend::partitioned_test_support::RecordingStreams;

const GIB: u64 = 1 << 30;

fn host(cores: u32) -> (Partitions, Workers) {
    let settings = PartitionSettings {
        device: Device::cpu(cores, 4 * GIB).unwrap(),
        model_reservation_bytes: 0,
        cpus: CpuMap::from_cpus(vec![0]),
        max_running: 4,
        capacity: 8,
        compute: ComputeBackend::Cpu,
    };
    let registry = Arc::new(ModelRegistry::load(&[], crate::models::PassPlace::Host).unwrap());
    Partitions::start(settings, registry).unwrap()
}

fn tenant(name: &str, isolation: Isolation, cus: Option<u32>, hbm: Option<u64>) -> TenantRequest {
    TenantRequest {
        tenant: name.into(),
        gpu: GpuRequest {
            compute: cus.map_or(Compute::Unset, Compute::Cus),
            hbm_bytes: hbm,
            isolation,
            weight: 1,
            kv_wait: None,
        },
    }
}

fn summary(p: &Partitions) -> Vec<(String, Vec<u32>, u64, bool)> {
    p.report(&BTreeMap::new())
        .partitions
        .into_iter()
        .map(|p| (p.id, p.units, p.memory_bytes, p.draining))
        .collect()
}

fn route(p: &Partitions, tenant: &str) -> Option<String> {
    let epoch = p.current.load();
    let at = epoch.by_tenant.get(tenant).copied().or(epoch.shared)?;
    Some(epoch.schedulers[at].view.spec.id.clone())
}

/// Waits (bounded) until no replaced scheduler is left draining.
fn drained(p: &Partitions) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while summary(p).iter().any(|s| s.3) {
        assert!(Instant::now() < deadline, "old schedulers never exited");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_host_starts_as_one_shared_pool_on_every_core() {
    let (p, _workers) = host(2);
    assert_eq!(summary(&p), [("shared".into(), vec![0, 1], 4 * GIB, false)]);
    assert_eq!(p.report(&BTreeMap::new()).epoch, 1);
    assert_eq!(route(&p, "anyone").as_deref(), Some("shared"));
}

#[test]
fn dedicated_tenants_get_their_own_partition_and_the_rest_share() {
    let (p, _workers) = host(2);
    let tenants = [
        tenant("acme", Isolation::Dedicated, Some(1), Some(GIB)),
        tenant("globex", Isolation::Shared, None, None),
    ];
    assert!(p.set(&tenants).unwrap());
    drained(&p);
    assert_eq!(
        summary(&p),
        [
            ("dedicated:acme".into(), vec![0], GIB, false),
            ("shared".into(), vec![1], 3 * GIB, false),
        ]
    );
    assert_eq!(route(&p, "acme").as_deref(), Some("dedicated:acme"));
    assert_eq!(route(&p, "globex").as_deref(), Some("shared"));
    assert_eq!(route(&p, "unlisted").as_deref(), Some("shared"));
    assert_eq!(p.report(&BTreeMap::new()).epoch, 2);
    // The same set again is not a new layout; another KV wait is.
    assert!(!p.set(&tenants).unwrap());
    assert_eq!(p.report(&BTreeMap::new()).epoch, 2);
    let mut patient = tenants.clone();
    patient[1].gpu.kv_wait = Some(Duration::from_secs(1));
    assert!(p.set(&patient).unwrap());
    drained(&p);
    let epoch = p.current.load();
    let shared = &epoch.schedulers[epoch.shared.unwrap()].view.spec;
    assert_eq!(shared.tenants[0].kv_wait, Duration::from_secs(1));
    assert!(!shared.tenants[0].owns_memory);
    drop(epoch);
    assert_eq!(p.health().schedulers, 2);
}

#[test]
fn a_live_dedicated_partition_reports_its_host_cpus_and_its_lane() {
    let (p, _workers) = host(2);
    let lanes = BTreeMap::from([("acme".to_string(), "unix:/run/h.sock.lane0".to_string())]);
    assert!(p.lane_cpus().is_empty());
    let dedicated = [tenant("acme", Isolation::Dedicated, Some(1), Some(GIB))];
    assert!(p.set(&dedicated).unwrap());
    assert_eq!(
        p.lane_cpus(),
        BTreeMap::from([("acme".to_string(), vec![0])])
    );
    drained(&p);
    let shown: Vec<(String, Vec<usize>, Option<String>)> = p
        .report(&lanes)
        .partitions
        .into_iter()
        .map(|p| (p.id, p.host_cpus, p.lane))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "dedicated:acme".into(),
                vec![0],
                Some("unix:/run/h.sock.lane0".into())
            ),
            ("shared".into(), vec![0], None),
        ]
    );
    // Shared again: no lane wanted, and a draining partition shows none.
    let shared = [tenant("acme", Isolation::Shared, None, None)];
    assert!(p.set(&shared).unwrap());
    assert!(p.lane_cpus().is_empty());
    for info in p.report(&lanes).partitions {
        assert_eq!(info.lane, None, "{info:?}");
    }
}

#[test]
fn an_oversubscribed_set_is_refused_with_the_numbers_and_the_old_layout_stays() {
    let (p, _workers) = host(2);
    let first = [tenant("acme", Isolation::Dedicated, Some(1), Some(GIB))];
    assert!(p.set(&first).unwrap());
    drained(&p);
    let before = summary(&p);
    let bad = [
        tenant("acme", Isolation::Dedicated, Some(2), Some(GIB)),
        tenant("globex", Isolation::Dedicated, Some(1), Some(GIB)),
    ];
    let refused = p.set(&bad).unwrap_err();
    assert!(
        matches!(refused, SchedError::Unplannable { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    for needle in ["acme 2", "globex 1", "= 3 > 2"] {
        assert!(message.contains(needle), "{message}");
    }
    assert_eq!(summary(&p), before);
    assert_eq!(route(&p, "acme").as_deref(), Some("dedicated:acme"));
}

#[test]
fn a_new_layout_leaves_the_old_schedulers_draining_until_they_exit() {
    let (p, workers) = host(2);
    assert!(
        p.set(&[tenant("acme", Isolation::Dedicated, Some(1), Some(GIB))])
            .unwrap()
    );
    // Back to everyone shared: the dedicated scheduler is replaced.
    assert!(p.set(&[]).unwrap());
    drained(&p);
    assert_eq!(summary(&p), [("shared".into(), vec![0, 1], 4 * GIB, false)]);
    assert_eq!(route(&p, "acme").as_deref(), Some("shared"));
    assert_eq!(p.health().schedulers, 1);
    drop(p);
    workers.join(); // every thread ever started exits once the router is gone
}

/// A host on an MI325X-shaped device whose streams are recorded, not
/// created (no GPU needed): 64 GiB, 16 of them the model reservation.
fn device_host(streams: Arc<RecordingStreams>) -> (Partitions, Workers, Arc<PartitionedDevice>) {
    let device = Device {
        memory_bytes: 64 * GIB,
        ..Device::mi325x()
    };
    let split = Arc::new(PartitionedDevice::new(device.clone(), 16 * GIB, streams).unwrap());
    let settings = PartitionSettings {
        device,
        model_reservation_bytes: 16 * GIB,
        cpus: CpuMap::from_cpus(vec![0]),
        max_running: 4,
        capacity: 8,
        compute: ComputeBackend::Device(Arc::clone(&split)),
    };
    let registry = Arc::new(ModelRegistry::load(&[], crate::models::PassPlace::Host).unwrap());
    let (p, workers) = Partitions::start(settings, registry).unwrap();
    (p, workers, split)
}

/// CU sets asked for since the `from`th.
fn asked(streams: &RecordingStreams, from: usize) -> Vec<CuSet> {
    streams.asked.lock().unwrap()[from..].to_vec()
}

#[test]
fn on_a_device_each_partition_gets_streams_on_its_cus_and_a_repartition_new_ones() {
    let streams = Arc::new(RecordingStreams::default());
    let (p, _workers, split) = device_host(Arc::clone(&streams));
    let device = split.device().clone();
    // The weights' view, then the first layout's one pool: every CU.
    assert_eq!(asked(&streams, 0), [device.all(), device.all()]);
    assert_eq!(
        summary(&p),
        [("shared".into(), (0..304).collect(), 48 * GIB, false)]
    );
    let tenants = [
        tenant("acme", Isolation::Dedicated, Some(38), Some(8 * GIB)),
        tenant("demo", Isolation::Shared, None, None),
    ];
    assert!(p.set(&tenants).unwrap());
    let mut rest = device.all();
    rest.remove_all(&device.xcd(0));
    assert_eq!(asked(&streams, 2), [device.xcd(0), rest.clone()]);
    drained(&p);
    let now = summary(&p);
    assert_eq!(now[0].0, "dedicated:acme");
    assert_eq!(now[0].1, device.xcd(0).iter().collect::<Vec<_>>());
    assert_eq!(now[0].2, 8 * GIB);
    assert_eq!((now[1].0.as_str(), now[1].2), ("shared", 40 * GIB));
    // The replaced pool's streams went with its scheduler: what holds the
    // device now is the test, the weights and the two live partitions.
    assert_eq!(Arc::strong_count(&streams.device), 1 + 1 + 2);
    // A bigger dedicated partition: new streams on two XCDs.
    let bigger = [tenant(
        "acme",
        Isolation::Dedicated,
        Some(76),
        Some(8 * GIB),
    )];
    assert!(p.set(&bigger).unwrap());
    let mut two = device.xcd(0);
    for cu in device.xcd(1).iter() {
        two.insert(cu);
    }
    let mut rest = device.all();
    rest.remove_all(&two);
    assert_eq!(asked(&streams, 4), [two, rest]);
    drained(&p);
    assert_eq!(Arc::strong_count(&streams.device), 1 + 1 + 2);
    // A GPU partition's units are CUs: no host CPUs, no lane.
    assert!(p.lane_cpus().is_empty());
    for info in p.report(&BTreeMap::new()).partitions {
        assert!(info.host_cpus.is_empty() && info.lane.is_none(), "{info:?}");
    }
    // Weights are the device's, not a partition's: the same cache throughout.
    assert_eq!(split.weights_budget().limit_bytes(), 16 * GIB);
}

#[test]
fn a_device_layout_that_leaves_the_weights_no_room_is_refused() {
    let streams = Arc::new(RecordingStreams::default());
    let (p, _workers, _split) = device_host(streams);
    let refused = p
        .set(&[tenant(
            "acme",
            Isolation::Dedicated,
            Some(38),
            Some(60 * GIB),
        )])
        .unwrap_err();
    assert!(
        matches!(refused, SchedError::Unplannable { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("of KV memory") && message.contains("48GiB"),
        "{message}"
    );
}
