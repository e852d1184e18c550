//! Connection lanes: a tenant in a dedicated partition of the local
//! gpu-host has its connections served by a gateway thread pinned to the
//! partition's host CPUs (`lane:TENANT`), counted in
//! `bulkhead_lane_connections_total`; requests that name no tenant (a bad
//! token) are still refused, on the main runtime; the gpu-host child
//! serves the partition on its own lane thread pinned alike; and shutdown
//! lets a stream on a lane finish.

use std::io::{Read, Write};

use bulkhead_tests::{ALL_OPERATOR_SCOPES, Gateway, PolicyDir, gateway_toml};
use serde_json::{Value, json};

const MODEL: &str = "bulkhead-demo-tiny";
const LANES: &str = "bulkhead_lane_connections_total";

/// The host CPUs of the tenant's dedicated partition (not draining).
fn partition_cpus(gateway: &Gateway, admin: &str, tenant: &str) -> Vec<u64> {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/partitions", Some(admin), None);
    assert_eq!(r.status, 200, "{}", r.body);
    let report: Value = r.json();
    let partition = report["data"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == format!("dedicated:{tenant}") && p["draining"] == false)
        .unwrap_or_else(|| panic!("no dedicated partition for {tenant}: {report}"))
        .clone();
    partition["host_cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect()
}

/// The CPUs the gateway's thread named `name` may run on, if it exists.
fn thread_cpus(pid: u32, name: &str) -> Option<Vec<u64>> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?.path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).ok()?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        return Some(cpu_list(list.trim()));
    }
    None
}

/// The pid of the gateway's `bulkhead-gpu-host` child.
fn gpu_host_pid(gateway: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
                .map(str::to_string)
        };
        let child =
            field("PPid:")? == gateway.to_string() && field("Name:")?.starts_with("bulkhead-gpu");
        child.then_some(pid)
    })
}

/// `0-2,5` → [0, 1, 2, 5].
fn cpu_list(list: &str) -> Vec<u64> {
    list.split(',')
        .flat_map(|range| {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            from.parse::<u64>().unwrap()..=to.parse::<u64>().unwrap()
        })
        .collect()
}

#[test]
fn a_dedicated_tenants_connections_are_served_on_its_partitions_cpus() {
    let policies = PolicyDir::new("lanes");
    let toml = gateway_toml("").replace("threads = 1", "threads = 2\nmemory = \"512MiB\"");
    policies.write(
        "gateway.toml",
        &format!("{toml}{}", policies.state_tables()),
    );
    let base = bulkhead_tests::repo().join("policies/tenants/demo.toml");
    let text = std::fs::read_to_string(base).unwrap();
    policies.write(
        "tenants/demo.toml",
        &format!("{text}\n[gpu]\nisolation = \"dedicated\"\ncus = 1\nhbm = \"64MiB\"\n"),
    );
    let gateway = Gateway::start(&policies);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &[]);
    let token = policies.token("demo", &[]);
    let lane_connections = || gateway.metric(LANES, &[("tenant", "demo")]);

    let cpus = partition_cpus(&gateway, &admin, "demo");
    assert!(
        !cpus.is_empty(),
        "the gpu-host reports the partition's host CPUs"
    );
    // The gpu-host child serves the partition on its own lane too, pinned alike.
    let host = gpu_host_pid(gateway.pid()).expect("the gateway's gpu-host child");
    gateway.eventually("started the gpu-host's lane", || {
        thread_cpus(host, "lane:demo").as_ref() == Some(&cpus)
    });

    // The lane starts at the partition watcher's next poll, pinned to the
    // partition's CPUs; from then on the tenant's connections go to it.
    gateway.eventually("started the tenant's lane", || {
        thread_cpus(gateway.pid(), "lane:demo").as_ref() == Some(&cpus)
    });
    gateway.eventually("routed a connection to the lane", || {
        let r = gateway.request("GET", "/v1/models", Some(&token), None);
        assert_eq!(r.status, 200, "{}", r.body);
        lane_connections() >= 1.0
    });

    // A streaming completion on the lane.
    let before = lane_connections();
    let body = json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 8, "stream": true});
    let mut stream = gateway.stream("/v1/completions", &token, &body.to_string());
    assert_eq!(stream.status, 200);
    let events = stream.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    assert_eq!(lane_connections(), before + 1.0);

    // A bad token names no tenant: refused, and not by the lane.
    let r = gateway.request("GET", "/v1/models", Some("not.a.jwt"), None);
    assert_eq!(r.status, 401, "{}", r.body);
    let r = gateway.request("POST", "/v1/completions", None, Some(&body.to_string()));
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(lane_connections(), before + 1.0);

    // A keep-alive connection the lane took for demo, then used for a
    // request that is not demo's (a pooling proxy does this): that answer
    // closes the connection, so the next request is routed afresh.
    let mut tcp = std::net::TcpStream::connect(gateway.addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let owner =
        format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n");
    tcp.write_all(owner.as_bytes()).unwrap();
    let first = read_one_response(&mut tcp);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    assert_eq!(lane_connections(), before + 2.0, "the lane took it");
    let foreign = || {
        gateway.metric(
            "bulkhead_lane_foreign_requests_total",
            &[("tenant", "demo")],
        )
    };
    let foreign_before = foreign();
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut rest = String::new();
    tcp.read_to_string(&mut rest)
        .expect("the lane closes the connection");
    assert!(rest.starts_with("HTTP/1.1 401"), "{rest}");
    assert!(
        rest.to_ascii_lowercase().contains("connection: close"),
        "{rest}"
    );
    assert_eq!(foreign(), foreign_before + 1.0);

    // SIGTERM with a stream open on the lane: the stream finishes.
    let body = json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 64, "stream": true, "temperature": 0});
    let mut stream = gateway.stream("/v1/completions", &token, &body.to_string());
    assert_eq!(stream.status, 200);
    stream.next_event().expect("a first chunk");
    assert_eq!(lane_connections(), before + 3.0);
    gateway.terminate_during(&mut stream);
}

/// One whole response with a `content-length` body from a keep-alive
/// connection, leaving the connection open.
fn read_one_response(tcp: &mut std::net::TcpStream) -> String {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).unwrap();
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .expect("a content-length");
    let mut body = vec![0; length];
    tcp.read_exact(&mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}
