use super::*;

const GIB: u64 = 1 << 30;

fn dedicated(tenant: &str, cus: u32, hbm_gib: u64) -> TenantRequest {
    TenantRequest {
        tenant: tenant.to_string(),
        gpu: GpuRequest {
            compute: Compute::Cus(cus),
            hbm_bytes: Some(hbm_gib * GIB),
            isolation: Isolation::Dedicated,
            weight: 1,
            kv_wait: None,
        },
    }
}

fn shared(tenant: &str, weight: u32, hbm_gib: Option<u64>) -> TenantRequest {
    TenantRequest {
        tenant: tenant.to_string(),
        gpu: GpuRequest {
            weight,
            hbm_bytes: hbm_gib.map(|g| g * GIB),
            ..GpuRequest::default()
        },
    }
}

fn messages(result: Result<Layout, Vec<PartitionError>>) -> Vec<String> {
    result
        .expect_err("the plan should fail")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn whole_xcds_when_the_count_allows_spread_otherwise() {
    let device = Device::mi325x();
    let tenants = [
        dedicated("acme", 76, 40),
        dedicated("beta", 40, 20),
        dedicated("gamma", 38, 10),
        shared("demo", 1, None),
    ];
    let layout = plan(&device, 16 * GIB, &tenants).unwrap();
    let (acme, _) = layout.placement("acme").unwrap();
    assert_eq!(acme.whole_xcds, [0, 1]);
    assert_eq!(acme.cus.len(), 76);
    let (gamma, _) = layout.placement("gamma").unwrap();
    assert_eq!(gamma.whole_xcds, [2], "whole XCDs go in tenant order");
    let (beta, _) = layout.placement("beta").unwrap();
    assert!(beta.whole_xcds.is_empty());
    assert_eq!(beta.cus.len(), 40);
    // 40 over the five XCDs no one owns: 8 each.
    for k in 3..8 {
        assert_eq!(beta.cus.iter().filter(|cu| cu % 8 == k).count(), 8);
    }
    let pool = layout.shared().unwrap();
    assert_eq!(pool.cus.len(), 304 - 76 - 40 - 38);
    assert!(
        pool.whole_xcds.is_empty(),
        "beta took CUs of every free XCD"
    );
    assert_eq!(pool.memory_bytes, (256 - 16 - 70) * GIB);
    let all = [acme, beta, gamma, pool];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert!(a.cus.is_disjoint(&b.cus));
        }
    }
    let (_, demo) = layout.placement("demo").unwrap();
    assert_eq!(demo.budget_bytes, (256 - 16 - 70) * GIB);
    assert_eq!(demo.max_cus, pool.cus.len());
}

#[test]
fn more_whole_xcds_than_are_left_are_spread() {
    let device = Device::mi325x();
    let layout = plan(
        &device,
        0,
        &[dedicated("a", 38 * 5, 10), dedicated("b", 38 * 3, 10)],
    )
    .unwrap();
    assert_eq!(layout.partitions[0].whole_xcds, [0, 1, 2, 3, 4]);
    assert_eq!(layout.partitions[1].whole_xcds, [5, 6, 7]);
    assert!(layout.shared().is_none(), "no units and no tenants left");

    let layout = plan(
        &device,
        0,
        &[
            dedicated("a", 38 * 5, 10),
            dedicated("b", 38 * 2, 10),
            dedicated("c", 76, 1),
        ],
    );
    // 5 + 2 XCDs whole, then c's 76 cannot be two whole XCDs (one is left).
    let layout = layout.unwrap_err();
    assert!(layout[0].to_string().contains("= 342 > 304"), "{layout:?}");
}

