//! Activation quantization: f32 rows into the Q8 block types the integer dot
//! products consume, exactly as ggml's reference quantizers do it.
//!
//! Scales that ggml stores as f16 are kept here as the f16-rounded value in an
//! f32, so every dot product sees the same numbers ggml's would.
#![forbid(unsafe_code)]

use half::f16;

use crate::blocks::{QK, QK_K};

/// 32 activations as `d * qs[i]` (ggml's `block_q8_0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale, already rounded through f16.
    pub d: f32,
    pub qs: [i8; QK],
}

/// A [`BlockQ8_0`] with its quants stored offset by +128 as unsigned bytes
/// (`qs[i] = q[i] + 128`): the unsigned operand of the AVX-512 VNNI kernels
/// (`avx2::Vnni`). Made from a `BlockQ8_0` once per matmul.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0U {
    /// Scale, as in the `BlockQ8_0` it came from.
    pub d: f32,
    pub qs: [u8; QK],
}

impl From<&BlockQ8_0> for BlockQ8_0U {
    fn from(b: &BlockQ8_0) -> Self {
        BlockQ8_0U {
            d: b.d,
            qs: b.qs.map(|q| (q as u8) ^ 0x80),
        }
    }
}

/// 32 activations as `d * qs[i]`, plus `s = d * Σ qs` for the weights' min
/// term (ggml's `block_q8_1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale, already rounded through f16.
    pub d: f32,
    /// `d * Σ qs`, already rounded through f16.
    pub s: f32,
    pub qs: [i8; QK],
}

/// 256 activations as `d * qs[i]`, with the sum of each 16 quants (ggml's
/// `block_q8_K`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        BlockQ8_0 {
            d: 0.0,
            qs: [0; QK],
        }
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        BlockQ8_1 {
            d: 0.0,
            s: 0.0,
            qs: [0; QK],
        }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        }
    }
}

fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Quantizes `x` (a multiple of 32 long) into `out` (one block per 32), as
/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q8_0 row length");
    for (xb, yb) in x.chunks_exact(QK).zip(out) {
        let d = abs_max(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = round_f16(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Quantizes `x` into Q8_1 blocks, as ggml's `quantize_row_q8_1_ref`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), out.len() * QK, "Q8_1 row length");
    for (xb, yb) in x.chunks_exact(QK).zip(out) {
        let d = abs_max(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        yb.d = round_f16(d);
        yb.s = round_f16(sum as f32 * d);
    }
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks, as ggml's
/// `quantize_row_q8_K_ref`: the value of largest magnitude maps to exactly
/// -127 (`iscale = -127 / max`), rounding is to nearest-even, and `bsums`
/// holds the sum of each 16 quants.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q8_K row length");
    for (xb, yb) in x.chunks_exact(QK_K).zip(out) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (sum, qs) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *sum = qs.iter().map(|&q| i16::from(q)).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_maps_amax_to_127_and_keeps_error_small() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.37)
            .collect();
        let mut q = vec![BlockQ8_0::default(); 2];
        quantize_row_q8_0(&x, &mut q);
        for (b, xb) in q.iter().zip(x.chunks(32)) {
            assert_eq!(b.qs.iter().map(|v| v.unsigned_abs()).max(), Some(127));
            for (&qv, &xv) in b.qs.iter().zip(xb) {
                assert!((f32::from(qv) * b.d - xv).abs() <= b.d * 0.51 + 1e-3 * xv.abs());
            }
        }
    }

    #[test]
    fn q8_1_sum_matches_quants() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32).sin()).collect();
        let mut q = [BlockQ8_1::default()];
        quantize_row_q8_1(&x, &mut q);
        let sum: i32 = q[0].qs.iter().map(|&v| i32::from(v)).sum();
        assert!((q[0].s - sum as f32 * q[0].d).abs() <= 1e-2 * q[0].s.abs() + 1e-3);
    }

    #[test]
    fn q8_k_largest_magnitude_maps_to_minus_127() {
        let mut x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.1).cos()).collect();
        x[77] = 3.0;
        let mut q = [BlockQ8K::default()];
        quantize_row_q8_k(&x, &mut q);
        assert_eq!(q[0].qs[77], -127);
        assert!(q[0].d < 0.0);
        for (j, s) in q[0].bsums.iter().enumerate() {
            let want: i16 = q[0].qs[j * 16..][..16].iter().map(|&v| i16::from(v)).sum();
            assert_eq!(*s, want);
        }
        let zeros = [0.0f32; 256];
        quantize_row_q8_k(&zeros, &mut q);
        assert_eq!(q[0], BlockQ8K::default());
    }
}
