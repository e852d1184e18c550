//! Activation quantization to Q8_0 with AVX2, the same function as
//! `quantize::quantize_row_q8_0` (ggml's reference): every quant and scale
//! is bit-identical to it.
//!
//! Why: the scalar version builds for the baseline x86-64 target (SSE2), so
//! its rounding is a saturating float-to-int cast with compares and moves
//! per element; a batched decode step quantizes every matmul's input of
//! every row, and it was ~5% of a 16-sequence step (perf, VNNI kernels).

use std::arch::x86_64::*;

use super::simd::load_f32x8;
use crate::quantize::BlockQ8_0;

/// The largest `|x|` of 32 values; a NaN is skipped, as `f32::max` skips it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs_max(x: &[f32; 32]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for x in x.as_chunks::<8>().0 {
        let a = _mm256_andnot_ps(sign, load_f32x8(x));
        // maxps returns its second operand when either is NaN: `m` never is.
        m = _mm256_max_ps(a, m);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// `round(x)` (half away from zero) clamped to the i8 range, NaN to 0, as
/// the scalar `round_to_i8`: truncation, then ±1 where the exact remainder
/// is at least one half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_clamp(x: __m256) -> __m256i {
    let one = _mm256_set1_ps(1.0);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm256_sub_ps(x, t);
    let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)), one);
    let down = _mm256_and_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(frac, _mm256_set1_ps(-0.5)), one);
    let r = _mm256_sub_ps(_mm256_add_ps(t, up), down);
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(x, x));
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvtps_epi32(r)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    let (blocks, _) = x.as_chunks::<32>();
    for (xb, yb) in blocks.iter().zip(out) {
        // The scalar code's f32 operations, in its order.
        let d = abs_max(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = half::f16::from_f32(d).to_f32();
        let idv = _mm256_set1_ps(id);
        let (x8, _) = xb.as_chunks::<8>();
        let q = |i: usize| round_clamp(_mm256_mul_ps(load_f32x8(&x8[i]), idv));
        let ab = _mm256_packs_epi32(q(0), q(1));
        let cd = _mm256_packs_epi32(q(2), q(3));
        // packs works within 128-bit lanes: dwords come out a0 b0 c0 d0 a1 b1 c1 d1.
        let abcd = _mm256_packs_epi16(ab, cd);
        let v = _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `yb.qs` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), v) }
    }
}
