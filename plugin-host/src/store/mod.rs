//! The tenant plugin store: uploads kept on disk, content-addressed by
//! SHA-256, with their compiled code cached, and an in-memory index the
//! request path reads ([`PluginRegistry::get`]) without waiting on disk or
//! compilation.
//!
//! Layout of the store folder (`[plugins] store` in `gateway.toml`; every
//! folder 0700, every file 0600):
//!
//! ```text
//! STORE/
//!   lock                            flock'd while a gateway has the store open
//!   key                             32 random bytes: the artifact MAC key
//!   blobs/<sha256>.wasm             uploaded bytes, named by their digest
//!   artifacts/<sha256>.cwasm        compiled code, sealed with the key (artifact.rs)
//!   tenants/<tenant>/<name>.json    one entry: digest, size_bytes, created_at, uploaded_by
//! ```
//!
//! A blob is shared by every entry with the same bytes, and removed (with
//! its artifact) when no entry refers to it any more. Writes are atomic
//! (`disk.rs`): blob, then artifact, then entry, then the old blob's
//! removal, so a crash at any point leaves a consistent store; opening it
//! again removes temp files and blobs no entry refers to.
//!
//! At open every referenced blob is hashed again: one that no longer
//! hashes to its name is refused and logged (its entries stay on disk,
//! unloaded, until re-uploaded or deleted). Its artifact is loaded only if
//! its MAC verifies; otherwise the blob is compiled again through the full
//! `validate_and_compile` path and the artifact rewritten.
//!
//! Mutations (upload, delete) take one lock for their disk writes and
//! publish a new index through `ArcSwap`; compilation happens before that
//! lock. Readers never take it.
//!
//! Replicas share their plugins through a [`SharedPlugins`] store instead
//! ([`PluginRegistry::open_shared`], `replica.rs`): entries, blobs and
//! version floors live there, and the folder, when given, is only this
//! replica's cache of compiled code (its key and `artifacts/`). A change is
//! committed there first, then published here; other replicas publish it
//! when told ([`PluginRegistry::refresh`]).

mod artifact;
mod disk;
mod export;
mod name;
mod replica;
mod shared;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use super::{CompiledPlugin, Compiler, PluginDigest, PluginEngine, PluginError};
use disk::StoreDir;
use replica::SharedStore;

pub(crate) use artifact::VerifiedArtifact;
pub use export::{FileStoreContents, read_file_store};
pub use name::{PLUGIN_NAME_RULE, PluginName};
pub use shared::{Listing, SharedEntry, SharedPlugins, SharedPut, StoredBlob, VersionFloor};

/// Most plugins one tenant may keep. A tenant's chain names a handful;
/// 64 bounds the disk, memory and compile work one tenant can claim.
pub const MAX_PLUGINS_PER_TENANT: usize = 64;

/// Deleted signed plugins whose last version a tenant's store remembers
/// (so a name cannot be rolled back by deleting and re-uploading it). Each
/// is a file of a few bytes; re-uploading the name frees its place.
pub const MAX_VERSION_FLOORS_PER_TENANT: usize = 4096;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("plugin uploads are off: set `store` in the `[plugins]` table of gateway.toml")]
    Disabled,

    #[error("the plugin name `{name}` is not valid: use {PLUGIN_NAME_RULE}")]
    InvalidName { name: String },

    #[error(
        "this tenant already has {max} plugins, the most it may keep: delete one first \
         (replacing an existing name is allowed)"
    )]
    TooManyPlugins { max: usize },

    #[error(
        "this tenant's store remembers the versions of {max} deleted signed plugins, the most \
         it keeps: re-upload one of those names, or delete an unsigned plugin instead"
    )]
    TooManyVersionFloors { max: usize },

    #[error("no plugin named `{name}`")]
    NotFound { name: String },

    #[error(
        "plugin `{name}` is at signed version {stored}; an upload must be signed with a higher \
         version, not {offered} (a signed component cannot be rolled back)"
    )]
    VersionNotNewer {
        name: String,
        stored: u64,
        offered: u64,
    },

    #[error(transparent)]
    Refused(#[from] PluginError),

    #[error("the tenant id `{tenant}` cannot name a store folder")]
    InvalidTenant { tenant: String },

    #[error(
        "the plugin store {} is in use by another process (another gateway?)",
        store.display()
    )]
    InUse { store: PathBuf },

    #[error("plugin store: {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    /// The shared store cannot be reached (or failed a statement): the
    /// change was not made (unless the connection broke as it committed),
    /// and retrying it is safe.
    #[error("the shared plugin store is unavailable: {0}")]
    Unavailable(String),
}

