//! One Q8_0 or Q4_0 weight row against up to eight token rows with AVX-512
//! VNNI on 256-bit vectors (`vpdpbusd`, AVX512VL): batched decode and
//! prefill on CPUs that have it (Zen 4, Ice Lake and later Xeons).
//!
//! Why it is faster than `dot_tokens`: there, each (block, token) costs a
//! sign transfer, `maddubs` and `madd` for the integer dot. Here the
//! activations come offset by +128 as unsigned bytes (`BlockQ8_0U`, made
//! once per matmul), so one `vpdpbusd` of the raw signed weight quants gives
//! `Σ (y + 128) q`; starting it from the weight-side bias `-128 Σ q` (two
//! instructions per weight block, shared by every token) leaves exactly
//! `Σ y q`. AVX512VL also brings 32 vector registers, which is what lets
//! eight tokens keep their two accumulators each in registers.
//!
//! **Every result is bit-identical to `dot::q8_0` / `dot::q4_0` for the same
//! token**: the integer lanes are the same exact sums of four products
//! (`vpdpbusd` does not saturate; `maddubs` cannot here, see below), the scale
//! is the same f32 product `d_w · d_y`, and blocks alternate between two
//! accumulators that are added and reduced as the one-row kernels do. This
//! holds for activations from `quantize_row_q8_0` (|y| ≤ 127, so the
//! one-row kernels' sign transfer and `maddubs` are exact too).

use std::arch::x86_64::*;

use super::dot::{arr, nibbles};
use super::dot_tokens::block_of;
use super::simd::*;
use crate::blocks::*;
use crate::quantize::BlockQ8_0U;

/// The unpacked weight block: signed quants, their bias `-128 Σ₄ q` per
/// i32 lane, and the scale as eight f32.
struct Unpacked {
    q: __m256i,
    bias: __m256i,
    d: __m256,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn with_bias(q: __m256i, d: __m256) -> Unpacked {
    // vpdpbusd(0, 0x80 bytes, q): 128 · (sum of each four quants), exact.
    let sum128 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), q);
    Unpacked {
        q,
        bias: _mm256_sub_epi32(_mm256_setzero_si256(), sum128),
        d,
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn q8_0_unpack(b: &[u8; Q8_0_BYTES]) -> Unpacked {
    with_bias(load_u8x32(arr(&b[2..])), f16_splat(b[0], b[1]))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn q4_0_unpack(b: &[u8; Q4_0_BYTES]) -> Unpacked {
    let q = _mm256_sub_epi8(nibbles(arr(&b[2..])), _mm256_set1_epi8(8));
    with_bias(q, f16_splat(b[0], b[1]))
}

/// Adds one block's `Σ q y · d_w d_y` into each token's accumulator.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn block_tokens<const N: usize>(acc: &mut [__m256; N], w: &Unpacked, ys: [&BlockQ8_0U; N]) {
    for t in 0..N {
        let y = ys[t];
        // Σ (y + 128) q - 128 Σ q = Σ y q, per four elements, as `dot_i8_i8`.
        let p = _mm256_dpbusd_epi32(w.bias, load_u8x32(&y.qs), w.q);
        // The same f32 product as `f16_splat_mul(d_w, y.d)`.
        let d = _mm256_mul_ps(w.d, _mm256_set1_ps(y.d));
        acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
    }
}

/// As `dot::two_accumulators` for `N` tokens: even blocks into one
/// accumulator per token, odd blocks into another, a trailing block into the
/// first; the two added, then reduced.
macro_rules! two_accumulators_vnni {
    ($w:expr, $x:expr, $bytes:expr, $unpack:ident) => {{
        let (blocks, _) = $w.as_chunks::<{ $bytes }>();
        let (pairs, rest) = blocks.as_chunks::<2>();
        let mut acc0 = [_mm256_setzero_ps(); N];
        let mut acc1 = [_mm256_setzero_ps(); N];
        for (i, b) in pairs.iter().enumerate() {
            block_tokens(&mut acc0, &$unpack(&b[0]), block_of($x, 2 * i));
            block_tokens(&mut acc1, &$unpack(&b[1]), block_of($x, 2 * i + 1));
        }
        if let Some(b) = rest.first() {
            block_tokens(&mut acc0, &$unpack(b), block_of($x, 2 * pairs.len()));
        }
        let mut out = [0.0f32; N];
        for t in 0..N {
            out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
        }
        out
    }};
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn q8_0_rows<const N: usize>(w: &[u8], x: [&[BlockQ8_0U]; N]) -> [f32; N] {
    two_accumulators_vnni!(w, x, Q8_0_BYTES, q8_0_unpack)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn q4_0_rows<const N: usize>(w: &[u8], x: [&[BlockQ8_0U]; N]) -> [f32; N] {
    two_accumulators_vnni!(w, x, Q4_0_BYTES, q4_0_unpack)
}
