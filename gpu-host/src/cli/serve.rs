use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use bulkhead_gpu_host::backend::{
    BackendChoice, BackendPlan, ComputeBackend, DeviceLabel, HIP_ENGINE, Ordinals,
    open_cuda_partitions, open_hip_partitions, plan_backend,
};
use bulkhead_gpu_host::models::ModelSpec;
use bulkhead_gpu_host::server::{
    AuthSecret, PlaintextTcp, ServeConfig, Server, ServerTls, TestHooks,
};
use bulkhead_gpu_host::verify::ScrubConfig;
use bulkhead_gpu_host::{cuda, hip};
use bulkhead_protocol::Target;
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: `unix:PATH` (socket mode 0600) or `tcp:HOST:PORT`
    /// (requires --auth-token-file, and TLS or --allow-plaintext-tcp).
    #[arg(long, value_name = "unix:PATH|tcp:ADDR")]
    listen: Target,
    /// Log lines on stderr as `text` or `json` (one object per line, with
    /// `trace_id` and `span_id` inside a traced request). Traces are
    /// exported over OTLP when the `OTEL_*` variables name an endpoint
    /// (docs/telemetry.md).
    #[arg(long, value_name = "text|json", default_value = "text")]
    pub(crate) log_format: bulkhead_telemetry::LogFormat,
    /// A model to serve under NAME (repeatable). It is hashed while loading
    /// and scrubbed while resident; registered models (checked against a
    /// signed digest) arrive later through the `LoadModel` RPC.
    #[arg(long = "model", value_name = "NAME=PATH")]
    models: Vec<ModelSpec>,
    /// What to run models on: `hip` (an AMD GPU; an error when none is
    /// usable), `cuda` (an NVIDIA GPU, likewise), `cpu`, or `auto` (HIP when
    /// a device is usable, else CUDA, else the CPU, saying why in one line
    /// on stderr).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// The HIP device (ordinal, as `bulkhead-gpu-host devices` lists them)
    /// for the HIP backend. A hardware partition (CPX, NPS4) is a device.
    #[arg(long, default_value_t = 0)]
    hip_device: usize,
    /// The CUDA device (ordinal, as `bulkhead-gpu-host devices` lists them)
    /// for the CUDA backend. A MIG instance the process is given is a device.
    #[arg(long, default_value_t = 0)]
    cuda_device: usize,
    /// Cores of the CPU device (default: all): the compute units tenants'
    /// partitions split, each partition's workers pinned to its own.
    #[arg(long)]
    threads: Option<usize>,
    /// Decode rows of one model's step, run as one forward pass; its
    /// continuous batch keeps twice that many sequences in KV and gives the
    /// rows to them fairly across tenants (`--workers` is the old name).
    #[arg(long, alias = "workers", default_value_t = DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// KV-cache memory of the host, e.g. `2GiB` (units B, KiB, MiB, GiB, kB,
    /// MB, GB): the memory tenants' partitions split (each partition's
    /// share is a pool of 16-token blocks per model it serves). Default: a
    /// quarter of host memory, at most 4 GiB. Pages are only touched as
    /// blocks are first used. With `--backend hip` it is also the device
    /// memory the partitions' budgets split; the rest of the device's memory
    /// is the model reservation the weights are charged to.
    #[arg(long, value_parser = parse_kv_memory)]
    kv_memory: Option<u64>,
    /// Requests that may wait to join a batch in each partition (a shared
    /// pool's tenants are each guaranteed their weighted part and borrow the
    /// free room); more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64)]
    queue_capacity: usize,
    /// File holding the bearer secret clients must send (`authorization: Bearer ...`):
    /// required on TCP, enforced on a Unix socket too when given.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// The host's certificate chain (PEM) for TLS on a `tcp:` listener and
    /// its lanes; with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A CA (PEM) whose certificates clients must present: mutual TLS.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve a `tcp:` listener without TLS: the bearer secret and every
    /// prompt cross the network in the clear. For a private link only.
    #[arg(long, conflicts_with = "tls_cert")]
    allow_plaintext_tcp: bool,
    /// Shut down gracefully when stdin reaches end of file: a supervising
    /// parent holds the pipe, so the host never outlives it.
    #[arg(long)]
    exit_with_parent: bool,
    /// Bytes per second the background scrub re-hashes resident weights
    /// (all models together; 0 turns it off). The default costs about 4% of
    /// one core and re-checks a 1 GiB model every 16 s.
    #[arg(long, default_value_t = DEFAULT_SCRUB_BYTES_PER_S)]
    scrub_bytes_per_s: u64,
    /// Bytes per second the scrub keeps up when no CPU is idle. It hashes
    /// at idle priority (SCHED_IDLE), so it never takes a partition's core
    /// while another core is idle; once a pass falls a second behind this
    /// floor, a normal-priority thread hashes until it is back on it. At
    /// most `--scrub-bytes-per-s`; 0: idle time only (changed weights may
    /// then go unnoticed while the host is saturated). Default: an eighth of
    /// `--scrub-bytes-per-s` (8 MiB/s: a 1 GiB model re-checked every ~2
    /// minutes with every core busy).
    #[arg(long)]
    scrub_min_bytes_per_s: Option<u64>,
    /// Answer the test-only RPCs (corrupting resident weights). Tests only.
    #[arg(long, hide = true)]
    enable_test_hooks: bool,
}

/// 32 sequences: on the 2-core dev box decode throughput still grows from
/// 16 to 32 (tests/bench/batching), and 32 decode rows plus a 256-token
/// prefill chunk keep one step's scratch a few MiB for a ~110M model.
const DEFAULT_MAX_BATCH: usize = 32;

