//! Model registration on a running gateway: the configured (signed) demo
//! model is loaded before `/readyz` says ready; a model folder signed by a
//! trusted publisher registers through `bulkhead model register`, serves,
//! survives a restart and unregisters; one signed by an unknown key, one
//! changed after signing and other bad requests are refused with stable
//! codes, and every outcome is in the audit log; `bulkhead policy check`
//! names a configured model whose signature does not verify.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use bulkhead_tests::{
    ALL_OPERATOR_SCOPES, Gateway, OPERATOR_ISSUER, PolicyDir, Response, cli, gateway_toml,
    model_keygen as keygen, register_body, signed_model_copy as signed_copy,
};
use serde_json::{Value, json};

const CONFIGURED: &str = "bulkhead-demo-tiny";
const REGISTERED: &str = "registered-tiny";

/// A scratch folder beside the policy folder, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(policies: &PolicyDir, name: &str) -> Scratch {
        let path = policies.path.with_file_name(format!(
            "{}-{name}",
            policies.path.file_name().unwrap().to_string_lossy()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A policy folder with an audit log, trusting `publisher.pub.pem` too
/// (besides `bulkhead-dev`), whose demo tenant may use [`REGISTERED`].
fn setup(name: &str) -> (PolicyDir, Scratch) {
    let policies = PolicyDir::new(name);
    let scratch = Scratch::new(&policies, "work");
    let publisher = keygen(&scratch.0, "publisher");
    policies.trust_publisher_for("e2e-publisher", &publisher, REGISTERED);
    policies.write(
        "gateway.toml",
        &format!(
            "{}{}\n[audit]\ndir = \"{}\"\n",
            gateway_toml(""),
            policies.state_tables(),
            scratch.0.join("audit").display()
        ),
    );
    (policies, scratch)
}

fn completion(gateway: &Gateway, token: &str, model: &str) -> Response {
    let body = json!({"model": model, "prompt": "Emma was", "max_tokens": 4}).to_string();
    gateway.request("POST", "/v1/completions", Some(token), Some(&body))
}

fn entries(gateway: &Gateway, admin: &str) -> Vec<Value> {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/audit/entries", Some(admin), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

/// The `model.register` / `model.unregister` entries for `model`.
fn model_entries(gateway: &Gateway, admin: &str, model: &str) -> Vec<Value> {
    entries(gateway, admin)
        .into_iter()
        .filter(|e| e["model"] == model)
        .collect()
}

fn registrations(gateway: &Gateway, admin: &str) -> Vec<Value> {
    let r = gateway
        .admin
        .request("GET", "/admin/v1/models", Some(admin), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

#[test]
fn a_trusted_model_registers_serves_survives_a_restart_and_unregisters() {
    let (policies, scratch) = setup("models-register");
    let key = scratch.0.join("publisher.pem");
    let (folder, signature) = signed_copy(&scratch.0, "model-a", &key);
    let gateway = Gateway::start(&policies);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops"]);
    let user = policies.token("demo", &[]);
    let url = format!("http://{}", gateway.admin.addr);

    // The configured demo model was loaded before /readyz said ready.
    let listed = registrations(&gateway, &admin);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], CONFIGURED);
    assert_eq!(listed[0]["source"], "policy");
    assert_eq!(listed[0]["publisher"], "bulkhead-dev");
    assert_eq!(listed[0]["state"], "serving", "{listed:?}");
    assert!(listed[0]["weights_verified_at_unix_ms"].as_u64().unwrap() > 0);
    assert_eq!(completion(&gateway, &user, CONFIGURED).status, 200);

    // Not registered yet: allowed by the tenant's policy, but not served.
    let r = completion(&gateway, &user, REGISTERED);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (404, "model_not_found")
    );

    // Registered through the CLI.
    let (ok, out) = cli(&[
        "model",
        "register",
        folder.to_str().unwrap(),
        "--signature",
        signature.to_str().unwrap(),
        "--name",
        REGISTERED,
        "--url",
        &url,
        "--token",
        &admin,
    ]);
    assert!(ok, "{out}\n{}", gateway.log.text());
    assert!(out.contains("registered `registered-tiny`"), "{out}");
    assert!(out.contains("signed by `e2e-publisher`"), "{out}");

    let r = completion(&gateway, &user, REGISTERED);
    assert_eq!(r.status, 200, "{}", r.body);
    let models = gateway
        .request("GET", "/v1/models", Some(&user), None)
        .json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [CONFIGURED, REGISTERED]);
    let listed = registrations(&gateway, &admin);
    let registered = listed.iter().find(|m| m["name"] == REGISTERED).unwrap();
    assert_eq!(registered["source"], "api");
    assert_eq!(registered["publisher"], "e2e-publisher");
    assert_eq!(registered["state"], "serving");
    assert_eq!(registered["registered_by"], "ops");

    // Audited with the signed manifest, by the admin token's holder.
    let audited = model_entries(&gateway, &admin, REGISTERED);
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["action"], "model.register");
    assert_eq!(audited[0]["outcome"]["result"], "accepted");
    assert_eq!(audited[0]["digest"], registered["digest"]);
    let operator = json!({"kind": "operator", "issuer": OPERATOR_ISSUER, "sub": "ops"});
    assert_eq!(audited[0]["actor"], operator);
    let bundle: Value = serde_json::from_slice(&std::fs::read(&signature).unwrap()).unwrap();
    assert_eq!(audited[0]["manifest"], bundle);
    // And the call itself, after the registration's entry, before the answer.
    let all = entries(&gateway, &admin);
    let at = all
        .iter()
        .position(|e| e["action"] == "model.register" && e["model"] == REGISTERED)
        .unwrap();
    assert_eq!(
        (
            &all[at + 1]["action"],
            &all[at + 1]["route"],
            &all[at + 1]["target"],
            &all[at + 1]["outcome"]["result"],
            &all[at + 1]["actor"],
        ),
        (
            &json!("admin.action"),
            &json!("POST /admin/v1/models"),
            &json!(REGISTERED),
            &json!("accepted"),
            &operator
        )
    );

    // Registering the name again, or a configured name, conflicts.
    let body = register_body(REGISTERED, &folder, &signature);
    let r = gateway
        .admin
        .request("POST", "/admin/v1/models", Some(&admin), Some(&body));
    assert_eq!((r.status, r.error_code().as_str()), (409, "model_exists"));
    let body = register_body(CONFIGURED, &folder, &signature);
    let r = gateway
        .admin
        .request("POST", "/admin/v1/models", Some(&admin), Some(&body));
    assert_eq!((r.status, r.error_code().as_str()), (409, "model_exists"));
    // A configured model is removed in the policy, not through the API.
    let r = gateway.admin.request(
        "DELETE",
        &format!("/admin/v1/models/{CONFIGURED}"),
        Some(&admin),
        None,
    );
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (409, "model_configured")
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("remove it there")
    );

    // The registration survives a restart of the gateway.
    assert!(gateway.terminate().success());
    let gateway = Gateway::start(&policies);
    let url = format!("http://{}", gateway.admin.addr);
    let r = completion(&gateway, &user, REGISTERED);
    assert_eq!(r.status, 200, "{}\n{}", r.body, gateway.log.text());

    // Unregistered through the CLI: no longer served, audited.
    let (ok, out) = cli(&[
        "model",
        "unregister",
        REGISTERED,
        "--url",
        &url,
        "--token",
        &admin,
    ]);
    assert!(ok, "{out}");
    let r = completion(&gateway, &user, REGISTERED);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (404, "model_not_found")
    );
    let audited = model_entries(&gateway, &admin, REGISTERED);
    let last = audited.last().unwrap();
    assert_eq!(last["action"], "model.unregister");
    assert_eq!(last["outcome"]["result"], "accepted");
    let all = entries(&gateway, &admin);
    let action = all.last().unwrap();
    assert_eq!(action["action"], "admin.action");
    assert_eq!(action["route"], "DELETE /admin/v1/models/{name}");
    assert_eq!(action["target"], REGISTERED);
    assert_eq!(action["outcome"]["result"], "accepted");
    let (ok, out) = cli(&[
        "model",
        "unregister",
        REGISTERED,
        "--url",
        &url,
        "--token",
        &admin,
    ]);
    assert!(!ok);
    assert!(out.contains("is not registered"), "{out}");
    assert_eq!(registrations(&gateway, &admin).len(), 1);
    assert!(policies.registry.join("lock").exists());
    assert!(!policies.registry.join("registered-tiny.json").exists());
}

