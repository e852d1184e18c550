//! The scalar reference kernels: plain Rust, written for clarity, and the
//! oracle every fast path is tested against.
#![forbid(unsafe_code)]

mod dot;
mod ops;

pub use dot::{
    dot_bf16, dot_f16, dot_f32, dot_iq4_nl, dot_iq4_xs, dot_q4_0, dot_q4_1, dot_q4k, dot_q5_0,
    dot_q5_1, dot_q5k, dot_q6k, dot_q8_0,
};
pub(crate) use ops::check_rope_shape;
pub(crate) use ops::{GELU_BETA, GELU_KAPPA};
pub use ops::{
    add, axpy, dot, gelu_tanh_mul, rms_norm, rope, rope_angles, rope_angles_ext, rope_rotate,
    scale, silu_mul, softcap, softmax,
};
