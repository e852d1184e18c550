//! The argument structs of the HIP kernels, mirroring `kernels/hip/args.h`
//! field for field (same order, same widths; pointers are device addresses
//! as `u64`). Each kernel takes one struct by value, so a launch passes a
//! single pointer to one of these. The size asserts here and the
//! static_asserts in args.h pin the same numbers.

/// `BhEmbeddingArgs`: `out[0..cols]` = dequantized row `token` of `table`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EmbeddingArgs {
    pub table: u64,
    pub out: u64,
    pub row_bytes: u64,
    pub token: u32,
    pub cols: u32,
    /// GGUF type id ([`crate::GgmlType::id`]).
    pub ty: u32,
    pub pad: u32,
}

/// `BhQuantizeArgs`: `n_tokens` rows of `cols` f32 activations into Q8_0
/// ([`Q8_0_DEVICE_BYTES`] per 32) or Q8_K ([`Q8_K_DEVICE_BYTES`] per 256) blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizeArgs {
    pub x: u64,
    pub out: u64,
    pub n_tokens: u32,
    pub cols: u32,
}

/// `BhMatArgs`: every matvec and the tiled matmul, `out[t * rows + r]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatArgs {
    pub w: u64,
    pub x: u64,
    pub out: u64,
    pub row_bytes: u64,
    pub rows: u32,
    pub cols: u32,
    pub n_tokens: u32,
    pub ty: u32,
}

/// `BhRmsNormArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RmsNormArgs {
    pub x: u64,
    pub weight: u64,
    pub out: u64,
    pub n_rows: u32,
    pub width: u32,
    pub eps: f32,
    pub pad: u32,
}

/// `BhRopeArgs`: `n_tokens` tokens at positions `start_pos..`, in place.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RopeArgs {
    pub x: u64,
    pub n_tokens: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub rot_dim: u32,
    pub start_pos: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// [`ROPE_NORMAL`] or [`ROPE_NEOX`].
    pub style: u32,
}

/// `BhRopeStyle` values.
pub const ROPE_NORMAL: u32 = 0;
pub const ROPE_NEOX: u32 = 1;

/// `BhSoftmaxArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxArgs {
    pub x: u64,
    pub n_rows: u32,
    pub width: u32,
}

/// `BhBinaryArgs`: `bh_add` (`a += b`) and `bh_silu_mul` (`a = silu(a) * b`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BinaryArgs {
    pub a: u64,
    pub b: u64,
    pub n: u64,
}

/// `BhAttentionArgs`: both attention passes (see `kernels/hip/attention.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionArgs {
    pub q: u64,
    pub k_pool: u64,
    pub v_pool: u64,
    /// Every sequence's block table, concatenated (u32 block indices).
    pub tables: u64,
    /// Per query row: where its sequence's table starts in `tables`.
    pub row_table: u64,
    /// Per query row: its position (it attends to `0..=pos`).
    pub row_pos: u64,
    /// `n_rows · n_heads · n_splits · head_dim` floats of scratch.
    pub partial_o: u64,
    /// `n_rows · n_heads · n_splits · 2` floats of scratch.
    pub partial_ml: u64,
    pub out: u64,
    pub n_rows: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub block_tokens: u32,
    pub split_positions: u32,
    pub n_splits: u32,
    pub scale: f32,
}

/// `BhSha256Args`: `out[32 i..]` = SHA-256(0x00 ‖ chunk i of `data[..len]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sha256Args {
    pub data: u64,
    pub out: u64,
    pub len: u64,
    pub chunk_bytes: u64,
}

/// Bytes of one Q8_0 activation block on the device (`BhQ8_0`: f32 scale, 32 quants).
pub const Q8_0_DEVICE_BYTES: usize = 36;
/// Bytes of one Q8_K activation block on the device (`BhQ8K`: f32 scale,
/// 256 quants, 16 i16 sums).
pub const Q8_K_DEVICE_BYTES: usize = 292;

// The sizes args.h asserts.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<EmbeddingArgs>() == 40);
    assert!(size_of::<QuantizeArgs>() == 24);
    assert!(size_of::<MatArgs>() == 48);
    assert!(size_of::<RmsNormArgs>() == 40);
    assert!(size_of::<RopeArgs>() == 40);
    assert!(size_of::<SoftmaxArgs>() == 16);
    assert!(size_of::<BinaryArgs>() == 24);
    assert!(size_of::<AttentionArgs>() == 104);
    assert!(size_of::<Sha256Args>() == 32);
};