/// An entry's record, as on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntryMeta {
    digest: PluginDigest,
    size_bytes: u64,
    /// Unix seconds.
    created_at: u64,
    uploaded_by: Option<String>,
    /// The signed version (see [`super::signature`]); `None`: unsigned.
    version: Option<u64>,
}

/// A stored plugin as the API shows it.
#[derive(Clone, Debug)]
pub struct PluginInfo {
    pub name: String,
    pub digest: PluginDigest,
    pub size_bytes: u64,
    /// The component's imports, all on the allow-list.
    pub imports: Vec<String>,
    /// When this version was uploaded, in Unix seconds.
    pub created_at: u64,
    /// The `sub` of the token that uploaded it.
    pub uploaded_by: Option<String>,
    /// The signed version, when the upload was signed.
    pub version: Option<u64>,
}

/// What an upload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadOutcome {
    /// A new name.
    Created,
    /// The name held other bytes, now replaced.
    Replaced,
    /// The name held these exact bytes already: nothing changed.
    Unchanged,
}

impl UploadOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            UploadOutcome::Created => "created",
            UploadOutcome::Replaced => "replaced",
            UploadOutcome::Unchanged => "unchanged",
        }
    }
}

/// An entry that could not be loaded at open, and why (also logged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadFailure {
    pub tenant: String,
    pub name: String,
    pub reason: String,
}

/// What opening the store found and did.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// Entries loaded and servable.
    pub plugins: usize,
    /// Distinct components loaded from their cached artifact.
    pub deserialized: usize,
    /// Distinct components compiled from their blob (no usable artifact).
    pub recompiled: usize,
    /// Entries not loaded.
    pub failed: Vec<LoadFailure>,
    /// Temp files of interrupted writes, removed.
    pub temp_files_removed: usize,
    /// Blobs and artifacts no entry referred to, removed.
    pub orphans_removed: usize,
    /// The MAC key was created (new store) or replaced.
    pub new_key: bool,
    /// Time to open and load everything.
    pub elapsed: std::time::Duration,
}

/// One loaded entry.
#[derive(Clone)]
struct Loaded {
    compiled: CompiledPlugin,
    meta: EntryMeta,
}

/// What the request path reads: tenant → name → plugin.
type Index = HashMap<String, Arc<BTreeMap<String, Loaded>>>;

/// The tenant plugins this gateway serves, and (when a store is
/// configured) the way to change them. Cheap to clone.
#[derive(Clone)]
pub struct PluginRegistry {
    inner: Arc<RegistryInner>,
}

struct RegistryInner {
    index: ArcSwap<Index>,
    backend: Backend,
}

/// Where the plugins are kept.
enum Backend {
    /// No store configured: uploads are off.
    Off,
    /// A store folder of this gateway's own.
    Files(Store),
    /// A store the replicas share.
    Shared(SharedStore),
}

struct Store {
    engine: PluginEngine,
    compatibility: [u8; 32],
    dir: StoreDir,
    /// Every entry on disk (loaded or not), guarded for mutations.
    entries: Mutex<BTreeMap<(String, PluginName), EntryMeta>>,
}

impl fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = self.inner.index.load();
        let store = match &self.inner.backend {
            Backend::Off => None,
            Backend::Files(store) => Some(store.dir.root().display().to_string()),
            Backend::Shared(shared) => Some(shared.place().to_string()),
        };
        f.debug_struct("PluginRegistry")
            .field("store", &store)
            .field("tenants", &index.len())
            .finish_non_exhaustive()
    }
}

impl PluginRegistry {
    /// No store: no plugins, and uploads answer [`StoreError::Disabled`].
    pub fn disabled() -> PluginRegistry {
        PluginRegistry {
            inner: Arc::new(RegistryInner {
                index: ArcSwap::from_pointee(Index::new()),
                backend: Backend::Off,
            }),
        }
    }

