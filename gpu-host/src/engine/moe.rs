//! The mixture-of-experts FFN on the host: routing (softmax over the
//! router's logits, the top `k` experts, their weights renormalized, as
//! llama.cpp's `build_moe_ffn` runs Mixtral and Qwen3-MoE and as
//! transformers' `MixtralSparseMoeBlock` computes it) and the experts'
//! matmuls on the [`Backend`]'s ops.
//!
//! An expert's matmuls take exactly the rows routed to it; an expert no
//! row chose is not read. Row independence (a sequence's rows are the
//! same bits whatever shares the pass) holds as for the dense FFN: the
//! rows are split into the same [`matmul_spans`] (a prefill chunk alone,
//! a run of decode rows each as a one-row matmul), routing is per row,
//! the gate's activation runs per row, and each row's outputs are summed in expert
//! order.

use crate::backend::{Backend, MoeFfn, OpResult, Segment, matmul_spans};
use bulkhead_kernels::Activation;

/// The experts a row goes to and their weights, in expert order.
pub(super) type Route = Vec<(usize, f32)>;

/// Routes one row: `softmax(logits)`, the `k` largest (ties to the lower
/// expert), their probabilities divided by their sum.
pub(super) fn route(logits: &[f32], k: usize) -> Route {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // A stable sort on the probability: equal ones keep expert order.
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]));
    order.truncate(k);
    order.sort_unstable();
    let probs: Vec<f32> = order.iter().map(|&e| exp[e] / sum).collect();
    let total: f32 = probs.iter().sum();
    order
        .into_iter()
        .zip(probs.into_iter().map(|p| p / total))
        .collect()
}

/// `out = moe(x)` for every row of `segments` (`x` rows of the embedding
/// width, `out` the same shape).
pub(super) fn moe_ffn(
    backend: &dyn Backend,
    segments: &[Segment],
    moe: &MoeFfn<'_>,
    x: &[f32],
    out: &mut [f32],
) -> OpResult {
    let d = moe.router.cols;
    for span in matmul_spans(segments) {
        let rows = span.at..span.at + span.rows;
        span_ffn(
            backend,
            moe,
            &x[rows.start * d..rows.end * d],
            span.per_row,
            &mut out[rows.start * d..rows.end * d],
        )?;
    }
    Ok(())
}

/// `out = w · x` for `n` rows, each row as a one-row matmul when `per_row`.
fn matmul(
    backend: &dyn Backend,
    w: &bulkhead_kernels::QuantMatrix<'_>,
    x: &[f32],
    n: usize,
    per_row: bool,
    out: &mut [f32],
) -> OpResult {
    if per_row {
        backend.matmul_per_row(w, x, n, out)
    } else {
        backend.matmul(w, x, n, out)
    }
}

/// The FFN of one span's rows.
fn span_ffn(
    backend: &dyn Backend,
    moe: &MoeFfn<'_>,
    x: &[f32],
    per_row: bool,
    out: &mut [f32],
) -> OpResult {
    let d = moe.router.cols;
    let n = x.len() / d;
    let experts = moe.router.rows;
    let mut logits = vec![0.0f32; n * experts];
    matmul(backend, &moe.router, x, n, per_row, &mut logits)?;
    let routes: Vec<Route> = logits
        .chunks_exact(experts)
        .map(|l| route(l, moe.experts_used))
        .collect();
    out.fill(0.0);
    let ff = moe.gate.rows;
    for e in 0..experts {
        // The rows routed to `e`, in row order, with their weights.
        let chosen: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(r, route)| route.iter().find(|(x, _)| *x == e).map(|&(_, w)| (r, w)))
            .collect();
        if chosen.is_empty() {
            continue;
        }
        let m = chosen.len();
        let mut xe = Vec::with_capacity(m * d);
        for &(r, _) in &chosen {
            xe.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut gate = vec![0.0f32; m * ff];
        let mut up = vec![0.0f32; m * ff];
        matmul(backend, &moe.gate.expert(e), &xe, m, per_row, &mut gate)?;
        matmul(backend, &moe.up.expert(e), &xe, m, per_row, &mut up)?;
        for (g, u) in gate.chunks_exact_mut(ff).zip(up.chunks_exact(ff)) {
            backend.gated(Activation::Silu, g, u)?;
        }
        let mut down = vec![0.0f32; m * d];
        matmul(backend, &moe.down.expert(e), &gate, m, per_row, &mut down)?;
        for (&(r, w), y) in chosen.iter().zip(down.chunks_exact(d)) {
            for (o, &y) in out[r * d..(r + 1) * d].iter_mut().zip(y) {
                *o += w * y;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
