use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::super::test_folder::TestFolder;
use super::*;
use crate::policy::{Policy, load};

/// How long a reload may take on a slow, busy test machine; reaching it is a failure.
const PATIENCE: Duration = Duration::from_secs(10);

fn tenant(id: &str, burst: u32) -> String {
    format!(
        "id = \"{id}\"\n\n[jwt]\nissuer = \"{id}-issuer\"\naudience = [\"bulkhead\"]\n\
         algorithms = [\"EdDSA\"]\n\n[limits]\nburst = {burst}\n"
    )
}

/// Replaces `name` in one step, as careful tools do; the temp name is hidden,
/// so neither the loader nor the fingerprint sees a half-written file.
fn replace(folder: &TestFolder, name: &str, text: &str) {
    let temp = format!("tenants/.{}.tmp", name.replace('/', "_"));
    folder.write(&temp, text);
    std::fs::rename(folder.path().join(temp), folder.path().join(name)).unwrap();
}

/// Waits for a reload attempt after which `done` holds.
async fn wait_until(reloads: &mut tokio_watch::Receiver<u64>, what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(PATIENCE, reloads.wait_for(|_| done()))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
        .expect("the watcher is running");
}

#[tokio::test]
async fn changes_are_published_and_bad_edits_keep_the_old_policy() {
    let folder = TestFolder::new();
    folder.write("tenants/acme.toml", tenant("acme", 5));
    let current = Arc::new(ArcSwap::from_pointee(load(folder.path()).unwrap()));
    let watcher = watch(folder.path(), load, Arc::clone(&current)).unwrap();
    let stats = Arc::clone(watcher.stats());
    let mut reloads = watcher.subscribe();
    let burst = |id: &str| current.load().tenants.get(id).map(|t| t.limits.burst);

    // The rebuild at start.
    wait_until(&mut reloads, "the first rebuild", || {
        stats.reloads_ok.load(Ordering::Relaxed) == 1
    })
    .await;

    replace(&folder, "tenants/beta.toml", &tenant("beta", 7));
    wait_until(&mut reloads, "beta appears", || burst("beta") == Some(7)).await;
    assert_eq!(burst("acme"), Some(5));

    let before: Arc<Policy> = current.load_full();
    replace(&folder, "tenants/beta.toml", "id = \"beta\"\n[jwt\n");
    wait_until(&mut reloads, "the broken edit is refused", || {
        stats.reloads_failed.load(Ordering::Relaxed) == 1
    })
    .await;
    assert!(
        Arc::ptr_eq(&before, &current.load_full()),
        "the old policy stays"
    );
    let last_error = stats.last_error.lock().unwrap().clone().unwrap();
    let beta = folder.path().join("tenants/beta.toml");
    assert!(
        last_error.starts_with(&format!("{}:2:5: ", beta.display())),
        "{last_error}"
    );

    replace(&folder, "tenants/beta.toml", &tenant("beta", 9));
    wait_until(&mut reloads, "the fix is published", || {
        burst("beta") == Some(9)
    })
    .await;
    assert_eq!(stats.reloads_failed.load(Ordering::Relaxed), 1);
    assert_eq!(*stats.last_error.lock().unwrap(), None);
}

