//! One gpu-host brought in line with the registrations: its control task
//! (a pass when the host (re)starts, after each reload, every
//! [`RECONCILE_EVERY`], and when a request asks), what it loaded, and the
//! set of models it serves for the request path.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bulkhead_protocol::v1::HealthResponse;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Mutex, watch};

use super::{Inner, audit_once, partitions};
use crate::audit::{Event, Outcome};
use crate::policy::{Policy, UpstreamSettings};
use crate::registration::{Registration, RegistrationError, Source};
use crate::upstream::{Upstream, UpstreamState};

/// How often the host's models are compared with the registrations when
/// nothing else prompted it.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15);
/// Wait before trying again when the host could not be asked at all.
const RETRY_UNREACHABLE: Duration = Duration::from_secs(1);

/// What the gateway is told of one host: its name, its client (ready as
/// soon as its process listens), that readiness, and the counter of its
/// process starts (a new value: a fresh host without models).
#[derive(Debug)]
pub struct HostSpec {
    pub name: String,
    pub host: Upstream,
    pub state: watch::Receiver<UpstreamState>,
    pub starts: Counter,
}

/// One host's side of the reconciler. Cheap to share.
#[derive(Debug)]
pub struct HostSync {
    name: String,
    /// The host, ready as soon as its process listens.
    host: Upstream,
    /// The request path's handle: also waits for the configured models.
    requests: Upstream,
    pub(super) control: Mutex<Control>,
    /// The request path's readiness: the host is up and the configured
    /// models are loaded.
    serving: watch::Sender<UpstreamState>,
    starts: Counter,
    /// Asks the control task for a pass now ([`HostSync::reprime`]).
    nudge: tokio::sync::Notify,
    /// Passes that reached the host so far.
    passes: watch::Sender<u64>,
    /// The registered names this host holds with the registered weights.
    models: ArcSwap<BTreeSet<String>>,
}

/// Control-plane state of one host, changed only under its lock.
#[derive(Debug, Default)]
pub(super) struct Control {
    /// The last load attempt per name.
    pub(super) states: BTreeMap<String, Attempt>,
    /// Name → digest of what this gateway had the current host load.
    pub(super) loaded: BTreeMap<String, String>,
    /// Which start of the host (`starts`) the loads above are for.
    child_start: Option<u64>,
    /// The host's last refusal of the tenants' partitions (logged once).
    partitions_refused: Option<String>,
}

impl Control {
    /// The current host holds `name` with `digest`, loaded or adopted by us.
    pub(super) fn mark_loaded(&mut self, name: &str, digest: &str) {
        self.loaded.insert(name.to_string(), digest.to_string());
        self.states.insert(
            name.to_string(),
            Attempt::Loaded {
                digest: digest.to_string(),
            },
        );
    }
}

/// How the last load of a name on a host went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    Loaded { digest: String },
    Failed { digest: String, reason: String },
}

impl HostSync {
    pub(super) fn new(spec: HostSpec) -> (Arc<HostSync>, watch::Receiver<UpstreamState>) {
        let (serving, serving_rx) = watch::channel(UpstreamState::Starting);
        let requests = spec.host.with_state(serving_rx);
        let sync = Arc::new(HostSync {
            name: spec.name,
            host: spec.host,
            requests,
            control: Mutex::new(Control::default()),
            serving,
            starts: spec.starts,
            nudge: tokio::sync::Notify::new(),
            passes: watch::Sender::new(0),
            models: ArcSwap::default(),
        });
        (sync, spec.state)
    }

    /// A host that serves `models`, for tests of the request path.
    #[cfg(test)]
    pub(crate) fn for_test(spec: HostSpec, models: &[&str]) -> Arc<HostSync> {
        let (sync, _) = HostSync::new(spec);
        sync.serving.send_replace(UpstreamState::Ready);
        let models = models.iter().map(|m| (*m).to_string()).collect();
        sync.models.store(Arc::new(models));
        sync
    }

    /// Its name in `gateway.toml` (`local` for the child).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host as the request path uses it: ready once it listens and
    /// its configured models are loaded.
    pub fn requests(&self) -> &Upstream {
        &self.requests
    }

    /// The host for control calls (ready as soon as it listens).
    pub(super) fn host(&self) -> &Upstream {
        &self.host
    }

    /// Whether the host's process is up (a local child that is restarting
    /// is not; a remote host always counts as up).
    pub fn process_up(&self) -> bool {
        self.host.state() == UpstreamState::Ready
    }

    /// The host's `Health` (an error while its process is not up).
    pub async fn health(&self) -> Result<HealthResponse, crate::upstream::UpstreamError> {
        self.host.health().await
    }

