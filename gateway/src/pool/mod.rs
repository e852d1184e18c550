//! The gpu-hosts as the request path sees them: which host runs a
//! generation, what happens when one fails, and draining.
//!
//! - **Choice.** Among the hosts that hold the model with its registered
//!   weights and are not draining: the tenant's dedicated partitions first
//!   (a host where the tenant has one), then the host with the fewest
//!   generations in flight from this gateway per byte of free KV cache
//!   (from its last `Health`), ties taken in turn. A host taken out of
//!   rotation is chosen only when no other can be.
//! - **Failure.** A host that cannot be reached is taken out of rotation
//!   (ejected) and health-checked again after a backoff (1 s doubling to
//!   30 s); one answer puts it back. A generation that fails before it
//!   started (unreachable host, full queue, model missing or out of
//!   service there, a device error) is sent once to another host; after
//!   `Started` the client already has its answer and gets the error event.
//! - **Draining.** A draining host takes no new generations; the drain
//!   call waits until its generations in flight end.

mod health;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::metrics::{HostLabels, Metrics};
use crate::reconcile::HostSync;
use crate::upstream::{Events, Generate, Started, Upstream, UpstreamError, UpstreamState};

use health::EJECT_FIRST;
#[cfg(test)]
use health::EJECT_MOST;

/// Every gpu-host this gateway sends generations to. Cheap to clone.
#[derive(Clone, Debug)]
pub struct HostPool {
    hosts: Arc<[Host]>,
    metrics: Arc<Metrics>,
    /// Where ties start, advanced by each choice.
    turn: Arc<AtomicUsize>,
}

/// One host: the client the request path uses and the state it shares
/// with every clone of the pool.
#[derive(Clone, Debug)]
pub struct Host {
    requests: Upstream,
    state: Arc<HostState>,
}

#[derive(Debug)]
pub struct HostState {
    sync: Arc<HostSync>,
    /// `unix:PATH` or `tcp:HOST:PORT`, for the admin API.
    target: String,
    /// Generations this gateway runs on the host now.
    outstanding: AtomicU64,
    /// Told when `outstanding` drops to zero.
    idle: Notify,
    /// The last `Health` answer.
    load: ArcSwap<Option<Load>>,
    health: Mutex<Health>,
    /// Tenants with a dedicated partition on the host (from `Partitions`).
    dedicated: ArcSwap<BTreeSet<String>>,
    labels: HostLabels,
}

/// What the host's last `Health` said of its load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub kv_bytes: u64,
    pub kv_bytes_used: u64,
    pub queued: u32,
    pub running: u32,
}

impl Load {
    fn free_kv(&self) -> u64 {
        self.kv_bytes.saturating_sub(self.kv_bytes_used)
    }
}

/// Whether the host takes new generations.
#[derive(Debug, Default)]
struct Health {
    /// Out of rotation since, until (the next health check).
    ejected: Option<(Instant, Instant)>,
    /// The current wait between checks of an ejected host.
    backoff: Duration,
    draining: bool,
    /// Why it was last ejected.
    last_error: Option<String>,
}

/// How the admin API shows a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostStatus {
    /// Taking generations.
    Up,
    /// Its process is (re)starting or its models are being loaded.
    Starting,
    /// Out of rotation after a failure, for `for_ms` so far.
    Ejected { for_ms: u64 },
    /// Taking no new generations.
    Draining,
}

/// A generation in flight on a host: counted until dropped.
struct InFlight {
    state: Arc<HostState>,
    metrics: Arc<Metrics>,
}

