//! Shared helpers for the integration tests: a seeded RNG and random but
//! valid weight matrices of every type.
#![allow(dead_code)] // each test binary uses a different subset

use bulkhead_kernels::{GgmlType, dequantize_row};
use half::{bf16, f16};

/// xorshift64*: deterministic, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Byte offsets of the f16 scale fields in one block of `ty`.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::IQ4XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
    }
}

/// `rows × cols` of `ty` as raw GGUF bytes: float types from uniform values,
/// quantized types as random quant bits with small random f16 scales (so
/// every packed bit pattern occurs, including the extremes).
pub fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.bytes_for(n as u64).unwrap() as usize;
            let mut data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
            for block in data.chunks_exact_mut(ty.block_bytes()) {
                for &at in f16_fields(ty) {
                    let d = f16::from_f32(rng.uniform() * 0.02);
                    block[at..at + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            data
        }
    }
}

/// The matrix dequantized, row-major.
pub fn dequantized(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let row_bytes = data.len() / rows.max(1);
    let mut out = vec![0.0; rows * cols];
    for (src, dst) in data.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        dequantize_row(ty, src, dst);
    }
    out
}
