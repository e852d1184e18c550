//! The reconciler: keeps the gpu-host's models equal to the registrations
//! and its partitions equal to the policy's tenants, and publishes the model
//! table the request path reads. The one place that drives the gpu-host's
//! configuration; the request path only sends it generations.
//!
//! The registrations are the configured models of the current policy plus
//! the API registrations on disk, each verified again with the current
//! `trust.toml` (so removing a publisher stops its models at the next
//! reload). A background task reconciles the host with them whenever the
//! local child (re)starts, the policy is reloaded, and every
//! [`RECONCILE_EVERY`] (a remote host that restarted is noticed so). The
//! admin API registers and unregisters under the same lock.
//!
//! The request path's gpu-host handle is ready only once the configured
//! models have been loaded (or refused) on the current child, so requests
//! that arrive during a restart wait for the models, not just the process.
//! **Nothing is loaded without a signature verified with a trusted key, and
//! the request path serves only names in the published table.**

mod partitions;

#[cfg(test)]
pub(crate) use partitions::tenant_set;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Mutex, watch};

use crate::audit::time::Timestamp;
use crate::audit::{Actor, Audit, Event, Outcome};
use crate::registration::{
    Claim, MAX_API_REGISTRATIONS, Record, Registration, RegistrationError, RegistryDir, Source,
    verify,
};
use crate::snapshot::Snapshot;
use crate::upstream::{Upstream, UpstreamState};

/// How often the host's models are compared with the registrations when
/// nothing else prompted it.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15);
/// Wait before trying again when the host could not be asked at all.
const RETRY_UNREACHABLE: Duration = Duration::from_secs(1);

/// The registrations and the control plane that loads them. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Reconciler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// What the request path reads: name → registration.
    table: ArcSwap<BTreeMap<String, Arc<Registration>>>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// The host, ready as soon as its process listens.
    host: Upstream,
    audit: Audit,
    store: Option<RegistryDir>,
    control: Mutex<Control>,
    /// The request path's readiness: the host is up and the configured
    /// models are loaded.
    serving: watch::Sender<UpstreamState>,
    /// Children started so far: a new value means a fresh host without
    /// models.
    starts: Counter,
    /// Asks the control task for a pass now ([`Reconciler::reprime`]).
    nudge: tokio::sync::Notify,
    /// Passes that reached the host so far.
    passes: watch::Sender<u64>,
}

/// Control-plane state, changed only under the lock.
#[derive(Debug, Default)]
struct Control {
    /// API registrations as stored (verified again at each reconcile).
    records: BTreeMap<String, Record>,
    /// The last load attempt per name.
    states: BTreeMap<String, Attempt>,
    /// Name → digest of what this gateway had the current host load.
    loaded: BTreeMap<String, String>,
    /// Audit entries written by reconciles (so a crash loop or a periodic
    /// check does not write the same refusal again and again).
    audited: BTreeSet<(String, String, String)>,
    /// Which start of the child (`starts`) the loads above are for.
    child_start: Option<u64>,
    /// The host's last refusal of the tenants' partitions (logged once).
    partitions_refused: Option<String>,
}

impl Control {
    /// The current host holds `name` with `digest`, loaded or adopted by us.
    fn mark_loaded(&mut self, name: &str, digest: &str) {
        self.loaded.insert(name.to_string(), digest.to_string());
        self.states.insert(
            name.to_string(),
            Attempt::Loaded {
                digest: digest.to_string(),
            },
        );
    }
}

/// How the last load of a name went.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Attempt {
    Loaded {
        digest: String,
    },
    Failed {
        digest: String,
        reason: String,
    },
    /// Its signature no longer verifies with the current trust.
    Refused {
        reason: String,
    },
}

/// What `POST /admin/v1/models` answers with.
#[derive(Clone, Debug)]
pub struct Registered {
    pub registration: Arc<Registration>,
    pub load_ms: u64,
}

/// One model as `GET /admin/v1/models` shows it.
#[derive(Clone, Debug)]
pub struct ModelView {
    pub name: String,
    pub source: Source,
    /// `None` when its signature does not verify (any more).
    pub registration: Option<Arc<Registration>>,
    pub state: ModelState,
}

