//! Checkpoints as C2SP signed notes (c2sp.org/signed-note,
//! c2sp.org/tlog-checkpoint), so transparency tooling and witnesses can
//! read them:
//!
//! ```text
//! bulkhead.local/audit          ← origin
//! 42                            ← tree size, decimal
//! qXzV…base64 root…=            ← tree head
//!                               ← blank line
//! — bulkhead.local/audit AbCd…  ← em dash, key name, base64(key ID ‖ Ed25519 signature)
//! ```
//!
//! The key ID is the first four bytes of SHA-256(name ‖ 0x0A ‖ 0x01 ‖
//! public key); the verifier key travels as `name+hex(key ID)+base64(0x01 ‖
//! public key)` (the "vkey" form of Go's `golang.org/x/mod/sumdb/note`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::merkle::Hash;

/// The signature type byte of Ed25519 in signed notes.
const ED25519: u8 = 0x01;
/// Largest note accepted: a checkpoint is ~150 bytes plus its signatures.
pub const MAX_NOTE_BYTES: usize = 64 << 10;
/// Most signature lines read; the spec asks verifiers to accept at least 16.
const MAX_SIGNATURES: usize = 100;

/// What is wrong with a note, a checkpoint or a verifier key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("not a signed note: {0}")]
    Malformed(String),
    #[error("not a checkpoint: {0}")]
    Checkpoint(String),
    #[error("not a verifier key (name+keyid+base64): {0}")]
    VerifierKey(String),
    #[error("key name `{0}` is invalid: it must be non-empty, without spaces or `+`")]
    KeyName(String),
    #[error("the note is not signed by key `{name}` ({id:08x})")]
    NotSigned { name: String, id: u32 },
    #[error(
        "the signature by key `{name}` ({id:08x}) does not verify: the note was altered or signed by another key"
    )]
    BadSignature { name: String, id: u32 },
}

/// Whether `name` may name a key in a signed note.
pub fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// The signed-note key ID of an Ed25519 key named `name`.
pub fn key_id(name: &str, key: &VerifyingKey) -> u32 {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([b'\n', ED25519]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// A named Ed25519 public key that checks notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    id: u32,
    key: VerifyingKey,
}

impl NoteVerifier {
    pub fn new(name: &str, key: VerifyingKey) -> Result<NoteVerifier, NoteError> {
        if !valid_key_name(name) {
            return Err(NoteError::KeyName(name.to_string()));
        }
        Ok(NoteVerifier {
            name: name.to_string(),
            id: key_id(name, &key),
            key,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn key(&self) -> &VerifyingKey {
        &self.key
    }

    /// `name+hex(key ID)+base64(0x01 ‖ public key)`.
    pub fn to_vkey(&self) -> String {
        let mut encoded = vec![ED25519];
        encoded.extend_from_slice(self.key.as_bytes());
        format!("{}+{:08x}+{}", self.name, self.id, BASE64.encode(encoded))
    }

    /// Parses the vkey form, checking that its key ID matches its key.
    pub fn from_vkey(text: &str) -> Result<NoteVerifier, NoteError> {
        let text = text.trim();
        let bad = |why: &str| NoteError::VerifierKey(why.to_string());
        // The name has no `+`; base64 may.
        let mut parts = text.splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected three parts separated by `+`"));
        };
        if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the key ID is not 8 hex digits"));
        }
        let id = u32::from_str_radix(id, 16).map_err(|_| bad("the key ID is not hex"))?;
        let raw = BASE64
            .decode(key)
            .map_err(|_| bad("the key is not base64"))?;
        let Some((&ED25519, public)) = raw.split_first() else {
            return Err(bad("only Ed25519 keys (type 0x01) are supported"));
        };
        let public: [u8; 32] = public
            .try_into()
            .map_err(|_| bad("an Ed25519 key is 32 bytes"))?;
        let key =
            VerifyingKey::from_bytes(&public).map_err(|_| bad("not a valid Ed25519 point"))?;
        let verifier = NoteVerifier::new(name, key)?;
        if verifier.id != id {
            return Err(bad(&format!(
                "the key ID {id:08x} does not match the name and key ({:08x})",
                verifier.id
            )));
        }
        Ok(verifier)
    }

    /// The note's text when it carries a valid signature by this key.
    /// Signatures by other keys are ignored, as the spec requires.
    pub fn open<'a>(&self, note: &'a str) -> Result<&'a str, NoteError> {
        let (text, signatures) = split_note(note)?;
        let mut verified = false;
        for (name, id, signature) in signatures {
            if name != self.name || id != self.id {
                continue;
            }
            let signature =
                Signature::from_slice(&signature).map_err(|_| NoteError::BadSignature {
                    name: self.name.clone(),
                    id,
                })?;
            self.key
                .verify_strict(text.as_bytes(), &signature)
                .map_err(|_| NoteError::BadSignature {
                    name: self.name.clone(),
                    id,
                })?;
            verified = true;
        }
        if verified {
            Ok(text)
        } else {
            Err(NoteError::NotSigned {
                name: self.name.clone(),
                id: self.id,
            })
        }
    }
}

