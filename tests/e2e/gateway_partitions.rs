//! Partitions through the gateway: a tenant's `[gpu]` table becomes a
//! dedicated partition on the local gpu-host (its own core and KV memory),
//! shown by `GET /admin/v1/partitions` (scope `admin` only) and the
//! `bulkhead_partition_*` metrics; a policy reload re-partitions the host.

use bulkhead_tests::{ALL_OPERATOR_SCOPES, Gateway, PolicyDir, gateway_toml};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

fn demo_tenant(policies: &PolicyDir, gpu: &str) {
    let base = bulkhead_tests::repo().join("policies/tenants/demo.toml");
    let text = std::fs::read_to_string(base).unwrap();
    policies.write("tenants/demo.toml", &format!("{text}\n{gpu}"));
}

fn partitions(gateway: &Gateway, token: &str) -> Value {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/partitions", Some(token), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// Each partition of the host: (id, cores, memory_bytes), draining ones left out.
fn layout(report: &Value) -> Vec<(String, Vec<u64>, u64)> {
    report["data"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["draining"] == false)
        .map(|p| {
            let cores = p["cores"].as_array().unwrap();
            (
                p["id"].as_str().unwrap().to_string(),
                cores.iter().map(|c| c.as_u64().unwrap()).collect(),
                p["memory_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_dedicated_tenant_gets_its_own_partition_shown_to_admins_and_in_metrics() {
    let policies = PolicyDir::new("partitions");
    // 512MiB for weights and KV, 64MiB of it set aside for the weights:
    // the child must plan with the other 448MiB, as `policy check` did.
    let toml = gateway_toml("").replace(
        "threads = 1",
        "threads = 2\nmemory = \"512MiB\"\nmodel_reservation = \"64MiB\"",
    );
    policies.write(
        "gateway.toml",
        &format!("{toml}{}", policies.state_tables()),
    );
    demo_tenant(
        &policies,
        "[gpu]\nisolation = \"dedicated\"\ncus = 1\nhbm = \"64MiB\"\n",
    );
    let gateway = Gateway::start(&policies);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &[]);
    let inference = policies.token("demo", &[]);

    // Operators only: a tenant's token is not an operator's.
    let r = gateway
        .admin
        .request("GET", "/admin/v1/partitions", None, None);
    assert_eq!(r.status, 401, "{}", r.body);
    let r = gateway
        .admin
        .request("GET", "/admin/v1/partitions", Some(&inference), None);
    assert_eq!(
        (r.status, r.error_code()),
        (401, "unknown_issuer".to_string())
    );
    // Nor is /admin/ on the tenants' listener.
    let r = gateway.request("GET", "/admin/v1/partitions", Some(&admin), None);
    assert_eq!(r.status, 404, "{}", r.body);

    let report = partitions(&gateway, &admin);
    let device = &report["data"][0];
    assert_eq!(
        (&device["device"], &device["unit"], &device["compute_units"]),
        (&json!("cpu"), &json!("cores"), &json!(2))
    );
    assert_eq!(device["memory_bytes"], json!(448 * MIB));
    assert_eq!(report["object"], "list");
    assert_eq!(
        layout(&report)[0],
        ("dedicated:demo".to_string(), vec![0], 64 * MIB)
    );
    assert_eq!(layout(&report)[1].0, "shared");
    assert_eq!(layout(&report)[1].1, [1]);
    let dedicated = &device["partitions"][0];
    assert_eq!(dedicated["kind"], "dedicated");
    let tenant = &dedicated["tenants"][0];
    assert_eq!(
        (
            &tenant["tenant"],
            &tenant["budget_bytes"],
            &tenant["kv_blocks"]
        ),
        (&json!("demo"), &json!(64 * MIB), &json!(0))
    );

    // The tenant's requests run there.
    let body = json!({"model": "bulkhead-demo-tiny", "prompt": "Emma was", "max_tokens": 4});
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&inference),
        Some(&body.to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // The metrics follow within a poll (one taken while the request ran
    // still counts it as running: wait for one after it).
    let series = [
        "bulkhead_partition_memory_bytes{partition=\"dedicated:demo\"} 67108864",
        "bulkhead_partition_running{partition=\"dedicated:demo\"} 0",
        "bulkhead_partition_queued{partition=\"shared\"} 0",
        "bulkhead_partition_kv_blocks{partition=\"dedicated:demo\",tenant=\"demo\"} 0",
        "bulkhead_partition_preemptions_total{partition=\"dedicated:demo\"} 0",
    ];
    gateway.eventually("exported the partitions", || {
        let text = gateway.admin.request("GET", "/metrics", None, None).body;
        series.iter().all(|s| text.contains(s))
    });

    // A reload without `[gpu]`: the host goes back to one shared pool.
    demo_tenant(&policies, "");
    gateway.eventually("re-partitioned after the reload", || {
        let now = layout(&partitions(&gateway, &admin));
        now.len() == 1 && now[0].0 == "shared" && now[0].1 == [0, 1]
    });
    let report = partitions(&gateway, &admin);
    assert!(report["data"][0]["generation"].as_u64().unwrap() >= 3);
    // Its gauges go (its counters stay, as Prometheus counters do).
    gateway.eventually("dropped the old partition's gauges", || {
        let text = gateway.admin.request("GET", "/metrics", None, None).body;
        !text.contains("bulkhead_partition_running{partition=\"dedicated:demo\"}")
            && !text.contains("bulkhead_partition_kv_blocks{partition=\"dedicated:demo\"")
            && text.contains("bulkhead_partition_running{partition=\"shared\"} 0")
    });
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&inference),
        Some(&body.to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}
