//! Backends: the ops the forward pass needs, behind one trait so that the
//! CPU and the HIP backends are interchangeable, and the wrappers that split
//! one device among partitions (a CU set and a memory budget each).
//!
//! May import `crate::hip` (the device runtime) and the kernels crate;
//! never the engine, the schedulers or the server.

mod budgeted;
mod compute;
mod cpu;
mod device;
#[cfg(test)]
pub(crate) mod faulty;
mod hip;
mod ledger;
mod moe;
mod partitioned;
mod pass;
mod select;

pub use budgeted::BudgetedDevice;
#[cfg(test)]
pub(crate) use budgeted::fake as fake_device;
pub use compute::ComputeBackend;
pub use cpu::CpuBackend;
pub use device::{
    HipDeviceError, open_cuda_device, open_cuda_partitions, open_hip_backend, open_hip_device,
    open_hip_partitions, planning_device,
};
pub use hip::{DeviceKv, DevicePass, DeviceWeights, HipBackend, KvLayout, StepRows};
pub use ledger::{Ledger, Transfers};
pub use moe::{Experts, MoeFfn};
#[cfg(test)]
pub(crate) use partitioned::tests as partitioned_test_support;
pub use partitioned::{MODEL_RESERVATION, PartitionCompute, PartitionedDevice, StreamSource};
pub use pass::{Act, ForwardPass, Heads, MatmulSpan, PassShape, Segment, matmul_spans};
pub use select::{
    BackendChoice, BackendPlan, BackendSelectError, DeviceLabel, HIP_ENGINE, HipEngine, Ordinals,
    plan_backend,
};

pub use bulkhead_kernels::hip::{DeviceError, DeviceErrorKind};
use bulkhead_kernels::{
    Activation, AttentionShape, PagedSeq, PagedShape, QuantMatrix, RopeFreqs, RopeStyle, Yarn,
};

/// RoPE parameters of a layer: the same for every row it rotates.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams<'a> {
    pub head_dim: usize,
    pub rot_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
    /// A divisor of each rotated pair's angle (`rope_freqs`).
    pub factors: Option<&'a [f32]>,
    pub yarn: Option<Yarn>,
}

/// What a [`RopeParams`]'s angles depend on ([`RopeParams::angles_key`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeAnglesKey {
    rot_dim: usize,
    freq_base: u32,
    freq_scale: u32,
    /// The factors' address and length: the model's own vector.
    factors: Option<(usize, usize)>,
    yarn: Option<Yarn>,
}

/// One position's RoPE angles: `cos` and `sin` of each rotated pair.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeAngles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeParams<'_> {
    /// The angles of position `pos`.
    pub fn angles(&self, pos: usize) -> RopeAngles {
        let (cos, sin) = bulkhead_kernels::scalar::rope_angles_ext(&self.freqs(), pos);
        RopeAngles { cos, sin }
    }

    /// What the angles depend on: equal keys, equal angles at every
    /// position.
    pub fn angles_key(&self) -> RopeAnglesKey {
        RopeAnglesKey {
            rot_dim: self.rot_dim,
            freq_base: self.freq_base.to_bits(),
            freq_scale: self.freq_scale.to_bits(),
            factors: self.factors.map(|f| (f.as_ptr() as usize, f.len())),
            yarn: self.yarn,
        }
    }

    /// The frequencies, as the kernels take them.
    pub fn freqs(&self) -> RopeFreqs<'_> {
        RopeFreqs {
            rot_dim: self.rot_dim,
            freq_base: self.freq_base,
            freq_scale: self.freq_scale,
            factors: self.factors,
            yarn: self.yarn,
        }
    }

    /// Plain RoPE: no per-pair factors, no YaRN (what the device kernels do).
    pub fn is_plain(&self) -> bool {
        self.factors.is_none() && self.yarn.is_none()
    }
}

/// What a backend op returns: nothing, or why the device could not do it.
/// The CPU backend never fails; a device op can run out of memory (its
/// partition's budget), fail, or find the device lost
/// ([`DeviceError::kind`]). Shapes that do not match are the caller's bug
/// and still panic, as slicing does.
pub type OpResult = Result<(), DeviceError>;