/// A named Ed25519 private key that signs notes.
pub struct NoteSigner {
    verifier: NoteVerifier,
    key: SigningKey,
}

impl std::fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoteSigner")
            .field("verifier", &self.verifier)
            .finish_non_exhaustive()
    }
}

impl NoteSigner {
    pub fn new(name: &str, key: SigningKey) -> Result<NoteSigner, NoteError> {
        Ok(NoteSigner {
            verifier: NoteVerifier::new(name, key.verifying_key())?,
            key,
        })
    }

    pub fn verifier(&self) -> &NoteVerifier {
        &self.verifier
    }

    /// `text` (ending in a newline) followed by a blank line and one
    /// signature line.
    pub fn sign(&self, text: &str) -> String {
        debug_assert!(text.ends_with('\n'));
        let signature = self.key.sign(text.as_bytes());
        let mut blob = self.verifier.id.to_be_bytes().to_vec();
        blob.extend_from_slice(&signature.to_bytes());
        format!(
            "{text}\n\u{2014} {} {}\n",
            self.verifier.name,
            BASE64.encode(blob)
        )
    }
}

/// A note's text and its signature lines (name, key ID, signature bytes).
type Split<'a> = (&'a str, Vec<(&'a str, u32, Vec<u8>)>);

fn split_note(note: &str) -> Result<Split<'_>, NoteError> {
    let bad = |why: &str| NoteError::Malformed(why.to_string());
    if note.len() > MAX_NOTE_BYTES {
        return Err(bad("larger than 64 KiB"));
    }
    if note.chars().any(|c| c.is_control() && c != '\n') {
        return Err(bad("it contains control characters"));
    }
    // The text is separated from the signatures by the last blank line.
    let Some(at) = note.rfind("\n\n") else {
        return Err(bad("no blank line before the signatures"));
    };
    let (text, block) = (&note[..at + 1], &note[at + 2..]);
    if !block.ends_with('\n') {
        return Err(bad("the last signature line does not end in a newline"));
    }
    let mut signatures = Vec::new();
    for line in block[..block.len() - 1].split('\n') {
        if signatures.len() == MAX_SIGNATURES {
            return Err(bad("too many signatures"));
        }
        let Some(rest) = line.strip_prefix("\u{2014} ") else {
            return Err(bad(
                "a signature line does not start with an em dash and a space",
            ));
        };
        let Some((name, blob)) = rest.split_once(' ') else {
            return Err(bad("a signature line has no signature"));
        };
        if !valid_key_name(name) {
            return Err(NoteError::KeyName(name.to_string()));
        }
        let blob = BASE64
            .decode(blob)
            .map_err(|_| bad("a signature is not base64"))?;
        if blob.len() < 5 {
            return Err(bad("a signature is shorter than a key ID"));
        }
        let id = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]);
        signatures.push((name, id, blob[4..].to_vec()));
    }
    Ok((text, signatures))
}

/// A tree head: the log's origin, its size and its root hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

impl Checkpoint {
    /// The note text: `origin\nsize\nbase64(root)\n`.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            BASE64.encode(self.root)
        )
    }

    /// Parses a note text. Extension lines after the root are allowed by
    /// the spec; this log writes none and ignores any.
    pub fn parse(text: &str) -> Result<Checkpoint, NoteError> {
        let bad = |why: String| NoteError::Checkpoint(why);
        let mut lines = text.split('\n');
        let (Some(origin), Some(size), Some(root)) = (lines.next(), lines.next(), lines.next())
        else {
            return Err(bad("it needs an origin, a size and a root line".into()));
        };
        if origin.is_empty() {
            return Err(bad("the origin line is empty".into()));
        }
        // Decimal without leading zeros, so a size has one spelling.
        if size.is_empty()
            || !size.bytes().all(|b| b.is_ascii_digit())
            || (size.len() > 1 && size.starts_with('0'))
        {
            return Err(bad(format!("`{size}` is not a tree size")));
        }
        let size = size
            .parse()
            .map_err(|_| bad(format!("`{size}` is not a tree size")))?;
        let root = BASE64
            .decode(root)
            .ok()
            .and_then(|r| Hash::try_from(r).ok())
            .ok_or_else(|| bad(format!("`{root}` is not a base64 SHA-256 root hash")))?;
        Ok(Checkpoint {
            origin: origin.to_string(),
            size,
            root,
        })
    }
}

/// The checkpoint a note claims, signature NOT checked: only to learn its
/// origin (the key name) before choosing the key that checks it.
pub fn unverified_checkpoint(note: &str) -> Result<Checkpoint, NoteError> {
    let (text, _) = split_note(note)?;
    Checkpoint::parse(text)
}

