use std::path::PathBuf;

use anyhow::Context;
use bulkhead_gpu_host::server::{AuthSecret, ModelSpec, ServeConfig, Server, TestHooks};
use bulkhead_gpu_host::verify::ScrubConfig;
use bulkhead_protocol::Target;
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: `unix:PATH` (socket mode 0600) or `tcp:HOST:PORT`
    /// (requires --auth-token-file).
    #[arg(long, value_name = "unix:PATH|tcp:ADDR")]
    listen: Target,
    /// A model to serve under NAME (repeatable). It is hashed while loading
    /// and scrubbed while resident; registered models (checked against a
    /// signed digest) arrive later through the `LoadModel` RPC.
    #[arg(long = "model", value_name = "NAME=PATH")]
    models: Vec<ModelSpec>,
    /// Cores of the CPU device (default: all): the compute units tenants'
    /// partitions split, each partition's workers pinned to its own.
    #[arg(long)]
    threads: Option<usize>,
    /// Sequences one model's continuous batch holds at once: each decode
    /// step runs them as one forward pass (`--workers` is the old name).
    #[arg(long, alias = "workers", default_value_t = DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// KV-cache memory of the host, e.g. `2GiB` (units B, KiB, MiB, GiB, kB,
    /// MB, GB): the memory tenants' partitions split (each partition's
    /// share is a pool of 16-token blocks per model it serves). Default: a
    /// quarter of host memory, at most 4 GiB. Pages are only touched as
    /// blocks are first used.
    #[arg(long, value_parser = parse_kv_memory)]
    kv_memory: Option<u64>,
    /// Requests that may wait to join a batch; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64)]
    queue_capacity: usize,
    /// File holding the bearer secret clients must send (`authorization: Bearer ...`):
    /// required on TCP, enforced on a Unix socket too when given.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Shut down gracefully when stdin reaches end of file: a supervising
    /// parent holds the pipe, so the host never outlives it.
    #[arg(long)]
    exit_with_parent: bool,
    /// Bytes per second the background scrub re-hashes resident weights
    /// (all models together; 0 turns it off). The default costs about 4% of
    /// one core and re-checks a 1 GiB model every 16 s.
    #[arg(long, default_value_t = DEFAULT_SCRUB_BYTES_PER_S)]
    scrub_bytes_per_s: u64,
    /// Answer the test-only RPCs (corrupting resident weights). Tests only.
    #[arg(long, hide = true)]
    enable_test_hooks: bool,
}

/// 32 sequences: on the 2-core dev box decode throughput still grows from
/// 16 to 32 (tests/bench/batching), and 32 decode rows plus a 256-token
/// prefill chunk keep one step's scratch a few MiB for a ~110M model.
const DEFAULT_MAX_BATCH: usize = 32;

/// Cap of the default `--kv-memory`.
const DEFAULT_KV_MEMORY_CAP_BYTES: u64 = 4 << 30;

fn parse_kv_memory(text: &str) -> Result<u64, String> {
    bulkhead_partition::parse_bytes(text).map_err(|e| e.to_string())
}

/// A quarter of host memory, at most 4 GiB (1 GiB when memory is unknown).
fn default_kv_memory() -> u64 {
    bulkhead_partition::host_memory_bytes()
        .map_or(1 << 30, |m| m / 4)
        .min(DEFAULT_KV_MEMORY_CAP_BYTES)
}

/// 64 MiB/s: see `--scrub-bytes-per-s`.
const DEFAULT_SCRUB_BYTES_PER_S: u64 = 64 << 20;

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let auth_secret = a
        .auth_token_file
        .as_deref()
        .map(AuthSecret::from_file)
        .transpose()?;
    let config = ServeConfig {
        listen: a.listen,
        models: a.models,
        threads: super::threads(a.threads),
        max_batch: a.max_batch,
        kv_memory_bytes: a.kv_memory.unwrap_or_else(default_kv_memory),
        queue_capacity: a.queue_capacity,
        auth_secret,
        scrub: ScrubConfig {
            bytes_per_s: a.scrub_bytes_per_s,
        },
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
        eprintln!("drained; exiting");
        anyhow::Ok(())
    })
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
        eprintln!("shutting down: no new connections, finishing streams in flight");
    })
}
