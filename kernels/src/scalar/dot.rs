//! Row · activation dot products, one per weight type. `w` is one row of raw
//! GGUF bytes; quantized types take the activation row already quantized to
//! the Q8 type ggml pairs them with.

use half::f16;

use crate::blocks::*;
use crate::quantize::{BlockQ8_0, BlockQ8_1, BlockQ8K};

/// F32 weights · f32 activations.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * 4);
    w.chunks_exact(4)
        .zip(x)
        .map(|(b, &x)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x)
        .sum()
}

/// F16 weights (widened to f32) · f32 activations.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * 2);
    w.chunks_exact(2)
        .zip(x)
        .map(|(b, &x)| f16::from_le_bytes([b[0], b[1]]).to_f32() * x)
        .sum()
}

/// BF16 weights (widened to f32) · f32 activations.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * 2);
    w.chunks_exact(2)
        .zip(x)
        .map(|(b, &x)| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) * x)
        .sum()
}

/// Q4_0 · Q8_0: `Σ_blocks d_w d_x Σ (q_w - 8) q_x`.
pub fn dot_q4_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q4_0_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q4_0_BYTES).zip(x) {
        let mut isum = 0i32;
        for (j, &q) in b[2..18].iter().enumerate() {
            isum += (i32::from(q & 0x0F) - 8) * i32::from(y.qs[j]);
            isum += (i32::from(q >> 4) - 8) * i32::from(y.qs[j + 16]);
        }
        sum += isum as f32 * (f16_at(b, 0) * y.d);
    }
    sum
}

/// Q4_1 · Q8_1: `Σ_blocks d_w d_x Σ q_w q_x + m_w s_x`.
pub fn dot_q4_1(w: &[u8], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q4_1_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q4_1_BYTES).zip(x) {
        let mut isum = 0i32;
        for (j, &q) in b[4..20].iter().enumerate() {
            isum += i32::from(q & 0x0F) * i32::from(y.qs[j]);
            isum += i32::from(q >> 4) * i32::from(y.qs[j + 16]);
        }
        sum += isum as f32 * (f16_at(b, 0) * y.d) + f16_at(b, 2) * y.s;
    }
    sum
}

/// Q5_0 · Q8_0: five-bit quants offset by 16.
pub fn dot_q5_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q5_0_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q5_0_BYTES).zip(x) {
        let qh = u32_at(b, 2);
        let mut isum = 0i32;
        for (j, &q) in b[6..22].iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            isum += ((u32::from(q & 0x0F) | h0) as i32 - 16) * i32::from(y.qs[j]);
            isum += ((u32::from(q >> 4) | h1) as i32 - 16) * i32::from(y.qs[j + 16]);
        }
        sum += isum as f32 * (f16_at(b, 0) * y.d);
    }
    sum
}

/// Q5_1 · Q8_1: five-bit quants with a min.
pub fn dot_q5_1(w: &[u8], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q5_1_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q5_1_BYTES).zip(x) {
        let qh = u32_at(b, 4);
        let mut isum = 0i32;
        for (j, &q) in b[8..24].iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            isum += (u32::from(q & 0x0F) | h0) as i32 * i32::from(y.qs[j]);
            isum += (u32::from(q >> 4) | h1) as i32 * i32::from(y.qs[j + 16]);
        }
        sum += isum as f32 * (f16_at(b, 0) * y.d) + f16_at(b, 2) * y.s;
    }
    sum
}

/// Q8_0 · Q8_0.
pub fn dot_q8_0(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q8_0_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q8_0_BYTES).zip(x) {
        let isum: i32 = b[2..34]
            .iter()
            .zip(&y.qs)
            .map(|(&q, &v)| i32::from(q as i8) * i32::from(v))
            .sum();
        sum += isum as f32 * (f16_at(b, 0) * y.d);
    }
    sum
}

