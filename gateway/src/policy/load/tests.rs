use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::super::test_folder::TestFolder;
use super::*;
use crate::policy::{Limits, UpstreamSettings};

const GATEWAY: &str = r#"listen = "127.0.0.1:9000"
max_body_bytes = 2_000_000

[local_gpu_host]
workers = 2

[[local_gpu_host.models]]
name = "tiny"
dir = "models/tiny"
signature = "models/tiny.sig"

[[local_gpu_host.models]]
name = "small"
dir = "models/small"
signature = "models/small.sig"
"#;

const STANDARD: &str = r#"[limits]
requests_per_s = 10
burst = 20
max_tokens = 1024
"#;

const ACME: &str = r#"id = "acme"
class = "standard"
models = ["tiny"]

[jwt]
issuer = "https://acme.example"
audience = ["bulkhead"]
algorithms = ["EdDSA"]
public_keys = ["keys/acme.pem"]

[limits]
burst = 50
per_sub = true
"#;

/// A tenant file with no class and no limits.
fn plain_tenant(id: &str) -> String {
    format!(
        r#"id = "{id}"
models = ["small"]

[jwt]
issuer = "https://{id}.example"
audience = ["bulkhead"]
algorithms = ["EdDSA"]
"#
    )
}

/// A valid folder: two signed models and their publisher, one class,
/// tenants `acme` (class standard) and `beta`.
fn valid_folder() -> TestFolder {
    let folder = TestFolder::new();
    folder
        .trust_publisher()
        .signed_model("tiny", b"GGUF tiny")
        .signed_model("small", b"GGUF small")
        .write("gateway.toml", GATEWAY)
        .write("classes/standard.toml", STANDARD)
        .write("tenants/acme.toml", ACME)
        .write("tenants/beta.toml", plain_tenant("beta"));
    folder
}

/// The errors of loading `folder`, as printed (`file:line:col: message`).
fn errors(folder: &TestFolder) -> Vec<String> {
    match load(folder.path()) {
        Ok(_) => panic!("the folder loaded, but errors were expected"),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

fn load_ok(folder: &TestFolder) -> Policy {
    load(folder.path()).unwrap_or_else(|e| panic!("the folder should load:\n{e}"))
}

#[test]
fn a_valid_folder_loads_with_resolved_values() {
    let folder = valid_folder();
    let policy = load_ok(&folder);

    assert!(policy.dir.is_absolute());
    let gw = &policy.gateway;
    assert_eq!(gw.listen, "127.0.0.1:9000".parse::<SocketAddr>().unwrap());
    assert_eq!(gw.max_body_bytes, 2_000_000);
    assert_eq!(gw.request_timeout, Duration::from_secs(300));
    assert_eq!(gw.jwt_leeway, Duration::from_secs(30));
    let UpstreamSettings::Local(local) = &gw.upstream else {
        panic!("expected a local gpu-host, got {:?}", gw.upstream);
    };
    assert_eq!(local.workers, 2);
    assert_eq!(local.queue_capacity, 64);
    assert_eq!(local.restart_backoff_max, Duration::from_secs(5));
    assert_eq!((local.binary.as_ref(), local.threads), (None, None));
    let models_dir = fs::canonicalize(folder.path().join("models")).unwrap();
    let models: Vec<_> = policy
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.path(), m.publisher.as_str()))
        .collect();
    assert_eq!(
        models,
        [
            ("tiny", models_dir.join("tiny/tiny.gguf"), "test-publisher"),
            (
                "small",
                models_dir.join("small/small.gguf"),
                "test-publisher"
            ),
        ]
    );
    assert_eq!(policy.models[0].file.size, Some(9));
    assert!(policy.models[0].digest.starts_with("sha256:"));
    assert_eq!(policy.trust.publishers.len(), 1);
    assert_eq!(policy.gateway.models_registry, None);

    assert_eq!(policy.tenants.keys().collect::<Vec<_>>(), ["acme", "beta"]);
    let acme = &policy.tenants["acme"];
    assert_eq!(acme.id, "acme");
    assert_eq!(acme.models.iter().collect::<Vec<_>>(), ["tiny"]);
    assert_eq!(acme.jwt.issuer.get_ref(), "https://acme.example");
    assert_eq!(acme.source.name, Path::new("tenants/acme.toml"));
    assert_eq!(acme.source.text, ACME);
    assert_eq!(policy.tenants["beta"].limits, Limits::DEFAULT);

    let names: Vec<_> = policy.files.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(
        names,
        [
            "gateway.toml",
            "trust.toml",
            "classes/standard.toml",
            "tenants/acme.toml",
            "tenants/beta.toml"
        ]
        .map(PathBuf::from)
    );
    let acme_digest: [u8; 32] = Sha256::digest(ACME.as_bytes()).into();
    assert_eq!(policy.files[3].1, acme_digest);
}

#[test]
fn limits_resolve_tenant_over_class_over_defaults_field_by_field() {
    let policy = load_ok(&valid_folder());
    assert_eq!(
        policy.tenants["acme"].limits,
        Limits {
            requests_per_s: 10, // class
            burst: 50,          // tenant over class
            max_tokens: 1024,   // class
            per_sub: true,      // tenant
            ..Limits::DEFAULT
        }
    );
}

#[test]
fn defaults_apply_without_gateway_toml() {
    let folder = TestFolder::new();
    folder.write(
        "tenants/solo.toml",
        plain_tenant("solo").replace(r#"models = ["small"]"#, "models = []"),
    );
    let policy = load_ok(&folder);
    let gw = &policy.gateway;
    assert_eq!(gw.listen, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
    assert_eq!(gw.max_body_bytes, 1 << 20);
    assert_eq!(gw.request_timeout, Duration::from_secs(300));
    assert_eq!(gw.jwt_leeway, Duration::from_secs(30));
    let UpstreamSettings::Local(local) = &gw.upstream else {
        panic!("expected a local gpu-host");
    };
    assert_eq!(
        (
            local.workers,
            local.queue_capacity,
            local.restart_backoff_max
        ),
        (16, 64, Duration::from_secs(5))
    );
    assert!(policy.models.is_empty());
    assert_eq!(policy.files.len(), 1);
}

#[test]
fn the_default_body_limit_never_exceeds_the_gateways() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        GATEWAY.replace("max_body_bytes = 2_000_000", "max_body_bytes = 4096"),
    );
    let policy = load_ok(&folder);
    assert_eq!(policy.tenants["beta"].limits.max_body_bytes, 4096);
}