/// Whether a registered model is being served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    Serving {
        verified_at_unix_ms: u64,
    },
    /// The host took it out of service (its resident weights changed).
    OutOfService {
        reason: String,
        verified_at_unix_ms: u64,
    },
    /// Not on the host (yet).
    NotLoaded,
    /// The host refused it (the message says why).
    Failed {
        reason: String,
    },
    /// Its signature does not verify with the current trust.
    Refused {
        reason: String,
    },
    /// The host could not be asked.
    Unknown {
        reason: String,
    },
}

impl Reconciler {
    /// Opens the registry folder (when configured), publishes the
    /// configured models and starts the task that loads them. Returns the
    /// request path's handle on the host: ready once they are loaded.
    /// `host` must be ready as soon as the process listens; `reloads`
    /// changes after each policy reload.
    pub async fn start(
        snapshot: Arc<ArcSwap<Snapshot>>,
        host: Upstream,
        host_state: watch::Receiver<UpstreamState>,
        reloads: watch::Receiver<u64>,
        audit: Audit,
        registry: Option<PathBuf>,
        starts: Counter,
    ) -> Result<(Reconciler, Upstream), RegistrationError> {
        let (store, records) = match registry {
            Some(root) => {
                let (store, records) =
                    tokio::task::spawn_blocking(move || RegistryDir::open(&root))
                        .await
                        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
                (Some(store), records)
            }
            None => (None, Vec::new()),
        };
        tracing::info!(
            configured = snapshot.load().policy.models.len(),
            registered = records.len(),
            "model registrations"
        );
        let (serving, serving_rx) = watch::channel(UpstreamState::Starting);
        let control = Control {
            records: records.into_iter().map(|r| (r.name.clone(), r)).collect(),
            ..Control::default()
        };
        let inner = Arc::new(Inner {
            table: ArcSwap::default(),
            snapshot,
            host: host.clone(),
            audit,
            store,
            control: Mutex::new(control),
            serving,
            starts,
            nudge: tokio::sync::Notify::new(),
            passes: watch::Sender::new(0),
        });
        tokio::spawn(run(Arc::clone(&inner), host_state, reloads));
        let requests = host.with_state(serving_rx);
        Ok((Reconciler { inner }, requests))
    }

    /// The registration the request path may serve under `name` (one
    /// atomic load, no lock).
    pub fn get(&self, name: &str) -> Option<Arc<Registration>> {
        self.inner.table.load().get(name).cloned()
    }

