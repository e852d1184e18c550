//! Prefill GEMM on AVX-512 VNNI (256-bit forms): eight weight rows at a
//! time, repacked into a [`Panel`] whose every vector holds the same four
//! quants of all eight rows, against several tokens at once.
//!
//! The one-row kernels (`dot.rs`, `vnni.rs`) reduce each (row, token) pair
//! on its own: an integer dot of 32 quants into eight i32 lanes, then a
//! convert, a scale and an FMA per block, and a horizontal sum at the end.
//! Here a lane is a row: `vpdpbusd` of a broadcast dword of one token's
//! activations with a panel vector adds four products to each of eight rows,
//! so a block costs eight `vpdpbusd` per token and the float work (convert,
//! scale, FMA) is shared by the eight rows. The weights are repacked once
//! per panel and reused by every token of the call, so the repack's cost
//! is that of reading the weights, which a matmul does anyway; nothing is
//! kept between calls and resident memory does not grow.
//!
//! Every weight type becomes signed 8-bit quants with a per-block f32 scale
//! (and for Q4_K/Q5_K an f32 min): Q8_0, Q4_0 and Q5_0 as they are, Q4_K and
//! Q5_K per 32-element sub-block, Q6_K per 16-element half-block (two scales
//! per block). Activations come in 32-element blocks offset by +128
//! (`BlockQ8_0U`): Q8_0 blocks, or Q8_K blocks cut in eight for the
//! K-quants (the quantization ggml pairs each type with); the offset's
//! contribution `128 Σ q` is precomputed per (row, block) and subtracted up
//! front. Integer sums are exact; results differ from the one-row kernels
//! by float re-association only, so this path is for prefill, never for
//! batched decode rows.

use std::arch::x86_64::*;

use super::dot::{arr, nibbles};
use super::simd::*;
use crate::blocks::*;
use crate::quantize::BlockQ8_0U;

/// Rows in a panel: one per i32 lane of a 256-bit vector.
pub const PANEL_ROWS: usize = 8;

/// Tokens one kernel call takes: each needs an integer and a float
/// accumulator (two of each with half-block scales); with the eight weight
/// vectors of a block that is 24 of AVX512VL's 32 registers.
pub const PANEL_TOKENS: usize = 4;

/// Eight weight rows repacked for [`super::Vnni::panel_dot`]; see the module
/// docs. Made by [`super::Vnni::pack_panel`], reused across calls (its
/// vectors only grow).
#[derive(Debug, Default)]
pub struct Panel {
    /// Blocks of 32 quants per row.
    blocks: usize,
    /// Valid rows (the rest are zero and never stored).
    rows: usize,
    /// Per block, eight vectors: vector `k` holds quants `4k..4k + 4` of
    /// every row, row `r` in i32 lane `r`.
    qs: Vec<[__m256i; 8]>,
    /// Per scale group (a block, or a half-block with `halves`): `-128 Σ q`
    /// over the group, per row.
    bias: Vec<__m256i>,
    /// Per scale group: the weights' scale, per row.
    scale: Vec<__m256>,
    /// Per block, with a min term (Q4_K/Q5_K): `min` per row, the weight
    /// being `scale · q - min`.
    min: Vec<__m256>,
    /// Two scale groups per block (Q6_K's 16-element sub-blocks).
    halves: bool,
}

impl Panel {
    /// Blocks of 32 quants per row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Valid rows (1..=8).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether the weights carry a min term (the activations' block sums are
    /// then needed).
    pub fn has_min(&self) -> bool {
        !self.min.is_empty()
    }

    fn reset(&mut self, blocks: usize, rows: usize, halves: bool, with_min: bool) {
        let groups = if halves { 2 * blocks } else { blocks };
        // SAFETY (the zeroed vectors): all-zero bits are a valid __m256i/__m256.
        let zero_i: __m256i = unsafe { std::mem::zeroed() };
        let zero_f: __m256 = unsafe { std::mem::zeroed() };
        self.blocks = blocks;
        self.rows = rows;
        self.halves = halves;
        self.qs.resize(blocks, [zero_i; 8]);
        self.qs.truncate(blocks);
        self.bias.resize(groups, zero_i);
        self.bias.truncate(groups);
        self.scale.resize(groups, zero_f);
        self.scale.truncate(groups);
        let mins = if with_min { blocks } else { 0 };
        self.min.resize(mins, zero_f);
        self.min.truncate(mins);
    }
}