#[test]
fn other_files_are_ignored() {
    let folder = valid_folder();
    let junk = "this is not TOML [";
    for name in [
        "README.md",
        "tenants/acme.toml.example",
        "tenants/.#acme.toml",
        "tenants/acme.toml~",
        "tenants/.acme.toml.swp",
        "tenants/.hidden.toml",
        "classes/notes.txt",
        "tenants/sub/nested.toml",
    ] {
        folder.write(name, junk);
    }
    assert_eq!(load_ok(&folder).files.len(), 5);
}

#[test]
fn symlinks_are_followed_to_regular_files() {
    let folder = valid_folder();
    // The way a Kubernetes ConfigMap volume looks.
    folder.write("..data/tenants/gamma.toml", plain_tenant("gamma"));
    std::os::unix::fs::symlink(
        folder.path().join("..data/tenants/gamma.toml"),
        folder.path().join("tenants/gamma.toml"),
    )
    .unwrap();
    assert!(load_ok(&folder).tenants.contains_key("gamma"));

    std::os::unix::fs::symlink("nowhere.toml", folder.path().join("tenants/delta.toml")).unwrap();
    assert_eq!(
        errors(&folder),
        ["tenants/delta.toml:1:1: cannot read: no such file or folder"]
    );
}

#[test]
fn a_folder_named_like_a_policy_file_is_an_error() {
    let folder = valid_folder();
    fs::create_dir(folder.path().join("tenants/odd.toml")).unwrap();
    assert_eq!(
        errors(&folder),
        ["tenants/odd.toml:1:1: is not a regular file (a folder)"]
    );
}

#[test]
fn a_missing_folder_is_one_error() {
    let folder = TestFolder::new();
    let missing = folder.path().join("absent");
    let errors = load(&missing).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!(
            ".:1:1: cannot read the policy folder {}: no such file or folder",
            missing.display()
        )
    );
    assert_eq!(
        errors.in_dir(&missing).0[0].file,
        missing,
        "the folder itself is shown as the folder, not folder/."
    );
}

#[test]
fn files_over_one_mib_are_refused_unread() {
    let folder = valid_folder();
    let big = format!("# {}\n", "x".repeat(1 << 20));
    folder.write("classes/huge.toml", &big);
    assert_eq!(
        errors(&folder),
        [format!(
            "classes/huge.toml:1:1: is {} bytes; policy files are limited to 1048576 bytes (1 MiB)",
            big.len()
        )]
    );
}

#[test]
fn too_many_files_in_a_folder_is_one_error() {
    let folder = TestFolder::new();
    for name in ["a", "b", "c"] {
        folder.write(&format!("tenants/{name}.toml"), "");
    }
    let mut errors = Vec::new();
    assert_eq!(list_toml(folder.path(), "tenants", 3, &mut errors).len(), 3);
    assert!(errors.is_empty());
    assert!(list_toml(folder.path(), "tenants", 2, &mut errors).is_empty());
    assert_eq!(
        errors[0].to_string(),
        "tenants:1:1: more than 2 *.toml files; none of them were read"
    );
}

#[test]
fn non_utf8_text_is_reported_where_it_starts() {
    let folder = valid_folder();
    folder.write("classes/latin1.toml", b"[limits]\n# caf\xe9\n");
    assert_eq!(
        errors(&folder),
        ["classes/latin1.toml:2:6: not UTF-8 text (TOML files are UTF-8)"]
    );
}

#[test]
fn an_unknown_key_points_at_the_key() {
    let folder = valid_folder();
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta") + "\n[limits]\nrps = 5\n",
    );
    let errors = errors(&folder);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("tenants/beta.toml:10:1: unknown field `rps`, expected one of"),
        "{}",
        errors[0]
    );
    assert!(!errors[0].contains('\n'), "one line: {}", errors[0]);
}

#[test]
fn toml_syntax_errors_are_one_line_each_and_all_reported() {
    let folder = valid_folder();
    folder.write(
        "classes/standard.toml",
        "[limits\nrequests_per_s = 10\nburst = = 3\n",
    );
    let errors = errors(&folder);
    assert!(errors.len() >= 2, "{errors:?}");
    assert!(errors.iter().all(|e| !e.contains('\n')), "{errors:?}");
    assert!(
        errors[0].starts_with("classes/standard.toml:1:"),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("classes/standard.toml:3:")),
        "{errors:?}"
    );
}

#[test]
fn wrong_types_and_missing_fields_are_reported() {
    let folder = valid_folder();
    folder.write("classes/standard.toml", "[limits]\nburst = \"lots\"\n");
    folder.write("tenants/beta.toml", "id = \"beta\"\n");
    assert_eq!(
        errors(&folder),
        [
            "classes/standard.toml:2:9: invalid type: string \"lots\", expected u32",
            "tenants/beta.toml:1:1: missing field `jwt`",
        ]
    );
}

#[test]
fn tenant_ids_must_be_valid_and_match_the_file_name() {
    let folder = valid_folder();
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta").replace("id = \"beta\"", "id = \"Beta!\""),
    );
    folder.write(
        "tenants/gamma.toml",
        plain_tenant("gamma").replace("id = \"gamma\"", "id = \"delta\""),
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/beta.toml:1:6: tenant id `Beta!` is not valid: \
             use 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit",
            "tenants/gamma.toml:1:6: tenant id `delta` does not match the file name `gamma.toml`",
        ]
    );
}

#[test]
fn duplicate_tenant_ids_and_issuers_are_errors() {
    let folder = valid_folder();
    // `alpha.toml` claims beta's id (and its issuer).
    folder.write("tenants/alpha.toml", plain_tenant("beta"));
    folder.write(
        "tenants/gamma.toml",
        plain_tenant("gamma").replace("https://gamma.example", "https://acme.example"),
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/alpha.toml:1:6: tenant id `beta` does not match the file name `alpha.toml`",
            "tenants/beta.toml:1:6: tenant id `beta` is also used by tenants/alpha.toml",
            "tenants/gamma.toml:5:10: issuer `https://acme.example` is also used by tenant \
             `acme` (tenants/acme.toml:6:10): the issuer tells tenants and the operator apart, \
             so it must be unique",
        ]
    );
}

#[test]
fn the_operators_issuers_are_its_own() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[[operator.issuers]]\nissuer = \"https://acme.example\"\n\
             audience = [\"admin\"]\nalgorithms = [\"EdDSA\"]\n\n\
             [[operator.issuers]]\nissuer = \"https://acme.example\"\naudience = [\"admin\"]\n\
             algorithms = [\"EdDSA\"]\n"
        ),
    );
    let at = GATEWAY.lines().count() + 3;
    assert_eq!(
        errors(&folder),
        [
            format!(
                "gateway.toml:{}:10: operator issuer `https://acme.example` is also used by the \
                 operator (gateway.toml:{at}:10)",
                at + 5
            ),
            format!(
                "tenants/acme.toml:6:10: issuer `https://acme.example` is also used by the \
                 operator (gateway.toml:{at}:10): the issuer tells tenants and the operator \
                 apart, so it must be unique"
            ),
        ]
    );
}

