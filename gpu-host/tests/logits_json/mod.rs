//! What the IQ4 and mixture-of-experts reference tests share (JSON read
//! loosely; `logits/` is the typed form the other reference tests use): the fixture
//! folder, a full-prompt evaluation and the error measure of
//! `reference_logits.rs` (max |diff| / max |reference|, rms diff / rms
//! reference).

// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use bulkhead_gpu_host::backend::Backend;
use bulkhead_gpu_host::engine::{Logits, Model};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// `tests/fixtures/reference/NAME`, parsed.
pub fn reference_json(name: &str) -> serde_json::Value {
    let path = fixtures().join("reference").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `tests/fixtures/models/NAME`, opened.
pub fn model(name: &str) -> Model {
    Model::open(fixtures().join("models").join(name)).unwrap()
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

/// The logits of every position of `tokens`, run as one prompt.
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

/// Errors of `ours` against `reference`: (max |diff| / max |reference|,
/// rms diff / rms reference).
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