/// Q4_K · Q8_K: `d Σ_sub sc Σ q_w q_x - dmin Σ_sub m Σ q_x`, the second sum
/// read from the activations' `bsums`.
pub fn dot_q4k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q4K_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q4K_BYTES).zip(x) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        let mut isum = 0i32;
        for (j, q) in b[16..144].chunks_exact(32).enumerate() {
            let ys = &y.qs[64 * j..64 * j + 64];
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                lo += i32::from(q[l] & 0x0F) * i32::from(ys[l]);
                hi += i32::from(q[l] >> 4) * i32::from(ys[l + 32]);
            }
            isum += i32::from(sc[2 * j]) * lo + i32::from(sc[2 * j + 1]) * hi;
        }
        let msum = min_sum(&y.bsums, &m);
        sum += f16_at(b, 0) * y.d * isum as f32 - f16_at(b, 2) * y.d * msum as f32;
    }
    sum
}

/// Q5_K · Q8_K: as Q4_K with a fifth bit from `qh`.
pub fn dot_q5k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q5K_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q5K_BYTES).zip(x) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        let qh = &b[16..48];
        let mut isum = 0i32;
        for (j, q) in b[48..176].chunks_exact(32).enumerate() {
            let ys = &y.qs[64 * j..64 * j + 64];
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let h_lo = i32::from((qh[l] >> (2 * j)) & 1) << 4;
                let h_hi = i32::from((qh[l] >> (2 * j + 1)) & 1) << 4;
                lo += (i32::from(q[l] & 0x0F) | h_lo) * i32::from(ys[l]);
                hi += (i32::from(q[l] >> 4) | h_hi) * i32::from(ys[l + 32]);
            }
            isum += i32::from(sc[2 * j]) * lo + i32::from(sc[2 * j + 1]) * hi;
        }
        let msum = min_sum(&y.bsums, &m);
        sum += f16_at(b, 0) * y.d * isum as f32 - f16_at(b, 2) * y.d * msum as f32;
    }
    sum
}

/// Q6_K · Q8_K: six-bit quants offset by 32, one signed scale per 16.
pub fn dot_q6k(w: &[u8], x: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * Q6K_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(Q6K_BYTES).zip(x) {
        let mut isum = 0i32;
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            let ys = &y.qs[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                let s = |k: usize| i32::from(sc[is + k] as i8);
                isum += s(0) * q1 * i32::from(ys[l])
                    + s(2) * q2 * i32::from(ys[l + 32])
                    + s(4) * q3 * i32::from(ys[l + 64])
                    + s(6) * q4 * i32::from(ys[l + 96]);
            }
        }
        sum += f16_at(b, 208) * y.d * isum as f32;
    }
    sum
}

/// IQ4_NL · Q8_0: `Σ_blocks d_w d_x Σ table[q_w] q_x`.
pub fn dot_iq4_nl(w: &[u8], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * IQ4NL_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(IQ4NL_BYTES).zip(x) {
        let isum = nl_block_dot(&b[2..18], &y.qs);
        sum += isum as f32 * (f16_at(b, 0) * y.d);
    }
    sum
}

/// IQ4_XS · Q8_K: `Σ_superblocks d_w d_x Σ_sub s_sub Σ table[q_w] q_x`, the
/// whole super-block's sum in integers (exact: at most 8 · 63 · 32 · 127²).
pub fn dot_iq4_xs(w: &[u8], x: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(w.len(), x.len() * IQ4XS_BYTES);
    let mut sum = 0.0f32;
    for (b, y) in w.chunks_exact(IQ4XS_BYTES).zip(x) {
        let scales = iq4xs_scales(b);
        let isum: i32 = b[8..136]
            .chunks_exact(16)
            .zip(y.qs.chunks_exact(32))
            .zip(scales)
            .map(|((q, ys), s)| i32::from(s) * nl_block_dot(q, ys))
            .sum();
        sum += f16_at(b, 0) * y.d * isum as f32;
    }
    sum
}

/// Σ table[nibble] · y over one 32-element IQ4 block (16 bytes of nibbles:
/// low ones pair with `ys[..16]`, high ones with `ys[16..]`).
fn nl_block_dot(q: &[u8], ys: &[i8]) -> i32 {
    let mut isum = 0i32;
    for (j, &q) in q.iter().enumerate() {
        isum += i32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]) * i32::from(ys[j]);
        isum += i32::from(KVALUES_IQ4NL[usize::from(q >> 4)]) * i32::from(ys[j + 16]);
    }
    isum
}