    /// Has the host brought in line now — a request found it without a
    /// registered model, as a remote host that restarted is until the
    /// next periodic pass — and waits (until `deadline`) for a pass that
    /// reached it. False when none did in time.
    pub async fn reprime(&self, deadline: tokio::time::Instant) -> bool {
        let mut passes = self.inner.passes.subscribe();
        let seen = *passes.borrow_and_update();
        self.inner.nudge.notify_one();
        tokio::time::timeout_at(deadline, passes.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether registering through the API is on.
    pub fn enabled(&self) -> bool {
        self.inner.store.is_some()
    }

    /// Registers a model: verify with the current trust, have the host
    /// load it (every byte hashed), store it, record it. Refusals are
    /// recorded too. The caller checked that the audit log writes.
    pub async fn register(
        &self,
        name: String,
        dir: PathBuf,
        file: Option<String>,
        signature: serde_json::Value,
        actor: Actor,
        registered_by: Option<String>,
    ) -> Result<Registered, RegistrationError> {
        let store = self
            .inner
            .store
            .as_ref()
            .ok_or(RegistrationError::Disabled)?;
        let mut control = self.inner.control.lock().await;
        let snapshot = self.inner.snapshot.load_full();
        let bundle = serde_json::to_vec(&signature).unwrap_or_default();
        let registered_at = Timestamp::now().to_string();
        let refuse = |digest: &str, e: RegistrationError| {
            let event = Event::ModelRegister {
                model: name.clone(),
                digest: digest.to_string(),
                manifest: signature.clone(),
                outcome: Outcome::Refused {
                    reason: e.to_string(),
                },
            };
            (event, e)
        };
        let checked = (|| {
            if snapshot.policy.models.iter().any(|m| m.name == name)
                || control.records.contains_key(&name)
            {
                return Err(RegistrationError::Exists(name.clone()));
            }
            if control.records.len() >= MAX_API_REGISTRATIONS {
                return Err(RegistrationError::TooMany(MAX_API_REGISTRATIONS));
            }
            let claim = Claim {
                name: &name,
                dir: &dir,
                file: file.as_deref(),
                bundle: &bundle,
            };
            let source = Source::Api {
                registered_at: registered_at.clone(),
                registered_by: registered_by.clone(),
            };
            let registration = verify(&snapshot.policy.trust, &claim, source)?;
            let request = registration.load_request()?;
            Ok((registration, request))
        })();
        let (registration, request) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                let (event, e) = refuse("", e);
                self.record_refusal(actor, event).await;
                return Err(e);
            }
        };
        let loaded = match self.inner.host.load_model(request).await {
            Ok(loaded) => loaded,
            Err(e) => {
                let (event, e) = refuse(&registration.digest, e.into());
                self.record_refusal(actor, event).await;
                return Err(e);
            }
        };
        let record = Record::new(
            name.clone(),
            dir,
            registration.file.name.clone(),
            registration.digest.clone(),
            signature.clone(),
            registered_at,
            registered_by,
        );
        let accepted = Event::ModelRegister {
            model: name.clone(),
            digest: registration.digest.clone(),
            manifest: signature,
            outcome: Outcome::Accepted,
        };
        // Stored, then recorded; either failing undoes the load, so a
        // registration exists only when both happened.
        let committed = match store.write(&record) {
            Ok(()) => match self.inner.audit.record_async(actor, accepted).await {
                Ok(_) => Ok(()),
                Err(e) => {
                    let _ = store.remove(&name);
                    Err(RegistrationError::Audit(e))
                }
            },
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            if let Err(undo) = self.inner.host.unload_model(&name).await {
                tracing::error!(model = %name, "could not unload a model whose registration failed: {undo}");
            }
            return Err(e);
        }
        let registration = Arc::new(registration);
        control.records.insert(name.clone(), record);
        control.mark_loaded(&name, &registration.digest);
        self.inner.table.rcu(|table| {
            let mut next = BTreeMap::clone(table);
            next.insert(name.clone(), Arc::clone(&registration));
            next
        });
        tracing::info!(
            model = %name,
            digest = %registration.digest,
            publisher = %registration.publisher,
            load_ms = loaded.load_ms,
            "model registered"
        );
        Ok(Registered {
            registration,
            load_ms: loaded.load_ms,
        })
    }

    /// Unregisters a model registered through the API: the request path
    /// stops serving it at once, its record is removed, the host unloads
    /// it. Returns the digest it had.
    pub async fn unregister(&self, name: &str, actor: Actor) -> Result<String, RegistrationError> {
        let mut control = self.inner.control.lock().await;
        let snapshot = self.inner.snapshot.load_full();
        if snapshot.policy.models.iter().any(|m| m.name == name) {
            return Err(RegistrationError::Configured(name.to_string()));
        }
        let store = self
            .inner
            .store
            .as_ref()
            .ok_or_else(|| RegistrationError::NotFound(name.to_string()))?;
        let Some(record) = control.records.get(name) else {
            return Err(RegistrationError::NotFound(name.to_string()));
        };
        let digest = record.digest.clone();
        store.remove(name)?;
        control.records.remove(name);
        control.states.remove(name);
        self.inner.table.rcu(|table| {
            let mut next = BTreeMap::clone(table);
            next.remove(name);
            next
        });
        match self.inner.host.unload_model(name).await {
            Ok(_) => {
                control.loaded.remove(name);
            }
            // The request path no longer serves it whatever the host holds;
            // the next reconcile unloads it.
            Err(e) => tracing::warn!(model = %name, "the gpu-host did not unload the model: {e}"),
        }
        drop(control);
        tracing::info!(model = %name, %digest, "model unregistered");
        let event = Event::ModelUnregister {
            model: name.to_string(),
            digest: digest.clone(),
            outcome: Outcome::Accepted,
        };
        self.inner.audit.record_async(actor, event).await?;
        Ok(digest)
    }

