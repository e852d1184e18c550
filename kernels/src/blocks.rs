//! Byte layouts of GGML's weight blocks, shared by every ISA.
//!
//! Offsets follow ggml's `block_*` structs; all fields are little-endian.
#![forbid(unsafe_code)]

use half::f16;

/// Elements per block of the 32-element types (Q4_0 … Q8_0).
pub(crate) const QK: usize = 32;
/// Elements per K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// Q4_0: `d: f16, qs: [u8; 16]`.
pub(crate) const Q4_0_BYTES: usize = 18;
/// Q4_1: `d: f16, m: f16, qs: [u8; 16]`.
pub(crate) const Q4_1_BYTES: usize = 20;
/// Q5_0: `d: f16, qh: [u8; 4], qs: [u8; 16]`.
pub(crate) const Q5_0_BYTES: usize = 22;
/// Q5_1: `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]`.
pub(crate) const Q5_1_BYTES: usize = 24;
/// Q8_0: `d: f16, qs: [i8; 32]`.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Q4_K: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`.
pub(crate) const Q4K_BYTES: usize = 144;
/// Q5_K: `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`.
pub(crate) const Q5K_BYTES: usize = 176;
/// Q6_K: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`.
pub(crate) const Q6K_BYTES: usize = 210;

/// IQ4_NL: `d: f16, qs: [u8; 16]`, nibbles indexing [`KVALUES_IQ4NL`].
pub(crate) const IQ4NL_BYTES: usize = 18;
/// IQ4_XS: `d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]`.
pub(crate) const IQ4XS_BYTES: usize = 136;

/// The sixteen values an IQ4_NL/IQ4_XS nibble stands for (ggml's
/// `kvalues_iq4nl`): denser near zero, where most weights are.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The eight signed sub-block scales of an IQ4_XS super-block: 6 bits each,
/// the low four from `scales_l` (two per byte, low nibble first), the top
/// two from `scales_h` (two bits per sub-block, from bit 0), minus 32.
#[inline]
pub(crate) fn iq4xs_scales(block: &[u8]) -> [i8; 8] {
    let h = u16::from_le_bytes([block[2], block[3]]);
    let low = &block[4..8];
    let mut out = [0i8; 8];
    for (ib, s) in out.iter_mut().enumerate() {
        let lo = (low[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        *s = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// The f16 at byte offset `at`, widened to f32 (exactly).
#[inline]
pub(crate) fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// The u32 at byte offset `at` (Q5_0/Q5_1 high bits).
#[inline]
pub(crate) fn u32_at(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block, unpacked
/// from their 12-byte packing (ggml's `get_scale_min_k4` for j = 0..8).
#[inline]
pub(crate) fn scales_mins_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let q = &packed[..12];
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            scales[j] = q[j] & 63;
            mins[j] = q[j + 4] & 63;
        } else {
            scales[j] = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
            mins[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (scales, mins)
}

/// Σ over the 16 sixteen-quant groups of a Q8_K block of `bsums[g] * mins[g / 2]`:
/// the integer part of a Q4_K/Q5_K block's min term.
#[inline]
pub(crate) fn min_sum(bsums: &[i16; 16], mins: &[u8; 8]) -> i32 {
    bsums
        .iter()
        .enumerate()
        .map(|(g, &s)| i32::from(s) * i32::from(mins[g / 2]))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_constants_match_type_table() {
        use crate::GgmlType as T;
        for (ty, bytes) in [
            (T::Q4_0, Q4_0_BYTES),
            (T::Q4_1, Q4_1_BYTES),
            (T::Q5_0, Q5_0_BYTES),
            (T::Q5_1, Q5_1_BYTES),
            (T::Q8_0, Q8_0_BYTES),
            (T::Q4K, Q4K_BYTES),
            (T::Q5K, Q5K_BYTES),
            (T::Q6K, Q6K_BYTES),
            (T::IQ4NL, IQ4NL_BYTES),
            (T::IQ4XS, IQ4XS_BYTES),
        ] {
            assert_eq!(ty.block_bytes(), bytes, "{ty}");
        }
    }

    #[test]
    fn iq4xs_scales_take_low_nibbles_and_two_high_bits_each() {
        let mut block = [0u8; IQ4XS_BYTES];
        // scales_h: sub-block 0 gets 0b11, 1 gets 0b01, 7 gets 0b10.
        let h: u16 = 0b11 | (0b01 << 2) | (0b10 << 14);
        block[2..4].copy_from_slice(&h.to_le_bytes());
        // scales_l: sub-blocks 0/1 in byte 0 (low nibble first), 6/7 in byte 3.
        block[4] = 0x5A;
        block[7] = 0xF0;
        let s = iq4xs_scales(&block);
        assert_eq!(s[0], (0xA | (0b11 << 4)) - 32);
        assert_eq!(s[1], (0x5 | (0b01 << 4)) - 32);
        assert_eq!(s[2], -32);
        assert_eq!(s[6], -32);
        assert_eq!(s[7], (0xF | (0b10 << 4)) - 32);
    }

    #[test]
    fn k4_scales_unpack_low_and_high_halves() {
        // scales 0..4 live in the low 6 bits of bytes 0..4, mins in bytes 4..8;
        // scales/mins 4..8 take their low nibble from bytes 8..12 and their top
        // two bits from the top of bytes 0..4 / 4..8.
        let packed = [
            0b11_000001,
            2,
            3,
            4,
            0b01_000101,
            6,
            7,
            8,
            0x9A,
            0xBC,
            0xDE,
            0xF0,
        ];
        let (sc, m) = scales_mins_k4(&packed);
        assert_eq!(&sc[..4], &[1, 2, 3, 4]);
        assert_eq!(&m[..4], &[5, 6, 7, 8]);
        assert_eq!(sc[4], 0xA | (0b11 << 4));
        assert_eq!(m[4], 0x9 | (0b01 << 4));
        assert_eq!(sc[7], 0x0);
        assert_eq!(m[7], 0xF);
    }
}
