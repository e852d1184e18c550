use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use bulkhead_gpu_host::engine::Logits;
use clap::Args;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (tokenized with the model's special tokens, e.g. BOS).
    #[arg(long)]
    prompt: String,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t)]
    backend: super::backend::BackendKind,
    /// Print JSON (the only format; accepted for symmetry with `generate`).
    #[arg(long)]
    json: bool,
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    let (model, tokenizer) = super::load(&a.model)?;
    let backend = super::backend(a.backend, a.threads)?;
    backend.load(&model)?;
    let tokens = tokenizer.encode(&a.prompt, true);
    if tokens.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    let mut cache = model.new_cache(tokens.len());
    let logits = model.forward(&*backend.backend, &mut cache, &tokens, Logits::All)?;
    let vocab = model.config().vocab_size;
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    let json = serde_json::json!({ "tokens": tokens, "logits": rows });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json}")?;
    Ok(())
}