    /// Opens the store at `root` (creating it) and loads every entry:
    /// from its cached artifact when the MAC verifies, by compiling its
    /// blob otherwise. Entries that cannot be loaded are reported and
    /// logged, never fatal; only an unusable store folder is.
    ///
    /// Blocks on disk and compilation: call it from a blocking thread.
    pub fn open(root: &Path, engine: PluginEngine) -> Result<(Self, LoadReport), StoreError> {
        let started = Instant::now();
        let (dir, tidied) = StoreDir::open(root)?;
        let mut report = LoadReport {
            temp_files_removed: tidied.temp_files_removed,
            new_key: tidied.new_key,
            ..LoadReport::default()
        };
        let compatibility = engine.compatibility_digest();
        let store = Store {
            engine,
            compatibility,
            dir,
            entries: Mutex::default(),
        };
        let (entries, unreadable) = store.dir.read_entries()?;
        report.failed.extend(unreadable);

        let digests: BTreeSet<PluginDigest> = entries.iter().map(|(_, _, m)| m.digest).collect();
        let mut compiled: HashMap<PluginDigest, Result<CompiledPlugin, String>> = HashMap::new();
        for digest in &digests {
            let loaded = store.load(*digest, &mut report);
            compiled.insert(*digest, loaded);
        }
        for digest in store.dir.stored_digests()? {
            if !digests.contains(&digest) {
                store.dir.remove_blob(digest)?;
                report.orphans_removed += 1;
            }
        }

        let mut index = Index::new();
        let mut on_disk = BTreeMap::new();
        for (tenant, name, meta) in entries {
            match &compiled[&meta.digest] {
                Ok(plugin) => {
                    let tenant_map = index.entry(tenant.clone()).or_default();
                    Arc::make_mut(tenant_map).insert(
                        name.to_string(),
                        Loaded {
                            compiled: plugin.clone(),
                            meta: meta.clone(),
                        },
                    );
                    report.plugins += 1;
                }
                Err(reason) => report.failed.push(LoadFailure {
                    tenant: tenant.clone(),
                    name: name.to_string(),
                    reason: reason.clone(),
                }),
            }
            on_disk.insert((tenant, name), meta);
        }
        *store.entries.lock().unwrap_or_else(PoisonError::into_inner) = on_disk;
        for failure in &report.failed {
            tracing::error!(
                tenant = %failure.tenant,
                plugin = %failure.name,
                "plugin not loaded: {}",
                failure.reason
            );
        }
        report.elapsed = started.elapsed();
        tracing::info!(
            store = %root.display(),
            plugins = report.plugins,
            from_cache = report.deserialized,
            compiled = report.recompiled,
            failed = report.failed.len(),
            temp_files_removed = report.temp_files_removed,
            orphans_removed = report.orphans_removed,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "plugin store loaded"
        );
        let registry = PluginRegistry {
            inner: Arc::new(RegistryInner {
                index: ArcSwap::from_pointee(index),
                backend: Backend::Files(store),
            }),
        };
        Ok((registry, report))
    }

    /// Opens the plugins `shared` holds, as one replica of several: loads
    /// every entry (each blob re-hashed against its digest: the store is
    /// not trusted with the bytes), compiled code read from `cache` (this
    /// replica's folder: key and sealed artifacts only) when its MAC
    /// verifies, compiled otherwise. Entries that cannot be loaded are
    /// reported and logged; an unreachable store is
    /// [`StoreError::Unavailable`] (a replica does not start without the
    /// plugins it should serve).
    ///
    /// Blocks on the store, disk and compilation: call it from a blocking
    /// thread. Uploads and deletes then write through `shared`; call
    /// [`refresh`](Self::refresh) when the store says another replica
    /// changed something.
    pub fn open_shared(
        shared: Arc<dyn SharedPlugins>,
        cache: Option<&Path>,
        engine: PluginEngine,
    ) -> Result<(Self, LoadReport), StoreError> {
        let (store, index, report) = SharedStore::open(shared, cache, engine)?;
        let registry = PluginRegistry {
            inner: Arc::new(RegistryInner {
                index: ArcSwap::from_pointee(index),
                backend: Backend::Shared(store),
            }),
        };
        Ok((registry, report))
    }