/// One row's block, unpacked: 32 signed quants in element order, its
/// scale(s) and min.
struct RowBlock {
    q: __m256i,
    scale: Scale,
    min: f32,
}

/// How a type's blocks become a panel's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `d · q`, `d` one f16 per block (Q8_0, Q4_0, Q5_0).
    F16Scale,
    /// `scale · q - min` per 32-element sub-block (Q4_K, Q5_K).
    WithMin,
    /// `scale · q` per 16-element half-block (Q6_K).
    Halves,
}

/// A row block's scale as the file stores it.
enum Scale {
    /// One f16 for the block (Q8_0, Q4_0, Q5_0): the eight rows' are
    /// widened together.
    F16([u8; 2]),
    /// Computed per block, or per half with `halves` (K-quants).
    F32([f32; 2]),
}

/// Rows `0..8` of `q` as dwords, transposed: output `k` holds dword `k` of
/// every input row, row `r` in lane `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn transpose_8x8(q: [__m256i; 8]) -> [__m256i; 8] {
    // Pairs of rows interleaved by dword, then by qword, then 128-bit halves
    // swapped across rows r and r + 4.
    let t0 = _mm256_unpacklo_epi32(q[0], q[1]);
    let t1 = _mm256_unpackhi_epi32(q[0], q[1]);
    let t2 = _mm256_unpacklo_epi32(q[2], q[3]);
    let t3 = _mm256_unpackhi_epi32(q[2], q[3]);
    let t4 = _mm256_unpacklo_epi32(q[4], q[5]);
    let t5 = _mm256_unpackhi_epi32(q[4], q[5]);
    let t6 = _mm256_unpacklo_epi32(q[6], q[7]);
    let t7 = _mm256_unpackhi_epi32(q[6], q[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// `128 Σ` of each lane's four quants, summed over `ks`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn sum128(ks: &[__m256i]) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for &k in ks {
        s = _mm256_dpbusd_epi32(s, _mm256_set1_epi8(-128), k);
    }
    s
}

/// Fills `panel` from eight rows' blocks, `unpack(row, block)` giving each.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn pack_with(
    panel: &mut Panel,
    blocks: usize,
    rows: usize,
    kind: Kind,
    unpack: impl Fn(usize, usize) -> RowBlock,
) {
    let halves = kind == Kind::Halves;
    let with_min = kind == Kind::WithMin;
    panel.reset(blocks, rows, halves, with_min);
    for b in 0..blocks {
        let mut q = [_mm256_setzero_si256(); PANEL_ROWS];
        let mut scale = [[0.0f32; PANEL_ROWS]; 2];
        let mut scale_f16 = [0u8; 2 * PANEL_ROWS];
        let mut min = [0.0f32; PANEL_ROWS];
        for r in 0..rows {
            let rb = unpack(r, b);
            q[r] = rb.q;
            match rb.scale {
                Scale::F16(bits) => scale_f16[2 * r..2 * r + 2].copy_from_slice(&bits),
                Scale::F32([lo, hi]) => {
                    scale[0][r] = lo;
                    scale[1][r] = hi;
                }
            }
            min[r] = rb.min;
        }
        let ks = transpose_8x8(q);
        let neg = |v: __m256i| _mm256_sub_epi32(_mm256_setzero_si256(), v);
        if halves {
            panel.bias[2 * b] = neg(sum128(&ks[..4]));
            panel.bias[2 * b + 1] = neg(sum128(&ks[4..]));
            panel.scale[2 * b] = load_f32x8(&scale[0]);
            panel.scale[2 * b + 1] = load_f32x8(&scale[1]);
        } else {
            panel.bias[b] = neg(sum128(&ks));
            panel.scale[b] = if kind == Kind::F16Scale {
                _mm256_cvtph_ps(load_u8x16(&scale_f16))
            } else {
                load_f32x8(&scale[0])
            };
        }
        if with_min {
            panel.min[b] = load_f32x8(&min);
        }
        panel.qs[b] = ks;
    }
}