#[test]
fn the_admin_listener_is_checked() {
    let folder = valid_folder();
    let with = |admin: &str| format!("{GATEWAY}\n[admin]\nlisten = \"{admin}\"\n");
    let at = GATEWAY.lines().count() + 3;
    folder.write("gateway.toml", with("localhost:1"));
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{at}:10: `localhost:1` is not a listen address: expected IP:PORT \
             (e.g. 127.0.0.1:8081) or unix:PATH"
        )]
    );
    folder.write("gateway.toml", with("127.0.0.1:9000"));
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{at}:10: the admin listener `127.0.0.1:9000` is the tenants' `listen` \
             address: the operator API needs a listener of its own"
        )]
    );
    folder.write("gateway.toml", with("unix:admin.sock"));
    let policy = load_ok(&folder);
    assert_eq!(
        policy.gateway.admin_listen,
        crate::policy::ListenAddr::Unix(policy.dir.join("admin.sock"))
    );
    folder.write("gateway.toml", GATEWAY);
    assert_eq!(
        load_ok(&folder).gateway.admin_listen.to_string(),
        crate::policy::DEFAULT_ADMIN_LISTEN
    );
}

#[test]
fn a_class_must_exist() {
    let folder = valid_folder();
    folder.write("classes/premium.toml", "");
    folder.write(
        "tenants/acme.toml",
        ACME.replace("\"standard\"", "\"gold\""),
    );
    assert_eq!(
        errors(&folder),
        ["tenants/acme.toml:2:9: class `gold` does not exist; classes: `premium`, `standard`"]
    );

    let no_classes = valid_folder();
    no_classes.remove("classes/standard.toml");
    assert_eq!(
        errors(&no_classes),
        ["tenants/acme.toml:2:9: class `standard` does not exist; \
             there are no classes/*.toml files"]
    );
}

#[test]
fn a_class_that_fails_to_parse_still_exists() {
    let folder = valid_folder();
    folder.write("classes/standard.toml", "[limits]\nbogus = 1\n");
    let errors = errors(&folder);
    assert_eq!(errors.len(), 1, "only the class's own error: {errors:?}");
    assert!(errors[0].starts_with("classes/standard.toml:2:1: unknown field `bogus`"));
}

#[test]
fn class_names_follow_the_id_rule() {
    let folder = valid_folder();
    folder.write("classes/Gold Plan.toml", "");
    assert_eq!(
        errors(&folder),
        [
            "classes/Gold Plan.toml:1:1: class name `Gold Plan` (the file name) is not valid: \
             use 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit"
        ]
    );
}

#[test]
fn tenant_models_must_be_served_by_the_local_gpu_host() {
    let folder = valid_folder();
    folder.write(
        "tenants/acme.toml",
        ACME.replace(r#"["tiny"]"#, r#"["tiny", "huge", "tiny"]"#),
    );
    assert_eq!(
        errors(&folder),
        [
            "tenants/acme.toml:3:19: model `huge` is not served by this gateway: gateway.toml \
             configures `small`, `tiny` (and has no `[models] registry` for models registered \
             through the API)",
            "tenants/acme.toml:3:27: model `tiny` is listed twice",
        ]
    );
}

#[test]
fn with_a_model_registry_any_valid_model_name_is_accepted() {
    let folder = valid_folder();
    folder.write("secret", "0123456789abcdef0123\n");
    folder.write(
        "gateway.toml",
        "[upstream]\ntarget = \"tcp:10.0.0.5:50051\"\nsecret_file = \"secret\"\n\
         allow_plaintext = true\n\n[models]\nregistry = \"../var/models\"\n",
    );
    folder.write(
        "tenants/acme.toml",
        ACME.replace(r#"["tiny"]"#, r#"["anything-at-all"]"#),
    );
    let policy = load_ok(&folder);
    let UpstreamSettings::Remote(hosts) = &policy.gateway.upstream else {
        panic!("expected a remote upstream");
    };
    let [host] = &hosts[..] else {
        panic!("expected one host, got {hosts:?}");
    };
    assert_eq!(host.name, "upstream");
    assert_eq!(host.target.to_string(), "tcp:10.0.0.5:50051");
    assert_eq!(host.secret.as_deref(), Some("0123456789abcdef0123"));
    assert_eq!(
        policy.files.len(),
        5,
        "the secret is not listed with the policy files"
    );

    folder.write("tenants/acme.toml", ACME.replace(r#"["tiny"]"#, r#"[""]"#));
    assert_eq!(
        errors(&folder),
        [
            "tenants/acme.toml:3:11: model name `` is not valid: use 1 to 128 of A-Z, a-z, 0-9, \
             `.`, `:` and `-`, starting with a letter or digit"
        ]
    );
}

#[test]
fn gateway_models_must_be_unique_and_readable() {
    let folder = valid_folder();
    let gateway = GATEWAY.replace("name = \"small\"", "name = \"tiny\"");
    folder.write("gateway.toml", gateway);
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta").replace("small", "tiny"),
    );
    assert_eq!(
        errors(&folder),
        ["gateway.toml:13:8: model `tiny` is already defined on line 8"]
    );

    let gateway = GATEWAY.replace("models/small\"", "models/missing\"");
    folder.write("gateway.toml", gateway);
    let missing = folder.path().join("models/missing");
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:14:7: model `small`: model folder {}: no such file or folder",
            missing.display()
        )]
    );
}