    /// Every registration with its state on the host.
    pub async fn list(&self) -> Vec<ModelView> {
        let snapshot = self.inner.snapshot.load_full();
        let (records, states): (Vec<Record>, _) = {
            let control = self.inner.control.lock().await;
            (
                control.records.values().cloned().collect(),
                control.states.clone(),
            )
        };
        let host = self.inner.host.list_models().await;
        let table = self.inner.table.load_full();
        let mut views = Vec::new();
        let configured = snapshot
            .policy
            .models
            .iter()
            .map(|m| (m.name.clone(), Source::Policy));
        let registered = records.iter().map(|r| {
            let source = Source::Api {
                registered_at: r.registered_at.clone(),
                registered_by: r.registered_by.clone(),
            };
            (r.name.clone(), source)
        });
        for (name, source) in configured.chain(registered) {
            let registration = table.get(&name).cloned();
            let state = match (&registration, states.get(&name), &host) {
                (None, Some(Attempt::Refused { reason }), _) => ModelState::Refused {
                    reason: reason.clone(),
                },
                (None, _, _) => ModelState::Refused {
                    reason: "its signature is not verified with the current trust".into(),
                },
                (Some(_), _, Err(e)) => ModelState::Unknown {
                    reason: e.to_string(),
                },
                (Some(registration), attempt, Ok(models)) => {
                    match models.iter().find(|m| m.name == name) {
                        Some(info) if info.digest == registration.digest && info.serving => {
                            ModelState::Serving {
                                verified_at_unix_ms: info.weights_verified_at_unix_ms,
                            }
                        }
                        Some(info) if info.digest == registration.digest => {
                            ModelState::OutOfService {
                                reason: info.unavailable_reason.clone(),
                                verified_at_unix_ms: info.weights_verified_at_unix_ms,
                            }
                        }
                        _ => match attempt {
                            Some(Attempt::Failed { reason, .. }) => ModelState::Failed {
                                reason: reason.clone(),
                            },
                            _ => ModelState::NotLoaded,
                        },
                    }
                }
            };
            views.push(ModelView {
                name,
                source,
                registration,
                state,
            });
        }
        views
    }

    /// Records a refusal; a refusal that cannot be recorded is logged (the
    /// call fails anyway).
    async fn record_refusal(&self, actor: Actor, event: Event) {
        if let Err(e) = self.inner.audit.record_async(actor, event).await {
            tracing::error!(
                "a refused model registration could not be recorded in the audit log: {e}"
            );
        }
    }
}