    /// Rereads `tenant`'s plugins (every tenant's with `None`) from the
    /// shared store and publishes them: new digests are loaded (re-hashed,
    /// then from the cache or compiled), those already served are kept,
    /// and removed ones go. When the store is unavailable the index stays
    /// as it was and the error says so. Nothing to do without a shared
    /// store.
    ///
    /// Blocks: call it from a blocking thread.
    pub fn refresh(&self, tenant: Option<&str>) -> Result<LoadReport, StoreError> {
        match &self.inner.backend {
            Backend::Shared(store) => store.refresh(&self.inner.index, tenant),
            Backend::Off | Backend::Files(_) => Ok(LoadReport::default()),
        }
    }

    /// Whether a store is configured (uploads are on).
    pub fn enabled(&self) -> bool {
        !matches!(self.inner.backend, Backend::Off)
    }

    /// Whether the plugins are kept in a store the replicas share.
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.backend, Backend::Shared(_))
    }

    /// The tenant's plugin `name`, ready to instantiate. Never blocks: one
    /// atomic load and two map lookups.
    pub fn get(&self, tenant: &str, name: &str) -> Option<CompiledPlugin> {
        self.inner
            .index
            .load()
            .get(tenant)?
            .get(name)
            .map(|loaded| loaded.compiled.clone())
    }

    /// The tenant's plugin `name` as the API shows it.
    pub fn info(&self, tenant: &str, name: &str) -> Option<PluginInfo> {
        let index = self.inner.index.load();
        let loaded = index.get(tenant)?.get(name)?;
        Some(info(name, loaded))
    }

    /// The tenant's plugins, sorted by name.
    pub fn list(&self, tenant: &str) -> Vec<PluginInfo> {
        let index = self.inner.index.load();
        index.get(tenant).map_or_else(Vec::new, |plugins| {
            plugins
                .iter()
                .map(|(name, loaded)| info(name, loaded))
                .collect()
        })
    }

    /// Validates, compiles and stores `bytes` as the tenant's plugin
    /// `name`, replacing what the name held. Uploading the bytes a name
    /// already holds changes nothing. When two uploads of one name race,
    /// the one that stores last wins, on disk and in the index alike.
    ///
    /// Blocks on compilation and disk: call it from a blocking thread.
    pub fn upload(
        &self,
        tenant: &str,
        name: &PluginName,
        bytes: &[u8],
        uploaded_by: Option<&str>,
    ) -> Result<(PluginInfo, UploadOutcome), StoreError> {
        self.upload_version(tenant, name, bytes, uploaded_by, None)
    }

    /// [`upload`](Self::upload) of a signed `version`, which must be above
    /// the stored one's (a signed component cannot be rolled back under
    /// its name).
    pub fn upload_version(
        &self,
        tenant: &str,
        name: &PluginName,
        bytes: &[u8],
        uploaded_by: Option<&str>,
        version: Option<u64>,
    ) -> Result<(PluginInfo, UploadOutcome), StoreError> {
        if let Backend::Shared(shared) = &self.inner.backend {
            return shared.upload(&self.inner.index, tenant, name, bytes, uploaded_by, version);
        }
        let store = self.store()?;
        let (digest, compiled) = compile_upload(&self.inner.index, &store.engine, tenant, bytes)?;

        let mut entries = store.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.to_string(), name.clone());
        let previous = entries.get(&key).cloned();
        // A deleted name keeps the version it had (its floor).
        let stored = match previous.as_ref().and_then(|p| p.version) {
            Some(version) => Some(version),
            None if previous.is_none() => store.dir.version_floor(tenant, name)?,
            None => None,
        };
        if let (Some(offered), Some(stored)) = (version, stored)
            && offered <= stored
        {
            return Err(StoreError::VersionNotNewer {
                name: name.to_string(),
                stored,
                offered,
            });
        }
        let outcome = match &previous {
            None => UploadOutcome::Created,
            Some(previous)
                if previous.digest == digest && self.get(tenant, name.as_str()).is_some() =>
            {
                UploadOutcome::Unchanged
            }
            Some(_) => UploadOutcome::Replaced,
        };
        if outcome == UploadOutcome::Unchanged {
            let info = self
                .info(tenant, name.as_str())
                .expect("an unchanged entry is loaded");
            return Ok((info, outcome));
        }
        if previous.is_none() {
            let held = entries.keys().filter(|(t, _)| t == tenant).count();
            if held >= MAX_PLUGINS_PER_TENANT {
                return Err(StoreError::TooManyPlugins {
                    max: MAX_PLUGINS_PER_TENANT,
                });
            }
        }

        // Both written even when another tenant's upload left them: an
        // upload that skipped the writes would be measurably quicker, and
        // tell the tenant which bytes others run.
        store.dir.write_blob(digest, bytes)?;
        store.write_artifact(&compiled)?;
        let meta = EntryMeta {
            digest,
            size_bytes: bytes.len() as u64,
            created_at: unix_now(),
            uploaded_by: disk::uploaded_by(uploaded_by),
            version,
        };
        store.dir.write_entry(tenant, name, &meta)?;
        if previous.is_none() && version.is_some() {
            // The entry now carries a version above the floor: its place is
            // free. (An unsigned entry leaves the floor where it is.)
            store.dir.remove_version_floor(tenant, name)?;
        }
        entries.insert(key, meta.clone());
        let loaded = Loaded { compiled, meta };
        let info = info(name.as_str(), &loaded);
        self.publish(tenant, |plugins| {
            plugins.insert(name.to_string(), loaded);
        });
        if let Some(previous) = previous {
            store.collect(&entries, previous.digest)?;
        }
        Ok((info, outcome))
    }

    /// Removes the tenant's plugin `name` (also one that failed to load)
    /// and returns the digest it had. A request that already holds the
    /// plugin finishes with it.
    pub fn delete(&self, tenant: &str, name: &PluginName) -> Result<PluginDigest, StoreError> {
        if let Backend::Shared(shared) = &self.inner.backend {
            return shared.delete(&self.inner.index, tenant, name);
        }
        let store = self.store()?;
        let mut entries = store.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.to_string(), name.clone());
        let Some(meta) = entries.get(&key).cloned() else {
            return Err(StoreError::NotFound {
                name: name.to_string(),
            });
        };
        if let Some(version) = meta.version {
            store
                .dir
                .write_version_floor(tenant, name, version, MAX_VERSION_FLOORS_PER_TENANT)?;
        }
        store.dir.remove_entry(tenant, name)?;
        entries.remove(&key);
        self.publish(tenant, |plugins| {
            plugins.remove(name.as_str());
        });
        store.collect(&entries, meta.digest)?;
        Ok(meta.digest)
    }

    /// How many tenants share the plugin instance pool (see
    /// [`PluginEngine::share_instances_among`]); nothing without a store.
    pub fn share_instances_among(&self, tenants: usize) {
        match &self.inner.backend {
            Backend::Off => {}
            Backend::Files(store) => store.engine.share_instances_among(tenants),
            Backend::Shared(shared) => shared.engine().share_instances_among(tenants),
        }
    }

    /// The engine the store compiles with (tests hold its compile slots).
    #[cfg(test)]
    pub(crate) fn engine(&self) -> &PluginEngine {
        match &self.inner.backend {
            Backend::Files(store) => &store.engine,
            Backend::Shared(shared) => shared.engine(),
            Backend::Off => panic!("a store"),
        }
    }

    fn store(&self) -> Result<&Store, StoreError> {
        match &self.inner.backend {
            Backend::Files(store) => Ok(store),
            Backend::Off | Backend::Shared(_) => Err(StoreError::Disabled),
        }
    }

    /// Publishes a new index with `change` applied to `tenant`'s map.
    /// Called with the entries lock held, so changes never interleave.
    fn publish(&self, tenant: &str, change: impl FnOnce(&mut BTreeMap<String, Loaded>)) {
        publish(&self.inner.index, tenant, change);
    }
}

