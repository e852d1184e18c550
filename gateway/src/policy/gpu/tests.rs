use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bulkhead_partition::PartitionKind;

use super::super::test_folder::TestFolder;
use super::*;
use crate::policy::{Policy, load, watch};

const GIB: u64 = 1 << 30;

fn gateway(device_lines: &str) -> String {
    format!(
        "[local_gpu_host]\n{device_lines}\n[[local_gpu_host.models]]\nname = \"tiny\"\n\
         dir = \"models/tiny\"\nsignature = \"models/tiny.sig\"\n"
    )
}

fn tenant(id: &str, gpu: &str) -> String {
    format!(
        "id = \"{id}\"\nmodels = [\"tiny\"]\n\n[jwt]\nissuer = \"https://{id}.example\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n{gpu}"
    )
}

fn folder(device_lines: &str, tenants: &[(&str, &str)]) -> TestFolder {
    let folder = TestFolder::new();
    folder
        .trust_publisher()
        .signed_model("tiny", &[0u8; 4096])
        .write("gateway.toml", gateway(device_lines));
    for (id, gpu) in tenants {
        folder.write(&format!("tenants/{id}.toml"), tenant(id, gpu));
    }
    folder
}

fn errors(folder: &TestFolder) -> Vec<String> {
    match load(folder.path()) {
        Ok(_) => panic!("the folder loaded, but errors were expected"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn tenants_are_planned_on_the_configured_device() {
    let folder = folder(
        "device = \"mi325x\"\nmodel_reservation = \"16GiB\"",
        &[
            (
                "acme",
                "\n[gpu]\nisolation = \"dedicated\"\ncus = 76\nhbm = \"40GiB\"\n",
            ),
            (
                "beta",
                "\n[gpu]\nshare = 0.25\nweight = 3\nhbm = \"20GiB\"\n",
            ),
            ("demo", ""),
        ],
    );
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let layout = policy.partitions.as_deref().expect("a layout");
    assert_eq!(layout.device.name, "mi325x");
    assert_eq!(layout.model_reservation_bytes, 16 * GIB);
    let (acme, slot) = layout.placement("acme").unwrap();
    assert_eq!(acme.kind, PartitionKind::Dedicated);
    assert_eq!(acme.whole_xcds, [0, 1]);
    assert_eq!(slot.budget_bytes, 40 * GIB);
    let (pool, beta) = layout.placement("beta").unwrap();
    assert_eq!(pool.kind, PartitionKind::Shared);
    assert_eq!(
        (beta.weight, beta.max_cus, beta.budget_bytes),
        (3, 76, 20 * GIB)
    );
    let (_, demo) = layout.placement("demo").unwrap();
    assert_eq!(demo.budget_bytes, (256 - 16 - 40 - 20) * GIB);
    assert_eq!(policy.tenants["beta"].gpu.weight, 3);
}

#[test]
fn over_subscription_names_tenants_and_numbers_in_the_first_tenants_file() {
    let folder = folder(
        "device = \"mi325x\"\nmodel_reservation = \"4GiB\"",
        &[
            (
                "acme",
                "\n[gpu]\nisolation = \"dedicated\"\ncus = 200\nhbm = \"100GiB\"\n",
            ),
            (
                "globex",
                "\n[gpu]\nisolation = \"dedicated\"\ncus = 160\nhbm = \"200GiB\"\n",
            ),
        ],
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/acme.toml:9:1: dedicated CUs: acme 200 + globex 160 = 360 > 304 on mi325x",
            "tenants/acme.toml:9:1: memory: acme 100GiB + globex 200GiB + model reservation \
             4GiB = 304GiB > 256GiB on mi325x",
        ]
    );
}

#[test]
fn the_cpu_device_counts_threads_as_cores() {
    let folder = folder(
        "threads = 2\nmemory = \"8GiB\"",
        &[
            (
                "a",
                "\n[gpu]\nisolation = \"dedicated\"\ncus = 2\nhbm = \"1GiB\"\n",
            ),
            ("b", ""),
        ],
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/b.toml:1:1: no shared pool: dedicated tenants take all 2 cores of cpu, \
          leaving none for b"
        ]
    );
    folder.write(
        "tenants/a.toml",
        tenant(
            "a",
            "\n[gpu]\nisolation = \"dedicated\"\ncus = 1\nhbm = \"1GiB\"\n",
        ),
    );
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let layout = policy.partitions.unwrap();
    assert_eq!(layout.device.memory_bytes, 8 * GIB);
    let (a, _) = layout.placement("a").unwrap();
    assert_eq!(a.cus.iter().collect::<Vec<_>>(), [0]);
    let (b, _) = layout.placement("b").unwrap();
    assert_eq!(b.cus.iter().collect::<Vec<_>>(), [1]);
}

#[test]
fn each_value_is_checked_where_it_is_written() {
    let folder = folder(
        "device = \"mi325x\"",
        &[
            ("a", "\n[gpu]\nhbm = \"24G\"\n"),
            ("b", "\n[gpu]\nshare = 1.5\n"),
            ("c", "\n[gpu]\ncus = 4\nshare = 0.5\n"),
            ("d", "\n[gpu]\nweight = 0\n"),
            ("e", "\n[gpu]\nisolation = \"dedicated\"\ncus = 38\n"),
            ("f", "\n[gpu]\nhbm = \"0GiB\"\n"),
            ("g", "\n[gpu]\nshare = 0.001\n"),
        ],
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/a.toml:10:7: `hbm`: `24G` is not a size: unknown unit: use B, KiB, MiB, \
             GiB, TiB (or kB, MB, GB, TB), no space",
            "tenants/b.toml:10:9: `share` is 1.5; it must be more than 0 and at most 1",
            "tenants/c.toml:11:9: set `cus` or `share`, not both",
            "tenants/d.toml:10:10: `weight` must be at least 1",
            "tenants/e.toml:10:13: a dedicated partition needs `hbm` (its own memory budget)",
            "tenants/f.toml:10:7: `hbm` must be more than 0 bytes",
            "tenants/g.toml:10:9: `share` 0.001 of 304 CUs is less than one",
        ]
    );
}

