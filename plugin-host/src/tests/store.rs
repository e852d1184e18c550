//! The plugin store: uploads, the index, what survives a restart, and what
//! a damaged or interrupted store does at open.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A scratch store folder, removed on drop, and an engine of its own: a
/// tenant's one compile at a time is counted per engine, and the tests run
/// at once with the same tenant names.
struct TempStore(PathBuf, PluginEngine);

impl TempStore {
    fn new() -> TempStore {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "bulkhead-store-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        // A parent that does not exist yet: open creates the whole path.
        TempStore(path.join("store"), test_engine())
    }

    fn open(&self) -> (PluginRegistry, LoadReport) {
        PluginRegistry::open(&self.0, self.1.clone())
            .unwrap_or_else(|e| panic!("opening the store: {e}"))
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.0.join(relative)
    }

    fn files(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(self.0.parent().unwrap());
    }
}

fn name(name: &str) -> PluginName {
    PluginName::parse(name).unwrap()
}

fn upload(
    registry: &PluginRegistry,
    tenant: &str,
    plugin: &str,
    bytes: &[u8],
) -> (PluginInfo, UploadOutcome) {
    registry
        .upload(tenant, &name(plugin), bytes, Some("alice"))
        .unwrap_or_else(|e| panic!("uploading {plugin}: {e}"))
}

/// The plugin answers a request the way `echo` or `rewrite` do.
fn assert_runs(plugin: &CompiledPlugin, uppercases: bool) {
    let mut call = plugin
        .instantiate(context("under-test", relaxed_limits()))
        .unwrap();
    let out = call.on_request(text_request("hello")).unwrap().unwrap();
    let expected = if uppercases { "HELLO" } else { "hello" };
    assert_eq!(out.prompt, Prompt::Text(expected.to_string()));
}

fn flip_byte(path: &Path, from_end: usize) {
    let mut bytes = fs::read(path).unwrap();
    let at = bytes.len() - 1 - from_end;
    bytes[at] ^= 0x01;
    fs::write(path, bytes).unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn upload_get_list_replace_and_delete() {
    require_guests!();
    let store = TempStore::new();
    let (registry, report) = store.open();
    assert!(report.new_key);
    assert_eq!(report.plugins, 0);
    let echo = guests::test_guest("echo");
    let rewrite = guests::test_guest("rewrite");

    let (info, outcome) = upload(&registry, "acme", "filter", &echo);
    assert_eq!(outcome, UploadOutcome::Created);
    assert_eq!(info.digest, PluginDigest::of(&echo));
    assert_eq!(info.size_bytes, echo.len() as u64);
    assert_eq!(info.uploaded_by.as_deref(), Some("alice"));
    assert!(
        info.imports
            .iter()
            .any(|i| i.starts_with("bulkhead:plugin/types@"))
    );
    assert!(info.created_at > 1_700_000_000);
    assert_runs(&registry.get("acme", "filter").unwrap(), false);

    // The same bytes again: nothing changes.
    let (again, outcome) = upload(&registry, "acme", "filter", &echo);
    assert_eq!(outcome, UploadOutcome::Unchanged);
    assert_eq!(again.created_at, info.created_at);

    upload(&registry, "acme", "another", &echo);
    let names: Vec<_> = registry.list("acme").into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["another", "filter"]);
    // Two names, one blob.
    assert_eq!(store.files("blobs"), [format!("{}.wasm", info.digest)]);
    assert_eq!(store.files("tenants/acme"), ["another.json", "filter.json"]);

    let (replaced, outcome) = upload(&registry, "acme", "filter", &rewrite);
    assert_eq!(outcome, UploadOutcome::Replaced);
    assert_eq!(replaced.digest, PluginDigest::of(&rewrite));
    assert_runs(&registry.get("acme", "filter").unwrap(), true);
    assert_eq!(store.files("blobs").len(), 2, "`another` still uses echo");

    registry.delete("acme", &name("another")).unwrap();
    assert!(registry.get("acme", "another").is_none());
    assert_eq!(
        store.files("blobs"),
        [format!("{}.wasm", replaced.digest)],
        "echo's blob went with its last entry"
    );
    assert_eq!(
        store.files("artifacts"),
        [format!("{}.cwasm", replaced.digest)]
    );
    assert!(matches!(
        registry.delete("acme", &name("another")),
        Err(StoreError::NotFound { .. })
    ));
    registry.delete("acme", &name("filter")).unwrap();
    assert!(registry.list("acme").is_empty());
    assert!(store.files("blobs").is_empty());
    assert!(store.files("artifacts").is_empty());
}

