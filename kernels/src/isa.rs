//! Which instruction set the kernels use, detected at run time.
#![forbid(unsafe_code)]

use crate::avx2::{Avx2, Vnni};

/// An instruction set the CPU kernels can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar code: the reference every fast path is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// The AVX2 kernels, plus AVX-512 VNNI (256-bit forms) for multi-token
    /// Q8_0 and Q4_0 matmuls (batched decode, prefill). Results are
    /// bit-identical to [`Isa::Avx2`]'s.
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        if Vnni::detect().is_some() {
            Isa::Avx512Vnni
        } else if Avx2::detect().is_some() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU can run kernels for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => Avx2::detect().is_some(),
            Isa::Avx512Vnni => Vnni::detect().is_some(),
        }
    }

    /// The CPU features `self` needs, for error messages.
    pub fn features(self) -> &'static str {
        match self {
            Isa::Scalar => "nothing",
            Isa::Avx2 => "avx2, fma and f16c",
            Isa::Avx512Vnni => "avx2, fma, f16c, avx512f, avx512vl and avx512vnni",
        }
    }
}
