//! Publisher keys: ECDSA P-256 (the kind model-signing's key mode shares
//! with us) and Ed25519 (ours), read from the PEM files OpenSSL writes.
//!
//! Private keys: PKCS#8 `PRIVATE KEY` (`openssl genpkey`, `openssl pkcs8
//! -topk8 -nocrypt`, `bulkhead model keygen`) and, for P-256, SEC1 `EC
//! PRIVATE KEY` (`openssl ecparam -genkey`, with or without its `EC
//! PARAMETERS` block). Public keys: SPKI `PUBLIC KEY`. Anything else (RSA,
//! other curves, encrypted keys, certificates, garbage) is refused with an
//! error naming what it is.

use std::fmt;
use std::io::Read as _;
use std::path::Path;

use ed25519_dalek::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _};
use p256::elliptic_curve::zeroize::Zeroizing;
use p256::pkcs8::der::pem;
use p256::pkcs8::spki::{EncodePublicKey as _, SubjectPublicKeyInfoRef};
use p256::pkcs8::{EncodePrivateKey as _, LineEnding, ObjectIdentifier, PrivateKeyInfo};
use sha2::{Digest as _, Sha256};

use super::ModelError;

/// Longest key file read. PEM keys of the kinds we take are under 1 KiB;
/// the cap keeps a wrong path (a model file) from being read whole.
pub const MAX_KEY_FILE_BYTES: usize = 64 * 1024;

/// The two key kinds a model can be signed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA on NIST P-256 with SHA-256, signatures DER-encoded (as
    /// model-signing and OpenSSL write them).
    P256,
    /// Ed25519 over the DSSE pre-authentication encoding, signatures the raw
    /// 64 bytes (Bulkhead's extension; model-signing does not take it).
    Ed25519,
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyKind::P256 => "ECDSA P-256",
            KeyKind::Ed25519 => "Ed25519",
        })
    }
}

/// A private key that signs model manifests.
pub struct SigningKey(Secret);

enum Secret {
    P256(p256::ecdsa::SigningKey),
    Ed25519(ed25519_dalek::SigningKey),
}

// Never prints key material.
impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.kind())
    }
}

/// A publisher's public key, which verifies model signatures.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey(Public);

#[derive(Clone, PartialEq, Eq)]
enum Public {
    P256(p256::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({} sha256:{})", self.kind(), self.hint())
    }
}

impl SigningKey {
    /// A fresh random key of `kind`.
    pub fn generate(kind: KeyKind) -> SigningKey {
        let mut rng = rand_core::OsRng;
        SigningKey(match kind {
            KeyKind::P256 => Secret::P256(p256::ecdsa::SigningKey::random(&mut rng)),
            KeyKind::Ed25519 => Secret::Ed25519(ed25519_dalek::SigningKey::generate(&mut rng)),
        })
    }

    /// Reads a private key file (see the module doc for the forms taken).
    pub fn from_pem_file(path: &Path) -> Result<SigningKey, ModelError> {
        let bytes = read_key_file(path)?;
        SigningKey::from_pem(&bytes)
            .map_err(|e| ModelError::Key(format!("{}: {e}", path.display())))
    }

    /// Parses a private key from PEM text.
    pub fn from_pem(text: &[u8]) -> Result<SigningKey, ModelError> {
        for block in pem_blocks(text)? {
            match block.label.as_str() {
                // `openssl ecparam -genkey` writes the curve before the key.
                "EC PARAMETERS" => continue,
                "PRIVATE KEY" => return private_from_pkcs8(&block.der),
                "EC PRIVATE KEY" => return private_from_sec1(&block.der),
                "ENCRYPTED PRIVATE KEY" => {
                    return Err(key_error(
                        "an encrypted private key; decrypt it first \
                         (`openssl pkcs8 -in KEY -out PLAIN.pem`)",
                    ));
                }
                "RSA PRIVATE KEY" => return Err(unsupported("an RSA")),
                "PUBLIC KEY" => {
                    return Err(key_error("a public key; signing needs the private key"));
                }
                other => return Err(not_a_key(other, "private")),
            }
        }
        Err(key_error("a PEM file with parameters but no private key"))
    }

    /// Which kind of key this is.
    pub fn kind(&self) -> KeyKind {
        match &self.0 {
            Secret::P256(_) => KeyKind::P256,
            Secret::Ed25519(_) => KeyKind::Ed25519,
        }
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(match &self.0 {
            Secret::P256(key) => Public::P256(*key.verifying_key()),
            Secret::Ed25519(key) => Public::Ed25519(key.verifying_key()),
        })
    }

    /// The key as PKCS#8 PEM, as `openssl genpkey` writes it (Ed25519
    /// without the optional embedded public key, the form every tool reads).
    pub fn to_pkcs8_pem(&self) -> Result<Zeroizing<String>, ModelError> {
        let pem = match &self.0 {
            Secret::P256(key) => p256::SecretKey::from(key).to_pkcs8_pem(LineEnding::LF),
            Secret::Ed25519(key) => ed25519_dalek::pkcs8::KeypairBytes {
                secret_key: key.to_bytes(),
                public_key: None,
            }
            .to_pkcs8_pem(LineEnding::LF),
        };
        pem.map_err(|e| key_error(&format!("cannot encode the private key: {e}")))
    }

