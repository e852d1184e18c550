//! Element-wise and per-row ops: the reference versions.

use crate::RopeStyle;

/// `Σ a[i] b[i]` in f32.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `y += a * x`.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, the mean accumulated in f64 as
/// ggml does.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == weight.len() && x.len() == out.len(),
        "rms_norm: x, weight and out lengths differ"
    );
    if x.is_empty() {
        return;
    }
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// In-place softmax of one row: `exp(x - max) / Σ exp(x - max)`.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `a += b`.
pub fn add(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: length mismatch");
    for (a, &b) in a.iter_mut().zip(b) {
        *a += b;
    }
}

/// Rotary position embedding of one token's `n_heads` heads, in place.
///
/// Pair `i` (of `rot_dim / 2`) turns by `pos · freq_scale · base^(-2i/rot_dim)`,
/// computed in f64 so the angle is exact to f32 precision at any position;
/// dimensions past `rot_dim` are left alone. `Normal` rotates adjacent pairs
/// `(x[2i], x[2i+1])` (llama); `Neox` rotates `(x[i], x[i + rot_dim/2])` (qwen2).
#[allow(clippy::too_many_arguments)] // mirrors ggml_rope's parameter list
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
    style: RopeStyle,
) {
    check_rope_shape(x.len(), n_heads, head_dim, rot_dim);
    let (cos, sin) = rope_angles(rot_dim, pos, freq_base, freq_scale);
    rope_rotate(x, head_dim, &cos, &sin, style);
}

/// Panics unless `x_len` is `n_heads` heads of `head_dim` and `rot_dim` is an
/// even number of dimensions within a head (shapes come from validated model
/// hyperparameters, so a mismatch is a caller bug).
pub(crate) fn check_rope_shape(x_len: usize, n_heads: usize, head_dim: usize, rot_dim: usize) {
    assert_eq!(
        x_len,
        n_heads * head_dim,
        "rope: x is not n_heads × head_dim"
    );
    assert!(
        rot_dim <= head_dim && rot_dim.is_multiple_of(2),
        "rope: rot_dim {rot_dim} must be even and at most head_dim {head_dim}"
    );
}

/// The `rot_dim / 2` rotation angles of position `pos` as (cos, sin) tables:
/// `theta_i = pos · freq_scale · freq_base^(-2i / rot_dim)`, computed in f64.
pub fn rope_angles(
    rot_dim: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    (0..rot_dim / 2)
        .map(|i| {
            let theta = pos as f64
                * f64::from(freq_scale)
                * f64::from(freq_base).powf(-2.0 * i as f64 / rot_dim as f64);
            (theta.cos() as f32, theta.sin() as f32)
        })
        .unzip()
}

/// Rotates the first `2 · cos.len()` dimensions of every `head_dim`-wide head
/// of `x` by the given angles; the rest of each head is left as it is.
pub fn rope_rotate(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, (&cos, &sin)) in cos.iter().zip(sin).enumerate() {
            let (a, b) = match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}
