use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use std::ops::ControlFlow;

use bulkhead_gpu_host::engine::{GenerateRequest, Pass, SamplingParams, generate_observed};
use bulkhead_gpu_host::{ChatMessage, ChatTemplate};
use clap::Args;
use serde::Deserialize;

/// Largest chat file accepted.
const MAX_CHAT_FILE_BYTES: u64 = 16 << 20;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Raw prompt text (special tokens such as BOS are added as the model asks).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// JSON chat: `[{"role": "user", "content": "..."}]` or `{"messages": [...]}`,
    /// rendered with the model's chat template.
    #[arg(long)]
    chat: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Drop tokens less likely than min_p times the best one.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalty for recently generated tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed; the same seed gives the same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t)]
    backend: super::backend::BackendKind,
    /// Print one JSON object with tokens, text and timings at the end instead
    /// of streaming (on a device, with what it moved: `device`).
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChatFile {
    Messages(Vec<ChatMessage>),
    Object { messages: Vec<ChatMessage> },
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let (model, tokenizer) = super::load(&a.model)?;
    let backend = super::backend(a.backend, a.threads)?;
    let mut phases = super::backend::Phases::new(&backend);
    backend.load(&model)?;
    phases.loaded();
    let prompt_tokens = match (&a.prompt, &a.chat) {
        (Some(text), _) => tokenizer.encode(text, true),
        (None, Some(path)) => {
            let messages = read_chat(path)?;
            let template = ChatTemplate::from_metadata(model.gguf().metadata(), &tokenizer)
                .context("loading the chat template")?;
            // As `serve` does: a control token spelled in a message is text.
            let rendered = template
                .render_marked(&messages, true)
                .context("rendering the chat")?;
            tokenizer.encode_marked(&rendered, false)
        }
        (None, None) => bail!("give --prompt or --chat"),
    };
    let req = GenerateRequest {
        prompt_tokens,
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
            seed: a.seed,
            ..SamplingParams::default()
        },
        stop: a.stop.clone(),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stream = !a.json;
    let mut on_piece = |piece: bulkhead_gpu_host::engine::Piece<'_>| {
        if stream && !piece.text.is_empty() {
            // A closed stdout (e.g. piped into `head`) just ends the output.
            let _ = out
                .write_all(piece.text.as_bytes())
                .and_then(|_| out.flush());
        }
        ControlFlow::Continue(())
    };
    let mut on_pass = |pass: Pass| match pass {
        Pass::Prefill { tokens } => phases.prefilled(tokens),
        Pass::Decode => phases.decoded(),
    };
    let generation = generate_observed(
        &model,
        &tokenizer,
        &*backend.backend,
        &req,
        &mut on_piece,
        &mut on_pass,
    )?;
    if a.json {
        let prompt_ms = generation.prompt_time.as_secs_f64() * 1e3;
        let decode_ms = generation.decode_time.as_secs_f64() * 1e3;
        let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 / ms * 1e3 } else { 0.0 };
        let mut json = serde_json::json!({
            "prompt_tokens": generation.prompt_tokens,
            "tokens": generation.tokens,
            "text": generation.text,
            "finish_reason": generation.finish_reason.as_str(),
            "timings": {
                "prompt_ms": prompt_ms,
                "decode_ms": decode_ms,
                "prompt_tok_s": per_s(generation.prompt_tokens.len(), prompt_ms),
                "decode_tok_s": per_s(generation.tokens.len(), decode_ms),
            },
        });
        if backend.transfers().is_some() {
            json["device"] = phases.to_json();
            // What one row of logits weighs, for reading the step counts.
            json["device"]["vocab_size"] = model.config().vocab_size.into();
        }
        writeln!(out, "{json}")?;
    } else {
        writeln!(out)?;
    }
    Ok(())
}

fn read_chat(path: &PathBuf) -> anyhow::Result<Vec<ChatMessage>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    if len > MAX_CHAT_FILE_BYTES {
        bail!(
            "{} is {len} bytes; chat files are limited to {MAX_CHAT_FILE_BYTES}",
            path.display()
        );
    }
    let chat: ChatFile =
        serde_json::from_reader(std::io::BufReader::new(file)).with_context(|| {
            format!(
                "{}: expected [{{\"role\": ..., \"content\": ...}}] or {{\"messages\": [...]}}",
                path.display()
            )
        })?;
    let messages = match chat {
        ChatFile::Messages(m) | ChatFile::Object { messages: m } => m,
    };
    if messages.is_empty() {
        bail!("{}: the chat has no messages", path.display());
    }
    Ok(messages)
}
