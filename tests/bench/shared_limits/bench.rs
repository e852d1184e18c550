//! Shared limits across gateway replicas (a measurement, not a check; run
//! with `tests/bench/shared_limits/run`): three `bulkhead serve` replicas,
//! one tenant with a small request rate and token budget, 1,000 requests
//! spread round-robin over the replicas by 64 clients at once (each
//! pausing 0.6 s between its requests, so the run lasts about 10 s). For each
//! store it counts what was admitted against what the tenant's limits allow
//! over the run's length:
//!
//! - `memory`: each replica keeps its own limits (the control: together
//!   they admit about three times the tenant's limits);
//! - `redis`: the replicas share the machine's Redis;
//! - `redis, one killed`: the same, with one replica killed (`kill -9`)
//!   a third of the way in.
//!
//! Admission latency is compared on the refused requests (429), which do
//! only authentication and admission: p50 and p99 per store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::io::Read;

use bulkhead_tests::{Client, Gateway, PolicyDir, Response, gateway_toml};
use serde_json::json;

const MODEL: &str = "bulkhead-demo-tiny";
const REQUESTS: usize = 1000;
const CLIENTS: usize = 64;
const REPLICAS: usize = 3;
const REQUESTS_PER_S: u64 = 5;
const BURST: u64 = 20;
const TOKENS_PER_MIN: u64 = 600;
const MAX_TOKENS: u32 = 32;
/// Each client waits this long between its requests, so that the run lasts
/// about 10 s and the limits' refill counts, not only their bursts.
const THINK_TIME: Duration = Duration::from_millis(600);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Memory,
    Redis,
    RedisOneKilled,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Memory => "memory",
            Scenario::Redis => "redis",
            Scenario::RedisOneKilled => "redis, one killed",
        }
    }
}

/// One request's outcome.
struct Sample {
    status: u16,
    latency: Duration,
    tokens: u64,
}

#[test]
#[ignore = "a benchmark: tests/bench/shared_limits/run"]
fn shared_limits() {
    let redis = std::env::var("BULKHEAD_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".into());
    println!(
        "tenant: {REQUESTS_PER_S} requests/s, burst {BURST}, {TOKENS_PER_MIN} tokens/min; \
         {REQUESTS} requests, {CLIENTS} clients, {REPLICAS} replicas, max_tokens {MAX_TOKENS}\n"
    );
    println!(
        "| store | run (s) | admitted | allowed | tokens used | allowed | refused | failed | \
         429 p50 (ms) | 429 p99 (ms) | within |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for scenario in [Scenario::Memory, Scenario::Redis, Scenario::RedisOneKilled] {
        let (samples, elapsed) = run(scenario, &redis);
        let admitted = samples.iter().filter(|s| s.status == 200).count() as u64;
        let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
        let refused = samples.iter().filter(|s| s.status == 429).count();
        let failed = samples.len() - admitted as usize - refused;
        let mut statuses = std::collections::BTreeMap::new();
        for sample in &samples {
            *statuses.entry(sample.status).or_insert(0) += 1;
        }
        eprintln!("{}: statuses {statuses:?}", scenario.name());
        let secs = elapsed.as_secs_f64();
        // GCRA admits at most the burst plus one request per emission
        // interval; the token bucket at most its size plus its refill.
        let allowed_requests = BURST + (REQUESTS_PER_S as f64 * secs).ceil() as u64;
        let allowed_tokens = TOKENS_PER_MIN + (TOKENS_PER_MIN as f64 * secs / 60.0).ceil() as u64;
        let mut refused_ms: Vec<f64> = samples
            .iter()
            .filter(|s| s.status == 429)
            .map(|s| s.latency.as_secs_f64() * 1e3)
            .collect();
        refused_ms.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&refused_ms, 0.50), percentile(&refused_ms, 0.99));
        let within = admitted <= allowed_requests && tokens <= allowed_tokens;
        println!(
            "| {} | {secs:.1} | {admitted} | {allowed_requests} | {tokens} | {allowed_tokens} | \
             {refused} | {failed} | {p50:.2} | {p99:.2} | {} |",
            scenario.name(),
            if within { "yes" } else { "NO" }
        );
        results.push(json!({
            "store": scenario.name(), "seconds": secs, "admitted": admitted,
            "allowed_requests": allowed_requests, "tokens": tokens,
            "allowed_tokens": allowed_tokens, "refused": refused, "failed": failed,
            "refused_p50_ms": p50, "refused_p99_ms": p99, "within_limits": within,
        }));
    }
    let out = bulkhead_tests::repo().join("target/bench-results");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("shared_limits.json"),
        serde_json::to_string_pretty(&results).unwrap(),
    )
    .unwrap();
}

