//! Authorization as a hostile tenant would probe it, on the real binary:
//! every route the two listeners serve is in the gateway's route table
//! (`bulkhead_gateway::ROUTES`) and nothing else is served; every route is
//! called with no token, an expired token, tenant tokens of each scope,
//! tenant tokens forging operator scopes (signed by the tenant's own key),
//! another tenant's token, and an operator token of each scope; each gets
//! the status its table entry implies, and no refused call changes the
//! plugin store, the model registry or the audit log.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bulkhead_gateway::audit::merkle::{leaf_hash, verify_inclusion};
use bulkhead_gateway::audit::note::open_checkpoint;
use bulkhead_gateway::audit::read_verifier;
use bulkhead_gateway::{Access, Listener, ROUTES};
use bulkhead_tests::{ALL_OPERATOR_SCOPES, Client, Gateway, OPERATOR_ISSUER, PolicyDir, bin};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

const MODEL: &str = "bulkhead-demo-tiny";

/// The demo tenant's gateway, a second tenant `acme` with an issuer and
/// key of its own, an audit log, and a plugin `guard` uploaded by demo.
struct World {
    policies: PolicyDir,
    audit_dir: std::path::PathBuf,
    gateway: Gateway,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.audit_dir);
    }
}

fn world(name: &str) -> World {
    let policies = PolicyDir::new(name);
    let audit_dir = policies
        .path
        .with_file_name(format!("bulkhead-e2e-{name}-{}-audit", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit_dir);
    let toml = policies.read("gateway.toml");
    policies.write(
        "gateway.toml",
        &format!("{toml}\n[audit]\ndir = \"{}\"\n", audit_dir.display()),
    );
    let keygen = Command::new(bin("bulkhead"))
        .args(["token", "keygen", "--out"])
        .arg(policies.path.join("dev-keys/acme"))
        .output()
        .unwrap();
    assert!(keygen.status.success(), "{keygen:?}");
    policies.write(
        "tenants/acme.toml",
        &format!(
            "id = \"acme\"\nclass = \"standard\"\nmodels = [\"{MODEL}\"]\n\n[jwt]\n\
             issuer = \"acme-idp\"\naudience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n\
             public_keys = [\"dev-keys/acme.pub.pem\"]\ndev_signing_key = \"dev-keys/acme.key.pem\"\n"
        ),
    );
    let gateway = Gateway::start(&policies);
    World {
        policies,
        audit_dir,
        gateway,
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token signed with the demo tenant's own key, with any claims.
fn signed_by_demo(policies: &PolicyDir, claims: &Value) -> String {
    let pem = policies.read("dev-keys/demo.key.pem");
    encode(
        &Header::new(Algorithm::EdDSA),
        claims,
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// Who calls: a name, the token, and what the gateway should make of it.
struct Caller {
    name: &'static str,
    token: Option<String>,
    kind: CallerKind,
}

#[derive(Clone, Copy, PartialEq)]
enum CallerKind {
    /// No token, expired, or a tenant-signed token claiming the operator's
    /// issuer: valid for no route that needs one.
    Invalid,
    /// A valid tenant token with these tenant scopes.
    Tenant(&'static str, &'static [&'static str]),
    /// A valid operator token with these scopes.
    Operator(&'static [&'static str]),
}

fn callers(policies: &PolicyDir) -> Vec<Caller> {
    let all_claimed = "admin inference plugins:write models:read models:write audit:read \
                       partitions:read tenants:read usage:read gpu-hosts:read gpu-hosts:write";
    let mut callers = vec![
        Caller {
            name: "no token",
            token: None,
            kind: CallerKind::Invalid,
        },
        Caller {
            name: "expired tenant token",
            token: Some(signed_by_demo(
                policies,
                &json!({"iss": "bulkhead-dev", "aud": "bulkhead", "sub": "x",
                        "exp": now() - 3600, "scope": "inference plugins:write"}),
            )),
            kind: CallerKind::Invalid,
        },
        Caller {
            name: "demo inference",
            token: Some(policies.token("demo", &["--scope", "inference"])),
            kind: CallerKind::Tenant("demo", &["inference"]),
        },
        Caller {
            name: "demo plugins:write",
            token: Some(policies.token("demo", &["--scope", "plugins:write"])),
            kind: CallerKind::Tenant("demo", &["plugins:write"]),
        },
        Caller {
            name: "demo claiming every operator scope",
            token: Some(signed_by_demo(
                policies,
                &json!({"iss": "bulkhead-dev", "aud": ["bulkhead", "bulkhead-admin"],
                        "sub": "mallory", "iat": now(), "exp": now() + 600, "scope": all_claimed}),
            )),
            // Its own issuer: only the tenant scopes among the claims count.
            kind: CallerKind::Tenant("demo", &["inference", "plugins:write"]),
        },
        Caller {
            name: "demo forging the operator's issuer",
            token: Some(signed_by_demo(
                policies,
                &json!({"iss": OPERATOR_ISSUER, "aud": "bulkhead-admin", "sub": "mallory",
                        "iat": now(), "exp": now() + 600, "scope": all_claimed}),
            )),
            kind: CallerKind::Invalid,
        },
        Caller {
            name: "acme plugins:write",
            token: Some(policies.token("acme", &["--scope", "plugins:write", "inference"])),
            kind: CallerKind::Tenant("acme", &["inference", "plugins:write"]),
        },
    ];
    for scope in ALL_OPERATOR_SCOPES {
        callers.push(Caller {
            name: scope,
            token: Some(policies.operator_token(&[scope], &["--sub", "ops"])),
            kind: CallerKind::Operator(match scope {
                "models:read" => &["models:read"],
                "models:write" => &["models:write"],
                "audit:read" => &["audit:read"],
                "partitions:read" => &["partitions:read"],
                "tenants:read" => &["tenants:read"],
                "gpu-hosts:read" => &["gpu-hosts:read"],
                "gpu-hosts:write" => &["gpu-hosts:write"],
                _ => &["usage:read"],
            }),
        });
    }
    callers
}

/// How to call one route of the table, and what an authorized caller gets.
struct Probe {
    method: &'static str,
    path: &'static str,
    /// The concrete path (placeholders filled, a query where needed).
    call: &'static str,
    body: Option<&'static str>,
    ok: u16,
}

const fn probe(
    method: &'static str,
    path: &'static str,
    call: &'static str,
    body: Option<&'static str>,
    ok: u16,
) -> Probe {
    Probe {
        method,
        path,
        call,
        body,
        ok,
    }
}

const CHAT: &str =
    r#"{"model":"bulkhead-demo-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
const COMPLETION: &str = r#"{"model":"bulkhead-demo-tiny","prompt":"Emma","max_tokens":1}"#;

/// One probe per table route. Calls that would change state are made so
/// an authorized caller is refused by the handler (a body that is not a
/// component, a model that cannot be unregistered), so every call in the
/// matrix must leave the state alone, except for the audit entry an
/// operator's changing call writes.
#[rustfmt::skip]
const PROBES: &[Probe] = &[
    probe("GET",    "/healthz",                           "/healthz",                                   None,                    200),
    probe("GET",    "/readyz",                            "/readyz",                                    None,                    200),
    probe("GET",    "/metrics",                           "/metrics",                                   None,                    200),
    probe("POST",   "/v1/chat/completions",               "/v1/chat/completions",                       Some(CHAT),              200),
    probe("POST",   "/v1/completions",                    "/v1/completions",                            Some(COMPLETION),        200),
    probe("GET",    "/v1/models",                         "/v1/models",                                 None,                    200),
    probe("GET",    "/v1/usage",                          "/v1/usage",                                  None,                    200),
    probe("GET",    "/v1/plugins",                        "/v1/plugins",                                None,                    200),
    probe("GET",    "/v1/plugins/{name}",                 "/v1/plugins/guard",                          None,                    200),
    probe("PUT",    "/v1/plugins/{name}",                 "/v1/plugins/guard",                          Some("not a component"), 400),
    probe("DELETE", "/v1/plugins/{name}",                 "/v1/plugins/missing",                        None,                    404),
    probe("GET",    "/v1/audit/entries",                  "/v1/audit/entries",                          None,                    200),
    probe("GET",    "/admin/v1/models",                   "/admin/v1/models",                           None,                    200),
    probe("POST",   "/admin/v1/models",                   "/admin/v1/models",                           Some("{}"),              400),
    probe("DELETE", "/admin/v1/models/{name}",            "/admin/v1/models/bulkhead-demo-tiny",        None,                    409),
    probe("GET",    "/admin/v1/partitions",               "/admin/v1/partitions",                       None,                    200),
    probe("GET",    "/admin/v1/gpu-hosts",                "/admin/v1/gpu-hosts",                        None,                    200),
    probe("POST",   "/admin/v1/gpu-hosts/{name}/drain",   "/admin/v1/gpu-hosts/missing/drain",          None,                    404),
    probe("POST",   "/admin/v1/gpu-hosts/{name}/resume",  "/admin/v1/gpu-hosts/missing/resume",         None,                    404),
    probe("GET",    "/admin/v1/tenants",                  "/admin/v1/tenants",                          None,                    200),
    probe("GET",    "/admin/v1/usage",                    "/admin/v1/usage",                            None,                    200),
    probe("GET",    "/admin/v1/audit/checkpoint",         "/admin/v1/audit/checkpoint",                 None,                    200),
    probe("GET",    "/admin/v1/audit/entries",            "/admin/v1/audit/entries",                    None,                    200),
    probe("GET",    "/admin/v1/audit/proof/inclusion",    "/admin/v1/audit/proof/inclusion?index=0",    None,                    200),
    probe("GET",    "/admin/v1/audit/proof/consistency",  "/admin/v1/audit/proof/consistency?from=1",   None,                    200),
];

/// Every file of the plugin store and registry, and the audit log's
/// entries, as bytes: what a refused call must not change.
fn state(world: &World) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for dir in [&world.policies.store, &world.policies.registry] {
        collect(dir, &mut files);
    }
    let log = world.audit_dir.join("entries.log");
    files.push((log.display().to_string(), std::fs::read(&log).unwrap()));
    files.sort();
    files
}

fn collect(dir: &Path, files: &mut Vec<(String, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
}

fn audit_entries(world: &World) -> Vec<Value> {
    let admin = world.policies.operator_token(&["audit:read"], &[]);
    let r = world
        .gateway
        .admin
        .request("GET", "/admin/v1/audit/entries", Some(&admin), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

fn upload_guard(world: &World, tenant: &str) {
    let token = world.policies.token(tenant, &["--scope", "plugins:write"]);
    let wasm = bulkhead_testkit::wasm::example("prompt-guard");
    let r = world.gateway.request_bytes(
        "PUT",
        "/v1/plugins/guard",
        Some(&token),
        "application/wasm",
        &wasm,
    );
    assert!(matches!(r.status, 200 | 201), "{}", r.body);
}

fn expected(
    probe: &Probe,
    access: Access,
    listener: Listener,
    on: Listener,
    caller: &Caller,
) -> u16 {
    if listener != on {
        return 404;
    }
    match (access, caller.kind) {
        (Access::Anonymous, _) => probe.ok,
        (_, CallerKind::Invalid) => 401,
        (Access::Tenant(_), CallerKind::Operator(_)) => 401,
        (Access::Operator(_), CallerKind::Tenant(..)) => 401,
        (Access::Tenant(scope), CallerKind::Tenant(tenant, scopes)) => {
            if !scopes.contains(&scope.as_str()) {
                403
            } else if tenant != "demo" && probe.call == "/v1/plugins/guard" && probe.method == "GET"
            {
                404 // another tenant's plugin does not exist for it
            } else {
                probe.ok
            }
        }
        (Access::Operator(scope), CallerKind::Operator(scopes)) => {
            if scopes.contains(&scope.as_str()) {
                probe.ok
            } else {
                403
            }
        }
    }
}

#[test]
fn every_route_answers_only_the_principal_and_scope_its_table_entry_names() {
    let world = world("routes-matrix");
    upload_guard(&world, "demo");
    let callers = callers(&world.policies);
    let gateway = &world.gateway;
    let listeners = [
        (Listener::Public, gateway.client()),
        (Listener::Admin, gateway.admin),
    ];

    // Every table route has a probe, and every probe is a table route.
    let table: BTreeSet<(&str, &str)> =
        ROUTES.iter().map(|r| (r.method.as_str(), r.path)).collect();
    let probed: BTreeSet<(&str, &str)> = PROBES.iter().map(|p| (p.method, p.path)).collect();
    assert_eq!(
        table, probed,
        "the matrix must probe exactly the table's routes"
    );

    let mut refused = 0;
    let mut failures = Vec::new();
    for probe in PROBES {
        for (on, client) in &listeners {
            // The entry for this listener, or any (to know it is 404 here).
            let entry = ROUTES
                .iter()
                .find(|r| {
                    r.method.as_str() == probe.method && r.path == probe.path && r.listener == *on
                })
                .or_else(|| {
                    ROUTES
                        .iter()
                        .find(|r| r.method.as_str() == probe.method && r.path == probe.path)
                })
                .unwrap();
            for caller in &callers {
                let want = expected(probe, entry.access, entry.listener, *on, caller);
                let before = state(&world);
                let entries_before = audit_entries(&world).len();
                let r = client.request(
                    probe.method,
                    probe.call,
                    caller.token.as_deref(),
                    probe.body,
                );
                let what = format!(
                    "{} {} on {on:?} as {}",
                    probe.method, probe.call, caller.name
                );
                if r.status != want {
                    failures.push(format!("{what}: {} (want {want}): {}", r.status, r.body));
                    continue;
                }
                if let Some(token) = &caller.token {
                    assert!(
                        !r.body.contains(token.as_str()),
                        "{what}: the token is echoed"
                    );
                }
                if r.status >= 400 {
                    refused += 1;
                    let after = state(&world);
                    let operator_wrote = matches!(caller.kind, CallerKind::Operator(_))
                        && matches!(entry.access, Access::Operator(_))
                        && r.status != 401
                        && r.status != 403
                        && entry.listener == *on
                        && probe.method != "GET";
                    if operator_wrote {
                        // An authorized operator's refused change is
                        // audited as such, and only that changed.
                        let entries = audit_entries(&world);
                        assert_eq!(entries.len(), entries_before + 1, "{what}");
                        let last = entries.last().unwrap();
                        assert_eq!(last["action"], "admin.action", "{what}: {last}");
                        assert_eq!(last["outcome"]["result"], "refused", "{what}: {last}");
                        assert_eq!(last["actor"]["issuer"], OPERATOR_ISSUER, "{what}: {last}");
                        let without_log = |s: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
                            s.iter()
                                .filter(|(p, _)| !p.ends_with("entries.log"))
                                .cloned()
                                .collect()
                        };
                        assert!(
                            without_log(&before) == without_log(&after),
                            "{what} changed the store or registry"
                        );
                    } else if before != after {
                        failures.push(format!(
                            "{what}: refused ({}) but changed the state",
                            r.status
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        refused > 200,
        "only {refused} refusals: the matrix is not probing"
    );
    // Refused operator calls are counted by reason.
    assert!(
        gateway.metric(
            "bulkhead_admin_refusals_total",
            &[("reason", "unknown_issuer")]
        ) > 0.0
    );
    assert!(
        gateway.metric(
            "bulkhead_admin_refusals_total",
            &[("reason", "insufficient_scope")]
        ) > 0.0
    );
    assert!(
        gateway.metric(
            "bulkhead_admin_refusals_total",
            &[("reason", "missing_authorization")]
        ) > 0.0
    );
    // Nothing a tenant did reached demo's plugin.
    let demo = world.policies.token("demo", &["--scope", "plugins:write"]);
    assert_eq!(
        gateway
            .request("GET", "/v1/plugins/guard", Some(&demo), None)
            .status,
        200
    );
    // The gateway's own log never holds a token.
    let log = gateway.log.text();
    for caller in &callers {
        if let Some(token) = &caller.token {
            assert!(
                !log.contains(token.as_str()),
                "{} is in the log",
                caller.name
            );
        }
    }
}

/// What each router serves, found by asking: every table path (and a few
/// that are not) with every method. A route is served when it answers
/// anything but 404 `unknown_url` or 405; the served set of each listener
/// must be exactly its table entries.
#[test]
fn the_listeners_serve_exactly_the_table() {
    let world = world("routes-served");
    let gateway = &world.gateway;
    // Every table path, its `{name}` as `x`, and some that are not.
    let concrete = |path: &str| path.replace("{name}", "x");
    let mut paths: BTreeSet<String> = ROUTES.iter().map(|r| concrete(r.path)).collect();
    for extra in [
        "/",
        "/admin",
        "/admin/v1",
        "/admin/v1/unknown",
        "/v1",
        "/v2/models",
        "/v1/plugins/x/y",
        "/metrics/x",
    ] {
        paths.insert(extra.to_owned());
    }
    for (listener, client) in [
        (Listener::Public, gateway.client()),
        (Listener::Admin, gateway.admin),
    ] {
        let mut served = BTreeSet::new();
        for path in &paths {
            for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                let body = (method != "GET").then_some("{}");
                let r = client.request(method, path, None, body);
                let unknown = r.status == 405
                    || (r.status == 404 && r.json()["error"]["code"] == "unknown_url");
                if !unknown {
                    served.insert((method.to_owned(), path.clone()));
                }
            }
        }
        let table: BTreeSet<(String, String)> = ROUTES
            .iter()
            .filter(|r| r.listener == listener)
            .map(|r| (r.method.as_str().to_owned(), concrete(r.path)))
            .collect();
        assert_eq!(
            served, table,
            "{listener:?} serves routes the table does not list, or misses some"
        );
    }

    // The check comes before the body: a request announcing a 1 MB body
    // and sending 1 KB of it is answered 401 without the rest ever coming.
    for (method, path) in [("POST", "/v1/completions"), ("PUT", "/v1/plugins/x")] {
        let mut tcp = TcpStream::connect(gateway.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: 1000000\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).unwrap();
        tcp.write_all(&[b' '; 1024]).unwrap();
        let mut status = [0u8; 12];
        tcp.read_exact(&mut status)
            .expect("an answer before the body is complete");
        assert_eq!(&status, b"HTTP/1.1 401", "{path}");
    }
}

/// A tenant sees its own usage and its own audit entries, with proofs that
/// verify against the signed checkpoint, and nobody else's.
#[test]
fn tenants_read_their_own_usage_and_audit_entries_with_proofs() {
    let world = world("routes-self");
    let gateway = &world.gateway;
    let demo = world
        .policies
        .token("demo", &["--scope", "inference", "plugins:write"]);
    let acme = world
        .policies
        .token("acme", &["--scope", "inference", "plugins:write"]);
    let mut prompt = 0;
    let mut completion = 0;
    for _ in 0..3 {
        let r = gateway.request("POST", "/v1/completions", Some(&demo), Some(COMPLETION));
        assert_eq!(r.status, 200, "{}", r.body);
        prompt += r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
        completion += r.json()["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let r = gateway.request("POST", "/v1/chat/completions", Some(&acme), Some(CHAT));
    assert_eq!(r.status, 200, "{}", r.body);

    let usage = gateway
        .request("GET", "/v1/usage", Some(&demo), None)
        .json();
    assert_eq!(usage["tenant"], "demo");
    let rows = usage["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{usage}");
    assert_eq!(rows[0]["model"], MODEL);
    assert_eq!(rows[0]["requests"], 3);
    assert_eq!(rows[0]["prompt_tokens"], prompt);
    assert_eq!(rows[0]["completion_tokens"], completion);
    let today = rows[0]["date"].as_str().unwrap();
    assert_eq!(today.len(), 10, "{today}");
    let r = gateway.request("GET", "/v1/usage?days=0", Some(&demo), None);
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (400, "invalid_usage_range")
    );
    // The operator sees both tenants.
    let ops = world.policies.operator_token(&["usage:read"], &[]);
    let all = gateway
        .admin
        .request("GET", "/admin/v1/usage", Some(&ops), None)
        .json();
    let tenants: BTreeSet<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, BTreeSet::from(["acme", "demo"]));

    // Audit entries: each tenant uploads, then sees only its own.
    upload_guard(&world, "demo");
    upload_guard(&world, "acme");
    let delete = gateway.request("DELETE", "/v1/plugins/guard", Some(&demo), None);
    assert_eq!(delete.status, 200, "{}", delete.body);
    let verifier = read_verifier(
        &world.audit_dir.join("audit.pub.pem"),
        "bulkhead.local/audit",
    )
    .unwrap();
    for (tenant, token, actions) in [
        ("demo", &demo, vec!["plugin.upload", "plugin.delete"]),
        ("acme", &acme, vec!["plugin.upload"]),
    ] {
        let r = gateway.request("GET", "/v1/audit/entries", Some(token), None);
        assert_eq!(r.status, 200, "{}", r.body);
        let page = r.json();
        let checkpoint = open_checkpoint(page["checkpoint"].as_str().unwrap(), &verifier)
            .expect("a checkpoint signed by the audit key");
        assert_eq!(checkpoint.size, page["tree_size"].as_u64().unwrap());
        let data = page["data"].as_array().unwrap();
        let seen: Vec<&str> = data
            .iter()
            .map(|e| e["entry"]["action"].as_str().unwrap())
            .collect();
        assert_eq!(seen, actions, "{tenant}: {page}");
        for item in data {
            let entry = &item["entry"];
            assert_eq!(entry["actor"]["tenant"], tenant);
            assert_eq!(entry["tenant"], tenant);
            // The leaf is recomputed from the entry as served.
            // (Entries are canonical: the parsed entry serializes back to
            // the bytes that were hashed.)
            let parsed: bulkhead_gateway::audit::Entry =
                serde_json::from_value(entry.clone()).expect("an entry");
            let leaf = leaf_hash(&parsed.to_bytes());
            assert_eq!(BASE64.encode(leaf), item["leaf_hash"].as_str().unwrap());
            let proof: Vec<[u8; 32]> = item["inclusion_proof"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    BASE64
                        .decode(h.as_str().unwrap())
                        .unwrap()
                        .try_into()
                        .unwrap()
                })
                .collect();
            verify_inclusion(
                &leaf,
                item["index"].as_u64().unwrap(),
                checkpoint.size,
                &proof,
                &checkpoint.root,
            )
            .expect("the inclusion proof verifies against the signed checkpoint");
        }
    }
    // Paging: one at a time, following next_from.
    let first = gateway
        .request("GET", "/v1/audit/entries?limit=1", Some(&demo), None)
        .json();
    assert_eq!(first["data"].as_array().unwrap().len(), 1);
    let next = first["next_from"].as_u64().expect("a second page");
    let second = gateway
        .request(
            "GET",
            &format!("/v1/audit/entries?limit=1&from={next}"),
            Some(&demo),
            None,
        )
        .json();
    assert_eq!(second["data"][0]["entry"]["action"], "plugin.delete");
    assert!(second["next_from"].is_null());
}

trait PublicClient {
    fn client(&self) -> Client;
}

impl PublicClient for Gateway {
    fn client(&self) -> Client {
        Client::new(self.addr)
    }
}
