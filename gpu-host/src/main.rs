//! `bulkhead-gpu-host`: runs GGUF models (the engine's tools and the gRPC `serve`).

mod cli;

use clap::Parser;

/// See gpu-host/Cargo.toml for why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Args::parse();
    let telemetry = match telemetry(&args) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = cli::run(args);
    // Exports the spans still queued before the process ends.
    drop(telemetry);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs, and for `serve` the trace export the `OTEL_*` variables configure
/// (the local child gets them from its gateway).
fn telemetry(args: &cli::Args) -> anyhow::Result<bulkhead_telemetry::Telemetry> {
    let settings = if args.serves() {
        bulkhead_telemetry::Settings::resolve(
            &bulkhead_telemetry::TelemetryFile::default(),
            "bulkhead-gpu-host",
            |name| std::env::var(name).ok(),
        )?
    } else {
        None
    };
    // Traces only: the gateway exports the GenAI metrics.
    Ok(bulkhead_telemetry::init(
        args.log_format(),
        "info",
        settings,
        false,
    )?)
}