/// The control task: follows the host's life and the policy's reloads.
async fn run(
    inner: Arc<Inner>,
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
                inner.serving.send_replace(UpstreamState::Starting);
            }
            UpstreamState::Stopped => {
                inner.serving.send_replace(UpstreamState::Stopped);
                return;
            }
            UpstreamState::Ready => {
                let reached = reconcile(&inner, retry_failed).await;
                // A remote host that cannot be reached is reported by each
                // request at once (503), as before registrations existed.
                inner.serving.send_replace(UpstreamState::Ready);
                if reached {
                    inner.passes.send_modify(|n| *n += 1);
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
                () = inner.nudge.notified() => break,
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

/// One pass: publish the registrations, unload what is no longer
/// registered, load what is missing. False when the host could not be
/// asked.
async fn reconcile(inner: &Inner, retry_failed: bool) -> bool {
    let mut control = inner.control.lock().await;
    let child_start = inner.starts.get();
    if control.child_start != Some(child_start) {
        // A fresh child holds no models: load everything, tell readiness.
        inner.serving.send_replace(UpstreamState::Starting);
        control.child_start = Some(child_start);
        control.loaded.clear();
        control.states.clear();
    }
    let snapshot = inner.snapshot.load_full();
    let desired = desired(inner, &mut control, &snapshot).await;
    inner.table.store(Arc::new(desired.clone()));

    let host = match inner.host.list_models().await {
        Ok(models) => models,
        Err(e) => {
            tracing::warn!("cannot list the gpu-host's models to load the registered ones: {e}");
            return false;
        }
    };
    // The host is reachable: its partitions first, so requests released by
    // this pass run in their tenants' partitions.
    partitions::sync(
        &inner.host,
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
        match inner.host.unload_model(&name).await {
            Ok(_) => {
                tracing::info!(model = %name, "unloaded a model that is no longer registered");
                control.loaded.remove(&name);
            }
            Err(e) => tracing::warn!(model = %name, "cannot unload a model: {e}"),
        }
    }
    for (name, registration) in &desired {
        let on_host = host.iter().find(|m| &m.name == name);
        if on_host.is_some_and(|m| m.digest == registration.digest) {
            // Loaded (by us before, or adopted on a remote host that has it).
            control.mark_loaded(name, &registration.digest);
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
            if let Err(e) = inner.host.unload_model(name).await {
                tracing::warn!(model = %name, "cannot unload unregistered weights: {e}");
                continue;
            }
        }
        let result = match registration.load_request() {
            Ok(request) => inner
                .host
                .load_model(request)
                .await
                .map_err(RegistrationError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(loaded) => {
                tracing::info!(
                    model = %name,
                    digest = %registration.digest,
                    publisher = %registration.publisher,
                    load_ms = loaded.load_ms,
                    "model loaded, every byte verified"
                );
                control.mark_loaded(name, &registration.digest);
                if registration.source == Source::Policy {
                    let event = Event::ModelRegister {
                        model: name.clone(),
                        digest: registration.digest.clone(),
                        manifest: (*registration.manifest).clone(),
                        outcome: Outcome::Accepted,
                    };
                    audit_once(inner, &mut control, name, &registration.digest, event).await;
                }
            }
            Err(e) => {
                let reason = e.to_string();
                tracing::error!(
                    model = %name,
                    digest = %registration.digest,
                    "THE MODEL WAS NOT LOADED and is not served: {reason}"
                );
                control.states.insert(
                    name.clone(),
                    Attempt::Failed {
                        digest: registration.digest.clone(),
                        reason: reason.clone(),
                    },
                );
                let event = Event::ModelRegister {
                    model: name.clone(),
                    digest: registration.digest.clone(),
                    manifest: (*registration.manifest).clone(),
                    outcome: Outcome::Refused { reason },
                };
                audit_once(inner, &mut control, name, &registration.digest, event).await;
            }
        }
    }
    true
}

/// The configured models and the API registrations that verify with the
/// current trust (a configured name wins over a stored one).
async fn desired(
    inner: &Inner,
    control: &mut Control,
    snapshot: &Snapshot,
) -> BTreeMap<String, Arc<Registration>> {
    let mut desired: BTreeMap<String, Arc<Registration>> = snapshot
        .policy
        .models
        .iter()
        .map(|m| (m.name.clone(), Arc::clone(m)))
        .collect();
    let records: Vec<Record> = control.records.values().cloned().collect();
    for record in records {
        if desired.contains_key(&record.name) {
            tracing::warn!(
                model = %record.name,
                "a model registered through the API is now also configured in the policy; \
                 the configured one is served"
            );
            continue;
        }
        let bundle = record.bundle();
        let claim = Claim {
            name: &record.name,
            dir: &record.dir,
            file: Some(&record.file),
            bundle: &bundle,
        };
        let source = Source::Api {
            registered_at: record.registered_at.clone(),
            registered_by: record.registered_by.clone(),
        };
        match verify(&snapshot.policy.trust, &claim, source) {
            Ok(registration) => {
                desired.insert(record.name.clone(), Arc::new(registration));
            }
            Err(e) => {
                let reason = format!("its signature no longer verifies: {e}");
                if control.states.get(&record.name)
                    != Some(&Attempt::Refused {
                        reason: reason.clone(),
                    })
                {
                    tracing::error!(model = %record.name, "THE MODEL IS NOT SERVED: {reason}");
                }
                control.states.insert(
                    record.name.clone(),
                    Attempt::Refused {
                        reason: reason.clone(),
                    },
                );
                let event = Event::ModelRegister {
                    model: record.name.clone(),
                    digest: record.digest.clone(),
                    manifest: record.signature.clone(),
                    outcome: Outcome::Refused { reason },
                };
                audit_once(inner, control, &record.name, &record.digest, event).await;
            }
        }
    }
    desired
}

/// Records `event` unless this process recorded the same outcome for this
/// model and digest already.
async fn audit_once(inner: &Inner, control: &mut Control, name: &str, digest: &str, event: Event) {
    let outcome = match &event {
        Event::ModelRegister { outcome, .. } => match outcome {
            Outcome::Accepted => "accepted".to_string(),
            Outcome::Refused { reason } => reason.clone(),
        },
        _ => String::new(),
    };
    let key = (name.to_string(), digest.to_string(), outcome);
    if control.audited.contains(&key) {
        return;
    }
    let actor = Actor::Operator {
        issuer: None,
        tenant: None,
        sub: None,
    };
    match inner.audit.record_async(actor, event).await {
        Ok(_) => {
            control.audited.insert(key);
        }
        Err(e) => {
            tracing::error!(model = %name, "a model load could not be recorded in the audit log: {e}")
        }
    }
}
