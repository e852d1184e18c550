//! Reading verification keys: PEM public keys, JWKS files and HMAC secrets.
//!
//! Every function returns the reason as a sentence; the caller puts it at
//! the policy field that named the file. Keys are parsed and checked here,
//! at load, so a bad key is a policy error rather than a stream of 401s.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey};
use p256::pkcs8::der::asn1::UintRef;
use p256::pkcs8::der::{Decode, Document, Reader, SliceReader};
use p256::pkcs8::{ObjectIdentifier, SubjectPublicKeyInfoRef};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Largest PEM key or secret file read (a 8192-bit RSA PEM is under 2 KiB).
pub(super) const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;
/// Largest JWKS file read: big enough for any real key set, small enough
/// that a wrong path (a log file, a model) fails fast instead of filling memory.
pub(super) const MAX_JWKS_BYTES: u64 = 1024 * 1024;
/// Most keys in one JWKS: a token without `kid` is tried against each.
pub(super) const MAX_JWKS_KEYS: usize = 32;
/// Shortest HMAC secret: RFC 7518 §3.2 wants at least the hash size.
pub(super) const MIN_HS_SECRET_BYTES: usize = 32;
/// A raw Ed25519 public key (RFC 8032 §5.1.5; JWK `x`, RFC 8037 §2).
const ED25519_KEY_BYTES: usize = 32;
/// RSA moduli below this are breakable or nearly so.
const MIN_RSA_BITS: usize = 2048;
/// The largest modulus the RSA verifier accepts.
const MAX_RSA_BITS: usize = 8192;

pub(super) const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
pub(super) const OID_EC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
pub(super) const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
pub(super) const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
pub(super) const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

/// What a key is, which decides the algorithms it may verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
    Ed25519,
    Hmac,
}

impl KeyKind {
    /// The only kind of key that may verify `alg`.
    pub(super) fn for_algorithm(alg: Algorithm) -> KeyKind {
        match alg {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => KeyKind::Hmac,
            Algorithm::ES256 => KeyKind::EcP256,
            Algorithm::ES384 => KeyKind::EcP384,
            Algorithm::EdDSA => KeyKind::Ed25519,
            _ => KeyKind::Rsa,
        }
    }

    /// The short name: `RSA`, `P-256`, `P-384`, `Ed25519`, `HMAC`.
    pub(super) fn name(self) -> &'static str {
        match self {
            KeyKind::Rsa => "RSA",
            KeyKind::EcP256 => "P-256",
            KeyKind::EcP384 => "P-384",
            KeyKind::Ed25519 => "Ed25519",
            KeyKind::Hmac => "HMAC",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            KeyKind::Rsa => "an RSA key",
            KeyKind::EcP256 => "a P-256 key",
            KeyKind::EcP384 => "a P-384 key",
            KeyKind::Ed25519 => "an Ed25519 key",
            KeyKind::Hmac => "an HMAC secret",
        }
    }
}

/// One key a tenant's tokens may be verified with.
#[derive(Clone, Debug)]
pub(super) struct VerifyKey {
    /// The JWKS `kid`; `None` for PEM keys and the HMAC secret.
    pub kid: Option<String>,
    pub kind: KeyKind,
    /// The JWKS `alg`, when the key is restricted to one algorithm.
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
    /// SHA-256 of the key's bytes as read (public key or secret): tells
    /// one key from another across reloads ([`super::Verifiers::narrows`]).
    pub material: [u8; 32],
}

impl VerifyKey {
    fn new(kind: KeyKind, key: DecodingKey, material: &[u8]) -> VerifyKey {
        VerifyKey {
            kid: None,
            kind,
            alg: None,
            key,
            material: Sha256::digest(material).into(),
        }
    }

    pub(super) fn can_verify(&self, alg: Algorithm) -> bool {
        self.kind == KeyKind::for_algorithm(alg) && self.alg.is_none_or(|a| a == alg)
    }
}

/// Reads at most `limit` bytes of `path`; a larger file is an error.
pub(super) fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    // Checked before opening: opening a FIFO would block the policy load.
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file".to_owned());
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("it is larger than {limit} bytes"));
    }
    Ok(bytes)
}

const CERTIFICATE_GIVEN: &str = "certificates are not accepted; extract the public key with \
                                 `openssl x509 -pubkey -noout -in CERT`";
const PRIVATE_KEY_GIVEN: &str =
    "it is a private key; give the public key (`openssl pkey -pubout -in KEY`)";

/// A PEM public key: SPKI (`PUBLIC KEY`: RSA, P-256, P-384, Ed25519) or
/// PKCS#1 (`RSA PUBLIC KEY`).
pub(super) fn public_key_from_pem(bytes: &[u8]) -> Result<VerifyKey, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not a PEM file".to_owned())?;
    let (label, der) =
        Document::from_pem(text).map_err(|e| format!("it is not a PEM file ({e})"))?;
    match label {
        "PUBLIC KEY" => public_key_from_spki(der.as_bytes()),
        "RSA PUBLIC KEY" => rsa_key_from_pkcs1(der.as_bytes())
            .map(|k| VerifyKey::new(KeyKind::Rsa, k, der.as_bytes())),
        "CERTIFICATE" => Err(CERTIFICATE_GIVEN.to_owned()),
        l if l.contains("PRIVATE KEY") => Err(PRIVATE_KEY_GIVEN.to_owned()),
        other => Err(format!(
            "unexpected PEM label `{other}`; expected `PUBLIC KEY`"
        )),
    }
}

