//! Tests of the auth module: a policy folder in a temp dir, keys generated
//! per run (RSA and P-384 keys come from `testdata/`, as there is no RSA or
//! P-384 key generator among our dependencies).

mod fixture;
mod issue;
mod malformed;
mod policy;
mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
use serde_json::{Value, json};

use super::Verifiers;
use crate::policy::{
    GatewaySettings, Limits, LocalGpuHost, Policy, PolicyError, SourceFile, TenantFile,
    TenantPolicy, UpstreamSettings,
};

/// The verifiers of `policy`, as the snapshot builds them.
fn build(policy: &Policy) -> Result<Verifiers, Vec<PolicyError>> {
    Verifiers::build(&policy.auth())
}

/// The test clock: 2023-11-14T22:13:20Z.
const NOW: u64 = 1_700_000_000;
const LEEWAY_S: u64 = 30;

fn at(unix_s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(unix_s)
}

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/auth/testdata")
        .join(name)
}

/// A scratch folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "bulkhead-auth-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("keys")).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, name: &str, bytes: impl AsRef<[u8]>) {
        std::fs::write(self.0.join(name), bytes).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A private key to sign test tokens with.
struct Signer {
    alg: Algorithm,
    key: EncodingKey,
}

impl Signer {
    /// A fresh Ed25519 key; its public PEM is written to `keys/{name}.pub.pem`
    /// and its private PEM to `keys/{name}.key.pem`.
    fn ed25519(dir: &TempDir, name: &str) -> Signer {
        let key = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
        // PKCS#8 v1 (no public key inside), as `openssl genpkey` writes it.
        let v1 = ed25519_dalek::pkcs8::KeypairBytes {
            secret_key: key.to_bytes(),
            public_key: None,
        };
        let private = v1.to_pkcs8_pem(LineEnding::LF).unwrap();
        let public = key
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        dir.write(&format!("keys/{name}.pub.pem"), public);
        dir.write(&format!("keys/{name}.key.pem"), private.as_bytes());
        Signer {
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_pem(private.as_bytes()).unwrap(),
        }
    }

    /// A fresh P-256 key, written like [`Signer::ed25519`].
    fn p256(dir: &TempDir, name: &str) -> Signer {
        let key = p256::SecretKey::random(&mut rand_core::OsRng);
        let private = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        let public = key.public_key().to_public_key_pem(LineEnding::LF).unwrap();
        dir.write(&format!("keys/{name}.pub.pem"), public);
        dir.write(&format!("keys/{name}.key.pem"), private.as_bytes());
        Signer {
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_pem(private.as_bytes()).unwrap(),
        }
    }

    /// The committed RSA test key, copied to `keys/{name}.*.pem`.
    fn rsa(dir: &TempDir, name: &str) -> Signer {
        let private = std::fs::read(testdata("rsa2048.key.pem")).unwrap();
        dir.write(&format!("keys/{name}.key.pem"), &private);
        dir.write(
            &format!("keys/{name}.pub.pem"),
            std::fs::read(testdata("rsa2048.pub.pem")).unwrap(),
        );
        Signer {
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_pem(&private).unwrap(),
        }
    }

