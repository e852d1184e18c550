//! Element-wise and per-row ops: the reference versions.

use crate::{RopeFreqs, RopeStyle};

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

/// `gate = gelu(gate) * up` with the tanh approximation of GELU (PyTorch's
/// `gelu(approximate="tanh")`, Gemma's `gelu_pytorch_tanh`):
/// `0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³)))`.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gelu_tanh_mul: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh(*g) * u;
    }
}

/// √(2/π), as PyTorch spells it (`M_SQRT2 * M_2_SQRTPI * 0.5`).
pub(crate) const GELU_BETA: f32 =
    (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
/// The cubic term's weight in the tanh approximation.
pub(crate) const GELU_KAPPA: f32 = 0.044715;

fn gelu_tanh(x: f32) -> f32 {
    let inner = GELU_BETA * (x + GELU_KAPPA * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// `cap · tanh(x / cap)`: Gemma 2's soft cap of attention scores and logits.
pub fn softcap(x: f32, cap: f32) -> f32 {
    (x / cap).tanh() * cap
}

/// `x *= c` for every element (exact per element on every ISA).
pub fn scale(x: &mut [f32], c: f32) {
    for v in x {
        *v *= c;
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

/// The `rot_dim / 2` (cos, sin) pairs of position `pos` under `freqs`.
/// Plain RoPE is [`rope_angles`] exactly. Per-pair factors divide the
/// angle (llama.cpp's `rope_freqs`: Llama 3.1 scaling). YaRN (as ggml's
/// `rope_yarn` and transformers' `_compute_yarn_parameters`) blends the
/// interpolated angle `freq_scale · θ` with the original `θ` over the
/// pairs between the correction dimensions of `beta_fast` and
/// `beta_slow`, and scales cos and sin by its attention factor.
pub fn rope_angles_ext(freqs: &RopeFreqs<'_>, pos: usize) -> (Vec<f32>, Vec<f32>) {
    let RopeFreqs {
        rot_dim,
        freq_base,
        freq_scale,
        factors,
        yarn,
    } = *freqs;
    if factors.is_none() && yarn.is_none() {
        return rope_angles(rot_dim, pos, freq_base, freq_scale);
    }
    if let Some(f) = factors {
        assert_eq!(f.len(), rot_dim / 2, "rope: a factor per rotated pair");
    }
    let base = f64::from(freq_base);
    let scale = f64::from(freq_scale);
    let ramp = yarn.map(|y| (y.correction_dims(rot_dim, freq_base), y));
    let mscale = yarn.map_or(1.0, |y| f64::from(y.attn_factor));
    (0..rot_dim / 2)
        .map(|i| {
            let factor = factors.map_or(1.0, |f| f64::from(f[i]));
            let extrap = pos as f64 * base.powf(-2.0 * i as f64 / rot_dim as f64) / factor;
            let interp = scale * extrap;
            let theta = match ramp {
                None => interp,
                Some(((low, high), y)) => {
                    let t = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                    let mix = (1.0 - t) * f64::from(y.ext_factor);
                    interp * (1.0 - mix) + extrap * mix
                }
            };
            ((theta.cos() * mscale) as f32, (theta.sin() * mscale) as f32)
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