#[test]
fn untrusted_changed_and_malformed_registrations_are_refused_and_audited() {
    let (policies, scratch) = setup("models-refused");
    let trusted = scratch.0.join("publisher.pem");
    let stranger = keygen(&scratch.0, "stranger");
    let gateway = Gateway::start(&policies);
    let admin = policies.operator_token(&ALL_OPERATOR_SCOPES, &["--sub", "ops"]);
    let user = policies.token("demo", &[]);
    let url = format!("http://{}", gateway.admin.addr);
    let post = |body: &str, token: &str| {
        gateway
            .admin
            .request("POST", "/admin/v1/models", Some(token), Some(body))
    };

    // Signed by a key trust.toml does not list: 403, audited as refused.
    let (folder, signature) = signed_copy(&scratch.0, "untrusted", &stranger);
    let r = post(&register_body(REGISTERED, &folder, &signature), &admin);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (403, "model_signature_untrusted"),
        "{}",
        r.body
    );
    assert!(r.body.contains("e2e-publisher"), "{}", r.body);
    let audited = model_entries(&gateway, &admin, REGISTERED);
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0]["outcome"]["result"], "refused");
    assert!(
        audited[0]["outcome"]["reason"]
            .as_str()
            .unwrap()
            .contains("no trusted publisher's key verifies the signature")
    );

    // Signed by a trusted key, then one byte of the GGUF changed: the
    // gpu-host finds it while loading: 422 naming the file.
    let (folder, signature) = signed_copy(&scratch.0, "changed", &trusted);
    let gguf = folder.join("model.gguf");
    let mut bytes = std::fs::read(&gguf).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&gguf, bytes).unwrap();
    let (ok, out) = cli(&[
        "model",
        "register",
        folder.to_str().unwrap(),
        "--signature",
        signature.to_str().unwrap(),
        "--name",
        REGISTERED,
        "--url",
        &url,
        "--token",
        &admin,
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("(422)"), "{out}");
    assert!(out.contains(&gguf.display().to_string()), "{out}");
    assert!(out.contains("does not match its registration"), "{out}");
    let r = post(&register_body(REGISTERED, &folder, &signature), &admin);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (422, "model_digest_mismatch")
    );
    let refused = model_entries(&gateway, &admin, REGISTERED);
    assert!(refused.len() >= 3, "{refused:?}");
    assert!(refused.iter().all(|e| e["outcome"]["result"] == "refused"));

    // A signed folder whose GGUF is gone: 404.
    let (folder, signature) = signed_copy(&scratch.0, "gone", &trusted);
    std::fs::remove_file(folder.join("model.gguf")).unwrap();
    let r = post(&register_body(REGISTERED, &folder, &signature), &admin);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (404, "model_file_not_found")
    );

    // Malformed requests.
    let (folder, signature) = signed_copy(&scratch.0, "ok", &trusted);
    let good = register_body(REGISTERED, &folder, &signature);
    for (body, status, code) in [
        ("{".to_string(), 400, "invalid_request"),
        (
            r#"{"name":"x","dir":"/m"}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            good.replace(REGISTERED, "bad name"),
            400,
            "invalid_model_name",
        ),
        (
            good.replace(&format!("\"{}\"", folder.display()), "\"relative/dir\""),
            400,
            "invalid_model_dir",
        ),
        (
            good.replace("\"dir\"", "\"file\":\"other.gguf\",\"dir\""),
            400,
            "model_file_not_signed",
        ),
    ] {
        let r = post(&body, &admin);
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (status, code),
            "{}",
            r.body
        );
    }
    // A body over the limit is refused from its declared length, before it
    // is read (sending it whole would race the server's early answer).
    let mut stream = TcpStream::connect(gateway.admin.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /admin/v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         authorization: Bearer {admin}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        600 << 10
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let r = Response::parse(&raw);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (413, "request_too_large"),
        "{}",
        r.body
    );
    // Only an operator with `models:write` registers.
    let r = post(&good, &user);
    assert_eq!((r.status, r.error_code().as_str()), (401, "unknown_issuer"));
    let reader = policies.operator_token(&["models:read"], &[]);
    let r = post(&good, &reader);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (403, "insufficient_scope")
    );
    let r = completion(&gateway, &user, REGISTERED);
    assert_eq!(r.status, 404);
    // After all that, a good one goes through.
    let r = post(&good, &admin);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(completion(&gateway, &user, REGISTERED).status, 200);
}

#[test]
fn policy_check_names_a_configured_model_whose_signature_does_not_verify() {
    let policies = PolicyDir::new("models-check");
    let scratch = Scratch::new(&policies, "keys");
    let other = keygen(&scratch.0, "other");
    // bulkhead-dev's entry now holds another key: the demo model's
    // signature no longer verifies with anything trusted.
    policies.write(
        "dev-keys/bulkhead-dev.pub.pem",
        &std::fs::read_to_string(other.with_extension("pub.pem")).unwrap(),
    );
    let (ok, out) = cli(&["policy", "check", policies.path.to_str().unwrap()]);
    assert!(!ok, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("model `bulkhead-demo-tiny`"))
        .unwrap_or_else(|| panic!("no error names the model:\n{out}"));
    assert!(line.contains("/gateway.toml:"), "{line}");
    assert!(
        line.contains("no trusted publisher's key verifies the signature"),
        "{line}"
    );
}
