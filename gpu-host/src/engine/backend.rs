//! The ops the forward pass needs, behind one trait so that backends (CPU,
//! HIP) are interchangeable.

use std::sync::Arc;

use bulkhead_kernels::{
    AttentionShape, CpuKernels, Isa, KernelError, PagedSeq, PagedShape, QuantMatrix, RopeStyle,
};

use super::partitioned::PartitionedDevice;

/// RoPE parameters shared by every call in a model.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    pub head_dim: usize,
    pub rot_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
}

/// The engine's compute ops. Activations are row-major f32 on the host.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// A short name for logs ("cpu-avx2", "cpu-scalar").
    fn name(&self) -> String;
    /// `out[t][r] = w[r] · x[t]` for `n_tokens` rows of `x`.
    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]);
    /// As [`Backend::matmul`], but every row of `x` computed exactly as a
    /// one-row `matmul` computes it (some multi-token kernels sum in another
    /// order). Still one pass over the weights for all rows: batched decode.
    fn matmul_per_row(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]);
    /// Row `token` of an embedding table, dequantized into `out`.
    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]);
    /// RMSNorm of each `weight.len()`-wide row of `x`, scaled by `weight`.
    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]);
    /// Rotates `heads` heads of one token at position `pos` in place.
    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, params: &RopeParams);
    /// Causal attention of `n_tokens` queries over the cache (see [`AttentionShape`]).
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: AttentionShape, out: &mut [f32]);
    /// Causal attention of several sequences over a paged KV pool, each
    /// through its block table; bit-identical per row to [`Backend::attention`].
    fn attention_paged(
        &self,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    );
    /// `gate = silu(gate) * up`.
    fn silu_mul(&self, gate: &mut [f32], up: &[f32]);
    /// `a += b`.
    fn add(&self, a: &mut [f32], b: &[f32]);
}

/// What the host's partition schedulers compute with.
#[derive(Clone, Debug, Default)]
pub enum ComputeBackend {
    /// A CPU backend per partition, one worker thread per compute unit,
    /// pinned with the partition's scheduler to its cores.
    #[default]
    Cpu,
    /// A device the partitions split: each partition's scheduler gets a
    /// backend of its own from it (streams on the partition's CUs, a
    /// budget of its memory), all reading one copy of the weights.
    Device(Arc<PartitionedDevice>),
}

/// The CPU backend: AVX2/FMA kernels when the processor has them, scalar otherwise.
#[derive(Debug)]
pub struct CpuBackend {
    kernels: CpuKernels,
}

impl CpuBackend {
    /// A backend running on `threads` worker threads with the best instruction set available.
    pub fn new(threads: usize) -> Result<CpuBackend, KernelError> {
        Self::with_isa(threads, Isa::detect())
    }

    /// A backend restricted to `isa` (tests compare the scalar oracle with the fast path).
    pub fn with_isa(threads: usize, isa: Isa) -> Result<CpuBackend, KernelError> {
        Ok(CpuBackend {
            kernels: CpuKernels::new(threads, isa)?,
        })
    }

    /// Worker threads in use.
    pub fn threads(&self) -> usize {
        self.kernels.threads()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu-{:?}", self.kernels.isa()).to_lowercase()
    }

    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.kernels.matmul(w, x, n_tokens, out);
    }

    fn matmul_per_row(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.kernels.matmul_row_exact(w, x, n_tokens, out);
    }

    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]) {
        let row_bytes = table.data.len() / table.rows;
        let start = token as usize * row_bytes;
        bulkhead_kernels::dequantize_row(table.ty, &table.data[start..start + row_bytes], out);
    }

    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let n = weight.len();
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            bulkhead_kernels::rms_norm(xr, weight, eps, or);
        }
    }

    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, p: &RopeParams) {
        bulkhead_kernels::rope(
            x,
            heads,
            p.head_dim,
            p.rot_dim,
            pos,
            p.freq_base,
            p.freq_scale,
            p.style,
        );
    }

    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: AttentionShape, out: &mut [f32]) {
        self.kernels.attention(q, k, v, shape, out);
    }

    fn attention_paged(
        &self,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) {
        self.kernels
            .attention_paged(q, k_pool, v_pool, seqs, shape, out);
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        bulkhead_kernels::silu_mul(gate, up);
    }

    fn add(&self, a: &mut [f32], b: &[f32]) {
        bulkhead_kernels::add(a, b);
    }
}