fn parse_kv_memory(text: &str) -> Result<u64, String> {
    bulkhead_partition::parse_bytes(text).map_err(|e| e.to_string())
}

/// 64 MiB/s: see `--scrub-bytes-per-s`.
const DEFAULT_SCRUB_BYTES_PER_S: u64 = 64 << 20;

/// The scrub's rates; a floor above the rate is an error naming both.
fn scrub_config(bytes_per_s: u64, min_bytes_per_s: Option<u64>) -> anyhow::Result<ScrubConfig> {
    let min_bytes_per_s = min_bytes_per_s.unwrap_or(bytes_per_s / 8);
    if min_bytes_per_s > bytes_per_s {
        anyhow::bail!(
            "--scrub-min-bytes-per-s {min_bytes_per_s} is above --scrub-bytes-per-s {bytes_per_s}: \
             the floor kept at normal priority cannot exceed the scrub's rate"
        );
    }
    Ok(ScrubConfig {
        bytes_per_s,
        min_bytes_per_s,
    })
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let kv_memory_bytes = a
        .kv_memory
        .unwrap_or_else(bulkhead_partition::default_kv_memory_bytes);
    let scrub = scrub_config(a.scrub_bytes_per_s, a.scrub_min_bytes_per_s)?;
    let compute = choose_backend(
        a.backend,
        Ordinals {
            hip: a.hip_device,
            cuda: a.cuda_device,
        },
        kv_memory_bytes,
    )?;
    let auth_secret = a
        .auth_token_file
        .as_deref()
        .map(AuthSecret::from_file)
        .transpose()?;
    let read = |path: &PathBuf, what: &str| {
        std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls {
            cert_pem: read(cert, "--tls-cert")?,
            key_pem: read(key, "--tls-key")?,
            client_ca_pem: a
                .tls_client_ca
                .as_ref()
                .map(|ca| read(ca, "--tls-client-ca"))
                .transpose()?,
        }),
        _ => None,
    };
    let config = ServeConfig {
        listen: a.listen,
        models: a.models,
        threads: super::threads(a.threads),
        compute,
        max_batch: a.max_batch,
        kv_memory_bytes,
        queue_capacity: a.queue_capacity,
        auth_secret,
        tls,
        plaintext_tcp: if a.allow_plaintext_tcp {
            PlaintextTcp::Allowed
        } else {
            PlaintextTcp::Refused
        },
        scrub,
        test_hooks: if a.enable_test_hooks {
            TestHooks::Enabled
        } else {
            TestHooks::Disabled
        },
    };
    let server = Server::load(config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal(a.exit_with_parent)?;
        server
            .run(
                |target| {
                    // One line on stdout: tests and supervisors read the real address from it.
                    println!("listening on {target}");
                },
                shutdown,
            )
            .await?;
        tracing::info!("drained; exiting");
        anyhow::Ok(())
    })
}

/// Settles `--backend` before anything is loaded, with one line on
/// stderr naming the backend (and why not HIP, when `auto` fell back).
fn choose_backend(
    choice: BackendChoice,
    ordinals: Ordinals,
    kv_memory_bytes: u64,
) -> anyhow::Result<ComputeBackend> {
    // Not even asked: `--backend cpu` must work where a runtime misbehaves.
    let hip = match choice {
        BackendChoice::Cpu | BackendChoice::Cuda => hip::HipAvailability::NotBuilt,
        _ => hip::probe(),
    };
    let cuda = match choice {
        BackendChoice::Cpu | BackendChoice::Hip => cuda::CudaAvailability::NotBuilt,
        _ => cuda::probe(),
    };
    Ok(
        match plan_backend(choice, ordinals, &hip, &cuda, HIP_ENGINE)? {
            BackendPlan::Cpu { fallback: None } => {
                tracing::info!("backend: cpu");
                ComputeBackend::Cpu
            }
            BackendPlan::Cpu {
                fallback: Some(why),
            } => {
                tracing::info!("backend: cpu ({why})");
                ComputeBackend::Cpu
            }
            BackendPlan::Hip { device } => {
                let label = DeviceLabel::of(&device);
                // `--kv-memory` of the device for the partitions (each one's
                // streams on its CUs, its allocations charged to its budget);
                // the rest is the model reservation the weights are charged to.
                let split = open_hip_partitions(device.ordinal, kv_memory_bytes)
                    .with_context(|| format!("opening {label}"))?;
                tracing::info!(
                    "backend: hip ({label}; {} for partitions, {} for weights)",
                    bulkhead_partition::format_bytes(kv_memory_bytes),
                    bulkhead_partition::format_bytes(split.model_reservation_bytes())
                );
                ComputeBackend::Device(Arc::new(split))
            }
            BackendPlan::Cuda { device } => {
                let label = device.label();
                let (split, isolation) = open_cuda_partitions(device.ordinal, kv_memory_bytes)
                    .with_context(|| format!("opening {label}"))?;
                tracing::info!(
                    "backend: cuda ({label}; {} for partitions, {} for weights; {})",
                    bulkhead_partition::format_bytes(kv_memory_bytes),
                    bulkhead_partition::format_bytes(split.model_reservation_bytes()),
                    isolation.describe()
                );
                ComputeBackend::Device(Arc::new(split))
            }
        },
    )
}

/// Resolves on the first SIGINT or SIGTERM (handlers are installed before we
/// listen), or when stdin closes if `exit_with_parent`.
fn shutdown_signal(exit_with_parent: bool) -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::io::AsyncReadExt;
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let parent_gone = async move {
        if !exit_with_parent {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        // Anything written is ignored; end of file (or an error) means the parent is gone.
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            _ = parent_gone => {}
        }
        tracing::info!("shutting down: no new connections, finishing streams in flight");
    })
}
