//! The reconciler: keeps every gpu-host's models equal to the
//! registrations and its partitions equal to the policy's tenants, and
//! publishes the model table the request path reads. The one place that
//! drives the gpu-hosts' configuration; the request path only sends them
//! generations.
//!
//! The registrations are the configured models of the current policy plus
//! the API registrations on disk, each verified again with the current
//! `trust.toml` (so removing a publisher stops its models at the next
//! reload). Each host has a background task ([`host`]) that brings it in
//! line whenever it (re)starts, the policy is reloaded, a request finds a
//! registered model missing, and every `RECONCILE_EVERY` (a remote host
//! that restarted is noticed so). A host loads the configured models
//! meant for it (`[[gpu_hosts.models]]`; every one for the local child and
//! `[upstream]`) and every API registration, and serves any registered
//! model it already holds with the registered weights. The admin API
//! registers and unregisters under the same locks: the book, then each
//! host's control, never the other way round.
//!
//! A host's request handle is ready only once its configured models have
//! been loaded (or refused) on its current process, so requests that
//! arrive during a restart wait for the models, not just the process.
//! **Nothing is loaded without a signature verified with a trusted key, and
//! the request path serves only names in the published table.**

mod host;
mod partitions;
mod shared;

#[cfg(test)]
pub(crate) use partitions::tenant_set;

pub use host::{HostSpec, HostSync};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{Mutex, watch};

use crate::audit::time::Timestamp;
use crate::audit::{Actor, Audit, Event, Outcome};
use crate::registration::{
    Claim, MAX_API_REGISTRATIONS, Record, Registration, RegistrationError, RegistrySource,
    RegistryStore, Source, verify,
};
use crate::snapshot::Snapshot;
use crate::upstream::{LoadError, UpstreamError};

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
    audit: Audit,
    store: Option<RegistryStore>,
    /// Locked before any host's control (never the other way round).
    book: Mutex<Book>,
    /// Audit entries written by reconciles (so a crash loop or a periodic
    /// check does not write the same refusal again and again). Locked
    /// last, alone.
    audited: Mutex<BTreeSet<(String, String, String)>>,
    hosts: Vec<Arc<HostSync>>,
}

/// The registrations themselves, changed only under the lock.
#[derive(Debug, Default)]
struct Book {
    /// API registrations as stored (verified again at each reconcile).
    records: BTreeMap<String, Record>,
    /// Names whose signature no longer verifies, with why.
    refused: BTreeMap<String, String>,
}

impl Inner {
    /// `reason`, naming the host when there are several.
    fn on_host(&self, host: &str, reason: &str) -> String {
        if self.hosts.len() > 1 {
            format!("gpu-host `{host}`: {reason}")
        } else {
            reason.to_string()
        }
    }
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
    /// Serving when any host serves it; otherwise the first host's state.
    pub state: ModelState,
    /// Its state on each host, in `gateway.toml`'s order.
    pub hosts: Vec<(String, ModelState)>,
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
    /// Opens the registry (a folder or the state database, when
    /// configured), publishes the configured models and starts one task
    /// per host that loads them, and with the database one that follows
    /// the registrations other replicas make.
    /// Each host's [`HostSync::requests`] is ready once they are loaded.
    /// A host must be ready as soon as its process listens; `reloads`
    /// changes after each policy reload.
    pub(crate) async fn start(
        snapshot: Arc<ArcSwap<Snapshot>>,
        hosts: Vec<HostSpec>,
        reloads: watch::Receiver<u64>,
        audit: Audit,
        registry: Option<RegistrySource>,
    ) -> Result<Reconciler, RegistrationError> {
        let (store, records) = match registry {
            Some(source) => {
                let (store, records) = RegistryStore::open(source).await?;
                (Some(store), records)
            }
            None => (None, Vec::new()),
        };
        tracing::info!(
            configured = snapshot.load().policy.models.len(),
            registered = records.len(),
            hosts = hosts.len(),
            "model registrations"
        );
        let book = Book {
            records: records.into_iter().map(|r| (r.name.clone(), r)).collect(),
            ..Book::default()
        };
        let (syncs, states): (Vec<_>, Vec<_>) = hosts.into_iter().map(HostSync::new).unzip();
        let inner = Arc::new(Inner {
            table: ArcSwap::default(),
            snapshot,
            audit,
            store,
            book: Mutex::new(book),
            audited: Mutex::default(),
            hosts: syncs,
        });
        if let Some(db) = inner.store.as_ref().and_then(RegistryStore::shared) {
            let changes = bulkhead_state::listen(
                db.db().clone(),
                crate::registration::REGISTRATIONS_TOPIC,
                shared::RESYNC_EVERY,
            );
            tokio::spawn(shared::follow(Arc::clone(&inner), db.clone(), changes));
        }
        for (sync, state) in inner.hosts.iter().zip(states) {
            tokio::spawn(host::run(
                Arc::clone(&inner),
                Arc::clone(sync),
                state,
                reloads.clone(),
            ));
        }
        Ok(Reconciler { inner })
    }

