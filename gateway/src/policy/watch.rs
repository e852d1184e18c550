//! Hot reload: when the policy folder changes, rebuild and publish a new
//! snapshot; when the rebuild fails, keep serving the old one.
//!
//! Reloads are atomic by construction: the caller's `build` reads and checks
//! the whole folder into a fresh value, and only a value that built without
//! error is swapped in. A half-written file is just an invalid policy: the
//! old snapshot stays, and the write that completes it triggers another try.
//!
//! The watcher looks at the whole folder, subfolders included, so key files
//! kept there (PEM, JWKS) reload too; files outside it (an absolute model or
//! key path) are read at each rebuild but their changes trigger none.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::{MAX_FILE_BYTES, PolicyErrors};

/// Quiet time after the last change before rebuilding: editors and
/// `kubectl` write several files (and temp files) in a burst.
pub const RELOAD_DEBOUNCE: Duration = Duration::from_millis(200);
/// Longest a steady stream of changes may put a rebuild off.
pub const RELOAD_MAX_DELAY: Duration = Duration::from_secs(2);
/// Folder depth the fingerprint walks (symlinked folders could loop).
const MAX_DEPTH: usize = 8;
/// Files the fingerprint looks at before giving up and always rebuilding.
const MAX_FINGERPRINT_FILES: usize = 100_000;

/// How reloads went, for metrics and the admin API.
#[derive(Debug, Default)]
pub struct ReloadStats {
    /// Rebuilds that succeeded and were published.
    pub reloads_ok: AtomicU64,
    /// Rebuilds that failed; the previous snapshot kept serving.
    pub reloads_failed: AtomicU64,
    /// Changes that left every file's contents as they were (a `touch`,
    /// an editor's temp file): nothing was rebuilt.
    pub reloads_skipped: AtomicU64,
    /// The errors of the last failed rebuild, one per line; cleared by a success.
    pub last_error: Mutex<Option<String>>,
}

/// A running watch on a policy folder; dropping it stops the watch.
pub struct PolicyWatcher {
    _watcher: RecommendedWatcher,
    task: JoinHandle<()>,
    stats: Arc<ReloadStats>,
    reloads: tokio_watch::Receiver<u64>,
}

impl PolicyWatcher {
    /// The counters this watcher updates.
    pub fn stats(&self) -> &Arc<ReloadStats> {
        &self.stats
    }

    /// A receiver that changes after each reload attempt (succeeded, failed
    /// or skipped), once `stats` and the published value are up to date.
    pub fn subscribe(&self) -> tokio_watch::Receiver<u64> {
        self.reloads.clone()
    }
}

impl fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyWatcher")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Drop for PolicyWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches `dir` and, after each burst of changes, runs `build(dir)` and
/// stores its value in `current`. On failure `current` is left alone, every
/// error is logged with `tracing::warn!` and counted in [`ReloadStats`].
///
/// Call from inside a tokio runtime. The first rebuild runs at once, so a
/// change made between the caller's own build and this call is not missed.
pub fn watch<T, F>(dir: &Path, build: F, current: Arc<ArcSwap<T>>) -> notify::Result<PolicyWatcher>
where
    T: Send + Sync + 'static,
    F: Fn(&Path) -> Result<T, PolicyErrors> + Send + Sync + 'static,
{
    let dir = std::path::absolute(dir).map_err(notify::Error::io)?;
    // Any relevant event only says "look again"; when the queue is full a
    // look is already due, so dropping the event loses nothing.
    let (events_tx, events_rx) = mpsc::channel::<()>(64);
    events_tx
        .try_send(())
        .expect("a new channel has room for the first rebuild");
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            Ok(event) => is_change(&event.kind),
            // Missed events (e.g. an inotify queue overflow): rescan.
            Err(_) => true,
        };
        if relevant {
            let _ = events_tx.try_send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::Recursive)?;

    let stats = Arc::new(ReloadStats::default());
    let (reloads_tx, reloads) = tokio_watch::channel(0);
    let reloader = Reloader {
        dir,
        build: Arc::new(build),
        current,
        stats: Arc::clone(&stats),
        reloads: reloads_tx,
    };
    let task = tokio::spawn(reloader.run(events_rx));
    Ok(PolicyWatcher {
        _watcher: watcher,
        task,
        stats,
        reloads,
    })
}

/// Whether an event may mean different contents. Opens and reads are not
/// changes (and the rebuild's own reads would otherwise trigger rebuilds).
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

struct Reloader<T, F> {
    dir: PathBuf,
    build: Arc<F>,
    current: Arc<ArcSwap<T>>,
    stats: Arc<ReloadStats>,
    reloads: tokio_watch::Sender<u64>,
}

