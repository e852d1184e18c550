//! Connection lanes: each tenant in a dedicated partition of the local
//! gpu-host gets a thread pinned to that partition's CPUs, running its own
//! single-threaded runtime, which serves the tenant's HTTP connections and
//! owns its own gRPC connection to the host. The tenant's per-token I/O
//! then runs on the tenant's cores, not on another tenant's
//! (tests/bench/isolation: without lanes, a flooding tenant's streams ran
//! on the other tenant's core).
//!
//! A connection is routed once, by the bearer token in its first request
//! head (peeked, not consumed: [`head`]), verified as handlers verify it.
//! **The route only picks where a connection is served: every request is
//! still authenticated by the handlers.** A keep-alive connection stays on
//! the lane it was given, so a later request of another tenant on the same
//! connection is served correctly, only on the first tenant's cores.
//!
//! The partition watcher ([`Lanes::update`]) starts, re-pins and retargets
//! lanes from each `Partitions` report. A lane is never stopped before
//! shutdown: a tenant that is no longer dedicated gets no new connections
//! on it, and it is re-pinned to every CPU of the process while its open
//! connections finish (tenants, and so lanes, are bounded by the policy).

mod head;

use std::collections::{BTreeMap, HashMap};
use std::net::TcpStream as StdTcpStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use bulkhead_partition::PartitionsReport;
use bulkhead_protocol::Target;
use hyper_util::server::graceful::Watcher;
use rustix::thread::{CpuSet, Pid, sched_getaffinity, sched_setaffinity};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::api::{self, App};
use crate::metrics::TenantLabels;
use crate::serving::{ConnectionSlot, serve_connection};

/// The connection lanes of one gateway. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Lanes {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Tenant → the lane its new connections go to: tenants dedicated now.
    /// Read once per connection; published by [`Lanes::update`].
    routes: ArcSwap<HashMap<String, mpsc::UnboundedSender<Command>>>,
    /// Every lane started, by tenant (the watcher and shutdown only).
    lanes: Mutex<BTreeMap<String, Lane>>,
    /// What each lane's router is built from; its `hosts` client is replaced
    /// by the lane's own.
    app: App,
    max_body_bytes: usize,
    /// The gpu-host's main listener, for partitions without a lane of
    /// their own there.
    host: Target,
    /// The process's CPUs at start: where a lane no longer dedicated runs.
    all_cpus: Vec<usize>,
}

/// What a lane's thread is asked to do.
enum Command {
    /// Serve this accepted connection (holding its place under the caps).
    Serve(StdTcpStream, Watcher, ConnectionSlot),
    /// Send new connections' requests to this gpu-host listener.
    Connect(Target),
}

/// One lane's thread, as the control side sees it.
#[derive(Debug)]
struct Lane {
    /// The thread's kernel id, to re-pin it from outside.
    tid: Pid,
    cpus: Vec<usize>,
    target: Target,
    commands: mpsc::UnboundedSender<Command>,
    thread: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Serve(tcp, ..) => f.debug_tuple("Serve").field(tcp).finish(),
            Command::Connect(target) => f.debug_tuple("Connect").field(target).finish(),
        }
    }
}

