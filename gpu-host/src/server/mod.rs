//! The gRPC transport of `bulkhead-gpu-host serve`: the
//! `bulkhead.gpu_host.v1.GpuHost` service, its bearer-secret check, the
//! wire's requests turned into the engine's, on the main listener and,
//! for each dedicated partition on the CPU backend, on its I/O lane
//! (`lanes.rs`). The models it serves are `crate::models`'; the
//! partitions' queues and scheduler threads are `crate::sched`', whose
//! events, errors and reports become the wire's messages and status codes
//! here (`wire.rs`) and nowhere else.
//!
//! ```text
//! gRPC request ─auth─▶ GpuHostService::generate ─validate─▶ Job ─route by tenant─▶ partition's queue ─▶ its scheduler thread
//!      ▲                                                                                                │ Batcher::step per model
//!      └─ wire ◀─ tokio mpsc (Started, Delta…, Finished) ◀─ outbox (try_send) ◀─────────────────────────┘
//! ```

mod auth;
mod lanes;
mod listen;
mod request;
mod service;
mod wire;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bulkhead_partition::Device;
use bulkhead_protocol::Target;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::backend::ComputeBackend;
use crate::models::{ModelRegistry, ModelSpec, PassPlace};
use crate::sched::{PartitionSettings, Partitions, Workers};
use crate::verify::{ScrubConfig, Scrubber};
pub use auth::{AuthSecret, MIN_SECRET_BYTES, SecretError};
pub use service::TestHooks;

use lanes::LaneListeners;
use listen::Listener;
use service::GpuHostService;

/// Everything `serve` needs, typed once.
#[derive(Debug)]
pub struct ServeConfig {
    /// `unix:PATH` or `tcp:HOST:PORT`.
    pub listen: Target,
    /// The models to load at start, each under its name (more can be loaded
    /// later with `LoadModel`).
    pub models: Vec<ModelSpec>,
    /// Cores of the CPU device (compute units the partitions split; each
    /// partition runs one worker thread per core it has). Unused on a HIP
    /// device, whose CUs the partitions split.
    pub threads: usize,
    /// What the partitions compute with (`--backend`).
    pub compute: ComputeBackend,
    /// Decode rows of one model's step (its batch keeps twice that many
    /// sequences in KV).
    pub max_batch: usize,
    /// Bytes of KV cache of the whole host (the memory partitions split;
    /// each partition's pool of 16-token blocks per model). On a HIP
    /// device the partitions are planned with the `PartitionedDevice`'s
    /// own memory split instead (made from this same setting by `serve`).
    pub kv_memory_bytes: u64,
    /// Requests that may wait to join a batch in each partition; past a
    /// tenant's part of it and the free room, RESOURCE_EXHAUSTED.
    pub queue_capacity: usize,
    /// Bearer secret required from clients (mandatory on TCP).
    pub auth_secret: Option<AuthSecret>,
    /// TLS on a TCP listener (and its lanes); without it TCP is refused
    /// unless `plaintext_tcp` allows it.
    pub tls: Option<ServerTls>,
    pub plaintext_tcp: PlaintextTcp,
    /// How fast resident weights are re-hashed in the background.
    pub scrub: ScrubConfig,
    /// Whether the test-only RPCs answer.
    pub test_hooks: TestHooks,
}

/// The host's TLS on TCP: its certificate chain and key, and the CA whose
/// certificates clients must present (mutual TLS) when set.
#[derive(Clone)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    fn config(&self) -> ServerTlsConfig {
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// Whether TCP without TLS is served (`--allow-plaintext-tcp`): the bearer
/// secret and every prompt would cross the network in the clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaintextTcp {
    Refused,
    Allowed,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listening on TCP needs a bearer secret (--auth-token-file)")]
    TcpWithoutSecret,
    #[error(
        "--listen needs an address to bind (tcp:IP:PORT, e.g. tcp:0.0.0.0:7070), not the name `{0}`"
    )]
    ListenOnName(String),
    #[error(
        "listening on TCP needs TLS (--tls-cert and --tls-key, with --tls-client-ca for \
         mutual TLS), or --allow-plaintext-tcp to send the secret and prompts in the clear"
    )]
    TcpWithoutTls,
    #[error("TLS is for a TCP listener; a Unix socket is served without it")]
    TlsOnUnix,
    #[error("the TLS settings: {0}")]
    Tls(String),
    #[error("{name} must be at least 1")]
    ZeroSetting { name: &'static str },
    #[error(transparent)]
    Models(#[from] crate::models::StartError),
    #[error("the device: {0}")]
    Device(String),
    #[error("starting the schedulers: {0}")]
    Workers(String),
    #[error("starting the weight scrub: {0}")]
    Scrub(std::io::Error),
    #[error("{what} {}: {source}", path.display())]
    Socket {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the socket path {} is too long: {bytes} bytes with the `.PID.tmp` suffix it is \
         first bound under, and Linux allows {} (108 with the trailing NUL)",
        path.display(),
        listen::MAX_SOCKET_PATH_BYTES
    )]
    SocketPathTooLong { path: PathBuf, bytes: usize },
    #[error("something is already listening on {}", .0.display())]
    SocketInUse(PathBuf),
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error("binding {addr}: {source}")]
    Tcp {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("starting an I/O lane: {0}")]
    Lane(String),
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// An error with its causes (rustls says what is wrong in the source).
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A host with its models loaded and its scheduler started, not yet listening.
#[derive(Debug)]
pub struct Server {
    listen: Target,
    registry: Arc<ModelRegistry>,
    partitions: Partitions,
    workers: Workers,
    auth: auth::BearerAuth,
    tls: Option<ServerTlsConfig>,
    scrubber: Scrubber,
    test_hooks: TestHooks,
}

