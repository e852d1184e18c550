//! The audit log of a running gateway: `gateway.start`, a plugin upload
//! and delete, an accepted and a refused policy reload are recorded; the
//! admin API serves a checkpoint that verifies, the entries, and proofs
//! that `bulkhead audit proof` checks; `bulkhead audit verify` passes on
//! the folder afterwards.
//!
//! The upload uses an example plugin (`BULKHEAD_EXAMPLE_PLUGINS`, built by
//! `tests/run-all`); without it that part is skipped, saying so, unless
//! `BULKHEAD_REQUIRE` lists `wasm-guests`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bulkhead_tests::{ALL_OPERATOR_SCOPES, Gateway, PolicyDir, Response, cli, gateway_toml};
use serde_json::Value;

/// Removes the audit folder when the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn example_plugin() -> Option<Vec<u8>> {
    match std::env::var_os("BULKHEAD_EXAMPLE_PLUGINS") {
        Some(dir) => Some(std::fs::read(Path::new(&dir).join("pii-redact.wasm")).unwrap()),
        None => {
            bulkhead_testkit::skip(
                bulkhead_testkit::Need::WasmGuests,
                "the plugin part: BULKHEAD_EXAMPLE_PLUGINS is not set",
            );
            None
        }
    }
}

fn entries(gateway: &Gateway, token: &str) -> Vec<Value> {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries", Some(token), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

fn actions(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_string())
        .collect()
}