/// Publishes a new `index` with `change` applied to `tenant`'s map; the
/// caller holds the lock that orders its store's changes.
fn publish(
    index: &ArcSwap<Index>,
    tenant: &str,
    change: impl FnOnce(&mut BTreeMap<String, Loaded>),
) {
    let mut next = Index::clone(&index.load());
    let plugins = next.entry(tenant.to_string()).or_default();
    change(Arc::make_mut(plugins));
    if plugins.is_empty() {
        next.remove(tenant);
    }
    index.store(Arc::new(next));
}

impl Store {
    /// A referenced digest, ready to serve: its blob must still hash to its
    /// name; its artifact is used when sealed by us, else it is compiled.
    fn load(
        &self,
        digest: PluginDigest,
        report: &mut LoadReport,
    ) -> Result<CompiledPlugin, String> {
        let bytes = self.dir.read_blob(digest)?;
        let cached = cached_plugin(&self.dir, &self.engine, &self.compatibility, digest, &bytes);
        match cached {
            Ok(plugin) => {
                report.deserialized += 1;
                return Ok(plugin);
            }
            Err(why) => tracing::info!(%digest, "compiling the plugin again: {why}"),
        }
        let plugin = self
            .engine
            .validate_and_compile(&bytes)
            .map_err(|e| format!("it no longer passes upload checks: {e}"))?;
        if let Err(e) = self.write_artifact(&plugin) {
            // Served all the same; the next start compiles it again.
            tracing::warn!(%digest, "caching the compiled plugin: {e}");
        }
        report.recompiled += 1;
        Ok(plugin)
    }

