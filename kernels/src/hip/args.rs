//! The argument structs of the HIP kernels, mirroring `kernels/hip/args.h`
//! field for field (same order, same widths; pointers are device addresses
//! as `u64`). Each kernel takes one struct by value, so a launch passes a
//! single pointer to one of these. The size asserts here and the
//! static_asserts in args.h pin the same numbers.

/// The bytes a kernel receives: the fields in order, little-endian, with no
/// padding (every struct is laid out so there is none). A launch passes
/// these (`HIP_LAUNCH_PARAM_BUFFER_POINTER`), so nothing casts a Rust struct
/// to bytes.
pub trait KernelArgs {
    /// The kernel's argument buffer.
    fn to_bytes(&self) -> Vec<u8>;
}

/// Declares an args struct (`#[repr(C)]`, so `size_of` is the C size too)
/// and its [`KernelArgs`] encoding.
macro_rules! kernel_args {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl KernelArgs for $name {
            fn to_bytes(&self) -> Vec<u8> {
                let mut bytes = Vec::with_capacity(std::mem::size_of::<$name>());
                $(bytes.extend_from_slice(&self.$field.to_le_bytes());)*
                bytes
            }
        }
    };
}

kernel_args! {
    /// `BhEmbeddingArgs`: row `r` of `out` = dequantized row `tokens[r]`
    /// of `table`, for the grid's `y` rows.
    EmbeddingArgs {
        pub table: u64,
        /// u32 token ids, one per grid row.
        pub tokens: u64,
        pub out: u64,
        pub row_bytes: u64,
        pub cols: u32,
        /// GGUF type id ([`crate::GgmlType::id`]).
        pub ty: u32,
    }
}

kernel_args! {
    /// `BhQuantizeArgs`: `n_tokens` rows of `cols` f32 activations into Q8_0
    /// ([`Q8_0_DEVICE_BYTES`] per 32) or Q8_K ([`Q8_K_DEVICE_BYTES`] per 256) blocks.
    QuantizeArgs {
        pub x: u64,
        pub out: u64,
        pub n_tokens: u32,
        pub cols: u32,
    }
}

kernel_args! {
    /// `BhMatArgs`: every matvec and the tiled matmul, `out[t * rows + r]`.
    MatArgs {
        pub w: u64,
        pub x: u64,
        pub out: u64,
        pub row_bytes: u64,
        pub rows: u32,
        pub cols: u32,
        pub n_tokens: u32,
        pub ty: u32,
    }
}

kernel_args! {
    /// `BhRmsNormArgs`.
    RmsNormArgs {
        pub x: u64,
        pub weight: u64,
        pub out: u64,
        pub n_rows: u32,
        pub width: u32,
        pub eps: f32,
        pub pad: u32,
    }
}

kernel_args! {
    /// `BhRopeArgs`: `n_tokens` rows, row `t` at position `positions[t]`, in place.
    RopeArgs {
        pub x: u64,
        /// u32 positions, one per row.
        pub positions: u64,
        pub n_tokens: u32,
        pub n_heads: u32,
        pub head_dim: u32,
        pub rot_dim: u32,
        pub freq_base: f32,
        pub freq_scale: f32,
        /// [`ROPE_NORMAL`] or [`ROPE_NEOX`].
        pub style: u32,
        pub pad: u32,
    }
}

/// `BhRopeStyle` values.
pub const ROPE_NORMAL: u32 = 0;
pub const ROPE_NEOX: u32 = 1;

kernel_args! {
    /// `BhSoftmaxArgs`.
    SoftmaxArgs {
        pub x: u64,
        pub n_rows: u32,
        pub width: u32,
    }
}

kernel_args! {
    /// `BhBinaryArgs`: `bh_add` (`a += b`) and `bh_silu_mul` (`a = silu(a) * b`).
    BinaryArgs {
        pub a: u64,
        pub b: u64,
        pub n: u64,
    }
}