#[test]
fn a_reopened_store_serves_the_same_plugins_from_cached_artifacts() {
    require_guests!();
    let store = TempStore::new();
    let echo = guests::test_guest("echo");
    let rewrite = guests::test_guest("rewrite");
    {
        let (registry, _) = store.open();
        upload(&registry, "acme", "echo", &echo);
        upload(&registry, "acme", "shout", &rewrite);
        upload(&registry, "beta", "shout", &rewrite);
    }
    let (registry, report) = store.open();
    assert_eq!(report.plugins, 3);
    // Two distinct components, both read back from their artifacts.
    assert_eq!((report.deserialized, report.recompiled), (2, 0));
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(!report.new_key);
    assert_runs(&registry.get("acme", "echo").unwrap(), false);
    assert_runs(&registry.get("acme", "shout").unwrap(), true);
    assert_runs(&registry.get("beta", "shout").unwrap(), true);
    let info = registry.info("acme", "echo").unwrap();
    assert_eq!(info.digest, PluginDigest::of(&echo));
    assert_eq!(info.uploaded_by.as_deref(), Some("alice"));
}

#[test]
fn an_altered_artifact_is_compiled_again_not_loaded() {
    require_guests!();
    let store = TempStore::new();
    let rewrite = guests::test_guest("rewrite");
    let digest = PluginDigest::of(&rewrite);
    let artifact = store.path(&format!("artifacts/{digest}.cwasm"));
    {
        let (registry, _) = store.open();
        upload(&registry, "acme", "shout", &rewrite);
    }
    let original = fs::read(&artifact).unwrap();
    // A byte of the code, a byte of the MAC (header: 8 magic + 32 engine).
    for offset_from_start in [None, Some(8 + 32 + 5)] {
        match offset_from_start {
            None => flip_byte(&artifact, 100),
            Some(at) => {
                let mut bytes = original.clone();
                bytes[at] ^= 0x80;
                fs::write(&artifact, bytes).unwrap();
            }
        }
        let (registry, report) = store.open();
        assert_eq!((report.deserialized, report.recompiled), (0, 1));
        assert_runs(&registry.get("acme", "shout").unwrap(), true);
        drop(registry);
        // Rewritten: the next open uses it again.
        let (_, report) = store.open();
        assert_eq!((report.deserialized, report.recompiled), (1, 0));
    }

    // A new key: every artifact fails its MAC.
    fs::write(store.path("key"), [0u8; 5]).unwrap();
    let (registry, report) = store.open();
    assert!(report.new_key);
    assert_eq!((report.deserialized, report.recompiled), (0, 1));
    assert_runs(&registry.get("acme", "shout").unwrap(), true);
    drop(registry);

    // Garbage in place of the artifact, or none at all.
    fs::write(&artifact, b"\x7fELF not ours").unwrap();
    assert_eq!(store.open().1.recompiled, 1);
    fs::remove_file(&artifact).unwrap();
    assert_eq!(store.open().1.recompiled, 1);
    assert!(artifact.is_file());
}

#[test]
fn an_altered_blob_is_refused_and_the_rest_still_load() {
    require_guests!();
    let store = TempStore::new();
    let echo = guests::test_guest("echo");
    let rewrite = guests::test_guest("rewrite");
    {
        let (registry, _) = store.open();
        upload(&registry, "acme", "echo", &echo);
        upload(&registry, "acme", "shout", &rewrite);
    }
    let blob = store.path(&format!("blobs/{}.wasm", PluginDigest::of(&echo)));
    flip_byte(&blob, 10);

    let (registry, report) = store.open();
    assert_eq!(report.plugins, 1);
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    let failure = &report.failed[0];
    assert_eq!((&*failure.tenant, &*failure.name), ("acme", "echo"));
    assert!(
        failure.reason.contains("does not hash to its name"),
        "{}",
        failure.reason
    );
    assert!(registry.get("acme", "echo").is_none());
    assert_runs(&registry.get("acme", "shout").unwrap(), true);
    // Kept for inspection, entry and blob alike.
    assert!(blob.is_file());
    assert!(store.path("tenants/acme/echo.json").is_file());

    // Uploading the real bytes again repairs it.
    let (_, outcome) = upload(&registry, "acme", "echo", &echo);
    assert_eq!(outcome, UploadOutcome::Replaced);
    assert_eq!(
        PluginDigest::of(&fs::read(&blob).unwrap()),
        PluginDigest::of(&echo)
    );
    drop(registry);
    let (registry, report) = store.open();
    assert_eq!((report.plugins, report.failed.len()), (2, 0));

    // A missing blob is refused the same way, and its entry can be deleted.
    drop(registry);
    fs::remove_file(&blob).unwrap();
    let (registry, report) = store.open();
    assert!(
        report.failed[0].reason.contains("is missing"),
        "{:?}",
        report.failed
    );
    registry.delete("acme", &name("echo")).unwrap();
    assert!(!store.path("tenants/acme/echo.json").exists());
}

