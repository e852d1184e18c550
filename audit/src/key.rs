//! The audit key: the Ed25519 key checkpoints are signed with. By default
//! `<dir>/audit.key.pem`, generated (PKCS#8 PEM, 0600) at first start;
//! `[audit] key` names another file, which must exist. Its public half is
//! written into the log folder as `audit.pub.pem` (SPKI PEM) and
//! `audit.vkey` (the signed-note verifier key) at every start, for
//! `bulkhead audit verify` and for anyone who checks checkpoints.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::KeypairBytes;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};

use super::AuditError;
use super::files::{read_small, write_atomic};
use super::note::NoteVerifier;

/// The default key file in the log folder.
pub const KEY_FILE: &str = "audit.key.pem";
/// The public key, SPKI PEM.
pub const PUBLIC_KEY_FILE: &str = "audit.pub.pem";
/// The public key as a signed-note verifier key.
pub const VKEY_FILE: &str = "audit.vkey";
/// A PEM key is well under this.
const MAX_KEY_FILE_BYTES: u64 = 16 << 10;

/// The key, and whether this start created it.
#[derive(Debug)]
pub(crate) struct LoadedKey {
    pub(crate) key: SigningKey,
    pub(crate) path: PathBuf,
    pub(crate) created: bool,
}

/// Reads the audit key (`explicit`, or the default in `dir`, generated if
/// missing), and writes its public half into `dir`.
pub(crate) fn load_or_create(
    dir: &Path,
    explicit: Option<&Path>,
    name: &str,
) -> Result<LoadedKey, AuditError> {
    let path = explicit.map_or_else(|| dir.join(KEY_FILE), Path::to_path_buf);
    let (key, created) = match read_small(&path, MAX_KEY_FILE_BYTES)? {
        Some(bytes) => {
            warn_if_open(&path);
            (parse_private(&path, &bytes)?, false)
        }
        None if explicit.is_some() => {
            return Err(AuditError::Key {
                path,
                why: "it does not exist (`[audit] key` must name an existing Ed25519 \
                      PKCS#8 PEM file; leave it out to have one generated in the log folder)"
                    .into(),
            });
        }
        None => {
            let key = SigningKey::generate(&mut rand_core::OsRng);
            // PKCS#8 v1, as `openssl genpkey -algorithm ed25519` writes it.
            let pem = KeypairBytes {
                secret_key: key.to_bytes(),
                public_key: None,
            }
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| AuditError::Key {
                path: path.clone(),
                why: format!("encoding a new key: {e}"),
            })?;
            write_atomic(&path, pem.as_bytes())?;
            tracing::info!(path = %path.display(), "generated the audit key");
            (key, true)
        }
    };
    write_public(dir, &key, name)?;
    Ok(LoadedKey { key, path, created })
}

/// The audit key in `path` (an Ed25519 PKCS#8 PEM file, which must
/// exist): how every gateway writing a shared log loads the one key they
/// all hold.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, AuditError> {
    let bytes = read_small(path, MAX_KEY_FILE_BYTES)?.ok_or_else(|| AuditError::Key {
        path: path.to_path_buf(),
        why: "it does not exist (`openssl genpkey -algorithm ed25519 -out FILE` makes one; \
              every gateway sharing the log needs the same file)"
            .into(),
    })?;
    warn_if_open(path);
    parse_private(path, &bytes)
}

fn parse_private(path: &Path, bytes: &[u8]) -> Result<SigningKey, AuditError> {
    let text = std::str::from_utf8(bytes).map_err(|_| AuditError::Key {
        path: path.to_path_buf(),
        why: "not a PEM file (not text)".into(),
    })?;
    SigningKey::from_pkcs8_pem(text).map_err(|e| AuditError::Key {
        path: path.to_path_buf(),
        why: format!(
            "not an Ed25519 private key in PKCS#8 PEM ({e}); `openssl genpkey -algorithm \
             ed25519` writes one"
        ),
    })
}

/// Writes `audit.pub.pem` and `audit.vkey` when they differ from the key.
fn write_public(dir: &Path, key: &SigningKey, name: &str) -> Result<(), AuditError> {
    let public = key.verifying_key();
    let pem = public
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| AuditError::Key {
            path: dir.join(PUBLIC_KEY_FILE),
            why: e.to_string(),
        })?;
    let vkey = NoteVerifier::new(name, public)
        .map_err(|e| AuditError::Config(e.to_string()))?
        .to_vkey()
        + "\n";
    for (file, text) in [(PUBLIC_KEY_FILE, pem), (VKEY_FILE, vkey)] {
        let path = dir.join(file);
        if read_small(&path, MAX_KEY_FILE_BYTES)?.as_deref() != Some(text.as_bytes()) {
            write_atomic(&path, text.as_bytes())?;
        }
    }
    Ok(())
}

fn warn_if_open(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
            "the audit key is readable by other users; 0600 is expected"
        );
    }
}

/// A verifier from a public key file: SPKI PEM (named `name`, the
/// checkpoint's origin) or a vkey line (which carries its own name).
pub fn read_verifier(path: &Path, name: &str) -> Result<NoteVerifier, AuditError> {
    let bytes = read_small(path, MAX_KEY_FILE_BYTES)?.ok_or_else(|| AuditError::Key {
        path: path.to_path_buf(),
        why: "it does not exist".into(),
    })?;
    let bad = |why: String| AuditError::Key {
        path: path.to_path_buf(),
        why,
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| bad("not text".into()))?;
    if text.trim_start().starts_with("-----BEGIN") {
        let key = ed25519_dalek::VerifyingKey::from_public_key_pem(text)
            .map_err(|e| bad(format!("not an Ed25519 public key in SPKI PEM ({e})")))?;
        NoteVerifier::new(name, key).map_err(|e| bad(e.to_string()))
    } else {
        NoteVerifier::from_vkey(text).map_err(|e| bad(e.to_string()))
    }
}
