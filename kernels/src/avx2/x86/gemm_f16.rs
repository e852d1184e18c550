//! Prefill GEMM for F16 weights on AVX2/FMA/F16C: eight weight rows at a
//! time widened to f32 and transposed into an [`F16Panel`] (one vector per
//! column, row `r` in lane `r`), so one FMA with a broadcast activation
//! adds a column's products to eight rows at once. Two panels (sixteen
//! rows) against up to six tokens keep twelve accumulators in registers:
//! per column two panel loads, six broadcasts and twelve FMAs, bound by the
//! FMA units rather than by loads or reductions.
//!
//! The one-row F16 kernel reduces eight lanes per (row, token) at the end
//! and loads each activation once per row pair; this path has no
//! reduction at all. Each (row, token) sums its columns in order in one f32
//! accumulator: results differ from the one-row kernel by float
//! re-association only.

use std::arch::x86_64::*;

use super::dot::arr;
use super::simd::*;

/// Rows in an F16 panel.
pub const F16_PANEL_ROWS: usize = 8;

/// Tokens one [`f16_panels_tokens`] call takes.
pub const F16_PANEL_TOKENS: usize = 6;

/// Eight F16 weight rows widened to f32, one vector per column.
#[derive(Debug, Default)]
pub struct F16Panel {
    /// Per column, the eight rows' weights (zero past the last row).
    cols: Vec<__m256>,
}

impl F16Panel {
    /// Columns (elements per row).
    pub fn cols(&self) -> usize {
        self.cols.len()
    }
}

/// The eight f32 vectors of an 8 × 8 tile, transposed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_8x8_ps(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Fills `panel` from up to eight F16 rows of equal length, a multiple of
/// eight elements (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pack_f16(panel: &mut F16Panel, rows: &[&[u8]]) {
    let cols = rows[0].len() / 2;
    panel.cols.clear();
    panel.cols.reserve(cols);
    for c0 in (0..cols).step_by(8) {
        let mut tile = [_mm256_setzero_ps(); 8];
        for (t, row) in tile.iter_mut().zip(rows) {
            *t = _mm256_cvtph_ps(load_u8x16(arr(&row[2 * c0..])));
        }
        panel.cols.extend_from_slice(&transpose_8x8_ps(tile));
    }
}

/// `out[t][p]` (eight rows each) = panel `p`'s rows · token `t`, for `P`
/// panels of equal width and `T` tokens of that many f32 activations.
// `c` indexes every panel's columns and every token's activations alike.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_panels_tokens<const P: usize, const T: usize>(
    panels: [&F16Panel; P],
    xs: [&[f32]; T],
) -> [[[f32; F16_PANEL_ROWS]; P]; T] {
    let mut acc = [[_mm256_setzero_ps(); P]; T];
    let cols = panels[0].cols.len();
    for c in 0..cols {
        let mut w = [_mm256_setzero_ps(); P];
        for p in 0..P {
            w[p] = panels[p].cols[c];
        }
        for t in 0..T {
            let x = _mm256_set1_ps(xs[t][c]);
            for p in 0..P {
                acc[t][p] = _mm256_fmadd_ps(w[p], x, acc[t][p]);
            }
        }
    }
    let mut out = [[[0.0f32; F16_PANEL_ROWS]; P]; T];
    for t in 0..T {
        for p in 0..P {
            store_f32x8(&mut out[t][p], acc[t][p]);
        }
    }
    out
}

/// Rows in a wide (AVX-512) F16 panel.
pub const F16_WIDE_ROWS: usize = 16;

/// Tokens one [`f16_wide_tokens`] call takes: two panels against twelve
/// tokens keep 24 accumulators in AVX-512's 32 registers.
pub const F16_WIDE_TOKENS: usize = 12;

/// Sixteen F16 weight rows widened to f32, one 512-bit vector per column:
/// the AVX-512 form of [`F16Panel`], for CPUs that run 512-bit FMAs at
/// full width (Zen 5, Xeons), where it doubles the work per instruction.
#[derive(Debug, Default)]
pub struct F16WidePanel {
    /// Per column, the sixteen rows' weights (zero past the last row).
    cols: Vec<__m512>,
}

impl F16WidePanel {
    /// Columns (elements per row).
    pub fn cols(&self) -> usize {
        self.cols.len()
    }
}

/// Fills `panel` from up to sixteen F16 rows of equal length, a multiple
/// of eight elements (checked by the caller): rows 0–7 in the low half of
/// each column's vector, rows 8–15 in the high half.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn pack_f16_wide(panel: &mut F16WidePanel, rows: &[&[u8]]) {
    let cols = rows[0].len() / 2;
    panel.cols.clear();
    panel.cols.reserve(cols);
    for c0 in (0..cols).step_by(8) {
        let mut halves = [[_mm256_setzero_ps(); 8]; 2];
        for (half, rows) in halves.iter_mut().zip(rows.chunks(F16_PANEL_ROWS)) {
            let mut tile = [_mm256_setzero_ps(); 8];
            for (t, row) in tile.iter_mut().zip(rows) {
                *t = _mm256_cvtph_ps(load_u8x16(arr(&row[2 * c0..])));
            }
            *half = transpose_8x8_ps(tile);
        }
        for (lo, hi) in halves[0].iter().zip(&halves[1]) {
            let v = _mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(*lo)),
                _mm256_castps_pd(*hi),
            );
            panel.cols.push(_mm512_castpd_ps(v));
        }
    }
}

/// `out[t][p]` (sixteen rows each) = panel `p`'s rows · token `t`, for `P`
/// wide panels of equal width and `T` tokens: [`f16_panels_tokens`] on
/// 512-bit vectors. Each (row, token) is the same chain of FMAs in column
/// order, so the results are bit-identical to the AVX2 panels'.
// `c` indexes every panel's columns and every token's activations alike.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) fn f16_wide_tokens<const P: usize, const T: usize>(
    panels: [&F16WidePanel; P],
    xs: [&[f32]; T],
) -> [[[f32; F16_WIDE_ROWS]; P]; T] {
    let mut acc = [[_mm512_setzero_ps(); P]; T];
    let cols = panels[0].cols.len();
    for c in 0..cols {
        let mut w = [_mm512_setzero_ps(); P];
        for p in 0..P {
            w[p] = panels[p].cols[c];
        }
        for t in 0..T {
            let x = _mm512_set1_ps(xs[t][c]);
            for p in 0..P {
                acc[t][p] = _mm512_fmadd_ps(w[p], x, acc[t][p]);
            }
        }
    }
    let mut out = [[[0.0f32; F16_WIDE_ROWS]; P]; T];
    for t in 0..T {
        for p in 0..P {
            // SAFETY: `out[t][p]` is 16 writable f32; storeu has no
            // alignment requirement.
            unsafe { _mm512_storeu_ps(out[t][p].as_mut_ptr(), acc[t][p]) };
        }
    }
    out
}
