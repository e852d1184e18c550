//! Two gateway replicas keeping their audit log in the machine's
//! PostgreSQL (`[state] store = "postgres://..."`): actions on both land
//! in one log whose checkpoint both serve; inclusion and consistency
//! proofs served by one check out against the other's checkpoint; with the
//! database cut off (a proxy) a replica keeps serving inference while its
//! audited actions answer 503, and takes them again once it is back; after
//! they stop, `bulkhead audit verify --state` passes against a checkpoint
//! kept aside, and a row edited with `psql` is named by it and refused by
//! a replica starting. A model registered on one replica serves on the
//! other, and stops there when unregistered on the first; a plugin
//! uploaded on one runs on the other, and a replica that was down finds
//! the uploads made meanwhile.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bulkhead_gateway::audit::{AuditLog, AuditSettings, KEY_FILE, PUBLIC_KEY_FILE};
use bulkhead_state::PgSettings;
use bulkhead_state::testing::TestSchema;
use bulkhead_tests::proxy::Proxy;
use bulkhead_tests::{
    ALL_OPERATOR_SCOPES, Gateway, PolicyDir, bin, cli, gateway_toml, model_keygen, register_body,
    signed_model_copy,
};
use serde_json::Value;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What every test here starts from: a fresh schema on the machine's
/// PostgreSQL, a scratch folder, and in it an audit signing key (made by a
/// file log) that every replica shares.
struct Setup {
    settings: PgSettings,
    _schema: TestSchema,
    scratch: Scratch,
    /// The audit log's private key, `[audit] key` of every replica.
    key: PathBuf,
}

fn setup(tag: &str) -> Setup {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (settings, schema) = runtime.block_on(TestSchema::new());
    let scratch = Scratch(
        std::env::temp_dir().join(format!("bulkhead-e2e-state-{}-{tag}", std::process::id())),
    );
    let keys = scratch.0.join("keys");
    drop(AuditLog::open(&AuditSettings::new(&keys)).unwrap());
    Setup {
        settings,
        _schema: schema,
        key: keys.join(KEY_FILE),
        scratch,
    }
}

/// `host:port` of a `postgres://user@host:port/db` URL.
fn address(url: &str) -> String {
    let rest = url.split_once('@').map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap().to_string()
}

/// A replica's gateway.toml: state in `schema`, the audit log signed with
/// `key`, and a folder of its own for its compiled plugins.
fn gateway_file(url: &str, schema: &str, key: &Path, policies: &PolicyDir) -> String {
    format!(
        "{}\n[plugins]\nstore = \"{}\"\n\n[state]\nstore = \"{url}\"\nschema = \"{schema}\"\n\
         connect_timeout_ms = 1000\nstatement_timeout_ms = 5000\n\n[audit]\nkey = \"{}\"\n",
        gateway_toml(""),
        policies.store.display(),
        key.display()
    )
}