    /// The hosts, in `gateway.toml`'s order.
    pub fn hosts(&self) -> &[Arc<HostSync>] {
        &self.inner.hosts
    }

    /// The registration the request path may serve under `name` (one
    /// atomic load, no lock).
    pub fn get(&self, name: &str) -> Option<Arc<Registration>> {
        self.inner.table.load().get(name).cloned()
    }

    /// Whether registering through the API is on.
    pub fn enabled(&self) -> bool {
        self.inner.store.is_some()
    }

    /// Registers a model: verify with the current trust, have every host
    /// that can be reached load it (every byte hashed), store it, record
    /// it. A host that cannot be reached loads it at its next pass; a host
    /// that refuses it refuses the registration (the loads done are
    /// undone). Refusals are recorded too. The caller checked that the
    /// audit log writes.
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
        let mut book = self.inner.book.lock().await;
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
                || book.records.contains_key(&name)
            {
                return Err(RegistrationError::Exists(name.clone()));
            }
            if book.records.len() >= MAX_API_REGISTRATIONS {
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
        // Another replica's registration of the name, not seen here yet:
        // refused before any host is asked (the hosts may be shared).
        let checked = match checked {
            Ok(checked) => match store.taken_elsewhere(&name).await {
                Ok(false) => Ok(checked),
                Ok(true) => Err(RegistrationError::Exists(name.clone())),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let (registration, request) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                let (event, e) = refuse("", e);
                self.record_refusal(actor, event).await;
                return Err(e);
            }
        };
        let mut loaded_on = Vec::new();
        let mut unreachable = None;
        let mut refused = None;
        for sync in &self.inner.hosts {
            let control = sync.control.lock().await;
            match sync.host().load_model(request.clone()).await {
                Ok(loaded) => loaded_on.push((sync, loaded.load_ms)),
                Err(LoadError::Upstream(e @ UpstreamError::Unavailable(_))) => {
                    tracing::warn!(
                        host = %sync.name(),
                        model = %name,
                        "the gpu-host cannot be reached; it loads the model at its next pass: {e}"
                    );
                    unreachable = Some(RegistrationError::from(LoadError::Upstream(e)));
                }
                Err(e) => {
                    refused = Some((sync.name().to_string(), RegistrationError::from(e)));
                    drop(control);
                    break;
                }
            }
        }
        let failed = match (refused, loaded_on.is_empty(), unreachable) {
            (Some((host, e)), _, _) if self.inner.hosts.len() > 1 => {
                Some(RegistrationError::OnHost(host, Box::new(e)))
            }
            (Some((_, e)), _, _) => Some(e),
            (None, true, Some(e)) => Some(e),
            _ => None,
        };
        if let Some(e) = failed {
            self.undo_loads(&name, &loaded_on).await;
            let (event, e) = refuse(&registration.digest, e);
            self.record_refusal(actor, event).await;
            return Err(e);
        }
        let load_ms = loaded_on.iter().map(|(_, ms)| *ms).max().unwrap_or(0);
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
        // Stored, then recorded; either failing undoes the loads, so a
        // registration exists only when both happened.
        let committed = match store.insert(&record).await {
            Ok(()) => match self.inner.audit.record_async(actor, accepted).await {
                Ok(_) => Ok(()),
                Err(e) => {
                    if let Err(undo) = store.remove(&name).await {
                        tracing::error!(
                            model = %name,
                            "a registration the audit log could not take is still stored: {undo}"
                        );
                    }
                    Err(RegistrationError::Audit(e))
                }
            },
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            self.undo_loads(&name, &loaded_on).await;
            return Err(e);
        }
        let registration = Arc::new(registration);
        book.records.insert(name.clone(), record);
        self.inner.table.rcu(|table| {
            let mut next = BTreeMap::clone(table);
            next.insert(name.clone(), Arc::clone(&registration));
            next
        });
        for (sync, _) in &loaded_on {
            let mut control = sync.control.lock().await;
            control.mark_loaded(&name, &registration.digest);
            sync.publish(&control, &self.inner.table.load());
        }
        drop(book);
        tracing::info!(
            model = %name,
            digest = %registration.digest,
            publisher = %registration.publisher,
            hosts = loaded_on.len(),
            load_ms,
            "model registered"
        );
        Ok(Registered {
            registration,
            load_ms,
        })
    }

