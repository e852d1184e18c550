//! A registry over a [`SharedPlugins`] store: what
//! [`super::PluginRegistry::open_shared`] loads, what `refresh` rereads,
//! and how this replica's uploads and deletes write through it.
//!
//! The store is the truth. A change commits there first (which tells every
//! replica), then this replica publishes it. A refresh reads rows, loads
//! the digests it does not serve yet and publishes the result; if the
//! store is unavailable it publishes nothing and the replica goes on
//! serving what it had (the request path never waits on the store).
//!
//! One lock orders a replica's refreshes and its own changes, from the
//! store's read or write to the index's publication, so a refresh that read
//! older rows never publishes after a change that wrote newer ones. The
//! request path never takes it.
//!
//! Every blob read is re-hashed against its digest before it is compiled
//! or matched with a cached artifact; one that does not match is refused
//! (and logged) and its entries are not served. Compiled code is cached
//! per replica in the cache folder, sealed with that folder's key as the
//! folder store seals it.
//!
//! **A change reaches this replica in the same time whether or not another
//! tenant here runs the same bytes.** A tenant can upload on one replica
//! and time how soon another serves it; if a refresh reused another
//! tenant's compiled code or cached artifact for the digest (about 2 ms
//! against about 100 ms for a compile), that delay would tell the tenant
//! which bytes other tenants run. So a refresh reuses only code the same
//! tenant already serves and otherwise compiles, never reading the
//! artifact cache. Only the start, which no tenant can time per digest,
//! shares compiled code and artifacts across tenants.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::disk::{self, StoreDir, Tidied};
use super::shared::{Listing, SharedEntry, SharedPlugins, SharedPut, StoredBlob};
use super::{
    Index, LoadFailure, LoadReport, Loaded, PluginInfo, PluginName, StoreError, UploadOutcome,
    artifact, info, publish, unix_now,
};
use crate::{CompiledPlugin, MAX_COMPONENT_BYTES, PluginDigest, PluginEngine};

/// The registry's backend over a shared store.
pub(super) struct SharedStore {
    engine: PluginEngine,
    compatibility: [u8; 32],
    shared: Arc<dyn SharedPlugins>,
    /// This replica's compiled code (artifacts and their key), if a folder
    /// was given; else every start compiles.
    cache: Option<StoreDir>,
    /// Held from a read or write of the store until the index is published.
    changes: Mutex<Memory>,
}

/// What a replica remembers between refreshes.
#[derive(Default)]
struct Memory {
    /// Digests whose verified bytes do not pass the upload checks with
    /// this engine: the same bytes fail the same way, so they are not
    /// compiled again until a change of one of their tenants asks.
    refused: HashMap<PluginDigest, String>,
    /// The failures last logged, per tenant and name: a refresh logs only
    /// what changed.
    logged: HashMap<(String, String), String>,
}

/// Whose compiled code a rebuild may reuse for a digest (see the module
/// notes on timing).
#[derive(Clone, Copy)]
enum Reuse {
    /// Any tenant's, and the artifact cache: at start.
    AnyTenant,
    /// Only the same tenant's: a refresh. `retry_refused`: compile again
    /// the digests that failed with lasting reasons.
    OwnOnly { retry_refused: bool },
}

/// Why a digest is not served.
enum LoadError {
    /// The store went away mid-read: give up the refresh.
    Unavailable(StoreError),
    /// This digest cannot be served; `lasting` when the same bytes will
    /// fail the same way.
    Refused { reason: String, lasting: bool },
}

