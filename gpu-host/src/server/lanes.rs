//! I/O lanes: each dedicated partition on the CPU backend gets a thread of
//! its own, pinned to the partition's CPUs, running a current-thread tokio
//! runtime that serves the same gRPC service on a listener of its own. The
//! gateway sends a dedicated tenant's traffic there, so the per-token
//! HTTP/2 work of its streams runs on its cores, not on the shared runtime
//! that may run on another tenant's.
//!
//! One lane per tenant, started the first time the tenant is dedicated. A
//! lane outlives the dedication: once its tenant is shared (or gone) it is
//! no longer advertised and is re-pinned to every CPU of the host, but it
//! keeps serving the connections it has (a request goes to its tenant's
//! partition whatever listener carried it). A lane that cannot start is
//! logged and its partition is served by the main listener alone: a lane
//! never fails a layout. At shutdown the lanes stop accepting, finish their
//! streams in flight and are joined before the schedulers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use bulkhead_protocol::Target;
use rustix::thread::Pid;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::ServerTlsConfig;
use tonic::transport::server::TcpIncoming;

use super::ServeError;
use super::listen::{PlacedSocket, bind_unix_std};
use crate::affinity::{pin_current_thread, pin_thread};

/// The lane listeners of a host (one per dedicated tenant on the CPU
/// backend, pinned to its partition's cores), keyed by tenant.
#[derive(Debug)]
pub(crate) struct LaneListeners {
    /// Where the main listener is bound: lanes listen beside it.
    main: Target,
    /// Where a lane goes once its tenant is no longer dedicated.
    all_cpus: Vec<usize>,
    state: Mutex<State>,
    /// Flips to true when the server shuts down.
    stop: watch::Sender<bool>,
    /// TLS of the main TCP listener, which lanes on TCP use too.
    tls: Option<ServerTlsConfig>,
}

#[derive(Debug, Default)]
struct State {
    lanes: BTreeMap<String, Lane>,
    /// Numbers Unix lane sockets (`PATH.lane<N>`) in this process.
    next: u64,
    stopped: bool,
}

#[derive(Debug)]
struct Lane {
    target: Target,
    cpus: Vec<usize>,
    /// Whether `Partitions` reports it (its tenant is dedicated).
    advertised: bool,
    /// The thread's kernel id, to re-pin it from outside.
    tid: Pid,
    thread: JoinHandle<()>,
    /// Our Unix socket, removed when the lane is joined.
    socket: Option<PlacedSocket>,
}

/// A lane's listener, bound before its thread starts so that a bind error
/// is known at once.
enum Bound {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

/// A lane's listener on its thread's runtime.
enum Registered {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl LaneListeners {
    pub(crate) fn new(main: Target, all_cpus: Vec<usize>) -> LaneListeners {
        LaneListeners {
            main,
            all_cpus,
            state: Mutex::new(State::default()),
            stop: watch::Sender::new(false),
            tls: None,
        }
    }

    /// Lanes on TCP serve over TLS with `tls`, as the main listener does.
    pub(crate) fn with_tls(mut self, tls: Option<ServerTlsConfig>) -> LaneListeners {
        self.tls = tls;
        self
    }

    /// Makes the lanes match `wanted` (each dedicated tenant and its
    /// partition's CPUs): starts the missing ones serving `routes()`,
    /// re-pins those whose CPUs changed, and stops advertising the others
    /// (re-pinned to every CPU). Problems are logged, never returned.
    pub(crate) fn apply(&self, wanted: &BTreeMap<String, Vec<usize>>, routes: impl Fn() -> Routes) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stopped {
            return;
        }
        for (tenant, cpus) in wanted {
            if let Some(lane) = state.lanes.get_mut(tenant) {
                if !lane.thread.is_finished() {
                    lane.advertised = lane.repin(tenant, cpus);
                    continue;
                }
                // It stopped on an error (logged): start another.
                if let Some(dead) = state.lanes.remove(tenant) {
                    dead.join();
                }
            }
            let number = state.next;
            state.next += 1;
            match self.start(tenant, cpus, number, routes()) {
                Ok(lane) => {
                    tracing::info!(
                        "lane for tenant `{tenant}`: listening on {} on CPUs {cpus:?}",
                        lane.target
                    );
                    state.lanes.insert(tenant.clone(), lane);
                }
                Err(e) => tracing::warn!(
                    "lane for tenant `{tenant}`: not started, the main listener serves it: {e}"
                ),
            }
        }
        for (tenant, lane) in &mut state.lanes {
            if lane.advertised && !wanted.contains_key(tenant) {
                lane.advertised = false;
                lane.repin(tenant, &self.all_cpus);
            }
        }
    }

    /// Tenant → target of each lane that is up and advertised.
    pub(crate) fn advertised(&self) -> BTreeMap<String, String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .lanes
            .iter()
            .filter(|(_, lane)| lane.advertised && !lane.thread.is_finished())
            .map(|(tenant, lane)| (tenant.clone(), lane.target.to_string()))
            .collect()
    }

    /// Stops every lane accepting (their streams in flight go on); no lane
    /// starts after this.
    pub(crate) fn stop(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.stopped = true;
        self.stop.send_replace(true);
    }