    /// HS256 with a secret of 40-odd bytes, written to `keys/{name}.secret`
    /// (with a trailing newline, as `echo` would leave).
    fn hs256(dir: &TempDir, name: &str) -> Signer {
        let secret = format!("{name}-0123456789abcdef0123456789abcdef-secret");
        dir.write(&format!("keys/{name}.secret"), format!("{secret}\n"));
        Signer {
            alg: Algorithm::HS256,
            key: EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_with_kid(claims, None)
    }

    fn sign_with_kid(&self, claims: &Value, kid: Option<&str>) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

/// Claims a tenant with issuer `iss` and audience `bulkhead` accepts at [`NOW`].
fn claims(iss: &str) -> Value {
    json!({
        "iss": iss,
        "sub": "alice",
        "aud": "bulkhead",
        "exp": NOW + 600,
        "iat": NOW - 10,
        "nbf": NOW - 10,
        "scope": "openid inference plugins:write",
    })
}

/// `claims(iss)` with `changes` merged in (`null` removes a claim).
fn claims_with(iss: &str, changes: Value) -> Value {
    let mut claims = claims(iss);
    for (name, value) in changes.as_object().unwrap() {
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value.clone();
        }
    }
    claims
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token assembled by hand: header and claims JSON, raw signature part.
fn craft(header: &Value, claims: &Value, signature: &str) -> String {
    format!(
        "{}.{}.{signature}",
        b64(header.to_string()),
        b64(claims.to_string())
    )
}

/// A tenant parsed from a real TOML text, so spans point into it.
fn tenant(id: &str, toml_text: &str) -> TenantPolicy {
    let file: TenantFile = toml::from_str(toml_text).unwrap();
    TenantPolicy {
        id: id.to_owned(),
        models: Default::default(),
        jwt: file.jwt,
        limits: Limits::DEFAULT,
        plugins: Default::default(),
        gpu: Default::default(),
        parse_special: false,
        record_content: false,
        source: Arc::new(SourceFile::new(format!("tenants/{id}.toml"), toml_text)),
    }
}

/// A `[jwt]` tenant file with the given issuer and extra `[jwt]` lines.
fn tenant_toml(id: &str, issuer: &str, jwt_lines: &str) -> String {
    format!("id = \"{id}\"\n\n[jwt]\nissuer = \"{issuer}\"\naudience = [\"bulkhead\"]\n{jwt_lines}")
}

fn policy(dir: &TempDir, tenants: Vec<TenantPolicy>) -> Policy {
    policy_with_operator(dir, tenants, "")
}

/// A policy whose `gateway.toml` is `gateway_text` (its
/// `[[operator.issuers]]` are the operator's).
fn policy_with_operator(dir: &TempDir, tenants: Vec<TenantPolicy>, gateway_text: &str) -> Policy {
    let file: crate::policy::GatewayFile = toml::from_str(gateway_text).unwrap();
    Policy {
        dir: dir.path().to_path_buf(),
        operator: crate::policy::OperatorPolicy {
            issuers: file.operator.map(|o| o.issuers).unwrap_or_default(),
            source: Arc::new(SourceFile::new("gateway.toml", gateway_text)),
        },
        gateway: GatewaySettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: crate::policy::ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
            connections: crate::policy::ConnectionLimits::DEFAULT,
            limit_store: crate::limits::LimitStore::Memory,
            max_body_bytes: 1 << 20,
            request_timeout: Duration::from_secs(30),
            jwt_leeway: Duration::from_secs(LEEWAY_S),
            upstream: UpstreamSettings::Local(LocalGpuHost {
                binary: None,
                threads: None,
                workers: 1,
                queue_capacity: 1,
                restart_backoff_max: Duration::from_secs(1),
                scrub_bytes_per_s: None,
                scrub_min_bytes_per_s: None,
                device: bulkhead_partition::Device::mi325x(),
                model_reservation_bytes: 0,
            }),
            plugins: Default::default(),
            audit: None,
            state: None,
            models_registry: None,
            usage_dir: None,
        },
        tenants: tenants
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect::<BTreeMap<_, _>>(),
        files: Vec::new(),
        partitions: None,
        trust: Default::default(),
        models: Vec::new(),
    }
}

/// The errors of building verifiers for `tenants`, as `file:line:col: message`.
fn build_errors(dir: &TempDir, tenants: Vec<TenantPolicy>) -> Vec<String> {
    match build(&policy(dir, tenants)) {
        Ok(v) => panic!("expected policy errors, built {v:?}"),
        Err(errors) => errors.iter().map(PolicyError::to_string).collect(),
    }
}
