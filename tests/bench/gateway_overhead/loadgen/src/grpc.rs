//! `grpc` mode: `GpuHost.Generate` straight to a gpu-host.

use std::time::Instant;

use anyhow::Context;
use bulkhead_protocol::v1::{GenerateRequest, HealthRequest};
use bulkhead_protocol::v1::generate_event::Event;
use bulkhead_protocol::v1::generate_request::Prompt;
use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::{Target, connect};
use clap::Args;
use tonic::transport::Channel;

use crate::driver::{Failure, Worker};

#[derive(Debug, Args)]
pub struct GrpcArgs {
    /// The gpu-host: `unix:PATH` or `tcp:HOST:PORT`.
    #[arg(long)]
    target: Target,
    /// Model name the host serves.
    #[arg(long)]
    model: String,
    /// HTTP/2 connections the workers share round-robin (the gateway's
    /// upstream client multiplexes everything over one).
    #[arg(long, default_value_t = 1)]
    channels: usize,
}

/// `concurrency` workers over `args.channels` connections.
pub async fn workers(
    args: &GrpcArgs,
    prompt: &str,
    concurrency: usize,
) -> anyhow::Result<Vec<GrpcWorker>> {
    let mut channels = Vec::new();
    for _ in 0..args.channels.max(1) {
        let channel = connect(&args.target)
            .await
            .with_context(|| format!("connecting to {}", args.target))?;
        channels.push(channel);
    }
    let request = GenerateRequest {
        model: args.model.clone(),
        prompt: Some(Prompt::Text(prompt.to_string())),
        max_tokens: Some(1),
        temperature: Some(0.0),
        tenant: "bench".to_string(),
        ..GenerateRequest::default()
    };
    Ok((0..concurrency)
        .map(|i| GrpcWorker {
            client: GpuHostClient::new(channels[i % channels.len()].clone()),
            request: request.clone(),
        })
        .collect())
}

#[derive(Debug)]
pub struct GrpcWorker {
    client: GpuHostClient<Channel>,
    request: GenerateRequest,
}

impl Worker for GrpcWorker {
    async fn request(&mut self) -> Result<Instant, Failure> {
        let mut stream = self
            .client
            .generate(self.request.clone())
            .await
            .map_err(status_failure)?
            .into_inner();
        let mut finished = None;
        while let Some(event) = stream.message().await.map_err(status_failure)? {
            if let Some(Event::Finished(_)) = event.event {
                // The answer is complete here; the trailers that follow are
                // read (so the stream closes cleanly) but not timed.
                finished.get_or_insert_with(Instant::now);
            }
        }
        finished.ok_or_else(|| Failure {
            kind: "no_finished".to_string(),
            detail: "the stream ended without a Finished event".to_string(),
        })
    }
}

fn status_failure(status: tonic::Status) -> Failure {
    Failure {
        kind: format!("grpc:{:?}", status.code()),
        detail: status.message().to_string(),
    }
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The gpu-host: `unix:PATH` (a `tcp:` host needs a bearer secret, which
    /// this tool does not send).
    #[arg(long)]
    target: Target,
}

/// One `GpuHost.Health` call, as a JSON line (the soak bench samples it).
pub async fn health(args: &HealthArgs) -> anyhow::Result<String> {
    let channel = connect(&args.target)
        .await
        .with_context(|| format!("connecting to {}", args.target))?;
    let health = GpuHostClient::new(channel)
        .health(HealthRequest {})
        .await
        .context("GpuHost.Health")?
        .into_inner();
    Ok(serde_json::json!({
        "serving": health.serving,
        "models": health.models,
        "queued": health.queued,
        "queue_capacity": health.queue_capacity,
        "workers": health.workers,
        "running": health.running,
        "max_running": health.max_running,
        "preemptions": health.preemptions,
        "kv_refusals": health.kv_refusals,
        "device_errors": health.device_errors,
        "kv_bytes": health.kv_bytes,
        "kv_bytes_used": health.kv_bytes_used,
    })
    .to_string())
}