impl InFlight {
    fn start(state: &Arc<HostState>, metrics: &Arc<Metrics>) -> InFlight {
        let now = state.outstanding.fetch_add(1, Ordering::SeqCst) + 1;
        gauge(metrics, &state.labels, now);
        InFlight {
            state: Arc::clone(state),
            metrics: Arc::clone(metrics),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.state.outstanding.fetch_sub(1, Ordering::SeqCst) - 1;
        gauge(&self.metrics, &self.state.labels, now);
        if now == 0 {
            self.state.idle.notify_waiters();
        }
    }
}

fn gauge(metrics: &Metrics, labels: &HostLabels, n: u64) {
    metrics
        .gpu_host_outstanding
        .get_or_create(labels)
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// Why a generation did not start on a host and whether another may take it.
fn retry_elsewhere(e: &UpstreamError) -> bool {
    matches!(
        e,
        UpstreamError::Unavailable(_)
            | UpstreamError::Overloaded(_)
            | UpstreamError::ModelNotFound(_)
            | UpstreamError::ModelUnavailable(_)
            | UpstreamError::DeviceError { .. }
    )
}

impl HostPool {
    /// The pool over the reconciler's hosts; `targets` names each one's
    /// address (same order).
    pub fn new(syncs: &[Arc<HostSync>], targets: Vec<String>, metrics: Arc<Metrics>) -> HostPool {
        let hosts: Vec<Host> = syncs
            .iter()
            .zip(targets)
            .map(|(sync, target)| {
                let labels = HostLabels {
                    host: sync.name().to_string(),
                };
                metrics.gpu_host_up.get_or_create(&labels).set(1);
                gauge(&metrics, &labels, 0);
                Host {
                    requests: sync.requests().clone(),
                    state: Arc::new(HostState {
                        sync: Arc::clone(sync),
                        target,
                        outstanding: AtomicU64::new(0),
                        idle: Notify::new(),
                        load: ArcSwap::default(),
                        health: Mutex::new(Health {
                            backoff: EJECT_FIRST,
                            ..Health::default()
                        }),
                        dedicated: ArcSwap::default(),
                        labels,
                    }),
                }
            })
            .collect();
        HostPool {
            hosts: hosts.into(),
            metrics,
            turn: Arc::default(),
        }
    }

    /// The hosts, in `gateway.toml`'s order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`.
    pub fn get(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name() == name)
    }

    /// The same pool with a one-host pool's client replaced by one on
    /// `target` (a partition's lane on the local child), sharing its
    /// counters and health.
    pub fn with_lane(&self, target: &bulkhead_protocol::Target) -> Result<HostPool, UpstreamError> {
        let hosts: Vec<Host> = self
            .hosts
            .iter()
            .map(|h| {
                Ok(Host {
                    requests: h.requests.for_target(target)?,
                    state: Arc::clone(&h.state),
                })
            })
            .collect::<Result<_, UpstreamError>>()?;
        Ok(HostPool {
            hosts: hosts.into(),
            ..self.clone()
        })
    }

    /// Starts one health checker per host (aborted with the handles).
    pub fn watch_health(&self) -> Vec<JoinHandle<()>> {
        self.hosts
            .iter()
            .map(|h| tokio::spawn(health::watch(h.clone(), Arc::clone(&self.metrics))))
            .collect()
    }

    /// Whether some host takes generations (`/readyz`).
    pub fn ready(&self) -> bool {
        self.hosts.iter().any(|h| h.status() == HostStatus::Up)
    }

    /// Whether some host holds `model` with its registered weights.
    pub fn serves(&self, model: &str) -> bool {
        self.hosts.iter().any(|h| h.state.sync.serves(model))
    }

    /// Starts `request` on the best host for it, and on a second one when
    /// the first fails before starting; the events count as that host's
    /// load until dropped.
    pub async fn generate(
        &self,
        request: Generate,
        deadline: tokio::time::Instant,
    ) -> Result<(Started, Events), UpstreamError> {
        let (model, tenant) = (request.model.as_str(), request.tenant.as_str());
        let first = self
            .choose(model, tenant, None)
            .ok_or_else(|| no_host(model))?;
        let error = match self.start_on(&first, request.clone(), deadline).await {
            Err(e) if retry_elsewhere(&e) => e,
            done => return done,
        };
        let Some(second) = self.choose(model, tenant, Some(first.name())) else {
            return Err(error);
        };
        self.metrics.gpu_host_retries.inc();
        tracing::warn!(
            host = %first.name(),
            next = %second.name(),
            "a generation failed before starting ({error}); retrying it on another gpu-host"
        );
        self.start_on(&second, request, deadline).await
    }

    /// One try on one host. A host that lacks a registered model it should
    /// have (restarted empty) is brought in line and asked once more.
    async fn start_on(
        &self,
        host: &Host,
        request: Generate,
        deadline: tokio::time::Instant,
    ) -> Result<(Started, Events), UpstreamError> {
        let in_flight = InFlight::start(&host.state, &self.metrics);
        let result = match host.requests.generate(request.clone()).await {
            Err(UpstreamError::ModelNotFound(why)) => {
                tracing::warn!(
                    host = %host.name(),
                    model = %request.model,
                    "the gpu-host does not have a registered model ({why}); loading it again"
                );
                if host.state.sync.reprime(deadline).await && host.state.sync.serves(&request.model)
                {
                    host.requests.generate(request).await
                } else {
                    Err(UpstreamError::ModelNotFound(why))
                }
            }
            result => result,
        };
        match result {
            Ok((started, events)) => {
                self.metrics
                    .gpu_host_generations
                    .get_or_create(&host.state.labels)
                    .inc();
                Ok((started, events.holding(in_flight)))
            }
            Err(e) => {
                if matches!(e, UpstreamError::Unavailable(_)) {
                    host.eject(&e.to_string(), &self.metrics);
                }
                Err(e)
            }
        }
    }

    /// The host to send a generation of `model` for `tenant` to, other
    /// than `not`.
    fn choose(&self, model: &str, tenant: &str, not: Option<&str>) -> Option<Host> {
        let open: Vec<&Host> = self
            .hosts
            .iter()
            .filter(|h| Some(h.name()) != not && !h.draining())
            .collect();
        // Hosts known to hold the model; when none does yet (every host
        // still loading, or restarted empty), any host may be asked: it
        // answers or is brought in line.
        let holding: Vec<&Host> = open
            .iter()
            .copied()
            .filter(|h| h.state.sync.serves(model))
            .collect();
        let mut candidates = if holding.is_empty() && not.is_none() {
            open
        } else {
            holding
        };
        if candidates
            .iter()
            .any(|h| h.state.dedicated.load().contains(tenant))
        {
            candidates.retain(|h| h.state.dedicated.load().contains(tenant));
        }
        let in_rotation: Vec<&Host> = candidates
            .iter()
            .copied()
            .filter(|h| !h.ejected())
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        if in_rotation.is_empty() {
            // Every candidate is out of rotation: try the one due back first.
            return candidates.into_iter().min_by_key(|h| h.back_at()).cloned();
        }
        least_loaded(&in_rotation, turn).cloned()
    }
}

/// The host with the fewest generations in flight per byte of free KV
/// cache (just the fewest while any host's load is unknown); ties go to
/// the first from `turn` on.
fn least_loaded<'a>(hosts: &[&'a Host], turn: usize) -> Option<&'a Host> {
    let loads: Vec<(u64, Option<u64>)> = hosts
        .iter()
        .map(|h| {
            let free = (**h.state.load.load()).map(|l| l.free_kv());
            (h.state.outstanding.load(Ordering::SeqCst), free)
        })
        .collect();
    let weigh = loads.iter().all(|(_, free)| free.is_some());
    let n = hosts.len();
    let mut best: Option<usize> = None;
    for k in 0..n {
        let i = (turn + k) % n;
        let Some(b) = best else {
            best = Some(i);
            continue;
        };
        let (oi, fi) = loads[i];
        let (ob, fb) = loads[b];
        let better = if weigh {
            // (oi + 1) / fi < (ob + 1) / fb, without dividing.
            let (fi, fb) = (u128::from(fi.unwrap_or(0)), u128::from(fb.unwrap_or(0)));
            u128::from(oi + 1) * fb < u128::from(ob + 1) * fi
        } else {
            oi < ob
        };
        if better {
            best = Some(i);
        }
    }
    best.map(|i| hosts[i])
}