kernel_args! {
    /// `BhAttentionArgs`: both attention passes (see `kernels/hip/attention.hip`).
    AttentionArgs {
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
}

kernel_args! {
    /// `BhKvStoreArgs`: row `r` of `k` and `v` into position `row_pos[r]`
    /// of its sequence's blocks (addressed as in [`AttentionArgs`]).
    KvStoreArgs {
        pub k: u64,
        pub v: u64,
        pub k_pool: u64,
        pub v_pool: u64,
        pub tables: u64,
        pub row_table: u64,
        pub row_pos: u64,
        pub n_rows: u32,
        pub kv_dim: u32,
        pub block_tokens: u32,
        pub pad: u32,
    }
}

kernel_args! {
    /// `BhAddRowsArgs`: `a[i] += b[i % width]` for `i < n`.
    AddRowsArgs {
        pub a: u64,
        pub b: u64,
        pub n: u64,
        pub width: u32,
        pub pad: u32,
    }
}

kernel_args! {
    /// `BhGatherArgs`: row `j` of `out` = row `rows[j]` of `x`.
    GatherArgs {
        pub x: u64,
        /// u32 row indices.
        pub rows: u64,
        pub out: u64,
        pub n_rows: u32,
        pub width: u32,
    }
}

kernel_args! {
    /// `BhSha256Args`: `out[32 i..]` = SHA-256(0x00 ‖ chunk i of `data[..len]`).
    Sha256Args {
        pub data: u64,
        pub out: u64,
        pub len: u64,
        pub chunk_bytes: u64,
    }
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
    assert!(size_of::<RopeArgs>() == 48);
    assert!(size_of::<SoftmaxArgs>() == 16);
    assert!(size_of::<BinaryArgs>() == 24);
    assert!(size_of::<AttentionArgs>() == 104);
    assert!(size_of::<KvStoreArgs>() == 72);
    assert!(size_of::<AddRowsArgs>() == 32);
    assert!(size_of::<GatherArgs>() == 32);
    assert!(size_of::<Sha256Args>() == 32);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// No padding anywhere: the encoding is exactly the C struct.
    #[test]
    fn encodings_are_the_struct_sizes() {
        use std::mem::size_of;
        assert_eq!(
            EmbeddingArgs::default().to_bytes().len(),
            size_of::<EmbeddingArgs>()
        );
        assert_eq!(
            QuantizeArgs::default().to_bytes().len(),
            size_of::<QuantizeArgs>()
        );
        assert_eq!(MatArgs::default().to_bytes().len(), size_of::<MatArgs>());
        assert_eq!(
            RmsNormArgs::default().to_bytes().len(),
            size_of::<RmsNormArgs>()
        );
        assert_eq!(RopeArgs::default().to_bytes().len(), size_of::<RopeArgs>());
        assert_eq!(
            SoftmaxArgs::default().to_bytes().len(),
            size_of::<SoftmaxArgs>()
        );
        assert_eq!(
            BinaryArgs::default().to_bytes().len(),
            size_of::<BinaryArgs>()
        );
        assert_eq!(
            AttentionArgs::default().to_bytes().len(),
            size_of::<AttentionArgs>()
        );
        assert_eq!(
            Sha256Args::default().to_bytes().len(),
            size_of::<Sha256Args>()
        );
        assert_eq!(
            KvStoreArgs::default().to_bytes().len(),
            size_of::<KvStoreArgs>()
        );
        assert_eq!(
            AddRowsArgs::default().to_bytes().len(),
            size_of::<AddRowsArgs>()
        );
        assert_eq!(
            GatherArgs::default().to_bytes().len(),
            size_of::<GatherArgs>()
        );
    }

    #[test]
    fn fields_land_in_declaration_order() {
        let a = MatArgs {
            w: 1,
            x: 2,
            out: 3,
            row_bytes: 4,
            rows: 5,
            cols: 6,
            n_tokens: 7,
            ty: 8,
        };
        let b = a.to_bytes();
        assert_eq!(&b[0..8], &1u64.to_le_bytes());
        assert_eq!(&b[24..32], &4u64.to_le_bytes());
        assert_eq!(&b[32..36], &5u32.to_le_bytes());
        assert_eq!(&b[44..48], &8u32.to_le_bytes());
    }
}
