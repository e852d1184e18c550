//! Row · activation dot products. Integer types follow ggml's approach:
//! `maddubs` (u8 × i8 → i16 pairs) then `madd` (→ i32), so every block's
//! integer dot is exact and only the per-block float scaling rounds.

use std::arch::x86_64::*;

use super::simd::*;
use crate::blocks::*;
use crate::quantize::{BlockQ8_0, BlockQ8_1, BlockQ8K};

/// Σ u[i] s[i] over 32 u8 × i8 pairs, as eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Σ a[i] b[i] over 32 i8 × i8 pairs: move `a`'s sign onto `b` so `maddubs`
/// (which needs one unsigned side) sees |a| × ±b.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8_i8(a: __m256i, b: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// The 32 nibbles of 16 bytes in element order: low nibbles (elements 0..16)
/// then high nibbles (16..32), as u8 0..=15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nibbles(raw: &[u8; 16]) -> __m256i {
    let lo = load_u8x16(raw);
    let hi = _mm_srli_epi16::<4>(lo);
    _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0F))
}

/// Byte `k` is 0xFF if bit `k` of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes_from_bits(bits: u32) -> __m256i {
    // Give byte k a copy of byte k/8 of `bits`, then OR in every bit but k%8:
    // the result is all ones exactly when bit k%8 was set.
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// Two bits of each Q6_K `qh` byte (already shifted to the bottom), moved to
/// bits 4..6 so they OR onto a nibble.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn high(h: __m256i) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(h, _mm256_set1_epi8(3)))
}

