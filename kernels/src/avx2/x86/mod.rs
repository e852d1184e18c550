//! The x86-64 AVX2 token and its safe kernel methods.

mod attention;
mod dot;
mod dot_tokens;
mod f16_panels;
mod gemm;
mod gemm_f16;
mod iq4;
mod ops;
mod packed;
mod quantize;
mod simd;
mod vnni;

pub use f16_panels::{F16PanelOut, F16WideOut};
pub use gemm::{PANEL_ROWS, PANEL_TOKENS, Panel};
pub use gemm_f16::{
    F16_PANEL_ROWS, F16_PANEL_TOKENS, F16_WIDE_ROWS, F16_WIDE_TOKENS, F16Panel, F16WidePanel,
};
pub use packed::PACKED_TOKENS;

use crate::GgmlType;
use crate::quantize::{BlockQ8_0, BlockQ8_0U, BlockQ8_1, BlockQ8K};

/// Proof that this CPU supports AVX2, FMA and F16C; the AVX2 kernels are its
/// methods. `Copy` and zero-sized: pass it around freely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx2 {
    _proof: (),
}

impl Avx2 {
    /// The token, if this CPU has avx2, fma and f16c.
    pub fn detect() -> Option<Avx2> {
        let ok = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        ok.then_some(Avx2 { _proof: () })
    }
}

