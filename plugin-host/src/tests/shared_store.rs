//! The registry over a shared store, against an in-memory one (the
//! PostgreSQL store has its own tests in `bulkhead-state`, two replicas on
//! a real database): replicas, refreshes, the compiled-code cache, bytes
//! the store altered, and a store that went away. Also the folder store
//! read whole for export.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::*;

/// A shared store in memory, with the folder store's rules for one name
/// (versions, unchanged bytes) but none of its caps; `down` makes every
/// call unavailable.
#[derive(Debug, Default)]
struct MemoryStore {
    tables: Mutex<Tables>,
    down: AtomicBool,
}

#[derive(Debug, Default)]
struct Tables {
    blobs: BTreeMap<PluginDigest, Vec<u8>>,
    entries: BTreeMap<(String, PluginName), SharedEntry>,
}

impl MemoryStore {
    fn tables(&self) -> Result<std::sync::MutexGuard<'_, Tables>, StoreError> {
        if self.down.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable("memory store: down".into()));
        }
        Ok(self.tables.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the bytes stored under `digest`, as an edit in the store.
    fn alter(&self, digest: PluginDigest, bytes: &[u8]) {
        self.tables().unwrap().blobs.insert(digest, bytes.to_vec());
    }
}

impl SharedPlugins for MemoryStore {
    fn place(&self) -> &str {
        "the memory store"
    }

    fn entries(&self, tenant: Option<&str>) -> Result<Listing, StoreError> {
        let tables = self.tables()?;
        Ok(Listing {
            entries: tables
                .entries
                .values()
                .filter(|e| tenant.is_none_or(|t| t == e.tenant))
                .cloned()
                .collect(),
            unreadable: Vec::new(),
        })
    }

    fn blob(&self, digest: PluginDigest) -> Result<StoredBlob, StoreError> {
        Ok(match self.tables()?.blobs.get(&digest) {
            Some(bytes) => StoredBlob::Bytes(bytes.clone()),
            None => StoredBlob::Missing,
        })
    }

    fn put(&self, put: SharedPut<'_>) -> Result<(UploadOutcome, SharedEntry), StoreError> {
        let mut tables = self.tables()?;
        let key = (put.entry.tenant.clone(), put.entry.name.clone());
        let existing = tables.entries.get(&key).cloned();
        if let (Some(offered), Some(stored)) =
            (put.entry.version, existing.as_ref().and_then(|e| e.version))
            && offered <= stored
        {
            return Err(StoreError::VersionNotNewer {
                name: key.1.to_string(),
                stored,
                offered,
            });
        }
        let repaired =
            tables.blobs.insert(put.entry.digest, put.bytes.to_vec()) != Some(put.bytes.to_vec());
        if let Some(existing) = &existing
            && existing.digest == put.entry.digest
            && put.entry.version.is_none()
            && !repaired
        {
            return Ok((UploadOutcome::Unchanged, existing.clone()));
        }
        tables.entries.insert(key, put.entry.clone());
        let outcome = match existing {
            Some(_) => UploadOutcome::Replaced,
            None => UploadOutcome::Created,
        };
        Ok((outcome, put.entry.clone()))
    }

    fn delete(&self, tenant: &str, name: &PluginName) -> Result<SharedEntry, StoreError> {
        let mut tables = self.tables()?;
        let removed = tables
            .entries
            .remove(&(tenant.to_string(), name.clone()))
            .ok_or_else(|| StoreError::NotFound {
                name: name.to_string(),
            })?;
        if !tables.entries.values().any(|e| e.digest == removed.digest) {
            tables.blobs.remove(&removed.digest);
        }
        Ok(removed)
    }
}

