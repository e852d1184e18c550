//! The contract of a shared plugin store: entries and blobs kept outside
//! this process (the state database, `bulkhead-state`'s `PgPlugins`), one
//! copy for every gateway replica. [`super::PluginRegistry::open_shared`]
//! reads it into the index the request path reads, and writes through it.
//!
//! The store keeps what the folder store keeps, and decides what the folder
//! store decides, each change in one transaction: the per-tenant cap
//! ([`MAX_PLUGINS_PER_TENANT`](super::MAX_PLUGINS_PER_TENANT)), the signed versions and the floors of
//! deleted signed plugins ([`MAX_VERSION_FLOORS_PER_TENANT`](super::MAX_VERSION_FLOORS_PER_TENANT)), blobs shared
//! by digest and removed with their last entry. It is not trusted with the
//! bytes: a replica re-hashes every blob it reads against its digest and
//! refuses one that does not match.

use std::fmt;

use super::{EntryMeta, LoadFailure, PluginName, StoreError, UploadOutcome};
use crate::PluginDigest;

/// One tenant's plugin `name` as a shared store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedEntry {
    pub tenant: String,
    pub name: PluginName,
    /// SHA-256 of the uploaded bytes: the blob it names.
    pub digest: PluginDigest,
    pub size_bytes: u64,
    /// When this version was uploaded, in Unix seconds.
    pub created_at: u64,
    /// The `sub` of the token that uploaded it (at most 256 bytes).
    pub uploaded_by: Option<String>,
    /// The signed version; `None`: unsigned.
    pub version: Option<u64>,
}

impl SharedEntry {
    pub(super) fn meta(&self) -> EntryMeta {
        EntryMeta {
            digest: self.digest,
            size_bytes: self.size_bytes,
            created_at: self.created_at,
            uploaded_by: self.uploaded_by.clone(),
            version: self.version,
        }
    }

    pub(super) fn from_meta(tenant: &str, name: &PluginName, meta: &EntryMeta) -> SharedEntry {
        SharedEntry {
            tenant: tenant.to_string(),
            name: name.clone(),
            digest: meta.digest,
            size_bytes: meta.size_bytes,
            created_at: meta.created_at,
            uploaded_by: meta.uploaded_by.clone(),
            version: meta.version,
        }
    }
}

/// The highest signed version a tenant's deleted plugin had: an upload
/// under that name must be signed with a higher one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VersionFloor {
    pub tenant: String,
    pub name: PluginName,
    pub version: u64,
}

/// What a shared store holds (of one tenant, or of all).
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Sorted by tenant, then name.
    pub entries: Vec<SharedEntry>,
    /// Rows that are not valid entries (a bad name or digest): reported,
    /// not served.
    pub unreadable: Vec<LoadFailure>,
}

/// A blob as read from a shared store, before it is re-hashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredBlob {
    Bytes(Vec<u8>),
    /// No blob under this digest.
    Missing,
    /// Over [`crate::MAX_COMPONENT_BYTES`]: not read.
    TooLarge {
        size_bytes: u64,
    },
}

/// What an upload asks a shared store to commit.
#[derive(Clone, Copy, Debug)]
pub struct SharedPut<'a> {
    /// The new entry: `created_at` now, `version` the one offered.
    pub entry: &'a SharedEntry,
    /// The uploaded bytes; `entry.digest` is their SHA-256.
    pub bytes: &'a [u8],
}

/// A store of entries and blobs that gateway replicas share. Every method
/// blocks (call it from a blocking thread) and says
/// [`StoreError::Unavailable`] when the store cannot be reached, having
/// changed nothing.
pub trait SharedPlugins: Send + Sync + fmt::Debug {
    /// Where the store is, for logs and errors.
    fn place(&self) -> &str;

    /// Every entry, or `tenant`'s only.
    fn entries(&self, tenant: Option<&str>) -> Result<Listing, StoreError>;

    /// The bytes stored under `digest`, as stored.
    fn blob(&self, digest: PluginDigest) -> Result<StoredBlob, StoreError>;

    /// In one transaction, serialized per tenant across replicas:
    /// - the version check: an offered version must be above the name's
    ///   stored one, or above its floor when the name has no entry
    ///   ([`StoreError::VersionNotNewer`]);
    /// - [`UploadOutcome::Unchanged`] when the name already holds these
    ///   bytes (and the upload offers no new version), writing nothing
    ///   unless the stored blob had to be repaired;
    /// - the cap: a new name beyond [`MAX_PLUGINS_PER_TENANT`](super::MAX_PLUGINS_PER_TENANT) is
    ///   [`StoreError::TooManyPlugins`];
    /// - the blob stored (or repaired: a stored blob with other bytes under
    ///   this digest is overwritten), the entry written, the name's floor
    ///   forgotten when a signed entry takes a free name, the previous
    ///   blob removed if no entry refers to it any more, and every replica
    ///   told.
    ///
    /// Returns the outcome and the entry now stored (for `Unchanged`, the
    /// one that was there).
    fn put(&self, put: SharedPut<'_>) -> Result<(UploadOutcome, SharedEntry), StoreError>;

    /// In one transaction, serialized per tenant: removes `tenant`'s entry
    /// `name` ([`StoreError::NotFound`] when there is none), keeping its
    /// signed version as the name's floor (at most
    /// [`MAX_VERSION_FLOORS_PER_TENANT`](super::MAX_VERSION_FLOORS_PER_TENANT) per tenant, else
    /// [`StoreError::TooManyVersionFloors`] and nothing is deleted), removes
    /// its blob if no other entry refers to it, and tells every replica.
    /// Returns the entry removed.
    fn delete(&self, tenant: &str, name: &PluginName) -> Result<SharedEntry, StoreError>;
}