impl SharedStore {
    pub(super) fn open(
        shared: Arc<dyn SharedPlugins>,
        cache: Option<&Path>,
        engine: PluginEngine,
    ) -> Result<(SharedStore, Index, LoadReport), StoreError> {
        let started = Instant::now();
        let (cache, tidied) = match cache {
            Some(root) => {
                let (dir, tidied) = StoreDir::open_cache(root)?;
                (Some(dir), tidied)
            }
            None => (None, Tidied::default()),
        };
        let mut report = LoadReport {
            temp_files_removed: tidied.temp_files_removed,
            new_key: tidied.new_key,
            ..LoadReport::default()
        };
        let store = SharedStore {
            compatibility: engine.compatibility_digest(),
            engine,
            shared,
            cache,
            changes: Mutex::default(),
        };
        let listing = store.shared.entries(None)?;
        let mut memory = Memory::default();
        let index = store.rebuild(
            &Index::new(),
            None,
            listing,
            &mut memory,
            Reuse::AnyTenant,
            &mut report,
        )?;
        if let Some(cache) = &store.cache {
            let served = digests(&index);
            for digest in cache.artifact_digests()? {
                if !served.contains(&digest) {
                    cache.remove_artifact(digest)?;
                    report.orphans_removed += 1;
                }
            }
            if cache.holds_entries() {
                tracing::warn!(
                    cache = %cache.root().display(),
                    "the plugin cache folder holds a folder store's entries, which are not \
                     served now that plugins are kept in {}: copy them there with `bulkhead \
                     state migrate`",
                    store.shared.place()
                );
            }
        }
        *store.changes.lock().unwrap_or_else(PoisonError::into_inner) = memory;
        report.elapsed = started.elapsed();
        tracing::info!(
            store = store.shared.place(),
            cache = store.cache.as_ref().map(|c| c.root().display().to_string()),
            plugins = report.plugins,
            from_cache = report.deserialized,
            compiled = report.recompiled,
            failed = report.failed.len(),
            orphans_removed = report.orphans_removed,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "shared plugin store loaded"
        );
        Ok((store, index, report))
    }

    pub(super) fn engine(&self) -> &PluginEngine {
        &self.engine
    }

    pub(super) fn place(&self) -> &str {
        self.shared.place()
    }

    pub(super) fn refresh(
        &self,
        index: &ArcSwap<Index>,
        tenant: Option<&str>,
    ) -> Result<LoadReport, StoreError> {
        let started = Instant::now();
        let mut memory = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let listing = self.shared.entries(tenant)?;
        let current = index.load_full();
        let mut report = LoadReport::default();
        // A tenant's own change retries its refused digests (a re-upload
        // may have repaired them); the periodic resync does not.
        let reuse = Reuse::OwnOnly {
            retry_refused: tenant.is_some(),
        };
        let next = self.rebuild(&current, tenant, listing, &mut memory, reuse, &mut report)?;
        let next = Arc::new(next);
        index.store(Arc::clone(&next));
        self.forget_artifacts(&current, &next);
        drop(memory);
        report.elapsed = started.elapsed();
        tracing::debug!(
            store = self.shared.place(),
            tenant = tenant.unwrap_or("*"),
            plugins = report.plugins,
            from_cache = report.deserialized,
            compiled = report.recompiled,
            failed = report.failed.len(),
            elapsed_ms = report.elapsed.as_millis() as u64,
            "plugins refreshed from the shared store"
        );
        Ok(report)
    }

    pub(super) fn upload(
        &self,
        index: &ArcSwap<Index>,
        tenant: &str,
        name: &PluginName,
        bytes: &[u8],
        uploaded_by: Option<&str>,
        version: Option<u64>,
    ) -> Result<(PluginInfo, UploadOutcome), StoreError> {
        let (digest, compiled) = super::compile_upload(index, &self.engine, tenant, bytes)?;
        let entry = SharedEntry {
            tenant: tenant.to_string(),
            name: name.clone(),
            digest,
            size_bytes: bytes.len() as u64,
            created_at: unix_now(),
            uploaded_by: disk::uploaded_by(uploaded_by),
            version,
        };

        let mut memory = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let (outcome, stored) = self.shared.put(SharedPut {
            entry: &entry,
            bytes,
        })?;
        // Committed: from here on nothing may fail the upload.
        memory.refused.remove(&digest);
        // Written even when another tenant's upload left one: skipping the
        // write would make this upload measurably quicker, and tell.
        if let Some(cache) = &self.cache
            && let Err(e) = self.write_artifact(cache, &compiled)
        {
            tracing::warn!(%digest, "caching the compiled plugin: {e}");
        }
        let before = index.load_full();
        let loaded = Loaded {
            compiled,
            meta: stored.meta(),
        };
        let shown = info(name.as_str(), &loaded);
        publish(index, tenant, |plugins| {
            plugins.insert(name.to_string(), loaded);
        });
        self.forget_artifacts(&before, &index.load());
        drop(memory);
        Ok((shown, outcome))
    }

