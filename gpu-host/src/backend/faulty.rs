//! Test support: a CPU backend whose device "fails" on demand, for the
//! paths that must survive a device error (the batch, the scheduler).

use std::sync::Mutex;

use bulkhead_kernels::{Activation, AttentionShape, PagedSeq, PagedShape, QuantMatrix};

use super::{Backend, CpuBackend, DeviceError, OpResult, RopeParams};

/// Runs every op on a [`CpuBackend`] until [`Faulty::fail_next`] is set:
/// the next matmul then returns that error instead (once).
#[derive(Debug)]
pub(crate) struct Faulty {
    cpu: CpuBackend,
    next: Mutex<Option<DeviceError>>,
}

impl Faulty {
    pub(crate) fn new(threads: usize) -> Faulty {
        Faulty {
            cpu: CpuBackend::new(threads).expect("a CPU backend"),
            next: Mutex::new(None),
        }
    }

    /// The next matmul fails with `error`.
    pub(crate) fn fail_next(&self, error: DeviceError) {
        *self.next.lock().unwrap() = Some(error);
    }

    fn fault(&self) -> OpResult {
        self.next.lock().unwrap().take().map_or(Ok(()), Err)
    }
}

impl Backend for Faulty {
    fn name(&self) -> String {
        format!("faulty {}", self.cpu.name())
    }

    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n: usize, out: &mut [f32]) -> OpResult {
        self.fault()?;
        self.cpu.matmul(w, x, n, out)
    }

    fn matmul_per_row(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> OpResult {
        self.fault()?;
        self.cpu.matmul_per_row(w, x, n, out)
    }

    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]) -> OpResult {
        self.cpu.embedding(table, token, out)
    }

    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> OpResult {
        self.cpu.rms_norm(x, weight, eps, out)
    }

    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, params: &RopeParams<'_>) -> OpResult {
        self.cpu.rope(x, heads, pos, params)
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
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) -> OpResult {
        self.cpu
            .attention_paged(q, k_pool, v_pool, seqs, shape, out)
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
