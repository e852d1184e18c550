//! The signed payload: an in-toto Statement v1 with predicate type
//! `https://model_signing/signature/v1.0`, as model-signing 1.x writes it,
//! plus Bulkhead's chunk-root extension.
//!
//! ```text
//! { "_type": "https://in-toto.io/Statement/v1",
//!   "subject": [{"name": <folder name>, "digest": {"sha256": H}}],
//!   "predicateType": "https://model_signing/signature/v1.0",
//!   "predicate": {
//!     "resources": [{"name": "a/b.gguf", "algorithm": "sha256", "digest": <hex>}, …],
//!     "serialization": {"method": "files", "hash_type": "sha256",
//!                       "allow_symlinks": false, "ignore_paths": [...]},
//!     "bulkhead_chunks": {"chunk_size": 4194304, "tree": "rfc6962-sha256",
//!                         "files": [{"name", "size", "chunk_root"}, …]} } }
//! ```
//!
//! `H` is SHA-256 over the resources' raw 32-byte digests, concatenated in
//! the order listed (model-signing sorts them by path). model-signing's
//! verifier reads only `serialization` and `resources` from the predicate
//! and documents that v1.0 verifiers ignore any other predicate field, so
//! `bulkhead_chunks` sits there (an interop test checks it with their CLI).

use std::collections::HashMap;

use bulkhead_protocol::digest::{CHUNK_BYTES, Hash, from_hex, to_hex};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::walk::check_name;
use super::{MAX_FILES, MAX_IGNORE_PATHS, Manifest, ModelError, SignedFile};

pub(crate) const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub(crate) const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// The pre-1.0 predicate model-signing still verifies; we do not.
const PREDICATE_TYPE_V0_1: &str = "https://model_signing/Digests/v0.1";
/// The name of our extension field in the predicate.
pub(crate) const CHUNKS_FIELD: &str = "bulkhead_chunks";
/// The tree our chunk roots use (`bulkhead_protocol::digest`).
const CHUNK_TREE: &str = "rfc6962-sha256";

#[derive(Debug, Serialize, Deserialize)]
struct Statement {
    #[serde(rename = "_type")]
    statement_type: String,
    subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    predicate_type: String,
    predicate: Predicate,
}

#[derive(Debug, Serialize, Deserialize)]
struct Subject {
    name: String,
    digest: SubjectDigest,
}

