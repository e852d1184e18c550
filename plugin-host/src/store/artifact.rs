//! Compiled artifacts, sealed so that only machine code this gateway
//! compiled itself is ever loaded back.
//!
//! wasmtime's `Component::deserialize` maps the bytes it is given as
//! executable code, trusting them to be its own output. An artifact file
//! is therefore sealed with an HMAC-SHA256 under the store's key (32
//! random bytes, created with the store, 0600) over a domain label, the
//! plugin's digest, the engine's compatibility digest and the code.
//! [`open`] returns a [`VerifiedArtifact`] — the only input
//! `PluginEngine::load_precompiled` takes — only when that MAC checks out
//! (compared in constant time).
//!
//! File format: `MAGIC` (8 bytes) ‖ engine compatibility digest (32) ‖
//! MAC (32) ‖ wasmtime's serialized component. The compatibility digest is
//! in the clear only so a log can say "another engine" rather than "bad
//! MAC"; the MAC covers it.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::PluginDigest;

/// First bytes of an artifact file: names the format and its version.
const MAGIC: &[u8; 8] = b"BHCWASM1";
/// Separates these MACs from any other use of the key.
const DOMAIN: &[u8] = b"bulkhead plugin artifact v1\0";
const HEADER_BYTES: usize = MAGIC.len() + 32 + 32;

/// Size of the store key.
pub(crate) const KEY_BYTES: usize = 32;

/// The store's MAC key. Never logged.
#[derive(Clone)]
pub(crate) struct StoreKey([u8; KEY_BYTES]);

impl StoreKey {
    pub(crate) fn new(bytes: [u8; KEY_BYTES]) -> StoreKey {
        StoreKey(bytes)
    }

    fn mac(&self, digest: PluginDigest, compatibility: &[u8; 32]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(DOMAIN);
        mac.update(digest.as_bytes());
        mac.update(compatibility);
        mac
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreKey(..)")
    }
}

/// The artifact file for `code`, the serialized component compiled from
/// the upload with `digest` by an engine with `compatibility`.
pub(crate) fn seal(
    key: &StoreKey,
    digest: PluginDigest,
    compatibility: &[u8; 32],
    code: &[u8],
) -> Vec<u8> {
    let mut mac = key.mac(digest, compatibility);
    mac.update(code);
    let tag = mac.finalize().into_bytes();
    let mut file = Vec::with_capacity(HEADER_BYTES + code.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(compatibility);
    file.extend_from_slice(&tag);
    file.extend_from_slice(code);
    file
}

/// Why an artifact file is not used (the plugin is then compiled again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArtifactRejected {
    #[error("not an artifact file of this gateway")]
    NotAnArtifact,
    #[error("compiled by another engine version or settings")]
    OtherEngine,
    #[error("its MAC does not verify (altered, or sealed with another store key)")]
    BadMac,
}

/// Compiled code whose MAC verified: produced by this gateway, under this
/// store's key, for the plugin with [`Self::digest`], by a compatible
/// engine. Only [`open`] makes one.
pub(crate) struct VerifiedArtifact {
    digest: PluginDigest,
    file: Vec<u8>,
}

impl VerifiedArtifact {
    pub(crate) fn digest(&self) -> PluginDigest {
        self.digest
    }

    /// The serialized component.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.file[HEADER_BYTES..]
    }
}

impl fmt::Debug for VerifiedArtifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedArtifact")
            .field("digest", &self.digest)
            .field("code_bytes", &self.bytes().len())
            .finish()
    }
}

/// Checks an artifact `file` read from the store against `key`, the plugin
/// `digest` it is meant for and this engine's `compatibility` digest.
pub(crate) fn open(
    key: &StoreKey,
    digest: PluginDigest,
    compatibility: &[u8; 32],
    file: Vec<u8>,
) -> Result<VerifiedArtifact, ArtifactRejected> {
    if file.len() < HEADER_BYTES || &file[..MAGIC.len()] != MAGIC {
        return Err(ArtifactRejected::NotAnArtifact);
    }
    let (header, code) = file.split_at(HEADER_BYTES);
    let written_compatibility = &header[MAGIC.len()..MAGIC.len() + 32];
    let tag = &header[MAGIC.len() + 32..];
    if written_compatibility != compatibility {
        return Err(ArtifactRejected::OtherEngine);
    }
    let mut mac = key.mac(digest, compatibility);
    mac.update(code);
    // Constant time: `verify_slice` compares with `subtle`.
    mac.verify_slice(tag)
        .map_err(|_| ArtifactRejected::BadMac)?;
    Ok(VerifiedArtifact { digest, file })
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPAT: [u8; 32] = [7; 32];

    fn key(byte: u8) -> StoreKey {
        StoreKey::new([byte; KEY_BYTES])
    }

    #[test]
    fn a_sealed_artifact_opens_with_the_same_key_digest_and_engine() {
        let digest = PluginDigest::of(b"plugin");
        let file = seal(&key(1), digest, &COMPAT, b"machine code");
        let opened = open(&key(1), digest, &COMPAT, file).unwrap();
        assert_eq!(opened.bytes(), b"machine code");
        assert_eq!(opened.digest(), digest);
    }

    #[test]
    fn anything_else_is_rejected() {
        let digest = PluginDigest::of(b"plugin");
        let file = seal(&key(1), digest, &COMPAT, b"machine code");
        let reject = |key: &StoreKey, digest, compat: &[u8; 32], file: Vec<u8>| {
            open(key, digest, compat, file).map(|_| ()).unwrap_err()
        };
        assert_eq!(
            reject(&key(2), digest, &COMPAT, file.clone()),
            ArtifactRejected::BadMac
        );
        assert_eq!(
            reject(&key(1), PluginDigest::of(b"other"), &COMPAT, file.clone()),
            ArtifactRejected::BadMac
        );
        assert_eq!(
            reject(&key(1), digest, &[8; 32], file.clone()),
            ArtifactRejected::OtherEngine
        );
        for at in [
            MAGIC.len() + 32,
            HEADER_BYTES - 1,
            HEADER_BYTES,
            file.len() - 1,
        ] {
            let mut flipped = file.clone();
            flipped[at] ^= 1;
            assert_eq!(
                reject(&key(1), digest, &COMPAT, flipped),
                ArtifactRejected::BadMac,
                "byte {at}"
            );
        }
        let mut longer = file.clone();
        longer.push(0);
        assert_eq!(
            reject(&key(1), digest, &COMPAT, longer),
            ArtifactRejected::BadMac
        );
        for short in [0, 7, HEADER_BYTES - 1] {
            assert_eq!(
                reject(&key(1), digest, &COMPAT, file[..short].to_vec()),
                ArtifactRejected::NotAnArtifact
            );
        }
        let mut renamed = file;
        renamed[0] = b'X';
        assert_eq!(
            reject(&key(1), digest, &COMPAT, renamed),
            ArtifactRejected::NotAnArtifact
        );
    }

    #[test]
    fn the_key_is_not_printed() {
        assert_eq!(format!("{:?}", key(0x41)), "StoreKey(..)");
    }
}
