//! Weights repacked once, at load, for the VNNI matvec: every eight rows
//! interleaved block by block so that one 256-bit vector holds the same
//! four quants of all eight rows ([`PackedMatrix`]). Q4_0 and Q8_0; Q4_K
//! and Q6_K with their sub-block scales kept as integers, applied to exact
//! integer sums as ggml's K-quant dots do.
//!
//! The file's layout suits one row at a time: a block's scale, then its
//! quants. A one-row kernel pays a convert, a scale product and an FMA per
//! (row, block) on top of the integer dot; on packed rows `vpdpbusd` with
//! a broadcast activation dword feeds eight rows at once and the float work
//! is shared by them (see `avx2::x86::packed`). The packed form takes as
//! many bytes as the file's (Q4_0 stays 4-bit), so decode reads no more
//! memory than before; the last group of a matrix is padded with zero rows.
#![forbid(unsafe_code)]

use crate::blocks::{Q4_0_BYTES, Q4K_BYTES, Q5_0_BYTES, Q6K_BYTES, Q8_0_BYTES, scales_mins_k4};
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
/// ones `W[2j + 1]`), Q5_0 as Q4_0's nibbles (`K` = 16) then a vector whose
/// byte `4r + m` holds in bit `k` the fifth bit of `W[k]`'s byte.
#[derive(Clone)]
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Bytes,
}

/// Memory that holds the packed forms of several matrices, each in its own
/// range ([`PackedMatrix::in_region`]): one mapping the loader can back
/// with huge pages, which matrices of a few MiB each cannot fill alone.
pub type Region = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where a packed matrix's bytes are.
#[derive(Clone)]
enum Bytes {
    Own(Vec<u8>),
    In(Region, std::ops::Range<usize>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Own(bytes) => bytes,
            Bytes::In(region, range) => &(**region).as_ref()[range.clone()],
        }
    }
}

impl PartialEq for PackedMatrix {
    fn eq(&self, other: &PackedMatrix) -> bool {
        (self.ty, self.rows, self.cols) == (other.ty, other.rows, other.cols)
            && *self.data == *other.data
    }
}

impl Eq for PackedMatrix {}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &self.data.len())
            .field("in_region", &matches!(self.data, Bytes::In(..)))
            .finish()
    }
}

impl PackedMatrix {
    /// Whether `ty` has a packed form.
    pub fn packs(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q6K
        )
    }

    /// `m` repacked, or `None` for a type without a packed form.
    pub fn pack(m: &QuantMatrix<'_>) -> Option<PackedMatrix> {
        let mut data = vec![0u8; Self::packed_len(m)?];
        Self::pack_into(m, &mut data);
        Some(PackedMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data: Bytes::Own(data),
        })
    }

    /// Bytes of `m`'s packed form, or `None` for a type without one.
    pub fn packed_len(m: &QuantMatrix<'_>) -> Option<usize> {
        if !Self::packs(m.ty) {
            return None;
        }
        let blocks = m.cols / m.ty.block_elements();
        Some(m.rows.div_ceil(PACK_ROWS) * blocks * group_block_bytes(m.ty))
    }

    /// Writes `m`'s packed form to `out`, [`PackedMatrix::packed_len`]
    /// bytes (padding rows included, so `out` need not be zero).
    ///
    /// # Panics
    /// If `m`'s type has no packed form or `out` is not its length.
    pub fn pack_into(m: &QuantMatrix<'_>, out: &mut [u8]) {
        assert_eq!(Some(out.len()), Self::packed_len(m), "packed length");
        out.fill(0);
        let blocks = m.cols / m.ty.block_elements();
        let group_block = group_block_bytes(m.ty);
        for (g, group) in out.chunks_exact_mut(blocks * group_block).enumerate() {
            for (b, out) in group.chunks_exact_mut(group_block).enumerate() {
                for r in 0..PACK_ROWS.min(m.rows - g * PACK_ROWS) {
                    let row = m.row(g * PACK_ROWS + r);
                    match m.ty {
                        GgmlType::Q4K => pack_q4k_row_block(row, b, r, out),
                        GgmlType::Q6K => pack_q6k_row_block(row, b, r, out),
                        _ => pack_row_block(m.ty, row, b, r, out),
                    }
                }
            }
        }
    }

    /// The packed form of `m` that [`PackedMatrix::pack_into`] wrote to
    /// `range` of `region`.
    ///
    /// # Panics
    /// If `range` is not `m`'s packed length or lies outside `region`.
    pub fn in_region(
        m: &QuantMatrix<'_>,
        region: Region,
        range: std::ops::Range<usize>,
    ) -> PackedMatrix {
        assert_eq!(Some(range.len()), Self::packed_len(m), "packed length");
        assert!(
            range.end <= (*region).as_ref().len(),
            "range inside the region"
        );
        PackedMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data: Bytes::In(region, range),
        }
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

    /// Blocks per row: of 32 elements, or of 256 for Q4_K and Q6_K.
    pub fn blocks(&self) -> usize {
        self.cols / self.ty.block_elements()
    }

    /// The packed bytes of group `g` (rows `8g..8g + 8`): every block's.
    pub fn group(&self, g: usize) -> &[u8] {
        let n = self.blocks() * self.group_block_bytes();
        &self.data[g * n..(g + 1) * n]
    }

    /// The groups from `g` on, each as [`PackedMatrix::group`] gives it:
    /// for a run of groups, the bytes looked up once.
    pub fn groups_from(&self, g: usize) -> std::slice::ChunksExact<'_, u8> {
        let n = self.blocks() * self.group_block_bytes();
        self.data[g * n..].chunks_exact(n)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Every packed byte, in order: what a weight scrub hashes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
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
        GgmlType::Q5_0 => 16 + 128 + 32,
        GgmlType::Q4K => Q4K_GROUP_BYTES,
        GgmlType::Q6K => Q6K_GROUP_BYTES,
        _ => 16 + 256,
    }
}