#[test]
fn configured_models_must_verify_with_a_trusted_publisher() {
    let folder = valid_folder();
    // Another key signs `small`: nothing in trust.toml verifies it.
    let other = crate::signing::SigningKey::generate(crate::signing::KeyKind::P256);
    let manifest = crate::signing::Manifest::of_dir(
        &folder.path().join("models/small"),
        &crate::signing::DirOptions::default(),
    )
    .unwrap();
    folder.write("models/small.sig", manifest.sign(&other));
    let errors_now = errors(&folder);
    assert_eq!(errors_now.len(), 1, "{errors_now:?}");
    assert!(
        errors_now[0].starts_with(&format!(
            "gateway.toml:15:13: model `small`: no trusted publisher's key verifies the \
             signature (it was signed by key sha256:{}); trust.toml trusts `test-publisher`",
            other.public_key().hint()
        )),
        "{errors_now:?}"
    );

    // No trust.toml at all: nothing verifies.
    let folder = valid_folder();
    folder.remove("trust.toml");
    let errors_now = errors(&folder);
    assert_eq!(errors_now.len(), 2, "{errors_now:?}");
    assert!(errors_now[0].ends_with("trust.toml lists no publishers"));

    // Weights changed after signing (a different size): the policy says so;
    // a same-size change is found by the gpu-host, which hashes every byte.
    let folder = valid_folder();
    folder.write("models/tiny/tiny.gguf", b"GGUF tiny, but longer");
    let path = fs::canonicalize(folder.path().join("models/tiny/tiny.gguf")).unwrap();
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:9:7: model `tiny`: weights file {}: is 21 bytes but was signed as \
             9 bytes",
            path.display()
        )]
    );

    // `file` must be in the manifest.
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        GATEWAY.replace(
            "signature = \"models/tiny.sig\"",
            "signature = \"models/tiny.sig\"\nfile = \"other.gguf\"",
        ),
    );
    assert_eq!(
        errors(&folder),
        [
            "gateway.toml:11:8: model `tiny`: `file` \"other.gguf\" is not in the signed manifest, \
          which lists `tiny.gguf`"
        ]
    );
}

#[test]
fn the_unsigned_path_form_is_refused_with_how_to_sign() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        "[[local_gpu_host.models]]\nname = \"tiny\"\npath = \"models/tiny/tiny.gguf\"\n",
    );
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta").replace("small", "tiny"),
    );
    let errors = errors(&folder);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "gateway.toml:3:8: model `tiny`: `path` is no longer accepted: the gateway serves \
             only signed models."
        ),
        "{errors:?}"
    );
    assert!(errors[0].contains("bulkhead model sign DIR --key KEY.pem"));
}

#[test]
fn trust_toml_keys_are_read_and_checked() {
    let folder = valid_folder();
    folder.write(
        "trust.toml",
        "[[publishers]]\nname = \"test-publisher\"\npublic_key = \"keys/publisher.pub.pem\"\n\n\
         [[publishers]]\nname = \"Bad Name\"\npublic_key = \"keys/missing.pem\"\n\n\
         [[publishers]]\nname = \"again\"\npublic_key = \"keys/publisher.pub.pem\"\n\n\
         [[publishers]]\nname = \"private\"\npublic_key = \"keys/publisher.pem\"\n",
    );
    let errors = errors(&folder);
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(errors[0].starts_with("trust.toml:6:8: publisher name `Bad Name` is not valid"));
    assert!(
        errors[1].starts_with("trust.toml:7:14: publisher `Bad Name`: public key ")
            && errors[1].contains("keys/missing.pem"),
        "{errors:?}"
    );
    assert_eq!(
        errors[2],
        "trust.toml:11:14: publisher `again` has the same key as publisher `test-publisher`"
    );
    assert!(
        errors[3].starts_with("trust.toml:15:14: publisher `private`: public key ")
            && errors[3].contains("a private key"),
        "{errors:?}"
    );
}

#[test]
fn gateway_values_are_checked() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        GATEWAY
            .replace("127.0.0.1:9000", "localhost:9000")
            .replace(
                "max_body_bytes = 2_000_000",
                "max_body_bytes = 0\njwt_leeway_s = 301",
            )
            .replace("workers = 2", "workers = 0\nqueue_capacity = 0"),
    );
    assert_eq!(
        errors(&folder),
        [
            "gateway.toml:1:10: `localhost:9000` is not a listen address: \
             expected IP:PORT, e.g. 127.0.0.1:8080",
            "gateway.toml:2:18: `max_body_bytes` must be at least 1",
            "gateway.toml:3:16: `jwt_leeway_s` is 301; at most 300 is allowed \
             (a long leeway keeps expired tokens usable)",
            "gateway.toml:6:11: `workers` must be at least 1",
            "gateway.toml:7:18: `queue_capacity` must be at least 1",
        ]
    );
}

#[test]
fn a_scrub_floor_above_the_scrub_rate_is_an_error() {
    let folder = valid_folder();
    // Above the default rate (64 MiB/s) when no rate is given.
    folder.write(
        "gateway.toml",
        GATEWAY.replace(
            "workers = 2",
            "workers = 2\nscrub_min_bytes_per_s = 67_108_865",
        ),
    );
    assert_eq!(
        errors(&folder),
        [
            "gateway.toml:6:25: `scrub_min_bytes_per_s` is 67108865, above the scrub's rate of \
          67108864 bytes/s (`scrub_bytes_per_s`); the floor kept at normal priority cannot exceed it"
        ]
    );
    folder.write(
        "gateway.toml",
        GATEWAY.replace(
            "workers = 2",
            "workers = 2\nscrub_bytes_per_s = 1000\nscrub_min_bytes_per_s = 1000",
        ),
    );
    let UpstreamSettings::Local(host) = load_ok(&folder).gateway.upstream else {
        panic!("the local gpu-host is configured");
    };
    assert_eq!(host.scrub_min_bytes_per_s, Some(1000));
}

