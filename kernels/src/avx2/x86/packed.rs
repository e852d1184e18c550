//! The matvec on [`PackedMatrix`] groups with AVX-512 VNNI (256-bit forms):
//! eight rows against up to four tokens.
//!
//! Per block: the eight rows' quants `W[k]` (unsigned, `q + K`) enter
//! `vpdpbusd` against a broadcast dword of the token's signed quants, so
//! lane `r` sums row `r`'s 32 products; the offset's share `K Σ y` starts
//! the sum; the convert, the scale (eight rows' `d_w` times the token's
//! `d_y`) and the FMA serve all eight rows. Even and odd `k` go to two
//! accumulators so the `vpdpbusd` chain is half as long.
//!
//! Each block asks for the bytes [`prefetch_ahead`] bytes further on: the
//! hardware prefetchers alone left decode's stream of packed weights well
//! short of the memory's bandwidth on Intel and AMD cores (see the
//! function).
//!
//! A row's result depends only on its own quants and the token's: integer
//! sums are exact and each lane's float steps run in block order, so a row
//! comes out the same whatever group and tokens share its call (batched
//! decode rows equal single-token calls bit for bit).

use std::arch::x86_64::*;

use super::dot::arr;
use super::simd::*;
use crate::GgmlType;
use crate::packed::{
    PACK_ROWS, Q4K_GROUP_BYTES, Q4K_MINS_AT, Q4K_QUANTS_AT, Q4K_SCALES_AT, Q6K_GROUP_BYTES,
    Q6K_QUANTS_AT, Q6K_SCALES_AT,
};
use crate::quantize::{BlockQ8_0, BlockQ8K};

/// Tokens per call.
pub const PACKED_TOKENS: usize = 4;

/// Quants `4k..4k + 4` of a block, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bcast4(qs: &[i8; 32], k: usize) -> __m256i {
    let q = [
        qs[4 * k] as u8,
        qs[4 * k + 1] as u8,
        qs[4 * k + 2] as u8,
        qs[4 * k + 3] as u8,
    ];
    _mm256_set1_epi32(i32::from_le_bytes(q))
}

/// A packed Q4_0 block's quants for [`group_tokens`]: `W[2j]` as
/// [`unpack`] gives it, but `W[2j + 1]` left in the high nibble (16 times
/// its value), which saves a shift per vector; the odd sums are divided by
/// 16 once per block, exactly (they are multiples of 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q4_0_high(quants: &[u8]) -> [__m256i; 8] {
    let mut w = [_mm256_setzero_si256(); 8];
    let (low, high) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0xF0_u8 as i8));
    for j in 0..4 {
        let v = load_u8x32(arr(&quants[32 * j..]));
        w[2 * j] = _mm256_and_si256(v, low);
        w[2 * j + 1] = _mm256_and_si256(v, high);
    }
    w
}

/// The packed block kinds `group_tokens` runs.
const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;

/// The eight vectors `W[k]` of a packed Q5_0 block: Q4_0's nibbles with
/// each byte's fifth bit from bit `k` of the plane that follows them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q5_0(quants: &[u8]) -> [__m256i; 8] {
    let mut w = unpack::<true>(quants);
    let high = load_u8x32(arr(&quants[128..]));
    let one = _mm256_set1_epi8(1);
    for (k, wk) in w.iter_mut().enumerate() {
        let bit = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(k as i32)), one);
        *wk = _mm256_or_si256(*wk, _mm256_slli_epi16::<4>(bit));
    }
    w
}

/// The eight vectors `W[k]` of a packed block's quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack<const Q4: bool>(quants: &[u8]) -> [__m256i; 8] {
    let mut w = [_mm256_setzero_si256(); 8];
    if Q4 {
        let low = _mm256_set1_epi8(0x0F);
        for j in 0..4 {
            let v = load_u8x32(arr(&quants[32 * j..]));
            w[2 * j] = _mm256_and_si256(v, low);
            w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
        }
    } else {
        for (k, wk) in w.iter_mut().enumerate() {
            *wk = load_u8x32(arr(&quants[32 * k..]));
        }
    }
    w
}

