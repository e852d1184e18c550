//! GGML tensor element types: ids as stored in GGUF, block geometry and byte sizes.

/// A tensor element type as numbered in GGUF/GGML files.
///
/// Only the types the engine can compute with are listed; GGUF files using
/// another id are refused by the reader with the id named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    BF16,
    /// 32 elements as 4-bit indices into a fixed non-linear table, one f16 scale.
    IQ4NL,
    /// IQ4_NL's table in 256-element super-blocks with 6-bit sub-block scales.
    IQ4XS,
}

/// A row length or element count that does not fit a type's block geometry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TypeError {
    #[error("{ty} stores elements in blocks of {block}; {elements} elements is not a multiple")]
    NotBlockMultiple {
        ty: GgmlType,
        block: usize,
        elements: u64,
    },
    #[error("{elements} elements of {ty} overflow the addressable byte size")]
    TooLarge { ty: GgmlType, elements: u64 },
}

impl GgmlType {
    /// Every supported type, for tests and tables.
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::BF16,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
    ];

    /// The type with GGUF id `id`, if the engine supports it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            20 => GgmlType::IQ4NL,
            23 => GgmlType::IQ4XS,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// The GGUF id of this type.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ4XS => 23,
            GgmlType::BF16 => 30,
        }
    }

    /// Elements per block (1 for plain float types).
    pub fn block_elements(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4NL => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::IQ4XS => 256,
        }
    }

    /// Bytes per block, as laid out by GGML.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4K => 2 + 2 + 12 + 128,
            GgmlType::Q5K => 2 + 2 + 12 + 32 + 128,
            GgmlType::Q6K => 128 + 64 + 16 + 2,
            GgmlType::IQ4NL => 2 + 16,
            GgmlType::IQ4XS => 2 + 2 + 4 + 128,
        }
    }

    /// Bytes needed for `elements` values, checking block alignment and overflow.
    pub fn bytes_for(self, elements: u64) -> Result<u64, TypeError> {
        let block = self.block_elements() as u64;
        if !elements.is_multiple_of(block) {
            return Err(TypeError::NotBlockMultiple {
                ty: self,
                block: block as usize,
                elements,
            });
        }
        (elements / block)
            .checked_mul(self.block_bytes() as u64)
            .ok_or(TypeError::TooLarge { ty: self, elements })
    }

    /// The name llama.cpp prints for this type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::BF16 => "BF16",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        }
        // Q8_1 (9), Q2_K (10), Q3_K (11), Q8_K (15) and the IQ types other
        // than IQ4_NL (20) and IQ4_XS (23) are not supported.
        for id in [4, 5, 9, 10, 11, 15, 16, 19, 21, 22, 24, 29, 99, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn block_sizes_match_ggml() {
        // Sizes from ggml's block structs (sizeof(block_q4_K) == 144, etc.).
        assert_eq!(GgmlType::Q4K.block_bytes(), 144);
        assert_eq!(GgmlType::Q5K.block_bytes(), 176);
        assert_eq!(GgmlType::Q6K.block_bytes(), 210);
        assert_eq!(GgmlType::Q5_0.block_bytes(), 22);
        assert_eq!(GgmlType::Q5_1.block_bytes(), 24);
        // block_iq4_nl {d, qs[16]}; block_iq4_xs {d, scales_h, scales_l[4], qs[128]}.
        assert_eq!(GgmlType::IQ4NL.block_bytes(), 18);
        assert_eq!(GgmlType::IQ4XS.block_bytes(), 136);
        assert_eq!(GgmlType::IQ4XS.bytes_for(512), Ok(272));
    }

    #[test]
    fn bytes_for_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Ok(68));
        assert!(matches!(
            GgmlType::Q4K.bytes_for(288),
            Err(TypeError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            GgmlType::F32.bytes_for(u64::MAX),
            Err(TypeError::TooLarge { .. })
        ));
    }
}
