//! Weight rows to f32 (embedding lookup, small vectors, tests). The scalar
//! code is the oracle; F32, F16, BF16, Q8_0 and Q4_0 rows (the usual
//! embedding-table types) also have an AVX2 path with bit-identical results.
#![forbid(unsafe_code)]

use half::f16;

use crate::GgmlType;
use crate::avx2::Avx2;
use crate::blocks::*;

/// Dequantizes one row of `ty` from `src` into `dst` (`dst.len()` elements),
/// on AVX2 when the CPU has it and the type has a vector path.
///
/// # Panics
/// As [`dequantize_row_scalar`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    if let Some(k) = Avx2::detect()
        && k.dequantize_row(ty, src, dst)
    {
        return;
    }
    dequantize_row_scalar(ty, src, dst);
}

/// The scalar oracle of [`dequantize_row`].
///
/// # Panics
/// If `dst.len()` is not a whole number of blocks or `src` is not exactly the
/// bytes of that many elements: both are caller bugs (lengths come from a
/// validated tensor shape).
pub fn dequantize_row_scalar(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let want = ty
        .bytes_for(dst.len() as u64)
        .unwrap_or_else(|e| panic!("dequantize_row: {e}"));
    assert_eq!(
        src.len() as u64,
        want,
        "dequantize_row: {} elements of {ty} need {want} bytes",
        dst.len()
    );
    match ty {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        GgmlType::Q4_0 => blocks(src, dst, Q4_0_BYTES, QK, q4_0),
        GgmlType::Q4_1 => blocks(src, dst, Q4_1_BYTES, QK, q4_1),
        GgmlType::Q5_0 => blocks(src, dst, Q5_0_BYTES, QK, q5_0),
        GgmlType::Q5_1 => blocks(src, dst, Q5_1_BYTES, QK, q5_1),
        GgmlType::Q8_0 => blocks(src, dst, Q8_0_BYTES, QK, q8_0),
        GgmlType::Q4K => blocks(src, dst, Q4K_BYTES, QK_K, q4_k),
        GgmlType::Q5K => blocks(src, dst, Q5K_BYTES, QK_K, q5_k),
        GgmlType::Q6K => blocks(src, dst, Q6K_BYTES, QK_K, q6_k),
        GgmlType::IQ4NL => blocks(src, dst, IQ4NL_BYTES, QK, iq4_nl),
        GgmlType::IQ4XS => blocks(src, dst, IQ4XS_BYTES, QK_K, iq4_xs),
    }
}

fn blocks(src: &[u8], dst: &mut [f32], bytes: usize, elems: usize, f: fn(&[u8], &mut [f32])) {
    for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(elems)) {
        f(b, y);
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((u32::from(q & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = ((u32::from(q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32_at(b, 4);
    for (j, &q) in b[8..24].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (u32::from(q & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = (u32::from(q >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = f32::from(q as i8) * d;
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_mins_k4(&b[4..16]);
    for (j, (q, y)) in b[16..144]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (d1, m1) = (d * f32::from(sc[2 * j]), dmin * f32::from(m[2 * j]));
        let (d2, m2) = (d * f32::from(sc[2 * j + 1]), dmin * f32::from(m[2 * j + 1]));
        for l in 0..32 {
            y[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_mins_k4(&b[4..16]);
    let qh = &b[16..48];
    for (j, (q, y)) in b[48..176]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (d1, m1) = (d * f32::from(sc[2 * j]), dmin * f32::from(m[2 * j]));
        let (d2, m2) = (d * f32::from(sc[2 * j + 1]), dmin * f32::from(m[2 * j + 1]));
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * f32::from((q[l] & 0x0F) + h1) - m1;
            y[l + 32] = d2 * f32::from((q[l] >> 4) + h2) - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    let scales = &b[192..208];
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &scales[8 * n..8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * f32::from(sc[is + k] as i8);
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

/// `d · table[nibble]`: low nibbles are elements 0..16, high ones 16..32.
fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    nl_nibbles(d, &b[2..18], y);
}

/// Eight sub-blocks of 32, each an IQ4_NL block whose scale is
/// `d · (6-bit scale - 32)`.
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales = iq4xs_scales(b);
    for ((q, y), s) in b[8..136]
        .chunks_exact(16)
        .zip(y.chunks_exact_mut(32))
        .zip(scales)
    {
        nl_nibbles(d * f32::from(s), q, y);
    }
}

fn nl_nibbles(d: f32, q: &[u8], y: &mut [f32]) {
    for (j, &q) in q.iter().enumerate() {
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}