    /// Signs `message`: a DER ECDSA signature (SHA-256, RFC 6979 nonce) or
    /// a raw 64-byte Ed25519 signature.
    pub(crate) fn sign(&self, message: &[u8]) -> Vec<u8> {
        use p256::ecdsa::signature::Signer as _;
        match &self.0 {
            Secret::P256(key) => {
                let signature: p256::ecdsa::Signature = key.sign(message);
                signature.to_der().as_bytes().to_vec()
            }
            Secret::Ed25519(key) => key.sign(message).to_bytes().to_vec(),
        }
    }
}

impl PublicKey {
    /// Reads an SPKI `PUBLIC KEY` PEM file.
    pub fn from_pem_file(path: &Path) -> Result<PublicKey, ModelError> {
        let bytes = read_key_file(path)?;
        PublicKey::from_pem(&bytes).map_err(|e| ModelError::Key(format!("{}: {e}", path.display())))
    }

    /// Parses an SPKI `PUBLIC KEY` from PEM text.
    pub fn from_pem(text: &[u8]) -> Result<PublicKey, ModelError> {
        let Some(block) = pem_blocks(text)?.into_iter().next() else {
            return Err(key_error("no public key in the PEM file"));
        };
        match block.label.as_str() {
            "PUBLIC KEY" => public_from_spki(&block.der),
            "RSA PUBLIC KEY" => Err(unsupported("an RSA")),
            "CERTIFICATE" => Err(key_error(
                "an X.509 certificate; give its public key \
                 (`openssl x509 -pubkey -noout -in CERT`)",
            )),
            "PRIVATE KEY" | "EC PRIVATE KEY" | "EC PARAMETERS" | "ENCRYPTED PRIVATE KEY" => Err(
                key_error("a private key; verification takes the public key (KEY.pub.pem)"),
            ),
            other => Err(not_a_key(other, "public")),
        }
    }

    /// Which kind of key this is.
    pub fn kind(&self) -> KeyKind {
        match &self.0 {
            Public::P256(_) => KeyKind::P256,
            Public::Ed25519(_) => KeyKind::Ed25519,
        }
    }

    /// The key as SPKI PEM, byte for byte what OpenSSL and Python's
    /// `cryptography` write (64-column base64, `\n` line ends).
    pub fn to_spki_pem(&self) -> String {
        let pem = match &self.0 {
            Public::P256(key) => key.to_public_key_pem(LineEnding::LF),
            Public::Ed25519(key) => key.to_public_key_pem(LineEnding::LF),
        };
        // Encoding a valid in-memory key into a growable String cannot fail.
        pem.unwrap_or_default()
    }

    /// The key's hint: lower-case hex SHA-256 of its SPKI PEM. model-signing
    /// writes it in `verificationMaterial.publicKey.hint` and refuses a key
    /// whose hint differs, so we compute it the same way.
    pub fn hint(&self) -> String {
        bulkhead_protocol::digest::to_hex(&Sha256::digest(self.to_spki_pem()).into())
    }

    /// Whether `signature` is this key's signature of `message`.
    pub(crate) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        use p256::ecdsa::signature::Verifier as _;
        match &self.0 {
            Public::P256(key) => p256::ecdsa::Signature::from_der(signature)
                .is_ok_and(|sig| key.verify(message, &sig).is_ok()),
            Public::Ed25519(key) => ed25519_dalek::Signature::from_slice(signature)
                // Strict: no small-order keys, no malleable signatures.
                .is_ok_and(|sig| key.verify_strict(message, &sig).is_ok()),
        }
    }
}

fn read_key_file(path: &Path) -> Result<Vec<u8>, ModelError> {
    let file = std::fs::File::open(path).map_err(ModelError::io(path))?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(ModelError::io(path))?;
    if bytes.len() > MAX_KEY_FILE_BYTES {
        return Err(ModelError::Key(format!(
            "{}: larger than {MAX_KEY_FILE_BYTES} bytes, not a key file",
            path.display()
        )));
    }
    Ok(bytes)
}

/// One `-----BEGIN label-----` … `-----END label-----` block, decoded.
struct PemBlock {
    label: String,
    der: Vec<u8>,
}

/// Every PEM block in `text`, in order; text around them is ignored (as
/// OpenSSL ignores it). An error if there is none or one is damaged.
fn pem_blocks(text: &[u8]) -> Result<Vec<PemBlock>, ModelError> {
    if text.len() > MAX_KEY_FILE_BYTES {
        return Err(key_error("larger than a key file"));
    }
    let Ok(text) = std::str::from_utf8(text) else {
        return Err(key_error("not a PEM file (not text)"));
    };
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let label_end = block["-----BEGIN ".len()..]
            .find("-----")
            .ok_or_else(|| key_error("a damaged PEM header"))?;
        let label = &block["-----BEGIN ".len()..][..label_end];
        let end_marker = format!("-----END {label}-----");
        let end = block
            .find(&end_marker)
            .ok_or_else(|| key_error(&format!("a PEM `{label}` block without its END line")))?
            + end_marker.len();
        let (decoded_label, der) = pem::decode_vec(&block.as_bytes()[..end])
            .map_err(|e| key_error(&format!("a damaged PEM `{label}` block ({e})")))?;
        blocks.push(PemBlock {
            label: decoded_label.to_string(),
            der,
        });
        rest = &block[end..];
    }
    if blocks.is_empty() {
        return Err(key_error("not a PEM file (no -----BEGIN line)"));
    }
    Ok(blocks)
}