/// Checks `note`'s signature with `verifier`, then parses its checkpoint.
pub fn open_checkpoint(note: &str, verifier: &NoteVerifier) -> Result<Checkpoint, NoteError> {
    let text = verifier.open(note)?;
    Checkpoint::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(name: &str) -> NoteSigner {
        NoteSigner::new(name, SigningKey::from_bytes(&[7; 32])).unwrap()
    }

    #[test]
    fn the_spec_example_verifier_key_parses_and_its_id_matches() {
        // Go's x/mod/sumdb/note documentation example key (a vkey with a
        // known name, ID and key).
        let vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        let verifier = NoteVerifier::from_vkey(vkey).unwrap();
        assert_eq!(verifier.name(), "PeterNeumann");
        assert_eq!(verifier.id(), 0xc74f20a3);
        assert_eq!(verifier.to_vkey(), vkey);
        // The example note signed by that key verifies.
        let note = "If you think cryptography is the answer to your problem,\n\
                    then you don't know what your problem is.\n\
                    \n\
                    \u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
        assert!(verifier.open(note).is_ok());
        let altered = note.replacen("cryptography", "Cryptography", 1);
        assert!(matches!(
            verifier.open(&altered),
            Err(NoteError::BadSignature { .. })
        ));
    }

    #[test]
    fn signing_reproduces_the_go_example_byte_for_byte() {
        // Its private key: `PRIVATE+KEY+PeterNeumann+c74f20a3+` then
        // base64(0x01 ‖ Ed25519 seed). Ed25519 is deterministic, so our note
        // must equal the published one exactly.
        let raw = BASE64
            .decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")
            .unwrap();
        let seed: [u8; 32] = raw[1..].try_into().unwrap();
        let signer = NoteSigner::new("PeterNeumann", SigningKey::from_bytes(&seed)).unwrap();
        assert_eq!(
            signer.verifier().to_vkey(),
            "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
        );
        let note = signer.sign(
            "If you think cryptography is the answer to your problem,\n\
             then you don't know what your problem is.\n",
        );
        assert!(note.ends_with(
            "\n\n\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
        ));
    }

    #[test]
    fn checkpoints_round_trip_and_alterations_fail() {
        let signer = signer("bulkhead.local/audit");
        let checkpoint = Checkpoint {
            origin: "bulkhead.local/audit".into(),
            size: 42,
            root: [9; 32],
        };
        let note = signer.sign(&checkpoint.body());
        assert!(note.starts_with(
            "bulkhead.local/audit\n42\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n\n\u{2014} bulkhead.local/audit "
        ));
        let verifier = signer.verifier();
        assert_eq!(open_checkpoint(&note, verifier).unwrap(), checkpoint);
        let vkey = verifier.to_vkey();
        assert_eq!(&NoteVerifier::from_vkey(&vkey).unwrap(), verifier);

        let bigger = note.replacen("\n42\n", "\n43\n", 1);
        assert!(matches!(
            open_checkpoint(&bigger, verifier),
            Err(NoteError::BadSignature { .. })
        ));
        let other =
            NoteSigner::new("bulkhead.local/audit", SigningKey::from_bytes(&[8; 32])).unwrap();
        assert!(matches!(
            open_checkpoint(&note, other.verifier()),
            Err(NoteError::NotSigned { .. })
        ));
        // A signature by an unknown key next to ours is ignored.
        let cosigned = format!(
            "{note}{}",
            other
                .sign(&checkpoint.body())
                .rsplit_once("\n\n")
                .unwrap()
                .1
        );
        assert_eq!(open_checkpoint(&cosigned, verifier).unwrap(), checkpoint);
    }

    #[test]
    fn malformed_notes_and_checkpoints_are_named() {
        let signer = signer("log");
        for (text, what) in [
            ("log\n1\n", "no root"),
            (
                "log\n01\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
                "leading zero",
            ),
            (
                "log\n-1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
                "negative",
            ),
            ("log\n1\nAAAA\n", "short root"),
            (
                "\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
                "no origin",
            ),
        ] {
            let note = signer.sign(text);
            assert!(
                matches!(
                    open_checkpoint(&note, signer.verifier()),
                    Err(NoteError::Checkpoint(_))
                ),
                "{what}"
            );
        }
        for note in [
            "log\n1\nroot\n",
            "log\n\n- log AAAA\n",
            "log\n\n\u{2014} log AAAAAAAA",
            "log\u{7}\n\n\u{2014} log AAAAAAAA\n",
        ] {
            assert!(signer.verifier().open(note).is_err(), "{note:?}");
        }
        assert!(NoteVerifier::new("two words", signer.verifier().key().to_owned()).is_err());
        assert!(NoteVerifier::from_vkey("log+zzzzzzzz+AQ==").is_err());
        let vkey = signer.verifier().to_vkey();
        let wrong_id = format!("log+00000000{}", &vkey[12..]);
        assert!(NoteVerifier::from_vkey(&wrong_id).is_err());
    }
}
