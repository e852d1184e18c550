//! The CPU backend: the kernels crate's AVX2/FMA (or AVX-512 VNNI) kernels
//! when the processor has them, scalar otherwise, on host memory.

use bulkhead_kernels::{
    Activation, AttentionShape, CpuKernels, Isa, KernelError, PagedSeq, PagedShape, QuantMatrix,
    TokenGrouping,
};

use super::{Backend, OpResult, RopeAngles, RopeParams};

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

    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) -> OpResult {
        self.kernels.matmul(w, x, n_tokens, out);
        Ok(())
    }

    fn matmul_per_row(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult {
        self.kernels.matmul_row_exact(w, x, n_tokens, out);
        Ok(())
    }

    fn matmuls(
        &self,
        x: &[f32],
        n_tokens: usize,
        outs: &mut [(QuantMatrix<'_>, &mut [f32])],
        per_row: bool,
    ) -> OpResult {
        let grouping = if per_row {
            TokenGrouping::Exact
        } else {
            TokenGrouping::Several
        };
        self.kernels.matmuls(x, n_tokens, outs, grouping);
        Ok(())
    }

    fn packed_len(&self, m: &QuantMatrix<'_>) -> Option<usize> {
        self.kernels.packed_len(m)
    }

    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]) -> OpResult {
        let row_bytes = table.data.len() / table.rows;
        let start = token as usize * row_bytes;
        bulkhead_kernels::dequantize_row(table.ty, &table.data[start..start + row_bytes], out);
        Ok(())
    }

    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> OpResult {
        let n = weight.len();
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            bulkhead_kernels::rms_norm(xr, weight, eps, or);
        }
        Ok(())
    }

    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, p: &RopeParams<'_>) -> OpResult {
        bulkhead_kernels::rope_ext(x, heads, p.head_dim, pos, &p.freqs(), p.style);
        Ok(())
    }

    fn rope_with(
        &self,
        x: &mut [f32],
        heads: usize,
        _pos: usize,
        p: &RopeParams<'_>,
        angles: &RopeAngles,
    ) -> OpResult {
        debug_assert_eq!(x.len(), heads * p.head_dim);
        bulkhead_kernels::rope_rotate(x, p.head_dim, &angles.cos, &angles.sin, p.style);
        Ok(())
    }

    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> OpResult {
        self.kernels.attention(q, k, v, shape, out);
        Ok(())
    }

    fn attention_paged(
        &self,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) -> OpResult {
        self.kernels
            .attention_paged(q, k_pool, v_pool, seqs, shape, out);
        Ok(())
    }

    fn gated(&self, act: Activation, gate: &mut [f32], up: &[f32]) -> OpResult {
        bulkhead_kernels::gated(act, gate, up);
        Ok(())
    }

    fn scale(&self, x: &mut [f32], c: f32) -> OpResult {
        bulkhead_kernels::scale(x, c);
        Ok(())
    }

    fn add(&self, a: &mut [f32], b: &[f32]) -> OpResult {
        bulkhead_kernels::add(a, b);
        Ok(())
    }
}