#[test]
fn upstream_targets_and_secrets_are_checked() {
    let folder = valid_folder();
    folder.write("tenants/acme.toml", ACME.replace(r#"["tiny"]"#, "[]"));
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta").replace(r#"["small"]"#, "[]"),
    );
    let check = |gateway: &str| {
        folder.write("gateway.toml", gateway);
        errors(&folder)
    };

    assert_eq!(
        check("[upstream]\ntarget = \"http://gpu:1\"\n"),
        [
            "gateway.toml:2:10: `http://gpu:1` is not an upstream target: \
             expected unix:PATH, tcp:IP:PORT or tcp:NAME:PORT"
        ]
    );
    // A name is a target; without a port it is not.
    assert_eq!(
        check("[upstream]\ntarget = \"tcp:gpu-host.internal\"\n"),
        [
            "gateway.toml:2:10: `tcp:gpu-host.internal` is not an upstream target: \
             expected unix:PATH, tcp:IP:PORT or tcp:NAME:PORT"
        ]
    );
    assert_eq!(
        check("[upstream]\ntarget = \"tcp:gpu-host.internal:50051\"\nallow_plaintext = true\n"),
        ["gateway.toml:2:10: a `tcp:` upstream needs `secret_file`: \
             the gpu-host refuses TCP clients without its bearer secret"]
    );
    assert_eq!(
        check("[upstream]\ntarget = \"tcp:10.0.0.5:50051\"\nallow_plaintext = true\n"),
        ["gateway.toml:2:10: a `tcp:` upstream needs `secret_file`: \
             the gpu-host refuses TCP clients without its bearer secret"]
    );

    folder.write("short-secret", "hunter2-hunter2\n"); // 15 bytes after the newline goes
    let short = folder.path().join("short-secret");
    let errors = check(
        "[upstream]\ntarget = \"tcp:10.0.0.5:50051\"\nsecret_file = \"short-secret\"\nallow_plaintext = true\n",
    );
    assert_eq!(
        errors,
        [format!(
            "gateway.toml:3:15: secret file {}: holds fewer than 16 bytes",
            short.display()
        )]
    );
    assert!(!errors[0].contains("hunter2"), "the secret is never shown");

    assert_eq!(
        check("[upstream]\ntarget = \"unix:/run/gpu.sock\"\n\n[local_gpu_host]\nworkers = 1\n"),
        [
            "gateway.toml:2:10: `[upstream]` and `[local_gpu_host]` are both set: \
             use a remote gpu-host or a local one, not both"
        ]
    );
}

#[test]
fn limits_must_be_positive_and_bodies_within_the_gateways() {
    let folder = valid_folder();
    folder.write(
        "classes/standard.toml",
        STANDARD.replace("burst = 20", "burst = 0\nmax_body_bytes = 3_000_000"),
    );
    folder.write(
        "tenants/acme.toml",
        ACME.replace("burst = 50", "tokens_per_min = 0\nmax_concurrent = 0"),
    );
    assert_eq!(
        errors(&folder),
        [
            "classes/standard.toml:3:9: `burst` must be at least 1",
            "classes/standard.toml:4:18: `max_body_bytes` is 3000000, \
             above the gateway's max_body_bytes (2000000)",
            "tenants/acme.toml:12:18: `tokens_per_min` must be at least 1",
            "tenants/acme.toml:13:18: `max_concurrent` must be at least 1",
        ]
    );
}

#[test]
fn errors_in_several_files_are_all_reported_sorted_by_file_then_position() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        GATEWAY.replace("workers = 2", "workers = 0"),
    );
    folder.write("tenants/beta.toml", plain_tenant("beta") + "rps = 5\n");
    folder.write(
        "tenants/acme.toml",
        ACME.replace("\"standard\"", "\"gold\"")
            .replace("burst = 50", "burst = 0"),
    );
    folder.write("classes/zero.toml", "[limits]\nmax_tokens = 0\n");
    let errors = errors(&folder);
    let locations: Vec<&str> = errors
        .iter()
        .map(|e| e.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        locations,
        [
            "classes/zero.toml:2:14",
            "gateway.toml:5:11",
            "tenants/acme.toml:2:9",
            "tenants/acme.toml:12:9",
            "tenants/beta.toml:8:1",
        ],
        "{errors:#?}"
    );
}

#[test]
fn the_repositorys_default_policies_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let policy = load(&dir).unwrap_or_else(|e| panic!("{}", e.in_dir(&dir)));
    let demo = &policy.tenants["demo"];
    assert!(demo.models.contains("bulkhead-demo-tiny"));
    assert!(matches!(
        policy.gateway.upstream,
        UpstreamSettings::Local(_)
    ));
    let demo_model = &policy.models[0];
    assert_eq!(demo_model.name, "bulkhead-demo-tiny");
    assert_eq!(demo_model.publisher, "bulkhead-dev");
    assert!(demo_model.path().is_file());
    assert!(
        policy
            .gateway
            .models_registry
            .as_deref()
            .is_some_and(|r| r.ends_with("var/models"))
    );
    // The store sits beside the policy folder, in `var/` (git-ignored).
    let store = policy
        .gateway
        .plugins
        .store
        .as_deref()
        .expect("a plugin store");
    assert!(store.ends_with("var/plugins"), "{}", store.display());
    assert!(!store.starts_with(&policy.dir));
    // The development operator: its own issuer, on loopback.
    assert_eq!(policy.operator.issuers.len(), 1);
    assert_eq!(
        policy.gateway.admin_listen.to_string(),
        crate::policy::DEFAULT_ADMIN_LISTEN
    );
    crate::policy::check(&dir).unwrap_or_else(|e| panic!("{}", e.in_dir(&dir)));
}

#[test]
fn the_example_tenant_is_a_valid_tenant_file() {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let read = |name: &str| fs::read_to_string(policies.join(name)).unwrap();
    let model = fs::canonicalize(policies.join("../models/bulkhead-demo-tiny")).unwrap();
    let folder = TestFolder::new();
    folder
        .write(
            "gateway.toml",
            format!(
                "[[local_gpu_host.models]]\nname = \"bulkhead-demo-tiny\"\ndir = {:?}\n\
                 signature = {:?}\n",
                model.display().to_string(),
                model.with_extension("sig").display().to_string()
            ),
        )
        .write("trust.toml", read("trust.toml"))
        .write(
            "dev-keys/bulkhead-dev.pub.pem",
            read("dev-keys/bulkhead-dev.pub.pem"),
        )
        .write("classes/standard.toml", read("classes/standard.toml"))
        .write("tenants/acme.toml", read("tenants/acme.toml.example"))
        // Plugin signing keys are read with the policy (JWT keys by `auth`).
        .write("keys/acme-plugins.pub.pem", read("dev-keys/demo.pub.pem"));
    let policy = load_ok(&folder);
    let acme = &policy.tenants["acme"];
    assert_eq!(acme.limits.max_tokens, 2048);
    assert!(acme.limits.per_sub);
    assert!(acme.jwt.jwks.is_some());
    assert_eq!(acme.plugins.signing_keys.len(), 1);
    assert_eq!(acme.plugins.on_request.len(), 3);
    assert_eq!(acme.plugins.settings.len(), 4);
    assert_eq!(acme.gpu.hbm_bytes, Some(2 << 30));
    assert_eq!(acme.gpu.weight, 2);
    assert!(policy.partitions.is_some());
}

#[test]
fn the_plugin_store_resolves_against_the_folder_and_must_lie_outside_it() {
    let folder = valid_folder();
    assert_eq!(load_ok(&folder).gateway.plugins.store, None);

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nstore = \"../var/./plugins\"\n"),
    );
    let policy = load_ok(&folder);
    let parent = policy.dir.parent().unwrap();
    assert_eq!(
        policy.gateway.plugins.store.as_deref(),
        Some(parent.join("var/plugins").as_path())
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nstore = \"/srv/bulkhead/plugins\"\n"),
    );
    assert_eq!(
        load_ok(&folder).gateway.plugins.store.as_deref(),
        Some(Path::new("/srv/bulkhead/plugins"))
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nstore = \"var/plugins\"\n"),
    );
    let inside = policy.dir.join("var/plugins");
    // `[plugins]` follows GATEWAY and a blank line.
    let store_line = GATEWAY.lines().count() + 3;
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{store_line}:9: the plugin store {} is inside the policy folder, which is \
             watched for changes: put it outside, e.g. \"../var/plugins\"",
            inside.display()
        )]
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nstore = \"\"\n"),
    );
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{store_line}:9: `store` is empty: name a folder for the plugin \
             store, e.g. \"../var/plugins\""
        )]
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nstore = \"../s\"\nsize = 1\n"),
    );
    let errors = errors(&folder);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("unknown field `size`"), "{errors:#?}");
}

