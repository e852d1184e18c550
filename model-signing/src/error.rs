//! What can go wrong while signing or verifying a model, each variant naming
//! the file, field or key at fault.

use std::fmt;
use std::path::PathBuf;

/// Every model-signing failure. Verification failures say what differs
/// (which file, which field, which key) so an operator can act on them.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A key file is not a key we can use (garbage, RSA, P-384, encrypted…).
    #[error("{0}")]
    Key(String),
    /// The model folder cannot be listed as model-signing lists it.
    #[error("{path}: {reason}")]
    Folder { path: String, reason: String },
    /// More of something than a manifest may hold.
    #[error("too many {what}: more than {limit}")]
    TooMany { what: &'static str, limit: usize },
    /// The signature file is larger than any manifest we accept.
    #[error("the signature bundle is {size} bytes; the limit is {limit}")]
    BundleTooLarge { size: u64, limit: usize },
    /// The bundle (JSON, base64, envelope) is not a model-signing bundle.
    #[error("malformed signature bundle: {0}")]
    MalformedBundle(String),
    /// The key's hint in the bundle names another key.
    #[error(
        "signature does not verify with the given key: the bundle was signed by \
         key sha256:{bundle_hint}, the given key is sha256:{key_hint}"
    )]
    KeyMismatch {
        bundle_hint: String,
        key_hint: String,
    },
    /// The DSSE signature is not valid for the given key.
    #[error("signature does not verify with the given key")]
    BadSignature,
    /// The signed statement is not a model-signing v1.0 manifest we accept.
    #[error("signed statement: {0}")]
    Statement(String),
    /// The subject digest does not cover the listed files.
    #[error(
        "signed statement: the subject digest is sha256:{signed}, but the listed \
         files hash to sha256:{computed}"
    )]
    SubjectMismatch { signed: String, computed: String },
    /// The folder's files differ from the signed manifest.
    #[error("the folder does not match the signature: {0}")]
    Mismatch(FolderDiff),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
        let path = path.into();
        move |source| ModelError::Io { path, source }
    }
}

/// How a folder differs from its signed manifest, by file name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FolderDiff {
    /// Files present in both whose content (SHA-256, size or chunk root) differs.
    pub changed: Vec<String>,
    /// Signed files the folder lacks (a renamed file shows here by its old
    /// name and under `unexpected` by its new one).
    pub missing: Vec<String>,
    /// Files in the folder the manifest does not list.
    pub unexpected: Vec<String>,
}

impl FolderDiff {
    /// No difference at all.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// At most this many names per kind in a message; the rest are counted.
const NAMES_SHOWN: usize = 20;

impl fmt::Display for FolderDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (label, names) in [
            ("content changed", &self.changed),
            ("missing", &self.missing),
            ("unexpected", &self.unexpected),
        ] {
            if names.is_empty() {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{label}: ")?;
            let shown = names.len().min(NAMES_SHOWN);
            for (i, name) in names[..shown].iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                // Debug quoting keeps odd names (spaces, control characters) legible.
                write!(f, "{name:?}")?;
            }
            if names.len() > shown {
                write!(f, " and {} more", names.len() - shown)?;
            }
        }
        Ok(())
    }
}