    fn write_artifact(&self, plugin: &CompiledPlugin) -> Result<(), StoreError> {
        let code = plugin.serialize()?;
        let sealed = artifact::seal(self.dir.key(), plugin.digest(), &self.compatibility, &code);
        self.dir.write_artifact(plugin.digest(), &sealed)
    }

    /// Removes `digest`'s blob and artifact if no entry refers to it.
    fn collect(
        &self,
        entries: &BTreeMap<(String, PluginName), EntryMeta>,
        digest: PluginDigest,
    ) -> Result<(), StoreError> {
        if entries.values().any(|meta| meta.digest == digest) {
            return Ok(());
        }
        self.dir.remove_blob(digest)
    }
}

/// An upload's digest and code: the tenant id checked, then the bytes
/// validated and compiled, unless one of this tenant's names already holds
/// them. (Only this tenant's: reusing another tenant's would tell, by
/// timing, that it holds these bytes.)
fn compile_upload(
    index: &ArcSwap<Index>,
    engine: &PluginEngine,
    tenant: &str,
    bytes: &[u8],
) -> Result<(PluginDigest, CompiledPlugin), StoreError> {
    if !name::is_valid_tenant(tenant) {
        return Err(StoreError::InvalidTenant {
            tenant: tenant.escape_debug().take(80).collect(),
        });
    }
    let digest = PluginDigest::of(bytes);
    let reused = index.load().get(tenant).and_then(|plugins| {
        plugins
            .values()
            .find(|loaded| loaded.meta.digest == digest)
            .map(|loaded| loaded.compiled.clone())
    });
    let compiled = match reused {
        Some(compiled) => compiled,
        None => engine.validate_and_compile_for(bytes, Compiler::Tenant(tenant))?,
    };
    Ok((digest, compiled))
}

/// `digest`'s compiled code from `dir`'s artifacts, if one is there and
/// sealed by this folder's key for this engine; else why not.
fn cached_plugin(
    dir: &StoreDir,
    engine: &PluginEngine,
    compatibility: &[u8; 32],
    digest: PluginDigest,
    bytes: &[u8],
) -> Result<CompiledPlugin, String> {
    match dir.read_artifact(digest) {
        Ok(Some(file)) => artifact::open(dir.key(), digest, compatibility, file)
            .map_err(|e| e.to_string())
            .and_then(|artifact| {
                engine
                    .load_precompiled(bytes, &artifact)
                    .map_err(|e| e.to_string())
            }),
        Ok(None) => Err("no cached artifact".to_string()),
        Err(e) => Err(e),
    }
}

fn info(name: &str, loaded: &Loaded) -> PluginInfo {
    PluginInfo {
        name: name.to_string(),
        digest: loaded.meta.digest,
        size_bytes: loaded.meta.size_bytes,
        imports: loaded.compiled.imports().to_vec(),
        created_at: loaded.meta.created_at,
        uploaded_by: loaded.meta.uploaded_by.clone(),
        version: loaded.meta.version,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
