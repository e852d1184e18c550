//! The store folder on disk (layout in the parent module's docs). Every
//! write goes to a temp file in the same folder, is fsynced, renamed over
//! its name, and the folder is fsynced: a crash leaves the old file or the
//! new one, never a torn one, plus at most a `.tmp-*` file that the next
//! open removes.

use std::fs::{self, File, Permissions};
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::artifact::{KEY_BYTES, StoreKey};
use super::name::{PluginName, is_valid_tenant};
use super::shared::VersionFloor;
use super::{EntryMeta, LoadFailure, StoreError};
use crate::{MAX_COMPONENT_BYTES, PluginDigest};
use bulkhead_durable::{DirLock, LockError, sync_dir, write_atomic};

/// Largest entry file read: an entry is a few hundred bytes.
const MAX_ENTRY_FILE_BYTES: u64 = 64 << 10;
/// Largest artifact file read. Cranelift's code for a component is a small
/// multiple of its size (the largest upload is `MAX_COMPONENT_BYTES`).
const MAX_ARTIFACT_FILE_BYTES: u64 = 16 * MAX_COMPONENT_BYTES as u64;
/// Version of the entry file format.
const ENTRY_FORMAT: u32 = 1;
/// Longest `uploaded_by` kept (the token's `sub`).
const MAX_UPLOADED_BY_BYTES: usize = 256;

const BLOBS: &str = "blobs";
const ARTIFACTS: &str = "artifacts";
const TENANTS: &str = "tenants";
/// `versions/TENANT/NAME`: the highest signed version a deleted plugin had,
/// so that a re-upload under its name cannot roll it back.
const VERSIONS: &str = "versions";
const KEY: &str = "key";

/// An open store folder: its key, and the lock that keeps a second gateway
/// out while this one runs.
#[derive(Debug)]
pub(crate) struct StoreDir {
    root: PathBuf,
    key: StoreKey,
    /// Holds an exclusive `flock` on `lock` until dropped.
    _lock: DirLock,
}

/// What opening the folder tidied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tidied {
    /// Temp files left by a crash in the middle of a write.
    pub(crate) temp_files_removed: usize,
    /// The key file was missing (new store) or unusable and was replaced.
    pub(crate) new_key: bool,
}

/// One `tenants/TENANT/NAME.json`, as written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    format: u32,
    name: String,
    /// `sha256:HEX`.
    digest: String,
    size_bytes: u64,
    /// Unix seconds.
    created_at: u64,
    /// The `sub` of the token that uploaded it.
    uploaded_by: Option<String>,
    /// The signed version, for a tenant that signs its plugins (absent in
    /// entries written before versions, and for unsigned uploads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<u64>,
}

impl StoreDir {
    /// Opens (creating, 0700) the store at `root`: takes its lock, reads or
    /// creates its key, removes temp files a crash left behind.
    pub(crate) fn open(root: &Path) -> Result<(StoreDir, Tidied), StoreError> {
        StoreDir::open_with(root, &[BLOBS, ARTIFACTS, TENANTS, VERSIONS])
    }

    /// Opens (creating, 0700) `root` as a replica's compiled-code cache for
    /// a shared store: its lock, its key and `artifacts/` only. Blobs and
    /// entries live in the shared store; any a folder store left here are
    /// neither read nor touched.
    pub(crate) fn open_cache(root: &Path) -> Result<(StoreDir, Tidied), StoreError> {
        StoreDir::open_with(root, &[ARTIFACTS])
    }

