//! The CPU backend: a team of threads plus the chosen ISA, running matmul
//! and attention in parallel on top of the row-level kernels.
#![forbid(unsafe_code)]

use crate::avx2::{Avx2, Vnni};
use crate::team::Team;
use crate::{GgmlType, Isa, KernelError, PackedMatrix};

mod attention;
mod gemm;
mod matmul;
pub use attention::{AttentionShape, PagedSeq, PagedShape, ScoreMask};
pub use matmul::TokenGrouping;

/// A weight matrix as stored in GGUF: `rows` rows of `cols` elements each
/// (GGUF `ne[0] = cols`), every row a contiguous run of blocks.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// The same matrix repacked ([`CpuKernels::pack`]): the VNNI kernels
    /// read it instead of `data` where given.
    pub packed: Option<&'a PackedMatrix>,
}

impl<'a> QuantMatrix<'a> {
    /// Wraps `data`, checking that `cols` is a whole number of blocks and
    /// that `data` holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let m = QuantMatrix {
            ty,
            data,
            rows,
            cols,
            packed: None,
        };
        m.check()?;
        Ok(m)
    }

    /// This matrix with its packed form `p` attached.
    ///
    /// # Panics
    /// If `p` is not of this matrix's type and shape.
    pub fn with_packed(self, p: &'a PackedMatrix) -> Self {
        assert!(
            p.fits(&self),
            "with_packed: the packed form is of another matrix"
        );
        QuantMatrix {
            packed: Some(p),
            ..self
        }
    }

    /// Bytes per row (assumes a shape that passed [`QuantMatrix::new`]).
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elements() * self.ty.block_bytes()
    }

    /// The raw bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    fn check(&self) -> Result<(), KernelError> {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        let row_bytes = ty
            .bytes_for(cols as u64)
            .map_err(|source| KernelError::RowLength { cols, source })?;
        let expected = row_bytes
            .checked_mul(rows as u64)
            .ok_or(KernelError::TooLarge { ty, rows, cols })?;
        if self.data.len() as u64 != expected {
            return Err(KernelError::DataLength {
                ty,
                rows,
                cols,
                expected,
                actual: self.data.len(),
            });
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Scalar,
    Avx2(Avx2),
}

/// The CPU compute backend: an ISA and a team of threads of a chosen size.
#[derive(Debug)]
pub struct CpuKernels {
    backend: Backend,
    /// Present with [`Isa::Avx512Vnni`]: the multi-token Q8_0/Q4_0 kernels
    /// take up to eight tokens per weight block instead of four.
    vnni: Option<Vnni>,
    team: Team,
}

/// Multiply-adds below which a call runs on the calling thread alone.
///
/// Handing work to the team costs well under a µs while the workers are
/// spinning (see `team.rs`): one atomic store, then a cache-line transfer
/// per worker. 2^15 multiply-adds are ~1-2 µs of kernel time, so smaller
/// calls (a 15M model's K and V projections, say) are not worth splitting.
const MIN_PARALLEL_MACS: usize = 1 << 15;

/// Activations below which quantization runs on the calling thread: a few
/// thousand floats take well under a µs to quantize.
const MIN_PARALLEL_QUANTIZE: usize = 1 << 13;

impl CpuKernels {
    /// A backend running on `threads` threads with `isa` kernels; fails if
    /// `threads` is 0 or the CPU lacks the ISA.
    pub fn new(threads: usize, isa: Isa) -> Result<Self, KernelError> {
        if threads == 0 {
            return Err(KernelError::ZeroThreads);
        }
        let unavailable = || KernelError::IsaUnavailable { isa };
        let (backend, vnni) = match isa {
            Isa::Scalar => (Backend::Scalar, None),
            Isa::Avx2 => (Backend::Avx2(Avx2::detect().ok_or_else(unavailable)?), None),
            Isa::Avx512Vnni => {
                let vnni = Vnni::detect().ok_or_else(unavailable)?;
                let avx2 = Avx2::detect().ok_or_else(unavailable)?;
                (Backend::Avx2(avx2), Some(vnni))
            }
        };
        let team = Team::new(threads).map_err(|e| KernelError::Threads(e.to_string()))?;
        Ok(CpuKernels {
            backend,
            vnni,
            team,
        })
    }

    /// `m` repacked for these kernels' matvec, if they have one for its
    /// type (AVX-512 VNNI: Q4_0 and Q8_0); attach it with
    /// [`QuantMatrix::with_packed`]. Done once per weight, at load.
    pub fn pack(&self, m: &QuantMatrix<'_>) -> Option<PackedMatrix> {
        self.vnni?;
        PackedMatrix::pack(m)
    }

    /// Bytes of the form [`CpuKernels::pack`] would make of `m`, or `None`
    /// where it makes none: to pack into memory of the caller's
    /// ([`PackedMatrix::pack_into`]).
    pub fn packed_len(&self, m: &QuantMatrix<'_>) -> Option<usize> {
        self.vnni?;
        PackedMatrix::packed_len(m)
    }

    /// Threads that run each op, the caller included.
    pub fn threads(&self) -> usize {
        self.team.threads()
    }

    /// The instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        match (self.backend, self.vnni) {
            (Backend::Scalar, _) => Isa::Scalar,
            (Backend::Avx2(_), None) => Isa::Avx2,
            (Backend::Avx2(_), Some(_)) => Isa::Avx512Vnni,
        }
    }
}
