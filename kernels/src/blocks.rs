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
        ] {
            assert_eq!(ty.block_bytes(), bytes, "{ty}");
        }
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