impl Lanes {
    /// No lanes yet; `app` is what lanes serve (with their own upstream),
    /// `host` the gpu-host's main listener.
    pub fn new(app: App, max_body_bytes: usize, host: Target) -> Lanes {
        let all_cpus = sched_getaffinity(None)
            .map(|set| (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
            .unwrap_or_default();
        Lanes {
            inner: Arc::new(Inner {
                routes: ArcSwap::default(),
                lanes: Mutex::new(BTreeMap::new()),
                app,
                max_body_bytes,
                host,
                all_cpus,
            }),
        }
    }

    /// Hands `tcp` to its tenant's lane, or gives it back to be served on
    /// the main runtime: no tenant has a lane, or the first request head
    /// names none (no valid bearer token, HTTP/2, too large or too slow).
    pub async fn hand_off(
        &self,
        tcp: TcpStream,
        watcher: Watcher,
        slot: ConnectionSlot,
    ) -> Option<(TcpStream, Watcher, ConnectionSlot)> {
        if self.inner.routes.load().is_empty() {
            return Some((tcp, watcher, slot));
        }
        let token = match head::peek_bearer(&tcp).await {
            Ok(token) => token,
            Err(why) => {
                tracing::trace!(?why, "a connection is served on the main runtime");
                return Some((tcp, watcher, slot));
            }
        };
        let snapshot = self.inner.app.snapshot.load();
        let Ok(identity) = snapshot.verifiers.verify(&token, SystemTime::now()) else {
            return Some((tcp, watcher, slot));
        };
        let Some(lane) = self.inner.routes.load().get(&identity.tenant).cloned() else {
            return Some((tcp, watcher, slot));
        };
        let std_tcp = match tcp.into_std() {
            Ok(std_tcp) => std_tcp,
            Err(e) => {
                tracing::warn!("a connection could not leave the main runtime: {e}");
                return None;
            }
        };
        // Counted before the lane has it: once sent, the lane may answer
        // before this task runs again, and a client that then reads the
        // metrics must find its connection counted. (Off by one only when
        // the lane stopped at shutdown, below.)
        self.inner
            .app
            .metrics
            .lane_connections
            .get_or_create(&TenantLabels {
                tenant: identity.tenant,
            })
            .inc();
        match lane.send(Command::Serve(std_tcp, watcher, slot)) {
            Ok(()) => None,
            // The lane stopped (shutdown): serve it here.
            Err(mpsc::error::SendError(Command::Serve(std_tcp, watcher, slot))) => {
                TcpStream::from_std(std_tcp)
                    .ok()
                    .map(|tcp| (tcp, watcher, slot))
            }
            Err(_) => None,
        }
    }

    /// Brings the lanes in line with the host's partitions: each dedicated
    /// partition with host CPUs gets its tenant a lane pinned to them,
    /// connected to the partition's own listener when it has one.
    pub fn update(&self, report: &PartitionsReport) {
        let wanted = wanted(report, &self.inner.host);
        let mut lanes = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (tenant, (cpus, target)) in &wanted {
            match lanes.get_mut(tenant) {
                Some(lane) => {
                    lane.pin(tenant, cpus);
                    lane.connect(target);
                }
                None => match Lane::start(tenant, cpus, target, &self.inner) {
                    Ok(lane) => {
                        lanes.insert(tenant.clone(), lane);
                    }
                    Err(e) => tracing::warn!(
                        tenant,
                        "cannot start a connection lane; the tenant's connections stay on \
                         the main runtime: {e}"
                    ),
                },
            }
        }
        for (tenant, lane) in lanes.iter_mut() {
            if !wanted.contains_key(tenant) {
                lane.pin(tenant, &self.inner.all_cpus);
            }
        }
        let routes: HashMap<String, mpsc::UnboundedSender<Command>> = lanes
            .iter()
            .filter(|(tenant, _)| wanted.contains_key(*tenant))
            .map(|(tenant, lane)| (tenant.clone(), lane.commands.clone()))
            .collect();
        let current = self.inner.routes.load();
        let same = routes.len() == current.len()
            && routes
                .iter()
                .all(|(t, c)| current.get(t).is_some_and(|now| now.same_channel(c)));
        if !same {
            self.inner.routes.store(Arc::new(routes));
        }
    }

    /// After shutdown drained every connection: stops the lane threads.
    pub async fn stop(&self) {
        self.inner.routes.store(Arc::default());
        let lanes = std::mem::take(
            &mut *self
                .inner
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        // Dropping a lane's last sender ends its loop.
        let threads: Vec<_> = lanes.into_values().map(|lane| lane.thread).collect();
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        });
        let _ = joined.await;
    }
}

impl Lane {
    /// Starts a lane's thread pinned to `cpus`, serving with its own
    /// client to `target`.
    fn start(
        tenant: &str,
        cpus: &[usize],
        target: &Target,
        inner: &Inner,
    ) -> std::io::Result<Lane> {
        let (commands, received) = mpsc::unbounded_channel();
        let (started_tx, started) = std::sync::mpsc::sync_channel(1);
        let thread = {
            let pinned = cpus.to_vec();
            let target = target.clone();
            let app = inner.app.clone();
            let max_body_bytes = inner.max_body_bytes;
            let owner: Arc<str> = tenant.into();
            std::thread::Builder::new()
                // The kernel keeps 15 bytes: `lane:` and the tenant's first ten.
                .name(format!("lane:{tenant}"))
                .spawn(move || {
                    let runtime = pin(None, &pinned).and_then(|()| {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                    });
                    let runtime = match runtime {
                        Ok(runtime) => {
                            let _ = started_tx.send(Ok(rustix::thread::gettid()));
                            runtime
                        }
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    runtime.block_on(run(received, app, max_body_bytes, target, owner));
                })?
        };
        let tid = started
            .recv()
            .map_err(|_| std::io::Error::other("the lane's thread exited at start"))??;
        tracing::info!(tenant, ?cpus, ?target, "connection lane started");
        Ok(Lane {
            tid,
            cpus: cpus.to_vec(),
            target: target.clone(),
            commands,
            thread,
        })
    }

    fn pin(&mut self, tenant: &str, cpus: &[usize]) {
        if self.cpus == cpus {
            return;
        }
        match pin(Some(self.tid), cpus) {
            Ok(()) => {
                tracing::debug!(tenant, ?cpus, "connection lane re-pinned");
                self.cpus = cpus.to_vec();
            }
            Err(e) => tracing::warn!(tenant, ?cpus, "cannot re-pin a connection lane: {e}"),
        }
    }

    fn connect(&mut self, target: &Target) {
        if self.target == *target {
            return;
        }
        if self.commands.send(Command::Connect(target.clone())).is_ok() {
            self.target = target.clone();
        }
    }
}

/// Tenant → (CPUs, gpu-host listener) of every lane `report` calls for:
/// each dedicated, non-draining partition with host CPUs, at its own
/// listener when it has one, else at `host`.
fn wanted(report: &PartitionsReport, host: &Target) -> BTreeMap<String, (Vec<usize>, Target)> {
    report
        .partitions
        .iter()
        .filter(|p| !p.draining && !p.host_cpus.is_empty())
        .filter_map(|p| {
            let tenant = p.dedicated_tenant()?;
            let mut cpus = p.host_cpus.clone();
            cpus.sort_unstable();
            cpus.dedup();
            let target = match &p.lane {
                None => host.clone(),
                Some(lane) => lane.parse().unwrap_or_else(|e| {
                    tracing::warn!(tenant, "the partition's lane listener: {e}");
                    host.clone()
                }),
            };
            Some((tenant.to_string(), (cpus, target)))
        })
        .collect()
}

/// Restricts thread `tid` (the calling thread for `None`) to `cpus`.
fn pin(tid: Option<Pid>, cpus: &[usize]) -> std::io::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus.iter().filter(|&&cpu| cpu < CpuSet::MAX_CPU) {
        set.set(cpu);
    }
    if set.count() == 0 {
        return Err(std::io::Error::other("no CPU to pin to"));
    }
    sched_setaffinity(tid, &set).map_err(std::io::Error::from)
}

/// A lane's loop: serve what the accept loop hands over until shutdown
/// drops the sender.
async fn run(
    mut commands: mpsc::UnboundedReceiver<Command>,
    app: App,
    max_body_bytes: usize,
    target: Target,
    owner: Arc<str>,
) {
    let mut router = lane_router(&app, max_body_bytes, &target, &owner);
    while let Some(command) = commands.recv().await {
        match command {
            Command::Serve(std_tcp, watcher, slot) => {
                // `into_std` left it non-blocking, as tokio needs.
                match TcpStream::from_std(std_tcp) {
                    Ok(tcp) => {
                        tokio::spawn(serve_connection(tcp, router.clone(), watcher, slot));
                    }
                    Err(e) => tracing::warn!("a lane could not take a connection: {e}"),
                }
            }
            Command::Connect(target) => {
                router = lane_router(&app, max_body_bytes, &target, &owner);
            }
        }
    }
}

/// The gateway's router, calling the gpu-host through a client whose
/// connection runs on this (the lane's) runtime. A connection is routed by
/// its first request, but a keep-alive connection (a pooling proxy's)
/// may carry other tenants' requests after it: each of those is answered
/// with `Connection: close`, so the client's next request opens a new
/// connection, which the accept loop routes by its own token. So another
/// tenant gets at most one request onto this lane per connection.
fn lane_router(
    app: &App,
    max_body_bytes: usize,
    target: &Target,
    owner: &Arc<str>,
) -> axum::Router {
    let hosts = app.hosts.with_lane(target).unwrap_or_else(|e| {
        tracing::warn!(?target, "a lane keeps the main gpu-host client: {e}");
        app.hosts.clone()
    });
    let app = App {
        hosts,
        ..app.clone()
    };
    let guard = (app.clone(), Arc::clone(owner));
    api::router(app, max_body_bytes).layer(axum::middleware::from_fn_with_state(guard, owners_only))
}

/// Marks the answer to a request that is not the lane owner's (another
/// tenant's token, or none that verifies) `Connection: close`.
async fn owners_only(
    axum::extract::State((app, owner)): axum::extract::State<(App, Arc<str>)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let owners = head::bearer_of(request.headers())
        .and_then(|token| {
            app.snapshot
                .load()
                .verifiers
                .verify(token, SystemTime::now())
                .ok()
        })
        .is_some_and(|identity| *identity.tenant == *owner);
    let mut response = next.run(request).await;
    if !owners {
        app.metrics
            .lane_foreign_requests
            .get_or_create(&TenantLabels {
                tenant: owner.to_string(),
            })
            .inc();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use bulkhead_partition::{PartitionKind, PartitionReport};

    use super::*;

    fn partition(id: &str, host_cpus: Vec<usize>, lane: &str, draining: bool) -> PartitionReport {
        PartitionReport {
            id: id.into(),
            kind: PartitionKind::from_name(id.split(':').next().unwrap()).unwrap(),
            units: Vec::new(),
            memory_bytes: 0,
            memory_used_bytes: 0,
            queued: 0,
            running: 0,
            preemptions: 0,
            device_errors: 0,
            tenants: Vec::new(),
            draining,
            host_cpus,
            lane: Some(lane.to_string()).filter(|l| !l.is_empty()),
        }
    }

    #[test]
    fn dedicated_partitions_with_host_cpus_get_lanes_at_their_own_listener_if_any() {
        let host = Target::Unix(PathBuf::from("/run/host.sock"));
        let report = PartitionsReport {
            partitions: vec![
                partition("dedicated:acme", vec![3, 2, 3], "", false),
                partition("dedicated:beta", vec![1], "unix:/run/beta.sock", false),
                partition("dedicated:gone", vec![4], "", true),
                partition("dedicated:gpu", vec![], "", false),
                partition("dedicated:odd", vec![5], "nonsense", false),
                partition("shared", vec![0], "", false),
            ],
            ..Default::default()
        };
        let lanes = wanted(&report, &host);
        assert_eq!(
            lanes.keys().map(String::as_str).collect::<Vec<_>>(),
            ["acme", "beta", "odd"]
        );
        assert_eq!(lanes["acme"], (vec![2, 3], host.clone()));
        assert_eq!(
            lanes["beta"],
            (vec![1], Target::Unix(PathBuf::from("/run/beta.sock")))
        );
        assert_eq!(lanes["odd"].1, host, "an unreadable listener falls back");
    }

    #[test]
    fn a_lane_thread_is_pinned_and_can_be_re_pinned_from_outside() {
        let all: Vec<usize> = {
            let set = sched_getaffinity(None).unwrap();
            (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
        };
        let last = *all.last().unwrap();
        let cpus_of = |tid| {
            let set = sched_getaffinity(Some(tid)).unwrap();
            (0..CpuSet::MAX_CPU)
                .filter(|&c| set.is_set(c))
                .collect::<Vec<_>>()
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            pin(None, &[last]).unwrap();
            tid_tx.send(rustix::thread::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        assert_eq!(cpus_of(tid), [last]);
        pin(Some(tid), &all).unwrap();
        assert_eq!(cpus_of(tid), all);
        assert!(pin(Some(tid), &[]).is_err());
        drop(done_tx);
        thread.join().unwrap();
    }
}