/// `out[t][r]` = row `r` of the packed `group` (`blocks` blocks of
/// `group_block` bytes) · token `t`; `sums[t][b]` is token `t`'s `Σ q` of
/// block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn group_tokens<const KIND: u8, const T: usize>(
    group: &[u8],
    blocks: usize,
    ys: [&[BlockQ8_0]; T],
    sums: [&[i32]; T],
) -> [[f32; PACK_ROWS]; T] {
    let (group_block, k_offset) = match KIND {
        Q4_0 => (16 + 128, 8),
        Q5_0 => (16 + 128 + 32, 16),
        _ => (16 + 256, 128),
    };
    let group = &group[..blocks * group_block];
    let mut y = [&[][..]; T];
    let mut sm = [&[][..]; T];
    for t in 0..T {
        y[t] = &ys[t][..blocks];
        sm[t] = &sums[t][..blocks];
    }
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = prefetch_ahead();
    for (b, blk) in group.chunks_exact(group_block).enumerate() {
        prefetch(blk, ahead);
        let d_w = _mm256_cvtph_ps(load_u8x16(arr(blk)));
        let w = match KIND {
            Q4_0 => unpack_q4_0_high(&blk[16..]),
            Q5_0 => unpack_q5_0(&blk[16..]),
            _ => unpack::<false>(&blk[16..]),
        };
        for t in 0..T {
            let yb = &y[t][b];
            let mut even = _mm256_set1_epi32(-k_offset * sm[t][b]);
            let mut odd = _mm256_setzero_si256();
            for k in (0..8).step_by(2) {
                even = _mm256_dpbusd_epi32(even, w[k], bcast4(&yb.qs, k));
                odd = _mm256_dpbusd_epi32(odd, w[k + 1], bcast4(&yb.qs, k + 1));
            }
            let odd = match KIND {
                Q4_0 => _mm256_srai_epi32::<4>(odd),
                _ => odd,
            };
            let s = _mm256_cvtepi32_ps(_mm256_add_epi32(even, odd));
            let d = _mm256_mul_ps(d_w, _mm256_set1_ps(yb.d));
            acc[t] = _mm256_fmadd_ps(s, d, acc[t]);
        }
    }
    let mut out = [[0.0f32; PACK_ROWS]; T];
    for t in 0..T {
        store_f32x8(&mut out[t], acc[t]);
    }
    out
}

/// [`group_tokens`] for the group's type.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn packed_tokens<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    blocks: usize,
    ys: [&[BlockQ8_0]; T],
    sums: [&[i32]; T],
) -> [[f32; PACK_ROWS]; T] {
    match ty {
        GgmlType::Q4_0 => group_tokens::<Q4_0, T>(group, blocks, ys, sums),
        GgmlType::Q5_0 => group_tokens::<Q5_0, T>(group, blocks, ys, sums),
        _ => group_tokens::<Q8_0, T>(group, blocks, ys, sums),
    }
}

/// Quants `4k..4k + 4` of a Q8_K block's 32-element sub-block `j`, in
/// every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bcast4_k(qs: &[i8; 256], j: usize, k: usize) -> __m256i {
    let at = 32 * j + 4 * k;
    let q = [
        qs[at] as u8,
        qs[at + 1] as u8,
        qs[at + 2] as u8,
        qs[at + 3] as u8,
    ];
    _mm256_set1_epi32(i32::from_le_bytes(q))
}

/// Eight u8 of a packed block, one per row, widened to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_bytes_i32(b: &[u8]) -> __m256i {
    let v = u64::from_le_bytes(*arr::<8>(b));
    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64))
}

/// `out[t][r]` = row `r` of the packed Q4_K `group` (`blocks` super-blocks)
/// · token `t` (Q8_K). Per super-block and row, as ggml sums a Q4_K dot:
/// `d Σ_j sc_j (Σ q y) - dmin Σ_j m_j (Σ y)`, both sums over sub-blocks
/// in exact integers, then two float steps shared by the eight rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn packed_q4k_tokens<const T: usize>(
    group: &[u8],
    blocks: usize,
    ys: [&[BlockQ8K]; T],
) -> [[f32; PACK_ROWS]; T] {
    let group = &group[..blocks * Q4K_GROUP_BYTES];
    let mut y = [&[][..]; T];
    for t in 0..T {
        y[t] = &ys[t][..blocks];
    }
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = prefetch_ahead();
    for (b, blk) in group.chunks_exact(Q4K_GROUP_BYTES).enumerate() {
        prefetch(blk, ahead);
        let d = _mm256_cvtph_ps(load_u8x16(arr(blk)));
        let dmin = _mm256_cvtph_ps(load_u8x16(arr(&blk[16..])));
        let mut isum = [_mm256_setzero_si256(); T];
        let mut imin = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            let w = unpack::<true>(&blk[Q4K_QUANTS_AT + 128 * j..]);
            let sc = row_bytes_i32(&blk[Q4K_SCALES_AT + 8 * j..]);
            let m = row_bytes_i32(&blk[Q4K_MINS_AT + 8 * j..]);
            for t in 0..T {
                let yb = &y[t][b];
                let mut even = _mm256_setzero_si256();
                let mut odd = _mm256_setzero_si256();
                for k in (0..8).step_by(2) {
                    even = _mm256_dpbusd_epi32(even, w[k], bcast4_k(&yb.qs, j, k));
                    odd = _mm256_dpbusd_epi32(odd, w[k + 1], bcast4_k(&yb.qs, j, k + 1));
                }
                let dot = _mm256_add_epi32(even, odd);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot, sc));
                let ysum = i32::from(yb.bsums[2 * j]) + i32::from(yb.bsums[2 * j + 1]);
                imin[t] = _mm256_add_epi32(imin[t], _mm256_mullo_epi32(m, _mm256_set1_epi32(ysum)));
            }
        }
        for t in 0..T {
            let dy = _mm256_set1_ps(y[t][b].d);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dy), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin[t]), _mm256_mul_ps(dmin, dy), acc[t]);
        }
    }
    let mut out = [[0.0f32; PACK_ROWS]; T];
    for t in 0..T {
        store_f32x8(&mut out[t], acc[t]);
    }
    out
}

