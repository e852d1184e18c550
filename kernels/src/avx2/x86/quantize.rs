//! Activation quantization to Q8_0 and Q8_K with AVX2, the same functions
//! as `quantize::quantize_row_q8_0` and `quantize_row_q8_k` (ggml's
//! references): every quant, block sum and scale is bit-identical to them.
//!
//! Why: the scalar versions build for the baseline x86-64 target (SSE2), so
//! Q8_0's rounding is a saturating float-to-int cast with compares and
//! moves per element, and Q8_K's round-to-even is a libm `rintf` call per
//! element. A batched decode step quantizes every matmul's input of every
//! row (Q8_0 was ~5% of a 16-sequence step); Q8_K was a third of a Q4_K_M
//! prefill (perf: `quantize_row_q8_k` 14%, `rintf` 18%).

use std::arch::x86_64::*;

use super::simd::{hsum_epi32, load_f32x8};
use crate::quantize::{BlockQ8_0, BlockQ8K};

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

/// Round to nearest, ties to even, NaN to 0, clamped to the i8 range, as
/// the scalar `(x.round_ties_even() as i32).min(127) as i8` for every `x`
/// Q8_K scaling can give (|x| ≤ 127 up to rounding, or NaN).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_even_clamp(x: __m256) -> __m256i {
    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(x, x));
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvtps_epi32(r)
}

/// The first value of `x` whose magnitude is `amax`, as the scalar loop
/// (`|v| > amax` keeps the first) picks it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn first_of_magnitude(x: &[f32; 256], amax: f32) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let want = _mm256_set1_ps(amax);
    for (i, x8) in x.as_chunks::<8>().0.iter().enumerate() {
        let a = _mm256_andnot_ps(sign, load_f32x8(x8));
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, want));
        if hit != 0 {
            return x[8 * i + hit.trailing_zeros() as usize];
        }
    }
    unreachable!("amax is the magnitude of one of the values")
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    let (blocks, _) = x.as_chunks::<256>();
    for (xb, yb) in blocks.iter().zip(out) {
        let (x32, _) = xb.as_chunks::<32>();
        let amax = x32.iter().fold(0.0f32, |m, c| m.max(abs_max(c)));
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / first_of_magnitude(xb, amax);
        let iv = _mm256_set1_ps(iscale);
        for (g, x32) in x32.iter().enumerate() {
            let (x8, _) = x32.as_chunks::<8>();
            let q = |i: usize| round_even_clamp(_mm256_mul_ps(load_f32x8(&x8[i]), iv));
            let (a, b, c, d) = (q(0), q(1), q(2), q(3));
            // Each 16 quants' sum fits i16 (|q| ≤ 128).
            yb.bsums[2 * g] = hsum_epi32(_mm256_add_epi32(a, b)) as i16;
            yb.bsums[2 * g + 1] = hsum_epi32(_mm256_add_epi32(c, d)) as i16;
            let ab = _mm256_packs_epi32(a, b);
            let cd = _mm256_packs_epi32(c, d);
            let abcd = _mm256_packs_epi16(ab, cd);
            let v = _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: `yb.qs[32g..32g + 32]` is 32 writable bytes; storeu
            // has no alignment requirement.
            unsafe { _mm256_storeu_si256(yb.qs[32 * g..].as_mut_ptr().cast(), v) }
        }
        yb.d = 1.0 / iscale;
    }
}
