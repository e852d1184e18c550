//! The log folder's small files: created 0600 in a 0700 folder, replaced
//! by temp file + fsync + rename + fsync of the folder, so a crash leaves
//! the old file or the new one.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::AuditError;

/// Creates `dir` (and missing parents) 0700; warns when an existing one is
/// open to other users.
pub(crate) fn make_dir(dir: &Path) -> Result<(), AuditError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(AuditError::io("creating", dir))?;
    let mode = fs::metadata(dir)
        .map_err(AuditError::io("reading", dir))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            dir = %dir.display(),
            mode = format_args!("{:o}", mode & 0o777),
            "the audit log folder is open to other users; 0700 is expected"
        );
    }
    Ok(())
}

/// Fsyncs a folder, so a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), AuditError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(AuditError::io("syncing", dir))
}

/// Replaces `path` with `bytes` atomically (0600).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AuditError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let temp = dir.join(format!(".tmp-{name}"));
    let written = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
    written.map_err(AuditError::io("writing", &temp))?;
    fs::rename(&temp, path).map_err(AuditError::io("renaming", path))?;
    sync_dir(dir)
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
