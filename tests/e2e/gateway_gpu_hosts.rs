//! Scale-out on loopback: three gateway replicas sharing limits through
//! Redis (through a proxy that can cut it off), each with two gpu-hosts
//! (`[[gpu_hosts]]`, Unix sockets) serving the demo model. Limits hold
//! across the replicas; both hosts take generations; killing a host
//! mid-load loses no request that had not started streaming, and the host
//! is ejected and comes back when it restarts; a drained host finishes its
//! streams and takes no new ones; cutting Redis off switches every replica
//! to its share and back.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bulkhead_tests::redis::{Keys, Proxy, prefix, redis, redis_addr};
use bulkhead_tests::{
    Gateway, PolicyDir, bin, demo_model_dir, demo_model_signature, operator_table,
};
use serde_json::{Value, json};

const MODEL: &str = "bulkhead-demo-tiny";
/// Five processes share the machine's cores with the test: the default
/// 20 ms would send replicas to their fallback whenever a core is busy.
const STORE_TIMEOUT_MS: u32 = 250;

/// A gpu-host on a Unix socket of its own, restartable on the same socket.
struct Host {
    name: &'static str,
    dir: PathBuf,
    child: Option<Child>,
}

impl Host {
    fn start(test: &str, name: &'static str) -> Host {
        let dir =
            std::env::temp_dir().join(format!("bulkhead-e2e-{test}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut host = Host {
            name,
            dir,
            child: None,
        };
        host.spawn();
        host
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("gpu.sock")
    }

    /// Starts the process (holding no model) and waits until it listens.
    fn spawn(&mut self) {
        let mut child = Command::new(bin("bulkhead-gpu-host"))
            .args(["serve", "--threads", "1", "--listen"])
            .arg(format!("unix:{}", self.socket().display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bulkhead-gpu-host starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening on "), "{line:?}");
        self.child = Some(child);
    }

    /// SIGKILL, as a crash or a lost machine.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its `[[gpu_hosts]]` table, serving the demo model.
    fn table(&self) -> String {
        format!(
            "[[gpu_hosts]]\nname = \"{}\"\ntarget = \"unix:{}\"\n\n\
             [[gpu_hosts.models]]\nname = \"{MODEL}\"\ndir = \"{}\"\nsignature = \"{}\"\n\n",
            self.name,
            self.socket().display(),
            demo_model_dir().display(),
            demo_model_signature().display(),
        )
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three replicas over the two hosts, sharing limits at `store` under
/// `prefix`; `demo` gets `limits`.
fn replicas(
    test: &str,
    hosts: &[&Host],
    store: &str,
    prefix: &str,
    limits: &str,
) -> Vec<(PolicyDir, Gateway)> {
    let tables: String = hosts.iter().map(|h| h.table()).collect();
    (0..3)
        .map(|i| {
            let policies = PolicyDir::new(&format!("{test}-{i}"));
            policies.write(
                "gateway.toml",
                &format!(
                    "{tables}{}{}\n[limits]\nstore = \"redis://{store}/0\"\nkey_prefix = \"{prefix}\"\n\
                     replicas = 3\nstore_timeout_ms = {STORE_TIMEOUT_MS}\n",
                    operator_table(),
                    policies.state_tables(),
                ),
            );
            policies.set_demo_limits(limits);
            let gateway = Gateway::start(&policies);
            (policies, gateway)
        })
        .collect()
}

fn completion(max_tokens: u32, stream: bool) -> String {
    json!({"model": MODEL, "prompt": "Emma was", "max_tokens": max_tokens, "stream": stream,
           "temperature": 0.8, "seed": 7})
    .to_string()
}

/// Generations each host started, all replicas together.
fn generations(replicas: &[(PolicyDir, Gateway)], host: &str) -> f64 {
    replicas
        .iter()
        .map(|(_, g)| g.metric("bulkhead_gpu_host_generations_total", &[("host", host)]))
        .sum()
}

/// One host as `GET /admin/v1/gpu-hosts` shows it on `gateway`.
fn host_view(policies: &PolicyDir, gateway: &Gateway, name: &str) -> Value {
    let token = policies.operator_token(&["gpu-hosts:read"], &[]);
    let r = gateway
        .admin
        .request("GET", "/admin/v1/gpu-hosts", Some(&token), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == name)
        .unwrap_or_else(|| panic!("no host {name} in {}", r.body))
        .clone()
}

#[test]
fn three_replicas_and_two_hosts_share_limits_load_failures_and_drains() {
    let prefix = prefix("scale-out");
    let _keys = Keys(prefix.clone());
    let proxy = Proxy::start(&redis_addr());
    let mut a = Host::start("scale-out", "gpu-a");
    let b = Host::start("scale-out", "gpu-b");
    // A burst of 6 between the three replicas, 1 more a second.
    let limits = "requests_per_s = 1\nburst = 6\ntokens_per_min = 1000000\nmax_concurrent = 64";
    let replicas = replicas("scale-out", &[&a, &b], &proxy.addr, &prefix, limits);
    let token = replicas[0].0.token("demo", &[]);

    // 1. Limits hold across the replicas: with memory stores each would
    //    admit 6 (18 in all).
    let started = Instant::now();
    let mut admitted = 0;
    for i in 0..18 {
        let gateway = &replicas[i % 3].1;
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(1, false)),
        );
        match r.status {
            200 => admitted += 1,
            429 => assert_eq!(r.error_code(), "rate_limit_requests", "{}", r.body),
            other => panic!("{other}: {}", r.body),
        }
    }
    let refilled = started.elapsed().as_secs() + 1;
    assert!(
        (6..=6 + refilled).contains(&admitted),
        "{admitted} admitted in {refilled} s"
    );

    // The rest runs with room to spare.
    let roomy =
        "requests_per_s = 1000\nburst = 1000\ntokens_per_min = 10000000\nmax_concurrent = 64";
    for (policies, gateway) in &replicas {
        let skip = gateway.log.len();
        policies.set_demo_limits(roomy);
        gateway
            .log
            .wait_for("policy reloaded", skip, Duration::from_secs(20));
    }

    // 2. Both hosts take generations.
    for i in 0..12 {
        let r = replicas[i % 3].1.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(2, false)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let (on_a, on_b) = (
        generations(&replicas, "gpu-a"),
        generations(&replicas, "gpu-b"),
    );
    assert!(on_a >= 1.0 && on_b >= 1.0, "gpu-a {on_a}, gpu-b {on_b}");
    assert_eq!(on_a + on_b, 12.0 + admitted as f64);

    // 3. Kill gpu-a under load: every request gets its 200 (a stream cut
    //    after it started may end with an error event).
    let stop = Arc::new(AtomicBool::new(false));
    let cut_streams = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let client: bulkhead_tests::Client = *replicas[i % 3].1;
            let (stop, cut, token) = (Arc::clone(&stop), Arc::clone(&cut_streams), token.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                while !stop.load(Ordering::Acquire) {
                    let mut stream =
                        client.stream("/v1/completions", &token, &completion(24, true));
                    let status = stream.status;
                    assert_eq!(status, 200, "{}", stream.rest());
                    let events = stream.events();
                    if events.last().map(String::as_str) != Some("[DONE]") {
                        cut.fetch_add(1, Ordering::Relaxed);
                    }
                    done += 1;
                }
                done
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    a.kill();
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Release);
    let served: u32 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let cut = cut_streams.load(Ordering::Relaxed);
    assert!(
        served > 12 && cut <= 6,
        "{served} served, {cut} cut mid-stream"
    );
    for (policies, gateway) in &replicas {
        let view = host_view(policies, gateway, "gpu-a");
        assert_eq!(view["state"], "ejected", "{view}");
        assert!(view["last_error"].is_string(), "{view}");
        assert_eq!(gateway.request("GET", "/readyz", None, None).status, 200);
    }
    let retried: f64 = replicas
        .iter()
        .map(|(_, g)| g.metric("bulkhead_gpu_host_retries_total", &[]))
        .sum();
    let ejections: f64 = replicas
        .iter()
        .map(|(_, g)| g.metric("bulkhead_gpu_host_ejections_total", &[("host", "gpu-a")]))
        .sum();
    assert!(ejections >= 3.0, "{ejections} ejections, {retried} retries");
    assert!(
        retried >= 1.0,
        "requests sent to the dead host went elsewhere"
    );

    // It restarts empty: back in rotation within its backoff, its model
    // loaded again, and it takes generations again.
    a.spawn();
    for (policies, gateway) in &replicas {
        gateway.eventually("gpu-a back in rotation", || {
            host_view(policies, gateway, "gpu-a")["state"] == "up"
        });
    }
    let before = generations(&replicas, "gpu-a");
    replicas[0]
        .1
        .eventually("gpu-a taking generations again", || {
            let r = replicas[0].1.request(
                "POST",
                "/v1/completions",
                Some(&token),
                Some(&completion(2, false)),
            );
            assert_eq!(r.status, 200, "{}", r.body);
            generations(&replicas, "gpu-a") > before
        });

    // 4. Drain gpu-a on replica 0 while it runs streams: the call returns
    //    once they finished, and they all finish.
    let (policies, gateway) = &replicas[0];
    let mut streams: Vec<_> = (0..4)
        .map(|_| {
            let mut s = gateway.stream("/v1/completions", &token, &completion(400, true));
            assert_eq!(s.status, 200);
            s.next_event().expect("a first chunk");
            s
        })
        .collect();
    let running_on_a = host_view(policies, gateway, "gpu-a")["outstanding"]
        .as_u64()
        .unwrap();
    assert!(
        running_on_a >= 1,
        "least outstanding spreads 4 streams over 2 hosts"
    );
    let drain = {
        let admin = gateway.admin;
        let writer = policies.operator_token(&["gpu-hosts:write"], &[]);
        std::thread::spawn(move || {
            admin.request(
                "POST",
                "/admin/v1/gpu-hosts/gpu-a/drain",
                Some(&writer),
                None,
            )
        })
    };
    gateway.eventually("gpu-a draining", || {
        host_view(policies, gateway, "gpu-a")["state"] == "draining"
    });
    let a_before = gateway.metric("bulkhead_gpu_host_generations_total", &[("host", "gpu-a")]);
    for _ in 0..4 {
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(2, false)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for stream in &mut streams {
        let events = stream.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{events:?}"
        );
    }
    let drained = drain.join().unwrap();
    assert_eq!(drained.status, 200, "{}", drained.body);
    let body = drained.json();
    assert_eq!(body["state"], "drained", "{body}");
    assert_eq!(body["streams_left"], 0, "{body}");
    assert!(
        body["streams_at_start"].as_u64().unwrap() >= running_on_a.min(1),
        "{body}"
    );
    assert_eq!(
        gateway.metric("bulkhead_gpu_host_generations_total", &[("host", "gpu-a")]),
        a_before,
        "a draining host takes no new generation"
    );
    let writer = policies.operator_token(&["gpu-hosts:write"], &[]);
    let r = gateway.admin.request(
        "POST",
        "/admin/v1/gpu-hosts/gpu-a/resume",
        Some(&writer),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "up", "{}", r.body);

    // 5. Redis cut off: each replica admits on its own share, then the
    //    store decides again.
    proxy.cut();
    for (_, gateway) in &replicas {
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(1, false)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(gateway.metric("bulkhead_limit_store_up", &[]), 0.0);
    }
    proxy.heal();
    for (_, gateway) in &replicas {
        gateway.eventually("the store answers again", || {
            gateway.metric("bulkhead_limit_store_up", &[]) == 1.0
        });
    }
    // Every request ended: no lease is left in Redis, and no generation
    // in flight on any host.
    let leases = format!("{prefix}:{{t:demo}}:leases");
    replicas[0].1.eventually("every lease released", || {
        redis(&["ZCARD", &leases]).starts_with(":0\r\n")
    });
    for (policies, gateway) in &replicas {
        for host in ["gpu-a", "gpu-b"] {
            assert_eq!(host_view(policies, gateway, host)["outstanding"], 0);
        }
    }
    drop(b);
}