#[tokio::test]
async fn rewriting_the_same_bytes_rebuilds_nothing() {
    let folder = TestFolder::new();
    folder.write("tenants/acme.toml", tenant("acme", 5));
    let current = Arc::new(ArcSwap::from_pointee(load(folder.path()).unwrap()));
    let watcher = watch(folder.path(), load, Arc::clone(&current)).unwrap();
    let stats = Arc::clone(watcher.stats());
    let mut reloads = watcher.subscribe();
    wait_until(&mut reloads, "the first rebuild", || {
        stats.reloads_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    let before = current.load_full();

    folder.write("tenants/acme.toml", tenant("acme", 5));
    wait_until(&mut reloads, "the rewrite is noticed", || {
        stats.reloads_skipped.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(stats.reloads_ok.load(Ordering::Relaxed), 1);
    assert!(Arc::ptr_eq(&before, &current.load_full()));
}

#[test]
fn opening_and_reading_files_is_not_a_change() {
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
    assert!(!is_change(&EventKind::Access(AccessKind::Open(
        AccessMode::Any
    ))));
    assert!(!is_change(&EventKind::Access(AccessKind::Close(
        AccessMode::Read
    ))));
    assert!(is_change(&EventKind::Access(AccessKind::Close(
        AccessMode::Write
    ))));
    assert!(is_change(&EventKind::Create(CreateKind::File)));
    assert!(is_change(&EventKind::Modify(ModifyKind::Any)));
}

#[test]
fn the_fingerprint_sees_contents_not_hidden_files() {
    let folder = TestFolder::new();
    folder.write("tenants/acme.toml", "a");
    let first = fingerprint(folder.path()).unwrap();
    folder.write("tenants/.acme.toml.swp", "editor state");
    assert_eq!(fingerprint(folder.path()).unwrap(), first);
    folder.write("tenants/acme.toml", "b");
    assert_ne!(fingerprint(folder.path()).unwrap(), first);
    folder.write("keys/acme.pem", "key");
    assert!(
        fingerprint(folder.path())
            .unwrap()
            .contains_key(Path::new("keys/acme.pem"))
    );
}

/// A folder laid out the way the kubelet writes a ConfigMap or projected
/// volume: each version in a hidden timestamped folder, `..data` a symlink
/// to the current one, and every visible name a symlink through `..data`.
struct ProjectedVolume<'a> {
    folder: &'a TestFolder,
    version: usize,
}

impl ProjectedVolume<'_> {
    /// Writes version `files` and swaps `..data` to it as the kubelet's
    /// atomic writer does: new folder, `..data_tmp` symlink, rename over
    /// `..data`, old folder removed.
    fn publish(&mut self, files: &[(&str, String)]) {
        use std::os::unix::fs::symlink;
        let root = self.folder.path();
        self.version += 1;
        let name = format!("..2026_12_06_10_00_0{}.000000001", self.version);
        for (path, text) in files {
            self.folder.write(&format!("{name}/{path}"), text);
        }
        symlink(&name, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        for top in ["tenants", "gateway.toml"] {
            let link = root.join(top);
            if std::fs::symlink_metadata(&link).is_err() && root.join("..data").join(top).exists() {
                symlink(format!("..data/{top}"), &link).unwrap();
            }
        }
        if self.version > 1 {
            let old = format!("..2026_12_06_10_00_0{}.000000001", self.version - 1);
            std::fs::remove_dir_all(root.join(old)).unwrap();
        }
    }
}

#[tokio::test]
async fn a_kubernetes_volume_update_is_reloaded() {
    let folder = TestFolder::new();
    let mut volume = ProjectedVolume {
        folder: &folder,
        version: 0,
    };
    volume.publish(&[("tenants/acme.toml", tenant("acme", 5))]);
    let current = Arc::new(ArcSwap::from_pointee(load(folder.path()).unwrap()));
    assert_eq!(current.load().tenants["acme"].limits.burst, 5);
    let watcher = watch(folder.path(), load, Arc::clone(&current)).unwrap();
    let stats = Arc::clone(watcher.stats());
    let mut reloads = watcher.subscribe();
    wait_until(&mut reloads, "the first rebuild", || {
        stats.reloads_ok.load(Ordering::Relaxed) == 1
    })
    .await;

    // `kubectl apply` of a changed ConfigMap: only hidden names change;
    // the visible ones now lead to new contents.
    volume.publish(&[
        ("tenants/acme.toml", tenant("acme", 8)),
        ("tenants/beta.toml", tenant("beta", 3)),
    ]);
    wait_until(&mut reloads, "the new version is published", || {
        let policy = current.load();
        policy.tenants.get("acme").map(|t| t.limits.burst) == Some(8)
            && policy.tenants.contains_key("beta")
    })
    .await;
    assert_eq!(stats.reloads_failed.load(Ordering::Relaxed), 0);
}
