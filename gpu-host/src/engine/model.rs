//! A loaded model and its forward pass (llama and qwen2 share one code path).

use std::path::Path;

use bulkhead_kernels::{AttentionShape, QuantMatrix};

use super::config::{ConfigError, ModelConfig};
use super::weights::{Ffn, Weights};
use crate::backend::{
    Act, Backend, DeviceError, DeviceKv, ForwardPass, Heads, KvLayout, MoeFfn, OpResult, PassShape,
    RopeParams, Segment, StepRows, WeightRef, matmul_spans,
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

    /// Makes every weight the forward pass reads resident on `backend`'s
    /// device: after this, passes move activations, never weights. On the
    /// CPU, repacks the matrices it has a faster form for
    /// ([`Backend::pack`]); when the model is the mapped file, the file's
    /// pages of a repacked matrix are then dropped, so memory holds one copy
    /// (they are the file's: a later read faults them back in).
    pub fn preload(&self, backend: &dyn Backend) -> Result<(), DeviceError> {
        if backend.resident().is_some() {
            self.device_support()
                .map_err(|e| DeviceError::new("load", e.to_string()))?;
        }
        let g = &self.gguf;
        let w = &self.weights;
        let tied = w.output.file_range() == w.token_embd.file_range();
        let mut matrices: Vec<&super::weights::MatrixRef> = vec![&w.output];
        for l in &w.layers {
            matrices.extend(l.dense_matrices());
        }
        for m in matrices {
            if let Some(packed) = backend.pack(&m.view(g))
                && m.set_packed(packed)
                && !(tied && std::ptr::eq(m, &w.output))
            {
                g.release_file_pages(m.file_range());
            }
        }
        let matrix = |m: &super::weights::MatrixRef| backend.preload(WeightRef::Matrix(m.view(g)));
        matrix(&w.token_embd)?;
        for l in &w.layers {
            backend.preload(WeightRef::Vector(&l.attn_norm))?;
            for m in [&l.wq, &l.wk, &l.wv, &l.wo] {
                matrix(m)?;
            }
            if let Ffn::Dense { gate, up, down } = &l.ffn {
                for m in [gate, up, down] {
                    matrix(m)?;
                }
            }
            backend.preload(WeightRef::Vector(&l.ffn_norm))?;
        }
        backend.preload(WeightRef::Vector(&w.output_norm))?;
        matrix(&w.output)
    }

    /// Matrices a backend repacked at [`Model::preload`].
    pub fn packed_matrices(&self) -> usize {
        let w = &self.weights;
        let layers = w.layers.iter().flat_map(|l| l.dense_matrices());
        layers.chain([&w.output]).filter(|m| m.is_packed()).count()
    }

    /// Whether a device backend (whose passes run on the device) has every
    /// op this model needs: the error names the architecture and the op
    /// it lacks. The CPU backend runs every model.
    pub fn device_support(&self) -> Result<(), UnsupportedOnDevice> {
        match self.config.moe {
            Some(moe) => Err(UnsupportedOnDevice {
                arch: self.config.arch.name(),
                what: format!("a mixture of {} experts", moe.experts),
                op: "moe_ffn",
            }),
            None => Ok(()),
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
            q: c.heads * c.head_dim,
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
        let rope = RopeParams {
            head_dim: c.head_dim,
            rot_dim: c.rope_dim,
            freq_base: c.rope_base,
            freq_scale: c.rope_scale,
            style: c.rope_style,
        };
        let heads = Heads {
            n_heads: c.heads,
            n_kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        pass.embed(&self.weights.token_embd.view(g), Act::X)?;
        for (l, w) in self.weights.layers.iter().enumerate() {
            pass.rms_norm(Act::X, &w.attn_norm, c.rms_eps, Act::Xn)?;
            let (wq, wk, wv) = (w.wq.view(g), w.wk.view(g), w.wv.view(g));
            pass.matmuls(Act::Xn, &[(&wq, Act::Q), (&wk, Act::K), (&wv, Act::V)])?;
            for (act, bias) in [(Act::Q, &w.bq), (Act::K, &w.bk), (Act::V, &w.bv)] {
                if let Some(bias) = bias {
                    pass.add_bias(act, bias)?;
                }
            }
            pass.rope(Act::Q, c.heads, &rope)?;
            pass.rope(Act::K, c.kv_heads, &rope)?;
            pass.store_kv(l, Act::K, Act::V)?;
            pass.attend(l, Act::Q, heads, Act::Attn)?;
            pass.matmul(&w.wo.view(g), Act::Attn, Act::Proj)?;
            pass.add(Act::X, Act::Proj)?;

            pass.rms_norm(Act::X, &w.ffn_norm, c.rms_eps, Act::Xn)?;
            match (&w.ffn, c.moe) {
                (Ffn::Dense { gate, up, down }, _) => {
                    let (gate, up) = (gate.view(g), up.view(g));
                    pass.matmuls(Act::Xn, &[(&gate, Act::Gate), (&up, Act::Up)])?;
                    pass.silu_mul(Act::Gate, Act::Up)?;
                    pass.matmul(&down.view(g), Act::Gate, Act::Proj)?;
                }
                (Ffn::Moe(moe), Some(mc)) => {
                    pass.moe_ffn(&moe.view(g, mc.experts_used), Act::Xn, Act::Proj)?;
                }
                (Ffn::Moe(_), None) => unreachable!("MoE weights are loaded for a MoE config"),
            }
            pass.add(Act::X, Act::Proj)?;
        }
        pass.logits(
            Act::X,
            &self.weights.output_norm,
            c.rms_eps,
            &self.weights.output.view(g),
        )
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

/// The host's pass: buffers in host memory, every op one or more calls of
/// the [`Backend`]'s host ops.
///
/// Matmuls take every row at once (the weights are read once per call,
/// whatever the number of sequences). Everything else is per row or per
/// segment, so a sequence's rows are computed bit for bit the same
/// whatever else shares the call: the AVX2 element-wise kernels finish a
/// slice's tail with scalar code, so running them over a whole batch
/// would shift which elements take that path.
struct HostPass<'a> {
    backend: &'a dyn Backend,
    shape: PassShape,
    tokens: &'a [u32],
    segments: &'a [Segment],
    /// Position of every row.
    positions: Vec<usize>,
    kv: &'a mut dyn KvStore,
    wanted: &'a [usize],
    bufs: [Vec<f32>; 9],
}

impl<'a> HostPass<'a> {
    fn new(
        backend: &'a dyn Backend,
        shape: PassShape,
        tokens: &'a [u32],
        segments: &'a [Segment],
        kv: &'a mut dyn KvStore,
        wanted: &'a [usize],
    ) -> HostPass<'a> {
        let positions: Vec<usize> = segments
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.rows)
            .collect();
        debug_assert_eq!(positions.len(), tokens.len());
        let n = tokens.len();
        HostPass {
            backend,
            shape,
            tokens,
            segments,
            positions,
            kv,
            wanted,
            bufs: Act::ALL.map(|a| vec![0.0f32; n * a.width(&shape)]),
        }
    }

    /// Runs `f` with `out` taken out of the pass (so `f` may read the
    /// other buffers).
    fn with_out<R>(&mut self, out: Act, f: impl FnOnce(&Self, &mut [f32]) -> R) -> R {
        let mut buf = std::mem::take(&mut self.bufs[out.index()]);
        let r = f(self, &mut buf);
        self.bufs[out.index()] = buf;
        r
    }

    /// `op(a, b)` on each segment's rows.
    fn per_segment(
        &mut self,
        a: Act,
        b: Act,
        op: impl Fn(&dyn Backend, &mut [f32], &[f32]) -> OpResult,
    ) -> OpResult {
        let width = a.width(&self.shape);
        self.with_out(a, |p, a| {
            let b = &p.bufs[b.index()];
            let mut at = 0;
            for s in p.segments {
                let span = at..at + s.rows * width;
                op(p.backend, &mut a[span.clone()], &b[span])?;
                at += s.rows * width;
            }
            Ok(())
        })
    }
}

impl ForwardPass for HostPass<'_> {
    fn embed(&mut self, table: &QuantMatrix<'_>, out: Act) -> OpResult {
        let d = out.width(&self.shape);
        self.with_out(out, |p, out| {
            for (row, &t) in out.chunks_exact_mut(d).zip(p.tokens) {
                p.backend.embedding(table, t, row)?;
            }
            Ok(())
        })
    }

    fn rms_norm(&mut self, x: Act, weight: &[f32], eps: f32, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            p.backend.rms_norm(&p.bufs[x.index()], weight, eps, out)
        })
    }

    fn matmul(&mut self, w: &QuantMatrix<'_>, x: Act, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            matmul_by_segment(p.backend, p.segments, w, &p.bufs[x.index()], out)
        })
    }

    fn matmuls(&mut self, x: Act, ws: &[(&QuantMatrix<'_>, Act)]) -> OpResult {
        let mut bufs: Vec<Vec<f32>> = ws
            .iter()
            .map(|&(_, out)| std::mem::take(&mut self.bufs[out.index()]))
            .collect();
        let x = &self.bufs[x.index()];
        let r = matmuls_by_segment(self.backend, self.segments, ws, x, &mut bufs);
        for (&(_, out), buf) in ws.iter().zip(bufs) {
            self.bufs[out.index()] = buf;
        }
        r
    }

    fn add_bias(&mut self, x: Act, bias: &[f32]) -> OpResult {
        self.with_out(x, |p, x| {
            for row in x.chunks_exact_mut(bias.len()) {
                p.backend.add(row, bias)?;
            }
            Ok(())
        })
    }

    fn rope(&mut self, x: Act, heads: usize, params: &RopeParams) -> OpResult {
        let width = x.width(&self.shape);
        self.with_out(x, |p, x| {
            for (row, &pos) in x.chunks_exact_mut(width).zip(&p.positions) {
                p.backend.rope(row, heads, pos, params)?;
            }
            Ok(())
        })
    }

    fn store_kv(&mut self, layer: usize, k: Act, v: Act) -> OpResult {
        self.kv
            .store(layer, &self.bufs[k.index()], &self.bufs[v.index()]);
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: Act, heads: Heads, out: Act) -> OpResult {
        let mut buf = std::mem::take(&mut self.bufs[out.index()]);
        let r = self
            .kv
            .attend(self.backend, layer, &self.bufs[q.index()], heads, &mut buf);
        self.bufs[out.index()] = buf;
        r
    }

    fn add(&mut self, a: Act, b: Act) -> OpResult {
        self.per_segment(a, b, |backend, a, b| backend.add(a, b))
    }

    fn silu_mul(&mut self, gate: Act, up: Act) -> OpResult {
        self.per_segment(gate, up, |backend, a, b| backend.silu_mul(a, b))
    }

    fn moe_ffn(&mut self, moe: &MoeFfn<'_>, x: Act, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            super::moe::moe_ffn(p.backend, p.segments, moe, &p.bufs[x.index()], out)
        })
    }

    /// Only the rows whose logits are wanted go through the output projection.
    fn logits(
        &mut self,
        x: Act,
        norm: &[f32],
        eps: f32,
        output: &QuantMatrix<'_>,
    ) -> Result<Vec<f32>, DeviceError> {
        let d = x.width(&self.shape);
        let x = &self.bufs[x.index()];
        let rows = self.wanted.len();
        let mut normed = vec![0.0f32; rows * d];
        for (out, &r) in normed.chunks_exact_mut(d).zip(self.wanted) {
            self.backend
                .rms_norm(&x[r * d..(r + 1) * d], norm, eps, out)?;
        }
        let mut out = vec![0.0f32; rows * self.shape.vocab];
        if self.segments.len() == 1 {
            self.backend.matmul(output, &normed, rows, &mut out)?;
        } else {
            // Alone, each of these rows is a one-row projection.
            self.backend
                .matmul_per_row(output, &normed, rows, &mut out)?;
        }
        Ok(out)
    }
}

