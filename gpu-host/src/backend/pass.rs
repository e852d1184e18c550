//! One forward pass, as the engine writes it once for every backend: a
//! sequence of ops over the activation buffers of a step (every row of
//! every sequence in the call), named by [`Act`]. Where the buffers live is
//! the pass's business: host vectors read by the per-op [`Backend`] ops
//! (the CPU), or device memory that stays there from the token ids in to
//! the logits out (`HipBackend::begin_pass`).
//!
//! [`Backend`]: super::Backend

use bulkhead_kernels::{Activation, QuantMatrix, ScoreMask};

use super::{DeviceError, MoeFfn, OpResult, RopeParams};

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

/// How a pass splits a matmul over its rows: every row of a one-sequence
/// call at once; in a batch, each run of one-row segments (decode steps)
/// as one per-row matmul and each longer segment (a prefill chunk) as its
/// own matmul, so every row is computed exactly as when its sequence runs
/// alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSpan {
    /// First row.
    pub at: usize,
    pub rows: usize,
    /// Each row as a one-row matmul computes it.
    pub per_row: bool,
}

/// The [`MatmulSpan`]s of a pass over `segments`, in row order.
pub fn matmul_spans(segments: &[Segment]) -> Vec<MatmulSpan> {
    if let [only] = segments {
        return vec![MatmulSpan {
            at: 0,
            rows: only.rows,
            per_row: false,
        }];
    }
    let mut spans: Vec<MatmulSpan> = Vec::new();
    let mut at = 0;
    for s in segments {
        match spans.last_mut() {
            Some(last) if last.per_row && s.rows == 1 => last.rows += 1,
            _ => spans.push(MatmulSpan {
                at,
                rows: s.rows,
                per_row: s.rows == 1,
            }),
        }
        at += s.rows;
    }
    spans
}

/// The attention heads of a layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// The layer's sliding window and score cap, if it has them.
    pub mask: ScoreMask,
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
    /// `x *= c` (an embedding scale).
    fn scale(&mut self, x: Act, c: f32) -> OpResult;
    /// RMSNorm of every row of `x` scaled by `weight`, into `out`.
    fn rms_norm(&mut self, x: Act, weight: &[f32], eps: f32, out: Act) -> OpResult;
    /// RMSNorm of each `weight.len()`-wide head of every row of `x`, in
    /// place (query and key norms).
    fn head_norm(&mut self, x: Act, weight: &[f32], eps: f32) -> OpResult;
    /// `out[t] = w · x[t]` for every row.
    fn matmul(&mut self, w: &QuantMatrix<'_>, x: Act, out: Act) -> OpResult;
    /// `out = w · x[t]` for every `(w, out)` of `ws` and every row: the
    /// projections of one input, which a pass may run as one job. By
    /// default one [`ForwardPass::matmul`] each.
    fn matmuls(&mut self, x: Act, ws: &[(&QuantMatrix<'_>, Act)]) -> OpResult {
        for &(w, out) in ws {
            self.matmul(w, x, out)?;
        }
        Ok(())
    }
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
    /// `gate = act(gate) * up`.
    fn gated(&mut self, act: Activation, gate: Act, up: Act) -> OpResult;
    /// `out` = the mixture-of-experts FFN of every row of `x`: each row
    /// through its routed experts only (an expert's weights are read for
    /// the rows routed to it, and not at all when none is).
    fn moe_ffn(&mut self, moe: &MoeFfn<'_>, x: Act, out: Act) -> OpResult;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(rows: usize) -> Segment {
        Segment { rows, start_pos: 0 }
    }

    fn span(at: usize, rows: usize, per_row: bool) -> MatmulSpan {
        MatmulSpan { at, rows, per_row }
    }

    #[test]
    fn decode_runs_are_per_row_and_prefill_chunks_their_own_matmul() {
        // One sequence: one matmul, a single row included.
        assert_eq!(matmul_spans(&[seg(5)]), [span(0, 5, false)]);
        assert_eq!(matmul_spans(&[seg(1)]), [span(0, 1, false)]);
        // Decode rows first (as the batcher orders them), then a chunk.
        assert_eq!(
            matmul_spans(&[seg(1), seg(1), seg(1), seg(4)]),
            [span(0, 3, true), span(3, 4, false)]
        );
        // Runs split by a chunk stay apart; chunks never merge.
        assert_eq!(
            matmul_spans(&[seg(1), seg(2), seg(1), seg(3), seg(3)]),
            [
                span(0, 1, true),
                span(1, 2, false),
                span(3, 1, true),
                span(4, 3, false),
                span(7, 3, false)
            ]
        );
    }
}