#[test]
fn shapes_are_checked_by_the_parser() {
    let folder = folder(
        "",
        &[
            ("a", "\n[gpu]\nisolation = \"dedicatd\"\n"),
            ("b", "\n[gpu]\ncus = -1\n"),
            ("c", "\n[gpu]\nhbm_bytes = 1\n"),
        ],
    );
    let errors = errors(&folder);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].starts_with("tenants/a.toml:10:13: unknown variant `dedicatd`"),
        "{errors:?}"
    );
    assert!(errors[1].starts_with("tenants/b.toml:10:7: "), "{errors:?}");
    assert!(
        errors[2].starts_with("tenants/c.toml:10:1: unknown field `hbm_bytes`"),
        "{errors:?}"
    );
}

#[test]
fn the_device_settings_are_checked() {
    let bad = [
        (
            "device = \"mi300x\"",
            "gateway.toml:2:10: unknown device `mi300x`: expected \"cpu\" or \"mi325x\"",
        ),
        (
            "device = \"mi325x\"\nmemory = \"1TiB\"",
            "gateway.toml:3:10: `memory` is set by the device for \"mi325x\" (256GiB); set it \
             only for device = \"cpu\"",
        ),
        (
            "model_reservation = \"1KiB\"",
            "gateway.toml:2:21: `model_reservation` is 1KiB, less than the model files take (4KiB)",
        ),
        (
            "memory = \"1MiB\"\nmodel_reservation = \"2MiB\"",
            "gateway.toml:3:21: the model reservation (2MiB) is more than the cpu device has (1MiB)",
        ),
        (
            "memory = \"lots\"",
            "gateway.toml:2:10: `memory`: `lots` is not a size: expected a whole number followed \
             by a unit, e.g. \"24GiB\"",
        ),
    ];
    for (lines, expected) in bad {
        assert_eq!(
            errors(&folder(lines, &[("demo", "")])),
            [expected],
            "{lines}"
        );
    }
}

#[test]
fn with_a_remote_upstream_values_are_checked_but_nothing_is_planned() {
    let folder = TestFolder::new();
    folder
        .write(
            "gateway.toml",
            "[upstream]\ntarget = \"unix:/run/gpu-host.sock\"\n\n\
             [models]\nregistry = \"../registry\"\n",
        )
        .write(
            "tenants/a.toml",
            tenant(
                "a",
                "\n[gpu]\nisolation = \"dedicated\"\nshare = 0.5\nhbm = \"100GiB\"\n",
            ),
        );
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(policy.partitions.is_none());
    folder.write("tenants/a.toml", tenant("a", "\n[gpu]\nshare = 2\n"));
    assert_eq!(
        errors(&folder),
        ["tenants/a.toml:10:9: `share` is 2; it must be more than 0 and at most 1"]
    );
}