/// Scratch folders for replicas' caches, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "bulkhead-shared-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        Scratch(path)
    }

    fn cache(&self, replica: &str) -> PathBuf {
        self.0.join(replica)
    }

    fn files(&self, relative: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.0.join(relative))
            .map(|dir| {
                dir.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn replica(store: &Arc<MemoryStore>, cache: Option<&Path>) -> (PluginRegistry, LoadReport) {
    let shared: Arc<dyn SharedPlugins> = Arc::clone(store) as _;
    PluginRegistry::open_shared(shared, cache, test_engine())
        .unwrap_or_else(|e| panic!("opening a replica: {e}"))
}

fn name(name: &str) -> PluginName {
    PluginName::parse(name).unwrap()
}

fn uppercases(plugin: &CompiledPlugin) -> bool {
    let mut call = plugin
        .instantiate(context("under-test", relaxed_limits()))
        .unwrap();
    let out = call.on_request(text_request("hello")).unwrap().unwrap();
    out.prompt == Prompt::Text("HELLO".to_string())
}

#[test]
fn replicas_share_uploads_and_cache_only_compiled_code() {
    require_guests!();
    let scratch = Scratch::new();
    let store = Arc::new(MemoryStore::default());
    let (a, report) = replica(&store, Some(&scratch.cache("a")));
    assert!(a.enabled() && a.is_shared());
    assert!(report.new_key);
    let rewrite = guests::test_guest("rewrite");
    let (info, outcome) = a
        .upload("acme", &name("shout"), &rewrite, Some("alice"))
        .unwrap();
    assert_eq!(outcome, UploadOutcome::Created);
    assert!(uppercases(&a.get("acme", "shout").unwrap()));
    // The cache holds compiled code and its key, never blobs or entries.
    assert_eq!(scratch.files("a"), ["artifacts", "key", "lock"]);
    assert_eq!(
        scratch.files("a/artifacts"),
        [format!("{}.cwasm", info.digest)]
    );

    // Another replica starts: it compiles, then reads its own cache.
    let (b, report) = replica(&store, Some(&scratch.cache("b")));
    assert_eq!((report.plugins, report.recompiled), (1, 1));
    assert_eq!(
        b.info("acme", "shout").unwrap().uploaded_by.as_deref(),
        Some("alice")
    );
    assert_eq!(b.info("acme", "shout").unwrap().created_at, info.created_at);
    drop(b);
    let (b, report) = replica(&store, Some(&scratch.cache("b")));
    assert_eq!((report.deserialized, report.recompiled), (1, 0));
    assert!(uppercases(&b.get("acme", "shout").unwrap()));
    // Without a cache folder, a replica compiles at every start.
    let (_, report) = replica(&store, None);
    assert_eq!((report.plugins, report.recompiled), (1, 1));

    // The same bytes again change nothing.
    let (again, outcome) = a.upload("acme", &name("shout"), &rewrite, None).unwrap();
    assert_eq!(outcome, UploadOutcome::Unchanged);
    assert_eq!(again.uploaded_by.as_deref(), Some("alice"));
}

#[test]
fn a_refresh_publishes_what_other_replicas_changed() {
    require_guests!();
    let scratch = Scratch::new();
    let store = Arc::new(MemoryStore::default());
    let (a, _) = replica(&store, Some(&scratch.cache("a")));
    let (b, _) = replica(&store, Some(&scratch.cache("b")));
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    a.upload("acme", &name("x"), &echo, None).unwrap();
    a.upload("beta", &name("y"), &echo, None).unwrap();
    assert!(b.get("acme", "x").is_none(), "not until told");

    // One tenant's refresh publishes that tenant only.
    let report = b.refresh(Some("acme")).unwrap();
    assert_eq!((report.plugins, report.recompiled), (1, 1));
    assert!(!uppercases(&b.get("acme", "x").unwrap()));
    assert!(b.get("beta", "y").is_none());
    // A full one the rest. Beta's digest is compiled for beta, although
    // acme's copy is served here (see the next test).
    let report = b.refresh(None).unwrap();
    assert_eq!((report.plugins, report.recompiled), (2, 1));
    assert!(b.get("beta", "y").is_some());

    // Replaced on A: B serves the new bytes after its refresh.
    let (replaced, _) = a.upload("acme", &name("x"), &rewrite, None).unwrap();
    b.refresh(Some("acme")).unwrap();
    assert!(uppercases(&b.get("acme", "x").unwrap()));
    assert_eq!(b.info("acme", "x").unwrap().digest, replaced.digest);

    // Deleted on A: gone from B, and from its cache once nothing uses it.
    a.delete("acme", &name("x")).unwrap();
    a.delete("beta", &name("y")).unwrap();
    b.refresh(None).unwrap();
    assert!(b.list("acme").is_empty() && b.list("beta").is_empty());
    assert!(scratch.files("b/artifacts").is_empty());
    assert!(scratch.files("a/artifacts").is_empty());
    // A delete the store no longer knows is NotFound, and gone here too.
    assert!(matches!(
        b.delete("acme", &name("x")),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn a_refresh_reuses_only_the_tenants_own_code() {
    // A tenant that uploads on A and times B must not learn whether some
    // other tenant on B runs the same bytes: B compiles them for it, from
    // neither the other tenant's code nor B's artifact of the digest.
    require_guests!();
    let scratch = Scratch::new();
    let store = Arc::new(MemoryStore::default());
    let (a, _) = replica(&store, Some(&scratch.cache("a")));
    let (b, _) = replica(&store, Some(&scratch.cache("b")));
    let echo = guests::test_guest("echo");
    let (info, _) = a.upload("acme", &name("x"), &echo, None).unwrap();
    let report = b.refresh(Some("acme")).unwrap();
    assert_eq!((report.recompiled, report.deserialized), (1, 0));
    assert_eq!(
        scratch.files("b/artifacts"),
        [format!("{}.cwasm", info.digest)]
    );

    // Another tenant's copy of the same bytes, by a tenant refresh and by
    // the periodic full one.
    a.upload("beta", &name("y"), &echo, None).unwrap();
    let report = b.refresh(Some("beta")).unwrap();
    assert_eq!(
        (report.plugins, report.recompiled, report.deserialized),
        (1, 1, 0)
    );
    a.upload("gamma", &name("z"), &echo, None).unwrap();
    let report = b.refresh(None).unwrap();
    assert_eq!(
        (report.plugins, report.recompiled, report.deserialized),
        (3, 1, 0)
    );
    assert!(!uppercases(&b.get("gamma", "z").unwrap()));

    // A tenant's own code is reused: a second name for bytes it runs.
    a.upload("acme", &name("x2"), &echo, None).unwrap();
    let report = b.refresh(Some("acme")).unwrap();
    assert_eq!(
        (report.plugins, report.recompiled, report.deserialized),
        (2, 0, 0)
    );

    // A start has no one timing a digest: it shares code and artifacts.
    drop(b);
    let (_, report) = replica(&store, Some(&scratch.cache("b")));
    assert_eq!(
        (report.plugins, report.recompiled, report.deserialized),
        (4, 0, 1)
    );
}

#[test]
fn bytes_altered_in_the_store_are_refused_not_served() {
    require_guests!();
    let store = Arc::new(MemoryStore::default());
    let (a, _) = replica(&store, None);
    let (b, _) = replica(&store, None);
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    let (info, _) = a.upload("acme", &name("shout"), &rewrite, None).unwrap();
    // Someone with access to the store puts other (valid!) bytes under
    // the digest.
    store.alter(info.digest, &echo);

    let (c, report) = replica(&store, None);
    assert_eq!((report.plugins, report.failed.len()), (0, 1));
    assert!(
        report.failed[0]
            .reason
            .contains("does not hash to its digest"),
        "{:?}",
        report.failed
    );
    assert!(c.get("acme", "shout").is_none());
    let report = b.refresh(Some("acme")).unwrap();
    assert_eq!(report.failed.len(), 1);
    assert!(b.get("acme", "shout").is_none());
    // A served the bytes it verified at upload; it keeps them.
    assert!(uppercases(&a.get("acme", "shout").unwrap()));

    // Uploading the real bytes again repairs the store.
    let (_, outcome) = a.upload("acme", &name("shout"), &rewrite, None).unwrap();
    assert_eq!(outcome, UploadOutcome::Replaced);
    c.refresh(Some("acme")).unwrap();
    assert!(uppercases(&c.get("acme", "shout").unwrap()));
}

#[test]
fn an_unavailable_store_keeps_the_last_index_and_refuses_changes() {
    require_guests!();
    let store = Arc::new(MemoryStore::default());
    let (a, _) = replica(&store, None);
    let rewrite = guests::test_guest("rewrite");
    a.upload("acme", &name("shout"), &rewrite, None).unwrap();

    store.down.store(true, Ordering::Release);
    let e = a
        .upload("acme", &name("other"), &rewrite, None)
        .unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    assert!(matches!(
        a.delete("acme", &name("shout")),
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(a.refresh(None), Err(StoreError::Unavailable(_))));
    assert!(matches!(
        a.refresh(Some("acme")),
        Err(StoreError::Unavailable(_))
    ));
    // Requests go on with what was loaded.
    assert!(uppercases(&a.get("acme", "shout").unwrap()));
    assert_eq!(a.list("acme").len(), 1);
    // A replica cannot start without the plugins it should serve.
    let shared: Arc<dyn SharedPlugins> = Arc::clone(&store) as _;
    assert!(matches!(
        PluginRegistry::open_shared(shared, None, test_engine()),
        Err(StoreError::Unavailable(_))
    ));

    store.down.store(false, Ordering::Release);
    a.upload("acme", &name("other"), &rewrite, None).unwrap();
    a.refresh(None).unwrap();
    assert_eq!(a.list("acme").len(), 2);
}

#[test]
fn a_folder_store_reads_whole_for_export() {
    require_guests!();
    let scratch = Scratch::new();
    let root = scratch.cache("store");
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    {
        let (registry, _) = PluginRegistry::open(&root, test_engine()).unwrap();
        registry
            .upload("acme", &name("echo"), &echo, Some("alice"))
            .unwrap();
        registry
            .upload("acme", &name("again"), &echo, None)
            .unwrap();
        registry
            .upload_version("beta", &name("shout"), &rewrite, None, Some(4))
            .unwrap();
        registry
            .upload_version("beta", &name("gone"), &rewrite, None, Some(9))
            .unwrap();
        registry.delete("beta", &name("gone")).unwrap();
        // Open: the export waits for the gateway to stop.
        assert!(matches!(
            read_file_store(&root),
            Err(StoreError::InUse { .. })
        ));
    }
    let contents = read_file_store(&root).unwrap();
    let names: Vec<_> = contents
        .entries
        .iter()
        .map(|e| format!("{}/{}", e.tenant, e.name))
        .collect();
    assert_eq!(names, ["acme/again", "acme/echo", "beta/shout"]);
    assert_eq!(contents.blobs.len(), 2);
    assert_eq!(contents.entries[1].uploaded_by.as_deref(), Some("alice"));
    assert_eq!(contents.entries[2].version, Some(4));
    assert_eq!(
        contents.floors,
        [VersionFloor {
            tenant: "beta".into(),
            name: name("gone"),
            version: 9
        }]
    );
    assert!(contents.failed.is_empty(), "{:?}", contents.failed);

    // A blob altered on disk: its entries are reported, not exported.
    let blob = root.join(format!("blobs/{}.wasm", PluginDigest::of(&echo)));
    let mut bytes = fs::read(&blob).unwrap();
    bytes[20] ^= 1;
    fs::write(&blob, bytes).unwrap();
    let contents = read_file_store(&root).unwrap();
    assert_eq!(contents.entries.len(), 1);
    assert_eq!(contents.blobs.len(), 1);
    let failed: Vec<_> = contents.failed.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(failed, ["again", "echo"]);
    assert!(contents.failed[0].reason.contains("does not hash"));

    assert!(matches!(
        read_file_store(&scratch.cache("missing")),
        Err(StoreError::Io { .. })
    ));
}
