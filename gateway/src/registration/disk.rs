//! The registry folder (`[models] registry`): one JSON file per model
//! registered through the admin API, so registrations survive a restart.
//!
//! ```text
//! REGISTRY/lock         flock'd while a gateway has the registry open
//! REGISTRY/NAME.json    {"version":1,"name","dir","file","digest","signature":{bundle},"registered_at","registered_by"}
//! ```
//!
//! The folder is 0700 and files 0600. Writes are temp file + fsync +
//! rename + fsync of the folder, so a crash leaves the old file or the new
//! one; leftover temp files are removed at open. Nothing read here is
//! trusted: every record's signature is verified again against the current
//! `trust.toml` before its model is loaded.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::verify::MAX_REGISTRATION_BUNDLE_BYTES;
use super::{RegistrationError, valid_model_name};
use bulkhead_durable::{DirLock, LOCK_FILE, LockError, sync_dir, write_atomic};

/// Most models registered through the API: each is loaded at every restart.
pub const MAX_API_REGISTRATIONS: usize = 256;
/// Largest record file: the bundle plus a few short fields.
pub(super) const MAX_RECORD_BYTES: u64 = MAX_REGISTRATION_BUNDLE_BYTES as u64 + (16 << 10);
const SUFFIX: &str = ".json";
pub(super) const VERSION: u32 = 1;

/// One API registration as stored: the claim, not a verified registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub version: u32,
    pub name: String,
    /// The model folder on the gpu-host's machine.
    pub dir: PathBuf,
    /// The weights file as the manifest names it.
    pub file: String,
    /// `sha256:HEX` of the manifest's subject when it was registered
    /// (informative: the signature is verified again at every start).
    pub digest: String,
    /// The signature bundle.
    pub signature: serde_json::Value,
    /// RFC 3339.
    pub registered_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<String>,
}

impl Record {
    pub fn new(
        name: String,
        dir: PathBuf,
        file: String,
        digest: String,
        signature: serde_json::Value,
        registered_at: String,
        registered_by: Option<String>,
    ) -> Record {
        Record {
            version: VERSION,
            name,
            dir,
            file,
            digest,
            signature,
            registered_at,
            registered_by,
        }
    }

    /// The bundle's bytes, as verified (serde_json writes a value the same
    /// way every time, so this is stable across restarts).
    pub fn bundle(&self) -> Vec<u8> {
        serde_json::to_vec(&self.signature).unwrap_or_default()
    }
}

/// An open registry folder; holds its lock until dropped.
#[derive(Debug)]
pub(crate) struct RegistryDir {
    root: PathBuf,
    _lock: DirLock,
}

impl RegistryDir {
    /// Opens (creating) the folder and reads every record. Records that
    /// cannot be read are logged and left on disk, not loaded.
    pub fn open(root: &Path) -> Result<(RegistryDir, Vec<Record>), RegistrationError> {
        bulkhead_durable::private_dir(root, "the model registry folder")
            .map_err(|(action, e)| RegistrationError::store(action, root)(e))?;
        let lock = lock(root)?;
        let dir = RegistryDir {
            root: root.to_path_buf(),
            _lock: lock,
        };
        bulkhead_durable::remove_temp_files(root)
            .map_err(|(action, path, source)| RegistrationError::store(action, &path)(source))?;
        let mut records = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for entry in fs::read_dir(root).map_err(RegistrationError::store("listing", root))? {
            let entry = entry.map_err(RegistrationError::store("listing", root))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            names.push(name);
        }
        names.sort();
        for name in names {
            let path = root.join(&name);
            let Some(stem) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            if records.len() >= MAX_API_REGISTRATIONS {
                tracing::error!(
                    path = %path.display(),
                    "more than {MAX_API_REGISTRATIONS} registrations in the registry; not loaded"
                );
                continue;
            }
            match read_record(&path, stem) {
                Ok(record) => records.push(record),
                Err(why) => tracing::error!(
                    path = %path.display(),
                    "a registration in the model registry cannot be read, so its model is not \
                     loaded (the file is left as it is): {why}"
                ),
            }
        }
        Ok((dir, records))
    }

    /// Stores `record` (replacing one of the same name) durably.
    pub fn write(&self, record: &Record) -> Result<(), RegistrationError> {
        let path = self.path(&record.name);
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| {
            RegistrationError::store("encoding", &path)(io::Error::other(e.to_string()))
        })?;
        write_atomic(&path, &bytes).map_err(RegistrationError::store("writing", &path))
    }

    /// Removes `name`'s record durably (already gone is fine).
    pub fn remove(&self, name: &str) -> Result<(), RegistrationError> {
        let path = self.path(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RegistrationError::store("removing", &path)(e)),
        }
        sync_dir(&self.root).map_err(RegistrationError::store("syncing", &self.root))
    }

    fn path(&self, name: &str) -> PathBuf {
        // Names are checked before anything is stored: no `/`, no leading `.`.
        self.root.join(format!("{name}{SUFFIX}"))
    }
}

/// A record file's contents, checked against its file name.
fn read_record(path: &Path, stem: &str) -> Result<Record, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(format!("larger than {MAX_RECORD_BYTES} bytes"));
    }
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if record.version != VERSION {
        return Err(format!(
            "version {} (this gateway reads {VERSION})",
            record.version
        ));
    }
    if record.name != stem || !valid_model_name(&record.name) {
        return Err(format!(
            "it registers `{}`, which does not match its file name",
            record.name.escape_debug()
        ));
    }
    Ok(record)
}

fn lock(root: &Path) -> Result<DirLock, RegistrationError> {
    bulkhead_durable::lock_dir(root).map_err(|e| match e {
        LockError::InUse => RegistrationError::store("locking", &root.join(LOCK_FILE))(
            io::Error::other("another gateway has this model registry open"),
        ),
        LockError::Io {
            action,
            path,
            source,
        } => RegistrationError::store(action, &path)(source),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "bulkhead-registry-test-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn record(name: &str) -> Record {
        Record::new(
            name.into(),
            "/models/m".into(),
            "m.gguf".into(),
            "sha256:00".into(),
            serde_json::json!({"mediaType": "x"}),
            "2025-01-01T00:00:00.000Z".into(),
            Some("ops".into()),
        )
    }

    #[test]
    fn records_survive_a_reopen_and_bad_files_are_skipped() {
        let root = scratch("reopen");
        {
            let (dir, records) = RegistryDir::open(&root).unwrap();
            assert!(records.is_empty());
            dir.write(&record("a")).unwrap();
            dir.write(&record("b")).unwrap();
            dir.remove("b").unwrap();
            dir.remove("never-there").unwrap();
            // A second gateway cannot open it while the first has it.
            assert!(RegistryDir::open(&root).is_err());
        }
        fs::write(root.join("x.json"), b"{not json").unwrap();
        fs::write(
            root.join("y.json"),
            serde_json::to_vec(&record("z")).unwrap(),
        )
        .unwrap();
        fs::write(root.join(".tmp-1-a.json"), b"half").unwrap();
        let (_dir, records) = RegistryDir::open(&root).unwrap();
        assert_eq!(records, vec![record("a")]);
        assert!(!root.join(".tmp-1-a.json").exists());
        assert!(root.join("x.json").exists(), "bad records are left on disk");
        let mode = fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let mode = fs::metadata(root.join("a.json"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let _ = fs::remove_dir_all(&root);
    }
}