    /// Whether the host holds `model` with its registered weights.
    pub fn serves(&self, model: &str) -> bool {
        self.models.load().contains(model)
    }

    /// The registered models the host holds.
    pub fn models(&self) -> Arc<BTreeSet<String>> {
        self.models.load_full()
    }

    /// Has the host brought in line now — a request found it without a
    /// registered model, as a remote host that restarted is until the
    /// next periodic pass — and waits (until `deadline`) for a pass that
    /// reached it. False when none did in time.
    pub async fn reprime(&self, deadline: tokio::time::Instant) -> bool {
        let mut passes = self.passes.subscribe();
        let seen = *passes.borrow_and_update();
        self.nudge.notify_one();
        tokio::time::timeout_at(deadline, passes.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Asks the control task for a pass (the registrations changed).
    pub(super) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// The host holds fewer models than it was given: it restarted empty.
    /// It is not chosen for them until a pass (asked for now) loads them
    /// again.
    pub fn lost_models(&self) {
        self.models.store(Arc::default());
        self.nudge.notify_one();
    }

    /// Publishes what `control` says the host holds, keeping only names
    /// whose registered weights are the ones it loaded.
    pub(super) fn publish(&self, control: &Control, table: &BTreeMap<String, Arc<Registration>>) {
        let held = control
            .loaded
            .iter()
            .filter(|(name, digest)| table.get(*name).is_some_and(|r| &r.digest == *digest))
            .map(|(name, _)| name.clone())
            .collect();
        self.models.store(Arc::new(held));
    }
}

/// The configured models `host` is to load: its `[[gpu_hosts.models]]`,
/// or every configured model for the local child and `[upstream]`.
fn configured_for<'a>(policy: &'a Policy, host: &str) -> Option<&'a BTreeSet<String>> {
    match &policy.gateway.upstream {
        UpstreamSettings::Remote(hosts) if hosts.len() > 1 => {
            hosts.iter().find(|h| h.name == host).map(|h| &h.models)
        }
        _ => None,
    }
}

