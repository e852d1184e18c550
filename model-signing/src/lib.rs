//! Model signing and verification in the OpenSSF model-signing v1.0 format
//! (a Sigstore bundle holding a DSSE envelope over an in-toto Statement v1
//! whose predicate lists every file's SHA-256), interoperable with the
//! `model_signing` tool's key mode for ECDSA P-256 keys, plus Ed25519 keys
//! and a per-file chunk Merkle root as Bulkhead's extensions.
//!
//! ```text
//! folder ─walk, hash─▶ Manifest ─statement JSON─▶ payload ─DSSE PAE, sign─▶ bundle (signature file)
//! bundle ─limits, parse, verify signature─▶ payload ─check statement─▶ VerifiedManifest ─compare─▶ folder
//! ```
//!
//! Format notes and how the reference tool behaves: `docs/model-signing.md`.

#![forbid(unsafe_code)]

mod bundle;
mod error;
mod hash;
mod keys;
mod manifest;
mod statement;
mod verify;
mod walk;

#[cfg(test)]
mod tests;

pub use error::{FolderDiff, ModelError};
pub use keys::{KeyKind, MAX_KEY_FILE_BYTES, PublicKey, SigningKey};
pub use manifest::{DirOptions, Manifest, ManifestFile};
pub use verify::{SignedFile, VerifiedManifest, read_bundle_file, verify_bundle, verify_dir};
pub use walk::DEFAULT_IGNORED;

/// Largest signature file accepted. A manifest of [`MAX_FILES`] files with
/// long names is about 2 MiB of JSON, base64 makes it 3; 16 MiB leaves room
/// without letting a hostile file cost much.
pub const MAX_BUNDLE_BYTES: usize = 16 << 20;

/// Most files in a model folder or a manifest. Models are a handful of
/// weight shards plus tokenizer and config files; thousands means a wrong
/// folder (a home directory, a dataset).
pub const MAX_FILES: usize = 4096;

/// Longest file path relative to the model folder, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Deepest folder nesting walked below the model folder.
pub const MAX_FOLDER_DEPTH: usize = 32;

/// Most ignore paths a statement may carry (model-signing writes its five
/// defaults plus what the signer asked for).
pub const MAX_IGNORE_PATHS: usize = 256;
