//! Routing by hand, and the experts an MoE pass reads: only the routed ones.

use bulkhead_kernels::Activation;
use std::sync::Mutex;

use bulkhead_kernels::{AttentionShape, PagedSeq, PagedShape, QuantMatrix};

use super::*;
use crate::backend::{CpuBackend, RopeParams};
use crate::engine::{Logits, Model};

#[test]
fn route_takes_the_top_k_and_renormalizes_their_softmax() {
    let logits = [0.5f32, 2.0, -1.0, 1.0];
    let r = route(&logits, 2);
    assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [1, 3]);
    // softmax over the two chosen logits alone: e^2 / (e^2 + e^1).
    let w1 = (2.0f64.exp() / (2.0f64.exp() + 1.0f64.exp())) as f32;
    assert!((r[0].1 - w1).abs() < 1e-6, "{r:?}");
    assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-6, "{r:?}");
    // k = 1: all the weight on the best; k = all: the plain softmax.
    assert_eq!(route(&logits, 1), vec![(1, 1.0)]);
    let all = route(&logits, 4);
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    for (e, w) in all {
        let want = (f64::from(logits[e]).exp() / z) as f32;
        assert!((w - want).abs() < 1e-6, "expert {e}: {w} vs {want}");
    }
}

#[test]
fn route_breaks_ties_toward_the_lower_expert() {
    let r = route(&[1.0, 3.0, 3.0, 3.0], 2);
    assert_eq!(r, vec![(1, 0.5), (2, 0.5)]);
}

/// A CPU backend that records the weight bytes every matmul reads.
#[derive(Debug)]
struct Recording {
    cpu: CpuBackend,
    read: Mutex<Vec<(usize, usize)>>,
}

impl Recording {
    fn note(&self, w: &QuantMatrix<'_>) {
        let start = w.data.as_ptr() as usize;
        self.read
            .lock()
            .unwrap()
            .push((start, start + w.data.len()));
    }
}

impl Backend for Recording {
    fn name(&self) -> String {
        "recording".into()
    }
    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n: usize, out: &mut [f32]) -> OpResult {
        self.note(w);
        self.cpu.matmul(w, x, n, out)
    }
    fn matmul_per_row(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> OpResult {
        self.note(w);
        self.cpu.matmul_per_row(w, x, n, out)
    }
    fn embedding(&self, t: &QuantMatrix<'_>, token: u32, out: &mut [f32]) -> OpResult {
        self.cpu.embedding(t, token, out)
    }
    fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) -> OpResult {
        self.cpu.rms_norm(x, w, eps, out)
    }
    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, p: &RopeParams) -> OpResult {
        self.cpu.rope(x, heads, pos, p)
    }
    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> OpResult {
        self.cpu.attention(q, k, v, shape, out)
    }
    fn attention_paged(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) -> OpResult {
        self.cpu.attention_paged(q, k, v, seqs, shape, out)
    }
    fn gated(&self, act: Activation, gate: &mut [f32], up: &[f32]) -> OpResult {
        self.cpu.gated(act, gate, up)
    }
    fn scale(&self, x: &mut [f32], c: f32) -> OpResult {
        self.cpu.scale(x, c)
    }
    fn add(&self, a: &mut [f32], b: &[f32]) -> OpResult {
        self.cpu.add(a, b)
    }
}

fn mixtral() -> Model {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models/mixtral-q8_0.gguf");
    Model::open(path).expect("fixture model opens")
}

/// One decode token goes to 2 of 4 experts per layer: the pass reads
/// those experts' bytes and no byte of the other two, and reads each
/// routed expert's matrices whole.
#[test]
fn a_token_reads_only_the_experts_it_is_routed_to() {
    let model = mixtral();
    let backend = Recording {
        cpu: CpuBackend::new(1).unwrap(),
        read: Mutex::new(Vec::new()),
    };
    let mut cache = model.new_cache(8);
    model
        .forward(&backend, &mut cache, &[1, 300], Logits::Last)
        .unwrap();
    backend.read.lock().unwrap().clear();
    model
        .forward(&backend, &mut cache, &[42], Logits::Last)
        .unwrap();
    let read = backend.read.lock().unwrap().clone();
    let gguf = model.gguf();
    let base = gguf.mapped_bytes().as_ptr() as usize;
    for layer in 0..model.config().layers {
        for kind in ["gate", "up", "down"] {
            let t = gguf
                .tensor(&format!("blk.{layer}.ffn_{kind}_exps.weight"))
                .unwrap();
            let range = t.file_range();
            let per = range.len() / 4;
            let mut touched = Vec::new();
            for e in 0..4 {
                let (lo, hi) = (
                    base + range.start + e * per,
                    base + range.start + (e + 1) * per,
                );
                let hits: Vec<_> = read.iter().filter(|&&(s, t)| s < hi && t > lo).collect();
                if !hits.is_empty() {
                    assert_eq!(hits, [&(lo, hi)], "layer {layer} {kind} expert {e}: whole");
                    touched.push(e);
                }
            }
            assert_eq!(
                touched.len(),
                2,
                "layer {layer} {kind}: experts read {touched:?}, expected the 2 routed"
            );
        }
    }
}