    pub(super) fn delete(
        &self,
        index: &ArcSwap<Index>,
        tenant: &str,
        name: &PluginName,
    ) -> Result<PluginDigest, StoreError> {
        let _memory = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let deleted = self.shared.delete(tenant, name);
        if matches!(deleted, Ok(_) | Err(StoreError::NotFound { .. })) {
            // Gone from the store (perhaps by another replica first): gone here.
            let before = index.load_full();
            if before
                .get(tenant)
                .is_some_and(|plugins| plugins.contains_key(name.as_str()))
            {
                publish(index, tenant, |plugins| {
                    plugins.remove(name.as_str());
                });
                self.forget_artifacts(&before, &index.load());
            }
        }
        deleted.map(|entry| entry.digest)
    }

    /// The index with `listing` in place of `scope`'s tenant (of every
    /// tenant for `None`), reusing what `current` already serves as `reuse`
    /// allows.
    fn rebuild(
        &self,
        current: &Index,
        scope: Option<&str>,
        listing: Listing,
        memory: &mut Memory,
        reuse: Reuse,
        report: &mut LoadReport,
    ) -> Result<Index, StoreError> {
        // Compiled code by (tenant, digest); the tenant is left out where
        // any tenant's code may be reused.
        let owner = |tenant: &str| match reuse {
            Reuse::AnyTenant => None,
            Reuse::OwnOnly { .. } => Some(tenant.to_string()),
        };
        let mut known: HashMap<(Option<String>, PluginDigest), CompiledPlugin> = current
            .iter()
            .flat_map(|(tenant, plugins)| plugins.values().map(move |loaded| (tenant, loaded)))
            .map(|(tenant, loaded)| {
                let key = (owner(tenant), loaded.meta.digest);
                (key, loaded.compiled.clone())
            })
            .collect();
        let (retry_refused, use_artifacts) = match reuse {
            Reuse::AnyTenant => (true, true),
            Reuse::OwnOnly { retry_refused } => (retry_refused, false),
        };
        let mut next = match scope {
            None => Index::new(),
            Some(tenant) => {
                let mut next = current.clone();
                next.remove(tenant);
                next
            }
        };
        let mut failed = listing.unreadable;
        for entry in listing.entries {
            if scope.is_some_and(|tenant| tenant != entry.tenant) {
                continue;
            }
            let digest = entry.digest;
            let key = (owner(&entry.tenant), digest);
            let compiled = match known.get(&key) {
                Some(compiled) => Ok(compiled.clone()),
                None => match memory.refused.get(&digest) {
                    Some(reason) if !retry_refused => Err(reason.clone()),
                    _ => match self.load(digest, use_artifacts, report) {
                        Ok(compiled) => {
                            memory.refused.remove(&digest);
                            known.insert(key, compiled.clone());
                            Ok(compiled)
                        }
                        Err(LoadError::Unavailable(e)) => return Err(e),
                        Err(LoadError::Refused { reason, lasting }) => {
                            if lasting {
                                memory.refused.insert(digest, reason.clone());
                            }
                            Err(reason)
                        }
                    },
                },
            };
            match compiled {
                Ok(compiled) => {
                    let plugins = next.entry(entry.tenant.clone()).or_default();
                    Arc::make_mut(plugins).insert(
                        entry.name.to_string(),
                        Loaded {
                            compiled,
                            meta: entry.meta(),
                        },
                    );
                    report.plugins += 1;
                }
                Err(reason) => failed.push(LoadFailure {
                    tenant: entry.tenant,
                    name: entry.name.to_string(),
                    reason,
                }),
            }
        }
        self.log_failures(scope, &failed, memory);
        report.failed.extend(failed);
        Ok(next)
    }

