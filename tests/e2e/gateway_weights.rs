//! Verified weights through the gateway: every response names the digest
//! the gpu-host verified the weights against and when; a bit flipped in the
//! resident weights (the host's test hook) takes the model out of service —
//! requests get 503 `model_unavailable` naming the changed chunk, the
//! gateway's metrics show it and the audit log records it.
//!
//! The gateway talks to a gpu-host this test starts itself (a remote
//! `[upstream]` on a Unix socket, told by the gateway to load the signed
//! demo model), so the test can reach the host's hook.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bulkhead_gateway::audit::time::Timestamp;
use bulkhead_protocol::digest::to_hex;
use bulkhead_protocol::v1::CorruptResidentWeightsRequest;
use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::{Target, connect};
use bulkhead_tests::{
    ALL_OPERATOR_SCOPES, Gateway, PolicyDir, bin, demo_model, demo_model_dir, demo_model_signature,
};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

const MODEL: &str = "bulkhead-demo-tiny";

/// A gpu-host with its test hook on, and the folder holding its socket.
struct Host {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_host(name: &str, extra: &[&str]) -> Host {
    let dir = std::env::temp_dir().join(format!("bulkhead-e2e-{name}-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("host.sock");
    let mut child = Command::new(bin("bulkhead-gpu-host"))
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(["--threads", "1", "--enable-test-hooks"])
        // Fast, so the flip is found within a few milliseconds.
        .args(["--scrub-bytes-per-s", "1000000000"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("bulkhead-gpu-host starts");
    // Its first stdout line says it listens.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("listening on"),
        "unexpected first line {line:?}"
    );
    Host { child, dir, socket }
}

fn chat(gateway: &Gateway, token: &str) -> bulkhead_tests::Response {
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
    });
    gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(token),
        Some(&body.to_string()),
    )
}

#[test]
fn responses_name_verified_weights_and_a_flipped_bit_takes_the_model_out_of_service() {
    let host = start_host("weights", &[]);
    let policies = PolicyDir::new("weights");
    let audit_dir = policies
        .path
        .with_file_name(format!("bulkhead-e2e-weights-{}-audit", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit_dir);
    policies.write(
        "gateway.toml",
        &format!(
            "[upstream]\ntarget = \"unix:{}\"\n\n[[upstream.models]]\nname = \"{MODEL}\"\n\
             dir = \"{}\"\nsignature = \"{}\"\n\n[audit]\ndir = \"{}\"\n{}",
            host.socket.display(),
            demo_model_dir().display(),
            demo_model_signature().display(),
            audit_dir.display(),
            bulkhead_tests::operator_table(),
        ),
    );
    let started = Timestamp::now();
    let gateway = Gateway::start(&policies);
    gateway.wait_ready();
    let token = policies.token("demo", &[]);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &[]);

    // Every answer says which weights answered — the signed manifest's
    // subject digest: for a one-file folder, SHA-256 over the file's SHA-256
    // (model-signing's rule) — and when the host last checked every byte.
    let r = chat(&gateway, &token);
    assert_eq!(r.status, 200, "{}", r.body);
    let file_sha256 = Sha256::digest(std::fs::read(demo_model()).unwrap());
    let subject: [u8; 32] = Sha256::digest(file_sha256).into();
    assert_eq!(
        r.header("x-bulkhead-model-digest"),
        Some(format!("sha256:{}", to_hex(&subject)).as_str())
    );
    let verified_at =
        Timestamp::parse(r.header("x-bulkhead-weights-verified-at").unwrap()).unwrap();
    assert!(verified_at <= Timestamp::now(), "{verified_at}");
    let labels = [("model", MODEL)];
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.metric("bulkhead_model_serving", &labels) != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the gateway never saw the model serving"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A bit flips in the resident weights, as a memory fault would.
    let size = std::fs::metadata(demo_model()).unwrap().len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = connect(&Target::Unix(host.socket.clone())).await.unwrap();
        GpuHostClient::new(channel)
            .corrupt_resident_weights(CorruptResidentWeightsRequest {
                model: MODEL.into(),
                offset: size - 1,
            })
            .await
            .unwrap();
    });

    // The scrub finds it; the gateway's model watch reports it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.metric("bulkhead_model_serving", &labels) != 0.0 {
        assert!(
            Instant::now() < deadline,
            "never taken out of service:\n{}",
            gateway.log.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        gateway.metric("bulkhead_model_weight_mismatches_total", &labels),
        1.0
    );
    let r = chat(&gateway, &token);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.error_code(), "model_unavailable");
    // It names the piece (of the file, or of a packed copy on a VNNI CPU).
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("weights changed while resident: chunk ")
            && message.contains("no longer matches"),
        "{message}"
    );

    // And the audit log holds the finding, by the gateway.
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries", Some(&admin), None);
    assert_eq!(r.status, 200, "{}", r.body);
    let entries: Vec<Value> = r.json()["data"].as_array().unwrap().clone();
    let quarantine = entries
        .iter()
        .find(|e| e["action"] == "model.quarantine")
        .unwrap_or_else(|| panic!("no model.quarantine entry in {entries:?}"));
    assert_eq!(quarantine["model"], MODEL);
    assert_eq!(quarantine["actor"], json!({"kind": "gateway"}));
    assert!(
        quarantine["reason"].as_str().unwrap().contains("chunk"),
        "{quarantine}"
    );
    assert!(Timestamp::parse(quarantine["time"].as_str().unwrap()).unwrap() >= started);
    let _ = std::fs::remove_dir_all(&audit_dir);
}

/// A gateway in front of `host`, serving the signed demo model.
fn gateway_for(host: &Host, name: &str) -> (PolicyDir, Gateway) {
    let policies = PolicyDir::new(name);
    policies.write(
        "gateway.toml",
        &format!(
            "[upstream]\ntarget = \"unix:{}\"\n\n[[upstream.models]]\nname = \"{MODEL}\"\n\
             dir = \"{}\"\nsignature = \"{}\"\n",
            host.socket.display(),
            demo_model_dir().display(),
            demo_model_signature().display(),
        ),
    );
    let gateway = Gateway::start(&policies);
    gateway.wait_ready();
    (policies, gateway)
}

#[test]
fn a_request_that_can_never_fit_the_kv_cache_is_400_saying_what_it_needs() {
    // 1 MiB of KV cache: ~170 tokens of the demo model (6 KiB per token).
    let host = start_host("kv", &["--kv-memory", "1MiB"]);
    let (policies, gateway) = gateway_for(&host, "kv");
    let token = policies.token("demo", &[]);
    let body = |max_tokens: u32| {
        json!({"model": MODEL, "prompt": "Emma was", "max_tokens": max_tokens, "priority": 5})
            .to_string()
    };
    // No wait would help, so it is not a 429 (which clients retry).
    let r = gateway.request("POST", "/v1/completions", Some(&token), Some(&body(400)));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.error_code(), "kv_budget_exceeded");
    assert_eq!(r.header("retry-after"), None);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("needs") && message.contains("tokens"),
        "{message}"
    );
    // One that fits is served (with its priority passed along).
    let r = gateway.request("POST", "/v1/completions", Some(&token), Some(&body(8)));
    assert_eq!(r.status, 200, "{}", r.body);
}