#[tokio::test]
async fn a_reload_that_over_subscribes_keeps_the_old_policy() {
    let folder = folder(
        "device = \"mi325x\"",
        &[(
            "acme",
            "\n[gpu]\nisolation = \"dedicated\"\ncus = 200\nhbm = \"10GiB\"\n",
        )],
    );
    let current = Arc::new(ArcSwap::from_pointee(load(folder.path()).unwrap()));
    let watcher = watch(folder.path(), load, Arc::clone(&current)).unwrap();
    let stats = Arc::clone(watcher.stats());
    let before: Arc<Policy> = current.load_full();
    let globex = tenant(
        "globex",
        "\n[gpu]\nisolation = \"dedicated\"\ncus = 160\nhbm = \"10GiB\"\n",
    );
    folder.write("tenants/.globex.tmp", globex);
    std::fs::rename(
        folder.path().join("tenants/.globex.tmp"),
        folder.path().join("tenants/globex.toml"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.reloads_failed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the reload was never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        Arc::ptr_eq(&before, &current.load_full()),
        "the old policy stays"
    );
    let last_error = stats.last_error.lock().unwrap().clone().unwrap();
    assert!(
        last_error.ends_with("dedicated CUs: acme 200 + globex 160 = 360 > 304 on mi325x"),
        "{last_error}"
    );
}

#[test]
fn kv_wait_is_at_most_two_minutes_and_reaches_the_tenant() {
    let folder = folder(
        "threads = 2",
        &[
            ("a", "\n[gpu]\nkv_wait_ms = 500\n"),
            ("b", ""),
            ("c", "\n[gpu]\nkv_wait_ms = 120001\n"),
        ],
    );
    assert_eq!(
        errors(&folder),
        ["tenants/c.toml:10:14: `kv_wait_ms` is 120001; at most 120000 (2 minutes)"]
    );
    folder.write("tenants/c.toml", tenant("c", "\n[gpu]\nkv_wait_ms = 0\n"));
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let waits: Vec<Option<Duration>> = ["a", "b", "c"]
        .iter()
        .map(|t| policy.tenants[*t].gpu.kv_wait)
        .collect();
    let ms = Duration::from_millis;
    assert_eq!(waits, [Some(ms(500)), None, Some(ms(0))]);
    let set = crate::reconcile::tenant_set(&policy);
    let wire = bulkhead_protocol::v1::TenantGpu::from(&set[0]);
    assert_eq!(wire.kv_wait_ms, Some(500));
}

/// The tenant set of `policy` planned as the local child plans it: its own
/// CPU device of `--threads` cores and `--kv-memory` bytes (as the
/// supervisor passes them), no reservation (weights are outside its KV).
fn child_plan(policy: &Policy) -> Result<Layout, Vec<PartitionError>> {
    let crate::policy::UpstreamSettings::Local(host) = &policy.gateway.upstream else {
        panic!("a local gpu-host is configured");
    };
    let cores = host.threads.map_or_else(host_cores, |t| t as u32);
    let kv = host
        .kv_memory_bytes()
        .expect("a cpu device gives the child --kv-memory");
    let requests: Vec<TenantRequest> = policy
        .tenants
        .values()
        .map(|t| TenantRequest {
            tenant: t.id.clone(),
            gpu: t.gpu.clone(),
        })
        .collect();
    plan(&Device::cpu(cores, kv).unwrap(), 0, &requests)
}

#[test]
fn the_local_child_plans_a_checked_policy_on_the_same_memory_and_cores() {
    // The model file is 4096 bytes, so the KV memory is 8GiB - 4096: `a`,
    // `b` and `c` together take all of it, which both sides accept ...
    let kv = 8 * GIB - 4096;
    let b_bytes = kv - GIB - (1 << 20);
    let gpu = |cus: u32, bytes: u64| {
        format!("\n[gpu]\nisolation = \"dedicated\"\ncus = {cus}\nhbm = \"{bytes}B\"\n")
    };
    let folder = folder(
        "threads = 3\nmemory = \"8GiB\"",
        &[
            ("a", &gpu(1, GIB)),
            ("b", &gpu(1, b_bytes)),
            ("c", "\n[gpu]\nhbm = \"1MiB\"\n"),
        ],
    );
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let layout = policy.partitions.clone().unwrap();
    let child = child_plan(&policy).unwrap_or_else(|e| panic!("the child refuses: {e:?}"));
    assert_eq!(child.partitions.len(), 2 + 1);
    for (gateway, child) in layout.partitions.iter().zip(&child.partitions) {
        assert_eq!(
            (&gateway.cus, gateway.memory_bytes, &gateway.tenants),
            (&child.cus, child.memory_bytes, &child.tenants)
        );
    }
    // ... and one byte more, which both refuse (before the fix the child,
    // on its own default --kv-memory, refused sets the check accepted).
    folder.write("tenants/b.toml", tenant("b", &gpu(1, b_bytes + 1)));
    assert!(
        errors(&folder)[0].contains("memory:"),
        "{:?}",
        errors(&folder)
    );
    folder.write("tenants/b.toml", tenant("b", &gpu(1, b_bytes)));
    let mut policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    if let Some(b) = policy.tenants.get_mut("b") {
        b.gpu.hbm_bytes = Some(b_bytes + 1);
    }
    assert!(child_plan(&policy).is_err());
}

#[test]
fn without_memory_the_check_uses_the_childs_default_kv_memory() {
    let folder = folder("threads = 2", &[("a", "")]);
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let crate::policy::UpstreamSettings::Local(host) = &policy.gateway.upstream else {
        panic!("a local gpu-host is configured");
    };
    assert_eq!(host.model_reservation_bytes, 4096);
    assert_eq!(host.device.memory_bytes, 4096 + default_kv_memory_bytes());
    assert_eq!(host.kv_memory_bytes(), Some(default_kv_memory_bytes()));
    // A GPU device's memory is the child's own to read: no --kv-memory.
    let folder = folder_gpu();
    let policy = load(folder.path()).unwrap_or_else(|e| panic!("{e}"));
    let crate::policy::UpstreamSettings::Local(host) = &policy.gateway.upstream else {
        panic!("a local gpu-host is configured");
    };
    assert_eq!(host.kv_memory_bytes(), None);
}

fn folder_gpu() -> TestFolder {
    folder("device = \"mi325x\"", &[("a", "")])
}