#[test]
fn over_subscribed_compute_names_the_tenants_and_numbers() {
    let device = Device::mi325x();
    let errors = messages(plan(
        &device,
        0,
        &[
            dedicated("globex", 160, 10),
            dedicated("acme", 200, 10),
            shared("demo", 1, None),
        ],
    ));
    assert_eq!(
        errors,
        ["dedicated CUs: acme 200 + globex 160 = 360 > 304 on mi325x"]
    );
    let cpu = Device::cpu(2, 8 * GIB).unwrap();
    let errors = messages(plan(&cpu, 0, &[dedicated("a", 2, 1), dedicated("b", 1, 1)]));
    assert_eq!(errors, ["dedicated cores: a 2 + b 1 = 3 > 2 on cpu"]);
}

#[test]
fn over_subscribed_memory_counts_the_model_reservation() {
    let device = Device::mi325x();
    let errors = messages(plan(
        &device,
        20 * GIB,
        &[dedicated("acme", 38, 100), shared("globex", 1, Some(140))],
    ));
    assert_eq!(
        errors,
        [
            "memory: acme 100GiB + globex 140GiB + model reservation 20GiB = 260GiB > 256GiB on mi325x"
        ]
    );
    let errors = messages(plan(&device, 300 * GIB, &[]));
    assert_eq!(
        errors,
        ["memory: model reservation 300GiB = 300GiB > 256GiB on mi325x"]
    );
}

#[test]
fn invalid_values_are_named() {
    let device = Device::mi325x();
    let mut bad_share = shared("a", 1, None);
    bad_share.gpu.compute = Compute::Share(1.5);
    let mut nan_share = shared("b", 1, None);
    nan_share.gpu.compute = Compute::Share(f64::NAN);
    let mut tiny_share = shared("c", 1, None);
    tiny_share.gpu.compute = Compute::Share(0.001);
    let zero_weight = shared("d", 0, Some(0));
    let mut no_hbm = dedicated("e", 38, 1);
    no_hbm.gpu.hbm_bytes = None;
    let zero_cus = dedicated("f", 0, 1);
    let errors = messages(plan(
        &device,
        0,
        &[
            bad_share,
            nan_share,
            tiny_share,
            zero_weight,
            no_hbm,
            zero_cus,
        ],
    ));
    assert_eq!(
        errors,
        [
            "tenant a: `share` is 1.5; it must be more than 0 and at most 1",
            "tenant b: `share` is NaN; it must be more than 0 and at most 1",
            "tenant c: `share` 0.001 of 304 CUs is less than one",
            "tenant d: `weight` must be at least 1",
            "tenant d: `hbm` must be more than 0 bytes",
            "tenant e: a dedicated partition needs `hbm` (its own memory budget)",
            "tenant f: `cus` must be at least 1",
        ]
    );
}

#[test]
fn shared_tenants_need_a_pool_and_caps_must_fit_it() {
    let device = Device::mi325x();
    let errors = messages(plan(
        &device,
        0,
        &[
            dedicated("acme", 304, 10),
            shared("demo", 1, None),
            shared("beta", 1, None),
        ],
    ));
    assert_eq!(
        errors,
        [
            "no shared pool: dedicated tenants take all 304 CUs of mi325x, leaving none for beta, demo"
        ]
    );
    let mut capped = shared("demo", 1, None);
    capped.gpu.compute = Compute::Share(0.5);
    let errors = messages(plan(&device, 0, &[dedicated("acme", 228, 10), capped]));
    assert_eq!(
        errors,
        [
            "tenant demo: shared compute capped at 152 CUs, but the shared pool of mi325x has 76 after dedicated partitions"
        ]
    );
    let errors = messages(plan(
        &device,
        56 * GIB,
        &[dedicated("acme", 38, 200), shared("demo", 1, None)],
    ));
    assert_eq!(
        errors,
        [
            "no memory left on mi325x for tenants without `hbm`: demo (the `hbm` budgets and the model reservation take all 256GiB)"
        ]
    );
}

#[test]
fn shares_resolve_against_the_device() {
    let device = Device::mi325x();
    let mut quarter = dedicated("acme", 0, 10);
    quarter.gpu.compute = Compute::Share(0.25);
    let layout = plan(&device, 0, &[quarter]).unwrap();
    assert_eq!(layout.partitions[0].cus.len(), 76);
    assert_eq!(layout.partitions[0].whole_xcds, [0, 1]);
}

