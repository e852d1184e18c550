//! Weights repacked once, at load, for the VNNI matvec: every eight rows
//! interleaved block by block so that one 256-bit vector holds the same
//! four quants of all eight rows ([`PackedMatrix`]).
//!
//! The file's layout suits one row at a time: a block's scale, then its
//! quants. A one-row kernel pays a convert, a scale product and an FMA per
//! (row, block) on top of the integer dot; on packed rows `vpdpbusd` with
//! a broadcast activation dword feeds eight rows at once and the float work
//! is shared by them (see `avx2::x86::packed`). The packed form takes as
//! many bytes as the file's (Q4_0 stays 4-bit), so decode reads no more
//! memory than before; the last group of a matrix is padded with zero rows.
#![forbid(unsafe_code)]

use crate::blocks::{Q4_0_BYTES, Q8_0_BYTES, QK};
use crate::{GgmlType, QuantMatrix};

/// Rows interleaved in a group.
pub const PACK_ROWS: usize = 8;

/// A matrix repacked for the VNNI matvec; see the module docs.
///
/// Per group of eight rows and per 32-element block: the eight rows' f16
/// scales (16 bytes), then the quants as eight 32-byte vectors `W[k]`, lane
/// `r` (bytes `4r..4r + 4`) holding row `r`'s quants `4k..4k + 4` as
/// unsigned `q + K`: Q8_0 as bytes (`K` = 128, 256 bytes), Q4_0 as nibbles
/// (`K` = 8, 128 bytes: the low nibbles of vector `j` are `W[2j]`, the high
/// ones `W[2j + 1]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Whether `ty` has a packed form.
    pub fn packs(ty: GgmlType) -> bool {
        matches!(ty, GgmlType::Q4_0 | GgmlType::Q8_0)
    }

    /// `m` repacked, or `None` for a type without a packed form.
    pub fn pack(m: &QuantMatrix<'_>) -> Option<PackedMatrix> {
        if !Self::packs(m.ty) {
            return None;
        }
        let blocks = m.cols / QK;
        let groups = m.rows.div_ceil(PACK_ROWS);
        let group_block = group_block_bytes(m.ty);
        let mut data = vec![0u8; groups * blocks * group_block];
        for (g, group) in data.chunks_exact_mut(blocks * group_block).enumerate() {
            for (b, out) in group.chunks_exact_mut(group_block).enumerate() {
                for r in 0..PACK_ROWS.min(m.rows - g * PACK_ROWS) {
                    let row = m.row(g * PACK_ROWS + r);
                    pack_row_block(m.ty, row, b, r, out);
                }
            }
        }
        Some(PackedMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one (group, block).
    pub fn group_block_bytes(&self) -> usize {
        group_block_bytes(self.ty)
    }

    /// The packed bytes of group `g` (rows `8g..8g + 8`): every block's.
    pub fn group(&self, g: usize) -> &[u8] {
        let n = self.cols / QK * self.group_block_bytes();
        &self.data[g * n..(g + 1) * n]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether this is `m` packed: same type and shape (the caller keeps
    /// the pairing; this catches a mix-up, not a different matrix of the
    /// same shape).
    pub fn fits(&self, m: &QuantMatrix<'_>) -> bool {
        (self.ty, self.rows, self.cols) == (m.ty, m.rows, m.cols)
    }
}

fn group_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_0 => 16 + 128,
        _ => 16 + 256,
    }
}

/// Writes row `r`'s block `b` (of `row`, in the file's layout) into its
/// lanes of the group's packed block `out`.
fn pack_row_block(ty: GgmlType, row: &[u8], b: usize, r: usize, out: &mut [u8]) {
    let bytes = match ty {
        GgmlType::Q4_0 => Q4_0_BYTES,
        _ => Q8_0_BYTES,
    };
    let block = &row[b * bytes..(b + 1) * bytes];
    let quant = |e| match ty {
        GgmlType::Q4_0 => q4_0_nibble(block, e),
        _ => q8_0_offset(block, e),
    };
    out[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
    let quants = &mut out[16..];
    for k in 0..8 {
        for m in 0..4 {
            let q = quant(4 * k + m);
            let at = 4 * r + m;
            match ty {
                GgmlType::Q4_0 => quants[32 * (k / 2) + at] |= q << (4 * (k % 2)),
                _ => quants[32 * k + at] = q,
            }
        }
    }
}

/// Element `e` of a Q4_0 block as stored: `q + 8`, 0..=15.
fn q4_0_nibble(block: &[u8], e: usize) -> u8 {
    let byte = block[2 + e % 16];
    if e < 16 { byte & 0x0F } else { byte >> 4 }
}

/// Element `e` of a Q8_0 block offset to unsigned: `q + 128`.
fn q8_0_offset(block: &[u8], e: usize) -> u8 {
    block[2 + e] ^ 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `e` of row `r`'s block `b` read back from the packed form.
    fn unpacked(p: &PackedMatrix, r: usize, b: usize, e: usize) -> (u16, u8) {
        let gb = p.group_block_bytes();
        let blk = &p.group(r / PACK_ROWS)[b * gb..(b + 1) * gb];
        let lane = r % PACK_ROWS;
        let scale = u16::from_le_bytes([blk[2 * lane], blk[2 * lane + 1]]);
        let (k, m) = (e / 4, e % 4);
        let q = match p.ty {
            GgmlType::Q4_0 => (blk[16 + 32 * (k / 2) + 4 * lane + m] >> (4 * (k % 2))) & 0x0F,
            _ => blk[16 + 32 * k + 4 * lane + m],
        };
        (scale, q)
    }

    #[test]
    fn every_quant_and_scale_lands_in_its_lane() {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let (rows, cols) = (11, 64);
            let bytes = ty.block_bytes();
            let data: Vec<u8> = (0..rows * cols / 32 * bytes)
                .map(|i| (i * 7 + i / 13) as u8)
                .collect();
            let m = QuantMatrix::new(ty, &data, rows, cols).unwrap();
            let p = PackedMatrix::pack(&m).unwrap();
            assert!(p.fits(&m));
            // Two groups, the second padded with zero rows.
            assert_eq!(p.bytes(), 2 * 2 * p.group_block_bytes());
            for r in 0..16 {
                for b in 0..2 {
                    for e in 0..32 {
                        let (scale, q) = unpacked(&p, r, b, e);
                        if r >= rows {
                            assert_eq!((scale, q), (0, 0), "padding row {r}");
                            continue;
                        }
                        let blk = &m.row(r)[b * bytes..(b + 1) * bytes];
                        let want_scale = u16::from_le_bytes([blk[0], blk[1]]);
                        let want_q = match ty {
                            GgmlType::Q4_0 => q4_0_nibble(blk, e),
                            _ => blk[2 + e] ^ 0x80,
                        };
                        assert_eq!(
                            (scale, q),
                            (want_scale, want_q),
                            "{ty} row {r} block {b} e {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_q4_0_and_q8_0_pack() {
        let data = vec![0u8; 4 * 34];
        let m = QuantMatrix::new(GgmlType::Q8_0, &data, 4, 32).unwrap();
        assert!(PackedMatrix::pack(&m).is_some());
        for ty in [GgmlType::F16, GgmlType::Q4K, GgmlType::Q6K] {
            assert!(!PackedMatrix::packs(ty), "{ty}");
        }
    }
}
