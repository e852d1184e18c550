//! Compute kernels for Bulkhead's inference engine: every op the forward pass
//! needs, once as a scalar reference and once fast (AVX2/FMA, chosen at run time).

mod types;

pub use types::{GgmlType, TypeError};
