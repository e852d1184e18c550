//! Verification: a bundle against a key (no file access), then a folder
//! against the verified manifest.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use bulkhead_protocol::digest::Hash;

use super::error::FolderDiff;
use super::hash::digest_file;
use super::walk::list_files;
use super::{DirOptions, MAX_BUNDLE_BYTES, ModelError, PublicKey, bundle, statement};

/// A manifest whose signature verified with the publisher's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedManifest {
    /// The subject name (the signed folder's name; informative only).
    pub model_name: String,
    /// The subject digest: SHA-256 over the files' digests in order. Names
    /// the model as a whole (in logs, audit entries, response headers).
    pub subject_digest: Hash,
    /// The signed files in statement order.
    pub files: Vec<SignedFile>,
    /// Paths the signer left out, relative to the folder.
    pub ignore_paths: Vec<String>,
}

/// One file as signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFile {
    /// Its path relative to the model folder, `/`-separated, normalized.
    pub name: String,
    /// SHA-256 of the whole file.
    pub sha256: Hash,
    /// Its size in bytes, when the signer recorded our extension.
    pub size: Option<u64>,
    /// The Merkle root over its 4 MiB chunks
    /// (`bulkhead_protocol::digest`), when the signer recorded our
    /// extension; models signed by model-signing itself have none, and a
    /// loader must then hash whole files.
    pub chunk_root: Option<Hash>,
}

/// Checks `bundle` (the signature file's bytes) with `key`: its shape and
/// size limits, the DSSE signature, and the statement (types, subject
/// digest recomputed from the listed files). Reads no model file.
pub fn verify_bundle(bundle: &[u8], key: &PublicKey) -> Result<VerifiedManifest, ModelError> {
    let payload = bundle::open(bundle, key)?;
    let checked = statement::check_payload(&payload)?;
    Ok(VerifiedManifest {
        model_name: checked.model_name,
        subject_digest: checked.subject_digest,
        files: checked.files,
        ignore_paths: checked.ignore_paths,
    })
}

/// [`verify_bundle`], then compares `folder` with the manifest: every
/// signed file present with the signed content, nothing else (apart from
/// model-signing's default ignores, the paths the signer left out and
/// `options.ignore`). The error names each file that differs.
pub fn verify_dir(
    folder: &Path,
    bundle: &[u8],
    key: &PublicKey,
    options: &DirOptions,
) -> Result<VerifiedManifest, ModelError> {
    let verified = verify_bundle(bundle, key)?;
    let mut ignored = options.ignored(folder);
    for path in &verified.ignore_paths {
        ignored.add(path.clone());
    }
    let listed = list_files(folder, &ignored)?;
    let mut diff = FolderDiff::default();
    let mut on_disk: HashMap<&str, &Path> = listed
        .iter()
        .map(|f| (f.name.as_str(), f.path.as_path()))
        .collect();
    for signed in &verified.files {
        let Some(path) = on_disk.remove(signed.name.as_str()) else {
            diff.missing.push(signed.name.clone());
            continue;
        };
        let found = digest_file(path)?;
        let matches = found.sha256 == signed.sha256
            && signed.size.is_none_or(|size| size == found.size)
            && signed
                .chunk_root
                .is_none_or(|root| root == found.chunk_root);
        if !matches {
            diff.changed.push(signed.name.clone());
        }
    }
    // What is left was not signed; `listed` is already in manifest order.
    diff.unexpected = listed
        .iter()
        .filter(|f| on_disk.contains_key(f.name.as_str()))
        .map(|f| f.name.clone())
        .collect();
    if diff.is_empty() {
        Ok(verified)
    } else {
        Err(ModelError::Mismatch(diff))
    }
}

/// Reads a signature file, refusing one over [`MAX_BUNDLE_BYTES`] before
/// reading it whole.
pub fn read_bundle_file(path: &Path) -> Result<Vec<u8>, ModelError> {
    let file = std::fs::File::open(path).map_err(ModelError::io(path))?;
    let mut bytes = Vec::new();
    file.take(MAX_BUNDLE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(ModelError::io(path))?;
    if bytes.len() > MAX_BUNDLE_BYTES {
        let size = std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len());
        return Err(ModelError::BundleTooLarge {
            size,
            limit: MAX_BUNDLE_BYTES,
        });
    }
    Ok(bytes)
}