/// in-toto allows several algorithms here; model-signing writes and reads
/// only `sha256`.
#[derive(Debug, Serialize, Deserialize)]
struct SubjectDigest {
    sha256: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Predicate {
    resources: Vec<Resource>,
    serialization: Serialization,
    #[serde(
        rename = "bulkhead_chunks",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    chunks: Option<Chunks>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Resource {
    name: String,
    algorithm: String,
    digest: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Serialization {
    method: String,
    hash_type: String,
    allow_symlinks: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ignore_paths: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Chunks {
    chunk_size: u64,
    tree: String,
    files: Vec<ChunkedFile>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ChunkedFile {
    name: String,
    size: u64,
    chunk_root: String,
}

/// SHA-256 over the 32-byte digests in order: the statement's subject digest.
pub(crate) fn subject_digest<'a>(digests: impl IntoIterator<Item = &'a Hash>) -> Hash {
    let mut h = Sha256::new();
    for digest in digests {
        h.update(digest);
    }
    h.finalize().into()
}

/// The statement for `manifest`, as JSON bytes (indented by two spaces, as
/// model-signing writes it; the bytes are what gets signed).
pub(crate) fn to_payload(manifest: &Manifest) -> Vec<u8> {
    let statement = Statement {
        statement_type: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: manifest.model_name.clone(),
            digest: SubjectDigest {
                sha256: to_hex(&manifest.subject_digest()),
            },
        }],
        predicate_type: PREDICATE_TYPE.into(),
        predicate: Predicate {
            resources: manifest
                .files
                .iter()
                .map(|f| Resource {
                    name: f.name.clone(),
                    algorithm: "sha256".into(),
                    digest: to_hex(&f.digest.sha256),
                })
                .collect(),
            serialization: Serialization {
                method: "files".into(),
                hash_type: "sha256".into(),
                allow_symlinks: false,
                ignore_paths: manifest.ignore_paths.clone(),
            },
            chunks: Some(Chunks {
                chunk_size: CHUNK_BYTES as u64,
                tree: CHUNK_TREE.into(),
                files: manifest
                    .files
                    .iter()
                    .map(|f| ChunkedFile {
                        name: f.name.clone(),
                        size: f.digest.size,
                        chunk_root: to_hex(&f.digest.chunk_root),
                    })
                    .collect(),
            }),
        },
    };
    // Plain structs of strings and numbers always serialize.
    serde_json::to_vec_pretty(&statement).unwrap_or_default()
}

/// What a checked statement says.
#[derive(Debug)]
pub(crate) struct Checked {
    pub model_name: String,
    pub subject_digest: Hash,
    pub files: Vec<SignedFile>,
    pub ignore_paths: Vec<String>,
}

fn bad(message: impl Into<String>) -> ModelError {
    ModelError::Statement(message.into())
}

/// Parses and checks a payload whose signature has verified: types, one
/// subject, `files` serialization with SHA-256, well-formed unique names,
/// the subject digest recomputed from the resources, and our extension (if
/// present) covering exactly the listed files. Unknown fields are ignored,
/// as model-signing ignores them.
pub(crate) fn check_payload(payload: &[u8]) -> Result<Checked, ModelError> {
    // serde_json does not check UTF-8 inside fields it skips; model-signing
    // (Python) refuses such a payload, so we do too.
    if std::str::from_utf8(payload).is_err() {
        return Err(bad("the statement is not UTF-8"));
    }
    let statement: Statement = serde_json::from_slice(payload)
        .map_err(|e| bad(format!("not a model-signing statement ({e})")))?;
    if statement.statement_type != STATEMENT_TYPE {
        return Err(bad(format!(
            "`_type` is {:?}, expected {STATEMENT_TYPE:?}",
            statement.statement_type
        )));
    }
    if statement.predicate_type != PREDICATE_TYPE {
        return Err(bad(if statement.predicate_type == PREDICATE_TYPE_V0_1 {
            format!(
                "predicate type {PREDICATE_TYPE_V0_1:?} is model-signing's pre-1.0 format; \
                 re-sign the model with a 1.x signer"
            )
        } else {
            format!(
                "`predicateType` is {:?}, expected {PREDICATE_TYPE:?}",
                statement.predicate_type
            )
        }));
    }
    let [subject] = &statement.subject[..] else {
        return Err(bad(format!(
            "{} subjects; a model signature has exactly one",
            statement.subject.len()
        )));
    };
    let signed_digest = from_hex(&subject.digest.sha256)
        .ok_or_else(|| bad("the subject's sha256 digest is not 64 hex digits"))?;
    let predicate = &statement.predicate;
    let serialization = &predicate.serialization;
    if serialization.method != "files" {
        return Err(bad(format!(
            "serialization method {:?} is not supported; sign with model-signing's default \
             `files` method",
            serialization.method
        )));
    }
    if serialization.hash_type != "sha256" {
        return Err(bad(format!(
            "hash type {:?} is not supported; only sha256 is",
            serialization.hash_type
        )));
    }
    if serialization.ignore_paths.len() > MAX_IGNORE_PATHS {
        return Err(ModelError::TooMany {
            what: "ignore paths in the statement",
            limit: MAX_IGNORE_PATHS,
        });
    }
    for path in &serialization.ignore_paths {
        check_name(path).map_err(|e| bad(format!("ignore path: {e}")))?;
    }
    if predicate.resources.len() > MAX_FILES {
        return Err(ModelError::TooMany {
            what: "files in the statement",
            limit: MAX_FILES,
        });
    }

    let mut files = Vec::with_capacity(predicate.resources.len());
    let mut index = HashMap::with_capacity(predicate.resources.len());
    for resource in &predicate.resources {
        check_name(&resource.name).map_err(|e| bad(format!("resource name: {e}")))?;
        if resource.algorithm != "sha256" {
            return Err(bad(format!(
                "{:?} is hashed with {:?}; only sha256 is supported",
                resource.name, resource.algorithm
            )));
        }
        let sha256 = from_hex(&resource.digest).ok_or_else(|| {
            bad(format!(
                "the digest of {:?} is not 64 hex digits",
                resource.name
            ))
        })?;
        if index.insert(resource.name.as_str(), files.len()).is_some() {
            return Err(bad(format!("{:?} is listed twice", resource.name)));
        }
        files.push(SignedFile {
            name: resource.name.clone(),
            sha256,
            size: None,
            chunk_root: None,
        });
    }

    let computed = subject_digest(files.iter().map(|f| &f.sha256));
    if computed != signed_digest {
        return Err(ModelError::SubjectMismatch {
            signed: to_hex(&signed_digest),
            computed: to_hex(&computed),
        });
    }

    if let Some(chunks) = &predicate.chunks {
        apply_chunks(chunks, &index, &mut files)?;
    }
    Ok(Checked {
        model_name: subject.name.clone(),
        subject_digest: signed_digest,
        files,
        ignore_paths: serialization.ignore_paths.clone(),
    })
}

/// Adds our extension's sizes and chunk roots to `files`; it must list
/// each file exactly once, with our chunk size and tree.
fn apply_chunks(
    chunks: &Chunks,
    index: &HashMap<&str, usize>,
    files: &mut [SignedFile],
) -> Result<(), ModelError> {
    let field = CHUNKS_FIELD;
    if chunks.chunk_size != CHUNK_BYTES as u64 {
        return Err(bad(format!(
            "`{field}.chunk_size` is {}, expected {CHUNK_BYTES}",
            chunks.chunk_size
        )));
    }
    if chunks.tree != CHUNK_TREE {
        return Err(bad(format!(
            "`{field}.tree` is {:?}, expected {CHUNK_TREE:?}",
            chunks.tree
        )));
    }
    if chunks.files.len() != files.len() {
        return Err(bad(format!(
            "`{field}` lists {} files, the resources {}",
            chunks.files.len(),
            files.len()
        )));
    }
    for chunked in &chunks.files {
        let Some(&i) = index.get(chunked.name.as_str()) else {
            return Err(bad(format!(
                "`{field}` lists {:?}, which is not a resource",
                chunked.name
            )));
        };
        let file = &mut files[i];
        if file.chunk_root.is_some() {
            return Err(bad(format!("`{field}` lists {:?} twice", chunked.name)));
        }
        file.chunk_root = Some(from_hex(&chunked.chunk_root).ok_or_else(|| {
            bad(format!(
                "the chunk root of {:?} is not 64 hex digits",
                chunked.name
            ))
        })?);
        file.size = Some(chunked.size);
    }
    Ok(())
}