pub(super) fn arr<const N: usize>(s: &[u8]) -> &[u8; N] {
    s.first_chunk::<N>().expect("block field length")
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f32_row(w: &[u8], x: &[f32]) -> f32 {
    let (wc, wt) = w.as_chunks::<128>();
    let (xc, xt) = x.as_chunks::<32>();
    let mut acc = [_mm256_setzero_ps(); 4];
    for (wb, xb) in wc.iter().zip(xc) {
        let (ws, _) = wb.as_chunks::<32>();
        let (xs, _) = xb.as_chunks::<8>();
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(load_f32x8_le(&ws[k]), load_f32x8(&xs[k]), acc[k]);
        }
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (b, &x) in wt.chunks_exact(4).zip(xt) {
        sum += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_row(w: &[u8], x: &[f32]) -> f32 {
    let (wc, wt) = w.as_chunks::<64>();
    let (xc, xt) = x.as_chunks::<32>();
    let mut acc = [_mm256_setzero_ps(); 4];
    let ahead = prefetch_ahead();
    for (wb, xb) in wc.iter().zip(xc) {
        // Rows are read in file order: the next ones follow this one.
        prefetch(wb, ahead);
        let (ws, _) = wb.as_chunks::<16>();
        let (xs, _) = xb.as_chunks::<8>();
        for k in 0..4 {
            let wv = _mm256_cvtph_ps(load_u8x16(&ws[k]));
            acc[k] = _mm256_fmadd_ps(wv, load_f32x8(&xs[k]), acc[k]);
        }
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (b, &x) in wt.chunks_exact(2).zip(xt) {
        sum += f16_to_f32(b[0], b[1]) * x;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bf16_row(w: &[u8], x: &[f32]) -> f32 {
    let (wc, wt) = w.as_chunks::<64>();
    let (xc, xt) = x.as_chunks::<32>();
    let mut acc = [_mm256_setzero_ps(); 4];
    for (wb, xb) in wc.iter().zip(xc) {
        let (ws, _) = wb.as_chunks::<16>();
        let (xs, _) = xb.as_chunks::<8>();
        for k in 0..4 {
            let wide = _mm256_cvtepu16_epi32(load_u8x16(&ws[k]));
            let wv = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide));
            acc[k] = _mm256_fmadd_ps(wv, load_f32x8(&xs[k]), acc[k]);
        }
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (b, &x) in wt.chunks_exact(2).zip(xt) {
        sum += f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) * x;
    }
    sum
}

/// Σ over block pairs of `step(acc, block, act)`, alternating between two
/// accumulators so consecutive blocks' FMAs do not wait on each other.
macro_rules! two_accumulators {
    ($w:expr, $x:expr, $bytes:expr, $step:ident) => {{
        let (blocks, _) = $w.as_chunks::<{ $bytes }>();
        let (pairs, rest) = blocks.as_chunks::<2>();
        let (act_pairs, act_rest) = $x.as_chunks::<2>();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        for (b, y) in pairs.iter().zip(act_pairs) {
            acc0 = $step(acc0, &b[0], &y[0]);
            acc1 = $step(acc1, &b[1], &y[1]);
        }
        for (b, y) in rest.iter().zip(act_rest) {
            acc0 = $step(acc0, b, y);
        }
        hsum_ps(_mm256_add_ps(acc0, acc1))
    }};
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_block(acc: __m256, b: &[u8; Q4_0_BYTES], y: &BlockQ8_0) -> __m256 {
    let d = f16_splat_mul(b[0], b[1], y.d);
    let q = _mm256_sub_epi8(nibbles(arr(&b[2..])), _mm256_set1_epi8(8));
    let p = _mm256_cvtepi32_ps(dot_i8_i8(q, load_i8x32(&y.qs)));
    _mm256_fmadd_ps(d, p, acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    two_accumulators!(w, x, Q4_0_BYTES, q4_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_1(w: &[u8], x: &[BlockQ8_1]) -> f32 {
    let (blocks, _) = w.as_chunks::<Q4_1_BYTES>();
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let d = f16_splat_mul(b[0], b[1], y.d);
        mins += f16_to_f32(b[2], b[3]) * y.s;
        let q = nibbles(arr(&b[4..]));
        let p = _mm256_cvtepi32_ps(dot_u8_i8(q, load_i8x32(&y.qs)));
        acc = _mm256_fmadd_ps(d, p, acc);
    }
    hsum_ps(acc) + mins
}

/// A Q5_0 block's 32 signed quants, `(nibble | bit << 4) - 16`, in
/// element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_0_quants(b: &[u8; Q5_0_BYTES]) -> __m256i {
    let bits = bytes_from_bits(u32::from_le_bytes(*arr(&b[2..])));
    // (nibble | bit << 4) - 16 as i8: where the bit is clear, setting the
    // top four bits subtracts 16; where it is set, the value is the nibble.
    let high_off = _mm256_set1_epi8(0xF0u8 as i8);
    _mm256_or_si256(nibbles(arr(&b[6..])), _mm256_andnot_si256(bits, high_off))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_block(acc: __m256, b: &[u8; Q5_0_BYTES], y: &BlockQ8_0) -> __m256 {
    let d = f16_splat_mul(b[0], b[1], y.d);
    let p = _mm256_cvtepi32_ps(dot_i8_i8(q5_0_quants(b), load_i8x32(&y.qs)));
    _mm256_fmadd_ps(d, p, acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    two_accumulators!(w, x, Q5_0_BYTES, q5_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_1(w: &[u8], x: &[BlockQ8_1]) -> f32 {
    let (blocks, _) = w.as_chunks::<Q5_1_BYTES>();
    let bit4 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let d = f16_splat_mul(b[0], b[1], y.d);
        mins += f16_to_f32(b[2], b[3]) * y.s;
        let bits = bytes_from_bits(u32::from_le_bytes(*arr(&b[4..])));
        let q = _mm256_or_si256(nibbles(arr(&b[8..])), _mm256_and_si256(bits, bit4));
        let p = _mm256_cvtepi32_ps(dot_u8_i8(q, load_i8x32(&y.qs)));
        acc = _mm256_fmadd_ps(d, p, acc);
    }
    hsum_ps(acc) + mins
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_block(acc: __m256, b: &[u8; Q8_0_BYTES], y: &BlockQ8_0) -> __m256 {
    let d = f16_splat_mul(b[0], b[1], y.d);
    let q = load_u8x32(arr(&b[2..]));
    let p = _mm256_cvtepi32_ps(dot_i8_i8(q, load_i8x32(&y.qs)));
    _mm256_fmadd_ps(d, p, acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q8_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    two_accumulators!(w, x, Q8_0_BYTES, q8_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w.as_chunks::<Q4K_BYTES>();
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        let (qs, _) = b[16..].as_chunks::<32>();
        let (ys, _) = y.qs.as_chunks::<32>();
        let mut isum = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load_u8x32(&qs[j]);
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
            let plo = _mm256_maddubs_epi16(lo, load_i8x32(&ys[2 * j]));
            let phi = _mm256_maddubs_epi16(hi, load_i8x32(&ys[2 * j + 1]));
            let slo = _mm256_madd_epi16(plo, _mm256_set1_epi16(i16::from(sc[2 * j])));
            let shi = _mm256_madd_epi16(phi, _mm256_set1_epi16(i16::from(sc[2 * j + 1])));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(slo, shi));
        }
        let d = f16_splat_mul(b[0], b[1], y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
        mins += f16_to_f32(b[2], b[3]) * y.d * min_sum(&y.bsums, &m) as f32;
    }
    hsum_ps(acc) - mins
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w.as_chunks::<Q5K_BYTES>();
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (b, y) in blocks.iter().zip(x) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        // Bit 2j of qh[l] is the fifth bit of element 64j + l, bit 2j+1 that
        // of element 64j + 32 + l; shift the whole vector down by 2 per j.
        let mut hbits = load_u8x32(arr(&b[16..]));
        let (qs, _) = b[48..].as_chunks::<32>();
        let (ys, _) = y.qs.as_chunks::<32>();
        let mut isum = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load_u8x32(&qs[j]);
            let h_lo = _mm256_slli_epi16::<4>(_mm256_and_si256(hbits, one));
            let h_hi = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<1>(hbits), one));
            hbits = _mm256_srli_epi16::<2>(hbits);
            let lo = _mm256_or_si256(_mm256_and_si256(q, low), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), low), h_hi);
            let plo = _mm256_maddubs_epi16(lo, load_i8x32(&ys[2 * j]));
            let phi = _mm256_maddubs_epi16(hi, load_i8x32(&ys[2 * j + 1]));
            let slo = _mm256_madd_epi16(plo, _mm256_set1_epi16(i16::from(sc[2 * j])));
            let shi = _mm256_madd_epi16(phi, _mm256_set1_epi16(i16::from(sc[2 * j + 1])));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(slo, shi));
        }
        let d = f16_splat_mul(b[0], b[1], y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
        mins += f16_to_f32(b[2], b[3]) * y.d * min_sum(&y.bsums, &m) as f32;
    }
    hsum_ps(acc) - mins
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    let (blocks, _) = w.as_chunks::<Q6K_BYTES>();
    let low = _mm256_set1_epi8(0x0F);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    for (b, y) in blocks.iter().zip(x) {
        let (ql, _) = b[..128].as_chunks::<32>();
        let (qh, _) = b[128..192].as_chunks::<32>();
        let sc = &b[192..208];
        let (ys, _) = y.qs.as_chunks::<32>();
        let mut isum = _mm256_setzero_si256();
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
                let yv = load_i8x32(&ys[4 * n + g]);
                // (q - 32) · y = q · y - 32 · y, both exact in i16.
                let p =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(qg, yv), _mm256_maddubs_epi16(m32, yv));
                let s = 8 * n + 2 * g;
                let scales = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(sc[s + 1] as i8)),
                    _mm_set1_epi16(i16::from(sc[s] as i8)),
                );
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales));
            }
        }
        let d = f16_splat_mul(b[208], b[209], y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    hsum_ps(acc)
}

/// The 32 quants `q - 32` (signed, -32..=31) of 32-element sub-block `j`
/// (0..8) of a Q6_K super-block, in element order. Element `128 n + 32 g + l`
/// takes a nibble of `ql[64 n + 32 (g % 2) + l]` (low for g < 2) and bits
/// `2 g, 2 g + 1` of `qh[32 n + l]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_quants(b: &[u8; Q6K_BYTES], j: usize) -> __m256i {
    let (n, g) = (j / 4, j % 4);
    let ql = load_u8x32(arr(&b[64 * n + 32 * (g % 2)..]));
    let ql = if g < 2 {
        ql
    } else {
        _mm256_srli_epi16::<4>(ql)
    };
    let qh = load_u8x32(arr(&b[128 + 32 * n..]));
    let qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32));
    let q = _mm256_or_si256(_mm256_and_si256(ql, _mm256_set1_epi8(0x0F)), high(qh));
    _mm256_sub_epi8(q, _mm256_set1_epi8(32))
}