    fn open_with(root: &Path, subs: &[&str]) -> Result<(StoreDir, Tidied), StoreError> {
        let mut tidied = Tidied::default();
        make_dir(root)?;
        let lock = lock(root)?;
        for sub in subs {
            make_dir(&root.join(sub))?;
        }
        tidied.temp_files_removed += remove_temp_files(root)?;
        for sub in subs {
            tidied.temp_files_removed += remove_temp_files(&root.join(sub))?;
        }
        for per_tenant in [TENANTS, VERSIONS] {
            if !subs.contains(&per_tenant) {
                continue;
            }
            for tenant in list_dir(&root.join(per_tenant))? {
                let path = root.join(per_tenant).join(&tenant);
                if path.is_dir() {
                    tidied.temp_files_removed += remove_temp_files(&path)?;
                }
            }
        }
        let (key, new_key) = read_or_create_key(root)?;
        tidied.new_key = new_key;
        Ok((
            StoreDir {
                root: root.to_path_buf(),
                key,
                _lock: lock,
            },
            tidied,
        ))
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn key(&self) -> &StoreKey {
        &self.key
    }

    fn blob_path(&self, digest: PluginDigest) -> PathBuf {
        blob_path(&self.root, digest)
    }

    fn artifact_path(&self, digest: PluginDigest) -> PathBuf {
        self.root.join(ARTIFACTS).join(format!("{digest}.cwasm"))
    }

    fn tenant_dir(&self, tenant: &str) -> PathBuf {
        self.root.join(TENANTS).join(tenant)
    }

    /// The uploaded bytes named `digest`, if they still hash to it.
    pub(crate) fn read_blob(&self, digest: PluginDigest) -> Result<Vec<u8>, String> {
        read_blob_in(&self.root, digest)
    }

    /// Stores an upload under its digest (replacing a copy already there).
    pub(crate) fn write_blob(&self, digest: PluginDigest, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.blob_path(digest);
        write_atomic(&path, bytes).map_err(io_error("writing", &path))
    }

    /// The artifact file for `digest`, if there is one.
    pub(crate) fn read_artifact(&self, digest: PluginDigest) -> Result<Option<Vec<u8>>, String> {
        let path = self.artifact_path(digest);
        read_bounded(&path, MAX_ARTIFACT_FILE_BYTES)
            .map_err(|e| format!("its artifact {} cannot be read: {e}", path.display()))
    }

    pub(crate) fn write_artifact(
        &self,
        digest: PluginDigest,
        sealed: &[u8],
    ) -> Result<(), StoreError> {
        let path = self.artifact_path(digest);
        write_atomic(&path, sealed).map_err(io_error("writing", &path))
    }

    /// Removes an artifact (a cache's digest no entry refers to any more).
    pub(crate) fn remove_artifact(&self, digest: PluginDigest) -> Result<(), StoreError> {
        let path = self.artifact_path(digest);
        remove_durably(&path).map_err(io_error("removing", &path))
    }

    /// Digests with an artifact in the folder.
    pub(crate) fn artifact_digests(&self) -> Result<Vec<PluginDigest>, StoreError> {
        let dir = self.root.join(ARTIFACTS);
        let mut digests = Vec::new();
        for file in list_dir(&dir)? {
            match file.strip_suffix(".cwasm").and_then(PluginDigest::from_hex) {
                Some(digest) => digests.push(digest),
                None => {
                    tracing::warn!(path = %dir.join(&file).display(), "not a store file; ignored")
                }
            }
        }
        Ok(digests)
    }

    /// Whether the folder holds a folder store's entries (`tenants/`).
    pub(crate) fn holds_entries(&self) -> bool {
        list_dir(&self.root.join(TENANTS)).is_ok_and(|tenants| !tenants.is_empty())
    }

    /// Removes a blob and its artifact (no entry refers to them any more).
    pub(crate) fn remove_blob(&self, digest: PluginDigest) -> Result<(), StoreError> {
        for path in [self.artifact_path(digest), self.blob_path(digest)] {
            remove_durably(&path).map_err(io_error("removing", &path))?;
        }
        Ok(())
    }

    /// Writes `tenants/TENANT/NAME.json`.
    pub(crate) fn write_entry(
        &self,
        tenant: &str,
        name: &PluginName,
        meta: &EntryMeta,
    ) -> Result<(), StoreError> {
        check_tenant(tenant)?;
        let dir = self.tenant_dir(tenant);
        if !dir.is_dir() {
            make_dir(&dir)?;
            sync_dir(&self.root.join(TENANTS))
                .map_err(io_error("syncing", &self.root.join(TENANTS)))?;
        }
        let file = EntryFile {
            format: ENTRY_FORMAT,
            name: name.to_string(),
            digest: format!("sha256:{}", meta.digest),
            size_bytes: meta.size_bytes,
            created_at: meta.created_at,
            uploaded_by: meta.uploaded_by.clone(),
            version: meta.version,
        };
        let mut json = serde_json::to_vec_pretty(&file).expect("an entry serializes");
        json.push(b'\n');
        let path = dir.join(format!("{name}.json"));
        write_atomic(&path, &json).map_err(io_error("writing", &path))
    }

    pub(crate) fn remove_entry(&self, tenant: &str, name: &PluginName) -> Result<(), StoreError> {
        check_tenant(tenant)?;
        let path = self.tenant_dir(tenant).join(format!("{name}.json"));
        remove_durably(&path).map_err(io_error("removing", &path))
    }

    /// The highest signed version `tenant`'s deleted plugin `name` had, if
    /// one is remembered.
    pub(crate) fn version_floor(
        &self,
        tenant: &str,
        name: &PluginName,
    ) -> Result<Option<u64>, StoreError> {
        check_tenant(tenant)?;
        let path = self.root.join(VERSIONS).join(tenant).join(name.as_str());
        let Some(bytes) = read_bounded(&path, 32).map_err(io_error("reading", &path))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        text.trim().parse().map(Some).map_err(|_| StoreError::Io {
            action: "reading",
            path: path.clone(),
            source: io::Error::new(io::ErrorKind::InvalidData, "not a version number"),
        })
    }

    /// Remembers `version` as the floor of `tenant`'s deleted `name`.
    /// Refused when the tenant already has `max` floors remembered.
    pub(crate) fn write_version_floor(
        &self,
        tenant: &str,
        name: &PluginName,
        version: u64,
        max: usize,
    ) -> Result<(), StoreError> {
        check_tenant(tenant)?;
        let dir = self.root.join(VERSIONS).join(tenant);
        if !dir.is_dir() {
            make_dir(&dir)?;
        }
        let path = dir.join(name.as_str());
        if !path.exists() && list_dir(&dir)?.len() >= max {
            return Err(StoreError::TooManyVersionFloors { max });
        }
        write_atomic(&path, format!("{version}\n").as_bytes()).map_err(io_error("writing", &path))
    }

    /// Forgets the floor of `name` (a live entry carries its version).
    pub(crate) fn remove_version_floor(
        &self,
        tenant: &str,
        name: &PluginName,
    ) -> Result<(), StoreError> {
        check_tenant(tenant)?;
        let path = self.root.join(VERSIONS).join(tenant).join(name.as_str());
        remove_durably(&path).map_err(io_error("removing", &path))
    }

    /// Every entry of every tenant, and the files that are not readable
    /// entries (left in place, reported).
    #[allow(clippy::type_complexity)]
    pub(crate) fn read_entries(
        &self,
    ) -> Result<(Vec<(String, PluginName, EntryMeta)>, Vec<LoadFailure>), StoreError> {
        read_entries_in(&self.root)
    }

    /// Digests with a blob or an artifact on disk.
    pub(crate) fn stored_digests(&self) -> Result<Vec<PluginDigest>, StoreError> {
        let mut digests = Vec::new();
        for (sub, suffix) in [(BLOBS, ".wasm"), (ARTIFACTS, ".cwasm")] {
            for file in list_dir(&self.root.join(sub))? {
                match file.strip_suffix(suffix).and_then(PluginDigest::from_hex) {
                    Some(digest) => digests.push(digest),
                    None => tracing::warn!(
                        path = %self.root.join(sub).join(&file).display(),
                        "not a store file; ignored"
                    ),
                }
            }
        }
        digests.sort();
        digests.dedup();
        Ok(digests)
    }
}

/// [`StoreDir::read_entries`] of the store folder at `root`.
#[allow(clippy::type_complexity)]
pub(crate) fn read_entries_in(
    root: &Path,
) -> Result<(Vec<(String, PluginName, EntryMeta)>, Vec<LoadFailure>), StoreError> {
    let mut entries = Vec::new();
    let mut failures = Vec::new();
    let tenants_dir = root.join(TENANTS);
    for tenant in list_dir(&tenants_dir)? {
        let dir = tenants_dir.join(&tenant);
        if !is_valid_tenant(&tenant) || !dir.is_dir() {
            tracing::warn!(path = %dir.display(), "not a tenant folder; ignored");
            continue;
        }
        for file in list_dir(&dir)? {
            let path = dir.join(&file);
            let name = file
                .strip_suffix(".json")
                .and_then(|stem| PluginName::parse(stem).ok());
            let Some(name) = name else {
                tracing::warn!(path = %path.display(), "not a plugin entry; ignored");
                continue;
            };
            match read_entry(&path, &name) {
                Ok(meta) => entries.push((tenant.clone(), name, meta)),
                Err(reason) => failures.push(LoadFailure {
                    tenant: tenant.clone(),
                    name: name.to_string(),
                    reason,
                }),
            }
        }
    }
    entries.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Ok((entries, failures))
}

/// The uploaded bytes named `digest` in the store folder at `root`, if they
/// still hash to it.
pub(crate) fn read_blob_in(root: &Path, digest: PluginDigest) -> Result<Vec<u8>, String> {
    let path = blob_path(root, digest);
    let bytes = read_bounded(&path, MAX_COMPONENT_BYTES as u64)
        .map_err(|e| format!("its blob {} cannot be read: {e}", path.display()))?
        .ok_or_else(|| format!("its blob {} is missing", path.display()))?;
    let actual = PluginDigest::of(&bytes);
    if actual != digest {
        return Err(format!(
            "its blob {} does not hash to its name (sha256 {actual}): altered on disk",
            path.display()
        ));
    }
    Ok(bytes)
}

fn blob_path(root: &Path, digest: PluginDigest) -> PathBuf {
    root.join(BLOBS).join(format!("{digest}.wasm"))
}

/// Every version floor in the store folder at `root` (`versions/TENANT/NAME`),
/// and the files that are not readable floors (reported).
pub(crate) fn read_version_floors_in(
    root: &Path,
) -> Result<(Vec<VersionFloor>, Vec<LoadFailure>), StoreError> {
    let mut floors = Vec::new();
    let mut failures = Vec::new();
    let versions_dir = root.join(VERSIONS);
    if !versions_dir.is_dir() {
        return Ok((floors, failures));
    }
    for tenant in list_dir(&versions_dir)? {
        let dir = versions_dir.join(&tenant);
        if !is_valid_tenant(&tenant) || !dir.is_dir() {
            tracing::warn!(path = %dir.display(), "not a tenant folder; ignored");
            continue;
        }
        for file in list_dir(&dir)? {
            let path = dir.join(&file);
            let Ok(name) = PluginName::parse(&file) else {
                tracing::warn!(path = %path.display(), "not a version floor; ignored");
                continue;
            };
            let version = read_bounded(&path, 32)
                .ok()
                .flatten()
                .and_then(|bytes| String::from_utf8_lossy(&bytes).trim().parse::<u64>().ok());
            match version {
                Some(version) => floors.push(VersionFloor {
                    tenant: tenant.clone(),
                    name,
                    version,
                }),
                None => failures.push(LoadFailure {
                    tenant: tenant.clone(),
                    name: name.to_string(),
                    reason: format!(
                        "its version floor {} is not a version number",
                        path.display()
                    ),
                }),
            }
        }
    }
    Ok((floors, failures))
}

fn read_entry(path: &Path, name: &PluginName) -> Result<EntryMeta, String> {
    let bytes = read_bounded(path, MAX_ENTRY_FILE_BYTES)
        .map_err(|e| format!("its entry {} cannot be read: {e}", path.display()))?
        .ok_or_else(|| format!("its entry {} vanished", path.display()))?;
    let file: EntryFile = serde_json::from_slice(&bytes)
        .map_err(|e| format!("its entry {} is not valid: {e}", path.display()))?;
    let digest = file
        .digest
        .strip_prefix("sha256:")
        .and_then(PluginDigest::from_hex);
    match digest {
        Some(digest)
            if file.format == ENTRY_FORMAT
                && file.name == name.as_str()
                && file
                    .uploaded_by
                    .as_ref()
                    .is_none_or(|s| s.len() <= MAX_UPLOADED_BY_BYTES) =>
        {
            Ok(EntryMeta {
                digest,
                size_bytes: file.size_bytes,
                created_at: file.created_at,
                uploaded_by: file.uploaded_by,
                version: file.version,
            })
        }
        _ => Err(format!(
            "its entry {} is not valid (format, name or digest)",
            path.display()
        )),
    }
}

/// `uploaded_by` as stored: the `sub`, cut to a bounded length.
pub(crate) fn uploaded_by(sub: Option<&str>) -> Option<String> {
    sub.map(|sub| {
        let mut end = sub.len().min(MAX_UPLOADED_BY_BYTES);
        while !sub.is_char_boundary(end) {
            end -= 1;
        }
        sub[..end].to_string()
    })
}

fn check_tenant(tenant: &str) -> Result<(), StoreError> {
    if is_valid_tenant(tenant) {
        Ok(())
    } else {
        Err(StoreError::InvalidTenant {
            tenant: tenant.escape_debug().take(80).collect(),
        })
    }
}

/// The lock of an existing store folder, held while it is read whole.
pub(crate) fn lock_existing(root: &Path) -> Result<DirLock, StoreError> {
    lock(root)
}

/// Takes the store's exclusive lock, or says another process holds it.
fn lock(root: &Path) -> Result<DirLock, StoreError> {
    bulkhead_durable::lock_dir(root).map_err(|e| match e {
        LockError::InUse => StoreError::InUse {
            store: root.to_path_buf(),
        },
        LockError::Io {
            action,
            path,
            source,
        } => io_error(action, &path)(source),
    })
}

/// The key in `root/key`, created (0600) when missing; a key file of the
/// wrong size is replaced (every artifact then fails its MAC and is
/// compiled again).
fn read_or_create_key(root: &Path) -> Result<(StoreKey, bool), StoreError> {
    let path = root.join(KEY);
    match read_bounded(&path, KEY_BYTES as u64 + 1) {
        Ok(Some(bytes)) if bytes.len() == KEY_BYTES => {
            let mode = fs::metadata(&path)
                .map_err(io_error("reading", &path))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format_args!("{:o}", mode & 0o777),
                    "the plugin store key was readable by others; made 0600"
                );
                fs::set_permissions(&path, Permissions::from_mode(0o600))
                    .map_err(io_error("securing", &path))?;
            }
            let key: [u8; KEY_BYTES] = bytes.try_into().expect("checked length");
            return Ok((StoreKey::new(key), false));
        }
        Ok(None) => {}
        Ok(Some(_)) | Err(_) => tracing::warn!(
            path = %path.display(),
            "the plugin store key is unusable; writing a new one (cached artifacts will be \
             compiled again)"
        ),
    }
    let mut key = [0u8; KEY_BYTES];
    rand_core::RngCore::try_fill_bytes(&mut rand_core::OsRng, &mut key)
        .map_err(|e| io_error("generating", &path)(io::Error::other(e.to_string())))?;
    write_atomic(&path, &key).map_err(io_error("writing", &path))?;
    Ok((StoreKey::new(key), true))
}

