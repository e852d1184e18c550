//! Fuzzes model-signature checking (`signing::verify_bundle`): the Sigstore
//! bundle JSON, its DSSE envelope and the in-toto statement inside.
//!
//! Two kinds of input:
//! - anything not starting with 0x00: a signature file, checked against a
//!   fixed Ed25519 key and a fixed P-256 key;
//! - 0x00 then a statement: wrapped in a bundle and signed here with the
//!   fixed Ed25519 key, so the fuzzer reaches the statement checks behind
//!   the signature.
//!
//! Never a panic; an unsigned input never verifies; an accepted statement
//! lists at most `MAX_FILES` files whose digests hash to the subject digest.
#![no_main]

use std::sync::OnceLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bulkhead_gateway::signing::{KeyKind, MAX_FILES, PublicKey, SigningKey, verify_bundle};
use ed25519_dalek::Signer;
use ed25519_dalek::pkcs8::EncodePublicKey;
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

struct Keys {
    signer: ed25519_dalek::SigningKey,
    ed25519: PublicKey,
    p256: PublicKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let signer = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let pem = signer
            .verifying_key()
            .to_public_key_pem(Default::default())
            .unwrap();
        Keys {
            ed25519: PublicKey::from_pem(pem.as_bytes()).unwrap(),
            p256: SigningKey::generate(KeyKind::P256).public_key(),
            signer,
        }
    })
}

/// A key-mode bundle over `payload`, signed with the fixed Ed25519 key.
fn bundle(payload: &[u8]) -> Vec<u8> {
    let mut pae = format!("DSSEv1 {} {PAYLOAD_TYPE} {} ", PAYLOAD_TYPE.len(), payload.len())
        .into_bytes();
    pae.extend_from_slice(payload);
    let signature = keys().signer.sign(&pae);
    serde_json::to_vec(&serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": keys().ed25519.hint()}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": STANDARD.encode(payload),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": STANDARD.encode(signature.to_bytes()), "keyid": ""}],
        },
    }))
    .unwrap()
}

fuzz_target!(|data: &[u8]| {
    let keys = keys();
    if let Some(statement) = data.strip_prefix(&[0u8]) {
        if let Ok(manifest) = verify_bundle(&bundle(statement), &keys.ed25519) {
            assert!(manifest.files.len() <= MAX_FILES);
            let mut h = Sha256::new();
            for file in &manifest.files {
                h.update(file.sha256);
            }
            assert_eq!(<[u8; 32]>::from(h.finalize()), manifest.subject_digest);
        }
        return;
    }
    for key in [&keys.ed25519, &keys.p256] {
        match verify_bundle(data, key) {
            Ok(_) => panic!("an input the fuzzer wrote verified"),
            Err(e) => drop(e.to_string()),
        }
    }
});