/// The eight vectors `W[k]` (`q + 32`, 0..=63) of a packed Q6_K
/// 32-element sub-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q6k(sub: &[u8]) -> [__m256i; 8] {
    let mut w = unpack::<true>(sub);
    let three = _mm256_set1_epi8(3);
    for half in 0..2 {
        let h = load_u8x32(arr(&sub[128 + 32 * half..]));
        for k in 0..4 {
            let bits =
                _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * k as i32)), three);
            let wk = &mut w[4 * half + k];
            *wk = _mm256_or_si256(*wk, _mm256_slli_epi16::<4>(bits));
        }
    }
    w
}

/// Eight i8 of a packed block, one per row, widened to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_i8_i32(b: &[u8]) -> __m256i {
    let v = u64::from_le_bytes(*arr::<8>(b));
    _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(v as i64))
}

/// `out[t][r]` = row `r` of the packed Q6_K `group` (`blocks`
/// super-blocks) · token `t` (Q8_K). Per super-block and row, as ggml sums
/// a Q6_K dot: `d Σ_s sc_s (Σ q y - 32 Σ y)` over the sixteen 16-element
/// sub-blocks `s`, in exact integers, then one float step for eight rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn packed_q6k_tokens<const T: usize>(
    group: &[u8],
    blocks: usize,
    ys: [&[BlockQ8K]; T],
) -> [[f32; PACK_ROWS]; T] {
    let group = &group[..blocks * Q6K_GROUP_BYTES];
    let mut y = [&[][..]; T];
    for t in 0..T {
        y[t] = &ys[t][..blocks];
    }
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = prefetch_ahead();
    for (b, blk) in group.chunks_exact(Q6K_GROUP_BYTES).enumerate() {
        prefetch(blk, ahead);
        let d = _mm256_cvtph_ps(load_u8x16(arr(blk)));
        let mut isum = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            let w = unpack_q6k(&blk[Q6K_QUANTS_AT + 192 * j..]);
            let sc_lo = row_i8_i32(&blk[Q6K_SCALES_AT + 8 * (2 * j)..]);
            let sc_hi = row_i8_i32(&blk[Q6K_SCALES_AT + 8 * (2 * j + 1)..]);
            for t in 0..T {
                let yb = &y[t][b];
                let mut lo = _mm256_set1_epi32(-32 * i32::from(yb.bsums[2 * j]));
                let mut hi = _mm256_set1_epi32(-32 * i32::from(yb.bsums[2 * j + 1]));
                for k in 0..4 {
                    lo = _mm256_dpbusd_epi32(lo, w[k], bcast4_k(&yb.qs, j, k));
                    hi = _mm256_dpbusd_epi32(hi, w[k + 4], bcast4_k(&yb.qs, j, k + 4));
                }
                let scaled =
                    _mm256_add_epi32(_mm256_mullo_epi32(lo, sc_lo), _mm256_mullo_epi32(hi, sc_hi));
                isum[t] = _mm256_add_epi32(isum[t], scaled);
            }
        }
        for t in 0..T {
            let dy = _mm256_set1_ps(y[t][b].d);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dy), acc[t]);
        }
    }
    let mut out = [[0.0f32; PACK_ROWS]; T];
    for t in 0..T {
        store_f32x8(&mut out[t], acc[t]);
    }
    out
}

/// `out[i]` = row `8 g0 + i` of `p` · one token: `y` with its block sums
/// `sums` (Q8_0) for Q4_0/Q5_0/Q8_0, `y_k` (Q8_K) for Q4_K/Q6_K. Decode's
/// matvec over a run of groups in one call, each group as the one-token
/// kernels above compute it (so bit-identical to calling them a group at
/// a time).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn matvec(
    p: &crate::PackedMatrix,
    g0: usize,
    y: &[BlockQ8_0],
    sums: &[i32],
    y_k: &[BlockQ8K],
    out: &mut [f32],
) {
    let blocks = p.blocks();
    macro_rules! each_group {
        ($group:ident => $kernel:expr) => {
            for ($group, o) in p.groups_from(g0).zip(out.chunks_mut(PACK_ROWS)) {
                let r = $kernel;
                o.copy_from_slice(&r[0][..o.len()]);
            }
        };
    }
    match p.ty() {
        GgmlType::Q4_0 => each_group!(g => group_tokens::<Q4_0, 1>(g, blocks, [y], [sums])),
        GgmlType::Q5_0 => each_group!(g => group_tokens::<Q5_0, 1>(g, blocks, [y], [sums])),
        GgmlType::Q8_0 => each_group!(g => group_tokens::<Q8_0, 1>(g, blocks, [y], [sums])),
        GgmlType::Q4K => each_group!(g => packed_q4k_tokens::<1>(g, blocks, [y_k])),
        GgmlType::Q6K => each_group!(g => packed_q6k_tokens::<1>(g, blocks, [y_k])),
        other => unreachable!("{other} is never packed"),
    }
}
