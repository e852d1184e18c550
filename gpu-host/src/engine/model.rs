//! A loaded model and its forward pass (llama and qwen2 share one code path).

use std::path::Path;

use bulkhead_kernels::{AttentionShape, QuantMatrix};

use super::config::{ConfigError, ModelConfig};
use super::weights::Weights;
use crate::backend::{Backend, DeviceError, OpResult, RopeParams, WeightRef};
use crate::gguf::Gguf;

/// Prompt tokens processed per forward call during prefill; bounds the scratch
/// memory (n × ffn_dim floats) while keeping matmuls wide enough to reuse weights.
pub const PREFILL_CHUNK: usize = 256;

/// A model mapped from a GGUF file with its validated hyperparameters.
#[derive(Debug)]
pub struct Model {
    gguf: Gguf,
    config: ModelConfig,
    weights: Weights,
}

/// Which logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only for the last token (generation).
    Last,
    /// For every token of the call (evaluation).
    All,
}

impl Model {
    /// Maps and validates the model at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, ConfigError> {
        let gguf = Gguf::open(path)?;
        Self::from_gguf(gguf)
    }

    /// Validates an opened GGUF file as a runnable model.
    pub fn from_gguf(gguf: Gguf) -> Result<Model, ConfigError> {
        let config = ModelConfig::from_gguf(&gguf)?;
        let weights = Weights::load(&gguf, &config)?;
        Ok(Model {
            gguf,
            config,
            weights,
        })
    }

    /// Hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The underlying file.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// A fresh KV cache able to hold `capacity` positions (at most the context length).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let capacity = capacity.min(self.config.context_length);
        let kv = self.config.kv_dim();
        KvCache {
            k: (0..self.config.layers)
                .map(|_| vec![0.0; capacity * kv])
                .collect(),
            v: (0..self.config.layers)
                .map(|_| vec![0.0; capacity * kv])
                .collect(),
            capacity,
            len: 0,
            kv_dim: kv,
        }
    }

    /// Makes every weight the forward pass reads resident on `backend`'s
    /// device (a no-op on the CPU): after this, passes move activations,
    /// never weights.
    pub fn preload(&self, backend: &dyn Backend) -> Result<(), DeviceError> {
        let g = &self.gguf;
        let w = &self.weights;
        let matrix = |m: &super::weights::MatrixRef| backend.preload(WeightRef::Matrix(m.view(g)));
        matrix(&w.token_embd)?;
        for l in &w.layers {
            backend.preload(WeightRef::Vector(&l.attn_norm))?;
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                matrix(m)?;
            }
            backend.preload(WeightRef::Vector(&l.ffn_norm))?;
        }
        backend.preload(WeightRef::Vector(&w.output_norm))?;
        matrix(&w.output)
    }

    /// Runs `tokens` through the model after what `cache` already holds,
    /// appending their keys and values, and returns logits (vocab floats per row).
    pub fn forward(
        &self,
        backend: &dyn Backend,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ForwardError::TokenOutOfRange { token: bad, vocab });
        }
        if cache.len + tokens.len() > cache.capacity {
            return Err(ForwardError::ContextFull {
                needed: cache.len + tokens.len(),
                capacity: cache.capacity,
            });
        }
        let mut out = Vec::new();
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let rows = self.forward_chunk(backend, cache, chunk, logits)?;
            out.extend_from_slice(&rows);
        }
        if logits == Logits::Last {
            let start = out.len().saturating_sub(vocab);
            out.drain(..start);
        }
        Ok(out)
    }

    fn forward_chunk(
        &self,
        backend: &dyn Backend,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, DeviceError> {
        let n = tokens.len();
        let start = cache.len;
        let segment = [Segment {
            rows: n,
            start_pos: start,
        }];
        let wanted: Vec<usize> = match logits {
            Logits::All => (0..n).collect(),
            Logits::Last => vec![n - 1],
        };
        let mut store = ContiguousStore { cache, start };
        // A failed pass leaves the cache's length as it was: the rows it
        // wrote past it are overwritten by the next call.
        let out = self.run_layers(backend, tokens, &segment, &mut store, &wanted)?;
        cache.len += n;
        Ok(out)
    }

    /// The forward pass proper, shared by the contiguous cache (one
    /// segment) and the paged pool (one segment per sequence of a batch):
    /// `tokens` are the rows of `segments` in order; returns the logits of
    /// the rows in `wanted`, in that order, or the first device error (the
    /// pass stops there).
    ///
    /// Matmuls take every row at once (the weights are read once per call,
    /// whatever the number of sequences). Everything else is per row or per
    /// segment, so a sequence's rows are computed bit for bit the same
    /// whatever else shares the call: the AVX2 element-wise kernels finish a
    /// slice's tail with scalar code, so running them over a whole batch
    /// would shift which elements take that path.
    pub(super) fn run_layers(
        &self,
        backend: &dyn Backend,
        tokens: &[u32],
        segments: &[Segment],
        kv: &mut dyn KvStore,
        wanted: &[usize],
    ) -> Result<Vec<f32>, DeviceError> {
        let c = &self.config;
        let g = &self.gguf;
        let n = tokens.len();
        let d = c.embedding_dim;
        let q_dim = c.heads * c.head_dim;
        let kv_dim = c.kv_dim();
        let rope = RopeParams {
            head_dim: c.head_dim,
            rot_dim: c.rope_dim,
            freq_base: c.rope_base,
            freq_scale: c.rope_scale,
            style: c.rope_style,
        };
        // Position of every row.
        let positions: Vec<usize> = segments
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.rows)
            .collect();
        debug_assert_eq!(positions.len(), n);

        let mut x = vec![0.0f32; n * d];
        let embd = self.weights.token_embd.view(g);
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            backend.embedding(&embd, t, row)?;
        }
        let mut xn = vec![0.0f32; n * d];
        let mut q = vec![0.0f32; n * q_dim];
        let mut k = vec![0.0f32; n * kv_dim];
        let mut v = vec![0.0f32; n * kv_dim];
        let mut attn = vec![0.0f32; n * q_dim];
        let mut proj = vec![0.0f32; n * d];
        let mut gate = vec![0.0f32; n * c.ffn_dim];
        let mut up = vec![0.0f32; n * c.ffn_dim];
        let mm = |w: &QuantMatrix<'_>, x: &[f32], out: &mut [f32]| {
            matmul_by_segment(backend, segments, w, x, out)
        };
        let heads = Heads {
            n_heads: c.heads,
            n_kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };

        for (l, w) in self.weights.layers.iter().enumerate() {
            backend.rms_norm(&x, &w.attn_norm, c.rms_eps, &mut xn)?;
            mm(&w.wq.view(g), &xn, &mut q)?;
            mm(&w.wk.view(g), &xn, &mut k)?;
            mm(&w.wv.view(g), &xn, &mut v)?;
            for (buf, bias) in [(&mut q, &w.bq), (&mut k, &w.bk), (&mut v, &w.bv)] {
                if let Some(bias) = bias {
                    for row in buf.chunks_exact_mut(bias.len()) {
                        backend.add(row, bias)?;
                    }
                }
            }
            for (t, &pos) in positions.iter().enumerate() {
                backend.rope(&mut q[t * q_dim..(t + 1) * q_dim], c.heads, pos, &rope)?;
                backend.rope(&mut k[t * kv_dim..(t + 1) * kv_dim], c.kv_heads, pos, &rope)?;
            }
            kv.store(l, &k, &v);
            kv.attend(backend, l, &q, heads, &mut attn)?;
            mm(&w.wo.view(g), &attn, &mut proj)?;
            per_segment(segments, d, &mut x, &proj, |a, b| backend.add(a, b))?;

            backend.rms_norm(&x, &w.ffn_norm, c.rms_eps, &mut xn)?;
            mm(&w.w_gate.view(g), &xn, &mut gate)?;
            mm(&w.w_up.view(g), &xn, &mut up)?;
            per_segment(segments, c.ffn_dim, &mut gate, &up, |a, b| {
                backend.silu_mul(a, b)
            })?;
            mm(&w.w_down.view(g), &gate, &mut proj)?;
            per_segment(segments, d, &mut x, &proj, |a, b| backend.add(a, b))?;
        }

        // Only the rows whose logits are wanted go through the output projection.
        let rows = wanted.len();
        let mut normed = vec![0.0f32; rows * d];
        for (out, &r) in normed.chunks_exact_mut(d).zip(wanted) {
            backend.rms_norm(
                &x[r * d..(r + 1) * d],
                &self.weights.output_norm,
                c.rms_eps,
                out,
            )?;
        }
        let mut out = vec![0.0f32; rows * c.vocab_size];
        let output = self.weights.output.view(g);
        if segments.len() == 1 {
            backend.matmul(&output, &normed, rows, &mut out)?;
        } else {
            // Alone, each of these rows is a one-row projection.
            backend.matmul_per_row(&output, &normed, rows, &mut out)?;
        }
        Ok(out)
    }
}