/// The 32-element blocks of `row` (of a type with `bytes` per block).
fn block_at<const BYTES: usize>(row: &[u8], b: usize) -> &[u8; BYTES] {
    arr(&row[b * BYTES..])
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q8_0(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q8_0_BYTES;
    pack_with(panel, blocks, rows.len(), Kind::F16Scale, |r, b| {
        let blk = block_at::<Q8_0_BYTES>(rows[r], b);
        RowBlock {
            q: load_u8x32(arr(&blk[2..])),
            scale: Scale::F16([blk[0], blk[1]]),
            min: 0.0,
        }
    });
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q4_0(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q4_0_BYTES;
    pack_with(panel, blocks, rows.len(), Kind::F16Scale, |r, b| {
        let blk = block_at::<Q4_0_BYTES>(rows[r], b);
        RowBlock {
            q: _mm256_sub_epi8(nibbles(arr(&blk[2..])), _mm256_set1_epi8(8)),
            scale: Scale::F16([blk[0], blk[1]]),
            min: 0.0,
        }
    });
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q5_0(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q5_0_BYTES;
    pack_with(panel, blocks, rows.len(), Kind::F16Scale, |r, b| {
        let blk = block_at::<Q5_0_BYTES>(rows[r], b);
        RowBlock {
            q: super::dot::q5_0_quants(blk),
            scale: Scale::F16([blk[0], blk[1]]),
            min: 0.0,
        }
    });
}

/// Q4_K and Q5_K: each 256-element super-block is eight 32-element
/// sub-blocks, `d · sc_j · q - dmin · m_j` with `q` in 0..16 (0..32).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q4k(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q4K_BYTES * 8;
    pack_with(panel, blocks, rows.len(), Kind::WithMin, |r, b| {
        let sb = block_at::<Q4K_BYTES>(rows[r], b / 8);
        let j = b % 8;
        let (sc, m) = scales_mins_k4(&sb[4..16]);
        let q = nibbles_of(&sb[16 + 32 * (j / 2)..], j % 2);
        RowBlock {
            q,
            scale: Scale::F32([f16_to_f32(sb[0], sb[1]) * f32::from(sc[j]), 0.0]),
            min: f16_to_f32(sb[2], sb[3]) * f32::from(m[j]),
        }
    });
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q5k(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q5K_BYTES * 8;
    pack_with(panel, blocks, rows.len(), Kind::WithMin, |r, b| {
        let sb = block_at::<Q5K_BYTES>(rows[r], b / 8);
        let j = b % 8;
        let (sc, m) = scales_mins_k4(&sb[4..16]);
        let low = nibbles_of(&sb[48 + 32 * (j / 2)..], j % 2);
        // Bit j of qh[l] is the fifth bit of element 32j + l.
        let qh = load_u8x32(arr(&sb[16..]));
        let bit = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)),
            _mm256_set1_epi8(1),
        );
        let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(bit));
        RowBlock {
            q,
            scale: Scale::F32([f16_to_f32(sb[0], sb[1]) * f32::from(sc[j]), 0.0]),
            min: f16_to_f32(sb[2], sb[3]) * f32::from(m[j]),
        }
    });
}

/// Q6_K: `d · sc_j · (q - 32)` with a scale per 16 elements: one block of
/// 32 here is two scale groups.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_q6k(panel: &mut Panel, rows: &[&[u8]]) {
    let blocks = rows[0].len() / Q6K_BYTES * 8;
    pack_with(panel, blocks, rows.len(), Kind::Halves, |r, b| {
        let sb = block_at::<Q6K_BYTES>(rows[r], b / 8);
        let j = b % 8;
        let d = f16_to_f32(sb[208], sb[209]);
        let sc = |g: usize| f32::from(sb[192 + g] as i8) * d;
        RowBlock {
            q: super::dot::q6k_quants(sb, j),
            scale: Scale::F32([sc(2 * j), sc(2 * j + 1)]),
            min: 0.0,
        }
    });
}

