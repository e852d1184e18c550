//! The AVX2 token on targets without x86-64: uninhabited, so `detect` is
//! always `None` and no method can ever run. Same API as the real one.
#![forbid(unsafe_code)]

use crate::quantize::{BlockQ8_0, BlockQ8_0U, BlockQ8_1, BlockQ8K};

/// Proof of AVX2 support, which this target can never have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Avx2 {}

impl Avx2 {
    /// Most tokens one `dot_*_tokens` call takes.
    pub const MAX_TOKENS: usize = 4;

    /// Always `None`: this target is not x86-64.
    pub fn detect() -> Option<Avx2> {
        None
    }
}

/// Proof of AVX-512 VNNI support, which this target can never have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vnni {}

impl Vnni {
    /// Most tokens one `dot_*_tokens` call takes.
    pub const MAX_TOKENS: usize = 8;

    /// Always `None`: this target is not x86-64.
    pub fn detect() -> Option<Vnni> {
        None
    }
}

/// Rows in a VNNI panel.
pub const PANEL_ROWS: usize = 8;
/// Tokens one panel call takes.
pub const PANEL_TOKENS: usize = 4;

/// Tokens per `packed_dot` call.
pub const PACKED_TOKENS: usize = 4;

/// Rows in an F16 panel.
pub const F16_PANEL_ROWS: usize = 8;
/// Tokens one F16 panel call takes.
pub const F16_PANEL_TOKENS: usize = 6;
/// `out[t][p]` of one F16 panel call.
pub type F16PanelOut = [[f32; F16_PANEL_ROWS]; 2];

/// Rows in a wide F16 panel.
pub const F16_WIDE_ROWS: usize = 16;
/// Tokens one wide F16 panel call takes.
pub const F16_WIDE_TOKENS: usize = 12;
/// `out[t][p]` of one wide F16 panel call.
pub type F16WideOut = [[f32; F16_WIDE_ROWS]; 2];

/// Widened F16 weight rows for the AVX-512 GEMM; never made on this target.
#[derive(Debug, Default)]
pub struct F16WidePanel;

/// Widened F16 weight rows for the AVX2 GEMM; never made on this target.
#[derive(Debug, Default)]
pub struct F16Panel;

/// Repacked weight rows for the VNNI GEMM; never made on this target.
#[derive(Debug, Default)]
pub struct Panel;

impl Vnni {
    /// No type: this target has no VNNI panels.
    pub fn packs(ty: crate::GgmlType) -> bool {
        let _ = ty;
        false
    }
}

macro_rules! unreachable_methods {
    ($token:ident: $($name:ident(self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?;)*) => {
        impl $token {
            $(
                #[allow(unused_variables)]
                pub fn $name(self $(, $arg: $ty)*) $(-> $ret)? {
                    match self {}
                }
            )*
        }
    };
}

unreachable_methods! {
    Vnni:
    pack_f16_wide(self, rows: &[&[u8]], panel: &mut F16WidePanel);
    packed_matvec(self, p: &crate::PackedMatrix, g: usize, y: &[BlockQ8_0], sums: &[i32], y_k: &[BlockQ8K], out: &mut [f32]);
    f16_wide_dot(self, panels: &[&F16WidePanel], xs: &[&[f32]], out: &mut [F16WideOut]);
    dot_q8_0_tokens(self, w: &[u8], x: &[&[BlockQ8_0U]], out: &mut [f32]);
    dot_q4_0_tokens(self, w: &[u8], x: &[&[BlockQ8_0U]], out: &mut [f32]);
    pack_panel(self, ty: crate::GgmlType, rows: &[&[u8]], panel: &mut Panel);
    packed_dot(self, p: &crate::PackedMatrix, g: usize, ys: &[&[BlockQ8_0]], sums: &[&[i32]], out: &mut [[f32; crate::PACK_ROWS]]);
    packed_dot_k(self, p: &crate::PackedMatrix, g: usize, ys: &[&[BlockQ8K]], out: &mut [[f32; crate::PACK_ROWS]]);
    panel_dot(self, panel: &Panel, ys: &[&[BlockQ8_0U]], sums: &[&[f32]], out: &mut [f32], stride: usize);
}

unreachable_methods! {
    Avx2:
    dot_f32(self, w: &[u8], x: &[f32]) -> f32;
    dot_f16(self, w: &[u8], x: &[f32]) -> f32;
    dot_bf16(self, w: &[u8], x: &[f32]) -> f32;
    dot_q4_0(self, w: &[u8], x: &[BlockQ8_0]) -> f32;
    dot_q4_1(self, w: &[u8], x: &[BlockQ8_1]) -> f32;
    dot_q5_0(self, w: &[u8], x: &[BlockQ8_0]) -> f32;
    dot_q5_1(self, w: &[u8], x: &[BlockQ8_1]) -> f32;
    dot_q8_0(self, w: &[u8], x: &[BlockQ8_0]) -> f32;
    dot_q4k(self, w: &[u8], x: &[BlockQ8K]) -> f32;
    dot_q5k(self, w: &[u8], x: &[BlockQ8K]) -> f32;
    dot_q6k(self, w: &[u8], x: &[BlockQ8K]) -> f32;
    dot_iq4_nl(self, w: &[u8], x: &[BlockQ8_0]) -> f32;
    dot_iq4_xs(self, w: &[u8], x: &[BlockQ8K]) -> f32;
    dot_f16_tokens(self, w: &[u8], x: &[&[f32]], out: &mut [f32]);
    pack_f16_panel(self, rows: &[&[u8]], panel: &mut F16Panel);
    f16_panel_dot(self, panels: &[&F16Panel], xs: &[&[f32]], out: &mut [F16PanelOut]);
    dequantize_row(self, ty: crate::GgmlType, src: &[u8], dst: &mut [f32]) -> bool;
    rope_rotate(self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: crate::RopeStyle);
    dot_f16_rows_tokens(self, w: &[&[u8]], x: &[&[f32]], out: &mut [f32]);
    dot_q4_0_tokens(self, w: &[u8], x: &[&[BlockQ8_0]], out: &mut [f32]);
    dot_q8_0_tokens(self, w: &[u8], x: &[&[BlockQ8_0]], out: &mut [f32]);
    dot_q4k_tokens(self, w: &[u8], x: &[&[BlockQ8K]], out: &mut [f32]);
    dot_q6k_tokens(self, w: &[u8], x: &[&[BlockQ8K]], out: &mut [f32]);
    dot_iq4_nl_tokens(self, w: &[u8], x: &[&[BlockQ8_0]], out: &mut [f32]);
    dot_iq4_xs_tokens(self, w: &[u8], x: &[&[BlockQ8K]], out: &mut [f32]);
    dot(self, a: &[f32], b: &[f32]) -> f32;
    axpy(self, a: f32, x: &[f32], y: &mut [f32]);
    attention_scores(self, q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]);
    attention_weighted_sum(self, s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]);
    rms_norm(self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]);
    softmax(self, x: &mut [f32]);
    quantize_row_q8_0(self, x: &[f32], out: &mut [BlockQ8_0]);
    quantize_row_q8_k(self, x: &[f32], out: &mut [BlockQ8K]);
    silu_mul(self, gate: &mut [f32], up: &[f32]);
    gelu_tanh_mul(self, gate: &mut [f32], up: &[f32]);
    add(self, a: &mut [f32], b: &[f32]);
}