fn public_key_from_spki(der: &[u8]) -> Result<VerifyKey, String> {
    let spki =
        SubjectPublicKeyInfoRef::try_from(der).map_err(|e| format!("not a public key ({e})"))?;
    let bits = spki
        .subject_public_key
        .as_bytes()
        .ok_or_else(|| "the key bits are malformed".to_owned())?;
    let oid = spki.algorithm.oid;
    if oid == OID_RSA {
        return rsa_key_from_pkcs1(bits).map(|k| VerifyKey::new(KeyKind::Rsa, k, bits));
    }
    let kind = if oid == OID_ED25519 {
        KeyKind::Ed25519
    } else if oid == OID_EC {
        match spki.algorithm.parameters_oid() {
            Ok(curve) if curve == OID_P256 => KeyKind::EcP256,
            Ok(curve) if curve == OID_P384 => KeyKind::EcP384,
            _ => return Err("unsupported elliptic curve (P-256 and P-384 are)".to_owned()),
        }
    } else {
        return Err(format!(
            "unsupported key type (OID {oid}); RSA, P-256, P-384 and Ed25519 are supported"
        ));
    };
    checked_curve_key(kind, bits)
}

/// An EC or Ed25519 key from its raw public bytes, checked by building a
/// verifier (which parses the point).
fn checked_curve_key(kind: KeyKind, bits: &[u8]) -> Result<VerifyKey, String> {
    // jsonwebtoken's EdDSA verifier takes the first 32 bytes without checking
    // the length: a shorter key panics it, and bytes past 32 would be ignored.
    if kind == KeyKind::Ed25519 && bits.len() != ED25519_KEY_BYTES {
        return Err(format!(
            "an Ed25519 public key is {ED25519_KEY_BYTES} bytes, this one is {}",
            bits.len()
        ));
    }
    let (key, alg) = match kind {
        KeyKind::Ed25519 => (DecodingKey::from_ed_der(bits), Algorithm::EdDSA),
        KeyKind::EcP256 => (DecodingKey::from_ec_der(bits), Algorithm::ES256),
        KeyKind::EcP384 => (DecodingKey::from_ec_der(bits), Algorithm::ES384),
        KeyKind::Rsa | KeyKind::Hmac => return Err("not an elliptic-curve key".to_owned()),
    };
    // An empty signature never verifies; only a key that fails to parse errs.
    jsonwebtoken::crypto::verify("", b"", &key, alg)
        .map_err(|_| format!("it is not a valid {} public key", kind.name()))?;
    Ok(VerifyKey::new(kind, key, bits))
}

/// A PKCS#1 `RSAPublicKey`, checked: the RSA verifier only parses keys when
/// a token arrives, which would turn a bad key into silent 401s.
fn rsa_key_from_pkcs1(der: &[u8]) -> Result<DecodingKey, String> {
    let parse = || -> Result<(UintRef<'_>, UintRef<'_>), p256::pkcs8::der::Error> {
        let mut reader = SliceReader::new(der)?;
        let ne = reader.sequence(|r| Ok((UintRef::decode(r)?, UintRef::decode(r)?)))?;
        reader.finish(ne)
    };
    let (n, e) = parse().map_err(|e| format!("not an RSA public key ({e})"))?;
    check_rsa(n.as_bytes(), e.as_bytes())?;
    Ok(DecodingKey::from_rsa_der(der))
}

/// Modulus and exponent (big-endian, no leading zeros) within sane bounds.
fn check_rsa(n: &[u8], e: &[u8]) -> Result<(), String> {
    let n = strip_zeros(n);
    let e = strip_zeros(e);
    let bits = match n.first() {
        Some(top) => n.len() * 8 - top.leading_zeros() as usize,
        None => 0,
    };
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(format!(
            "RSA key is {bits} bits; {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted"
        ));
    }
    // The same bounds as the verifier: odd, at least 3, at most 2^33 - 1.
    let e_value = (e.len() <= 8).then(|| e.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b)));
    match e_value {
        Some(v)
            if (3..(1 << 33)).contains(&v)
                && v % 2 == 1
                && n.last().is_some_and(|b| b % 2 == 1) =>
        {
            Ok(())
        }
        _ => Err("RSA key has an invalid modulus or exponent".to_owned()),
    }
}

fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

/// An HMAC secret file: trailing line breaks are not part of the secret.
pub(super) fn hs_secret(mut bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < MIN_HS_SECRET_BYTES {
        return Err(format!(
            "the secret is {} bytes; HMAC secrets must be at least {MIN_HS_SECRET_BYTES} \
             (e.g. `openssl rand -base64 48`)",
            bytes.len()
        ));
    }
    Ok(bytes)
}

