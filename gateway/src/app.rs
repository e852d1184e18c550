//! `bulkhead serve`'s composition: load the policy, start (or reach) the
//! gpu-host, watch the policy folder, serve HTTP until shutdown, then drain.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bulkhead_protocol::Target;
use tokio::sync::watch;

use crate::api::{self, App};
use crate::audit::{Actor, Audit, AuditError, AuditLog, AuditSettings, Event, Outcome};
use crate::metrics::{Metrics, ResultLabels};
use crate::plugins::{
    HookGate, PluginEngine, PluginEngineConfig, PluginError, PluginRegistry, StoreError,
};
use crate::policy::{self, GatewayPlugins, ListenAddr, PolicyErrors, UpstreamSettings};
use crate::pool::HostPool;
use crate::reconcile::{HostSpec, Reconciler};
use crate::registration::{RegistrationError, RegistrySource};
use crate::serving::Lanes;
use crate::serving::{AdminListener, ConnectionGate, serve_admin, serve_http};
use crate::snapshot::{Snapshot, build_snapshot};
use crate::upstream::{
    ChildConfig, ChildTelemetry, DEFAULT_READY_WAIT, Supervised, Supervisor, SupervisorError,
    Upstream, UpstreamError, UpstreamState,
};

/// What `bulkhead serve` was asked to do.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub policies: PathBuf,
    /// Overrides `listen` in `gateway.toml`.
    pub listen: Option<SocketAddr>,
    /// Overrides `[admin] listen` in `gateway.toml`.
    pub admin_listen: Option<ListenAddr>,
    /// The trace export in force (the local gpu-host exports alike).
    pub telemetry: Option<bulkhead_telemetry::Settings>,
    pub log_format: bulkhead_telemetry::LogFormat,
    /// What happened to the exported spans (`/metrics`).
    pub span_counts: Option<Arc<bulkhead_telemetry::SpanCounts>>,
}