#[test]
fn the_gateway_wide_plugin_call_cap_defaults_to_the_cores_minus_one_and_is_bounded() {
    let folder = valid_folder();
    assert_eq!(
        load_ok(&folder).gateway.plugins.max_concurrent_calls,
        crate::plugins::default_gate_slots()
    );
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[plugins]\nmax_concurrent_calls = 3\n"),
    );
    assert_eq!(load_ok(&folder).gateway.plugins.max_concurrent_calls, 3);

    let line = GATEWAY.lines().count() + 3;
    for bad in ["0", "1025"] {
        folder.write(
            "gateway.toml",
            format!("{GATEWAY}\n[plugins]\nmax_concurrent_calls = {bad}\n"),
        );
        assert_eq!(
            errors(&folder),
            [format!(
                "gateway.toml:{line}:24: `max_concurrent_calls` is {bad}; it must be from 1 to \
                 1024 (the default, {}, leaves one of this machine's cores to the request path)",
                crate::plugins::default_gate_slots()
            )]
        );
    }
}

#[test]
fn the_audit_log_resolves_against_the_folder_and_is_checked() {
    let folder = valid_folder();
    assert_eq!(load_ok(&folder).gateway.audit, None);

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[audit]\ndir = \"../var/audit\"\nkey = \"/etc/bh/audit.pem\"\n"),
    );
    let policy = load_ok(&folder);
    let audit = policy.gateway.audit.expect("[audit] is set");
    assert_eq!(audit.dir, policy.dir.parent().unwrap().join("var/audit"));
    assert_eq!(audit.key.as_deref(), Some(Path::new("/etc/bh/audit.pem")));
    assert_eq!(audit.origin, crate::audit::DEFAULT_ORIGIN);

    let line = GATEWAY.lines().count() + 3;
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[audit]\ndir = \"audit\"\n"),
    );
    let inside = policy.dir.join("audit");
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{line}:7: the audit log {} is inside the policy folder, which is \
             watched for changes: put it outside, e.g. \"../var/audit\"",
            inside.display()
        )]
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[audit]\ndir = \"../a\"\norigin = \"two words\"\n"),
    );
    let errors_now = errors(&folder);
    assert_eq!(errors_now.len(), 1, "{errors_now:#?}");
    assert!(
        errors_now[0].contains("is not a checkpoint origin"),
        "{errors_now:#?}"
    );

    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[audit]\norigin = \"x\"\n"),
    );
    let errors_now = errors(&folder);
    assert!(
        errors_now[0].contains("`[audit]` needs `dir`"),
        "{errors_now:#?}"
    );
}

#[test]
fn connection_limits_are_read_and_their_bounds_checked() {
    let folder = valid_folder();
    assert_eq!(
        load_ok(&folder).gateway.connections,
        crate::policy::ConnectionLimits::DEFAULT
    );
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[connections]\nheader_read_timeout_ms = 500\nbody_read_timeout_ms = 2000\n"
        ),
    );
    let limits = load_ok(&folder).gateway.connections;
    assert_eq!(
        (limits.header_read_timeout, limits.body_read_timeout),
        (Duration::from_millis(500), Duration::from_secs(2))
    );
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[connections]\nheader_read_timeout_ms = 60001\nbody_read_timeout_ms = 0\n\
             max_connections = 10\nmax_connections_per_ip = 11\n"
        ),
    );
    let lines = GATEWAY.lines().count();
    assert_eq!(
        errors(&folder),
        [
            format!(
                "gateway.toml:{}:26: `header_read_timeout_ms` is 60001; at most 60000 (a long \
                 one lets slow clients hold connections)",
                lines + 3
            ),
            format!(
                "gateway.toml:{}:24: `body_read_timeout_ms` must be at least 1",
                lines + 4
            ),
            format!(
                "gateway.toml:{}:26: `max_connections_per_ip` is 11, more than \
                 `max_connections` (10)",
                lines + 6
            ),
        ]
    );
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[connections]\nbody_read_timeout_ms = 300001\n"),
    );
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{}:24: `body_read_timeout_ms` is 300001; at most 300000 (a long one \
             lets slow clients hold connections)",
            lines + 3
        )]
    );
}