#[test]
fn the_store_is_private_to_the_gateway() {
    let store = TempStore::new();
    let (registry, _) = store.open();
    assert_eq!(mode(&store.path("key")), 0o600);
    assert_eq!(fs::metadata(store.path("key")).unwrap().len(), 32);
    for dir in ["", "blobs", "artifacts", "tenants"] {
        assert_eq!(mode(&store.path(dir)), 0o700, "{dir}");
    }
    // A second gateway on the same store is refused while this one runs.
    let Err(e) = PluginRegistry::open(&store.0, store.1.clone()) else {
        panic!("opened twice")
    };
    assert!(matches!(e, StoreError::InUse { .. }), "{e}");
    let key = fs::read(store.path("key")).unwrap();
    drop(registry);

    // A key others can read is made private again, and kept.
    fs::set_permissions(store.path("key"), fs::Permissions::from_mode(0o644)).unwrap();
    let (_, report) = store.open();
    assert!(!report.new_key);
    assert_eq!(mode(&store.path("key")), 0o600);
    assert_eq!(fs::read(store.path("key")).unwrap(), key);
}

#[test]
fn tenants_see_and_touch_only_their_own_plugins() {
    require_guests!();
    let store = TempStore::new();
    let (registry, _) = store.open();
    upload(&registry, "acme", "filter", &guests::test_guest("echo"));
    assert!(registry.get("beta", "filter").is_none());
    assert!(registry.info("beta", "filter").is_none());
    assert!(registry.list("beta").is_empty());
    assert!(matches!(
        registry.delete("beta", &name("filter")),
        Err(StoreError::NotFound { .. })
    ));
    let (_, outcome) = upload(&registry, "beta", "filter", &guests::test_guest("rewrite"));
    assert_eq!(outcome, UploadOutcome::Created);
    assert_runs(&registry.get("acme", "filter").unwrap(), false);
    assert_runs(&registry.get("beta", "filter").unwrap(), true);

    // A tenant id that could escape the store is refused outright.
    for tenant in ["../acme", "", "a/b"] {
        assert!(matches!(
            registry.upload(tenant, &name("x"), &guests::test_guest("echo"), None),
            Err(StoreError::InvalidTenant { .. })
        ));
    }
}

#[test]
fn an_upload_of_bytes_another_tenant_holds_does_the_same_work() {
    // Skipping the writes for stored bytes would make the upload quicker
    // and tell the tenant that someone else runs them: both files are
    // written again (a new file, renamed over the old one).
    require_guests!();
    use std::os::unix::fs::MetadataExt;
    let store = TempStore::new();
    let (registry, _) = store.open();
    let echo = guests::test_guest("echo");
    let (info, _) = upload(&registry, "acme", "filter", &echo);
    let files = [
        store.path(&format!("blobs/{}.wasm", info.digest)),
        store.path(&format!("artifacts/{}.cwasm", info.digest)),
    ];
    let inodes = |files: &[PathBuf]| -> Vec<u64> {
        files
            .iter()
            .map(|f| fs::metadata(f).unwrap().ino())
            .collect()
    };
    let before = inodes(&files);
    upload(&registry, "beta", "other", &echo);
    let after = inodes(&files);
    assert!(
        before.iter().zip(&after).all(|(b, a)| b != a),
        "blob and artifact rewritten: {before:?} -> {after:?}"
    );
    assert_runs(&registry.get("acme", "filter").unwrap(), false);
    assert_runs(&registry.get("beta", "other").unwrap(), false);
}

