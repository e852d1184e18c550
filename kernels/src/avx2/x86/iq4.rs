//! IQ4_NL · Q8_0 and IQ4_XS · Q8_K: nibbles looked up in the 16-entry
//! non-linear table with one byte shuffle, then the signed-byte dot of the
//! other integer kernels. Each kernel takes up to `N` token rows per weight
//! row (each block unpacked once); the single-row dot is the `N = 1` case,
//! and every token's sum runs through the same operations whatever `N` is,
//! so a multi-token result equals the single-row one bit for bit.

use std::arch::x86_64::*;

use super::dot::{arr, dot_u8_i8, nibbles};
use super::dot_tokens::block_of;
use super::simd::*;
use crate::blocks::*;
use crate::quantize::{BlockQ8_0, BlockQ8K};

/// The table in both 128-bit lanes, for `_mm256_shuffle_epi8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table() -> __m256i {
    let bytes = KVALUES_IQ4NL.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load_u8x16(&bytes))
}

/// The 32 signed values of one 16-byte run of nibbles, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lookup(table: __m256i, raw: &[u8; 16]) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles(raw))
}

/// Adds one IQ4_NL block times each token's Q8_0 block into its accumulator.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nl_block<const N: usize>(
    acc: &mut [__m256; N],
    table: __m256i,
    b: &[u8; IQ4NL_BYTES],
    ys: [&BlockQ8_0; N],
) {
    let q = lookup(table, arr(&b[2..]));
    // |q| once for all tokens; its sign moves onto each token's quants.
    let q_abs = _mm256_sign_epi8(q, q);
    let d_w = f16_splat(b[0], b[1]);
    for t in 0..N {
        let p = dot_u8_i8(q_abs, _mm256_sign_epi8(load_i8x32(&ys[t].qs), q));
        let d = _mm256_mul_ps(d_w, _mm256_set1_ps(ys[t].d));
        acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
    }
}

/// One IQ4_NL row against `N` Q8_0 rows: blocks alternate between two
/// accumulators per token, so consecutive blocks' FMAs do not wait on each
/// other.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_nl_rows<const N: usize>(w: &[u8], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    let table = table();
    let (blocks, _) = w.as_chunks::<IQ4NL_BYTES>();
    let (pairs, rest) = blocks.as_chunks::<2>();
    let mut acc0 = [_mm256_setzero_ps(); N];
    let mut acc1 = [_mm256_setzero_ps(); N];
    for (i, b) in pairs.iter().enumerate() {
        nl_block(&mut acc0, table, &b[0], block_of(x, 2 * i));
        nl_block(&mut acc1, table, &b[1], block_of(x, 2 * i + 1));
    }
    if let Some(b) = rest.first() {
        nl_block(&mut acc0, table, b, block_of(x, 2 * pairs.len()));
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_nl_row(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    let [sum] = iq4_nl_rows(w, [x]);
    sum
}

/// One IQ4_XS row against `N` Q8_K rows. Per super-block the sum is exact
/// in i32 lanes: `maddubs` gives pairs of |q|·±y (at most 2 · 127², no
/// saturation), `madd` with the sub-block's scale widens them, and the
/// lanes are converted and scaled by `d_w · d_y` once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs_rows<const N: usize>(w: &[u8], x: [&[BlockQ8K]; N]) -> [f32; N] {
    let table = table();
    let (blocks, _) = w.as_chunks::<IQ4XS_BYTES>();
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, b) in blocks.iter().enumerate() {
        let ys = block_of(x, i);
        let scales = iq4xs_scales(b);
        let (qs, _) = b[8..].as_chunks::<16>();
        let mut isum = [_mm256_setzero_si256(); N];
        for (ib, raw) in qs.iter().enumerate() {
            let q = lookup(table, raw);
            let q_abs = _mm256_sign_epi8(q, q);
            let s = _mm256_set1_epi16(i16::from(scales[ib]));
            for t in 0..N {
                let (yq, _) = ys[t].qs.as_chunks::<32>();
                let y = _mm256_sign_epi8(load_i8x32(&yq[ib]), q);
                let p = _mm256_maddubs_epi16(q_abs, y);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, s));
            }
        }
        let d = f16_to_f32(b[0], b[1]);
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

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs_row(w: &[u8], x: &[BlockQ8K]) -> f32 {
    let [sum] = iq4_xs_rows(w, [x]);
    sum
}
