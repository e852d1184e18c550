//! Command-line interface of `bulkhead-gpu-host`.

mod backend;
mod bench;
mod devices;
mod eval;
mod generate;
mod inspect;
mod serve;

use std::path::PathBuf;

use anyhow::Context;
use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::engine::Model;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bulkhead-gpu-host",
    version,
    about = "Bulkhead's GPU host: runs GGUF models"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

impl Args {
    /// How `serve` writes its log lines (the other commands: text).
    pub fn log_format(&self) -> bulkhead_telemetry::LogFormat {
        match &self.command {
            Command::Serve(a) => a.log_format,
            _ => bulkhead_telemetry::LogFormat::Text,
        }
    }

    /// Whether this command may export traces (`serve` only).
    pub fn serves(&self) -> bool {
        matches!(self.command, Command::Serve(_))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text from a prompt or a chat, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Print the logits of every prompt position as JSON.
    Eval(eval::EvalArgs),
    /// Measure prefill and decode speed (warm, as llama.cpp's llama-bench does).
    Bench(bench::BenchArgs),
    /// Print a model's architecture, metadata and tensor table.
    Inspect(inspect::InspectArgs),
    /// Print the token ids of a text as JSON.
    Tokenize(inspect::TokenizeArgs),
    /// List the HIP devices this process can use (exit 1 when there are none).
    Devices(devices::DevicesArgs),
    /// Serve models over gRPC (`bulkhead.gpu_host.v1.GpuHost`) until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Generate(a) => generate::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Tokenize(a) => inspect::tokenize(a),
        Command::Serve(a) => serve::run(a),
        Command::Devices(a) => devices::run(a),
    }
}

/// Loads a model and its tokenizer, with errors that name the file.
fn load(path: &PathBuf) -> anyhow::Result<(Model, Tokenizer)> {
    let model = Model::open(path).with_context(|| format!("loading model {}", path.display()))?;
    let tokenizer = Tokenizer::from_metadata(model.gguf().metadata())
        .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    Ok((model, tokenizer))
}

/// `kind` with `threads` CPU workers (default: all available cores).
fn backend(
    kind: backend::BackendKind,
    threads: Option<usize>,
) -> anyhow::Result<backend::OpenBackend> {
    backend::OpenBackend::open(kind, self::threads(threads))
}

/// `threads`, or all available cores.
fn threads(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}