/// One call (the contiguous cache, evaluation) keeps the plain matmul.
/// Several sequences: each run of one-row segments (decode steps) is one
/// per-row matmul, and each longer segment (a prefill chunk) its own
/// matmul, so every row is computed exactly as when its sequence runs alone.
fn matmul_by_segment(
    backend: &dyn Backend,
    segments: &[Segment],
    w: &QuantMatrix<'_>,
    x: &[f32],
    out: &mut [f32],
) -> OpResult {
    let n: usize = segments.iter().map(|s| s.rows).sum();
    if segments.len() == 1 {
        return backend.matmul(w, x, n, out);
    }
    let (cols, rows) = (w.cols, w.rows);
    let mut at = 0;
    let mut i = 0;
    while i < segments.len() {
        let single = segments[i].rows == 1;
        let mut span = segments[i].rows;
        i += 1;
        while single && i < segments.len() && segments[i].rows == 1 {
            span += 1;
            i += 1;
        }
        let (x, out) = (
            &x[at * cols..(at + span) * cols],
            &mut out[at * rows..(at + span) * rows],
        );
        if single {
            backend.matmul_per_row(w, x, span, out)?;
        } else {
            backend.matmul(w, x, span, out)?;
        }
        at += span;
    }
    Ok(())
}

/// Runs `op(a, b)` on each segment's rows of two `width`-wide row buffers.
fn per_segment(
    segments: &[Segment],
    width: usize,
    a: &mut [f32],
    b: &[f32],
    op: impl Fn(&mut [f32], &[f32]) -> OpResult,
) -> OpResult {
    let mut at = 0;
    for s in segments {
        let span = at..at + s.rows * width;
        op(&mut a[span.clone()], &b[span])?;
        at += s.rows * width;
    }
    Ok(())
}