    /// Stops the lanes and waits until each has finished its streams
    /// (blocking), then removes their sockets.
    pub(crate) fn join(&self) {
        self.stop();
        let lanes = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut state.lanes)
        };
        for lane in lanes.into_values() {
            lane.join();
        }
    }

    /// Binds lane number `number` and starts its thread; returns once it
    /// is pinned and accepting.
    fn start(
        &self,
        tenant: &str,
        cpus: &[usize],
        number: u64,
        routes: Routes,
    ) -> Result<Lane, ServeError> {
        let (bound, target) = self.bind(number)?;
        let socket = match &target {
            Target::Unix(path) => Some(PlacedSocket::at(path)),
            Target::Tcp(_) | Target::Named { .. } => None,
        };
        let (ready_tx, ready) = sync_channel(1);
        let stop = self.stop.subscribe();
        let pinned = cpus.to_vec();
        let label = tenant.to_string();
        let tls = self.tls.clone();
        // Linux keeps 15 bytes of a thread's name; a NUL would panic.
        let name: String = format!("lane:{tenant}")
            .chars()
            .filter(|&c| c != '\0')
            .take(15)
            .collect();
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&label, bound, &pinned, routes, tls, stop, &ready_tx));
        let failed = |message: String| {
            if let Some(socket) = &socket {
                socket.remove();
            }
            ServeError::Lane(message)
        };
        let thread = spawned.map_err(|e| failed(format!("starting its thread: {e}")))?;
        match ready.recv() {
            Ok(Ok(tid)) => Ok(Lane {
                target,
                cpus: cpus.to_vec(),
                advertised: true,
                tid,
                thread,
                socket,
            }),
            Ok(Err(message)) => {
                let _ = thread.join();
                Err(failed(message))
            }
            Err(_) => {
                let _ = thread.join();
                Err(failed("its thread died while starting".to_string()))
            }
        }
    }

    /// Lane `number`'s listener beside the main one: `PATH.lane<N>` (mode
    /// 0600, as the main socket) or the main IP with a port of its own.
    fn bind(&self, number: u64) -> Result<(Bound, Target), ServeError> {
        match &self.main {
            Target::Unix(main) => {
                let mut path = main.as_os_str().to_owned();
                path.push(format!(".lane{number}"));
                let path = PathBuf::from(path);
                let listener = bind_unix_std(&path)?;
                Ok((Bound::Unix(listener), Target::Unix(path)))
            }
            Target::Tcp(main) => {
                let addr = SocketAddr::new(main.ip(), 0);
                let tcp = |source| ServeError::Tcp { addr, source };
                let listener = std::net::TcpListener::bind(addr).map_err(tcp)?;
                listener.set_nonblocking(true).map_err(tcp)?;
                let bound = listener.local_addr().map_err(tcp)?;
                Ok((Bound::Tcp(listener), Target::Tcp(bound)))
            }
            // The main listener bound an address, or serving never started.
            Target::Named { host, .. } => Err(ServeError::ListenOnName(host.clone())),
        }
    }
}

impl Lane {
    /// Moves the lane's thread to `cpus`; whether it runs there now.
    fn repin(&mut self, tenant: &str, cpus: &[usize]) -> bool {
        if self.cpus == cpus {
            return true;
        }
        match pin_thread(self.tid, cpus) {
            Ok(()) => {
                self.cpus = cpus.to_vec();
                true
            }
            Err(e) => {
                tracing::warn!("lane for tenant `{tenant}`: re-pinning to CPUs {cpus:?}: {e}");
                false
            }
        }
    }

    fn join(self) {
        let _ = self.thread.join();
        if let Some(socket) = &self.socket {
            socket.remove();
        }
    }
}

/// A lane's thread: pins itself, serves until the server stops, then
/// finishes its streams in flight. Says on `ready` once it accepts.
fn run(
    tenant: &str,
    bound: Bound,
    cpus: &[usize],
    routes: Routes,
    tls: Option<ServerTlsConfig>,
    mut stop: watch::Receiver<bool>,
    ready: &SyncSender<Result<Pid, String>>,
) {
    let started = pin_current_thread(cpus)
        .map_err(|e| format!("pinning to CPUs {cpus:?}: {e}"))
        .and_then(|()| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting its runtime: {e}"))
        });
    let runtime = match started {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let shutdown = async move {
        // A dropped sender means the server is gone: stop too.
        let _ = stop.wait_for(|&stopped| stopped).await;
    };
    let served = runtime.block_on(async {
        let registered = match bound {
            Bound::Unix(listener) => {
                tokio::net::UnixListener::from_std(listener).map(Registered::Unix)
            }
            Bound::Tcp(listener) => {
                tokio::net::TcpListener::from_std(listener).map(Registered::Tcp)
            }
        };
        let listener = match registered {
            Ok(listener) => listener,
            Err(e) => {
                let _ = ready.send(Err(format!("registering its socket: {e}")));
                return Ok(());
            }
        };
        let builder = match (&listener, tls) {
            (Registered::Tcp(_), Some(tls)) => tonic::transport::Server::builder().tls_config(tls),
            _ => Ok(tonic::transport::Server::builder()),
        };
        let router = match builder {
            Ok(mut builder) => builder.add_routes(routes),
            Err(e) => {
                let _ = ready.send(Err(format!("its TLS settings: {e}")));
                return Ok(());
            }
        };
        let _ = ready.send(Ok(rustix::thread::gettid()));
        match listener {
            Registered::Unix(listener) => {
                router
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                    .await
            }
            Registered::Tcp(listener) => {
                // TCP_NODELAY as on the main listener: one small frame a token.
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        }
    });
    if let Err(e) = served {
        tracing::warn!("lane for tenant `{tenant}`: stopped serving: {e}");
    }
}

#[cfg(test)]
mod tests;