/// A Q4_K super-block of eight rows: `d` and `dmin` (f16 per row), the
/// eight sub-blocks' 6-bit scales and mins (a byte per row), then each
/// sub-block's quants (0..=15) nibble-packed as Q4_0's are: 1184 bytes for
/// the 1152 of eight rows in the file.
pub(crate) const Q4K_GROUP_BYTES: usize = 16 + 16 + 64 + 64 + 8 * 128;
pub(crate) const Q4K_SCALES_AT: usize = 32;
pub(crate) const Q4K_MINS_AT: usize = 96;
pub(crate) const Q4K_QUANTS_AT: usize = 160;

/// Writes row `r`'s Q4_K super-block `b` into its lanes of `out`.
fn pack_q4k_row_block(row: &[u8], b: usize, r: usize, out: &mut [u8]) {
    let block = &row[b * Q4K_BYTES..(b + 1) * Q4K_BYTES];
    out[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
    out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&block[2..4]);
    let (scales, mins) = scales_mins_k4(&block[4..16]);
    for j in 0..8 {
        out[Q4K_SCALES_AT + 8 * j + r] = scales[j];
        out[Q4K_MINS_AT + 8 * j + r] = mins[j];
        let quants = &mut out[Q4K_QUANTS_AT + 128 * j..Q4K_QUANTS_AT + 128 * (j + 1)];
        let qs = &block[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
        for k in 0..8 {
            for m in 0..4 {
                let q = (qs[4 * k + m] >> (4 * (j % 2))) & 0x0F;
                quants[32 * (k / 2) + 4 * r + m] |= q << (4 * (k % 2));
            }
        }
    }
}

/// Writes row `r`'s block `b` (of `row`, in the file's layout) into its
/// lanes of the group's packed block `out`.
fn pack_row_block(ty: GgmlType, row: &[u8], b: usize, r: usize, out: &mut [u8]) {
    let bytes = match ty {
        GgmlType::Q4_0 => Q4_0_BYTES,
        GgmlType::Q5_0 => Q5_0_BYTES,
        _ => Q8_0_BYTES,
    };
    let block = &row[b * bytes..(b + 1) * bytes];
    let quant = |e| match ty {
        GgmlType::Q4_0 => q4_0_nibble(block, e),
        GgmlType::Q5_0 => q5_0_quant(block, e),
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
                GgmlType::Q5_0 => {
                    quants[32 * (k / 2) + at] |= (q & 0x0F) << (4 * (k % 2));
                    quants[128 + at] |= (q >> 4) << k;
                }
                _ => quants[32 * k + at] = q,
            }
        }
    }
}

/// A Q6_K super-block of eight rows: `d` (f16 per row), the sixteen
/// 16-element sub-blocks' scales (an i8 per row), then per 32-element
/// sub-block the quants (`q + 32`, 0..=63): their low nibbles packed as
/// Q4_0's (128 bytes), then their top two bits, two vectors whose byte
/// `4r + m` holds, in bits `2k' .. 2k' + 2`, those of element `4k + m`
/// (`k' = k % 4`; `k < 4` in the first). 1680 bytes, as eight rows in the
/// file.
pub(crate) const Q6K_GROUP_BYTES: usize = 16 + 128 + 8 * 192;
pub(crate) const Q6K_SCALES_AT: usize = 16;
pub(crate) const Q6K_QUANTS_AT: usize = 144;