const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

/// What a key of algorithm `oid` (and curve `curve`) is, for errors.
fn describe(oid: ObjectIdentifier, curve: Option<ObjectIdentifier>) -> String {
    match oid.to_string().as_str() {
        "1.2.840.113549.1.1.1" => "an RSA".into(),
        "1.2.840.113549.1.1.10" => "an RSA-PSS".into(),
        "1.3.101.113" => "an Ed448".into(),
        "1.3.101.110" | "1.3.101.111" => "an X25519/X448 (key agreement)".into(),
        "1.2.840.10045.2.1" => format!("an ECDSA {}", curve_name(curve)),
        other => format!("an algorithm {other}"),
    }
}

fn curve_name(curve: Option<ObjectIdentifier>) -> String {
    match curve.map(|c| c.to_string()).as_deref() {
        Some("1.2.840.10045.3.1.7") => "P-256".into(),
        Some("1.3.132.0.34") => "P-384".into(),
        Some("1.3.132.0.35") => "P-521".into(),
        Some("1.3.132.0.10") => "secp256k1".into(),
        Some(other) => format!("curve {other}"),
        None => "(unnamed curve)".into(),
    }
}

fn private_from_pkcs8(der: &[u8]) -> Result<SigningKey, ModelError> {
    let info = PrivateKeyInfo::try_from(der)
        .map_err(|e| key_error(&format!("a damaged PKCS#8 private key ({e})")))?;
    let (oid, curve) = info
        .algorithm
        .oids()
        .map_err(|e| key_error(&format!("a damaged PKCS#8 algorithm ({e})")))?;
    let damaged = |e: &dyn fmt::Display| key_error(&format!("a damaged PKCS#8 private key ({e})"));
    if oid == OID_ED25519 {
        let key = ed25519_dalek::SigningKey::from_pkcs8_der(der).map_err(|e| damaged(&e))?;
        return Ok(SigningKey(Secret::Ed25519(key)));
    }
    if oid == OID_EC_PUBLIC_KEY && curve == Some(OID_P256) {
        let key = p256::SecretKey::from_pkcs8_der(der).map_err(|e| damaged(&e))?;
        return Ok(SigningKey(Secret::P256(key.into())));
    }
    Err(unsupported(&describe(oid, curve)))
}

fn private_from_sec1(der: &[u8]) -> Result<SigningKey, ModelError> {
    let parsed = sec1::EcPrivateKey::try_from(der)
        .map_err(|e| key_error(&format!("a damaged EC private key ({e})")))?;
    let curve = parsed.parameters.and_then(|p| p.named_curve());
    // No parameters: the curve is implied by the key length, 32 bytes for P-256.
    if curve == Some(OID_P256) || (curve.is_none() && parsed.private_key.len() == 32) {
        let key = p256::SecretKey::from_sec1_der(der)
            .map_err(|e| key_error(&format!("a damaged EC private key ({e})")))?;
        return Ok(SigningKey(Secret::P256(key.into())));
    }
    Err(unsupported(&format!("an ECDSA {}", curve_name(curve))))
}

fn public_from_spki(der: &[u8]) -> Result<PublicKey, ModelError> {
    let info = SubjectPublicKeyInfoRef::try_from(der)
        .map_err(|e| key_error(&format!("a damaged public key ({e})")))?;
    let (oid, curve) = info
        .algorithm
        .oids()
        .map_err(|e| key_error(&format!("a damaged public key algorithm ({e})")))?;
    let damaged = |e: &dyn fmt::Display| key_error(&format!("a damaged public key ({e})"));
    if oid == OID_ED25519 {
        let key = ed25519_dalek::VerifyingKey::from_public_key_der(der).map_err(|e| damaged(&e))?;
        return Ok(PublicKey(Public::Ed25519(key)));
    }
    if oid == OID_EC_PUBLIC_KEY && curve == Some(OID_P256) {
        use p256::pkcs8::DecodePublicKey as _;
        let key = p256::PublicKey::from_public_key_der(der).map_err(|e| damaged(&e))?;
        return Ok(PublicKey(Public::P256(key.into())));
    }
    Err(unsupported(&describe(oid, curve)))
}

fn key_error(what: &str) -> ModelError {
    ModelError::Key(what.to_string())
}

fn unsupported(what: &str) -> ModelError {
    ModelError::Key(format!(
        "{what} key; model signing takes ECDSA P-256 or Ed25519 keys"
    ))
}

fn not_a_key(label: &str, which: &str) -> ModelError {
    ModelError::Key(format!("a PEM `{label}` block, not a {which} key"))
}
