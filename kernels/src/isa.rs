//! Which instruction set the kernels use, detected at run time.
#![forbid(unsafe_code)]

use crate::avx2::Avx2;

/// An instruction set the CPU kernels can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar code: the reference every fast path is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        if Avx2::detect().is_some() {
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
        }
    }
}
