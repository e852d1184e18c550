//! A loaded model and its forward pass (llama and qwen2 share one code path).

use std::path::Path;

use bulkhead_kernels::AttentionShape;

use super::backend::{Backend, RopeParams};
use super::config::{ConfigError, ModelConfig};
use super::weights::Weights;
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
        }
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
            let rows = self.forward_chunk(backend, cache, chunk, logits);
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
    ) -> Vec<f32> {
        let c = &self.config;
        let g = &self.gguf;
        let n = tokens.len();
        let d = c.embedding_dim;
        let q_dim = c.heads * c.head_dim;
        let kv = c.kv_dim();
        let start = cache.len;
        let rope = RopeParams {
            head_dim: c.head_dim,
            rot_dim: c.rope_dim,
            freq_base: c.rope_base,
            freq_scale: c.rope_scale,
            style: c.rope_style,
        };

        let mut x = vec![0.0f32; n * d];
        let embd = self.weights.token_embd.view(g);
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            backend.embedding(&embd, t, row);
        }
        let mut xn = vec![0.0f32; n * d];
        let mut q = vec![0.0f32; n * q_dim];
        let mut k = vec![0.0f32; n * kv];
        let mut v = vec![0.0f32; n * kv];
        let mut attn = vec![0.0f32; n * q_dim];
        let mut proj = vec![0.0f32; n * d];
        let mut gate = vec![0.0f32; n * c.ffn_dim];
        let mut up = vec![0.0f32; n * c.ffn_dim];

        for (l, w) in self.weights.layers.iter().enumerate() {
            backend.rms_norm(&x, &w.attn_norm, c.rms_eps, &mut xn);
            backend.matmul(&w.wq.view(g), &xn, n, &mut q);
            backend.matmul(&w.wk.view(g), &xn, n, &mut k);
            backend.matmul(&w.wv.view(g), &xn, n, &mut v);
            for (buf, bias) in [(&mut q, &w.bq), (&mut k, &w.bk), (&mut v, &w.bv)] {
                if let Some(bias) = bias {
                    for row in buf.chunks_exact_mut(bias.len()) {
                        backend.add(row, bias);
                    }
                }
            }
            for t in 0..n {
                backend.rope(
                    &mut q[t * q_dim..(t + 1) * q_dim],
                    c.heads,
                    start + t,
                    &rope,
                );
                backend.rope(&mut k[t * kv..(t + 1) * kv], c.kv_heads, start + t, &rope);
            }
            cache.k[l][start * kv..(start + n) * kv].copy_from_slice(&k);
            cache.v[l][start * kv..(start + n) * kv].copy_from_slice(&v);
            let shape = AttentionShape {
                n_tokens: n,
                start_pos: start,
                n_heads: c.heads,
                n_kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            };
            let seen = (start + n) * kv;
            backend.attention(
                &q,
                &cache.k[l][..seen],
                &cache.v[l][..seen],
                shape,
                &mut attn,
            );
            backend.matmul(&w.wo.view(g), &attn, n, &mut proj);
            backend.add(&mut x, &proj);

            backend.rms_norm(&x, &w.ffn_norm, c.rms_eps, &mut xn);
            backend.matmul(&w.w_gate.view(g), &xn, n, &mut gate);
            backend.matmul(&w.w_up.view(g), &xn, n, &mut up);
            backend.silu_mul(&mut gate, &up);
            backend.matmul(&w.w_down.view(g), &gate, n, &mut proj);
            backend.add(&mut x, &proj);
        }
        cache.len += n;

        // Only the rows whose logits are wanted go through the output projection.
        let (rows, first) = match logits {
            Logits::All => (n, 0),
            Logits::Last => (1, n - 1),
        };
        let mut normed = vec![0.0f32; rows * d];
        backend.rms_norm(
            &x[first * d..],
            &self.weights.output_norm,
            c.rms_eps,
            &mut normed,
        );
        let mut out = vec![0.0f32; rows * c.vocab_size];
        backend.matmul(&self.weights.output.view(g), &normed, rows, &mut out);
        out
    }
}

/// Keys and values of every layer for the positions processed so far.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    capacity: usize,
    len: usize,
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
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("context full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
}