#[test]
fn a_tcp_upstream_needs_tls_or_plaintext_asked_for_and_its_files_must_parse() {
    let folder = valid_folder();
    folder.write("secret", "0123456789abcdef0123\n");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tls");
    let tls = |name: &str| fixtures.join(name).display().to_string();
    folder.write("tenants/acme.toml", ACME.replace(r#"["tiny"]"#, "[]"));
    folder.write(
        "tenants/beta.toml",
        plain_tenant("beta").replace(r#"["small"]"#, "[]"),
    );
    let upstream = "[upstream]\ntarget = \"tcp:127.0.0.1:7070\"\nsecret_file = \"secret\"\n";
    let check = |extra: &str| {
        folder.write("gateway.toml", format!("{upstream}{extra}"));
        load(folder.path()).map_err(|e| e.0.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    assert_eq!(
        check("").unwrap_err(),
        [
            "gateway.toml:2:10: a `tcp:` upstream needs TLS (`tls_ca`, and `tls_cert` + \
          `tls_key` when the host asks for a client certificate), or `allow_plaintext = true` \
          to send the secret and prompts in the clear"
        ]
    );
    // Mutual TLS, read and parsed.
    let mutual = format!(
        "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        tls("ca.pem"),
        tls("client.pem"),
        tls("client.key")
    );
    let policy = check(&mutual).unwrap();
    let UpstreamSettings::Remote(hosts) = &policy.gateway.upstream else {
        panic!("expected a remote upstream");
    };
    let Some(client) = &hosts[0].tls else {
        panic!("expected TLS to the upstream");
    };
    assert!(client.identity.is_some() && client.server_name.is_none());
    // A certificate without its key; a key that is not one.
    assert_eq!(
        check(&format!(
            "tls_ca = \"{}\"\ntls_cert = \"{}\"\n",
            tls("ca.pem"),
            tls("client.pem")
        ))
        .unwrap_err(),
        [
            "gateway.toml:5:12: `tls_cert` and `tls_key` go together (the gateway's client \
          certificate)"
        ]
    );
    folder.write("not-a-key.pem", "hello\n");
    let errors = check(&format!(
        "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"not-a-key.pem\"\n",
        tls("ca.pem"),
        tls("client.pem")
    ))
    .unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("gateway.toml:4:10: the upstream's TLS files: "),
        "{errors:?}"
    );
    assert!(
        check(&format!(
            "allow_plaintext = true\ntls_ca = \"{}\"\n",
            tls("ca.pem")
        ))
        .unwrap_err()[0]
            .contains("choose one")
    );
    assert!(check("allow_plaintext = true\n").is_ok());
}

#[test]
fn a_redis_limit_store_is_read_with_its_password_from_a_file() {
    use crate::limits::{LimitStore, OnStoreError};
    let folder = valid_folder();
    assert_eq!(load_ok(&folder).gateway.limit_store, LimitStore::Memory);
    folder
        .write("secrets/redis", "a-long-redis-password\n")
        .write(
            "gateway.toml",
            format!(
                "{GATEWAY}\n[limits]\nstore = \"redis://redis.internal:6380/2\"\n\
                 password_file = \"secrets/redis\"\nkey_prefix = \"bh-prod\"\nreplicas = 3\n\
                 on_store_error = \"deny\"\nstore_timeout_ms = 50\nlease_ttl_ms = 9000\n"
            ),
        );
    let policy = load_ok(&folder);
    let LimitStore::Redis(store) = &policy.gateway.limit_store else {
        panic!("expected a Redis store: {:?}", policy.gateway.limit_store);
    };
    assert_eq!(store.url, "redis://redis.internal:6380/2");
    assert_eq!(store.password.as_deref(), Some("a-long-redis-password"));
    assert_eq!(store.key_prefix, "bh-prod");
    assert_eq!(store.replicas, 3);
    assert_eq!(store.on_error, OnStoreError::Deny);
    assert_eq!(store.timeout, Duration::from_millis(50));
    assert_eq!(store.lease_ttl, Duration::from_secs(9));
    assert!(!format!("{store:?}").contains("a-long-redis-password"));
    // Defaults.
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[limits]\nstore = \"redis://127.0.0.1/\"\nreplicas = 2\n"),
    );
    let LimitStore::Redis(store) = load_ok(&folder).gateway.limit_store else {
        panic!("expected a Redis store");
    };
    assert_eq!(
        (
            store.key_prefix.as_str(),
            store.on_error,
            store.timeout,
            store.lease_ttl
        ),
        (
            "bulkhead",
            OnStoreError::Local,
            Duration::from_millis(20),
            Duration::from_secs(15)
        )
    );
    assert_eq!(store.password, None);
}

#[test]
fn a_broken_limit_store_names_each_problem() {
    let folder = valid_folder();
    let lines = GATEWAY.lines().count();
    let line = |n: usize| lines + 2 + n;
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[limits]\nstore = \"redis://:hunter2hunter2@127.0.0.1/\"\n\
             tls_ca = \"ca.pem\"\nkey_prefix = \"{{evil}}\"\non_store_error = \"ignore\"\n\
             store_timeout_ms = 5000\nlease_ttl_ms = 10\n"
        ),
    );
    let found = errors(&folder);
    let expected = [
        format!(
            "gateway.toml:{}:9: `store` holds a password: put it in `password_file` instead \
             (policy files are hashed into the audit log and read by many)",
            line(1)
        ),
        format!(
            "gateway.toml:{}:10: `tls_ca` needs a `rediss://` store (TLS); this one is `redis://`",
            line(2)
        ),
        format!(
            "gateway.toml:{}:14: `key_prefix` is `{{evil}}`: 1 to 64 of A-Z a-z 0-9 _ - . :",
            line(3)
        ),
        format!(
            "gateway.toml:{}:18: `on_store_error` is `ignore`: expected \"local\" (fall back to \
             this replica's share of the limits) or \"deny\" (answer 503)",
            line(4)
        ),
    ];
    for expected in expected {
        assert!(found.contains(&expected), "{expected}\nnot in {found:#?}");
    }
    assert!(
        found
            .iter()
            .any(|e| e.contains("`store_timeout_ms` is 5000; 1 to 1000")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|e| e.contains("`lease_ttl_ms` is 10; 100 to 600000")),
        "{found:#?}"
    );
    // None shows the password.
    assert!(found.iter().all(|e| !e.contains("hunter2")), "{found:#?}");

    // Another scheme; a local fallback without `replicas`.
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[limits]\nstore = \"memcached://127.0.0.1\"\n"),
    );
    let found = errors(&folder);
    assert!(
        found[0].contains("`store` is `memcached://127.0.0.1`: expected \"memory\""),
        "{found:#?}"
    );
    assert!(
        found[1].contains("needs `replicas`: while Redis is down each replica admits 1/replicas"),
        "{found:#?}"
    );

    // The memory store with a Redis-only key: a mistake, not a default.
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[limits]\nstore = \"memory\"\nreplicas = 3\n"),
    );
    assert_eq!(
        errors(&folder),
        [format!(
            "gateway.toml:{}:12: `replicas` applies to a Redis limit store; `store` is \
             \"memory\" (set store = \"redis://HOST:PORT/DB\" to share limits)",
            line(2)
        )]
    );
}

