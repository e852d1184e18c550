//! `bench`: prefill and decode speed of one model, measured the way
//! llama.cpp's `llama-bench` measures them, so the two compare directly:
//! the model loaded and a warm-up pass run before anything is timed,
//! synthetic prompt tokens, greedy decode after a prompt's worth of
//! context, each repetition on a fresh cache.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use bulkhead_gpu_host::engine::{Logits, Model, argmax};
use clap::Args;

/// Largest `--prompt-tokens` or `--gen-tokens`: the cache holds both.
const MAX_TOKENS: usize = 1 << 16;

/// Largest `--repetitions`.
const MAX_REPETITIONS: usize = 1000;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt tokens of each prefill (`llama-bench -p`).
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens decoded after the prompt (`llama-bench -n` at depth `-d` equal
    /// to the prompt); 0 measures prefill only.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Timed repetitions, after one untimed warm-up.
    #[arg(long, default_value_t = 5)]
    repetitions: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t)]
    backend: super::backend::BackendKind,
    /// Print one JSON object instead of a line of text.
    #[arg(long)]
    json: bool,
}

/// One repetition: prefill and decode time.
struct Sample {
    prefill_s: f64,
    decode_s: f64,
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if a.prompt_tokens == 0 || a.prompt_tokens > MAX_TOKENS || a.gen_tokens > MAX_TOKENS {
        bail!("--prompt-tokens must be 1..={MAX_TOKENS} and --gen-tokens at most {MAX_TOKENS}");
    }
    if a.repetitions == 0 || a.repetitions > MAX_REPETITIONS {
        bail!("--repetitions must be 1..={MAX_REPETITIONS}");
    }
    let (model, _) = super::load(&a.model)?;
    let context = model.config().context_length;
    if a.prompt_tokens + a.gen_tokens > context {
        bail!(
            "{} prompt tokens plus {} generated exceed the model's context of {context}",
            a.prompt_tokens,
            a.gen_tokens
        );
    }
    let backend = super::backend(a.backend, a.threads)?;
    backend.load(&model)?;
    let prompt = synthetic_prompt(a.prompt_tokens, model.config().vocab_size);
    // Warm-up: first-touch allocations, the threads' start, caches.
    repetition(&model, &*backend.backend, &prompt, a.gen_tokens.min(1))?;
    let mut samples = Vec::with_capacity(a.repetitions);
    for _ in 0..a.repetitions {
        samples.push(repetition(
            &model,
            &*backend.backend,
            &prompt,
            a.gen_tokens,
        )?);
    }
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let prefill: Vec<f64> = samples
        .iter()
        .map(|s| rate(a.prompt_tokens, s.prefill_s))
        .collect();
    let decode: Vec<f64> = samples
        .iter()
        .map(|s| rate(a.gen_tokens, s.decode_s))
        .collect();
    let (pp, tg) = (median(&prefill), median(&decode));
    if a.json {
        let json = serde_json::json!({
            "model": a.model,
            "backend": backend.describe(),
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "repetitions": a.repetitions,
            "prefill_tok_s": pp,
            "decode_tok_s": tg,
            "prefill_samples_tok_s": prefill,
            "decode_samples_tok_s": decode,
        });
        println!("{json}");
    } else {
        println!(
            "{}: pp{} {pp:.1} t/s, tg{} {tg:.1} t/s (median of {}, {})",
            a.model.display(),
            a.prompt_tokens,
            a.gen_tokens,
            a.repetitions,
            backend.describe()
        );
    }
    Ok(())
}

/// Prompt token ids spread over the vocabulary, the same every run (what
/// they are does not change the work).
fn synthetic_prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// A prefill of `prompt` on a fresh cache, then `gen` greedy decode steps.
fn repetition(
    model: &Model,
    backend: &dyn bulkhead_gpu_host::backend::Backend,
    prompt: &[u32],
    gen_tokens: usize,
) -> anyhow::Result<Sample> {
    let mut cache = model.new_cache(prompt.len() + gen_tokens);
    let start = Instant::now();
    let mut logits = model
        .forward(backend, &mut cache, prompt, Logits::Last)
        .context("prefill")?;
    let prefill_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 0..gen_tokens {
        let next = argmax(&logits);
        logits = model
            .forward(backend, &mut cache, &[next], Logits::Last)
            .context("decode")?;
    }
    Ok(Sample {
        prefill_s,
        decode_s: start.elapsed().as_secs_f64(),
    })
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}