/// The engine's compute ops. Activations are row-major f32 on the host.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// A short name for logs ("cpu-avx2", "cpu-scalar").
    fn name(&self) -> String;
    /// `out[t][r] = w[r] · x[t]` for `n_tokens` rows of `x`.
    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) -> OpResult;
    /// As [`Backend::matmul`], but every row of `x` computed exactly as a
    /// one-row `matmul` computes it (some multi-token kernels sum in another
    /// order). Still one pass over the weights for all rows: batched decode.
    fn matmul_per_row(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult;
    /// `out = w · x` for every `(w, out)` of `outs`, all over the same
    /// `n_tokens` rows of `x` (a layer's q, k and v; gate and up), each
    /// computed as [`Backend::matmul`] (or [`Backend::matmul_per_row`] with
    /// `per_row`) computes it. A backend may run them as one job; by default
    /// they are one call each.
    fn matmuls(
        &self,
        x: &[f32],
        n_tokens: usize,
        outs: &mut [(QuantMatrix<'_>, &mut [f32])],
        per_row: bool,
    ) -> OpResult {
        for (w, out) in outs.iter_mut() {
            if per_row {
                self.matmul_per_row(w, x, n_tokens, out)?;
            } else {
                self.matmul(w, x, n_tokens, out)?;
            }
        }
        Ok(())
    }
    /// Row `token` of an embedding table, dequantized into `out`.
    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]) -> OpResult;
    /// RMSNorm of each `weight.len()`-wide row of `x`, scaled by `weight`.
    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> OpResult;
    /// Rotates `heads` heads of one token at position `pos` in place.
    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, params: &RopeParams<'_>) -> OpResult;
    /// [`Backend::rope`] with the position's angles given: `angles` is
    /// what `bulkhead_kernels::scalar::rope_angles_ext` gives for `pos` and
    /// `params` (a pass works them out once per position, not once per
    /// layer). By default they are worked out again.
    fn rope_with(
        &self,
        x: &mut [f32],
        heads: usize,
        pos: usize,
        params: &RopeParams<'_>,
        angles: &RopeAngles,
    ) -> OpResult {
        let _ = angles;
        self.rope(x, heads, pos, params)
    }
    /// Causal attention of `n_tokens` queries over the cache (see [`AttentionShape`]).
    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> OpResult;
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
    ) -> OpResult;
    /// `gate = act(gate) * up`.
    fn gated(&self, act: Activation, gate: &mut [f32], up: &[f32]) -> OpResult;
    /// `x *= c`.
    fn scale(&self, x: &mut [f32], c: f32) -> OpResult;
    /// `a += b`.
    fn add(&self, a: &mut [f32], b: &[f32]) -> OpResult;
    /// The backend that runs whole passes on its device, activations and
    /// KV cache resident there ([`HipBackend::begin_pass`]); `None` for
    /// one whose passes run on the host through these ops.
    fn resident(&self) -> Option<&HipBackend> {
        None
    }
    /// Bytes of `m` repacked into the form this backend's matmuls read
    /// fastest ([`bulkhead_kernels::PackedMatrix::pack_into`], then
    /// `QuantMatrix::with_packed`), or `None` where it has none: asked
    /// once per weight, at load. The CPU backend packs Q4_0, Q5_0, Q8_0,
    /// Q4_K and Q6_K on AVX-512 VNNI.
    fn packed_len(&self, m: &QuantMatrix<'_>) -> Option<usize> {
        let _ = m;
        None
    }
    /// Makes `weight` resident where the ops will read it, so that no
    /// pass after the model's load moves weight bytes. A no-op on the CPU,
    /// whose weights are the mapped file.
    fn preload(&self, weight: WeightRef<'_>) -> OpResult {
        let _ = weight;
        Ok(())
    }
}

/// A weight as the ops take it: a matrix (any type) or an f32 vector (a
/// norm's scale).
#[derive(Clone, Copy, Debug)]
pub enum WeightRef<'a> {
    Matrix(QuantMatrix<'a>),
    Vector(&'a [f32]),
}
