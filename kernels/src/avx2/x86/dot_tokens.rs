//! One weight row against up to `N` token rows at once (prefill). Each weight
//! block is loaded and unpacked once and dotted with every token's
//! activations, one accumulator per token; `N` separate row dots would unpack
//! it `N` times.
//!
//! Q4_0, Q8_0 and Q4_K keep the single-row kernels' accumulation order per
//! token, so their results equal `dot::*` bit for bit; Q6_K (its offset
//! spread over other i32 lanes) and F16 (one accumulator, not four) differ
//! by float re-association only.

use std::arch::x86_64::*;

use super::dot::{arr, dot_u8_i8, high, nibbles};
use super::simd::*;
use crate::blocks::*;
use crate::quantize::{BlockQ8_0, BlockQ8K};

/// Adds one 32-element block's `Σ q y` (q: signed weight quants, shared by
/// all tokens) times `d_w d_y` into each token's accumulator. `|q|` is taken
/// once; only the sign transfer onto `y` is per token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8_block_tokens<const N: usize>(
    acc: &mut [__m256; N],
    q: __m256i,
    d_w: __m256,
    ys: [&BlockQ8_0; N],
) {
    let q_abs = _mm256_sign_epi8(q, q);
    for t in 0..N {
        let y = ys[t];
        let p = dot_u8_i8(q_abs, _mm256_sign_epi8(load_i8x32(&y.qs), q));
        // Same product as `d_w * y.d` in f32: the scale stays off the
        // accumulator's dependency chain (see `simd::f16_splat`).
        let d = _mm256_mul_ps(d_w, _mm256_set1_ps(y.d));
        acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
    }
}

/// Block `i` of every token. A plain loop: `array::map` here stayed a call
/// per weight block (`try_map`, ~1% of a batched decode step in perf).
#[inline(always)]
pub(super) fn block_of<T, const N: usize>(x: [&[T]; N], i: usize) -> [&T; N] {
    let mut ys = [&x[0][i]; N];
    for (y, x) in ys.iter_mut().zip(x).skip(1) {
        *y = &x[i];
    }
    ys
}