/// The low nibbles (`half` 0) or the high ones (`half` 1) of the 32 bytes
/// at the start of `src`, as u8 0..=15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles_of(src: &[u8], half: usize) -> __m256i {
    let v = load_u8x32(arr(src));
    let v = if half == 0 {
        v
    } else {
        _mm256_srli_epi16::<4>(v)
    };
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// `out[t]` (eight rows) = the panel's rows · token `t`'s activations, for
/// `T` tokens; `sums[t][b]` is `d · Σ q` of token `t`'s block `b` (only read
/// when the panel has a min term).
///
/// Each token keeps two integer accumulators per block, quants 0..16 and
/// 16..32 (a block's two scale groups with `halves`): `vpdpbusd` takes
/// several cycles, and eight in a row on one register would leave the
/// units waiting on the chain.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn panel_tokens<const T: usize>(
    p: &Panel,
    ys: [&[BlockQ8_0U]; T],
    sums: [&[f32]; T],
) -> [[f32; PANEL_ROWS]; T] {
    let blocks = p.blocks;
    let groups = if p.halves { 2 * blocks } else { blocks };
    // Slices cut to their known lengths: no bounds checks in the loop.
    let qs = &p.qs[..blocks];
    let bias = &p.bias[..groups];
    let scale = &p.scale[..groups];
    let with_min = p.has_min();
    let mins = if with_min { &p.min[..blocks] } else { &[][..] };
    let mut y = [&[][..]; T];
    let mut sm = [&[][..]; T];
    for t in 0..T {
        y[t] = &ys[t][..blocks];
        if with_min {
            sm[t] = &sums[t][..blocks];
        }
    }
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..blocks {
        let w = &qs[b];
        let (bias_lo, bias_hi) = if p.halves {
            (bias[2 * b], bias[2 * b + 1])
        } else {
            (bias[b], _mm256_setzero_si256())
        };
        let mut lo = [bias_lo; T];
        let mut hi = [bias_hi; T];
        for k in 0..4 {
            for t in 0..T {
                lo[t] = _mm256_dpbusd_epi32(lo[t], bcast4(&y[t][b].qs, k), w[k]);
                hi[t] = _mm256_dpbusd_epi32(hi[t], bcast4(&y[t][b].qs, k + 4), w[k + 4]);
            }
        }
        if p.halves {
            for t in 0..T {
                let dy = _mm256_set1_ps(y[t][b].d);
                let s_lo = _mm256_mul_ps(scale[2 * b], dy);
                let s_hi = _mm256_mul_ps(scale[2 * b + 1], dy);
                acc[t] = _mm256_fmadd_ps(s_lo, _mm256_cvtepi32_ps(lo[t]), acc[t]);
                acc[t] = _mm256_fmadd_ps(s_hi, _mm256_cvtepi32_ps(hi[t]), acc[t]);
            }
        } else {
            for t in 0..T {
                let s = _mm256_mul_ps(scale[b], _mm256_set1_ps(y[t][b].d));
                let i = _mm256_add_epi32(lo[t], hi[t]);
                acc[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(i), acc[t]);
                if with_min {
                    acc[t] = _mm256_fnmadd_ps(mins[b], _mm256_set1_ps(sm[t][b]), acc[t]);
                }
            }
        }
    }
    let mut out = [[0.0f32; PANEL_ROWS]; T];
    for t in 0..T {
        store_f32x8(&mut out[t], acc[t]);
    }
    out
}

/// Quants `4k..4k + 4` of a block, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bcast4(qs: &[u8; 32], k: usize) -> __m256i {
    let q = arr::<4>(&qs[4 * k..]);
    _mm256_set1_epi32(i32::from_le_bytes(*q))
}
