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

/// The angles RoPE turns a head's pairs by: the frequencies of plain RoPE
/// (`freq_scale · freq_base^(-2i/rot_dim)` per position) and, for models
/// trained with context extension, per-pair factors or YaRN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeFreqs<'a> {
    /// Dimensions of each head that turn (even, at most the head size).
    pub rot_dim: usize,
    pub freq_base: f32,
    /// 1 / the linear (or YaRN) scaling factor.
    pub freq_scale: f32,
    /// `rot_dim / 2` divisors of the angles (llama.cpp's `rope_freqs`
    /// tensor, which Llama 3.1's scaling is converted to).
    pub factors: Option<&'a [f32]>,
    pub yarn: Option<Yarn>,
}

/// YaRN context extension ("YaRN: Efficient Context Window Extension of
/// Large Language Models"), with ggml's parameter names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained on before extension.
    pub orig_ctx: usize,
    /// How much of the original angle the fast-turning pairs keep (1: all).
    pub ext_factor: f32,
    /// Turns over `orig_ctx` above which a pair keeps its original angle.
    pub beta_fast: f32,
    /// Turns below which a pair is fully interpolated.
    pub beta_slow: f32,
    /// Scale of cos and sin (so of every attention score, squared).
    pub attn_factor: f32,
}

impl Yarn {
    /// The pair indices where the blend starts and ends (ggml's
    /// `ggml_rope_yarn_corr_dims`; transformers' `find_correction_range`).
    pub fn correction_dims(&self, rot_dim: usize, freq_base: f32) -> (f64, f64) {
        let dim = |turns: f32| {
            let turns = f64::from(turns);
            rot_dim as f64 * (self.orig_ctx as f64 / (turns * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * f64::from(freq_base).ln())
        };
        let low = dim(self.beta_fast).floor().max(0.0);
        let high = dim(self.beta_slow).ceil().min(rot_dim as f64 - 1.0);
        (low, high)
    }
}

/// The gated feed-forward's activation: `gate = act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen, Phi-3.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    GeluTanh,
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

/// RoPE of one token's heads under `freqs` (plain, per-pair factors or
/// YaRN); see [`scalar::rope_angles_ext`]. Plain frequencies give exactly
/// [`rope`]'s result.
pub fn rope_ext(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    freqs: &RopeFreqs<'_>,
    style: RopeStyle,
) {
    scalar::check_rope_shape(x.len(), n_heads, head_dim, freqs.rot_dim);
    let (cos, sin) = scalar::rope_angles_ext(freqs, pos);
    match Avx2::detect() {
        Some(k) => k.rope_rotate(x, head_dim, &cos, &sin, style),
        None => scalar::rope_rotate(x, head_dim, &cos, &sin, style),
    }
}

/// Rotates every `head_dim`-wide head of `x` by the angles in `cos` and
/// `sin` (one per rotated pair, as [`scalar::rope_angles_ext`] gives):
/// [`rope_ext`] with the angles worked out beforehand.
pub fn rope_rotate(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: RopeStyle) {
    match Avx2::detect() {
        Some(k) => k.rope_rotate(x, head_dim, cos, sin, style),
        None => scalar::rope_rotate(x, head_dim, cos, sin, style),
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

/// `gate = act(gate) * up`.
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => silu_mul(gate, up),
        Activation::GeluTanh => match Avx2::detect() {
            Some(k) => k.gelu_tanh_mul(gate, up),
            None => scalar::gelu_tanh_mul(gate, up),
        },
    }
}

/// `x *= c` (an embedding's scale): one multiply per element, the same
/// bits on every ISA, so it needs no fast path.
pub fn scale(x: &mut [f32], c: f32) {
    scalar::scale(x, c)
}

/// `a += b` (residual connections).
pub fn add(a: &mut [f32], b: &[f32]) {
    match Avx2::detect() {
        Some(k) => k.add(a, b),
        None => scalar::add(a, b),
    }
}