#[test]
fn a_refused_upload_leaves_nothing_behind() {
    let store = TempStore::new();
    let (registry, _) = store.open();
    let core_module = wat::parse_str("(module)").unwrap();
    let forbidden =
        wat::parse_str(r#"(component (import "wasi:filesystem/types@0.2.6" (instance)))"#).unwrap();
    assert!(matches!(
        registry.upload("acme", &name("x"), &core_module, None),
        Err(StoreError::Refused(PluginError::NotAComponent))
    ));
    let e = registry
        .upload("acme", &name("x"), &forbidden, None)
        .unwrap_err();
    assert!(
        e.to_string().contains("`wasi:filesystem/types@0.2.6`"),
        "{e}"
    );
    assert!(store.files("blobs").is_empty());
    assert!(store.files("tenants").is_empty());
    assert!(registry.list("acme").is_empty());
}

#[test]
fn uploads_are_off_without_a_store() {
    let registry = PluginRegistry::disabled();
    assert!(!registry.enabled());
    assert!(registry.get("acme", "x").is_none());
    let e = registry
        .upload("acme", &name("x"), b"\0asm", None)
        .unwrap_err();
    assert!(matches!(e, StoreError::Disabled));
    assert!(e.to_string().contains("`store`"), "{e}");
    assert!(matches!(
        registry.delete("acme", &name("x")),
        Err(StoreError::Disabled)
    ));
}

#[test]
fn a_tenant_may_keep_at_most_the_cap() {
    require_guests!();
    let store = TempStore::new();
    let (registry, _) = store.open();
    let echo = guests::test_guest("echo");
    // One compile; the rest reuse it (same tenant, same bytes).
    for i in 0..MAX_PLUGINS_PER_TENANT {
        upload(&registry, "acme", &format!("p{i}"), &echo);
    }
    let e = registry
        .upload("acme", &name("one-more"), &echo, None)
        .unwrap_err();
    assert!(matches!(e, StoreError::TooManyPlugins { max: 64 }), "{e}");
    // Replacing a name is not one more; another tenant has its own cap.
    let (_, outcome) = upload(&registry, "acme", "p0", &guests::test_guest("rewrite"));
    assert_eq!(outcome, UploadOutcome::Replaced);
    upload(&registry, "beta", "one-more", &echo);
    registry.delete("acme", &name("p1")).unwrap();
    upload(&registry, "acme", "one-more", &echo);
}

#[test]
fn interrupted_writes_and_orphans_are_cleaned_at_open() {
    require_guests!();
    let store = TempStore::new();
    let echo = guests::test_guest("echo");
    {
        let (registry, _) = store.open();
        upload(&registry, "acme", "echo", &echo);
    }
    // What a crash mid-write leaves: temp files beside their targets, and a
    // blob (with its artifact) whose entry was never written.
    fs::write(store.path("tenants/acme/.tmp-1-0-echo.json"), b"{\"form").unwrap();
    fs::write(store.path("blobs/.tmp-1-1-x.wasm"), b"\0asm").unwrap();
    fs::write(store.path(".tmp-1-2-key"), b"").unwrap();
    let orphan = PluginDigest::of(b"orphan");
    fs::write(store.path(&format!("blobs/{orphan}.wasm")), b"orphan").unwrap();
    fs::write(store.path(&format!("artifacts/{orphan}.cwasm")), b"x").unwrap();
    // An entry that is not valid JSON is reported, not fatal.
    fs::write(store.path("tenants/acme/broken.json"), b"{").unwrap();

    let (registry, report) = store.open();
    assert_eq!(report.temp_files_removed, 3);
    assert_eq!(report.orphans_removed, 1);
    assert_eq!(report.plugins, 1);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].name, "broken");
    assert_eq!(store.files("tenants/acme"), ["broken.json", "echo.json"]);
    assert_eq!(
        store.files("blobs"),
        [format!("{}.wasm", PluginDigest::of(&echo))]
    );
    assert_runs(&registry.get("acme", "echo").unwrap(), false);
}

