//! The offline check behind `bulkhead audit verify`: reads a log folder
//! without writing to it and checks, in order, the framing of every record,
//! that every entry parses, is canonical and carries its own index (so a
//! deleted, inserted or moved entry shows), that the log has every entry
//! the checkpoint covers and hashes to its root, and the checkpoint's
//! signature. The first failure is reported, naming the entry when one is
//! at fault.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::entry::Entry;
use super::frame::{self, FrameError, Record};
use super::merkle::Tree;
use super::note::{
    Checkpoint, MAX_NOTE_BYTES, NoteVerifier, open_checkpoint, unverified_checkpoint,
};
use super::{CHECKPOINT_FILE, ENTRIES_FILE, VKEY_FILE, read_verifier};

/// What to check a log folder against.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// A signed checkpoint; default `DIR/checkpoint`.
    pub checkpoint: Option<PathBuf>,
    /// The public key (SPKI PEM or vkey); default `DIR/audit.vkey`, which
    /// proves only that the folder agrees with itself.
    pub key: Option<PathBuf>,
}

/// A log that passed.
#[derive(Clone, Debug)]
pub struct Verified {
    /// Entries in the log.
    pub entries: u64,
    /// The checkpoint it was checked against.
    pub checkpoint: Checkpoint,
    /// The key file that checked the signature.
    pub key: PathBuf,
    /// Whether that key came from the log folder itself.
    pub key_from_log_dir: bool,
}

/// Why a log failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// An entry is at fault: the first one found.
    #[error("entry {index}: {why}")]
    Entry { index: u64, why: String },
    /// The log as a whole, its checkpoint or its key.
    #[error("{0}")]
    Log(String),
}

/// Verifies the log in `dir`.
pub fn verify_log(dir: &Path, options: &VerifyOptions) -> Result<Verified, VerifyError> {
    verify_log_each(dir, options, &mut |_| {})
}

/// [`verify_log`], handing every record to `each` as it is checked (framed,
/// hashed, a valid entry carrying its own index): a copy of the log that
/// counts only once this returns `Ok` (`bulkhead state migrate`).
pub fn verify_log_each(
    dir: &Path,
    options: &VerifyOptions,
    each: &mut dyn FnMut(&Record<'_>),
) -> Result<Verified, VerifyError> {
    let path = dir.join(ENTRIES_FILE);
    let file = File::open(&path)
        .map_err(|e| VerifyError::Log(format!("opening {}: {e}", path.display())))?;
    let len = file
        .metadata()
        .map_err(|e| VerifyError::Log(format!("reading {}: {e}", path.display())))?
        .len();
    let mut tree = Tree::new();
    let scanned = frame::scan::<VerifyError>(
        &mut BufReader::with_capacity(1 << 20, file),
        len,
        |record| {
            check_entry(record.index, record.entry)?;
            tree.push(record.leaf);
            each(&record);
            Ok(())
        },
    )?;
    if let Some(torn) = scanned.torn {
        return Err(VerifyError::Entry {
            index: scanned.count,
            why: format!(
                "the last {} bytes are not a whole record ({}): a torn tail from a crash, \
                 which `bulkhead serve` cuts at its next start, or damage to the last entry",
                torn.bytes, torn.why
            ),
        });
    }

    let checkpoint_path = options
        .checkpoint
        .clone()
        .unwrap_or_else(|| dir.join(CHECKPOINT_FILE));
    let note = read_text(&checkpoint_path)?;
    let claimed = unverified_checkpoint(&note).map_err(|e| {
        VerifyError::Log(format!("the checkpoint {}: {e}", checkpoint_path.display()))
    })?;
    let (key_path, key_from_log_dir) = match &options.key {
        Some(key) => (key.clone(), false),
        None => (dir.join(VKEY_FILE), true),
    };
    let verifier =
        read_verifier(&key_path, &claimed.origin).map_err(|e| VerifyError::Log(e.to_string()))?;
    let checkpoint = check_tree(
        &tree,
        &note,
        &checkpoint_path.display().to_string(),
        &verifier,
        &key_path.display().to_string(),
    )?;
    Ok(Verified {
        entries: tree.size(),
        checkpoint,
        key: key_path,
        key_from_log_dir,
    })
}

/// Checks one entry as stored at position `index`: it parses, is canonical
/// and carries its own index (so a deleted, inserted or moved entry shows).
pub fn check_entry(index: u64, bytes: &[u8]) -> Result<(), VerifyError> {
    let entry = Entry::from_bytes(bytes).map_err(|why| VerifyError::Entry {
        index,
        why: format!("not a valid audit entry: {why}"),
    })?;
    if entry.index != index {
        return Err(VerifyError::Entry {
            index,
            why: format!(
                "the entry in position {index} says it is entry {}: an entry was deleted, \
                 inserted or moved",
                entry.index
            ),
        });
    }
    Ok(())
}

/// Checks the tree of every entry against a signed checkpoint (`note`,
/// read from `note_place`): its signature under `verifier` (from
/// `key_place`), that the log has every entry it covers, and that those
/// hash to its root.
pub fn check_tree(
    tree: &Tree,
    note: &str,
    note_place: &str,
    verifier: &NoteVerifier,
    key_place: &str,
) -> Result<Checkpoint, VerifyError> {
    let checkpoint = open_checkpoint(note, verifier).map_err(|e| {
        VerifyError::Log(format!(
            "the checkpoint {note_place} does not verify with {key_place}: {e}"
        ))
    })?;
    if checkpoint.size > tree.size() {
        return Err(VerifyError::Entry {
            index: tree.size(),
            why: format!(
                "missing: the checkpoint covers {} entries and the log holds {} (entries were \
                 removed from its end, or the log was rolled back)",
                checkpoint.size,
                tree.size()
            ),
        });
    }
    let root = tree
        .root(checkpoint.size)
        .map_err(|e| VerifyError::Log(e.to_string()))?;
    if root != checkpoint.root {
        return Err(VerifyError::Log(format!(
            "the first {} entries do not hash to the checkpoint's root: an entry was altered \
             and its checksum recomputed (checking older checkpoints narrows down which)",
            checkpoint.size
        )));
    }
    Ok(checkpoint)
}

impl From<FrameError> for VerifyError {
    fn from(e: FrameError) -> VerifyError {
        match e {
            FrameError::Corrupt { index, offset, why } => VerifyError::Entry {
                index,
                why: format!("damaged at byte {offset} of the file: {why}"),
            },
            other => VerifyError::Log(other.to_string()),
        }
    }
}

/// A checkpoint file's text (bounded).
pub fn read_text(path: &Path) -> Result<String, VerifyError> {
    let bytes = std::fs::read(path)
        .map_err(|e| VerifyError::Log(format!("reading the checkpoint {}: {e}", path.display())))?;
    if bytes.len() > MAX_NOTE_BYTES {
        return Err(VerifyError::Log(format!(
            "the checkpoint {} is larger than a note may be",
            path.display()
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| VerifyError::Log(format!("the checkpoint {} is not text", path.display())))
}
