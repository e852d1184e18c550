//! The safe wrappers of the F16 panel kernels (`gemm_f16.rs`): the AVX2
//! panels on [`Avx2`], the 512-bit ones on [`Vnni`].

use super::gemm_f16::{
    self, F16_PANEL_ROWS, F16_PANEL_TOKENS, F16_WIDE_ROWS, F16_WIDE_TOKENS, F16Panel, F16WidePanel,
};
use super::{Avx2, Vnni};

/// `out[t][p]` of one [`Avx2::f16_panel_dot`] call: token `t`, panel `p`.
pub type F16PanelOut = [[f32; F16_PANEL_ROWS]; 2];

impl Avx2 {
    /// Widens and transposes up to [`F16_PANEL_ROWS`] F16 rows (each a
    /// whole row's bytes, a multiple of eight elements) into `panel` for
    /// [`Avx2::f16_panel_dot`].
    ///
    /// # Panics
    /// If there are no rows or too many, or they differ in length or are
    /// not a multiple of eight elements.
    pub fn pack_f16_panel(self, rows: &[&[u8]], panel: &mut F16Panel) {
        assert!(
            (1..=F16_PANEL_ROWS).contains(&rows.len()),
            "pack_f16_panel: {} rows, want 1..={F16_PANEL_ROWS}",
            rows.len()
        );
        let len = rows[0].len();
        assert!(
            len > 0 && len.is_multiple_of(16) && rows.iter().all(|r| r.len() == len),
            "pack_f16_panel: rows are not one length of a multiple of eight F16"
        );
        // SAFETY: `self` proves avx2, fma and f16c; rows checked above.
        unsafe { gemm_f16::pack_f16(panel, rows) }
    }

    /// `out[t][p][r]` = row `r` of `panels[p]` · `xs[t]`, for one or two
    /// panels and up to [`F16_PANEL_TOKENS`] tokens (with one panel,
    /// `out[t][1]` is left as it was).
    ///
    /// # Panics
    /// If there are no panels or more than two, the panels differ in width,
    /// a token is not that wide, or the token and output counts differ or
    /// exceed [`F16_PANEL_TOKENS`].
    pub fn f16_panel_dot(self, panels: &[&F16Panel], xs: &[&[f32]], out: &mut [F16PanelOut]) {
        let cols = panels.first().map_or(0, |p| p.cols());
        assert!(
            (1..=2).contains(&panels.len()) && panels.iter().all(|p| p.cols() == cols),
            "f16_panel_dot: want one or two panels of one width"
        );
        assert!(
            xs.len() == out.len() && xs.len() <= F16_PANEL_TOKENS,
            "f16_panel_dot: {} tokens, {} outputs (at most {F16_PANEL_TOKENS})",
            xs.len(),
            out.len()
        );
        assert!(
            xs.iter().all(|x| x.len() == cols),
            "f16_panel_dot: activations are not {cols} wide"
        );
        macro_rules! go {
            ($($t:literal),*) => {
                match (panels, xs.len()) {
                    $(
                        ([a], $t) => {
                            // SAFETY: `self` proves avx2, fma and f16c;
                            // widths checked above.
                            let r = unsafe {
                                gemm_f16::f16_panels_tokens::<1, $t>([a], xs.try_into().unwrap())
                            };
                            for (o, r) in out.iter_mut().zip(r) {
                                o[0] = r[0];
                            }
                        }
                        ([a, b], $t) => {
                            // SAFETY: as above.
                            let r = unsafe {
                                gemm_f16::f16_panels_tokens::<2, $t>([a, b], xs.try_into().unwrap())
                            };
                            for (o, r) in out.iter_mut().zip(r) {
                                *o = r;
                            }
                        }
                    )*
                    _ => {}
                }
            };
        }
        go!(1, 2, 3, 4, 5, 6);
    }
}

/// `out[t][p]` of one [`Vnni::f16_wide_dot`] call: token `t`, panel `p`.
pub type F16WideOut = [[f32; F16_WIDE_ROWS]; 2];

impl Vnni {
    /// Widens and transposes up to [`F16_WIDE_ROWS`] F16 rows (each a
    /// whole row's bytes, a multiple of eight elements) into `panel` for
    /// [`Vnni::f16_wide_dot`].
    ///
    /// # Panics
    /// If there are no rows or too many, or they differ in length or are
    /// not a multiple of eight elements.
    pub fn pack_f16_wide(self, rows: &[&[u8]], panel: &mut F16WidePanel) {
        assert!(
            (1..=F16_WIDE_ROWS).contains(&rows.len()),
            "pack_f16_wide: {} rows, want 1..={F16_WIDE_ROWS}",
            rows.len()
        );
        let len = rows[0].len();
        assert!(
            len > 0 && len.is_multiple_of(16) && rows.iter().all(|r| r.len() == len),
            "pack_f16_wide: rows are not one length of a multiple of eight F16"
        );
        // SAFETY: `self` proves avx2, fma, f16c, avx512f, avx512vl and
        // avx512vnni; rows checked above.
        unsafe { gemm_f16::pack_f16_wide(panel, rows) }
    }

    /// `out[t][p][r]` = row `r` of `panels[p]` · `xs[t]`, for one or two
    /// wide panels and up to [`F16_WIDE_TOKENS`] tokens (with one panel,
    /// `out[t][1]` is left as it was): [`Avx2::f16_panel_dot`] on 512-bit
    /// vectors, with bit-identical results.
    ///
    /// # Panics
    /// If there are no panels or more than two, the panels differ in width,
    /// a token is not that wide, or the token and output counts differ or
    /// exceed [`F16_WIDE_TOKENS`].
    pub fn f16_wide_dot(self, panels: &[&F16WidePanel], xs: &[&[f32]], out: &mut [F16WideOut]) {
        let cols = panels.first().map_or(0, |p| p.cols());
        assert!(
            (1..=2).contains(&panels.len()) && panels.iter().all(|p| p.cols() == cols),
            "f16_wide_dot: want one or two panels of one width"
        );
        assert!(
            xs.len() == out.len() && xs.len() <= F16_WIDE_TOKENS,
            "f16_wide_dot: {} tokens, {} outputs (at most {F16_WIDE_TOKENS})",
            xs.len(),
            out.len()
        );
        assert!(
            xs.iter().all(|x| x.len() == cols),
            "f16_wide_dot: activations are not {cols} wide"
        );
        macro_rules! go {
            ($($t:literal),*) => {
                match (panels, xs.len()) {
                    $(
                        ([a], $t) => {
                            // SAFETY: `self` proves avx2, fma, f16c,
                            // avx512f, avx512vl and avx512vnni; widths
                            // checked above.
                            let r = unsafe {
                                gemm_f16::f16_wide_tokens::<1, $t>([a], xs.try_into().unwrap())
                            };
                            for (o, r) in out.iter_mut().zip(r) {
                                o[0] = r[0];
                            }
                        }
                        ([a, b], $t) => {
                            // SAFETY: as above.
                            let r = unsafe {
                                gemm_f16::f16_wide_tokens::<2, $t>([a, b], xs.try_into().unwrap())
                            };
                            for (o, r) in out.iter_mut().zip(r) {
                                *o = r;
                            }
                        }
                    )*
                    _ => {}
                }
            };
        }
        go!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    }
}
