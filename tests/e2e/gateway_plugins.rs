//! The tenant plugin API over HTTP: upload, list, get, replace, delete,
//! refusals (auth, scope, name, size, not a component, forbidden imports),
//! tenant isolation, and plugins surviving a restart.
//!
//! Uploads that must succeed use the example plugins `tests/run-all` builds
//! (`guest-sdk/build`), found through `BULKHEAD_EXAMPLE_PLUGINS`; without it
//! those tests skip for `wasm-guests`, a failure where `BULKHEAD_REQUIRE` lists it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use bulkhead_gateway::plugins::MAX_COMPONENT_BYTES;
use bulkhead_tests::{Gateway, PolicyDir, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};

const WASM: &str = "application/wasm";

/// The folder of example components, or `None` (skip) when it is not set.
fn example_plugins() -> Option<PathBuf> {
    match std::env::var_os("BULKHEAD_EXAMPLE_PLUGINS") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            bulkhead_testkit::skip(
                bulkhead_testkit::Need::WasmGuests,
                "BULKHEAD_EXAMPLE_PLUGINS is not set (build the example plugins with \
                 `guest-sdk/build DIR`, then set it to DIR; tests/run-all does both)",
            );
            None
        }
    }
}

fn example(dir: &std::path::Path, name: &str) -> Vec<u8> {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The default policies plus tenant `other`, whose tokens the demo dev key
/// also signs (under its own issuer).
fn policies(name: &str) -> PolicyDir {
    let policies = PolicyDir::new(name);
    policies.write(
        "tenants/other.toml",
        "id = \"other\"\nmodels = [\"bulkhead-demo-tiny\"]\n\n[jwt]\nissuer = \"other-dev\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n\
         public_keys = [\"dev-keys/demo.pub.pem\"]\ndev_signing_key = \"dev-keys/demo.key.pem\"\n",
    );
    policies
}

fn writer_token(policies: &PolicyDir, tenant: &str) -> String {
    policies.token(tenant, &["--scope", "plugins:write", "--sub", "ci-bot"])
}

fn put(gateway: &Gateway, token: Option<&str>, name: &str, bytes: &[u8]) -> Response {
    gateway.request_bytes("PUT", &format!("/v1/plugins/{name}"), token, WASM, bytes)
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

fn names(list: &Response) -> Vec<String> {
    assert_eq!(list.status, 200, "{}", list.body);
    let list = list.json();
    assert_eq!(list["object"], "list");
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

fn assert_error(r: &Response, status: u16, code: &str) -> String {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.error_code(), code, "{}", r.body);
    r.json()["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn plugins_upload_list_replace_delete_and_survive_a_restart() {
    let Some(examples) = example_plugins() else {
        return;
    };
    let redact = example(&examples, "pii-redact");
    let guard = example(&examples, "prompt-guard");
    let system = example(&examples, "system-prompt");
    let policies = policies("plugins-lifecycle");
    let gateway = Gateway::start(&policies);
    let demo = writer_token(&policies, "demo");
    let other = writer_token(&policies, "other");

    let created = put(&gateway, Some(&demo), "redact", &redact);
    assert_eq!(created.status, 201, "{}", created.body);
    let plugin = created.json();
    assert_eq!(plugin["object"], "plugin");
    assert_eq!(plugin["name"], "redact");
    assert_eq!(plugin["digest"], sha256(&redact));
    assert_eq!(plugin["size_bytes"], redact.len());
    let imports: Vec<&str> = plugin["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(
        imports
            .iter()
            .any(|i| i.starts_with("bulkhead:plugin/host@0.1")),
        "{imports:?}"
    );
    assert!(plugin["created_at"].as_u64().unwrap() > 1_700_000_000);

    // The same bytes again: 200, nothing changed.
    let again = put(&gateway, Some(&demo), "redact", &redact);
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.json(), plugin);

    assert_eq!(put(&gateway, Some(&demo), "guard", &guard).status, 201);
    let list = gateway.request("GET", "/v1/plugins", Some(&demo), None);
    assert_eq!(names(&list), ["guard", "redact"]);
    assert_eq!(list.json()["data"][1], plugin);
    let one = gateway.request("GET", "/v1/plugins/redact", Some(&demo), None);
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(one.json(), plugin);

    // Replaced: 200 with the new digest.
    let replaced = put(&gateway, Some(&demo), "redact", &system);
    assert_eq!(replaced.status, 200, "{}", replaced.body);
    assert_eq!(replaced.json()["digest"], sha256(&system));

    // Another tenant sees none of it and can use the same names.
    let theirs = gateway.request("GET", "/v1/plugins", Some(&other), None);
    assert!(names(&theirs).is_empty());
    assert_error(
        &gateway.request("GET", "/v1/plugins/redact", Some(&other), None),
        404,
        "plugin_not_found",
    );
    assert_error(
        &gateway.request("DELETE", "/v1/plugins/guard", Some(&other), None),
        404,
        "plugin_not_found",
    );
    assert_eq!(put(&gateway, Some(&other), "redact", &redact).status, 201);

    let deleted = gateway.request("DELETE", "/v1/plugins/guard", Some(&demo), None);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    let deleted = deleted.json();
    assert_eq!(deleted["object"], "plugin.deleted");
    assert_eq!(deleted["name"], "guard");
    assert_eq!(deleted["deleted"], true);
    assert_error(
        &gateway.request("GET", "/v1/plugins/guard", Some(&demo), None),
        404,
        "plugin_not_found",
    );
    assert_error(
        &gateway.request("DELETE", "/v1/plugins/guard", Some(&demo), None),
        404,
        "plugin_not_found",
    );

    let uploads = |result| {
        gateway.metric(
            "bulkhead_plugin_uploads_total",
            &[("tenant", "demo"), ("result", result)],
        )
    };
    assert_eq!(uploads("created"), 2.0);
    assert_eq!(uploads("unchanged"), 1.0);
    assert_eq!(uploads("replaced"), 1.0);

    // A new gateway on the same policy folder and store serves the same
    // plugins, read back from their cached artifacts.
    assert!(gateway.terminate().success());
    let gateway = Gateway::start(&policies);
    let (_, loaded) = gateway
        .log
        .wait_for("plugin store loaded", 0, Duration::from_secs(5));
    assert!(
        loaded.contains("plugins=2") && loaded.contains("from_cache=2"),
        "{loaded}"
    );
    assert!(
        loaded.contains("compiled=0") && loaded.contains("failed=0"),
        "{loaded}"
    );
    let list = gateway.request("GET", "/v1/plugins", Some(&demo), None);
    assert_eq!(names(&list), ["redact"]);
    assert_eq!(list.json()["data"][0], replaced.json());
    let list = gateway.request("GET", "/v1/plugins", Some(&other), None);
    assert_eq!(list.json()["data"][0]["digest"], sha256(&redact));
}

/// A component importing WASI's filesystem: refused naming the import.
const FORBIDDEN: &str = r#"(component (import "wasi:filesystem/types@0.2.6" (instance)))"#;

#[test]
fn bad_uploads_are_refused_saying_why() {
    let policies = policies("plugins-refused");
    let gateway = Gateway::start(&policies);
    let demo = writer_token(&policies, "demo");
    let inference_only = policies.token("demo", &[]);
    let component = wat::parse_str(FORBIDDEN).unwrap();

    // No token, or a token without plugins:write.
    for (method, path) in [
        ("PUT", "/v1/plugins/x"),
        ("GET", "/v1/plugins"),
        ("GET", "/v1/plugins/x"),
        ("DELETE", "/v1/plugins/x"),
    ] {
        let r = gateway.request_bytes(method, path, None, WASM, &component);
        assert_eq!(r.status, 401, "{method} {path}: {}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let r = gateway.request_bytes(method, path, Some(&inference_only), WASM, &component);
        assert_eq!(r.status, 403, "{method} {path}: {}", r.body);
        assert!(r.body.contains("plugins:write"), "{}", r.body);
    }

    let message = assert_error(
        &put(&gateway, Some(&demo), "Bad_Name", &component),
        400,
        "invalid_plugin_name",
    );
    assert!(
        message.contains("Bad_Name") && message.contains("a-z"),
        "{message}"
    );
    assert_error(
        &gateway.request("GET", "/v1/plugins/has.dot", Some(&demo), None),
        400,
        "invalid_plugin_name",
    );

    let message = assert_error(
        &put(&gateway, Some(&demo), "x", &component),
        400,
        "plugin_forbidden_import",
    );
    assert!(
        message.contains("`wasi:filesystem/types@0.2.6`") && message.contains("no filesystem"),
        "{message}"
    );
    let core = wat::parse_str("(module)").unwrap();
    let message = assert_error(
        &put(&gateway, Some(&demo), "x", &core),
        400,
        "plugin_not_component",
    );
    assert!(message.contains("wasm32-wasip2"), "{message}");
    for garbage in [&b""[..], b"#!/bin/sh\n", b"\0asm\x0d\0\x01\0\xff"] {
        assert_error(
            &put(&gateway, Some(&demo), "x", garbage),
            400,
            "plugin_malformed",
        );
    }

    // Over the size cap, declared (refused before the body is read) or
    // streamed without a length (refused once the cap is passed).
    let declared = raw(
        &gateway,
        &format!(
            "PUT /v1/plugins/big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             authorization: Bearer {demo}\r\ncontent-type: {WASM}\r\n\
             content-length: {}\r\n\r\n",
            MAX_COMPONENT_BYTES + 1
        ),
        &[],
    );
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    assert!(declared.contains("plugin_too_large"), "{declared}");
    let mut chunked = Vec::new();
    let chunk = vec![0u8; 1 << 16];
    let mut sent = 0;
    while sent <= MAX_COMPONENT_BYTES {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
        sent += chunk.len();
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let streamed = raw(
        &gateway,
        &format!(
            "PUT /v1/plugins/big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             authorization: Bearer {demo}\r\ncontent-type: {WASM}\r\n\
             transfer-encoding: chunked\r\n\r\n"
        ),
        &chunked,
    );
    assert!(streamed.starts_with("HTTP/1.1 413"), "{streamed}");
    assert!(streamed.contains("plugin_too_large"), "{streamed}");

    // Nothing was stored; every refusal was counted.
    let list = gateway.request("GET", "/v1/plugins", Some(&demo), None);
    assert!(names(&list).is_empty());
    let refused = |result| {
        gateway.metric(
            "bulkhead_plugin_uploads_total",
            &[("tenant", "demo"), ("result", result)],
        )
    };
    assert_eq!(refused("plugin_forbidden_import"), 1.0);
    assert_eq!(refused("plugin_malformed"), 3.0);
    assert_eq!(refused("plugin_too_large"), 2.0);
    assert_eq!(refused("invalid_plugin_name"), 1.0);
}

/// Sends `head` then `body` (write errors ignored: the gateway may answer
/// and close before it has read everything) and returns what came back.
fn raw(gateway: &Gateway, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(gateway.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn without_a_store_the_plugin_api_says_uploads_are_off() {
    let policies = PolicyDir::new("plugins-off");
    policies.write("gateway.toml", &bulkhead_tests::gateway_toml(""));
    let gateway = Gateway::start(&policies);
    let demo = writer_token(&policies, "demo");
    for (method, path) in [("PUT", "/v1/plugins/x"), ("GET", "/v1/plugins")] {
        let r = gateway.request_bytes(method, path, Some(&demo), WASM, b"\0asm");
        let message = assert_error(&r, 501, "plugin_uploads_disabled");
        assert!(
            message.contains("`store`") && message.contains("[plugins]"),
            "{message}"
        );
    }
    assert!(!policies.store.exists());
    // Inference is unaffected.
    let models = gateway.request(
        "GET",
        "/v1/models",
        Some(&policies.token("demo", &[])),
        None,
    );
    assert_eq!(models.status, 200, "{}", models.body);
    let _: Value = models.json();
}