pub(super) fn hs_key(secret: &[u8]) -> Result<VerifyKey, String> {
    let key = DecodingKey::from_secret(secret).map_err(|e| format!("unusable secret ({e})"))?;
    Ok(VerifyKey::new(KeyKind::Hmac, key, secret))
}

#[derive(Deserialize)]
struct JwksFile {
    keys: Vec<serde_json::Value>,
}

/// The members of a JWK we read (RFC 7517 §4, RFC 7518 §6).
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    key_use: Option<String>,
    alg: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
    d: Option<serde_json::Value>,
}

/// The signature keys of a JWKS file (`use: enc` keys are skipped). Every
/// bad key is reported, each as one sentence.
pub(super) fn jwks_keys(bytes: &[u8]) -> Result<Vec<VerifyKey>, Vec<String>> {
    let file: JwksFile = serde_json::from_slice(bytes)
        .map_err(|e| vec![format!("it is not a JWKS (`{{\"keys\": [...]}}`): {e}")])?;
    if file.keys.len() > MAX_JWKS_KEYS {
        return Err(vec![format!(
            "it has {} keys; at most {MAX_JWKS_KEYS} are accepted",
            file.keys.len()
        )]);
    }
    let mut keys: Vec<VerifyKey> = Vec::new();
    let mut errors = Vec::new();
    for (i, value) in file.keys.into_iter().enumerate() {
        let jwk = match serde_json::from_value::<Jwk>(value) {
            Ok(jwk) => jwk,
            Err(e) => {
                errors.push(format!("key {i}: {e}"));
                continue;
            }
        };
        let name = match &jwk.kid {
            Some(kid) => format!("key {i} (kid `{}`)", super::error::printable(kid)),
            None => format!("key {i}"),
        };
        if let Some(kid) = &jwk.kid
            && keys.iter().any(|k| k.kid.as_ref() == Some(kid))
        {
            errors.push(format!("{name}: another key has the same kid"));
            continue;
        }
        match jwk_key(jwk) {
            Ok(Some(key)) => keys.push(key),
            Ok(None) => {}
            Err(reason) => errors.push(format!("{name}: {reason}")),
        }
    }
    if errors.is_empty() {
        Ok(keys)
    } else {
        Err(errors)
    }
}

fn jwk_key(jwk: Jwk) -> Result<Option<VerifyKey>, String> {
    if jwk.key_use.as_deref().is_some_and(|u| u != "sig") {
        return Ok(None);
    }
    if jwk.d.is_some() {
        return Err("it holds private key material (`d`); publish public keys only".to_owned());
    }
    let alg = match jwk.alg.as_deref() {
        None => None,
        Some(name) => {
            Some(Algorithm::from_str(name).map_err(|_| format!("unsupported `alg` `{name}`"))?)
        }
    };
    let field = |value: Option<String>, name: &str| -> Result<Vec<u8>, String> {
        let value = value.ok_or_else(|| format!("`{name}` is missing"))?;
        URL_SAFE_NO_PAD
            .decode(value)
            .map_err(|_| format!("`{name}` is not base64url"))
    };
    let mut key = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
        ("RSA", _) => {
            let (n, e) = (field(jwk.n, "n")?, field(jwk.e, "e")?);
            check_rsa(&n, &e)?;
            let material = [n.as_slice(), b".", e.as_slice()].concat();
            VerifyKey::new(
                KeyKind::Rsa,
                DecodingKey::from_rsa_raw_components(&n, &e),
                &material,
            )
        }
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (kind, len) = if crv == "P-256" {
                (KeyKind::EcP256, 32)
            } else {
                (KeyKind::EcP384, 48)
            };
            let (x, y) = (field(jwk.x, "x")?, field(jwk.y, "y")?);
            if x.len() != len || y.len() != len {
                return Err(format!("`x` and `y` must be {len} bytes for {crv}"));
            }
            let point: Vec<u8> = [&[4u8][..], &x, &y].concat();
            checked_curve_key(kind, &point)?
        }
        ("OKP", Some("Ed25519")) => checked_curve_key(KeyKind::Ed25519, &field(jwk.x, "x")?)?,
        ("EC" | "OKP", crv) => {
            return Err(format!("unsupported curve `{}`", crv.unwrap_or("(none)")));
        }
        ("oct", _) => {
            return Err(
                "symmetric (`oct`) keys are not accepted in a JWKS; use `hs_secret_file`"
                    .to_owned(),
            );
        }
        (kty, _) => return Err(format!("unsupported key type `{kty}`")),
    };
    if let Some(alg) = alg
        && KeyKind::for_algorithm(alg) != key.kind
    {
        return Err(format!(
            "`alg` {alg:?} does not fit {}",
            key.kind.describe()
        ));
    }
    key.kid = jwk.kid;
    key.alg = alg;
    Ok(Some(key))
}
