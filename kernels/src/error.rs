//! The crate's error type: every way a caller can hand the kernels bad input.
#![forbid(unsafe_code)]

use crate::{GgmlType, Isa, TypeError};

/// Input the kernels refuse. All of these are the caller's fault (a malformed
/// tensor or a bad configuration); retrying with the same input fails again.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// The row length does not fit the type's block geometry.
    #[error("matrix row of {cols} elements: {source}")]
    RowLength {
        cols: usize,
        #[source]
        source: TypeError,
    },
    /// The byte buffer does not hold exactly `rows` rows.
    #[error("{ty} matrix of {rows} rows × {cols} columns needs {expected} bytes, got {actual}")]
    DataLength {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: u64,
        actual: usize,
    },
    /// `rows × row bytes` does not fit in memory.
    #[error("{ty} matrix of {rows} rows × {cols} columns is too large to address")]
    TooLarge {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// The kernel team needs at least one thread.
    #[error("kernel thread count must be at least 1")]
    ZeroThreads,
    /// The requested instruction set is missing on this CPU.
    #[error("{isa:?} kernels need a CPU with {}, which this one lacks", isa.features())]
    IsaUnavailable { isa: Isa },
    /// The OS could not start the kernel team's threads.
    #[error("could not start the kernel threads: {0}")]
    Threads(String),
}
