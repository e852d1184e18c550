//! A folder store's contents read whole, for copying into a shared store
//! (`bulkhead state migrate`): every entry with its blob re-hashed, and
//! every version floor. Nothing in the folder is changed; what cannot be
//! read is reported, never silently left out.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use super::disk;
use super::shared::{SharedEntry, VersionFloor};
use super::{LoadFailure, StoreError};
use crate::PluginDigest;

/// What [`read_file_store`] found.
#[derive(Clone, Debug, Default)]
pub struct FileStoreContents {
    /// Entries whose blob was read and hashes to their digest, sorted by
    /// tenant and name.
    pub entries: Vec<SharedEntry>,
    /// The blobs those entries name, each once.
    pub blobs: BTreeMap<PluginDigest, Vec<u8>>,
    /// The floors of deleted signed plugins, sorted.
    pub floors: Vec<VersionFloor>,
    /// Entries (and floors) that could not be read, with why: not in
    /// `entries` (or `floors`).
    pub failed: Vec<LoadFailure>,
}

/// Reads the folder store at `root` without changing it, holding its lock
/// meanwhile ([`StoreError::InUse`] while a gateway has it open). Blobs are
/// hashed again; an entry whose blob is missing, too large or altered goes
/// to [`FileStoreContents::failed`].
///
/// Blocks on disk.
pub fn read_file_store(root: &Path) -> Result<FileStoreContents, StoreError> {
    if !root.is_dir() {
        return Err(StoreError::Io {
            action: "reading",
            path: root.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotFound, "not a plugin store folder"),
        });
    }
    let _lock = disk::lock_existing(root)?;
    let (entries, mut failed) = disk::read_entries_in(root)?;
    let mut contents = FileStoreContents::default();
    let mut unreadable: BTreeMap<PluginDigest, String> = BTreeMap::new();
    for (tenant, name, meta) in entries {
        let digest = meta.digest;
        if !contents.blobs.contains_key(&digest) && !unreadable.contains_key(&digest) {
            match disk::read_blob_in(root, digest) {
                Ok(bytes) => {
                    contents.blobs.insert(digest, bytes);
                }
                Err(reason) => {
                    unreadable.insert(digest, reason);
                }
            }
        }
        match unreadable.get(&digest) {
            Some(reason) => failed.push(LoadFailure {
                tenant,
                name: name.to_string(),
                reason: reason.clone(),
            }),
            None => contents
                .entries
                .push(SharedEntry::from_meta(&tenant, &name, &meta)),
        }
    }
    let (floors, unreadable_floors) = disk::read_version_floors_in(root)?;
    contents.floors = floors;
    contents.floors.sort();
    failed.extend(unreadable_floors);
    contents.failed = failed;
    Ok(contents)
}
