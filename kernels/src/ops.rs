//! The per-row ops the forward pass calls directly, dispatched to AVX2 when
//! the CPU has it and to the scalar reference otherwise.
#![forbid(unsafe_code)]

use crate::avx2::Avx2;
use crate::scalar;

/// How RoPE pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Llama: rotate adjacent pairs `(x[2i], x[2i+1])`.
    Normal,
    /// GPT-NeoX / Qwen2: rotate `(x[i], x[i + rot_dim/2])`.
    Neox,
}

/// `out = x / sqrt(mean(x²) + eps) * weight` for one row.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    match Avx2::detect() {
        Some(k) => k.rms_norm(x, weight, eps, out),
        None => scalar::rms_norm(x, weight, eps, out),
    }
}

/// Rotary position embedding of one token's heads, in place; see
/// [`scalar::rope`]. The angles are computed once per call (in f64, shared by
/// every head); the rotation runs on AVX2 when available.
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
    scalar::check_rope_shape(x.len(), n_heads, head_dim, rot_dim);
    let (cos, sin) = scalar::rope_angles(rot_dim, pos, freq_base, freq_scale);
    match Avx2::detect() {
        Some(k) => k.rope_rotate(x, head_dim, &cos, &sin, style),
        None => scalar::rope_rotate(x, head_dim, &cos, &sin, style),
    }
}

/// In-place softmax of one row.
pub fn softmax(x: &mut [f32]) {
    match Avx2::detect() {
        Some(k) => k.softmax(x),
        None => scalar::softmax(x),
    }
}

/// `gate = silu(gate) * up` (the SwiGLU feed-forward's activation).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    match Avx2::detect() {
        Some(k) => k.silu_mul(gate, up),
        None => scalar::silu_mul(gate, up),
    }
}

/// `a += b` (residual connections).
pub fn add(a: &mut [f32], b: &[f32]) {
    match Avx2::detect() {
        Some(k) => k.add(a, b),
        None => scalar::add(a, b),
    }
}