/// No host can take a generation of `model` now.
fn no_host(model: &str) -> UpstreamError {
    UpstreamError::Unavailable(format!(
        "no gpu-host can take a generation of `{model}` now (every host that serves it is \
         draining)"
    ))
}

impl Host {
    pub fn name(&self) -> &str {
        self.state.sync.name()
    }

    pub fn target(&self) -> &str {
        &self.state.target
    }

    /// The client the request path uses (partitions, lanes, listings).
    pub fn requests(&self) -> &Upstream {
        &self.requests
    }

    /// The registered models it holds.
    pub fn models(&self) -> Arc<BTreeSet<String>> {
        self.state.sync.models()
    }

    /// Generations this gateway runs on it now.
    pub fn outstanding(&self) -> u64 {
        self.state.outstanding.load(Ordering::SeqCst)
    }

    /// Its last reported load (`None` before the first health check).
    pub fn load(&self) -> Option<Load> {
        **self.state.load.load()
    }

    /// Tenants with a dedicated partition on it.
    pub fn dedicated(&self) -> Arc<BTreeSet<String>> {
        self.state.dedicated.load_full()
    }

    /// Records the host's partitions (the tenants it has dedicated ones for).
    pub fn set_dedicated(&self, tenants: BTreeSet<String>) {
        if **self.state.dedicated.load() != tenants {
            self.state.dedicated.store(Arc::new(tenants));
        }
    }