#[test]
fn racing_uploads_of_one_name_leave_index_and_disk_agreeing() {
    require_guests!();
    let store = TempStore::new();
    let (registry, _) = store.open();
    let versions = [guests::test_guest("echo"), guests::test_guest("rewrite")];
    let barrier = Barrier::new(versions.len());
    let outcomes: Vec<UploadOutcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = versions
            .iter()
            .map(|bytes| {
                let (registry, barrier) = (&registry, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    // The tenant compiles one upload at a time: the other
                    // is told it is busy, and tries again.
                    loop {
                        match registry.upload("acme", &name("racy"), bytes, None) {
                            Ok((_, outcome)) => break outcome,
                            Err(StoreError::Refused(PluginError::TenantCompileBusy { .. })) => {
                                std::thread::yield_now();
                            }
                            Err(e) => panic!("uploading racy: {e}"),
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = outcomes.clone();
    sorted.sort_by_key(|o| o.as_str());
    assert_eq!(sorted, [UploadOutcome::Created, UploadOutcome::Replaced]);

    let served = registry.get("acme", "racy").unwrap().digest();
    let entry = fs::read_to_string(store.path("tenants/acme/racy.json")).unwrap();
    assert!(entry.contains(&format!("sha256:{served}")), "{entry}");
    // Only the winner's blob is left.
    assert_eq!(store.files("blobs"), [format!("{served}.wasm")]);
    drop(registry);
    let (registry, _) = store.open();
    assert_eq!(registry.get("acme", "racy").unwrap().digest(), served);
}

#[test]
fn a_plugin_held_by_a_request_outlives_its_deletion() {
    require_guests!();
    let store = TempStore::new();
    let (registry, _) = store.open();
    upload(&registry, "acme", "shout", &guests::test_guest("rewrite"));
    let held = registry.get("acme", "shout").unwrap();
    registry.delete("acme", &name("shout")).unwrap();
    assert!(registry.get("acme", "shout").is_none());
    assert_runs(&held, true);
}

#[test]
fn a_tenant_compiles_one_upload_at_a_time_and_leaves_the_others_theirs() {
    let store = TempStore::new();
    let (registry, _) = store.open();
    // acme's upload is compiling (its turn is taken)...
    let turn = registry
        .engine()
        .hold_compile_slot(Compiler::Tenant("acme"))
        .expect("acme's turn");
    let e = registry
        .upload("acme", &name("x"), &guests::test_guest("echo"), None)
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Refused(PluginError::TenantCompileBusy { ref tenant }) if tenant == "acme"),
        "{e:?}"
    );
    // ...while beta compiles its own.
    upload(&registry, "beta", "x", &guests::test_guest("echo"));
    drop(turn);
    upload(&registry, "acme", "x", &guests::test_guest("echo"));
}

#[test]
fn a_signed_version_only_grows_and_survives_a_restart() {
    let store = TempStore::new();
    let (registry, _) = store.open();
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    let (info, _) = registry
        .upload_version("acme", &name("x"), &echo, None, Some(5))
        .unwrap();
    assert_eq!(info.version, Some(5));
    for stale in [5, 4] {
        let e = registry
            .upload_version("acme", &name("x"), &rewrite, None, Some(stale))
            .unwrap_err();
        assert!(
            matches!(e, StoreError::VersionNotNewer { stored: 5, offered, .. } if offered == stale),
            "{e:?}"
        );
    }
    drop(registry);
    let (reopened, _) = store.open();
    assert_eq!(reopened.info("acme", "x").unwrap().version, Some(5));
    let e = reopened
        .upload_version("acme", &name("x"), &rewrite, None, Some(3))
        .unwrap_err();
    assert!(matches!(e, StoreError::VersionNotNewer { .. }), "{e:?}");
    let (info, outcome) = reopened
        .upload_version("acme", &name("x"), &rewrite, None, Some(6))
        .unwrap();
    assert_eq!((info.version, outcome), (Some(6), UploadOutcome::Replaced));
}

#[test]
fn a_deleted_signed_plugin_keeps_its_version_so_it_cannot_be_rolled_back() {
    let store = TempStore::new();
    let (registry, _) = store.open();
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    registry
        .upload_version("acme", &name("guard"), &rewrite, None, Some(7))
        .unwrap();
    registry.delete("acme", &name("guard")).unwrap();
    // The old harmless version, or any not above 7, cannot take the name.
    for stale in [3, 7] {
        let e = registry
            .upload_version("acme", &name("guard"), &echo, None, Some(stale))
            .unwrap_err();
        assert!(
            matches!(e, StoreError::VersionNotNewer { stored: 7, .. }),
            "{e:?}"
        );
    }
    // Also after a restart, and for this name only.
    drop(registry);
    let (registry, _) = store.open();
    let e = registry
        .upload_version("acme", &name("guard"), &echo, None, Some(6))
        .unwrap_err();
    assert!(matches!(e, StoreError::VersionNotNewer { .. }), "{e:?}");
    registry
        .upload_version("acme", &name("other"), &echo, None, Some(1))
        .unwrap();
    registry
        .upload_version("beta", &name("guard"), &echo, None, Some(1))
        .unwrap();
    // A newer one is taken, and its entry carries the version from then on.
    registry
        .upload_version("acme", &name("guard"), &echo, None, Some(8))
        .unwrap();
    assert_eq!(store.files("versions/acme"), Vec::<String>::new());
}