#[test]
fn unclaimed_memory_is_split_by_weight_and_borrowable() {
    let device = Device::cpu(4, 100 * GIB).unwrap();
    let layout = plan(
        &device,
        10 * GIB,
        &[
            dedicated("ded", 1, 10),
            shared("fixed", 1, Some(20)),
            shared("heavy", 3, None),
            shared("light", 1, None),
        ],
    )
    .unwrap();
    assert_eq!(layout.partitions[0].cus, CuSet::from_ids(4, [0]));
    let pool = layout.shared().unwrap();
    assert_eq!(pool.cus, CuSet::from_ids(4, 1..4));
    assert_eq!(pool.memory_bytes, 80 * GIB);
    let (_, fixed) = layout.placement("fixed").unwrap();
    assert_eq!(
        (fixed.guaranteed_bytes, fixed.budget_bytes),
        (20 * GIB, 20 * GIB)
    );
    let (_, heavy) = layout.placement("heavy").unwrap();
    assert_eq!(
        (heavy.guaranteed_bytes, heavy.budget_bytes),
        (45 * GIB, 60 * GIB)
    );
    let (_, light) = layout.placement("light").unwrap();
    assert_eq!(
        (light.guaranteed_bytes, light.budget_bytes),
        (15 * GIB, 60 * GIB)
    );
}

#[test]
fn the_same_input_in_any_order_gives_the_same_layout() {
    let device = Device::mi325x();
    let mut tenants = vec![
        dedicated("a", 50, 10),
        dedicated("b", 38, 10),
        dedicated("c", 17, 10),
        shared("d", 2, None),
        shared("e", 1, Some(5)),
    ];
    let first = plan(&device, GIB, &tenants).unwrap();
    tenants.reverse();
    assert_eq!(plan(&device, GIB, &tenants).unwrap(), first);
    tenants.swap(0, 3);
    assert_eq!(plan(&device, GIB, &tenants).unwrap(), first);
    tenants.push(shared("d", 1, None));
    assert_eq!(
        messages(plan(&device, GIB, &tenants)),
        ["tenant d is listed twice"]
    );
}

#[test]
fn in_flight_work_keeps_the_layout_it_started_on() {
    use crate::LayoutCell;
    let device = Device::cpu(2, 8 * GIB).unwrap();
    let before = plan(&device, 0, &[shared("a", 1, None)]).unwrap();
    let cell = LayoutCell::new(before.clone());
    let running = cell.current();
    let after = plan(&device, 0, &[dedicated("a", 1, 4), shared("b", 1, None)]).unwrap();
    let old = cell.publish(after.clone());
    assert_eq!(*running, before, "work that started keeps its layout");
    assert_eq!(*old, before);
    assert_eq!(*cell.current(), after);
}

#[test]
fn slots_carry_the_whole_request() {
    let device = Device::cpu(4, 8 * GIB).unwrap();
    let mut waits = shared("waits", 1, None);
    waits.gpu.kv_wait = Some(Duration::from_millis(2500));
    let tenants = [dedicated("own", 2, 2), waits, shared("pooled", 1, Some(1))];
    let layout = plan(&device, 0, &tenants).unwrap();
    let slot = |t: &str| layout.placement(t).unwrap().1.clone();
    assert!(slot("own").owns_memory);
    assert_eq!(slot("own").kv_wait, DEFAULT_KV_WAIT);
    assert!(!slot("waits").owns_memory);
    assert_eq!(slot("waits").kv_wait, Duration::from_millis(2500));
    assert!(slot("pooled").owns_memory);

    let mut greedy = shared("greedy", 1, None);
    greedy.gpu.kv_wait = Some(MAX_KV_WAIT + Duration::from_millis(1));
    assert_eq!(
        messages(plan(&device, 0, &[greedy])),
        ["tenant greedy: `kv_wait_ms` is 120001; at most 120000 (2 minutes)"]
    );
}