/// As `dot::two_accumulators` for `N` tokens: blocks alternate between two
/// accumulators per token, `unpack(block)` giving the signed quants.
macro_rules! two_accumulators_tokens {
    ($w:expr, $x:expr, $bytes:expr, $unpack:ident) => {{
        let (blocks, _) = $w.as_chunks::<{ $bytes }>();
        let (pairs, rest) = blocks.as_chunks::<2>();
        let mut acc0 = [_mm256_setzero_ps(); N];
        let mut acc1 = [_mm256_setzero_ps(); N];
        for (i, b) in pairs.iter().enumerate() {
            let (q0, d0) = $unpack(&b[0]);
            i8_block_tokens(&mut acc0, q0, d0, block_of($x, 2 * i));
            let (q1, d1) = $unpack(&b[1]);
            i8_block_tokens(&mut acc1, q1, d1, block_of($x, 2 * i + 1));
        }
        if let Some(b) = rest.first() {
            let (q, d) = $unpack(b);
            i8_block_tokens(&mut acc0, q, d, block_of($x, 2 * pairs.len()));
        }
        let mut out = [0.0f32; N];
        for t in 0..N {
            out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
        }
        out
    }};
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_unpack(b: &[u8; Q8_0_BYTES]) -> (__m256i, __m256) {
    (load_u8x32(arr(&b[2..])), f16_splat(b[0], b[1]))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_unpack(b: &[u8; Q4_0_BYTES]) -> (__m256i, __m256) {
    let q = _mm256_sub_epi8(nibbles(arr(&b[2..])), _mm256_set1_epi8(8));
    (q, f16_splat(b[0], b[1]))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q8_0_rows<const N: usize>(w: &[u8], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    two_accumulators_tokens!(w, x, Q8_0_BYTES, q8_0_unpack)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_0_rows<const N: usize>(w: &[u8], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    two_accumulators_tokens!(w, x, Q4_0_BYTES, q4_0_unpack)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4k_rows<const N: usize>(w: &[u8], x: [&[BlockQ8K]; N]) -> [f32; N] {
    let (blocks, _) = w.as_chunks::<Q4K_BYTES>();
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [0.0f32; N];
    for (i, b) in blocks.iter().enumerate() {
        let ys = block_of(x, i);
        let (sc, m) = scales_mins_k4(&b[4..16]);
        // mins[g / 2] for the 16 bsums groups g, so one `madd` per token
        // gives the (exact) integer min term `min_sum(bsums, m)`.
        let m8 = _mm_cvtepu8_epi16(_mm_set_epi64x(0, u64::from_le_bytes(m) as i64));
        let mins16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
        let (qs, _) = b[16..].as_chunks::<32>();
        let mut isum = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            let q = load_u8x32(&qs[j]);
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
            let sc_lo = _mm256_set1_epi16(i16::from(sc[2 * j]));
            let sc_hi = _mm256_set1_epi16(i16::from(sc[2 * j + 1]));
            for t in 0..N {
                let (yq, _) = ys[t].qs.as_chunks::<32>();
                let plo = _mm256_maddubs_epi16(lo, load_i8x32(&yq[2 * j]));
                let phi = _mm256_maddubs_epi16(hi, load_i8x32(&yq[2 * j + 1]));
                let slo = _mm256_madd_epi16(plo, sc_lo);
                let shi = _mm256_madd_epi16(phi, sc_hi);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(slo, shi));
            }
        }
        let (d, dmin) = (f16_to_f32(b[0], b[1]), f16_to_f32(b[2], b[3]));
        for t in 0..N {
            let y = ys[t];
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            let msum = hsum_epi32(_mm256_madd_epi16(load_i16x16(&y.bsums), mins16));
            mins[t] += dmin * y.d * msum as f32;
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum_ps(acc[t]) - mins[t];
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_rows<const N: usize>(w: &[u8], x: [&[BlockQ8K]; N]) -> [f32; N] {
    let (blocks, _) = w.as_chunks::<Q6K_BYTES>();
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, b) in blocks.iter().enumerate() {
        let ys = block_of(x, i);
        let (ql, _) = b[..128].as_chunks::<32>();
        let (qh, _) = b[128..192].as_chunks::<32>();
        let sc = &b[192..208];
        // The quants are stored +32: Σ sc (q - 32) y = Σ sc q y - 32 Σ_g sc_g
        // bsums_g, the second sum one `madd` per token on the activations'
        // 16-element sums (all exact in i32).
        let sc16 = _mm256_cvtepi8_epi16(load_u8x16(arr(sc)));
        let mut isum =
            ys.map(|y| _mm256_slli_epi32::<5>(_mm256_madd_epi16(load_i16x16(&y.bsums), sc16)));
        for v in &mut isum {
            *v = _mm256_sub_epi32(_mm256_setzero_si256(), *v);
        }
        for n in 0..2 {
            let ql0 = load_u8x32(&ql[2 * n]);
            let ql1 = load_u8x32(&ql[2 * n + 1]);
            let h = load_u8x32(&qh[n]);
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, low), high(h)),
                _mm256_or_si256(_mm256_and_si256(ql1, low), high(_mm256_srli_epi16::<2>(h))),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                    high(_mm256_srli_epi16::<4>(h)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                    high(_mm256_srli_epi16::<6>(h)),
                ),
            ];
            for (g, &qg) in q.iter().enumerate() {
                let s = 8 * n + 2 * g;
                let scales = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(sc[s + 1] as i8)),
                    _mm_set1_epi16(i16::from(sc[s] as i8)),
                );
                for t in 0..N {
                    let (yq, _) = ys[t].qs.as_chunks::<32>();
                    let yv = load_i8x32(&yq[4 * n + g]);
                    let p = _mm256_maddubs_epi16(qg, yv);
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, scales));
                }
            }
        }
        let d = f16_to_f32(b[208], b[209]);
        for t in 0..N {
            let dy = _mm256_set1_ps(d * ys[t].d);
            acc[t] = _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum_ps(acc[t]);
    }
    out
}

/// `R` F16 weight rows against `N` tokens: `out[r][t] = dot(w[r], x[t])`.
/// Each 8-wide weight chunk is widened once per row and each activation
/// chunk loaded once for all rows, with one accumulator per (row, token).
/// F16 is bound by activation loads (f32 activations are twice the weight
/// bytes), so sharing them across two rows matters as much as sharing the
/// widened weights across tokens. The order of summation per (row, token)
/// does not depend on `R` or `N`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_tile<const R: usize, const N: usize>(
    w: [&[u8]; R],
    x: [&[f32]; N],
) -> [[f32; N]; R] {
    let wc = w.map(|w| w.as_chunks::<16>().0);
    let xc = x.map(|x| x.as_chunks::<8>().0);
    let steps = wc.first().map_or(0, |w| w.len());
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    for i in 0..steps {
        let wv = wc.map(|w| _mm256_cvtph_ps(load_u8x16(&w[i])));
        for t in 0..N {
            let xv = load_f32x8(&xc[t][i]);
            for r in 0..R {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; N]; R];
    let tail = steps * 8;
    for r in 0..R {
        for t in 0..N {
            out[r][t] = hsum_ps(acc[r][t]);
            for (b, &x) in w[r][2 * tail..].chunks_exact(2).zip(&x[t][tail..]) {
                out[r][t] += f16_to_f32(b[0], b[1]) * x;
            }
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_rows<const N: usize>(w: &[u8], x: [&[f32]; N]) -> [f32; N] {
    let [out] = f16_tile([w], x);
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_rows2<const N: usize>(w: [&[u8]; 2], x: [&[f32]; N]) -> [[f32; N]; 2] {
    f16_tile(w, x)
}
