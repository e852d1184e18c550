//! Crash-safe small-file writes shared by the control plane's stores (the
//! plugin store, the model registry, the audit log's checkpoint and keys).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Names of half-written files; stores skip (and may remove) them.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// Replaces `path` with `bytes` (mode 0600) so that a crash leaves either
/// the old file or the new one: a temp file in the same folder (a name no
/// other writer in this process uses), fsync, rename, fsync the folder.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(
        "{TEMP_PREFIX}{}-{}-{file_name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Fsyncs a folder, so a file created, renamed or removed in it survives a
/// crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn replaces_the_file_privately_and_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!("bulkhead-durable-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("record.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
        // A folder that does not exist: an error, nothing created.
        assert!(write_atomic(&dir.join("missing/x"), b"x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
