//! What the logits tests share: the recorded references
//! (`tests/fixtures/reference/<family>.json`, typed; or any reference file
//! read loosely as JSON), running a fixture model, and the error measures.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use bulkhead_gpu_host::backend::{Backend, CpuBackend};
use bulkhead_gpu_host::engine::{Logits, Model, argmax};
use serde::Deserialize;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// One family's references, as `tests/reference/` recorded them.
#[derive(Deserialize)]
pub struct Reference {
    pub prompt_tokens: Vec<u32>,
    pub transformers_f32_logits: Vec<Vec<f32>>,
    pub greedy: Greedy,
    /// llama.cpp's logits on each file of the family, by type.
    pub llamacpp: BTreeMap<String, Vec<Vec<f32>>>,
}

#[derive(Deserialize)]
pub struct Greedy {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
}

pub fn reference(family: &str) -> Reference {
    let path = fixtures().join(format!("reference/{family}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `tests/fixtures/reference/NAME`, parsed loosely, for references whose
/// shape differs from [`Reference`] (the IQ4 and mixture-of-experts ones).
pub fn reference_json(name: &str) -> serde_json::Value {
    let path = fixtures().join("reference").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of rows of floats.
pub fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("float") as f32)
                .collect()
        })
        .collect()
}

/// A JSON array of token ids.
pub fn tokens(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("token id") as u32)
        .collect()
}

pub fn model(family: &str, ty: &str) -> Model {
    Model::open(fixtures().join(format!("models/{family}-{ty}.gguf"))).unwrap()
}

/// The logits of every prompt position, one forward call.
pub fn eval(model: &Model, backend: &dyn Backend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(tokens.len());
    let logits = model
        .forward(backend, &mut cache, tokens, Logits::All)
        .unwrap();
    logits
        .chunks_exact(model.config().vocab_size)
        .map(|r| r.to_vec())
        .collect()
}

/// Greedy decoding of `n` tokens after `prompt`, a token per forward call.
pub fn greedy(model: &Model, backend: &dyn Backend, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache(prompt.len() + n);
    let mut logits = model
        .forward(backend, &mut cache, prompt, Logits::Last)
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        logits = model
            .forward(backend, &mut cache, &[next], Logits::Last)
            .unwrap();
    }
    out
}

/// Errors of `ours` against `reference`: (max |diff| / max |reference|, rms diff / rms reference).
pub fn error(ours: &[Vec<f32>], reference: &[Vec<f32>]) -> (f64, f64) {
    assert_eq!(ours.len(), reference.len());
    let (mut max_diff, mut max_ref, mut sq_diff, mut sq_ref) = (0f64, 0f64, 0f64, 0f64);
    for (a, b) in ours.iter().zip(reference) {
        assert_eq!(a.len(), b.len());
        for (&x, &y) in a.iter().zip(b) {
            let d = (x as f64 - y as f64).abs();
            max_diff = max_diff.max(d);
            max_ref = max_ref.max((y as f64).abs());
            sq_diff += d * d;
            sq_ref += (y as f64) * (y as f64);
        }
    }
    (max_diff / max_ref, (sq_diff / sq_ref).sqrt())
}

pub fn backend() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}
