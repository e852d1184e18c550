//! Compute kernels for Bulkhead's inference engine: every op the forward pass
//! needs, once as a scalar reference and once fast (AVX2/FMA, chosen at run time).
//!
//! `scalar` is the oracle; `avx2` is the fast path, reachable only through an
//! [`avx2::Avx2`] token that proves the CPU has the features. [`CpuKernels`]
//! owns the thread team and runs matmul and attention on it. [`hip`] holds
//! the HIP kernels' code objects (feature `hip`), names and argument layouts.

#![deny(unsafe_op_in_unsafe_fn)]

mod blocks;
mod cpu;
mod dequant;
mod error;
mod isa;
mod ops;
mod packed;
mod quantize;
mod team;
mod types;

pub mod avx2;
pub mod hip;
pub mod scalar;

pub use cpu::{
    AttentionShape, CpuKernels, PagedSeq, PagedShape, QuantMatrix, ScoreMask, TokenGrouping,
};
pub use dequant::{dequantize_row, dequantize_row_scalar};
pub use error::KernelError;
pub use isa::Isa;
pub use ops::{
    Activation, RopeFreqs, RopeStyle, Yarn, add, gated, rms_norm, rope, rope_ext, rope_rotate,
    scale, silu_mul, softmax,
};
pub use packed::{PACK_ROWS, PackedMatrix, Region};
pub use quantize::{
    BlockQ8_0, BlockQ8_0U, BlockQ8_1, BlockQ8K, quantize_row_q8_0, quantize_row_q8_1,
    quantize_row_q8_k,
};
pub use types::{GgmlType, TypeError};