/// Writes row `r`'s Q6_K super-block `b` into its lanes of `out`.
fn pack_q6k_row_block(row: &[u8], b: usize, r: usize, out: &mut [u8]) {
    let block = &row[b * Q6K_BYTES..(b + 1) * Q6K_BYTES];
    out[2 * r..2 * r + 2].copy_from_slice(&block[208..210]);
    for s in 0..16 {
        out[Q6K_SCALES_AT + 8 * s + r] = block[192 + s];
    }
    for j in 0..8 {
        let sub = &mut out[Q6K_QUANTS_AT + 192 * j..Q6K_QUANTS_AT + 192 * (j + 1)];
        for k in 0..8 {
            for m in 0..4 {
                let q = q6k_quant(block, 32 * j + 4 * k + m);
                let at = 4 * r + m;
                sub[32 * (k / 2) + at] |= (q & 0x0F) << (4 * (k % 2));
                sub[128 + 32 * (k / 4) + at] |= (q >> 4) << (2 * (k % 4));
            }
        }
    }
}

/// Element `e` (0..256) of a Q6_K super-block as stored: `q + 32`, 0..=63.
/// Element `128 n + 32 g + l` takes a nibble of `ql[64 n + 32 (g % 2) + l]`
/// (the high one for `g >= 2`) and bits `2g, 2g + 1` of `qh[32 n + l]`.
fn q6k_quant(block: &[u8], e: usize) -> u8 {
    let (n, g, l) = (e / 128, e % 128 / 32, e % 32);
    let ql = block[64 * n + 32 * (g % 2) + l];
    let low = if g < 2 { ql & 0x0F } else { ql >> 4 };
    let high = (block[128 + 32 * n + l] >> (2 * g)) & 3;
    low | (high << 4)
}

/// Element `e` of a Q4_0 block as stored: `q + 8`, 0..=15.
fn q4_0_nibble(block: &[u8], e: usize) -> u8 {
    let byte = block[2 + e % 16];
    if e < 16 { byte & 0x0F } else { byte >> 4 }
}

/// Element `e` of a Q5_0 block as stored: `q + 16`, 0..=31 (its fifth bit
/// is bit `e` of the block's `qh`).
fn q5_0_quant(block: &[u8], e: usize) -> u8 {
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let byte = block[6 + e % 16];
    let low = if e < 16 { byte & 0x0F } else { byte >> 4 };
    low | ((((qh >> e) & 1) as u8) << 4)
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
    fn only_q4_0_q8_0_q4_k_and_q6_k_pack() {
        let data = vec![0u8; 4 * 34];
        let m = QuantMatrix::new(GgmlType::Q8_0, &data, 4, 32).unwrap();
        assert!(PackedMatrix::pack(&m).is_some());
        assert!(PackedMatrix::packs(GgmlType::Q4K) && PackedMatrix::packs(GgmlType::Q6K));
        for ty in [GgmlType::F16, GgmlType::Q4_1, GgmlType::Q5K] {
            assert!(!PackedMatrix::packs(ty), "{ty}");
        }
    }

    #[test]
    fn a_form_packed_into_a_shared_region_equals_one_packed_alone() {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let (rows, cols) = (11, 64);
            let data: Vec<u8> = (0..rows * cols / 32 * ty.block_bytes())
                .map(|i| (i * 5 + i / 7) as u8)
                .collect();
            let m = QuantMatrix::new(ty, &data, rows, cols).unwrap();
            let alone = PackedMatrix::pack(&m).unwrap();
            let n = PackedMatrix::packed_len(&m).unwrap();
            assert_eq!(n, alone.bytes());
            // Dirty memory around and under the range: padding rows must
            // still come out zero.
            let mut region = vec![0xA5u8; n + 100];
            PackedMatrix::pack_into(&m, &mut region[40..40 + n]);
            assert_eq!(region[..40], [0xA5; 40]);
            assert_eq!(region[40 + n..], [0xA5; 60]);
            let region: Region = std::sync::Arc::new(region);
            let shared = PackedMatrix::in_region(&m, region, 40..40 + n);
            assert_eq!(shared, alone, "{ty}");
            assert_eq!(shared.as_bytes(), alone.as_bytes());
            assert_eq!(shared.group(1), alone.group(1));
            let groups: Vec<&[u8]> = shared.groups_from(0).collect();
            assert_eq!(groups, [alone.group(0), alone.group(1)]);
        }
    }
}
