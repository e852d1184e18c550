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

/// `x.round() as i8` (half away from zero, saturating, NaN to 0) without
/// `f32::round`, which on the baseline x86-64 target is a call into libm's
/// `roundf` per element (~2% of a batched decode step, perf). Truncation is
/// exact and so is `x - trunc(x)` for every f32, so this is the same
/// function, not an approximation (tests: against `round` on every
/// half-integer and its neighbours, and on random bits).
#[inline]
fn round_to_i8(x: f32) -> i8 {
    let t = x as i32;
    let frac = x - t as f32;
    let r = if frac >= 0.5 {
        t.saturating_add(1)
    } else if frac <= -0.5 {
        t.saturating_sub(1)
    } else {
        t
    };
    r.clamp(-128, 127) as i8
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
            *q = round_to_i8(v * id);
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
            *q = round_to_i8(v * id);
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
    fn round_to_i8_is_round_then_cast() {
        let same = |x: f32| {
            assert_eq!(
                round_to_i8(x),
                x.round() as i8,
                "{x:e} ({:#x})",
                x.to_bits()
            )
        };
        for special in [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1e10,
            -1e10,
            2147483520.0,
            2147483648.0,
            -2147483648.0,
            8388608.5,
            16777216.0,
        ] {
            same(special);
        }
        // Every half-integer in and beyond the i8 range and its nearest neighbours.
        for k in -600..=600 {
            let h = k as f32 + 0.5;
            for x in [
                h,
                h.next_up(),
                h.next_down(),
                k as f32,
                (k as f32).next_up(),
                (k as f32).next_down(),
            ] {
                same(x);
            }
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..1_000_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = state as u32;
            same(f32::from_bits(bits));
            // And values of the size quantization produces.
            same(f32::from_bits(bits).rem_euclid(300.0) - 150.0);
        }
    }

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
