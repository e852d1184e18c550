//! Fuzzes JWT verification (`Verifiers::verify`, `bearer_token`) against a
//! fixed policy of four tenants: `hs` (HS256 secret), `ed` (Ed25519 PEM),
//! `jw` (Ed25519 in a JWKS, chosen by `kid`) and `mix` (HMAC, EdDSA, RSA and
//! P-384 keys at once).
//!
//! Two kinds of input:
//! - anything not starting with `{`: a raw `Authorization` value and token;
//! - `{header JSON}` 0xFF `{payload JSON}` [0xFF signer byte, raw signature]:
//!   both JSON parts are base64url-encoded here and the token is signed by the
//!   key the signer byte picks (a real tenant key, a wrong one, or raw bytes),
//!   so the fuzzer reaches the claim checks behind the signature.
//!
//! Never a panic; every error is a 401 that does not echo the token; and a
//! token is accepted only if it was signed with a key of the tenant its `iss`
//! names.
#![no_main]

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bulkhead_gateway::auth::{AuthError, Identity, MAX_TOKEN_BYTES, Verifiers, bearer_token};
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// The time tokens are checked at (2027-01-15); seeds expire in 2030.
const NOW_S: u64 = 1_800_000_000;
/// The default `jwt_leeway_s` (no gateway.toml).
const LEEWAY_S: u64 = 30;
/// Separates the parts of a structured input; never in UTF-8 JSON.
const SEPARATOR: u8 = 0xFF;

const HS_SECRET: &[u8] = b"fuzz-hs-tenant-secret-0123456789-abcdefghijklmnop";
const MIX_SECRET: &[u8] = b"fuzz-mix-tenant-secret-9876543210-zyxwvutsrqponmlk";
const ED_PUBLIC: &[u8] = include_bytes!("../../policies/dev-keys/demo.pub.pem");
const ED_PRIVATE: &[u8] = include_bytes!("../../policies/dev-keys/demo.key.pem");
const RSA_PUBLIC: &[u8] = include_bytes!("../../gateway/src/auth/testdata/rsa2048.pub.pem");
const RSA_PRIVATE: &[u8] = include_bytes!("../../gateway/src/auth/testdata/rsa2048.key.pem");
const P384_PUBLIC: &[u8] = include_bytes!("../../gateway/src/auth/testdata/p384.pub.pem");
const P384_PRIVATE: &[u8] = include_bytes!("../../gateway/src/auth/testdata/p384.key.pem");

/// Who signs a structured token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signer {
    HsTenantSecret,
    MixTenantSecret,
    Ed25519,
    /// HMAC keyed with the Ed25519 *public* key: the classic algorithm confusion.
    HmacWithPublicKey,
    /// The fuzzer's bytes, base64url-encoded.
    RawBase64,
    /// The fuzzer's bytes as the signature text itself.
    RawText,
    Rsa,
    P384,
}

impl Signer {
    fn from_byte(byte: u8) -> Signer {
        match byte % 8 {
            0 => Signer::HsTenantSecret,
            1 => Signer::MixTenantSecret,
            2 => Signer::Ed25519,
            3 => Signer::HmacWithPublicKey,
            4 => Signer::RawBase64,
            5 => Signer::RawText,
            6 => Signer::Rsa,
            _ => Signer::P384,
        }
    }

    /// Whether a token this signer made may be accepted for `tenant`.
    fn holds_key_of(self, tenant: &str) -> bool {
        match tenant {
            "hs" => self == Signer::HsTenantSecret,
            "ed" | "jw" => self == Signer::Ed25519,
            "mix" => matches!(
                self,
                Signer::MixTenantSecret | Signer::Ed25519 | Signer::Rsa | Signer::P384
            ),
            _ => false,
        }
    }
}

struct Keys {
    verifiers: Verifiers,
    ed: EncodingKey,
    rsa: EncodingKey,
    p384: EncodingKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys {
        verifiers: build_verifiers(),
        ed: EncodingKey::from_ed_pem(ED_PRIVATE).expect("the dev Ed25519 key"),
        rsa: EncodingKey::from_rsa_pem(RSA_PRIVATE).expect("the test RSA key"),
        p384: EncodingKey::from_ec_pem(P384_PRIVATE).expect("the test P-384 key"),
    })
}

/// Writes the policy folder to a per-process temp dir, builds the verifiers
/// (they keep their keys) and removes the folder.
fn build_verifiers() -> Verifiers {
    let dir = std::env::temp_dir().join(format!("bulkhead-fuzz-jwt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |name: &str, bytes: &[u8]| {
        let path: PathBuf = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    write("keys/hs.secret", HS_SECRET);
    write("keys/mix.secret", MIX_SECRET);
    write("keys/ed.pub.pem", ED_PUBLIC);
    write("keys/rsa.pub.pem", RSA_PUBLIC);
    write("keys/p384.pub.pem", P384_PUBLIC);
    write("keys/jw.jwks.json", jwks().as_bytes());
    let tenant = |id: &str, jwt: &str| {
        let text = format!(
            "id = \"{id}\"\n[jwt]\nissuer = \"https://{id}.example/\"\n\
             audience = [\"bulkhead\", \"{id}-api\"]\n{jwt}"
        );
        write(&format!("tenants/{id}.toml"), text.as_bytes());
    };
    tenant(
        "hs",
        "algorithms = [\"HS256\"]\nhs_secret_file = \"keys/hs.secret\"\n",
    );
    tenant(
        "ed",
        "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n",
    );
    tenant(
        "jw",
        "algorithms = [\"EdDSA\"]\njwks = \"keys/jw.jwks.json\"\n",
    );
    tenant(
        "mix",
        "algorithms = [\"HS256\", \"HS384\", \"HS512\", \"EdDSA\", \"RS256\", \"PS256\", \"ES384\"]\n\
         public_keys = [\"keys/ed.pub.pem\", \"keys/rsa.pub.pem\", \"keys/p384.pub.pem\"]\n\
         hs_secret_file = \"keys/mix.secret\"\n",
    );
    let policy = bulkhead_gateway::policy::load(&dir)
        .unwrap_or_else(|e| panic!("the fuzz policy loads:\n{e}"));
    let verifiers = Verifiers::build(&policy.auth()).unwrap_or_else(|errors| {
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        panic!("the fuzz policy builds:\n{}", errors.join("\n"))
    });
    let _ = std::fs::remove_dir_all(&dir);
    verifiers
}

/// The dev Ed25519 key as a JWKS with `kid` `ed-1` (its raw key is the last
/// 32 bytes of the SPKI DER).
fn jwks() -> String {
    let pem = std::str::from_utf8(ED_PUBLIC).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = STANDARD.decode(body).unwrap();
    let x = URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    format!(
        r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"ed-1","use":"sig","alg":"EdDSA","x":"{x}"}}]}}"#
    )
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_S)
}

fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&b'{') {
        structured(data);
    } else {
        raw(data);
    }
});

fn raw(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let verifiers = &keys().verifiers;
    if let Ok(token) = bearer_token(Some(&text)) {
        assert!(!token.is_empty());
        assert!(!token.contains(|c: char| c.is_ascii_whitespace() || c.is_control()));
        assert!(text.contains(token));
        check(verifiers.verify(token, now()), token, None);
    }
    check(verifiers.verify(&text, now()), &text, None);
}

fn structured(data: &[u8]) {
    let mut parts = data.splitn(3, |b| *b == SEPARATOR);
    let header = parts.next().unwrap_or_default();
    let payload = parts.next().unwrap_or_default();
    let (signer, raw_signature) = match parts.next() {
        Some([byte, rest @ ..]) => (Signer::from_byte(*byte), rest),
        _ => (Signer::HsTenantSecret, &[][..]),
    };
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let header_alg = serde_json::from_slice::<serde_json::Value>(header)
        .ok()
        .and_then(|h| h.get("alg")?.as_str().map(str::to_owned))
        .and_then(|alg| Algorithm::from_str(&alg).ok());
    let pick = |allowed: &[Algorithm]| {
        header_alg
            .filter(|alg| allowed.contains(alg))
            .unwrap_or(allowed[0])
    };
    const HMAC: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
    let keys = keys();
    let sign = |key: &EncodingKey, alg: Algorithm| {
        jsonwebtoken::crypto::sign(signing_input.as_bytes(), key, alg).expect("signing works")
    };
    let hmac = |secret: &[u8]| sign(&EncodingKey::from_secret(secret).unwrap(), pick(HMAC));
    let signature = match signer {
        Signer::HsTenantSecret => hmac(HS_SECRET),
        Signer::MixTenantSecret => hmac(MIX_SECRET),
        Signer::HmacWithPublicKey => hmac(ED_PUBLIC),
        Signer::Ed25519 => sign(&keys.ed, Algorithm::EdDSA),
        Signer::Rsa => sign(&keys.rsa, pick(&[Algorithm::RS256, Algorithm::PS256])),
        Signer::P384 => sign(&keys.p384, Algorithm::ES384),
        Signer::RawBase64 => URL_SAFE_NO_PAD.encode(raw_signature),
        Signer::RawText => String::from_utf8_lossy(raw_signature).into_owned(),
    };
    let token = format!("{signing_input}.{signature}");
    let result = keys.verifiers.verify(&token, now());
    check(result, &token, Some(signer));
}

/// The claim an accepted token's tenant must match.
#[derive(Deserialize)]
struct Issuer {
    iss: String,
}

/// What holds for every verification result.
fn check(result: Result<Identity, AuthError>, token: &str, signer: Option<Signer>) {
    match result {
        Ok(identity) => {
            assert!(token.len() <= MAX_TOKEN_BYTES);
            assert_eq!(token.split('.').count(), 3);
            assert!(identity.expires_at.saturating_add(LEEWAY_S) > NOW_S);
            // The payload's `iss` names the tenant that accepted it.
            let payload = token.split('.').nth(1).unwrap();
            // Read the way the gateway reads claims (a struct, other members
            // skipped), so a JSON value the gateway need not parse (1e999) is
            // no false alarm.
            let claims: Issuer =
                serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
            assert_eq!(claims.iss, format!("https://{}.example/", identity.tenant));
            // Raw inputs have no signer to check: only a seed token kept
            // intact can pass.
            if let Some(signer) = signer {
                assert!(
                    signer.holds_key_of(&identity.tenant),
                    "tenant `{}` accepted a token signed by {signer:?}",
                    identity.tenant
                );
            }
        }
        Err(error) => {
            // A bad token is always 401 (403 is only for a missing scope).
            assert_eq!(error.status(), 401, "{error}");
            assert!(!error.code().is_empty());
            let message = error.to_string();
            // Errors never echo the token. The fuzzer may send an error's
            // own fixed text as the token, which that error then "contains";
            // an echo copies whatever the token is, so the same token with
            // one more character must show in its own error too.
            if token.len() > 8 && message.contains(token) {
                let longer = format!("{token}~");
                if let Err(again) = keys().verifiers.verify(&longer, now()) {
                    let again = again.to_string();
                    assert!(!again.contains(&longer), "{again:?} echoes {longer:?}");
                }
            }
        }
    }
}