    /// Unloads a registration that failed from the hosts that loaded it.
    async fn undo_loads(&self, name: &str, loaded_on: &[(&Arc<HostSync>, u64)]) {
        for (sync, _) in loaded_on {
            let _control = sync.control.lock().await;
            if let Err(undo) = sync.host().unload_model(name).await {
                tracing::error!(
                    host = %sync.name(),
                    model = %name,
                    "could not unload a model whose registration failed: {undo}"
                );
            }
        }
    }

    /// Unregisters a model registered through the API: the request path
    /// stops serving it at once, its record is removed, the hosts unload
    /// it. Returns the digest it had.
    pub async fn unregister(&self, name: &str, actor: Actor) -> Result<String, RegistrationError> {
        let mut book = self.inner.book.lock().await;
        let snapshot = self.inner.snapshot.load_full();
        if snapshot.policy.models.iter().any(|m| m.name == name) {
            return Err(RegistrationError::Configured(name.to_string()));
        }
        let store = self
            .inner
            .store
            .as_ref()
            .ok_or_else(|| RegistrationError::NotFound(name.to_string()))?;
        let Some(record) = book.records.get(name) else {
            return Err(RegistrationError::NotFound(name.to_string()));
        };
        let digest = record.digest.clone();
        store.remove(name).await?;
        book.records.remove(name);
        book.refused.remove(name);
        self.inner.table.rcu(|table| {
            let mut next = BTreeMap::clone(table);
            next.remove(name);
            next
        });
        for sync in &self.inner.hosts {
            let mut control = sync.control.lock().await;
            control.states.remove(name);
            sync.publish(&control, &self.inner.table.load());
            match sync.host().unload_model(name).await {
                Ok(_) => {
                    control.loaded.remove(name);
                }
                // The request path no longer serves it whatever the host
                // holds; the next reconcile unloads it.
                Err(e) => tracing::warn!(
                    host = %sync.name(),
                    model = %name,
                    "the gpu-host did not unload the model: {e}"
                ),
            }
        }
        drop(book);
        tracing::info!(model = %name, %digest, "model unregistered");
        let event = Event::ModelUnregister {
            model: name.to_string(),
            digest: digest.clone(),
            outcome: Outcome::Accepted,
        };
        self.inner.audit.record_async(actor, event).await?;
        Ok(digest)
    }