/// Waits (bounded) until the log holds an entry for which `wanted` holds.
fn wait_for_entry(gateway: &Gateway, token: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = entries(gateway, token).into_iter().find(&wanted) {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such audit entry:\n{}",
            gateway.log.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_error(r: &Response, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.error_code(), code, "{}", r.body);
}

#[test]
fn a_gateway_audits_its_control_plane_and_its_proofs_verify() {
    let plugin = example_plugin();
    let policies = PolicyDir::new("audit");
    let audit = Scratch(
        policies
            .path
            .with_file_name(format!("bulkhead-e2e-audit-{}-log", std::process::id())),
    );
    let _ = std::fs::remove_dir_all(&audit.0);
    policies.write(
        "gateway.toml",
        &format!(
            "{}{}\n[audit]\ndir = \"{}\"\n",
            gateway_toml(""),
            policies.state_tables(),
            audit.0.display()
        ),
    );
    let gateway = Gateway::start(&policies);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops"]);
    let writer = policies.token("demo", &["--scope", "plugins:write", "--sub", "ci-bot"]);
    let url = format!("http://{}", gateway.admin.addr);
    let key = audit.0.join("audit.pub.pem");
    let key = key.to_str().unwrap();

    // A new log: the key's creation, the start with the policy files, then
    // the configured demo model, loaded (every byte verified) before the
    // gateway said it was ready.
    let first = entries(&gateway, &admin);
    assert_eq!(
        actions(&first),
        ["key.change", "gateway.start", "model.register"]
    );
    let model = &first[2];
    assert_eq!(model["model"], "bulkhead-demo-tiny");
    assert_eq!(model["outcome"]["result"], "accepted");
    assert_eq!(model["actor"]["kind"], "operator");
    let signature: Value =
        serde_json::from_slice(&std::fs::read(bulkhead_tests::demo_model_signature()).unwrap())
            .unwrap();
    assert_eq!(
        model["manifest"], signature,
        "the signed manifest as signed"
    );
    assert!(model["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(first[1]["actor"]["kind"], "gateway");
    let files = first[1]["policy_files"].as_array().unwrap();
    assert!(files.iter().any(
        |f| f["path"] == "gateway.toml" && f["sha256"].as_str().unwrap().starts_with("sha256:")
    ));

    // The API: operators with `audit:read` only, ranges checked.
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/checkpoint", Some(&writer), None);
    assert_error(&r, 401, "unknown_issuer");
    let models_only = policies.operator_token(&["models:read"], &[]);
    let r = gateway.admin.request(
        "GET",
        "/admin/v1/audit/checkpoint",
        Some(&models_only),
        None,
    );
    assert_error(&r, 403, "insufficient_scope");
    let r = gateway.admin.request(
        "GET",
        "/admin/v1/audit/entries?from=2&to=1",
        Some(&admin),
        None,
    );
    assert_error(&r, 400, "invalid_audit_range");
    let r = gateway.admin.request(
        "GET",
        "/admin/v1/audit/entries?from=0&to=5000",
        Some(&admin),
        None,
    );
    assert_error(&r, 400, "invalid_audit_range");
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries?from=x", Some(&admin), None);
    assert_error(&r, 400, "invalid_audit_range");
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries?limit=1", Some(&admin), None);
    assert_error(&r, 400, "invalid_parameter");
    let r = gateway.admin.request(
        "GET",
        "/admin/v1/audit/proof/inclusion?index=9",
        Some(&admin),
        None,
    );
    assert_error(&r, 400, "invalid_audit_range");
    let r = gateway.admin.request(
        "GET",
        "/admin/v1/audit/proof/consistency",
        Some(&admin),
        None,
    );
    assert_error(&r, 400, "invalid_audit_range");

    let checkpoint = gateway
        .admin
        .request("GET", "/admin/v1/audit/checkpoint", Some(&admin), None);
    assert_eq!(checkpoint.status, 200);
    assert!(
        checkpoint
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    assert!(
        checkpoint.body.starts_with("bulkhead.local/audit\n3\n"),
        "{}",
        checkpoint.body
    );
    let old = audit.0.with_extension("old-checkpoint");
    std::fs::write(&old, &checkpoint.body).unwrap();
    let _old_guard = Scratch(old.clone());

    // A plugin upload and delete, recorded after the store committed them.
    if let Some(plugin) = &plugin {
        let r = gateway.request_bytes(
            "PUT",
            "/v1/plugins/redact",
            Some(&writer),
            "application/wasm",
            plugin,
        );
        assert_eq!(r.status, 201, "{}", r.body);
        let digest = r.json()["digest"].as_str().unwrap().to_string();
        let upload = wait_for_entry(&gateway, &admin, |e| e["action"] == "plugin.upload");
        assert_eq!(upload["tenant"], "demo");
        assert_eq!(upload["name"], "redact");
        assert_eq!(upload["digest"], digest.as_str());
        assert_eq!(upload["size_bytes"], plugin.len());
        assert_eq!(
            upload["actor"],
            serde_json::json!({"kind": "tenant", "tenant": "demo", "sub": "ci-bot"})
        );
        let r = gateway.request("DELETE", "/v1/plugins/redact", Some(&writer), None);
        assert_eq!(r.status, 200, "{}", r.body);
        let delete = wait_for_entry(&gateway, &admin, |e| e["action"] == "plugin.delete");
        assert_eq!(delete["digest"], digest.as_str());
    }

    // A policy edit that loads, then one that does not.
    let demo = policies.read("tenants/demo.toml");
    policies.write("tenants/demo.toml", &format!("{demo}\n# edited\n"));
    let accepted = wait_for_entry(&gateway, &admin, |e| {
        e["action"] == "policy.reload" && e["outcome"]["result"] == "accepted"
    });
    assert!(accepted["files"].as_array().unwrap().len() >= 2);
    policies.write("tenants/demo.toml", "id = \"demo\"\n[jwt]\n");
    let refused = wait_for_entry(&gateway, &admin, |e| {
        e["action"] == "policy.reload" && e["outcome"]["result"] == "refused"
    });
    assert!(
        refused["outcome"]["reason"]
            .as_str()
            .unwrap()
            .contains("tenants/demo.toml"),
        "{refused}"
    );
    policies.write("tenants/demo.toml", &demo);
    wait_for_entry(&gateway, &admin, |e| {
        e["action"] == "policy.reload"
            && e["outcome"]["result"] == "accepted"
            && e["index"].as_u64() > accepted["index"].as_u64()
    });

    // Every entry's inclusion in the current checkpoint, and the old
    // checkpoint's consistency with it, through the CLI.
    let all = entries(&gateway, &admin);
    for (i, entry) in all.iter().enumerate() {
        assert_eq!(entry["index"], i);
    }
    let new = audit.0.with_extension("new-checkpoint");
    let _new_guard = Scratch(new.clone());
    let (ok, out) = cli(&[
        "audit",
        "proof",
        "consistency",
        "--url",
        &url,
        "--token",
        &admin,
        "--key",
        key,
        "--old",
        old.to_str().unwrap(),
        "--save",
        new.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("extends the one of size 3"), "{out}");
    for index in [0, all.len() / 2, all.len() - 1] {
        let (ok, out) = cli(&[
            "audit",
            "proof",
            "inclusion",
            "--url",
            &url,
            "--token",
            &admin,
            "--key",
            key,
            "--index",
            &index.to_string(),
            "--checkpoint",
            new.to_str().unwrap(),
        ]);
        assert!(ok, "entry {index}: {out}");
        assert!(
            out.starts_with(&format!("ok: entry {index} is in the log")),
            "{out}"
        );
    }
    // A checkpoint signed by another key is refused.
    let (ok, out) = cli(&[
        "audit",
        "proof",
        "inclusion",
        "--url",
        &url,
        "--token",
        &admin,
        "--key",
        policies
            .path
            .join("dev-keys/demo.pub.pem")
            .to_str()
            .unwrap(),
        "--index",
        "0",
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("does not verify"), "{out}");

    drop(gateway);
    let (ok, out) = cli(&["audit", "verify", audit.0.to_str().unwrap(), "--key", key]);
    assert!(ok, "{out}");
    assert!(
        out.starts_with(&format!("ok: {} entries", all.len())),
        "{out}"
    );
}
