//! One forward pass, as the engine writes it once for every backend: a
//! sequence of ops over the activation buffers of a step (every row of
//! every sequence in the call), named by [`Act`]. Where the buffers live is
//! the pass's business: host vectors read by the per-op [`Backend`] ops
//! (the CPU), or device memory that stays there from the token ids in to
//! the logits out (`HipBackend::begin_pass`).
//!
//! [`Backend`]: super::Backend

use bulkhead_kernels::QuantMatrix;

use super::{DeviceError, OpResult, RopeParams};

/// The activation buffers of a pass, each `rows × width` f32s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// The residual stream.
    X,
    /// Its normalized copy, the input of the projections.
    Xn,
    Q,
    K,
    V,
    /// Attention output.
    Attn,
    /// A projection back to the residual width.
    Proj,
    Gate,
    Up,
}

impl Act {
    pub const ALL: [Act; 9] = [
        Act::X,
        Act::Xn,
        Act::Q,
        Act::K,
        Act::V,
        Act::Attn,
        Act::Proj,
        Act::Gate,
        Act::Up,
    ];

    /// Its index in [`Act::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Floats per row.
    pub fn width(self, s: &PassShape) -> usize {
        match self {
            Act::X | Act::Xn | Act::Proj => s.embedding,
            Act::Q | Act::Attn => s.q,
            Act::K | Act::V => s.kv,
            Act::Gate | Act::Up => s.ffn,
        }
    }
}

/// A model's widths, as a pass sizes its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassShape {
    pub layers: usize,
    pub embedding: usize,
    /// Query width (heads × head_dim).
    pub q: usize,
    /// Key and value width (kv_heads × head_dim).
    pub kv: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Positions a sequence may reach.
    pub context: usize,
}

/// Consecutive rows of one forward call that belong to one sequence.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub rows: usize,
    /// Cache position of the first row.
    pub start_pos: usize,
}

/// The attention heads of a model.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// The ops of a forward pass over its [`Act`] buffers. The rows are the
/// step's (which sequences, at which positions, which rows want logits:
/// fixed when the pass begins); every op covers all of them.
///
/// Row independence: whatever else shares a pass, a sequence's rows come
/// out as when it runs alone with the same chunking. Matmuls of decode rows
/// compute each row as a one-row matmul; a prefill chunk is its own matmul.
pub trait ForwardPass {
    /// Row `r` of `out` = the embedding of the step's token `r`.
    fn embed(&mut self, table: &QuantMatrix<'_>, out: Act) -> OpResult;
    /// RMSNorm of every row of `x` scaled by `weight`, into `out`.
    fn rms_norm(&mut self, x: Act, weight: &[f32], eps: f32, out: Act) -> OpResult;
    /// `out[t] = w · x[t]` for every row.
    fn matmul(&mut self, w: &QuantMatrix<'_>, x: Act, out: Act) -> OpResult;
    /// `bias` added to every row of `x`.
    fn add_bias(&mut self, x: Act, bias: &[f32]) -> OpResult;
    /// Rotates `heads` heads of every row at its position.
    fn rope(&mut self, x: Act, heads: usize, params: &RopeParams) -> OpResult;
    /// Writes every row's key and value for `layer` at its position.
    fn store_kv(&mut self, layer: usize, k: Act, v: Act) -> OpResult;
    /// Causal attention of every row over its sequence's cache, into `out`.
    fn attend(&mut self, layer: usize, q: Act, heads: Heads, out: Act) -> OpResult;
    /// `a += b`.
    fn add(&mut self, a: Act, b: Act) -> OpResult;
    /// `gate = silu(gate) * up`.
    fn silu_mul(&mut self, gate: Act, up: Act) -> OpResult;
    /// The logits of the rows that want them (in row order), from the
    /// final norm and the output projection: the only floats a pass hands
    /// back.
    fn logits(
        &mut self,
        x: Act,
        norm: &[f32],
        eps: f32,
        output: &QuantMatrix<'_>,
    ) -> Result<Vec<f32>, DeviceError>;
}
