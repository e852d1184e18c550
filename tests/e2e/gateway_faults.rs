//! Faults and changes under traffic: the gpu-host killed with SIGKILL
//! mid-generation, and policy edits (valid and broken) while requests flow.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bulkhead_tests::{Gateway, PolicyDir};
use serde_json::json;

const MODEL: &str = "bulkhead-demo-tiny";

fn generous_demo(name: &str) -> PolicyDir {
    let policies = PolicyDir::new(name);
    policies.set_demo_limits(
        "requests_per_s = 1000\nburst = 1000\ntokens_per_min = 10000000\nmax_concurrent = 64",
    );
    policies
}

fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid}");
}

fn completion(max_tokens: u32, stream: bool) -> String {
    json!({"model": MODEL, "prompt": "Emma was", "max_tokens": max_tokens, "stream": stream, "temperature": 0.9, "seed": 7}).to_string()
}

#[test]
fn a_killed_gpu_host_fails_requests_in_flight_with_503_and_comes_back() {
    let policies = generous_demo("kill");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let (mut log_at, pid) = gateway.gpu_host_pid(0);

    // Streamed: the first chunk is out (status 200 already sent), so the
    // failure arrives as an error event and the stream ends without [DONE].
    let mut stream = gateway.stream("/v1/completions", &token, &completion(400, true));
    assert_eq!(stream.status, 200);
    stream.next_event().expect("a first chunk");
    kill9(pid);
    let mut last = String::new();
    while let Some(event) = stream.next_event() {
        last = event;
    }
    let error: serde_json::Value =
        serde_json::from_str(&last).unwrap_or_else(|_| panic!("last event {last:?}"));
    assert_eq!(error["error"]["code"], "upstream_unavailable", "{last}");

    // The next request waits for the restarted host and succeeds.
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&token),
        Some(&completion(4, false)),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.body, gateway.log.text());
    let (at, new_pid) = gateway.gpu_host_pid(log_at + 1);
    assert_ne!(new_pid, pid);
    log_at = at;

    // Whole (non-streamed): killed after generation started → 503. The kill
    // can lose the race against a short generation; try a few times.
    let mut saw_503 = false;
    let mut pid = new_pid;
    for _ in 0..5 {
        let started = gateway.metric("bulkhead_tokens_total", &[("kind", "prompt")]);
        let addr = gateway.addr;
        let token = token.clone();
        let request = std::thread::spawn(move || {
            let gateway_client = bulkhead_tests::Client::new(addr);
            gateway_client.request(
                "POST",
                "/v1/completions",
                Some(&token),
                Some(&completion(480, false)),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while gateway.metric("bulkhead_tokens_total", &[("kind", "prompt")]) <= started {
            assert!(Instant::now() < deadline, "the request never started");
            std::thread::sleep(Duration::from_millis(2));
        }
        kill9(pid);
        let r = request.join().unwrap();
        let (at, next) = gateway.gpu_host_pid(log_at + 1);
        log_at = at;
        pid = next;
        if r.status == 503 {
            assert_eq!(r.error_code(), "upstream_unavailable", "{}", r.body);
            saw_503 = true;
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert!(saw_503, "no kill landed during a generation in 5 tries");
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&token),
        Some(&completion(4, false)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(gateway.metric("bulkhead_upstream_starts_total", &[]) >= 3.0);
}

#[test]
fn policy_edits_under_traffic_never_fail_a_request() {
    let policies = generous_demo("reload");
    let gateway = Arc::new(Gateway::start(&policies));
    let token = policies.token("demo", &[]);

    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (gateway, token, stop) = (Arc::clone(&gateway), token.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            // Through every edit, and at least five requests in all: the
            // edits may land faster than five completions.
            while !stop.load(Ordering::Relaxed) || statuses.len() < 5 {
                let r = gateway.request(
                    "POST",
                    "/v1/completions",
                    Some(&token),
                    Some(&completion(1, false)),
                );
                statuses.push((r.status, r.body));
            }
            statuses
        })
    };

    // A valid edit: a new tenant, usable once the reload lands.
    policies.write("gamma.secret", "gamma-shared-secret-of-at-least-32-bytes");
    policies.write(
        "tenants/gamma.toml",
        "id = \"gamma\"\nmodels = [\"bulkhead-demo-tiny\"]\n\n[jwt]\nissuer = \"gamma-idp\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"HS256\"]\nhs_secret_file = \"gamma.secret\"\n",
    );
    // `token issue` reads the files directly; the gateway accepts the token
    // once its watcher has published the new policy (401 until then).
    let gamma = policies.token("gamma", &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&gamma),
            Some(&completion(1, false)),
        );
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(
            Instant::now() < deadline,
            "the new tenant was not loaded:\n{}",
            gateway.log.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A broken edit: the old policy keeps serving, the failure is counted and logged.
    let good_demo = policies.read("tenants/demo.toml");
    let failed_reloads = gateway.metric("bulkhead_policy_reloads_total", &[("result", "failed")]);
    policies.write("tenants/demo.toml", &format!("{good_demo}\n[limits\n"));
    while gateway.metric("bulkhead_policy_reloads_total", &[("result", "failed")]) <= failed_reloads
    {
        assert!(
            Instant::now() < deadline,
            "the broken edit was not noticed:\n{}",
            gateway.log.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    gateway
        .log
        .wait_for("tenants/demo.toml:", 0, Duration::from_secs(5));
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&gamma),
        Some(&completion(1, false)),
    );
    assert_eq!(
        r.status, 200,
        "the previous policy still serves: {}",
        r.body
    );

    // Fixed again: back to normal.
    let oks = gateway.metric("bulkhead_policy_reloads_total", &[("result", "ok")]);
    policies.write("tenants/demo.toml", &good_demo);
    while gateway.metric("bulkhead_policy_reloads_total", &[("result", "ok")]) <= oks {
        assert!(Instant::now() < deadline, "the fix was not loaded");
        std::thread::sleep(Duration::from_millis(20));
    }

    stop.store(true, Ordering::Relaxed);
    let statuses = traffic.join().unwrap();
    let failed: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        statuses.len()
    );
}