fn actions(gateway: &Gateway, token: &str) -> Vec<Value> {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries", Some(token), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

fn checkpoint(gateway: &Gateway, token: &str) -> String {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/checkpoint", Some(token), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// An audited operator action: draining the local gpu-host, then resuming.
fn drain_and_resume(gateway: &Gateway, token: &str) -> (u16, String) {
    let r = gateway
        .admin
        .request("POST", "/admin/v1/gpu-hosts/local/drain", Some(token), None);
    if r.status != 200 {
        return (r.status, r.error_code());
    }
    let r = gateway.admin.request(
        "POST",
        "/admin/v1/gpu-hosts/local/resume",
        Some(token),
        None,
    );
    (r.status, r.body)
}

#[test]
fn two_replicas_keep_one_audit_log_in_postgres() {
    let Setup {
        settings,
        _schema,
        scratch,
        key,
    } = setup("log");
    let public = key.with_file_name(PUBLIC_KEY_FILE);
    let public = public.to_str().unwrap();

    // Replica B reaches the database through a proxy that can cut it off.
    let proxy = Proxy::start(&address(&settings.url));
    let url_b = settings
        .url
        .replacen(&address(&settings.url), &proxy.addr, 1);
    let pa = PolicyDir::new("state-a");
    let pb = PolicyDir::new("state-b");
    pa.write(
        "gateway.toml",
        &gateway_file(&settings.url, &settings.schema, &key, &pa),
    );
    pb.write(
        "gateway.toml",
        &gateway_file(&url_b, &settings.schema, &key, &pb),
    );
    let a = Gateway::start(&pa);
    let b = Gateway::start(&pb);
    let ta = pa.operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops-a"]);
    let tb = pb.operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops-b"]);

    // Actions on both replicas land in one log, seen alike from both.
    assert_eq!(drain_and_resume(&a, &ta).0, 200);
    assert_eq!(drain_and_resume(&b, &tb).0, 200);
    let from_a = actions(&a, &ta);
    assert_eq!(from_a, actions(&b, &tb), "one log, read through either");
    let starts = from_a
        .iter()
        .filter(|e| e["action"] == "gateway.start")
        .count();
    let subs: Vec<&str> = from_a
        .iter()
        .filter(|e| e["action"] == "admin.action")
        .filter_map(|e| e["actor"]["sub"].as_str())
        .collect();
    assert_eq!(starts, 2, "{from_a:#?}");
    assert_eq!(subs, ["ops-a", "ops-a", "ops-b", "ops-b"], "{from_a:#?}");
    let note = checkpoint(&a, &ta);
    assert_eq!(
        note,
        checkpoint(&b, &tb),
        "both replicas serve one checkpoint"
    );

    // Proofs from A against the checkpoint B serves, for an entry B wrote.
    let kept = scratch.0.join("kept-checkpoint");
    std::fs::write(&kept, &note).unwrap();
    let last = from_a.len() - 1;
    let url_a = format!("http://{}", a.admin.addr);
    let (ok, out) = cli(&[
        "audit",
        "proof",
        "inclusion",
        "--url",
        &url_a,
        "--token",
        &ta,
        "--key",
        public,
        "--index",
        &last.to_string(),
        "--checkpoint",
        kept.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");

    // B cut off from the database: inference goes on; audited actions are
    // refused (nothing unrecorded happens) until it is back.
    proxy.cut();
    let tenant = pb.token("demo", &[]);
    let body = r#"{"model":"bulkhead-demo-tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}"#;
    let r = b.request("POST", "/v1/chat/completions", Some(&tenant), Some(body));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        drain_and_resume(&b, &tb),
        (503, "audit_unavailable".to_string())
    );
    proxy.heal();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match drain_and_resume(&b, &tb) {
            (200, _) => break,
            (503, _) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("after the database came back: {other:?}\n{}", b.log.text()),
        }
    }
    // A consistency proof from the kept checkpoint to the grown log.
    let url_b_admin = format!("http://{}", b.admin.addr);
    let (ok, out) = cli(&[
        "audit",
        "proof",
        "consistency",
        "--url",
        &url_b_admin,
        "--token",
        &tb,
        "--key",
        public,
        "--old",
        kept.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let size = actions(&a, &ta).len();
    assert!(size > from_a.len() + 1, "the retried action was recorded");
    drop((a, b));

    // Offline: the whole log verifies against the kept checkpoint...
    let verify = || {
        cli(&[
            "audit",
            "verify",
            "--state",
            &settings.url,
            "--schema",
            &settings.schema,
            "--key",
            public,
            "--checkpoint",
            kept.to_str().unwrap(),
        ])
    };
    let (ok, out) = verify();
    assert!(ok && out.starts_with("ok: "), "{out}");

    // ...and a row edited with psql is named, and refused by a replica.
    let edit = format!(
        "UPDATE {}.audit_entries SET entry = convert_to(replace(convert_from(entry, 'UTF8'), \
         'ops-b', 'ops-x'), 'UTF8') WHERE idx = {last}",
        settings.schema
    );
    let out = Command::new("psql")
        .args([settings.url.as_str(), "-v", "ON_ERROR_STOP=1", "-c", &edit])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, out) = verify();
    assert!(!ok && out.contains(&format!("entry {last}")), "{out}");
    let refused = start_expecting_failure(&pa);
    assert!(
        refused.contains(&format!("entry {last}")) && refused.contains("edited"),
        "{refused}"
    );
}

/// Polls `done` every 20 ms until it holds; how long that took. Panics
/// after `within`, with `gateway`'s log.
fn wait_until(
    gateway: &Gateway,
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}\n{}",
            gateway.log.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn a_model_registered_on_one_replica_serves_on_the_other() {
    const MODEL: &str = "shared-tiny";
    let Setup {
        settings,
        _schema,
        scratch,
        key,
    } = setup("models");
    let publisher = model_keygen(&scratch.0, "publisher");
    let (folder, signature) = signed_model_copy(&scratch.0, MODEL, &publisher);
    let replicas: Vec<PolicyDir> = ["models-a", "models-b"]
        .into_iter()
        .map(|name| {
            let policies = PolicyDir::new(&format!("state-{name}"));
            policies.trust_publisher_for("shared-publisher", &publisher, MODEL);
            policies.write(
                "gateway.toml",
                &gateway_file(&settings.url, &settings.schema, &key, &policies),
            );
            policies
        })
        .collect();
    let a = Gateway::start(&replicas[0]);
    let b = Gateway::start(&replicas[1]);
    let ta = replicas[0].operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops-a"]);
    let tb = replicas[1].operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops-b"]);
    let tenant = replicas[1].token("demo", &[]);
    let body = format!(r#"{{"model":"{MODEL}","prompt":"Emma was","max_tokens":4}}"#);
    let complete_on = |gateway: &Gateway| {
        gateway
            .request("POST", "/v1/completions", Some(&tenant), Some(&body))
            .status
    };
    assert_eq!(complete_on(&b), 404, "not registered yet");

    // Registered on A: B, with its own gpu-host, loads it (every byte
    // verified against its own trust.toml) and serves it.
    let register = register_body(MODEL, &folder, &signature);
    let r = a
        .admin
        .request("POST", "/admin/v1/models", Some(&ta), Some(&register));
    assert_eq!(r.status, 201, "{}", r.body);
    let took = wait_until(&b, "served on B", Duration::from_secs(20), || {
        complete_on(&b) == 200
    });
    eprintln!("a model registered on A served on B after {took:?}");
    let listed = b
        .admin
        .request("GET", "/admin/v1/models", Some(&tb), None)
        .json();
    let shared = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == MODEL)
        .unwrap()
        .clone();
    assert_eq!(shared["source"], "api", "{shared}");
    assert_eq!(shared["registered_by"], "ops-a", "{shared}");
    assert_eq!(shared["state"], "serving", "{shared}");

    // The name is taken for every replica.
    let r = b
        .admin
        .request("POST", "/admin/v1/models", Some(&tb), Some(&register));
    assert_eq!((r.status, r.error_code().as_str()), (409, "model_exists"));

    // Unregistered on B: A stops serving it.
    let r = b.admin.request(
        "DELETE",
        &format!("/admin/v1/models/{MODEL}"),
        Some(&tb),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let took = wait_until(&a, "unserved on A", Duration::from_secs(5), || {
        complete_on(&a) == 404
    });
    eprintln!("a model unregistered on B stopped on A after {took:?}");

    // Both changes are in the one log, each by the replica that made it.
    let changes: Vec<(String, String)> = actions(&a, &ta)
        .iter()
        .filter(|e| e["model"] == MODEL && e["outcome"]["result"] == "accepted")
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["actor"]["sub"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("model.register".to_string(), "ops-a".to_string()),
            ("model.unregister".to_string(), "ops-b".to_string())
        ],
        "{:#?}",
        actions(&a, &ta)
    );
}

#[test]
fn a_plugin_uploaded_on_one_replica_runs_on_the_other() {
    if !bulkhead_testkit::wasm::require() {
        return;
    }
    let guard = bulkhead_testkit::wasm::example("prompt-guard");
    let Setup {
        settings,
        _schema,
        scratch: _scratch,
        key,
    } = setup("plugins");
    let replicas: Vec<PolicyDir> = ["plugins-a", "plugins-b"]
        .into_iter()
        .map(|name| {
            let policies = PolicyDir::new(&format!("state-{name}"));
            let demo = policies.read("tenants/demo.toml");
            policies.write(
                "tenants/demo.toml",
                &format!(
                    "{demo}\n[plugins]\non_request = [\"prompt-guard\"]\n\
                     [plugins.config.prompt-guard]\nblocked = \"launch codes\"\n"
                ),
            );
            policies.write(
                "gateway.toml",
                &gateway_file(&settings.url, &settings.schema, &key, &policies),
            );
            policies
        })
        .collect();
    let a = Gateway::start(&replicas[0]);
    let b = Gateway::start(&replicas[1]);
    let writer = replicas[0].token("demo", &["--scope", "plugins:write", "--sub", "dev-a"]);
    let user = replicas[1].token("demo", &[]);
    let blocked = r#"{"model":"bulkhead-demo-tiny","messages":[{"role":"user","content":"the launch codes"}],"max_tokens":4}"#;
    let ask = |gateway: &Gateway| {
        let r = gateway.request("POST", "/v1/chat/completions", Some(&user), Some(blocked));
        (r.status, r.error_code())
    };
    assert_eq!(ask(&b), (502, "plugin_not_found".to_string()));

    // Uploaded on A: B runs it, compiled by itself from the bytes it read
    // (and re-hashed) from the database.
    let r = a.request_bytes(
        "PUT",
        "/v1/plugins/prompt-guard",
        Some(&writer),
        "application/wasm",
        &guard,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let digest = r.json()["digest"].clone();
    let took = wait_until(
        &b,
        "the plugin running on B",
        Duration::from_secs(5),
        || ask(&b).0 == 400,
    );
    eprintln!("a plugin uploaded on A ran on B after {took:?}");
    let listed = b.request("GET", "/v1/plugins/prompt-guard", Some(&writer), None);
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json()["digest"], digest, "{}", listed.body);

    // Deleted on B: A no longer has it.
    let r = b.request("DELETE", "/v1/plugins/prompt-guard", Some(&writer), None);
    assert_eq!(r.status, 200, "{}", r.body);
    let took = wait_until(&a, "the plugin gone from A", Duration::from_secs(5), || {
        ask(&a).0 == 502
    });
    eprintln!("a plugin deleted on B was gone from A after {took:?}");

    // A stopped while B uploads again: A finds the upload at its start.
    drop(a);
    let r = b.request_bytes(
        "PUT",
        "/v1/plugins/prompt-guard",
        Some(&writer),
        "application/wasm",
        &guard,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let a = Gateway::start(&replicas[0]);
    assert_eq!(
        ask(&a).0,
        400,
        "a replica that was down catches up at start"
    );
}

/// Runs `bulkhead serve` on `policies`, which must exit with an error
/// within 30 s; its stderr.
fn start_expecting_failure(policies: &PolicyDir) -> String {
    let mut child = Command::new(bin("bulkhead"))
        .args(["serve", "--policies"])
        .arg(&policies.path)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the gateway started on an edited log");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}
