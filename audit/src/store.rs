//! Where an audit log keeps its entries and checkpoints: a folder on one
//! machine ([`FileStore`], the default) or a database that several gateway
//! replicas append to (`bulkhead-state`'s PostgreSQL store).
//!
//! The log ([`AuditLog`](crate::AuditLog)) keeps the Merkle tree in memory,
//! builds and signs; a store only keeps bytes, and is never trusted with
//! the tree: every entry it hands back has its leaf hash checked against
//! its bytes (by the store, as it reads) and the tree it makes checked
//! against the signed checkpoints (by the log).

use std::fmt;

use super::AuditError;
use super::merkle::Hash;

mod files;

pub use files::FileStore;

/// One stored entry: its index, its bytes as hashed, and its leaf hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub index: u64,
    pub entry: Vec<u8>,
    pub leaf: Hash,
}

/// The entries a writer makes once it knows where they go: each entry's
/// bytes (carrying its own index) and leaf hash, for indexes `first..`.
pub type Build<'a> = dyn FnMut(u64) -> Vec<(Vec<u8>, Hash)> + 'a;

/// Storage for one audit log. Calls block (file I/O, a database round
/// trip); the log calls them on blocking threads.
pub trait Store: Send + Sync + fmt::Debug {
    /// Where the log is, for messages: a folder, or a database schema.
    fn place(&self) -> &str;

    /// Entries from `from` on, in order. Each leaf is checked against its
    /// bytes and indexes run on without a gap, or this fails naming the
    /// entry.
    fn scan(&self, from: u64, each: &mut dyn FnMut(Stored)) -> Result<(), AuditError>;

    /// Appends, durably. With the store's write lock held it learns the
    /// stored size `first`, hands over the entries `known..first` other
    /// writers appended (`others`; a single-writer store has none), calls
    /// `build(first)` and writes what it returns. Returns `first`. When
    /// this returns an error nothing of `build`'s was stored.
    fn append(
        &self,
        known: u64,
        others: &mut dyn FnMut(Stored),
        build: &mut Build<'_>,
    ) -> Result<u64, AuditError>;

    /// The stored bytes of entries `from..to` (the log checks each against
    /// its leaf).
    fn read(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, AuditError>;

    /// The latest stored checkpoint (a signed note, not yet verified).
    fn latest_checkpoint(&self) -> Result<Option<String>, AuditError>;

    /// Keeps a signed checkpoint of the first `size` entries. A shared
    /// store keeps every one; a checkpoint of the same size already kept
    /// with another text is an error (two signers disagree).
    fn keep_checkpoint(&self, size: u64, note: &str) -> Result<(), AuditError>;

    /// Whether other processes append to this store too (so the log
    /// [`sync`](crate::AuditLog::sync)s before it answers).
    fn is_shared(&self) -> bool {
        false
    }

    /// Bytes the entries take, where that is cheap to know.
    fn bytes(&self) -> Option<u64> {
        None
    }

    /// Why the store takes no more entries, when it stopped for good.
    fn failure(&self) -> Option<String> {
        None
    }

    /// Test hook of [`FileStore`]: write batches in pieces (a no-op
    /// elsewhere).
    #[doc(hidden)]
    fn split_writes(&self, _bytes: usize) {}
}

#[cfg(test)]
mod tests;