    /// Every registration with its state on each host.
    pub async fn list(&self) -> Vec<ModelView> {
        let snapshot = self.inner.snapshot.load_full();
        let (records, refused): (Vec<Record>, _) = {
            let book = self.inner.book.lock().await;
            (
                book.records.values().cloned().collect(),
                book.refused.clone(),
            )
        };
        let mut on_hosts = Vec::new();
        for sync in &self.inner.hosts {
            let states = sync.control.lock().await.states.clone();
            on_hosts.push((sync, states));
        }
        let listed = futures_util::future::join_all(
            on_hosts.iter().map(|(sync, _)| sync.host().list_models()),
        )
        .await;
        let table = self.inner.table.load_full();
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
        let mut views = Vec::new();
        for (name, source) in configured.chain(registered) {
            let registration = table.get(&name).cloned();
            let hosts: Vec<(String, ModelState)> = on_hosts
                .iter()
                .zip(&listed)
                .map(|((sync, states), models)| {
                    let state = match &registration {
                        None => ModelState::Refused {
                            reason: refused.get(&name).cloned().unwrap_or_else(|| {
                                "its signature is not verified with the current trust".into()
                            }),
                        },
                        Some(registration) => {
                            host_state(registration, states.get(&name), models.as_ref())
                        }
                    };
                    (sync.name().to_string(), state)
                })
                .collect();
            let state = hosts
                .iter()
                .find(|(_, s)| matches!(s, ModelState::Serving { .. }))
                .or(hosts.first())
                .map_or(ModelState::NotLoaded, |(_, s)| s.clone());
            views.push(ModelView {
                name,
                source,
                registration,
                state,
                hosts,
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

/// A verified registration's state on one host, from its listing (or why
/// it could not be listed) and the last load attempt there.
fn host_state(
    registration: &Registration,
    attempt: Option<&host::Attempt>,
    listed: Result<&Vec<bulkhead_protocol::v1::ModelInfo>, &UpstreamError>,
) -> ModelState {
    let models = match listed {
        Ok(models) => models,
        Err(e) => {
            return ModelState::Unknown {
                reason: e.to_string(),
            };
        }
    };
    match models.iter().find(|m| m.name == registration.name) {
        Some(info) if info.digest == registration.digest && info.serving => ModelState::Serving {
            verified_at_unix_ms: info.weights_verified_at_unix_ms,
        },
        Some(info) if info.digest == registration.digest => ModelState::OutOfService {
            reason: info.unavailable_reason.clone(),
            verified_at_unix_ms: info.weights_verified_at_unix_ms,
        },
        _ => match attempt {
            Some(host::Attempt::Failed { reason, .. }) => ModelState::Failed {
                reason: reason.clone(),
            },
            _ => ModelState::NotLoaded,
        },
    }
}

/// The configured models and the API registrations that verify with the
/// current trust (a configured name wins over a stored one).
async fn desired(
    inner: &Inner,
    book: &mut Book,
    snapshot: &Snapshot,
) -> BTreeMap<String, Arc<Registration>> {
    let mut desired: BTreeMap<String, Arc<Registration>> = snapshot
        .policy
        .models
        .iter()
        .map(|m| (m.name.clone(), Arc::clone(m)))
        .collect();
    let records: Vec<Record> = book.records.values().cloned().collect();
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
                book.refused.remove(&record.name);
                desired.insert(record.name.clone(), Arc::new(registration));
            }
            Err(e) => {
                let reason = format!("its signature no longer verifies: {e}");
                if book.refused.get(&record.name) != Some(&reason) {
                    tracing::error!(model = %record.name, "THE MODEL IS NOT SERVED: {reason}");
                }
                book.refused.insert(record.name.clone(), reason.clone());
                let event = Event::ModelRegister {
                    model: record.name.clone(),
                    digest: record.digest.clone(),
                    manifest: record.signature.clone(),
                    outcome: Outcome::Refused { reason },
                };
                audit_once(inner, &record.name, &record.digest, event).await;
            }
        }
    }
    desired
}

/// Records `event` unless this process recorded the same outcome for this
/// model and digest already.
async fn audit_once(inner: &Inner, name: &str, digest: &str, event: Event) {
    let outcome = match &event {
        Event::ModelRegister { outcome, .. } => match outcome {
            Outcome::Accepted => "accepted".to_string(),
            Outcome::Refused { reason } => reason.clone(),
        },
        _ => String::new(),
    };
    let key = (name.to_string(), digest.to_string(), outcome);
    let mut audited = inner.audited.lock().await;
    if audited.contains(&key) {
        return;
    }
    let actor = Actor::Operator {
        issuer: None,
        tenant: None,
        sub: None,
    };
    match inner.audit.record_async(actor, event).await {
        Ok(_) => {
            audited.insert(key);
        }
        Err(e) => {
            tracing::error!(model = %name, "a model load could not be recorded in the audit log: {e}")
        }
    }
}