/// Creates `dir` (and missing parents) with mode 0700.
fn make_dir(dir: &Path) -> Result<(), StoreError> {
    bulkhead_durable::private_dir(dir, "the plugin store folder")
        .map_err(|(action, e)| io_error(action, dir)(e))
}

/// File names in `dir` (not UTF-8 ones are skipped: the store writes none).
fn list_dir(dir: &Path) -> Result<Vec<String>, StoreError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("listing", dir))? {
        let entry = entry.map_err(io_error("listing", dir))?;
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(name) => tracing::warn!(
                path = %dir.join(name).display(),
                "a file name that is not UTF-8 in the plugin store; ignored"
            ),
        }
    }
    names.sort();
    Ok(names)
}

fn remove_temp_files(dir: &Path) -> Result<usize, StoreError> {
    bulkhead_durable::remove_temp_files(dir).map_err(|(action, path, source)| StoreError::Io {
        action,
        path,
        source,
    })
}

/// A regular file's bytes if it exists, refusing one over `max` bytes.
fn read_bounded(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() > max {
        return Err(io::Error::other(format!(
            "{} bytes, over the limit of {max}",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::other(format!("over the limit of {max} bytes")));
    }
    Ok(Some(bytes))
}

/// Removes `path` (already gone is fine) and fsyncs its folder.
fn remove_durably(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    sync_dir(path.parent().expect("store paths have a parent"))
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}