impl<T, F> Reloader<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&Path) -> Result<T, PolicyErrors> + Send + Sync + 'static,
{
    async fn run(self, mut events: mpsc::Receiver<()>) {
        // Unknown until the first rebuild: the value in `current` may predate
        // changes made before the watch began.
        let mut last = None;
        while events.recv().await.is_some() {
            if !debounce(&mut events).await {
                return;
            }
            let now = self.fingerprint().await;
            if now.is_some() && now == last {
                self.stats.reloads_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(dir = %self.dir.display(), "policy folder unchanged; not reloading");
            } else {
                last = now;
                self.rebuild().await;
            }
            self.reloads.send_modify(|n| *n += 1);
        }
    }

    async fn rebuild(&self) {
        let build = Arc::clone(&self.build);
        let dir = self.dir.clone();
        let built = tokio::task::spawn_blocking(move || build(&dir)).await;
        match built {
            Ok(Ok(value)) => {
                self.current.store(Arc::new(value));
                self.stats.reloads_ok.fetch_add(1, Ordering::Relaxed);
                *lock(&self.stats.last_error) = None;
                tracing::info!(dir = %self.dir.display(), "policy reloaded");
            }
            Ok(Err(errors)) => {
                let errors = errors.in_dir(&self.dir);
                for error in &errors.0 {
                    tracing::warn!(%error, "policy reload failed; the previous policy stays");
                }
                self.fail(errors.to_string());
            }
            Err(join_error) => {
                tracing::warn!(%join_error, "policy rebuild panicked; the previous policy stays");
                self.fail(format!("the rebuild panicked: {join_error}"));
            }
        }
    }

    fn fail(&self, why: String) {
        self.stats.reloads_failed.fetch_add(1, Ordering::Relaxed);
        *lock(&self.stats.last_error) = Some(why);
    }

    async fn fingerprint(&self) -> Option<Fingerprint> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || fingerprint(&dir))
            .await
            .ok()
            .flatten()
    }
}

/// Waits until no event came for [`RELOAD_DEBOUNCE`], or [`RELOAD_MAX_DELAY`]
/// passed. False when the event source is gone.
async fn debounce(events: &mut mpsc::Receiver<()>) -> bool {
    let give_up = Instant::now() + RELOAD_MAX_DELAY;
    loop {
        let quiet = (Instant::now() + RELOAD_DEBOUNCE).min(give_up);
        tokio::select! {
            event = events.recv() => {
                if event.is_none() {
                    return false;
                }
            }
            () = sleep_until(quiet) => return true,
        }
    }
}

fn lock<V>(mutex: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    // A panic while holding it cannot leave an `Option<String>` half-written.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Each visible file under the folder (relative path) and a digest of it.
type Fingerprint = BTreeMap<PathBuf, [u8; 32]>;

/// What the folder holds now, so a change that changed nothing (a `touch`,
/// an editor's hidden temp file) rebuilds nothing. Hidden names are skipped
/// like the loader skips them; symlinks are followed like it follows them.
/// Files up to [`MAX_FILE_BYTES`] are hashed, bigger ones stand for
/// themselves by size and modification time. `None`: too big to tell.
fn fingerprint(dir: &Path) -> Option<Fingerprint> {
    let mut prints = Fingerprint::new();
    let mut stack = vec![(PathBuf::new(), 0)];
    while let Some((relative, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(dir.join(&relative)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let relative = relative.join(&name);
            let path = dir.join(&relative);
            match fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    if depth + 1 < MAX_DEPTH {
                        stack.push((relative, depth + 1));
                    }
                }
                Ok(meta) if meta.is_file() => {
                    prints.insert(relative, file_digest(&path, &meta));
                }
                // Dangling symlinks, sockets and the like: present, no contents.
                _ => {
                    prints.insert(relative, [0; 32]);
                }
            }
            if prints.len() > MAX_FINGERPRINT_FILES {
                return None;
            }
        }
    }
    Some(prints)
}

fn file_digest(path: &Path, meta: &fs::Metadata) -> [u8; 32] {
    let mut hasher = Sha256::new();
    if meta.len() <= MAX_FILE_BYTES {
        let mut bytes = Vec::new();
        match fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        {
            Ok(_) => hasher.update(&bytes),
            Err(e) => hasher.update(format!("unreadable: {:?}", e.kind())),
        }
    } else {
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .unwrap_or_default();
        hasher.update(format!(
            "large: {} bytes, modified {modified:?}",
            meta.len()
        ));
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests;
