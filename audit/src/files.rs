//! The log folder's small files: created 0600 in a 0700 folder, replaced
//! by temp file + fsync + rename + fsync of the folder, so a crash leaves
//! the old file or the new one.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::AuditError;

/// Creates `dir` (and missing parents) 0700; warns when an existing one is
/// open to other users.
pub(crate) fn make_dir(dir: &Path) -> Result<(), AuditError> {
    bulkhead_durable::private_dir(dir, "the audit log folder")
        .map_err(|(action, e)| AuditError::io(action, dir)(e))
}

/// Replaces `path` with `bytes` atomically (0600).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AuditError> {
    bulkhead_durable::write_atomic(path, bytes).map_err(AuditError::io("writing", path))
}

/// A file's contents up to `limit` bytes; `None` when it does not exist.
pub(crate) fn read_small(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, AuditError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(AuditError::io("opening", path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(AuditError::io("reading", path))?;
    if bytes.len() as u64 > limit {
        return Err(AuditError::io("reading", path)(io::Error::other(format!(
            "larger than {limit} bytes"
        ))));
    }
    Ok(Some(bytes))
}
