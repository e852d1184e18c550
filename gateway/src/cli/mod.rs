//! Command-line interface of `bulkhead`.

mod audit;
mod http;
mod model;
mod model_api;
mod plugin;
mod policy;
mod serve;
mod state;
mod token;
mod usage;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bulkhead",
    version,
    about = "Bulkhead: a multi-tenant, OpenAI-compatible LLM gateway"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with policy folders.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Sign and verify model folders (OpenSSF model-signing format); register
    /// them with a running gateway
    Model(model::ModelArgs),
    /// Check and run plugin components locally (for plugin authors)
    Plugin(plugin::PluginArgs),
    /// Development tokens and keys (real issuers mint their own tokens)
    Token(token::TokenArgs),
    /// Check the audit log offline, or proofs from a running gateway
    Audit(audit::AuditArgs),
    /// Move state into the database replicas share (today: the audit log
    /// only; plugins and registrations are not in PostgreSQL yet)
    State(state::StateArgs),
    /// Export hourly usage for billing from a running gateway
    Usage(usage::UsageArgs),
    /// Serve the OpenAI-compatible API until SIGINT/SIGTERM (starting a local
    /// gpu-host unless gateway.toml names an upstream).
    Serve(serve::ServeArgs),
}

/// The log format and trace export of this command: `serve` reads them
/// from its `gateway.toml` and the `OTEL_*` variables; the others log text
/// and export nothing.
pub fn telemetry_setup(
    args: &Args,
) -> anyhow::Result<(
    bulkhead_telemetry::LogFormat,
    Option<bulkhead_telemetry::Settings>,
)> {
    match &args.command {
        Command::Serve(a) => serve::telemetry_setup(a),
        _ => Ok((bulkhead_telemetry::LogFormat::Text, None)),
    }
}

pub fn run(args: Args, telemetry: &bulkhead_telemetry::Telemetry) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Policy { command } => policy::run(command),
        Command::Model(args) => model::run(args),
        Command::Plugin(args) => plugin::run(args),
        Command::Token(args) => token::run(args),
        Command::Serve(a) => serve::run(a, telemetry),
        Command::Audit(args) => audit::run(args),
        Command::State(args) => state::run(args),
        Command::Usage(args) => usage::run(args),
    }
}

/// Creates `path` (never replacing a file) with `mode`, written and synced:
/// key files the `keygen` commands write.
fn write_new(path: &std::path::Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    use anyhow::Context as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}