/// Starts the replicas for `scenario`, sends the requests, stops them.
fn run(scenario: Scenario, redis: &str) -> (Vec<Sample>, Duration) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let prefix = format!("bh-bench-{}-{nanos}", std::process::id());
    let store = match scenario {
        Scenario::Memory => String::new(),
        _ => format!(
            "\n[limits]\nstore = \"redis://{redis}/0\"\nkey_prefix = \"{prefix}\"\n\
             replicas = {REPLICAS}\nlease_ttl_ms = 3000\n"
        ),
    };
    let folders: Vec<PolicyDir> = (0..REPLICAS)
        .map(|i| {
            let policies = PolicyDir::new(&format!("shared-limits-bench-{i}"));
            policies.write(
                "gateway.toml",
                &format!("{}{}{store}", gateway_toml(""), policies.state_tables()),
            );
            policies.set_demo_limits(&format!(
                "requests_per_s = {REQUESTS_PER_S}\nburst = {BURST}\n\
                 tokens_per_min = {TOKENS_PER_MIN}\nmax_concurrent = 16\nmax_tokens = {MAX_TOKENS}"
            ));
            policies
        })
        .collect();
    let mut gateways: Vec<Option<Gateway>> =
        folders.iter().map(|f| Some(Gateway::start(f))).collect();
    let clients: Vec<Client> = gateways
        .iter()
        .map(|g| Client::new(g.as_ref().unwrap().addr))
        .collect();
    let victim = gateways[REPLICAS - 1].as_ref().unwrap().pid();
    let token = folders[0].token("demo", &[]);
    let body =
        json!({"model": MODEL, "prompt": "Emma was", "max_tokens": MAX_TOKENS, "temperature": 0})
            .to_string();

    let next = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let started = Instant::now();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, samples, clients) =
                (Arc::clone(&next), Arc::clone(&samples), clients.clone());
            let (token, body) = (token.clone(), body.clone());
            thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::AcqRel);
                    if i >= REQUESTS {
                        return;
                    }
                    if scenario == Scenario::RedisOneKilled && i == REQUESTS / 3 {
                        let _ = std::process::Command::new("kill")
                            .args(["-KILL", &victim.to_string()])
                            .status();
                    }
                    let at = Instant::now();
                    let answer = clients[i % REPLICAS]
                        .send("POST", "/v1/completions", Some(&token), Some(&body))
                        .and_then(|mut stream| {
                            let mut raw = Vec::new();
                            stream.read_to_end(&mut raw).map(|_| raw)
                        });
                    let latency = at.elapsed();
                    // A replica killed mid-answer leaves no whole head.
                    let whole = |raw: &[u8]| raw.windows(4).any(|w| w == b"\r\n\r\n");
                    let sample = match answer {
                        Ok(raw) if whole(&raw) => {
                            let r = Response::parse(&raw);
                            Sample {
                                status: r.status,
                                latency,
                                tokens: if r.status == 200 {
                                    r.json()["usage"]["total_tokens"].as_u64().unwrap_or(0)
                                } else {
                                    0
                                },
                            }
                        }
                        // The killed replica: its clients' requests fail.
                        _ => Sample {
                            status: 0,
                            latency,
                            tokens: 0,
                        },
                    };
                    samples.lock().unwrap().push(sample);
                    thread::sleep(THINK_TIME);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let elapsed = started.elapsed();
    for gateway in &mut gateways {
        gateway.take();
    }
    if scenario != Scenario::Memory {
        delete_keys(redis, &prefix);
    }
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    (samples, elapsed)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Removes the run's keys (`redis-cli`, which the machine's Redis brings).
fn delete_keys(redis: &str, prefix: &str) {
    let (host, port) = redis.split_once(':').unwrap_or((redis, "6379"));
    let keys = std::process::Command::new("redis-cli")
        .args([
            "-h",
            host,
            "-p",
            port,
            "--scan",
            "--pattern",
            &format!("{prefix}:*"),
        ])
        .output()
        .expect("redis-cli runs");
    let keys = String::from_utf8_lossy(&keys.stdout);
    let keys: Vec<&str> = keys.lines().collect();
    if !keys.is_empty() {
        let _ = std::process::Command::new("redis-cli")
            .args(["-h", host, "-p", port, "DEL"])
            .args(&keys)
            .output();
    }
}
