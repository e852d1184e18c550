//! A loaded model and its forward pass: one code path for every
//! architecture, whose differences are the config's (an activation,
//! optional norms and biases, attention windows and caps, an embedding
//! scale, RoPE scaling).

use std::path::Path;

use bulkhead_kernels::{ScoreMask, scalar};

use super::config::{ConfigError, ModelConfig};
use super::host_pass::{ContiguousStore, HostPass, KvStore};
use super::weights::{Ffn, Weights};
use super::zeroed::{HugePageBytes, ZeroedFloats};
use crate::backend::{
    Act, Backend, DeviceError, DeviceKv, ForwardPass, Heads, KvLayout, PassShape, RopeParams,
    Segment, StepRows, WeightRef,
};
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

    /// A fresh KV cache able to hold `capacity` positions (at most the
    /// context length). Its memory is allocated by the first forward call,
    /// where that call's backend computes: host memory, or the device's.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let capacity = capacity.min(self.config.context_length);
        KvCache {
            memory: KvMemory::Unplaced,
            layout: KvLayout {
                layers: self.config.layers,
                blocks: 1,
                block_tokens: capacity,
                kv_dim: self.config.kv_dim(),
                table_stride: 1,
            },
            len: 0,
        }
    }

    /// The ops this model's pass needs that the device pass (the HIP and
    /// CUDA kernels) does not implement; empty when it can run there.
    pub fn ops_missing_on_device(&self) -> Vec<&'static str> {
        ops_missing_on_device(&self.config, &self.weights)
    }

    /// Checks that `gguf` holds a model this engine runs (hyperparameters
    /// and every tensor the pass reads, as [`Model::from_gguf`] does)
    /// without taking the file; returns its config and the ops a device
    /// backend would lack.
    pub fn check(gguf: &Gguf) -> Result<(ModelConfig, Vec<&'static str>), ConfigError> {
        let config = ModelConfig::from_gguf(gguf)?;
        let weights = Weights::load(gguf, &config)?;
        let missing = ops_missing_on_device(&config, &weights);
        Ok((config, missing))
    }

    /// Refuses a model whose pass would need ops `backend`'s device lacks
    /// (a CPU backend runs every model): before any weight goes up or any
    /// request is accepted, naming the architecture and the ops.
    pub fn check_backend(&self, backend: &dyn Backend) -> Result<(), ConfigError> {
        if backend.resident().is_none() {
            return Ok(());
        }
        self.check_device_support()
    }

    /// [`Model::check_backend`] for a device backend.
    pub fn check_device_support(&self) -> Result<(), ConfigError> {
        let missing = self.ops_missing_on_device();
        if missing.is_empty() {
            return Ok(());
        }
        Err(ConfigError::NotOnDevice {
            arch: self.config.arch.name(),
            ops: missing.join(", "),
        })
    }

    /// Makes every weight the forward pass reads resident on `backend`'s
    /// device: after this, passes move activations, never weights. On the
    /// CPU, repacks the matrices it has a faster form for
    /// ([`Model::pack`]); when the model is the mapped file, the file's
    /// pages of a repacked matrix are then dropped, so memory holds one copy
    /// (they are the file's: a later read faults them back in). Call
    /// [`Model::check_backend`] first: a model the device cannot run fails
    /// its first pass there.
    pub fn preload(&self, backend: &dyn Backend) -> Result<(), DeviceError> {
        let g = &self.gguf;
        let w = &self.weights;
        self.pack(backend, |range| g.release_file_pages(range));
        let matrix = |m: &super::weights::MatrixRef| backend.preload(WeightRef::Matrix(m.view(g)));
        matrix(&w.token_embd)?;
        for l in &w.layers {
            for v in l.vectors() {
                backend.preload(WeightRef::Vector(v))?;
            }
            for m in l.matrices() {
                matrix(m)?;
            }
        }
        backend.preload(WeightRef::Vector(&w.output_norm))?;
        matrix(&w.output)
    }

    /// Repacks every matrix `backend` has a faster form for
    /// ([`Backend::packed_len`]; the matrices in parallel) into one region
    /// of huge pages ([`HugePageBytes`]), and calls `unused` with each file
    /// range nothing reads any more, as soon as its matrix is packed (so
    /// memory never holds both forms of every matrix): those of the packed
    /// matrices, less an output matrix tied to the embedding table (its
    /// rows are still looked up). Matrices packed already are left as they
    /// are. Returns how many it packed: none when the region cannot be
    /// mapped (the passes then read the file's form).
    pub fn pack(
        &self,
        backend: &dyn Backend,
        unused: impl Fn(std::ops::Range<usize>) + Sync,
    ) -> usize {
        use rayon::prelude::*;
        let g = &self.gguf;
        let w = &self.weights;
        let tied = w.output.file_range() == w.token_embd.file_range();
        // Each matrix's range in the region, a cache line apart.
        let mut end = 0;
        let plan: Vec<(&super::weights::MatrixRef, std::ops::Range<usize>)> = self
            .matrices()
            .into_iter()
            .filter(|m| m.packed().is_none())
            .filter_map(|m| {
                let len = backend.packed_len(&m.view(g))?;
                let range = end..end + len;
                end = range.end.next_multiple_of(64);
                Some((m, range))
            })
            .collect();
        if plan.is_empty() {
            return 0;
        }
        let mut region = match HugePageBytes::new(end) {
            Ok(region) => region,
            Err(e) => {
                // Slower, not wrong: say so rather than leave a slow host
                // unexplained.
                tracing::warn!(
                    bytes = end,
                    "weights not repacked: the {end}-byte region for them could not be mapped \
                     ({e}); passes read the file's form"
                );
                return 0;
            }
        };
        let mut outs = Vec::with_capacity(plan.len());
        let mut rest = region.as_mut();
        let mut at = 0;
        for (m, range) in &plan {
            let (out, tail) = rest[range.start - at..].split_at_mut(range.len());
            outs.push((*m, out));
            (rest, at) = (tail, range.end);
        }
        outs.into_par_iter().for_each(|(m, out)| {
            bulkhead_kernels::PackedMatrix::pack_into(&m.view(g), out);
            if !(tied && std::ptr::eq(m, &w.output)) {
                unused(m.file_range());
            }
        });
        let region: bulkhead_kernels::Region = std::sync::Arc::new(region);
        for (m, range) in &plan {
            let packed = bulkhead_kernels::PackedMatrix::in_region(
                &m.view(g),
                region.clone(),
                range.clone(),
            );
            m.set_packed(packed);
        }
        plan.len()
    }

    /// The matrices a backend may repack, in a fixed order: the output
    /// projection, then each layer's.
    fn matrices(&self) -> Vec<&super::weights::MatrixRef> {
        let w = &self.weights;
        let layers = w.layers.iter().flat_map(|l| l.matrices());
        std::iter::once(&w.output).chain(layers).collect()
    }

    /// The packed forms [`Model::pack`] made, in [`Model::matrices`]' order,
    /// with each matrix's file range.
    pub fn packed_forms(
        &self,
    ) -> impl Iterator<Item = (&bulkhead_kernels::PackedMatrix, std::ops::Range<usize>)> {
        self.matrices()
            .into_iter()
            .filter_map(|m| m.packed().map(|p| (p, m.file_range())))
    }

    /// Matrices a backend repacked at [`Model::preload`].
    pub fn packed_matrices(&self) -> usize {
        self.packed_forms().count()
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
        if cache.len + tokens.len() > cache.capacity() {
            return Err(ForwardError::ContextFull {
                needed: cache.len + tokens.len(),
                capacity: cache.capacity(),
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
        // A failed pass leaves the cache's length as it was: the rows it
        // wrote past it are overwritten by the next call.
        let kv_dim = cache.layout.kv_dim;
        let out = match cache.memory.place(backend, cache.layout)? {
            KvMemory::Host { k, v } => {
                let mut store = ContiguousStore {
                    k,
                    v,
                    kv_dim,
                    start,
                };
                self.run_on_host(backend, tokens, &segment, &mut store, &wanted)?
            }
            KvMemory::Device(kv) => {
                // One block holding every position: block table [0].
                let step = StepRows {
                    tokens,
                    segments: &segment,
                    tables: &[&[0]],
                    wanted: &wanted,
                };
                self.run_on_device(backend, step, kv)?
            }
            KvMemory::Unplaced => unreachable!("placed above"),
        };
        cache.len += n;
        Ok(out)
    }

    /// Widths of this model's activations, as a pass sizes its buffers.
    pub(super) fn pass_shape(&self) -> PassShape {
        let c = &self.config;
        PassShape {
            layers: c.layers,
            embedding: c.embedding_dim,
            q: c.q_dim(),
            kv: c.kv_dim(),
            ffn: c.ffn_dim,
            vocab: c.vocab_size,
            heads: c.heads,
            head_dim: c.head_dim,
            context: c.context_length,
        }
    }

    /// The forward pass proper, once for every backend: the ops of a
    /// [`Pass`] over the step's rows (the host's buffers and ops, or a
    /// device's). Returns the logits of the rows that want them, in order,
    /// or the first device error (the pass stops there).
    pub(super) fn layers(&self, pass: &mut impl ForwardPass) -> Result<Vec<f32>, DeviceError> {
        let c = &self.config;
        let g = &self.gguf;
        let eps = c.rms_eps;
        pass.embed(&self.weights.token_embd.view(g), Act::X)?;
        if let Some(scale) = c.embedding_scale {
            pass.scale(Act::X, scale)?;
        }
        for (l, w) in self.weights.layers.iter().enumerate() {
            let window = c.window(l);
            let (freq_base, freq_scale) = c.rope.base_and_scale(window.is_some());
            let rope = RopeParams {
                head_dim: c.head_dim,
                rot_dim: c.rope.dim,
                freq_base,
                freq_scale,
                style: c.rope.style,
                factors: self.weights.rope_factors.as_deref(),
                yarn: c.rope.yarn,
            };
            let heads = Heads {
                n_heads: c.heads,
                n_kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                scale: c.attention_scale,
                mask: ScoreMask {
                    window,
                    softcap: c.attn_softcap,
                },
            };
            pass.rms_norm(Act::X, &w.attn_norm, eps, Act::Xn)?;
            let (wq, wk, wv) = (w.wq.view(g), w.wk.view(g), w.wv.view(g));
            pass.matmuls(Act::Xn, &[(&wq, Act::Q), (&wk, Act::K), (&wv, Act::V)])?;
            for (act, bias) in [(Act::Q, &w.bq), (Act::K, &w.bk), (Act::V, &w.bv)] {
                if let Some(bias) = bias {
                    pass.add_bias(act, bias)?;
                }
            }
            for (act, norm) in [(Act::Q, &w.q_norm), (Act::K, &w.k_norm)] {
                if let Some(norm) = norm {
                    pass.head_norm(act, norm, eps)?;
                }
            }
            pass.rope(Act::Q, c.heads, &rope)?;
            pass.rope(Act::K, c.kv_heads, &rope)?;
            pass.store_kv(l, Act::K, Act::V)?;
            pass.attend(l, Act::Q, heads, Act::Attn)?;
            pass.matmul(&w.wo.view(g), Act::Attn, Act::Proj)?;
            residual(pass, w.attn_post_norm.as_deref(), eps)?;

            pass.rms_norm(Act::X, &w.ffn_norm, eps, Act::Xn)?;
            match (&w.ffn, c.moe) {
                (Ffn::Dense { gate, up, down }, _) => {
                    let (gate, up) = (gate.view(g), up.view(g));
                    pass.matmuls(Act::Xn, &[(&gate, Act::Gate), (&up, Act::Up)])?;
                    pass.gated(c.activation, Act::Gate, Act::Up)?;
                    pass.matmul(&down.view(g), Act::Gate, Act::Proj)?;
                }
                (Ffn::Moe(moe), Some(mc)) => {
                    pass.moe_ffn(&moe.view(g, mc.experts_used), Act::Xn, Act::Proj)?;
                }
                (Ffn::Moe(_), None) => unreachable!("MoE weights are loaded for a MoE config"),
            }
            residual(pass, w.ffn_post_norm.as_deref(), eps)?;
        }
        let mut logits = pass.logits(
            Act::X,
            &self.weights.output_norm,
            eps,
            &self.weights.output.view(g),
        )?;
        // On the host whatever ran the pass: each logit on its own.
        if let Some(cap) = c.final_softcap {
            for v in &mut logits {
                *v = scalar::softcap(*v, cap);
            }
        }
        Ok(logits)
    }

    /// The pass on the host: `tokens` are the rows of `segments` in order,
    /// their keys and values in `kv`, the logits of the rows in `wanted`.
    pub(super) fn run_on_host(
        &self,
        backend: &dyn Backend,
        tokens: &[u32],
        segments: &[Segment],
        kv: &mut dyn KvStore,
        wanted: &[usize],
    ) -> Result<Vec<f32>, DeviceError> {
        let mut pass = HostPass::new(backend, self.pass_shape(), tokens, segments, kv, wanted);
        self.layers(&mut pass)
    }

    /// The pass on a device that keeps activations and `kv` resident.
    pub(super) fn run_on_device(
        &self,
        backend: &dyn Backend,
        step: StepRows<'_>,
        kv: &mut DeviceKv,
    ) -> Result<Vec<f32>, DeviceError> {
        let Some(device) = backend.resident() else {
            return Err(DeviceError::new(
                "forward",
                format!(
                    "this KV cache lives in device memory, and {} cannot read it",
                    backend.name()
                ),
            ));
        };
        let mut pass = device.begin_pass(self.pass_shape(), step, kv)?;
        self.layers(&mut pass)
    }
}

/// See [`Model::ops_missing_on_device`].
fn ops_missing_on_device(c: &ModelConfig, w: &Weights) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if c.moe.is_some() {
        missing.push("a mixture of experts (moe_ffn)");
    }
    if c.activation != bulkhead_kernels::Activation::Silu {
        missing.push("the GELU activation (GeGLU)");
    }
    if c.embedding_scale.is_some() {
        missing.push("an embedding scale");
    }
    if w.layers
        .iter()
        .any(|l| l.q_norm.is_some() || l.k_norm.is_some())
    {
        missing.push("query/key norms");
    }
    if (0..c.layers).any(|l| c.window(l).is_some()) {
        missing.push("sliding-window attention");
    }
    if c.attn_softcap.is_some() {
        missing.push("attention score soft-capping");
    }
    if w.rope_factors.is_some() {
        missing.push("RoPE frequency factors (rope_freqs)");
    }
    if c.rope.yarn.is_some() {
        missing.push("YaRN RoPE scaling");
    }
    missing
}

/// `X += Proj`, or `X += norm(Proj)` where the layer normalizes a
/// sublayer's output first (Gemma's post-attention and post-feed-forward
/// norms).
fn residual(
    pass: &mut impl ForwardPass,
    post_norm: Option<&[f32]>,
    eps: f32,
) -> Result<(), DeviceError> {
    match post_norm {
        Some(norm) => {
            pass.rms_norm(Act::Proj, norm, eps, Act::Xn)?;
            pass.add(Act::X, Act::Xn)
        }
        None => pass.add(Act::X, Act::Proj),
    }
}

/// Where a cache's keys and values live.
#[derive(Debug)]
pub(super) enum KvMemory {
    /// Nowhere yet: the first forward call places them.
    Unplaced,
    /// Host memory, per layer: fresh zero pages, so pages no pass touches
    /// cost no resident memory.
    Host {
        k: Vec<ZeroedFloats>,
        v: Vec<ZeroedFloats>,
    },
    /// A device's memory, with the sequences' block tables.
    Device(DeviceKv),
}

impl KvMemory {
    /// The memory, allocated first if unplaced: on `backend`'s device when
    /// its passes stay there, else on the host.
    pub(super) fn place(
        &mut self,
        backend: &dyn Backend,
        layout: KvLayout,
    ) -> Result<&mut KvMemory, DeviceError> {
        if let KvMemory::Unplaced = self {
            *self = match backend.resident() {
                Some(device) => KvMemory::Device(device.alloc_kv(layout)?),
                None => {
                    let floats = layout.blocks * layout.block_tokens * layout.kv_dim;
                    let layer = || -> Result<Vec<ZeroedFloats>, DeviceError> {
                        (0..layout.layers)
                            .map(|_| {
                                ZeroedFloats::new(floats).map_err(|e| {
                                    DeviceError::out_of_memory(
                                        format!("alloc {floats} KV floats in host memory"),
                                        e.to_string(),
                                    )
                                })
                            })
                            .collect()
                    };
                    KvMemory::Host {
                        k: layer()?,
                        v: layer()?,
                    }
                }
            };
        }
        Ok(self)
    }
}

/// Keys and values of every layer for the positions processed so far.
#[derive(Debug)]
pub struct KvCache {
    memory: KvMemory,
    /// One block of the whole capacity.
    layout: KvLayout,
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
        self.layout.block_tokens
    }

    /// Bytes of memory the cache holds (once a forward call placed it).
    pub fn bytes(&self) -> usize {
        self.layout.bytes()
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

#[cfg(test)]
mod tests;