/// The control task of one host: follows its life and the policy's reloads.
pub(super) async fn run(
    inner: Arc<Inner>,
    sync: Arc<HostSync>,
    mut host_state: watch::Receiver<UpstreamState>,
    reloads: watch::Receiver<u64>,
) {
    // `None` once the policy watcher is gone (the gateway is shutting down).
    let mut reloads = Some(reloads);
    let mut tick = tokio::time::interval(RECONCILE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Set after a reload: failed loads are tried again (the files may have
    // been fixed along with the policy).
    let mut retry_failed = true;
    // Backs off while the host cannot be asked at all.
    let mut unreachable_wait = RETRY_UNREACHABLE;
    loop {
        let state = *host_state.borrow_and_update();
        let mut next_try = None;
        match state {
            UpstreamState::Starting => {
                sync.serving.send_replace(UpstreamState::Starting);
            }
            UpstreamState::Stopped => {
                sync.serving.send_replace(UpstreamState::Stopped);
                return;
            }
            UpstreamState::Ready => {
                let reached = reconcile(&inner, &sync, retry_failed).await;
                // A remote host that cannot be reached is reported by each
                // request at once (503), as before registrations existed.
                sync.serving.send_replace(UpstreamState::Ready);
                if reached {
                    sync.passes.send_modify(|n| *n += 1);
                    retry_failed = false;
                    unreachable_wait = RETRY_UNREACHABLE;
                } else {
                    next_try = Some(unreachable_wait);
                    unreachable_wait = (unreachable_wait * 2).min(RECONCILE_EVERY);
                }
            }
        }
        // Wait for something that calls for another pass.
        loop {
            tokio::select! {
                changed = host_state.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                reloaded = reload(&mut reloads) => {
                    if reloaded {
                        retry_failed = true;
                        break;
                    }
                    // Shutting down: keep following the host until it stops.
                    reloads = None;
                }
                () = sleep_or_never(next_try) => break,
                _ = tick.tick() => break,
                () = sync.nudge.notified() => break,
            }
        }
    }
}

/// Sleeps for `wait`, or forever without one.
async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Resolves with true after a policy reload, false once the watcher is
/// gone; never when there is none.
async fn reload(reloads: &mut Option<watch::Receiver<u64>>) -> bool {
    match reloads {
        Some(reloads) => reloads.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// One pass on one host: publish the registrations, unload what is no
/// longer registered, load what is missing. False when the host could not
/// be asked.
async fn reconcile(inner: &Inner, sync: &HostSync, retry_failed: bool) -> bool {
    // The book first, then the host (the order every caller keeps): the
    // registrations cannot change between reading them and this pass.
    let mut book = inner.book.lock().await;
    let snapshot = inner.snapshot.load_full();
    let desired = super::desired(inner, &mut book, &snapshot).await;
    inner.table.store(Arc::new(desired.clone()));
    let mut control = sync.control.lock().await;
    let api_names: BTreeSet<String> = book.records.keys().cloned().collect();
    drop(book);
    let child_start = sync.starts.get();
    if control.child_start != Some(child_start) {
        // A fresh child holds no models: load everything, tell readiness.
        sync.serving.send_replace(UpstreamState::Starting);
        control.child_start = Some(child_start);
        control.loaded.clear();
        control.states.clear();
    }
    let configured = configured_for(&snapshot.policy, &sync.name);
    let wanted = |name: &str| {
        api_names.contains(name) || configured.is_none_or(|names| names.contains(name))
    };

    let host = match sync.host.list_models().await {
        Ok(models) => models,
        Err(e) => {
            tracing::warn!(
                host = %sync.name,
                "cannot list the gpu-host's models to load the registered ones: {e}"
            );
            return false;
        }
    };
    // The host is reachable: its partitions first, so requests released by
    // this pass run in their tenants' partitions.
    partitions::sync(
        &sync.host,
        &snapshot.policy,
        &mut control.partitions_refused,
    )
    .await;
    // What we loaded that is no longer registered (or changed) goes first.
    let stale: Vec<String> = control
        .loaded
        .iter()
        .filter(|(name, digest)| desired.get(*name).is_none_or(|r| &r.digest != *digest))
        .map(|(name, _)| name.clone())
        .collect();
    for name in stale {
        match sync.host.unload_model(&name).await {
            Ok(_) => {
                tracing::info!(host = %sync.name, model = %name, "unloaded a model that is no longer registered");
                control.loaded.remove(&name);
            }
            Err(e) => {
                tracing::warn!(host = %sync.name, model = %name, "cannot unload a model: {e}")
            }
        }
    }
    for (name, registration) in &desired {
        let on_host = host.iter().find(|m| &m.name == name);
        if on_host.is_some_and(|m| m.digest == registration.digest) {
            // Loaded (by us before), or found on the host with the
            // registered weights (discovered): served either way.
            control.mark_loaded(name, &registration.digest);
            continue;
        }
        if !wanted(name) {
            continue;
        }
        if let Some(Attempt::Failed { digest, .. }) = control.states.get(name)
            && *digest == registration.digest
            && !retry_failed
        {
            continue;
        }
        if on_host.is_some() {
            // Other weights under a registered name: the registration wins.
            if let Err(e) = sync.host.unload_model(name).await {
                tracing::warn!(host = %sync.name, model = %name, "cannot unload unregistered weights: {e}");
                continue;
            }
        }
        load(inner, sync, &mut control, name, registration).await;
    }
    sync.publish(&control, &desired);
    true
}

/// Has the host load one registration, and records how it went.
async fn load(
    inner: &Inner,
    sync: &HostSync,
    control: &mut Control,
    name: &str,
    registration: &Registration,
) {
    let result = match registration.load_request() {
        Ok(request) => sync
            .host
            .load_model(request)
            .await
            .map_err(RegistrationError::from),
        Err(e) => Err(e),
    };
    let event = |outcome| Event::ModelRegister {
        model: name.to_string(),
        digest: registration.digest.clone(),
        manifest: (*registration.manifest).clone(),
        outcome,
    };
    match result {
        Ok(loaded) => {
            tracing::info!(
                host = %sync.name,
                model = %name,
                digest = %registration.digest,
                publisher = %registration.publisher,
                load_ms = loaded.load_ms,
                "model loaded, every byte verified"
            );
            control.mark_loaded(name, &registration.digest);
            if registration.source == Source::Policy {
                audit_once(inner, name, &registration.digest, event(Outcome::Accepted)).await;
            }
        }
        Err(e) => {
            let reason = inner.on_host(&sync.name, &e.to_string());
            tracing::error!(
                host = %sync.name,
                model = %name,
                digest = %registration.digest,
                "THE MODEL WAS NOT LOADED and is not served there: {reason}"
            );
            control.states.insert(
                name.to_string(),
                Attempt::Failed {
                    digest: registration.digest.clone(),
                    reason: reason.clone(),
                },
            );
            audit_once(
                inner,
                name,
                &registration.digest,
                event(Outcome::Refused { reason }),
            )
            .await;
        }
    }
}