/// Consecutive rows of one forward call that belong to one sequence.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub rows: usize,
    /// Cache position of the first row.
    pub start_pos: usize,
}

/// The attention heads of a model.
#[derive(Clone, Copy, Debug)]
pub(super) struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Where a forward call keeps keys and values and how attention reads them.
pub(super) trait KvStore {
    /// Stores the keys and values of every row of the call for `layer`.
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]);
    /// Attention of every row of the call over what its sequence holds.
    fn attend(
        &self,
        backend: &dyn Backend,
        layer: usize,
        q: &[f32],
        heads: Heads,
        out: &mut [f32],
    ) -> OpResult;
}

/// One sequence's contiguous cache, the call's rows written from `start`.
struct ContiguousStore<'c> {
    cache: &'c mut KvCache,
    start: usize,
}

impl KvStore for ContiguousStore<'_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kv = self.cache.kv_dim;
        let at = self.start * kv..self.start * kv + k.len();
        self.cache.k[layer][at.clone()].copy_from_slice(k);
        self.cache.v[layer][at].copy_from_slice(v);
    }

    fn attend(
        &self,
        backend: &dyn Backend,
        layer: usize,
        q: &[f32],
        h: Heads,
        out: &mut [f32],
    ) -> OpResult {
        let n = q.len() / (h.n_heads * h.head_dim);
        let shape = AttentionShape {
            n_tokens: n,
            start_pos: self.start,
            n_heads: h.n_heads,
            n_kv_heads: h.n_kv_heads,
            head_dim: h.head_dim,
            scale: h.scale,
        };
        let seen = (self.start + n) * self.cache.kv_dim;
        backend.attention(
            q,
            &self.cache.k[layer][..seen],
            &self.cache.v[layer][..seen],
            shape,
            out,
        )
    }
}

/// Keys and values of every layer for the positions processed so far.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    capacity: usize,
    len: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of memory the cache holds.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|l| l.len() * 4).sum()
    }
}

/// Why a forward call was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("context full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("KV block {block} is outside the pool of {blocks} blocks")]
    BlockOutOfRange { block: u32, blocks: u32 },
    /// The backend's device failed the pass (its kind says whether the
    /// device can go on).
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
}