    /// Why it was last taken out of rotation.
    pub fn last_error(&self) -> Option<String> {
        self.health().last_error.clone()
    }

    pub fn status(&self) -> HostStatus {
        let health = self.health();
        if health.draining {
            return HostStatus::Draining;
        }
        if let Some((since, _)) = health.ejected {
            let for_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
            return HostStatus::Ejected { for_ms };
        }
        match self.requests.state() {
            UpstreamState::Ready => HostStatus::Up,
            UpstreamState::Starting | UpstreamState::Stopped => HostStatus::Starting,
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.state
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn draining(&self) -> bool {
        self.health().draining
    }

    fn ejected(&self) -> bool {
        self.health().ejected.is_some()
    }

    /// When an ejected host is next checked (now for one in rotation).
    fn back_at(&self) -> Instant {
        self.health()
            .ejected
            .map_or_else(Instant::now, |(_, until)| until)
    }

    /// Takes the host out of rotation (a no-op when it is out already:
    /// only health checks move the backoff on).
    fn eject(&self, why: &str, metrics: &Metrics) {
        let mut health = self.health();
        health.last_error = Some(why.to_string());
        if health.ejected.is_some() {
            return;
        }
        let now = Instant::now();
        health.ejected = Some((now, now + health.backoff));
        drop(health);
        metrics
            .gpu_host_ejections
            .get_or_create(&self.state.labels)
            .inc();
        metrics.gpu_host_up.get_or_create(&self.state.labels).set(0);
        tracing::warn!(host = %self.name(), "gpu-host taken out of rotation: {why}");
    }

    /// Stops sending new generations to the host and waits (until
    /// `deadline`) for those in flight; how many were in flight when it
    /// started, and how many are left.
    pub async fn drain(&self, deadline: tokio::time::Instant, metrics: &Metrics) -> (u64, u64) {
        let was = {
            let mut health = self.health();
            let was = health.draining;
            health.draining = true;
            was
        };
        if !was {
            metrics.gpu_host_up.get_or_create(&self.state.labels).set(0);
            tracing::info!(host = %self.name(), "draining the gpu-host");
        }
        let at_start = self.outstanding();
        loop {
            let idle = self.state.idle.notified();
            if self.outstanding() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        (at_start, self.outstanding())
    }

    /// Puts a drained host back in rotation.
    pub fn resume(&self, metrics: &Metrics) {
        let mut health = self.health();
        if !health.draining {
            return;
        }
        health.draining = false;
        let up = health.ejected.is_none();
        drop(health);
        metrics
            .gpu_host_up
            .get_or_create(&self.state.labels)
            .set(i64::from(up));
        tracing::info!(host = %self.name(), "the gpu-host takes requests again");
    }
}