#[test]
fn gpu_hosts_are_named_and_each_loads_its_models() {
    let folder = valid_folder();
    let root = folder.path().display().to_string();
    let model = |name: &str, dir: &str| {
        format!(
            "[[gpu_hosts.models]]\nname = \"{name}\"\ndir = \"{root}/models/{dir}\"\n\
             signature = \"models/{dir}.sig\"\n"
        )
    };
    let host = |name: &str, socket: &str| {
        let name = if name.is_empty() {
            String::new()
        } else {
            format!("name = \"{name}\"\n")
        };
        format!("[[gpu_hosts]]\n{name}target = \"unix:/run/{socket}.sock\"\n")
    };
    let gateway = format!(
        "{}{}{}{}{}",
        host("gpu-a", "a"),
        model("tiny", "tiny"),
        model("small", "small"),
        host("gpu-b", "b"),
        model("tiny", "tiny")
    );
    folder.write("gateway.toml", &gateway);
    let policy = load_ok(&folder);
    let UpstreamSettings::Remote(hosts) = &policy.gateway.upstream else {
        panic!("expected remote hosts");
    };
    let names: Vec<(&str, Vec<&str>)> = hosts
        .iter()
        .map(|h| {
            (
                h.name.as_str(),
                h.models.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [("gpu-a", vec!["small", "tiny"]), ("gpu-b", vec!["tiny"])]
    );
    let mut models: Vec<&str> = policy.models.iter().map(|m| m.name.as_str()).collect();
    models.sort_unstable();
    assert_eq!(models, ["small", "tiny"], "each model once");

    // One name, other weights on another host.
    let clash = format!(
        "{}{}{}{}",
        host("gpu-a", "a"),
        model("tiny", "tiny"),
        host("gpu-b", "b"),
        model("tiny", "small")
    );
    folder.write("gateway.toml", &clash);
    let found = errors(&folder);
    assert!(
        found[0]
            .starts_with("gateway.toml:12:8: model `tiny` on gpu-host `gpu-b` is other weights")
            && found[0].contains("than on `gpu-a`"),
        "{found:?}"
    );

    // A host without a name, two with one name, and `[upstream]` as well.
    for (gateway, expected) in [
        (
            format!("{}{}", host("gpu-a", "a"), host("", "b")),
            "every `[[gpu_hosts]]` needs a `name`",
        ),
        (
            format!("{}{}", host("gpu-a", "a"), host("gpu-a", "b")),
            "gpu-host `gpu-a` is named twice",
        ),
        (
            format!(
                "[upstream]\ntarget = \"unix:/run/u.sock\"\n\n{}",
                host("gpu-a", "a")
            ),
            "`[upstream]` and `[[gpu_hosts]]` are both set",
        ),
        (
            "[upstream]\nname = \"x\"\ntarget = \"unix:/run/u.sock\"\n".to_string(),
            "`[upstream]` takes no `name`",
        ),
        (
            host("not a name", "a"),
            "gpu-host name `not a name` is not valid",
        ),
    ] {
        folder.write("gateway.toml", &gateway);
        folder.write("tenants/acme.toml", ACME.replace(r#"["tiny"]"#, "[]"));
        folder.write(
            "tenants/beta.toml",
            plain_tenant("beta").replace(r#"["small"]"#, "[]"),
        );
        let found = errors(&folder);
        assert!(
            found.iter().any(|e| e.contains(expected)),
            "{gateway}\nexpected `{expected}` in {found:?}"
        );
    }
}

#[test]
fn a_postgres_state_store_is_read_and_its_audit_log_needs_a_key() {
    let folder = valid_folder();
    assert_eq!(load_ok(&folder).gateway.state, None);
    folder.write("secrets/pg-password", "s3cret\n");
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[state]\nstore = \"postgres://bulkhead@db.internal:5432/bh\"\n\
             schema = \"bh_one\"\npassword_file = \"secrets/pg-password\"\npool_size = 4\n\
             \n[audit]\nkey = \"../keys/audit.pem\"\norigin = \"example.com/audit\"\n"
        ),
    );
    let policy = load_ok(&folder);
    let state = policy.gateway.state.expect("[state] is set");
    assert_eq!(state.url, "postgres://bulkhead@db.internal:5432/bh");
    assert_eq!(state.schema, "bh_one");
    assert_eq!(state.pool_size, 4);
    assert_eq!(
        state.password_file.as_deref(),
        Some(policy.dir.join("secrets/pg-password").as_path())
    );
    let audit = policy.gateway.audit.expect("[audit] is set");
    assert_eq!(
        audit.key.as_deref(),
        Some(
            policy
                .dir
                .parent()
                .unwrap()
                .join("keys/audit.pem")
                .as_path()
        )
    );
    assert_eq!(audit.origin, "example.com/audit");

    // "files" is the default and takes no database keys.
    folder.write(
        "gateway.toml",
        format!("{GATEWAY}\n[state]\nstore = \"files\"\nschema = \"x\"\n"),
    );
    let found = errors(&folder);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("`schema` applies to a PostgreSQL state store"),
        "{found:#?}"
    );

    // Each broken setting is named.
    for (table, wanted) in [
        (
            "store = \"mysql://db/bh\"",
            "expected \"files\" or \"postgres://USER@HOST:PORT/DATABASE\"",
        ),
        (
            "store = \"postgres://bulkhead:hunter2@db/bh\"",
            "password_file",
        ),
        (
            "store = \"postgres://bulkhead@db/bh\"\nschema = \"Robert'); DROP\"",
            "`schema`",
        ),
        (
            "store = \"postgres://bulkhead@db/bh\"\npassword_file = \"missing\"",
            "`password_file`",
        ),
        (
            "store = \"postgres://bulkhead@db/bh?sslmode=sometimes\"",
            "sslmode",
        ),
    ] {
        folder.write(
            "gateway.toml",
            format!("{GATEWAY}\n[state]\n{table}\n\n[audit]\nkey = \"k.pem\"\n"),
        );
        let found = errors(&folder);
        assert_eq!(found.len(), 1, "{table}: {found:#?}");
        assert!(found[0].contains(wanted), "{table}: {found:#?}");
        assert!(
            !found[0].contains("hunter2"),
            "the password leaked: {found:#?}"
        );
    }

    // A log in the database: one key for every replica, no folder.
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[state]\nstore = \"postgres://bulkhead@db/bh\"\n\n[audit]\ndir = \"../a\"\n"
        ),
    );
    let found = errors(&folder);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found.iter().any(|e| e.contains("remove `dir`")),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|e| e.contains("`[audit]` needs `key`")),
        "{found:#?}"
    );

    // Registrations live in the database too: no registry folder beside it.
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[models]\nregistry = \"../models\"\n\n[state]\n\
             store = \"postgres://bulkhead@db/bh\"\n"
        ),
    );
    let found = errors(&folder);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("gateway.toml:") && found[0].contains("remove `registry`"),
        "{found:#?}"
    );
}

#[test]
fn telemetry_and_log_tables_are_checked_with_where_they_are() {
    let folder = valid_folder();
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[telemetry]\nendpoint = \"http://collector:4317\"\nsampler = \"traceidratio\"\n\
             sampler_arg = 0.5\n\n[log]\nformat = \"json\"\n"
        ),
    );
    load_ok(&folder);
    let lines = GATEWAY.lines().count();
    folder.write(
        "gateway.toml",
        format!(
            "{GATEWAY}\n[telemetry]\nendpoint = \"http://collector:4317\"\nsampler = \"often\"\n"
        ),
    );
    let found = errors(&folder);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(&format!("gateway.toml:{}:", lines + 2))
            && found[0].contains("[telemetry] sampler: sampler `often` is not one of"),
        "{found:?}"
    );
    for (table, why) in [
        ("[telemetry]\nendpont = \"x\"\n", "unknown field `endpont`"),
        ("[log]\nformat = \"xml\"\n", "unknown variant `xml`"),
    ] {
        folder.write("gateway.toml", format!("{GATEWAY}\n{table}"));
        let found = errors(&folder);
        assert!(found.len() == 1 && found[0].contains(why), "{found:?}");
    }
}
