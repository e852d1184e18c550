//! The signature file: a Sigstore bundle (v0.3 JSON) holding a DSSE
//! envelope, shaped as model-signing writes it in key mode:
//!
//! ```text
//! {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
//!  "verificationMaterial": {"publicKey": {"hint": <hex SHA-256 of the SPKI PEM>},
//!                           "tlogEntries": []},
//!  "dsseEnvelope": {"payload": <base64 statement>,
//!                   "payloadType": "application/vnd.in-toto+json",
//!                   "signatures": [{"sig": <base64>, "keyid": ""}]}}
//! ```
//!
//! The signature covers DSSE's pre-authentication encoding of the payload
//! ([`pae`]), never the JSON around it.

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::{MAX_BUNDLE_BYTES, ModelError, PublicKey, SigningKey};

pub(crate) const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
pub(crate) const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// DSSE v1 pre-authentication encoding:
/// `"DSSEv1" SP len(type) SP type SP len(payload) SP payload`, lengths in
/// decimal bytes.
pub(crate) fn pae(payload: &[u8]) -> Vec<u8> {
    let header = format!(
        "DSSEv1 {} {PAYLOAD_TYPE} {} ",
        PAYLOAD_TYPE.len(),
        payload.len()
    );
    let mut out = Vec::with_capacity(header.len() + payload.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    out
}

#[derive(Serialize)]
struct BundleOut<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    #[serde(rename = "verificationMaterial")]
    verification_material: MaterialOut,
    #[serde(rename = "dsseEnvelope")]
    dsse_envelope: EnvelopeOut<'a>,
}

#[derive(Serialize)]
struct MaterialOut {
    #[serde(rename = "publicKey")]
    public_key: HintOut,
    #[serde(rename = "tlogEntries")]
    tlog_entries: [(); 0],
}

#[derive(Serialize)]
struct HintOut {
    hint: String,
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    payload: String,
    #[serde(rename = "payloadType")]
    payload_type: &'a str,
    signatures: [SignatureOut; 1],
}

#[derive(Serialize)]
struct SignatureOut {
    sig: String,
    keyid: &'static str,
}

/// Signs `payload` with `key` and wraps it in a bundle (compact JSON, as
/// model-signing writes it).
pub(crate) fn seal(payload: &[u8], key: &SigningKey) -> Vec<u8> {
    let b64 = &general_purpose::STANDARD;
    let bundle = BundleOut {
        media_type: BUNDLE_MEDIA_TYPE,
        verification_material: MaterialOut {
            public_key: HintOut {
                hint: key.public_key().hint(),
            },
            tlog_entries: [],
        },
        dsse_envelope: EnvelopeOut {
            payload: b64.encode(payload),
            payload_type: PAYLOAD_TYPE,
            signatures: [SignatureOut {
                sig: b64.encode(key.sign(&pae(payload))),
                keyid: "",
            }],
        },
    };
    // Strings and arrays only: serializing cannot fail.
    serde_json::to_vec(&bundle).unwrap_or_default()
}

#[derive(Deserialize)]
struct Bundle {
    #[serde(rename = "mediaType")]
    media_type: String,
    #[serde(rename = "verificationMaterial")]
    verification_material: Material,
    #[serde(rename = "dsseEnvelope")]
    dsse_envelope: Option<Envelope>,
    #[serde(rename = "messageSignature")]
    message_signature: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Material {
    #[serde(rename = "publicKey")]
    public_key: Option<Hint>,
    certificate: Option<IgnoredAny>,
    #[serde(rename = "x509CertificateChain")]
    certificate_chain: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Hint {
    hint: Option<String>,
}

#[derive(Deserialize)]
struct Envelope {
    payload: String,
    #[serde(rename = "payloadType")]
    payload_type: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
struct EnvelopeSignature {
    sig: String,
}

fn malformed(message: impl Into<String>) -> ModelError {
    ModelError::MalformedBundle(message.into())
}

/// DSSE allows standard or URL-safe base64, with or without padding.
fn decode_base64(field: &str, text: &str) -> Result<Vec<u8>, ModelError> {
    const LENIENT: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .map_err(|e| malformed(format!("`{field}` is not base64 ({e})")))
}

/// Checks a bundle's shape and its signature with `key`; the signed payload.
/// The JSON is parsed only up to [`MAX_BUNDLE_BYTES`] (and serde_json's
/// nesting limit); unknown fields are ignored, as a protobuf JSON reader
/// would.
pub(crate) fn open(bytes: &[u8], key: &PublicKey) -> Result<Vec<u8>, ModelError> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(ModelError::BundleTooLarge {
            size: bytes.len() as u64,
            limit: MAX_BUNDLE_BYTES,
        });
    }
    // As for the statement: skipped fields' UTF-8 is not checked by serde_json.
    if std::str::from_utf8(bytes).is_err() {
        return Err(malformed("not UTF-8 text"));
    }
    let bundle: Bundle = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("not a Sigstore bundle ({e})")))?;
    if bundle.media_type != BUNDLE_MEDIA_TYPE {
        return Err(malformed(format!(
            "`mediaType` is {:?}, expected {BUNDLE_MEDIA_TYPE:?}",
            bundle.media_type
        )));
    }
    let material = &bundle.verification_material;
    if material.certificate.is_some() || material.certificate_chain.is_some() {
        return Err(malformed(
            "signed with a certificate; only key-signed bundles are supported",
        ));
    }
    let Some(envelope) = bundle.dsse_envelope else {
        return Err(malformed(if bundle.message_signature.is_some() {
            "a `messageSignature` bundle; model signatures are DSSE envelopes"
        } else {
            "no `dsseEnvelope`"
        }));
    };
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(malformed(format!(
            "`payloadType` is {:?}, expected {PAYLOAD_TYPE:?}",
            envelope.payload_type
        )));
    }
    let [signature] = &envelope.signatures[..] else {
        return Err(malformed(format!(
            "{} signatures in the envelope; model signatures have exactly one",
            envelope.signatures.len()
        )));
    };
    let payload = decode_base64("dsseEnvelope.payload", &envelope.payload)?;
    let signature = decode_base64("dsseEnvelope.signatures[0].sig", &signature.sig)?;

    // model-signing refuses a key whose hint differs; an empty or absent
    // hint (older bundles) is allowed, the signature decides.
    if let Some(bundle_hint) = material
        .public_key
        .as_ref()
        .and_then(|k| k.hint.as_deref())
        .filter(|h| !h.is_empty())
    {
        let key_hint = key.hint();
        if !bundle_hint.eq_ignore_ascii_case(&key_hint) {
            return Err(ModelError::KeyMismatch {
                // Hints are public key digests, not secrets; cap what we echo.
                bundle_hint: bundle_hint.chars().take(64).collect(),
                key_hint,
            });
        }
    }
    if !key.verifies(&pae(&payload), &signature) {
        return Err(ModelError::BadSignature);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        // "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body.
        assert_eq!(
            pae(b"hello world"),
            b"DSSEv1 28 application/vnd.in-toto+json 11 hello world"
        );
    }

    #[test]
    fn base64_in_either_alphabet_with_or_without_padding() {
        for text in ["+/8=", "+/8", "-_8=", "-_8"] {
            assert_eq!(decode_base64("f", text).unwrap(), [0xfb, 0xff], "{text}");
        }
        let err = decode_base64("f", "not base64!").unwrap_err().to_string();
        assert!(err.contains("`f` is not base64"), "{err}");
    }
}