/// `out = w · x` over the rows of `segments`, span by span
/// ([`matmul_spans`]).
fn matmul_by_segment(
    backend: &dyn Backend,
    segments: &[Segment],
    w: &QuantMatrix<'_>,
    x: &[f32],
    out: &mut [f32],
) -> OpResult {
    let (cols, rows) = (w.cols, w.rows);
    for span in matmul_spans(segments) {
        let (at, n) = (span.at, span.rows);
        let (x, out) = (
            &x[at * cols..(at + n) * cols],
            &mut out[at * rows..(at + n) * rows],
        );
        if span.per_row {
            backend.matmul_per_row(w, x, n, out)?;
        } else {
            backend.matmul(w, x, n, out)?;
        }
    }
    Ok(())
}

/// [`matmul_by_segment`] for several matrices over one input, each span
/// one [`Backend::matmuls`] call.
fn matmuls_by_segment(
    backend: &dyn Backend,
    segments: &[Segment],
    ws: &[(&QuantMatrix<'_>, Act)],
    x: &[f32],
    outs: &mut [Vec<f32>],
) -> OpResult {
    let Some(&(first, _)) = ws.first() else {
        return Ok(());
    };
    let cols = first.cols;
    for span in matmul_spans(segments) {
        let (at, n) = (span.at, span.rows);
        let mut pairs: Vec<(QuantMatrix<'_>, &mut [f32])> = ws
            .iter()
            .zip(outs.iter_mut())
            .map(|(&(w, _), out)| (*w, &mut out[at * w.rows..(at + n) * w.rows]))
            .collect();
        backend.matmuls(&x[at * cols..(at + n) * cols], n, &mut pairs, span.per_row)?;
    }
    Ok(())
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

/// One sequence's contiguous cache in host memory, the call's rows
/// written from `start`.
struct ContiguousStore<'c> {
    k: &'c mut [Vec<f32>],
    v: &'c mut [Vec<f32>],
    kv_dim: usize,
    start: usize,
}

impl KvStore for ContiguousStore<'_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kv = self.kv_dim;
        let at = self.start * kv..self.start * kv + k.len();
        self.k[layer][at.clone()].copy_from_slice(k);
        self.v[layer][at].copy_from_slice(v);
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
        let seen = (self.start + n) * self.kv_dim;
        backend.attention(
            q,
            &self.k[layer][..seen],
            &self.v[layer][..seen],
            shape,
            out,
        )
    }
}

/// Where a cache's keys and values live.
#[derive(Debug)]
pub(super) enum KvMemory {
    /// Nowhere yet: the first forward call places them.
    Unplaced,
    /// Host memory, per layer (zeroed, so pages no pass touches cost no
    /// resident memory).
    Host { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
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
                    let layer = || (0..layout.layers).map(|_| vec![0.0; floats]).collect();
                    KvMemory::Host {
                        k: layer(),
                        v: layer(),
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

/// A model needs an op the device backends do not have.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "architecture {arch} with {what} needs the `{op}` op, which the device backend does not have \
     (run it on the CPU backend)"
)]
pub struct UnsupportedOnDevice {
    pub arch: &'static str,
    pub what: String,
    pub op: &'static str,
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
