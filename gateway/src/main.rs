//! `bulkhead`: the gateway and its operator tools.

mod cli;

use clap::Parser;

/// See gateway/Cargo.toml for why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Args::parse();
    // Logs go to stderr; `RUST_LOG` overrides the default `info`. `serve`
    // reads `[log]` and `[telemetry]` first, so that every line of its
    // start is in the configured format.
    let setup = cli::telemetry_setup(&args).and_then(|(format, settings)| {
        Ok(bulkhead_telemetry::init(format, "info", settings, true)?)
    });
    let telemetry = match setup {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = cli::run(args, &telemetry);
    // Exports the spans still queued before the process ends.
    drop(telemetry);
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
