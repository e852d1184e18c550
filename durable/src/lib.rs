//! What the control plane's stores (the plugin store, the model registry,
//! the audit log) share about their folders: crash-safe small-file writes,
//! a private (0700) folder, and the lock that keeps a second process out.

#![forbid(unsafe_code)]

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Names of half-written files; stores skip (and may remove) them.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Replaces `path` with `bytes` (mode 0600) so that a crash leaves either
/// the old file or the new one: a temp file in the same folder (a name no
/// other writer in this process uses), fsync, rename, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(
        "{TEMP_PREFIX}{}-{}-{file_name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    write_via(&temp, path, bytes)?;
    sync_dir(dir)
}

/// [`write_atomic`]'s steps through the temp file `temp`.
fn write_via(temp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(temp)
    };
    let written = (|| {
        let mut file = match create() {
            // Left by a process killed mid-write that had this PID: PIDs
            // are reused, and in a container every start is PID 1. No live
            // writer can hold the name (it is ours in this process), so
            // the file is stale.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(temp)?;
                create()?
            }
            opened => opened?,
        };
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(temp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(temp);
        return Err(e);
    }
    Ok(())
}

/// Removes the temp files an interrupted [`write_atomic`] left in `dir`
/// (call it with the folder's lock held) and says how many it removed.
/// `Err` names the step that failed (`reading`, `removing`, `syncing`) and
/// the path.
pub fn remove_temp_files(dir: &Path) -> Result<usize, (&'static str, PathBuf, io::Error)> {
    let mut removed = 0;
    let entries = fs::read_dir(dir).map_err(|e| ("reading", dir.to_path_buf(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ("reading", dir.to_path_buf(), e))?;
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let path = entry.path();
            fs::remove_file(&path).map_err(|e| ("removing", path.clone(), e))?;
            tracing::info!(path = %path.display(), "removed a temp file left by an interrupted write");
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(dir).map_err(|e| ("syncing", dir.to_path_buf(), e))?;
    }
    Ok(removed)
}

/// Fsyncs a folder, so a file created, renamed or removed in it survives a
/// crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` (and missing parents) 0700. One that already exists open
/// to other users is used, with a warning naming `what` it is (an
/// operator may have meant it); its files are still created 0600. `Err`
/// names the step that failed (`creating`, `reading`).
pub fn private_dir(dir: &Path, what: &str) -> Result<(), (&'static str, io::Error)> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| ("creating", e))?;
    let mode = fs::metadata(dir)
        .map_err(|e| ("reading", e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            dir = %dir.display(),
            mode = format_args!("{:o}", mode & 0o777),
            "{what} is open to other users; 0700 is expected"
        );
    }
    Ok(())
}

/// The file in a state folder whose `flock` its owner holds.
pub const LOCK_FILE: &str = "lock";

/// An exclusive `flock` on a folder's [`LOCK_FILE`], held until dropped,
/// so two processes never write one store.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Why [`lock_dir`] failed.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds the lock.
    InUse,
    /// `action` (`opening`, `locking`) on `path` failed.
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Takes `dir`'s lock (creating its [`LOCK_FILE`] 0600), or says another
/// process holds it. Never waits.
pub fn lock_dir(dir: &Path) -> Result<DirLock, LockError> {
    let path = dir.join(LOCK_FILE);
    let file = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(file) => file,
        Err(source) => {
            return Err(LockError::Io {
                action: "opening",
                path,
                source,
            });
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(DirLock { _file: file }),
        Err(fs::TryLockError::WouldBlock) => Err(LockError::InUse),
        Err(fs::TryLockError::Error(source)) => Err(LockError::Io {
            action: "locking",
            path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("bulkhead-durable-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_folder_is_private_and_locked_by_one_owner() {
        let dir = scratch("lock");
        private_dir(&dir.join("store"), "the test store").unwrap();
        let store = dir.join("store");
        assert_eq!(
            fs::metadata(&store).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let held = lock_dir(&store).unwrap();
        assert!(matches!(lock_dir(&store), Err(LockError::InUse)));
        drop(held);
        let again = lock_dir(&store).unwrap();
        assert_eq!(
            fs::metadata(store.join(LOCK_FILE))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        drop(again);
        assert!(matches!(
            lock_dir(&dir.join("missing")),
            Err(LockError::Io {
                action: "opening",
                ..
            })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replaces_the_file_privately_and_leaves_no_temp_file() {
        let dir = scratch("write");
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
        // A temp file of the very name this write picks, left by a dead
        // process that had this PID: replaced, not an error.
        let temp = dir.join(format!("{TEMP_PREFIX}{}-7-record.json", std::process::id()));
        fs::write(&temp, b"half-writ").unwrap();
        write_via(&temp, &path, b"three").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"three");
        assert!(!temp.exists());
        // A folder that does not exist: an error, nothing created.
        assert!(write_atomic(&dir.join("missing/x"), b"x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temp_files_left_by_a_crash_are_removed_and_nothing_else() {
        let dir = scratch("temps");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("{TEMP_PREFIX}1-0-checkpoint")), b"x").unwrap();
        fs::write(dir.join(format!("{TEMP_PREFIX}1-1-audit.pub")), b"x").unwrap();
        fs::write(dir.join("checkpoint"), b"kept").unwrap();
        assert_eq!(remove_temp_files(&dir).unwrap(), 2);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["checkpoint"]);
        assert_eq!(remove_temp_files(&dir).unwrap(), 0);
        let missing = remove_temp_files(&dir.join("missing")).unwrap_err();
        assert_eq!(missing.0, "reading");
        fs::remove_dir_all(&dir).unwrap();
    }
}
