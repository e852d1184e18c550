//! The tamper-evident audit log: control-plane actions (plugin uploads,
//! policy reloads, gateway starts, …) appended to an fsync'd file, hashed
//! into an RFC 9162 Merkle tree, with signed checkpoints in the C2SP
//! signed-note format and inclusion and consistency proofs.
//!
//! - [`AuditLog`] (`log.rs`): open (scan, check the stored checkpoint),
//!   append (group commit: one durable write per batch, acknowledged only
//!   after it), checkpoints, entries and proofs for the API.
//! - [`store`]: where entries and checkpoints are kept: [`FileStore`] (a
//!   folder; cuts a torn tail at open), or a shared database through the
//!   [`Store`] trait (`bulkhead-state`).
//! - [`entry`]: the JSON schema of entries; [`frame`]: the record format;
//!   [`merkle`]: tree and proofs; [`note`]: checkpoints and keys;
//!   [`verify`]: the offline check behind `bulkhead audit verify`.
//!
//! The file format, the schema and how to verify are in `docs/audit-log.md`.

#![forbid(unsafe_code)]

pub mod entry;
mod files;
pub mod frame;
mod handle;
mod key;
mod log;
pub mod merkle;
pub mod note;
pub mod store;
pub mod time;
pub mod verify;

use std::io;
use std::path::{Path, PathBuf};

pub use entry::{Actor, Entry, Event, FileDigest, Outcome, file_digests, sha256_text};
pub use handle::Audit;
pub use key::{KEY_FILE, PUBLIC_KEY_FILE, VKEY_FILE, read_signing_key, read_verifier};
pub use log::{
    AuditLog, AuditSettings, CHECKPOINT_FILE, DEFAULT_ORIGIN, ENTRIES_FILE, MAX_BATCH_ENTRIES,
    OpenReport, valid_origin,
};
pub use merkle::{Hash, ProofError};
pub use note::{Checkpoint, NoteError, NoteVerifier};
pub use store::{FileStore, Store, Stored};

/// Why the audit log could not be opened, written or read.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the audit log {} is damaged: {source}", path.display())]
    Frame {
        path: PathBuf,
        source: frame::FrameError,
    },
    #[error("the audit key {}: {why}", path.display())]
    Key { path: PathBuf, why: String },
    #[error("the audit settings: {0}")]
    Config(String),
    #[error("the audit log {} is open in another process (its `lock` is held)", dir.display())]
    InUse { dir: PathBuf },
    #[error("the stored checkpoint of the audit log in {place}: {why}")]
    Checkpoint { place: String, why: String },
    #[error(
        "the audit log in {place} has {log_size} entries but its signed checkpoint covers \
         {checkpoint_size}: entries were removed (a truncated, rolled-back or replaced log); \
         refusing to start. Restore it from a backup; `bulkhead audit verify` names what is \
         missing"
    )]
    RolledBack {
        place: String,
        checkpoint_size: u64,
        log_size: u64,
    },
    #[error(
        "the first {size} entries of the audit log in {place} do not hash to its signed \
         checkpoint's root: the log was altered; refusing to start"
    )]
    Diverged { place: String, size: u64 },
    #[error("the audit log in {place}, entry {index}: {why}")]
    Damaged {
        place: String,
        index: u64,
        why: String,
    },
    #[error("the audit log's store is unavailable ({0}); try again when it is back")]
    Unavailable(String),
    #[error("an audit entry of {bytes} bytes is larger than the {max} bytes allowed")]
    EntryTooLarge { bytes: usize, max: usize },
    #[error(
        "the audit log failed to write ({0}) and takes no more entries until the gateway \
         restarts (the restart checks and repairs the file)"
    )]
    Failed(String),
    #[error(
        "refusing to sign checkpoint {size}: the tree does not extend the last signed one (a bug)"
    )]
    Inconsistent { size: u64 },
    #[error(transparent)]
    Proof(#[from] ProofError),
}

impl AuditError {
    /// An `Io` error about `path` while doing `action`.
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> AuditError {
        let path = path.to_path_buf();
        move |source| AuditError::Io {
            action,
            path,
            source,
        }
    }
}

#[cfg(test)]
mod tests;
