//! The AVX2/FMA/F16C kernels. Every kernel is a method on [`Avx2`], a token
//! that can only be obtained from [`Avx2::detect`], so holding one proves the
//! CPU has the features and the methods can be safe to call. [`Vnni`] is the
//! same for the few kernels that also use AVX-512 VNNI (256-bit forms).
//!
//! On other architectures the token is an empty enum with the same methods:
//! `detect` returns `None` and callers fall back to `scalar`.

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub use x86::{
    Avx2, F16_PANEL_ROWS, F16_PANEL_TOKENS, F16_WIDE_ROWS, F16_WIDE_TOKENS, F16Panel, F16PanelOut,
    F16WideOut, F16WidePanel, PACKED_TOKENS, PANEL_ROWS, PANEL_TOKENS, Panel, Vnni,
};

#[cfg(not(target_arch = "x86_64"))]
mod disabled;
#[cfg(not(target_arch = "x86_64"))]
pub use disabled::{
    Avx2, F16_PANEL_ROWS, F16_PANEL_TOKENS, F16_WIDE_ROWS, F16_WIDE_TOKENS, F16Panel, F16PanelOut,
    F16WideOut, F16WidePanel, PACKED_TOKENS, PANEL_ROWS, PANEL_TOKENS, Panel, Vnni,
};
