//! Plugin cost through the real gateway (a measurement, not a check; run
//! with `tests/bench/plugin_overhead/run`, which builds in release):
//!
//! 1. added latency of a no-op `on-request` + `on-response` pair (the
//!    `echo` test guest): the same requests with and without the chain,
//!    interleaved, median and p99;
//! 2. isolation: a benign tenant's latency while another tenant's plugin
//!    runs into its deadline on every request (the `hostile` guest's
//!    infinite loop), against the same tenant without the attack.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bulkhead_testkit::wasm;
use bulkhead_tests::{Gateway, PolicyDir};
use serde_json::json;

const MODEL: &str = "bulkhead-demo-tiny";
const SAMPLES: usize = 1500;
/// Requests the attacking tenant may have in flight (its `max_concurrent`),
/// and the threads it attacks with.
const ATTACKER_CONCURRENCY: u32 = 2;
/// Isolation runs this many rounds of `ROUND_SAMPLES` requests alone and
/// then as many under attack: 3,000 of each in all.
const ROUNDS: usize = 6;
const ROUND_SAMPLES: usize = 500;

/// A tenant with the demo tenant's dev keys, its own issuer, generous
/// limits (so the limiter never refuses) and `plugins`.
fn tenant(id: &str, max_concurrent: u32, plugins: &str) -> String {
    format!(
        "id = \"{id}\"\nmodels = [\"{MODEL}\"]\n\n\
         [jwt]\nissuer = \"bench-{id}\"\naudience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n\
         public_keys = [\"dev-keys/demo.pub.pem\"]\ndev_signing_key = \"dev-keys/demo.key.pem\"\n\n\
         [limits]\nrequests_per_s = 10000\nburst = 10000\ntokens_per_min = 100000000\n\
         max_concurrent = {max_concurrent}\n\n{plugins}"
    )
}

fn upload(gateway: &Gateway, token: &str, name: &str, wasm: &[u8]) {
    let response = gateway.request_bytes(
        "PUT",
        &format!("/v1/plugins/{name}"),
        Some(token),
        "application/wasm",
        wasm,
    );
    assert!(response.status < 300, "{}", response.body);
}

fn completion(prompt: &str) -> String {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}).to_string()
}

fn timed(gateway: &Gateway, token: &str, body: &str, want: u16) -> Duration {
    let started = Instant::now();
    let response = gateway.request("POST", "/v1/completions", Some(token), Some(body));
    let took = started.elapsed();
    assert_eq!(response.status, want, "{}", response.body);
    took
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 50), percentile(&samples, 99))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
#[ignore = "a measurement, not a check: run tests/bench/plugin_overhead/run"]
fn plugin_overhead_and_isolation_through_the_gateway() {
    let policies = PolicyDir::new("plugin-bench");
    policies.write("tenants/plain.toml", &tenant("plain", 8, ""));
    policies.write(
        "tenants/noop.toml",
        &tenant(
            "noop",
            8,
            "[plugins]\non_request = [\"echo\"]\non_response = [\"echo\"]\n",
        ),
    );
    policies.write(
        "tenants/attacker.toml",
        &tenant(
            "attacker",
            ATTACKER_CONCURRENCY,
            "[plugins]\non_request = [\"hostile\"]\n[plugins.limits.hostile]\ndeadline_ms = 50\n",
        ),
    );
    let gateway = Gateway::start(&policies);
    let plain = policies.token("plain", &[]);
    let noop = policies.token("noop", &[]);
    let attacker = policies.token("attacker", &["--scope", "inference", "plugins:write"]);
    let noop_admin = policies.token("noop", &["--scope", "plugins:write"]);
    upload(&gateway, &noop_admin, "echo", &wasm::test_guest("echo"));
    upload(&gateway, &attacker, "hostile", &wasm::test_guest("hostile"));

    // Warm up both paths (model pages, connection setup, plugin code).
    let body = completion("Hi");
    for _ in 0..50 {
        timed(&gateway, &plain, &body, 200);
        timed(&gateway, &noop, &body, 200);
    }

    // 1. No-op pair, interleaved with the same request without plugins.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        without.push(timed(&gateway, &plain, &body, 200));
        with.push(timed(&gateway, &noop, &body, 200));
    }
    let (p50_without, p99_without) = summary(without);
    let (p50_with, p99_with) = summary(with);
    eprintln!(
        "no plugins:        median {:.3} ms, p99 {:.3} ms ({SAMPLES} requests, max_tokens 1)",
        ms(p50_without),
        ms(p99_without)
    );
    eprintln!(
        "no-op pair (echo): median {:.3} ms, p99 {:.3} ms; added median {:+.3} ms, p99 {:+.3} ms",
        ms(p50_with),
        ms(p99_with),
        ms(p50_with) - ms(p50_without),
        ms(p99_with) - ms(p99_without)
    );

    // 2. Isolation: the benign tenant alone, then under attack, in
    //    alternating rounds so drift in the machine's load lands on both.
    let (mut quiet, mut attacked) = (Vec::new(), Vec::new());
    let mut round_ratios = Vec::new();
    let attacks = Arc::new(AtomicU64::new(0));
    for _ in 0..ROUNDS {
        let alone: Vec<Duration> = (0..ROUND_SAMPLES)
            .map(|_| timed(&gateway, &plain, &body, 200))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let started_with = attacks.load(Ordering::Relaxed);
        let attackers: Vec<_> = (0..ATTACKER_CONCURRENCY)
            .map(|_| {
                let (stop, attacks) = (Arc::clone(&stop), Arc::clone(&attacks));
                let client = bulkhead_tests::Client::new(gateway.addr);
                let token = attacker.clone();
                thread::spawn(move || {
                    let body = completion("loop");
                    while !stop.load(Ordering::Relaxed) {
                        let r =
                            client.request("POST", "/v1/completions", Some(&token), Some(&body));
                        assert!(r.status == 502 || r.status == 429, "{}", r.body);
                        attacks.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Let the attack reach its steady state.
        while attacks.load(Ordering::Relaxed) < started_with + 2 {
            thread::yield_now();
        }
        let under: Vec<Duration> = (0..ROUND_SAMPLES)
            .map(|_| timed(&gateway, &plain, &body, 200))
            .collect();
        stop.store(true, Ordering::Relaxed);
        for a in attackers {
            a.join().unwrap();
        }
        let (_, alone99) = summary(alone.clone());
        let (_, under99) = summary(under.clone());
        round_ratios.push(under99.as_secs_f64() / alone99.as_secs_f64());
        quiet.extend(alone);
        attacked.extend(under);
    }
    round_ratios.sort_by(f64::total_cmp);
    let (q50, q99) = summary(quiet);
    let (a50, a99) = summary(attacked);
    eprintln!(
        "benign tenant alone:        median {:.3} ms, p99 {:.3} ms ({ROUNDS} rounds of \
         {ROUND_SAMPLES} requests)",
        ms(q50),
        ms(q99)
    );
    eprintln!(
        "benign tenant under attack: median {:.3} ms, p99 {:.3} ms; p99 ratio {:.2} \
         ({} attacking requests, each stopped at its 50 ms deadline)",
        ms(a50),
        ms(a99),
        a99.as_secs_f64() / q99.as_secs_f64(),
        attacks.load(Ordering::Relaxed)
    );
    eprintln!(
        "per-round p99 ratios (sorted): {}; median {:.2}",
        round_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" "),
        round_ratios[round_ratios.len() / 2]
    );
}
