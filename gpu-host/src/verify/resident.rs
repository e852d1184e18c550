//! Loading a model file into host-owned memory, hashing it on the way in.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bulkhead_protocol::digest::{CHUNK_BYTES, Hash, chunk_count, merkle_root, to_hex};
use memmap2::{Mmap, MmapMut};
use sha2::{Digest as _, Sha256};

/// What a registration says the file must be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// Length in bytes.
    pub size: u64,
    /// The 4 MiB chunk root (our manifests carry it; checked in parallel).
    pub chunk_root: Option<Hash>,
    /// The whole-file SHA-256 (every manifest has it; checked when there is
    /// no chunk root, at the cost of a second, sequential pass).
    pub sha256: Option<Hash>,
}

/// A model file resident in memory, with the chunk hashes it was verified by.
#[derive(Debug)]
pub struct ResidentFile {
    /// The bytes, read-only once loaded.
    pub map: Mmap,
    /// The leaf hash of every chunk, in order: what the scrub compares against.
    pub leaves: Vec<Hash>,
    /// The Merkle root over `leaves`.
    pub chunk_root: Hash,
    /// When every byte was last checked (now: at load).
    pub verified_at: SystemTime,
    /// Whether the bytes were checked against a registration (`Expected`) or
    /// only hashed (a model given on the command line).
    pub registered: bool,
}

/// Why a file could not be loaded, or did not match its registration.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
    #[error("{} is {actual} bytes but was registered as {expected} bytes", path.display())]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{} does not match its registration: chunk root {actual}, registered {expected}",
        path.display()
    )]
    ChunkRootMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error(
        "{} does not match its registration: SHA-256 {actual}, registered {expected}",
        path.display()
    )]
    Sha256Mismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{} changed size while it was being read", .0.display())]
    Truncated(PathBuf),
}

/// Reads `path` into fresh anonymous memory, `CHUNK_BYTES` at a time on all
/// cores, hashing each chunk while it is still in cache (every byte is read
/// and hashed once), and checks it against `expected` when given.
///
/// The copy is what gets served: editing or replacing the file afterwards
/// changes nothing resident, and the scrub re-checks exactly these bytes.
pub fn load_resident(path: &Path, expected: Option<&Expected>) -> Result<ResidentFile, LoadError> {
    use rayon::prelude::*;
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if let Some(expected) = expected
        && expected.size != len
    {
        return Err(LoadError::SizeMismatch {
            path: path.to_path_buf(),
            expected: expected.size,
            actual: len,
        });
    }
    if len == 0 {
        return Err(LoadError::Empty(path.to_path_buf()));
    }
    let size = usize::try_from(len).map_err(|_| io(std::io::ErrorKind::FileTooLarge.into()))?;
    let mut map = MmapMut::map_anon(size).map_err(io)?;
    let leaves = map
        .par_chunks_mut(CHUNK_BYTES)
        .enumerate()
        .map(|(i, chunk)| {
            let offset = (i * CHUNK_BYTES) as u64;
            file.read_exact_at(chunk, offset).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    LoadError::Truncated(path.to_path_buf())
                } else {
                    io(e)
                }
            })?;
            Ok(bulkhead_protocol::digest::leaf_hash(chunk))
        })
        .collect::<Result<Vec<Hash>, LoadError>>()?;
    debug_assert_eq!(leaves.len() as u64, chunk_count(len));
    let chunk_root = merkle_root(&leaves);
    if let Some(expected) = expected {
        check(path, expected, &map, &chunk_root)?;
    }
    Ok(ResidentFile {
        map: map.make_read_only().map_err(io)?,
        leaves,
        chunk_root,
        verified_at: SystemTime::now(),
        registered: expected.is_some(),
    })
}

fn check(
    path: &Path,
    expected: &Expected,
    bytes: &[u8],
    chunk_root: &Hash,
) -> Result<(), LoadError> {
    match (expected.chunk_root, expected.sha256) {
        (Some(want), _) if want != *chunk_root => Err(LoadError::ChunkRootMismatch {
            path: path.to_path_buf(),
            expected: to_hex(&want),
            actual: to_hex(chunk_root),
        }),
        (Some(_), _) => Ok(()),
        (None, Some(want)) => {
            let actual: Hash = Sha256::digest(bytes).into();
            if actual == want {
                Ok(())
            } else {
                Err(LoadError::Sha256Mismatch {
                    path: path.to_path_buf(),
                    expected: to_hex(&want),
                    actual: to_hex(&actual),
                })
            }
        }
        // A registration that names no digest at all is refused upstream;
        // nothing to compare here.
        (None, None) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_protocol::digest::FileDigest;

    fn file_with(bytes: &[u8]) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 253) as u8).collect()
    }

    #[test]
    fn resident_copy_matches_the_file_and_its_digest() {
        let bytes = sample(CHUNK_BYTES * 2 + 5);
        let (_dir, path) = file_with(&bytes);
        let digest = FileDigest::of(&bytes);
        let expected = Expected {
            size: digest.size,
            chunk_root: Some(digest.chunk_root),
            sha256: Some(digest.sha256),
        };
        let resident = load_resident(&path, Some(&expected)).unwrap();
        assert_eq!(&resident.map[..], &bytes[..]);
        assert_eq!(resident.leaves.len(), 3);
        assert_eq!(resident.chunk_root, digest.chunk_root);
        assert!(resident.registered);

        // Only the whole-file hash (a manifest from the reference signer).
        let expected = Expected {
            chunk_root: None,
            ..expected
        };
        assert!(load_resident(&path, Some(&expected)).is_ok());
    }

    #[test]
    fn one_flipped_byte_is_refused_naming_the_file() {
        let mut bytes = sample(CHUNK_BYTES + 100);
        let digest = FileDigest::of(&bytes);
        bytes[CHUNK_BYTES + 3] ^= 0x10;
        let (_dir, path) = file_with(&bytes);
        let expected = Expected {
            size: digest.size,
            chunk_root: Some(digest.chunk_root),
            sha256: Some(digest.sha256),
        };
        let err = load_resident(&path, Some(&expected)).unwrap_err();
        assert!(matches!(err, LoadError::ChunkRootMismatch { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("model.gguf does not match its registration")
        );

        let sha_only = Expected {
            chunk_root: None,
            ..expected.clone()
        };
        let err = load_resident(&path, Some(&sha_only)).unwrap_err();
        assert!(matches!(err, LoadError::Sha256Mismatch { .. }), "{err}");

        let wrong_size = Expected {
            size: digest.size + 1,
            ..expected
        };
        let err = load_resident(&path, Some(&wrong_size)).unwrap_err();
        assert!(err.to_string().contains("registered as"), "{err}");
    }

    #[test]
    fn missing_and_empty_files_are_clear_errors() {
        let (_dir, path) = file_with(b"");
        assert!(matches!(
            load_resident(&path, None),
            Err(LoadError::Empty(_))
        ));
        let missing = path.with_file_name("nope.gguf");
        let err = load_resident(&missing, None).unwrap_err();
        assert!(err.to_string().contains("nope.gguf"), "{err}");
    }

    /// A scratch folder removed on drop (the crate has no tempfile dependency).
    mod tempdir {
        use std::path::{Path, PathBuf};
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let path = std::env::temp_dir().join(format!(
                    "bulkhead-resident-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }

            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