/// Safe wrappers: each checks the lengths its kernel relies on, then calls the
/// `#[target_feature]` kernel. Kernels only read through fixed-size array
/// references, so lengths matter for the answer, not for memory safety.
macro_rules! row_dots {
    ($($(#[$doc:meta])* $name:ident($act:ty, $bytes_per:expr) => $kernel:path;)*) => {
        impl Avx2 {
            $(
                $(#[$doc])*
                pub fn $name(self, w: &[u8], x: &[$act]) -> f32 {
                    assert_eq!(
                        w.len(),
                        x.len() * $bytes_per,
                        concat!(stringify!($name), ": row bytes and activations disagree")
                    );
                    // SAFETY: `self` exists only if avx2, fma and f16c were detected.
                    unsafe { $kernel(w, x) }
                }
            )*
        }
    };
}

row_dots! {
    /// F32 weights · f32 activations.
    dot_f32(f32, 4) => dot::f32_row;
    /// F16 weights · f32 activations (weights widened with F16C).
    dot_f16(f32, 2) => dot::f16_row;
    /// BF16 weights · f32 activations.
    dot_bf16(f32, 2) => dot::bf16_row;
    /// Q4_0 · Q8_0.
    dot_q4_0(BlockQ8_0, crate::blocks::Q4_0_BYTES) => dot::q4_0;
    /// Q4_1 · Q8_1.
    dot_q4_1(BlockQ8_1, crate::blocks::Q4_1_BYTES) => dot::q4_1;
    /// Q5_0 · Q8_0.
    dot_q5_0(BlockQ8_0, crate::blocks::Q5_0_BYTES) => dot::q5_0;
    /// Q5_1 · Q8_1.
    dot_q5_1(BlockQ8_1, crate::blocks::Q5_1_BYTES) => dot::q5_1;
    /// Q8_0 · Q8_0.
    dot_q8_0(BlockQ8_0, crate::blocks::Q8_0_BYTES) => dot::q8_0;
    /// Q4_K · Q8_K.
    dot_q4k(BlockQ8K, crate::blocks::Q4K_BYTES) => dot::q4k;
    /// Q5_K · Q8_K.
    dot_q5k(BlockQ8K, crate::blocks::Q5K_BYTES) => dot::q5k;
    /// Q6_K · Q8_K.
    dot_q6k(BlockQ8K, crate::blocks::Q6K_BYTES) => dot::q6k;
    /// IQ4_NL · Q8_0.
    dot_iq4_nl(BlockQ8_0, crate::blocks::IQ4NL_BYTES) => iq4::iq4_nl_row;
    /// IQ4_XS · Q8_K.
    dot_iq4_xs(BlockQ8K, crate::blocks::IQ4XS_BYTES) => iq4::iq4_xs_row;
}

/// Safe wrappers for the multi-token kernels: `out[t] = dot(w, x[t])` for up
/// to [`Avx2::MAX_TOKENS`] tokens, each weight block unpacked once. Lengths
/// are checked as for the single-row wrappers, then the token count picks the
/// const-generic kernel.
macro_rules! token_dots {
    ($($(#[$doc:meta])* $name:ident($act:ty, $bytes_per:expr) => $kernel:path;)*) => {
        impl Avx2 {
            $(
                $(#[$doc])*
                pub fn $name(self, w: &[u8], x: &[&[$act]], out: &mut [f32]) {
                    assert_eq!(
                        x.len(),
                        out.len(),
                        concat!(stringify!($name), ": token and output counts differ")
                    );
                    for xt in x {
                        assert_eq!(
                            w.len(),
                            xt.len() * $bytes_per,
                            concat!(stringify!($name), ": row bytes and activations disagree")
                        );
                    }
                    // SAFETY: `self` exists only if avx2, fma and f16c were detected.
                    unsafe {
                        match *x {
                            [] => {}
                            [a] => put(out, $kernel(w, [a])),
                            [a, b] => put(out, $kernel(w, [a, b])),
                            [a, b, c] => put(out, $kernel(w, [a, b, c])),
                            [a, b, c, d] => put(out, $kernel(w, [a, b, c, d])),
                            _ => panic!(
                                concat!(stringify!($name), ": {} tokens, at most {} per call"),
                                x.len(),
                                Avx2::MAX_TOKENS
                            ),
                        }
                    }
                }
            )*
        }
    };
}

token_dots! {
    /// F16 weights · up to four f32 activation rows.
    dot_f16_tokens(f32, 2) => dot_tokens::f16_rows;
    /// Q4_0 · up to four Q8_0 rows.
    dot_q4_0_tokens(BlockQ8_0, crate::blocks::Q4_0_BYTES) => dot_tokens::q4_0_rows;
    /// Q8_0 · up to four Q8_0 rows.
    dot_q8_0_tokens(BlockQ8_0, crate::blocks::Q8_0_BYTES) => dot_tokens::q8_0_rows;
    /// Q4_K · up to four Q8_K rows.
    dot_q4k_tokens(BlockQ8K, crate::blocks::Q4K_BYTES) => dot_tokens::q4k_rows;
    /// Q6_K · up to four Q8_K rows.
    dot_q6k_tokens(BlockQ8K, crate::blocks::Q6K_BYTES) => dot_tokens::q6k_rows;
    /// IQ4_NL · up to four Q8_0 rows; bit-identical to [`Avx2::dot_iq4_nl`].
    dot_iq4_nl_tokens(BlockQ8_0, crate::blocks::IQ4NL_BYTES) => iq4::iq4_nl_rows;
    /// IQ4_XS · up to four Q8_K rows; bit-identical to [`Avx2::dot_iq4_xs`].
    dot_iq4_xs_tokens(BlockQ8K, crate::blocks::IQ4XS_BYTES) => iq4::iq4_xs_rows;
}

impl Avx2 {
    /// `out[r * x.len() + t] = dot(w[r], x[t])` for one or two F16 rows and up
    /// to [`Avx2::MAX_TOKENS`] tokens. Two rows share every activation load,
    /// which is what bounds F16 (its f32 activations outweigh the weights).
    pub fn dot_f16_rows_tokens(self, w: &[&[u8]], x: &[&[f32]], out: &mut [f32]) {
        assert_eq!(
            w.len() * x.len(),
            out.len(),
            "dot_f16_rows_tokens: out is not rows × tokens"
        );
        match *w {
            [a] => self.dot_f16_tokens(a, x, out),
            [a, b] => {
                for xt in x {
                    assert!(
                        a.len() == xt.len() * 2 && b.len() == xt.len() * 2,
                        "dot_f16_rows_tokens: row bytes and activations disagree"
                    );
                }
                let (out_a, out_b) = out.split_at_mut(x.len());
                // SAFETY: `self` exists only if avx2, fma and f16c were detected.
                let res = unsafe {
                    match *x {
                        [] => return,
                        [p] => two_rows(dot_tokens::f16_rows2([a, b], [p])),
                        [p, q] => two_rows(dot_tokens::f16_rows2([a, b], [p, q])),
                        [p, q, r] => two_rows(dot_tokens::f16_rows2([a, b], [p, q, r])),
                        [p, q, r, s] => two_rows(dot_tokens::f16_rows2([a, b], [p, q, r, s])),
                        _ => panic!(
                            "dot_f16_rows_tokens: {} tokens, at most {} per call",
                            x.len(),
                            Avx2::MAX_TOKENS
                        ),
                    }
                };
                out_a.copy_from_slice(&res[0][..x.len()]);
                out_b.copy_from_slice(&res[1][..x.len()]);
            }
            _ => panic!("dot_f16_rows_tokens: {} rows, at most 2 per call", w.len()),
        }
    }
}

/// `out[t * stride..][..rows] = res[t][..rows]` for every token: a fixed
/// eight-float store per token for a full panel (a slice copy of eight
/// floats is a `memmove` call).
#[inline]
fn put_rows<const T: usize>(out: &mut [f32], stride: usize, rows: usize, res: [[f32; 8]; T]) {
    for (t, r) in res.iter().enumerate() {
        let at = t * stride;
        if rows == 8 {
            *<&mut [f32; 8]>::try_from(&mut out[at..at + 8]).expect("eight floats") = *r;
        } else {
            out[at..at + rows].copy_from_slice(&r[..rows]);
        }
    }
}

/// `out = v`, `out` known to be `N` long: a fixed-size store. (A slice
/// `copy_from_slice` of a few floats is a `memmove` call per weight row and
/// token group, ~2% of a batched decode step in perf.)
#[inline]
fn put<const N: usize>(out: &mut [f32], v: [f32; N]) {
    *<&mut [f32; N]>::try_from(out).expect("output length checked by the caller") = v;
}

/// Pads a 2 × N result to 2 × MAX_TOKENS so every N has one return type.
fn two_rows<const N: usize>(r: [[f32; N]; 2]) -> [[f32; Avx2::MAX_TOKENS]; 2] {
    let mut out = [[0.0; Avx2::MAX_TOKENS]; 2];
    for (o, r) in out.iter_mut().zip(r) {
        o[..N].copy_from_slice(&r);
    }
    out
}

impl Avx2 {
    /// Most tokens one `dot_*_tokens` call takes: four accumulators per
    /// kernel still leave registers for the unpacked weights.
    pub const MAX_TOKENS: usize = 4;
}

/// Proof that this CPU has, beyond [`Avx2`]'s features, AVX-512 VNNI with
/// its 256-bit forms (avx512f, avx512vl, avx512vnni): the multi-token Q8_0
/// and Q4_0 kernels of `vnni.rs` are its methods. `Copy` and zero-sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vnni {
    _proof: (),
}

impl Vnni {
    /// Most tokens one `dot_*_tokens` call takes: two accumulators for each
    /// of eight tokens fit in AVX512VL's 32 vector registers.
    pub const MAX_TOKENS: usize = 8;

    /// The token, if this CPU has avx2, fma, f16c, avx512f, avx512vl and
    /// avx512vnni.
    pub fn detect() -> Option<Vnni> {
        Avx2::detect()?;
        let ok = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        ok.then_some(Vnni { _proof: () })
    }
}

/// Safe wrappers for the VNNI kernels, as `token_dots` with up to
/// [`Vnni::MAX_TOKENS`] tokens.
macro_rules! vnni_token_dots {
    ($($(#[$doc:meta])* $name:ident($bytes_per:expr) => $kernel:path;)*) => {
        impl Vnni {
            $(
                $(#[$doc])*
                pub fn $name(self, w: &[u8], x: &[&[BlockQ8_0U]], out: &mut [f32]) {
                    assert_eq!(
                        x.len(),
                        out.len(),
                        concat!(stringify!($name), ": token and output counts differ")
                    );
                    for xt in x {
                        assert_eq!(
                            w.len(),
                            xt.len() * $bytes_per,
                            concat!(stringify!($name), ": row bytes and activations disagree")
                        );
                    }
                    // SAFETY: `self` exists only if avx2, fma, f16c, avx512f,
                    // avx512vl and avx512vnni were detected.
                    unsafe {
                        match *x {
                            [] => {}
                            [a] => put(out, $kernel(w, [a])),
                            [a, b] => put(out, $kernel(w, [a, b])),
                            [a, b, c] => put(out, $kernel(w, [a, b, c])),
                            [a, b, c, d] => put(out, $kernel(w, [a, b, c, d])),
                            [a, b, c, d, e] => put(out, $kernel(w, [a, b, c, d, e])),
                            [a, b, c, d, e, f] => {
                                put(out, $kernel(w, [a, b, c, d, e, f]))
                            }
                            [a, b, c, d, e, f, g] => {
                                put(out, $kernel(w, [a, b, c, d, e, f, g]))
                            }
                            [a, b, c, d, e, f, g, h] => {
                                put(out, $kernel(w, [a, b, c, d, e, f, g, h]))
                            }
                            _ => panic!(
                                concat!(stringify!($name), ": {} tokens, at most {} per call"),
                                x.len(),
                                Vnni::MAX_TOKENS
                            ),
                        }
                    }
                }
            )*
        }
    };
}

vnni_token_dots! {
    /// Q8_0 · up to eight offset Q8_0 rows; bit-identical to
    /// [`Avx2::dot_q8_0`] on the same activations.
    dot_q8_0_tokens(crate::blocks::Q8_0_BYTES) => vnni::q8_0_rows;
    /// Q4_0 · up to eight offset Q8_0 rows; bit-identical to
    /// [`Avx2::dot_q4_0`] on the same activations.
    dot_q4_0_tokens(crate::blocks::Q4_0_BYTES) => vnni::q4_0_rows;
}

impl Vnni {
    /// `out[t][r]` = row `8g + r` of `p` · token `t`, for group `g`'s rows
    /// (lanes past the matrix's last row are zero) and up to
    /// [`PACKED_TOKENS`] tokens of Q8_0 activations, `sums[t][b]` being
    /// token `t`'s `Σ q` of block `b`. A row's result is the same whatever
    /// tokens share the call.
    ///
    /// # Panics
    /// If `g` is past the last group, or the tokens' blocks, sums and
    /// outputs do not match `p` and each other.
    pub fn packed_dot(
        self,
        p: &crate::PackedMatrix,
        g: usize,
        ys: &[&[BlockQ8_0]],
        sums: &[&[i32]],
        out: &mut [[f32; crate::PACK_ROWS]],
    ) {
        assert!(
            matches!(p.ty(), GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0),
            "packed_dot: {} weights take packed_dot_k",
            p.ty()
        );
        let blocks = p.blocks();
        let group = p.group(g);
        let n = ys.len();
        assert!(
            n <= PACKED_TOKENS && sums.len() == n && out.len() == n,
            "packed_dot: {n} tokens, {} sums, {} outputs (at most {PACKED_TOKENS})",
            sums.len(),
            out.len()
        );
        assert!(
            ys.iter().all(|y| y.len() == blocks) && sums.iter().all(|s| s.len() == blocks),
            "packed_dot: activations are not {blocks} blocks"
        );
        let ty = p.ty();
        // SAFETY (each arm): `self` proves avx2, fma, f16c, avx512f,
        // avx512vl and avx512vnni; `group` is `blocks` packed blocks of
        // `ty` and every token has `blocks` blocks and sums (checked above).
        unsafe {
            match n {
                0 => {}
                1 => out.copy_from_slice(&packed::packed_tokens::<1>(
                    ty,
                    group,
                    blocks,
                    [ys[0]],
                    [sums[0]],
                )),
                2 => out.copy_from_slice(&packed::packed_tokens::<2>(
                    ty,
                    group,
                    blocks,
                    [ys[0], ys[1]],
                    [sums[0], sums[1]],
                )),
                3 => out.copy_from_slice(&packed::packed_tokens::<3>(
                    ty,
                    group,
                    blocks,
                    [ys[0], ys[1], ys[2]],
                    [sums[0], sums[1], sums[2]],
                )),
                _ => out.copy_from_slice(&packed::packed_tokens::<4>(
                    ty,
                    group,
                    blocks,
                    [ys[0], ys[1], ys[2], ys[3]],
                    [sums[0], sums[1], sums[2], sums[3]],
                )),
            }
        }
    }

    /// `out[i]` = row `8 g + i` of `p` · one token, for `out.len()` rows
    /// from group `g` on: decode's matvec in one call, bit-identical to
    /// [`Vnni::packed_dot`] / [`Vnni::packed_dot_k`] a group at a time
    /// (their per-call checks and dispatch were ~10% of a 110m Q4_0
    /// decode step). The token is `y` with its block sums `sums` (Q8_0)
    /// for Q4_0/Q5_0/Q8_0, or `y_k` (Q8_K) for Q4_K/Q6_K; the other may be
    /// empty.
    ///
    /// # Panics
    /// If the rows run past the matrix or the token is not `p.blocks()`
    /// blocks of the type's activations.
    pub fn packed_matvec(
        self,
        p: &crate::PackedMatrix,
        g: usize,
        y: &[BlockQ8_0],
        sums: &[i32],
        y_k: &[BlockQ8K],
        out: &mut [f32],
    ) {
        let blocks = p.blocks();
        assert!(
            g * crate::PACK_ROWS + out.len() <= p.rows(),
            "packed_matvec: rows {}.. of {} past the matrix's {}",
            g * crate::PACK_ROWS,
            out.len(),
            p.rows()
        );
        let ok = match p.ty() {
            GgmlType::Q4K | GgmlType::Q6K => y_k.len() == blocks,
            _ => y.len() == blocks && sums.len() == blocks,
        };
        assert!(ok, "packed_matvec: activations are not {blocks} blocks");
        // SAFETY: `self` proves avx2, fma, f16c, avx512f, avx512vl and
        // avx512vnni; the rows are within `p` and the token has `blocks`
        // blocks of the kind `p`'s type takes (checked above).
        unsafe { packed::matvec(p, g, y, sums, y_k, out) }
    }

    /// [`Vnni::packed_dot`] for a packed Q4_K or Q6_K matrix, whose tokens
    /// come as Q8_K blocks.
    ///
    /// # Panics
    /// If `p` is not Q4_K or Q6_K, `g` is past the last group, or the tokens'
    /// blocks and outputs do not match `p` and each other.
    pub fn packed_dot_k(
        self,
        p: &crate::PackedMatrix,
        g: usize,
        ys: &[&[BlockQ8K]],
        out: &mut [[f32; crate::PACK_ROWS]],
    ) {
        let q6k = match p.ty() {
            GgmlType::Q4K => false,
            GgmlType::Q6K => true,
            other => panic!("packed_dot_k: {other} weights"),
        };
        let blocks = p.blocks();
        let group = p.group(g);
        let n = ys.len();
        assert!(
            n <= PACKED_TOKENS && out.len() == n,
            "packed_dot_k: {n} tokens, {} outputs (at most {PACKED_TOKENS})",
            out.len()
        );
        assert!(
            ys.iter().all(|y| y.len() == blocks),
            "packed_dot_k: activations are not {blocks} blocks"
        );
        macro_rules! go {
            ($kernel:ident) => {
                // SAFETY (each arm): `self` proves avx2, fma, f16c, avx512f,
                // avx512vl and avx512vnni; `group` is `blocks` packed
                // super-blocks of `p`'s type and every token has `blocks`
                // blocks (checked above).
                unsafe {
                    match n {
                        0 => {}
                        1 => out.copy_from_slice(&packed::$kernel::<1>(group, blocks, [ys[0]])),
                        2 => out.copy_from_slice(&packed::$kernel::<2>(
                            group,
                            blocks,
                            [ys[0], ys[1]],
                        )),
                        3 => out.copy_from_slice(&packed::$kernel::<3>(
                            group,
                            blocks,
                            [ys[0], ys[1], ys[2]],
                        )),
                        _ => out.copy_from_slice(&packed::$kernel::<4>(
                            group,
                            blocks,
                            [ys[0], ys[1], ys[2], ys[3]],
                        )),
                    }
                }
            };
        }
        if q6k {
            go!(packed_q6k_tokens)
        } else {
            go!(packed_q4k_tokens)
        }
    }

    /// Whether [`Vnni::pack_panel`] takes weights of type `ty`.
    pub fn packs(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q5_0
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
        )
    }

    /// Repacks up to [`PANEL_ROWS`] rows of a `ty` matrix (each a whole
    /// row's bytes) into `panel` for [`Vnni::panel_dot`].
    ///
    /// # Panics
    /// If `ty` is not one [`Vnni::packs`] takes, if there are no rows or
    /// more than [`PANEL_ROWS`], or if the rows differ in length or are not
    /// whole blocks.
    pub fn pack_panel(self, ty: GgmlType, rows: &[&[u8]], panel: &mut Panel) {
        assert!(
            (1..=PANEL_ROWS).contains(&rows.len()),
            "pack_panel: {} rows, want 1..={PANEL_ROWS}",
            rows.len()
        );
        let len = rows[0].len();
        let block = ty.block_bytes();
        assert!(
            len > 0 && len.is_multiple_of(block) && rows.iter().all(|r| r.len() == len),
            "pack_panel: rows are not whole {ty} blocks of one length"
        );
        // SAFETY (all): `self` proves avx2, fma, f16c, avx512f, avx512vl and
        // avx512vnni; every row was checked to be whole blocks of `ty`.
        unsafe {
            match ty {
                GgmlType::Q8_0 => gemm::pack_q8_0(panel, rows),
                GgmlType::Q4_0 => gemm::pack_q4_0(panel, rows),
                GgmlType::Q5_0 => gemm::pack_q5_0(panel, rows),
                GgmlType::Q4K => gemm::pack_q4k(panel, rows),
                GgmlType::Q5K => gemm::pack_q5k(panel, rows),
                GgmlType::Q6K => gemm::pack_q6k(panel, rows),
                other => panic!("pack_panel: {other} weights have no panel layout"),
            }
        }
    }

    /// `out[t * stride + r]` = row `r` of `panel` · token `t` (offset Q8_0
    /// blocks, one per 32 weights), for the panel's rows and up to
    /// [`PANEL_TOKENS`] tokens. With a min term (Q4_K, Q5_K:
    /// [`Panel::has_min`]) `sums[t][b]` must be token `t`'s `d · Σ q` of
    /// block `b`; otherwise `sums` is not read and may be empty.
    ///
    /// # Panics
    /// If there are more than [`PANEL_TOKENS`] tokens, `sums` (when read)
    /// has another count, a token's blocks do not match the panel, or `out`
    /// is too short for the last token's rows.
    pub fn panel_dot(
        self,
        panel: &Panel,
        ys: &[&[BlockQ8_0U]],
        sums: &[&[f32]],
        out: &mut [f32],
        stride: usize,
    ) {
        let n = ys.len();
        assert!(
            n <= PANEL_TOKENS,
            "panel_dot: {n} tokens, at most {PANEL_TOKENS}"
        );
        let blocks = panel.blocks();
        assert!(
            ys.iter().all(|y| y.len() == blocks),
            "panel_dot: activations are not {blocks} blocks"
        );
        let no_sums: [&[f32]; PANEL_TOKENS] = [&[]; PANEL_TOKENS];
        let sums = if panel.has_min() {
            assert!(
                sums.len() == n && sums.iter().all(|s| s.len() == blocks),
                "panel_dot: block sums are not {n} tokens × {blocks} blocks"
            );
            sums
        } else {
            &no_sums[..n]
        };
        let rows = panel.rows();
        assert!(
            n == 0 || out.len() >= (n - 1) * stride + rows,
            "panel_dot: output too short"
        );
        // SAFETY (all): `self` proves the kernel's features; the kernel
        // reads `blocks` entries of each token's slices, checked above.
        unsafe {
            match n {
                0 => {}
                1 => put_rows(
                    out,
                    stride,
                    rows,
                    gemm::panel_tokens::<1>(panel, [ys[0]], [sums[0]]),
                ),
                2 => put_rows(
                    out,
                    stride,
                    rows,
                    gemm::panel_tokens::<2>(panel, [ys[0], ys[1]], [sums[0], sums[1]]),
                ),
                3 => put_rows(
                    out,
                    stride,
                    rows,
                    gemm::panel_tokens::<3>(
                        panel,
                        [ys[0], ys[1], ys[2]],
                        [sums[0], sums[1], sums[2]],
                    ),
                ),
                _ => put_rows(
                    out,
                    stride,
                    rows,
                    gemm::panel_tokens::<4>(
                        panel,
                        [ys[0], ys[1], ys[2], ys[3]],
                        [sums[0], sums[1], sums[2], sums[3]],
                    ),
                ),
            }
        }
    }
}

impl Avx2 {
    /// `Σ a[i] b[i]`.
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: length mismatch");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::dot(a, b) }
    }

    /// `y += a * x`.
    pub fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: length mismatch");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::axpy(a, x, y) }
    }

    /// `out = x / sqrt(mean(x²) + eps) * weight`.
    pub fn rms_norm(self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        assert!(
            x.len() == weight.len() && x.len() == out.len(),
            "rms_norm: x, weight and out lengths differ"
        );
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::rms_norm(x, weight, eps, out) }
    }

    /// Quantizes `x` (a multiple of 32 long) into Q8_0 blocks, bit-identical
    /// to [`crate::quantize_row_q8_0`].
    pub fn quantize_row_q8_0(self, x: &[f32], out: &mut [BlockQ8_0]) {
        assert_eq!(x.len(), out.len() * 32, "Q8_0 row length");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { quantize::q8_0(x, out) }
    }

    /// Quantizes `x` (a multiple of 256 long) into Q8_K blocks,
    /// bit-identical to [`crate::quantize_row_q8_k`].
    pub fn quantize_row_q8_k(self, x: &[f32], out: &mut [BlockQ8K]) {
        assert_eq!(x.len(), out.len() * 256, "Q8_K row length");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { quantize::q8_k(x, out) }
    }

    /// In-place softmax of one row.
    pub fn softmax(self, x: &mut [f32]) {
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::softmax(x) }
    }

    /// `gate = silu(gate) * up`.
    pub fn silu_mul(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::silu_mul(gate, up) }
    }

    /// `gate = gelu_tanh(gate) * up` (see `scalar::gelu_tanh_mul`).
    pub fn gelu_tanh_mul(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gelu_tanh_mul: length mismatch");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::gelu_tanh_mul(gate, up) }
    }

    /// RoPE rotation of every `head_dim`-wide head of `x` by the angles in
    /// `cos`/`sin` (see `scalar::rope_rotate`).
    pub fn rope_rotate(
        self,
        x: &mut [f32],
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
        style: crate::RopeStyle,
    ) {
        assert!(
            cos.len() == sin.len() && 2 * cos.len() <= head_dim && x.len().is_multiple_of(head_dim),
            "rope_rotate: tables or head size do not fit x"
        );
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::rope_rotate(x, head_dim, cos, sin, style) }
    }

    /// Dequantizes one row on AVX2 when `ty` has a vector path (F32, F16,
    /// BF16, Q8_0, Q4_0) and returns true; returns false, touching nothing,
    /// for other types. Lengths as [`crate::dequantize_row_scalar`].
    pub fn dequantize_row(self, ty: crate::GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
        use crate::GgmlType as T;
        if !matches!(ty, T::F32 | T::F16 | T::BF16 | T::Q8_0 | T::Q4_0) {
            return false;
        }
        let want = ty.bytes_for(dst.len() as u64);
        assert!(
            want == Ok(src.len() as u64),
            "dequantize_row: {} elements of {ty} do not fit {} bytes",
            dst.len(),
            src.len()
        );
        match ty {
            T::F32 => {
                for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            // SAFETY (all four): `self` proves avx2, fma and f16c.
            T::F16 => unsafe { ops::dequant_f16(src, dst) },
            T::BF16 => unsafe { ops::dequant_bf16(src, dst) },
            T::Q8_0 => unsafe { ops::dequant_q8_0(src, dst) },
            T::Q4_0 => unsafe { ops::dequant_q4_0(src, dst) },
            _ => unreachable!("filtered above"),
        }
        true
    }

    /// `a += b`.
    pub fn add(self, a: &mut [f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "add: length mismatch");
        // SAFETY: `self` proves avx2, fma and f16c.
        unsafe { ops::add(a, b) }
    }
}