/// Where the gateway listens once bound (real ports for `:0`).
#[derive(Clone, Debug)]
pub struct Listening {
    /// Tenants: the OpenAI-compatible API.
    pub public: SocketAddr,
    /// Operators: the admin API and `/metrics`.
    pub admin: ListenAddr,
}

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the policy in {} is invalid:\n{errors}", dir.display())]
    Policy { dir: PathBuf, errors: PolicyErrors },
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the admin listener on {addr}: {source}")]
    BindAdmin {
        addr: ListenAddr,
        source: std::io::Error,
    },
    #[error("watching the policy folder: {0}")]
    Watch(String),
    #[error("the shared limit store: {0}")]
    LimitStore(String),
    #[error("starting the plugin engine: {0}")]
    PluginEngine(#[from] PluginError),
    #[error(transparent)]
    PluginStore(#[from] StoreError),
    #[error("the audit log: {0}")]
    Audit(#[from] AuditError),
    #[error("the model registry: {0}")]
    Registration(#[from] RegistrationError),
    #[error("the state database: {0}")]
    State(bulkhead_state::StateError),
    #[error(transparent)]
    Usage(#[from] crate::limits::JournalError),
}

/// Runs the gateway until `shutdown` resolves, then stops accepting, lets
/// streams in flight finish, and stops the local gpu-host.
/// `on_listening` gets the bound addresses (the real port for `:0`).
pub async fn serve(
    options: ServeOptions,
    on_listening: impl FnOnce(&Listening),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let dir = options.policies.clone();
    let first = build_snapshot(&dir, None).map_err(|errors| ServeError::Policy {
        dir: dir.clone(),
        errors,
    })?;
    let gateway = first.policy.gateway.clone();
    let first_files = first.policy.files.clone();
    for tenant in first.policy.tenants.values() {
        if tenant.jwt.dev_signing_key.is_some() {
            tracing::warn!(
                tenant = %tenant.id,
                "this tenant names a dev_signing_key: anyone who can read it can mint its tokens; \
                 remove it outside development"
            );
        }
    }
    for issuer in &first.policy.operator.issuers {
        if issuer.dev_signing_key.is_some() {
            tracing::warn!(
                issuer = %issuer.issuer.get_ref(),
                "an operator issuer names a dev_signing_key: anyone who can read it can mint \
                 operator tokens; remove it outside development"
            );
        }
    }
    if first.policy.operator.issuers.is_empty() {
        tracing::warn!(
            "gateway.toml has no [[operator.issuers]]: the operator API refuses every call"
        );
    }
    let metrics = Arc::new(Metrics::new());
    if let Some(counts) = &options.span_counts {
        metrics.count_spans(Arc::clone(counts));
    }
    let snapshot = Arc::new(ArcSwap::from_pointee(first));
    let audit = open_audit(gateway.audit.as_ref(), gateway.state.as_ref()).await?;
    audit
        .record_async(
            Actor::Gateway,
            Event::GatewayStart {
                version: env!("CARGO_PKG_VERSION").to_string(),
                policy_files: crate::audit::file_digests(&first_files),
            },
        )
        .await?;
    let plugins = open_plugins(&gateway.plugins, gateway.state.as_ref()).await?;
    plugins.share_instances_among(snapshot.load().policy.tenants_with_plugins());

    // Each host's readiness is its process's; requests get a handle that
    // also waits for the registered models (`Reconciler::start`).
    // `lane_host`: connection lanes only for the local child, whose CPU
    // numbers are this machine's.
    let mut hosts = Vec::new();
    let mut targets = Vec::new();
    let (supervisor, lane_host) = match &gateway.upstream {
        UpstreamSettings::Local(host) => {
            let child = ChildTelemetry::of(options.telemetry.as_ref(), options.log_format);
            let config = ChildConfig::new(host.clone(), child)?;
            let (state_tx, state_rx) = watch::channel(UpstreamState::Starting);
            let target = Target::Unix(config.socket.clone());
            let supervisor = Supervisor::start(config, state_tx, metrics.upstream_starts.clone());
            let upstream = Upstream::new(
                &target,
                None,
                None,
                state_rx.clone(),
                DEFAULT_READY_WAIT,
                Supervised::Yes,
            )?;
            targets.push(target.to_string());
            hosts.push(HostSpec {
                name: "local".into(),
                host: upstream,
                state: state_rx,
                starts: metrics.upstream_starts.clone(),
            });
            (Some(supervisor), Some(target))
        }
        UpstreamSettings::Remote(remotes) => {
            for remote in remotes {
                // Nobody supervises a remote host: it is assumed up, and
                // health checks take it out of rotation when it is not.
                let (state_tx, state_rx) = watch::channel(UpstreamState::Ready);
                std::mem::forget(state_tx);
                let upstream = Upstream::new(
                    &remote.target,
                    remote.secret.as_deref(),
                    remote.tls.as_ref(),
                    state_rx.clone(),
                    DEFAULT_READY_WAIT,
                    Supervised::No,
                )?;
                targets.push(remote.target.to_string());
                hosts.push(HostSpec {
                    name: remote.name.clone(),
                    host: upstream,
                    state: state_rx,
                    starts: prometheus_client::metrics::counter::Counter::default(),
                });
            }
            (None, None)
        }
    };

    let reloads = {
        let metrics = Arc::clone(&metrics);
        let current = Arc::clone(&snapshot);
        let started_with = gateway.clone();
        let audit = audit.clone();
        let plugins = plugins.clone();
        let last_audited = std::sync::Mutex::new(first_files);
        policy::watch(
            &dir,
            move |dir| {
                let previous = current.load();
                let built = build_snapshot(dir, Some(&previous));
                let result = audit_reload(&audit, dir, built, &previous, &last_audited, &metrics);
                let label = ResultLabels {
                    result: if result.is_ok() { "ok" } else { "failed" },
                };
                metrics.policy_reloads.get_or_create(&label).inc();
                if let Ok(next) = &result {
                    warn_restart_only_changes(&started_with, &next.policy.gateway);
                    plugins.share_instances_among(next.policy.tenants_with_plugins());
                }
                result
            },
            Arc::clone(&snapshot),
        )
        .map_err(|e| ServeError::Watch(e.to_string()))?
    };
    let models = Reconciler::start(
        Arc::clone(&snapshot),
        hosts,
        reloads.subscribe(),
        audit.clone(),
        registry_source(&gateway).await?,
    )
    .await?;
    let pool = HostPool::new(models.hosts(), targets, Arc::clone(&metrics));
    let health_watch = pool.watch_health();
    // Model and partition metrics are labelled by model and partition
    // only: with several hosts they are left out rather than mixed.
    let single = pool.hosts().len() == 1;
    let model_watch: Vec<_> = pool
        .hosts()
        .iter()
        .map(|h| {
            let metrics = single.then(|| Arc::clone(&metrics));
            crate::upstream::watch_models(h.requests().clone(), metrics, audit.clone())
        })
        .collect();
    let shared_limits = match &gateway.limit_store {
        crate::limits::LimitStore::Memory => None,
        crate::limits::LimitStore::Redis(store) => Some(
            crate::limits::SharedLimits::connect(
                store.clone(),
                metrics.limit_store_errors.clone(),
                metrics.limit_store_up.clone(),
            )
            .await
            .map_err(ServeError::LimitStore)?,
        ),
    };
    let usage = crate::limits::UsageBook::new();
    let journal = open_usage(gateway.usage_dir.as_ref(), &usage).await?;
    let usage_flusher = journal.clone().map(|j| tokio::spawn(flush_usage(j)));
    let app = App {
        snapshot,
        shared_limits,
        hosts: pool.clone(),
        models,
        metrics: Arc::clone(&metrics),
        plugins,
        plugin_gate: HookGate::new(gateway.plugins.max_concurrent_calls),
        audit,
        usage,
        plugin_changes: crate::limits::ChangeLimiter::new(crate::limits::LimitClock::monotonic()),
    };
    let max_body_bytes = usize::try_from(gateway.max_body_bytes).unwrap_or(usize::MAX);
    let lanes = lane_host.map(|host| Lanes::new(app.clone(), max_body_bytes, host));
    let partition_watch: Vec<_> = pool
        .hosts()
        .iter()
        .map(|host| {
            let lanes = lanes.clone();
            let host = host.clone();
            let metrics = single.then(|| Arc::clone(&metrics));
            crate::upstream::watch_partitions(host.requests().clone(), metrics, move |report| {
                host.set_dedicated(dedicated_tenants(report));
                if let Some(lanes) = &lanes {
                    lanes.update(report);
                }
            })
        })
        .collect();
    let router = api::router(app.clone(), max_body_bytes);
    let admin_router = api::admin_router(app, max_body_bytes);
    let addr = options.listen.unwrap_or(gateway.listen);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let admin_addr = options.admin_listen.unwrap_or(gateway.admin_listen);
    let admin_error = |source| ServeError::BindAdmin {
        addr: admin_addr.clone(),
        source,
    };
    let admin_listener = AdminListener::bind(&admin_addr)
        .await
        .map_err(admin_error)?;
    let admin_bound = admin_listener.local_addr().map_err(admin_error)?;
    on_listening(&Listening {
        public: bound,
        admin: admin_bound,
    });
    // One shutdown for both listeners.
    let open_files = crate::serving::raise_open_file_limit();
    tracing::info!(
        open_files = open_files.map_or("unlimited".into(), |n| n.to_string()),
        max_connections = gateway.connections.max_connections,
        "connection limits"
    );
    let public_gate = ConnectionGate::new(gateway.connections, Arc::clone(&metrics), "public");
    let admin_gate = ConnectionGate::new(gateway.connections, Arc::clone(&metrics), "admin");
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    tokio::join!(
        serve_http(
            listener,
            router,
            lanes.clone(),
            public_gate,
            stopped(stop_rx.clone())
        ),
        serve_admin(admin_listener, admin_router, admin_gate, stopped(stop_rx)),
    );
    drop(reloads);
    for task in model_watch
        .iter()
        .chain(&partition_watch)
        .chain(&health_watch)
    {
        task.abort();
    }
    if let Some(lanes) = lanes {
        lanes.stop().await;
    }
    if let Some(supervisor) = supervisor {
        supervisor.stop().await;
    }
    if let (Some(flusher), Some(journal)) = (usage_flusher, journal) {
        // The last counts, once no stream is running.
        flusher.abort();
        let flushed = tokio::task::spawn_blocking(move || journal.flush()).await;
        if let Ok(Err(e)) = flushed {
            tracing::error!("the last usage counts were not written: {e}");
        }
    }
    Ok(())
}

/// The usage journal of `dir`, read back into `book`; `None` without one.
async fn open_usage(
    dir: Option<&PathBuf>,
    book: &crate::limits::UsageBook,
) -> Result<Option<Arc<crate::limits::Journal>>, ServeError> {
    let Some(dir) = dir.cloned() else {
        return Ok(None);
    };
    let book = book.clone();
    let journal = tokio::task::spawn_blocking(move || crate::limits::Journal::open(&dir, &book))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    Ok(Some(Arc::new(journal)))
}

/// Writes what the usage book gained every [`crate::limits::FLUSH_EVERY`];
/// a failure is logged once until a write works again (the counts stay in
/// memory and go out with the next write that works).
async fn flush_usage(journal: Arc<crate::limits::Journal>) {
    let mut tick = tokio::time::interval(crate::limits::FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let journal = Arc::clone(&journal);
        match tokio::task::spawn_blocking(move || journal.flush()).await {
            Ok(Ok(_)) if failing => {
                failing = false;
                tracing::info!("usage is written again");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) if !failing => {
                failing = true;
                tracing::error!("usage could not be written (kept in memory, retried): {e}");
            }
            Ok(Err(_)) => {}
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// The tenants that have a dedicated partition in `report`.
fn dedicated_tenants(
    report: &bulkhead_partition::PartitionsReport,
) -> std::collections::BTreeSet<String> {
    report
        .partitions
        .iter()
        .filter(|p| !p.draining && p.kind == bulkhead_partition::PartitionKind::Dedicated)
        .flat_map(|p| p.tenants.iter().map(|t| t.tenant.clone()))
        .collect()
}

/// The audit log, opened on a blocking thread (its entries read, its
/// checkpoint checked; a file log's torn tail cut), in the state database
/// when `[state]` names one; none when `[audit]` is unset.
async fn open_audit(
    settings: Option<&AuditSettings>,
    state: Option<&bulkhead_state::PgSettings>,
) -> Result<Audit, ServeError> {
    let Some(settings) = settings.cloned() else {
        tracing::info!("the audit log is off: no `[audit]` in gateway.toml");
        return Ok(Audit::disabled());
    };
    let state = state.cloned();
    let (log, report) = tokio::task::spawn_blocking(move || match state {
        None => AuditLog::open(&settings),
        Some(state) => {
            let key = settings.key.as_deref().ok_or_else(|| {
                AuditError::Config("a log in the state database needs `[audit] key`".into())
            })?;
            let key = crate::audit::read_signing_key(key)?;
            let store = bulkhead_state::PgAuditStore::open(&state)
                .map_err(|e| AuditError::Unavailable(e.to_string()))?;
            AuditLog::open_store(Box::new(store), key, &settings.origin)
        }
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    if report.key_created {
        tracing::warn!(
            log = log.place(),
            "a new audit key was generated; give its public key (audit.pub.pem or \
             audit.vkey in the log folder) to whoever verifies checkpoints"
        );
    }
    Ok(Audit::new(log))
}

/// Records a reload in the audit log: accepted (when the files differ from
/// the last recorded set) or refused, with the digest of every policy file.
/// An accepted reload whose entry cannot be written is not published (it
/// fails, and the previous policy keeps serving) unless it only restricts
/// tenants ([`only_restricts`]): revoking a tenant never waits for a disk.
/// Such a reload is logged and counted, and recorded by the next reload
/// the log can take.
fn audit_reload(
    audit: &Audit,
    dir: &Path,
    result: Result<Snapshot, PolicyErrors>,
    previous: &Snapshot,
    last_audited: &std::sync::Mutex<Vec<(PathBuf, [u8; 32])>>,
    metrics: &Metrics,
) -> Result<Snapshot, PolicyErrors> {
    let Some(_) = audit.log() else {
        return result;
    };
    let mut last = last_audited
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (files, outcome) = match &result {
        Ok(next) if next.policy.files == *last => return result,
        Ok(next) => (next.policy.files.clone(), Outcome::Accepted),
        Err(errors) => (
            policy::file_digests(dir),
            Outcome::Refused {
                reason: errors.to_string(),
            },
        ),
    };
    let accepted = matches!(outcome, Outcome::Accepted);
    let event = Event::PolicyReload {
        files: crate::audit::file_digests(&files),
        outcome,
    };
    let actor = Actor::Operator {
        issuer: None,
        tenant: None,
        sub: None,
    };
    match audit.record(actor, event) {
        Ok(_) if accepted => {
            *last = files;
            result
        }
        Ok(_) => result,
        Err(e) if accepted => match result.as_ref().map(|next| only_restricts(previous, next)) {
            Ok(Ok(())) => {
                tracing::error!(
                    error = %e,
                    "the reload could not be recorded in the audit log; it is applied because it \
                     only restricts tenants"
                );
                metrics.policy_reloads_unrecorded.inc();
                result
            }
            Ok(Err(grants)) => Err(PolicyErrors(vec![policy::PolicyError::at_path(
                Path::new("."),
                format!(
                    "the reload could not be recorded in the audit log, so it was not applied \
                     ({e}); while the log cannot record, only a reload that restricts tenants is \
                     applied, and in this one {grants}"
                ),
            )])),
            Err(_) => result,
        },
        Err(e) => {
            tracing::error!(error = %e, "a refused policy reload could not be recorded in the audit log");
            result
        }
    }
}

/// Whether `next` only takes away from tenants compared with `previous`:
/// the policy rule ([`policy::only_restricts`]) and, for every tenant kept,
/// token verification that admits no token it did not
/// ([`crate::auth::Verifiers::narrows`]).
fn only_restricts(previous: &Snapshot, next: &Snapshot) -> Result<(), String> {
    policy::only_restricts(&previous.policy, &next.policy)?;
    next.policy
        .tenants
        .keys()
        .try_for_each(|tenant| next.verifiers.narrows(&previous.verifiers, tenant))
}

/// Where API registrations live: the state database when `[state]` names
/// one, else the `[models] registry` folder, else nowhere (registering is
/// off).
async fn registry_source(
    gateway: &policy::GatewaySettings,
) -> Result<Option<RegistrySource>, ServeError> {
    match (&gateway.state, &gateway.models_registry) {
        (Some(state), _) => {
            let db = bulkhead_state::Db::connect(state)
                .await
                .map_err(ServeError::State)?;
            Ok(Some(RegistrySource::Db(db)))
        }
        (None, Some(dir)) => Ok(Some(RegistrySource::Dir(dir.clone()))),
        (None, None) => Ok(None),
    }
}

/// The plugin registry: the store loaded (every plugin compiled or read
/// from its cache, failures logged), or none when `[plugins] store` is
/// unset. The engine is created here, once, and the registry owns it.
///
/// With `[state]`, plugins are kept in the state database for every
/// replica (uploads are on), `[plugins] store`, if set, is only this
/// replica's cache of compiled code, and a task keeps the index in step
/// with the database (notices, and a full reread every
/// [`bulkhead_state::PLUGIN_RESYNC`]). A database that does not answer
/// within its `connect_timeout_ms` fails the start, naming it.
async fn open_plugins(
    settings: &GatewayPlugins,
    state: Option<&bulkhead_state::PgSettings>,
) -> Result<PluginRegistry, ServeError> {
    if let Some(state) = state.cloned() {
        let cache = settings.store.clone();
        let (registry, db) = tokio::task::spawn_blocking(move || {
            let shared = bulkhead_state::PgPlugins::open(&state).map_err(ServeError::State)?;
            let db = shared.db().clone();
            let engine = PluginEngine::new(PluginEngineConfig::default())?;
            let (registry, _) =
                PluginRegistry::open_shared(Arc::new(shared), cache.as_deref(), engine)?;
            Ok::<_, ServeError>((registry, db))
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        bulkhead_state::follow_plugins(db, registry.clone(), bulkhead_state::PLUGIN_RESYNC);
        return Ok(registry);
    }
    let Some(store) = settings.store.clone() else {
        tracing::info!("plugin uploads are off: no `[plugins] store` in gateway.toml");
        return Ok(PluginRegistry::disabled());
    };
    let opened = tokio::task::spawn_blocking(move || {
        let engine = PluginEngine::new(PluginEngineConfig::default())?;
        Ok::<_, ServeError>(PluginRegistry::open(&store, engine)?)
    })
    .await
    // A panic while loading is a bug: let it surface as one.
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    Ok(opened.0)
}

/// Settings read once at start; a reload that changes them says so.
fn warn_restart_only_changes(running: &policy::GatewaySettings, new: &policy::GatewaySettings) {
    let upstream_changed = match (&running.upstream, &new.upstream) {
        (UpstreamSettings::Local(a), UpstreamSettings::Local(b)) => a != b,
        (UpstreamSettings::Remote(a), UpstreamSettings::Remote(b)) => {
            a.len() != b.len()
                || a.iter()
                    .zip(b)
                    .any(|(a, b)| a.name != b.name || a.target != b.target)
        }
        _ => true,
    };
    if upstream_changed
        || running.listen != new.listen
        || running.admin_listen != new.admin_listen
        || running.max_body_bytes != new.max_body_bytes
        || running.plugins.store != new.plugins.store
        || running.plugins.max_concurrent_calls != new.plugins.max_concurrent_calls
        || running.audit != new.audit
        || running.models_registry != new.models_registry
        || running.usage_dir != new.usage_dir
        || running.limit_store != new.limit_store
        || running.state != new.state
    {
        tracing::warn!(
            "gateway.toml changed listen, [admin] listen, max_body_bytes, the upstream, the plugin store or \
             max_concurrent_calls, the audit log, the model registry, [usage], the [limits] store or [state]; \
             those take effect at the next restart (the rest, models included, is live)"
        );
    }
}
