//! A model folder's manifest (every file's digest) and signing it.

use std::path::{Path, PathBuf};

use bulkhead_protocol::digest::{FileDigest, Hash};

use super::hash::digest_file;
use super::walk::{Ignored, list_files, name_inside};
use super::{ModelError, SigningKey, bundle, statement};

/// Every file of a model folder with its digests, in manifest order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The folder's own name (informative only: renaming the folder keeps
    /// the signature valid, as in model-signing).
    pub model_name: String,
    /// The files, sorted as model-signing sorts them.
    pub files: Vec<ManifestFile>,
    /// Paths left out, relative to the folder (recorded in the statement so
    /// a verifier leaves them out too).
    pub ignore_paths: Vec<String>,
}

/// One file of a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// Its path relative to the folder, `/`-separated.
    pub name: String,
    /// Size, SHA-256 and chunk root.
    pub digest: FileDigest,
}

/// What to leave out of a folder besides model-signing's defaults
/// (`.git`, `.gitattributes`, `.github`, `.gitignore` at the top).
#[derive(Debug, Clone, Default)]
pub struct DirOptions {
    /// Paths (absolute or relative to the current directory) to leave out
    /// when they lie inside the folder — above all the signature file, as
    /// model-signing's CLI leaves out its `--signature` path.
    pub ignore: Vec<PathBuf>,
}

impl DirOptions {
    /// The options that leave out `signature` (when it is inside the folder).
    pub fn with_signature(signature: &Path) -> DirOptions {
        DirOptions {
            ignore: vec![signature.to_path_buf()],
        }
    }

    pub(crate) fn ignored(&self, folder: &Path) -> Ignored {
        Ignored::with_defaults(self.ignore.iter().filter_map(|p| name_inside(folder, p)))
    }
}

impl Manifest {
    /// Lists and hashes every file of `folder`.
    pub fn of_dir(folder: &Path, options: &DirOptions) -> Result<Manifest, ModelError> {
        let ignored = options.ignored(folder);
        let files = list_files(folder, &ignored)?
            .into_iter()
            .map(|file| {
                Ok(ManifestFile {
                    digest: digest_file(&file.path)?,
                    name: file.name,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Manifest {
            model_name: folder_name(folder),
            files,
            ignore_paths: ignored.sorted(),
        })
    }

    /// SHA-256 over the files' SHA-256 digests in order: the statement's
    /// subject digest, which names the model as a whole.
    pub fn subject_digest(&self) -> Hash {
        statement::subject_digest(self.files.iter().map(|f| &f.digest.sha256))
    }

    /// Signs the manifest: the bundle's JSON bytes, to be written as the
    /// signature file.
    pub fn sign(&self, key: &SigningKey) -> Vec<u8> {
        bundle::seal(&statement::to_payload(self), key)
    }
}

/// The last component of the folder's path, as model-signing names the
/// subject (resolving `.` and `..` to the real name).
fn folder_name(folder: &Path) -> String {
    let name = match folder.file_name() {
        Some(name) => Some(name.to_os_string()),
        None => std::fs::canonicalize(folder)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_os_string())),
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