impl Server {
    /// Checks the config, loads every model and starts the scheduler (blocking).
    pub fn load(config: ServeConfig) -> Result<Server, ServeError> {
        let on_tcp = config.listen.is_tcp();
        if on_tcp && config.auth_secret.is_none() {
            return Err(ServeError::TcpWithoutSecret);
        }
        let tls = match (&config.tls, on_tcp) {
            (Some(_), false) => return Err(ServeError::TlsOnUnix),
            (None, true) if config.plaintext_tcp == PlaintextTcp::Refused => {
                return Err(ServeError::TcpWithoutTls);
            }
            (Some(tls), true) => {
                let tls = tls.config();
                // Parsed now, so a bad certificate or key fails the start.
                tonic::transport::Server::builder()
                    .tls_config(tls.clone())
                    .map_err(|e| ServeError::Tls(describe(&e)))?;
                Some(tls)
            }
            (None, _) => None,
        };
        for (name, value) in [
            ("threads", config.threads),
            ("max batch", config.max_batch),
            ("queue capacity", config.queue_capacity),
        ] {
            if value == 0 {
                return Err(ServeError::ZeroSetting { name });
            }
        }
        let place = match config.compute {
            ComputeBackend::Cpu => PassPlace::Host,
            ComputeBackend::Device(_) => PassPlace::Device,
        };
        let registry = Arc::new(ModelRegistry::load(&config.models, place)?);
        let (device, model_reservation_bytes) = match &config.compute {
            ComputeBackend::Cpu => {
                let cores = u32::try_from(config.threads).unwrap_or(u32::MAX);
                let device = Device::cpu(cores, config.kv_memory_bytes)
                    .map_err(|e| ServeError::Device(e.to_string()))?;
                (device, 0)
            }
            ComputeBackend::Device(split) => {
                (split.device().clone(), split.model_reservation_bytes())
            }
        };
        let cpus = crate::affinity::CpuMap::of_this_process()
            .map_err(|e| ServeError::Device(format!("reading the CPU affinity: {e}")))?;
        let settings = PartitionSettings {
            device,
            model_reservation_bytes,
            cpus,
            max_running: config.max_batch,
            capacity: config.queue_capacity,
            compute: config.compute,
        };
        let (partitions, workers) =
            Partitions::start(settings, Arc::clone(&registry)).map_err(ServeError::Workers)?;
        let listed = registry.clone();
        let scrubber = Scrubber::start(
            config.scrub,
            move || listed.all(),
            |model: &crate::models::LoadedModel, reason: &str| {
                tracing::warn!("model `{}` taken out of service: {reason}", model.name);
            },
        )
        .map_err(ServeError::Scrub)?;
        if config.test_hooks == TestHooks::Enabled {
            tracing::warn!("WARNING: test hooks are enabled; never run a real host like this");
        }
        Ok(Server {
            listen: config.listen,
            registry,
            partitions,
            workers,
            auth: auth::BearerAuth::new(config.auth_secret),
            tls,
            scrubber,
            test_hooks: config.test_hooks,
        })
    }

    /// Binds the listener, calls `on_listening` with the bound address (the
    /// real port for `tcp:…:0`), and serves until `shutdown` resolves, with
    /// an I/O lane for each dedicated partition (`lanes.rs`); then stops
    /// accepting everywhere, lets streams in flight finish and stops the
    /// scheduler.
    pub async fn run(
        self,
        on_listening: impl FnOnce(&Target),
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let listener = listen::bind(&self.listen).await?;
        on_listening(&listener.target());
        let lanes = Arc::new(
            LaneListeners::new(listener.target(), self.partitions.all_cpus())
                .with_tls(self.tls.clone()),
        );
        let service = GpuHostService::new(
            self.registry,
            Arc::new(self.partitions),
            Arc::clone(&lanes),
            self.auth,
            self.test_hooks,
        );
        let mut builder = match (&listener, self.tls) {
            (Listener::Tcp(_), Some(tls)) => tonic::transport::Server::builder().tls_config(tls)?,
            _ => tonic::transport::Server::builder(),
        };
        let router = builder.add_routes(service.routes());
        // The lanes hold the only other copies of the service.
        drop(service);
        let stopping = Arc::clone(&lanes);
        let shutdown = async move {
            shutdown.await;
            stopping.stop();
        };
        let served = match listener {
            Listener::Unix { listener, path } => {
                let result = router
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                    .await;
                // Only our own socket: a newer host may have replaced it since.
                let _ = std::fs::remove_file(&path);
                result
            }
            Listener::Tcp(listener) => {
                // TCP_NODELAY: every token event is a small HTTP/2 frame;
                // with Nagle on it would wait for the gateway's delayed ACK
                // of the previous one (~40 ms stalls in a stream).
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        };
        // The lanes' streams in flight finish; then the last copy of the
        // service (and with it every queue's sender) is gone: each
        // scheduler finishes its sequences, delivers their events and exits.
        let _ = tokio::task::spawn_blocking(move || lanes.join()).await;
        drop(self.scrubber);
        let workers = self.workers;
        let _ = tokio::task::spawn_blocking(move || workers.join()).await;
        Ok(served?)
    }
}