    /// Logs each failure once (until it changes or is cured); `scope`: the
    /// tenant (or all) whose failures `failed` lists in full.
    fn log_failures(&self, scope: Option<&str>, failed: &[LoadFailure], memory: &mut Memory) {
        memory
            .logged
            .retain(|(tenant, _), _| scope.is_some_and(|scope| scope != tenant));
        for failure in failed {
            let key = (failure.tenant.clone(), failure.name.clone());
            let previous = memory.logged.insert(key, failure.reason.clone());
            if previous.as_deref() != Some(failure.reason.as_str()) {
                tracing::error!(
                    tenant = %failure.tenant,
                    plugin = %failure.name,
                    store = self.shared.place(),
                    "plugin not loaded: {}",
                    failure.reason
                );
            }
        }
    }

    /// A digest ready to serve: its blob must hash to it; its artifact is
    /// used when `use_artifacts` and this replica sealed it, else it is
    /// compiled (and cached).
    fn load(
        &self,
        digest: PluginDigest,
        use_artifacts: bool,
        report: &mut LoadReport,
    ) -> Result<CompiledPlugin, LoadError> {
        let place = self.shared.place();
        let refused = |reason: String| LoadError::Refused {
            reason,
            lasting: false,
        };
        let bytes = match self.shared.blob(digest) {
            Ok(StoredBlob::Bytes(bytes)) => bytes,
            Ok(StoredBlob::Missing) => {
                return Err(refused(format!("its blob is missing from {place}")));
            }
            Ok(StoredBlob::TooLarge { size_bytes }) => {
                return Err(refused(format!(
                    "its blob in {place} is {size_bytes} bytes, over the limit of \
                     {MAX_COMPONENT_BYTES}"
                )));
            }
            Err(e @ StoreError::Unavailable(_)) => return Err(LoadError::Unavailable(e)),
            Err(e) => return Err(refused(e.to_string())),
        };
        if bytes.len() > MAX_COMPONENT_BYTES {
            return Err(refused(format!(
                "its blob in {place} is over the limit of {MAX_COMPONENT_BYTES} bytes"
            )));
        }
        let actual = PluginDigest::of(&bytes);
        if actual != digest {
            return Err(refused(format!(
                "its blob in {place} does not hash to its digest (sha256 {actual}): altered in \
                 the store"
            )));
        }
        if let Some(cache) = self.cache.as_ref().filter(|_| use_artifacts) {
            match super::cached_plugin(cache, &self.engine, &self.compatibility, digest, &bytes) {
                Ok(plugin) => {
                    report.deserialized += 1;
                    return Ok(plugin);
                }
                Err(why) => tracing::debug!(%digest, "compiling the plugin: {why}"),
            }
        }
        let plugin = self.engine.validate_and_compile(&bytes).map_err(|e| {
            // Busy or slow is this gateway's state, not the bytes'.
            let lasting = !e.retryable() && !matches!(e, crate::PluginError::CompileTimeout { .. });
            LoadError::Refused {
                reason: format!("it does not pass upload checks: {e}"),
                lasting,
            }
        })?;
        if let Some(cache) = &self.cache
            && let Err(e) = self.write_artifact(cache, &plugin)
        {
            // Served all the same; the next start compiles it again.
            tracing::warn!(%digest, "caching the compiled plugin: {e}");
        }
        report.recompiled += 1;
        Ok(plugin)
    }

    fn write_artifact(&self, cache: &StoreDir, plugin: &CompiledPlugin) -> Result<(), StoreError> {
        let code = plugin.serialize()?;
        let sealed = artifact::seal(cache.key(), plugin.digest(), &self.compatibility, &code);
        cache.write_artifact(plugin.digest(), &sealed)
    }

    /// Removes the cached artifacts of digests `before` served and `after`
    /// does not (a failure only leaves a file the next start removes).
    fn forget_artifacts(&self, before: &Index, after: &Index) {
        let Some(cache) = &self.cache else {
            return;
        };
        let kept = digests(after);
        for digest in digests(before).difference(&kept) {
            if let Err(e) = cache.remove_artifact(*digest) {
                tracing::warn!(%digest, "removing a cached plugin artifact: {e}");
            }
        }
    }
}

fn digests(index: &Index) -> BTreeSet<PluginDigest> {
    index
        .values()
        .flat_map(|plugins| plugins.values())
        .map(|loaded| loaded.meta.digest)
        .collect()
}
