use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use bulkhead_gateway::policy::ListenAddr;
use bulkhead_gateway::{ServeOptions, serve};
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The policy folder (gateway.toml, trust.toml, classes/, tenants/).
    #[arg(long, default_value = "policies")]
    policies: PathBuf,
    /// Address to listen on, `HOST:PORT`; overrides `listen` in gateway.toml.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Where the operator API and /metrics listen: `HOST:PORT` or
    /// `unix:PATH`; overrides `[admin] listen` in gateway.toml (default
    /// 127.0.0.1:8081).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<ListenAddr>,
}

/// `[log]` and `[telemetry]` of the policy folder's `gateway.toml`, read
/// before the rest of it, merged with the `OTEL_*` variables. A file that
/// does not parse counts as neither here: loading the policy reports it,
/// with its line and column.
pub fn telemetry_setup(
    a: &ServeArgs,
) -> anyhow::Result<(
    bulkhead_telemetry::LogFormat,
    Option<bulkhead_telemetry::Settings>,
)> {
    #[derive(Default, serde::Deserialize)]
    struct Early {
        telemetry: Option<bulkhead_telemetry::TelemetryFile>,
        log: Option<Log>,
    }
    #[derive(serde::Deserialize)]
    struct Log {
        format: Option<bulkhead_telemetry::LogFormat>,
    }
    let early: Early = std::fs::read_to_string(a.policies.join("gateway.toml"))
        .ok()
        .and_then(|text| toml::from_str(&text).ok())
        .unwrap_or_default();
    let format = early.log.and_then(|l| l.format).unwrap_or_default();
    let settings = bulkhead_telemetry::Settings::resolve(
        &early.telemetry.unwrap_or_default(),
        "bulkhead",
        |name| std::env::var(name).ok(),
    )?;
    Ok((format, settings))
}

pub fn run(a: ServeArgs, telemetry: &bulkhead_telemetry::Telemetry) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        let options = ServeOptions {
            policies: a.policies,
            listen: a.listen,
            admin_listen: a.admin_listen,
            telemetry: telemetry.settings().cloned(),
            log_format: telemetry.log_format(),
            span_counts: telemetry.span_counts(),
        };
        serve(
            options,
            // Two lines on stdout: tests and scripts read the real addresses.
            |bound| {
                println!("listening on http://{}", bound.public);
                match &bound.admin {
                    ListenAddr::Tcp(addr) => println!("admin listening on http://{addr}"),
                    unix => println!("admin listening on {unix}"),
                }
            },
            shutdown,
        )
        .await?;
        tracing::info!("drained; exiting");
        Ok(ExitCode::SUCCESS)
    })
}

/// Resolves on the first SIGINT or SIGTERM.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down: no new connections, finishing streams in flight");
    })
}
