//! Closed-loop load generator for `tests/bench/gateway_overhead`: N workers
//! send requests back to back for a fixed time after a warm-up, every latency
//! is kept, and one JSON line per run goes to stdout. `health` (no load)
//! prints a gpu-host's `Health` as JSON for `tests/bench/soak`.

#![forbid(unsafe_code)]

mod driver;
mod grpc;
mod http;
mod stats;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bulkhead-loadgen", about)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Workers, each with one request in flight at a time.
    #[arg(long, global = true, default_value_t = 1)]
    concurrency: usize,
    /// Seconds of load before measuring (connections are open before it starts).
    #[arg(long, global = true, default_value_t = 2.0)]
    warmup_s: f64,
    /// Seconds measured after the warm-up.
    #[arg(long, global = true, default_value_t = 10.0)]
    duration_s: f64,
    /// Name echoed in the JSON line, e.g. `direct`.
    #[arg(long, global = true, default_value = "")]
    label: String,
    /// Async runtime threads (1: a single-threaded runtime).
    #[arg(long, global = true, default_value_t = 1)]
    threads: usize,
    /// Prompt text of every request.
    #[arg(long, global = true, default_value = "Emma was")]
    prompt: String,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// `GpuHost.Generate` with `max_tokens: 1`, read to `Finished`.
    Grpc(grpc::GrpcArgs),
    /// `POST` an OpenAI completion with `max_tokens: 1` over HTTP/1.1 keep-alive.
    Http(http::HttpArgs),
    /// No load: one `GpuHost.Health` call, printed as a JSON line.
    Health(grpc::HealthArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::ensure!(cli.load.concurrency > 0, "--concurrency must be at least 1");
    let runtime = if cli.load.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cli.load.threads)
            .enable_all()
            .build()
    }
    .context("starting the async runtime")?;
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let plan = driver::Plan {
        warmup: Duration::from_secs_f64(cli.load.warmup_s),
        duration: Duration::from_secs_f64(cli.load.duration_s),
    };
    let (mode, samples) = match &cli.mode {
        Mode::Grpc(args) => {
            let workers = grpc::workers(args, &cli.load.prompt, cli.load.concurrency).await?;
            ("grpc", driver::run(workers, &plan).await?)
        }
        Mode::Http(args) => {
            let workers = http::workers(args, &cli.load.prompt, cli.load.concurrency).await?;
            ("http", driver::run(workers, &plan).await?)
        }
        Mode::Health(args) => {
            println!("{}", grpc::health(args).await?);
            return Ok(());
        }
    };
    let summary = stats::Summary::new(samples, plan.duration);
    println!(
        "{}",
        summary.to_json(&cli.load.label, mode, cli.load.concurrency, &plan)
    );
    Ok(())
}
