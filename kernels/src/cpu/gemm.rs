//! Prefill matmuls on panels: every eight weight rows repacked once and
//! run against every token of the call. Quantized types go through the
//! VNNI panels (`avx2::Panel`, four tokens per kernel call), F16 through
//! the F16 panels: AVX-512 ones where the CPU has it (`avx2::F16WidePanel`,
//! 32 rows and twelve tokens per call), else AVX2 ones (`avx2::F16Panel`,
//! sixteen rows and six tokens per call).

use std::cell::RefCell;

use super::matmul::{Activations, Job};
use super::{CpuKernels, QuantMatrix};
use crate::GgmlType;
use crate::avx2::{
    Avx2, F16_PANEL_ROWS, F16_PANEL_TOKENS, F16_WIDE_ROWS, F16_WIDE_TOKENS, F16Panel, F16PanelOut,
    F16WideOut, F16WidePanel, PACKED_TOKENS, PANEL_ROWS, PANEL_TOKENS, Panel, Vnni,
};
use crate::quantize::{BlockQ8_0, BlockQ8_0U, BlockQ8K};
use crate::{PACK_ROWS, PackedMatrix};

thread_local! {
    /// Each thread's panel, reused across tasks and calls.
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    /// Each thread's pair of F16 panels.
    static F16_PANELS: RefCell<[F16Panel; 2]> = RefCell::new(Default::default());
    /// Each thread's pair of wide (AVX-512) F16 panels.
    static F16_WIDE_PANELS: RefCell<[F16WidePanel; 2]> = RefCell::new(Default::default());
}

/// Rows per task: whole panels, several per task so a task's setup is
/// amortised, at least four tasks a thread so claiming evens out stragglers.
fn rows_per_task(rows: usize, threads: usize) -> usize {
    let panels = rows.div_ceil(PANEL_ROWS);
    panels.div_ceil(threads * 4).clamp(1, 8) * PANEL_ROWS
}

impl CpuKernels {
    /// The job for `w` through VNNI panels; `w`'s type must be one
    /// [`Vnni::packs`] takes.
    pub(super) fn panels_job<'a>(
        &'a self,
        vnni: Vnni,
        w: &QuantMatrix<'a>,
        acts: &'a Activations<'a>,
    ) -> Job<'a> {
        let n_tokens = acts.tokens();
        let blocks = w.cols / 32;
        // The activations ggml pairs with each type: Q8_K for K-quants
        // (then only Q4_K and Q5_K read the block sums), Q8_0 otherwise.
        let (ys, sums): (&[BlockQ8_0U], &[f32]) = match w.ty {
            GgmlType::Q4K | GgmlType::Q5K => acts.q8_k_as_32(self),
            GgmlType::Q6K => (acts.q8_k_as_32(self).0, &[]),
            _ => (acts.q8_0u(self), &[]),
        };
        let token = move |t: usize| &ys[t * blocks..(t + 1) * blocks];
        let token_sums = move |t: usize| {
            if sums.is_empty() {
                &[][..]
            } else {
                &sums[t * blocks..(t + 1) * blocks]
            }
        };
        let (ty, data, row_bytes) = (w.ty, w.data, w.row_bytes());
        let chunk = rows_per_task(w.rows, self.threads());
        self.new_job(
            w,
            n_tokens,
            chunk,
            Box::new(move |first_row, dst| {
                let rows_here = dst.len() / n_tokens;
                PANEL.with_borrow_mut(|panel| {
                    for p0 in (0..rows_here).step_by(PANEL_ROWS) {
                        let nr = PANEL_ROWS.min(rows_here - p0);
                        let mut rows: [&[u8]; PANEL_ROWS] = [&[]; PANEL_ROWS];
                        for (i, r) in rows[..nr].iter_mut().enumerate() {
                            let row = first_row + p0 + i;
                            *r = &data[row * row_bytes..(row + 1) * row_bytes];
                        }
                        vnni.pack_panel(ty, &rows[..nr], panel);
                        for t0 in (0..n_tokens).step_by(PANEL_TOKENS) {
                            let nt = PANEL_TOKENS.min(n_tokens - t0);
                            let mut xs: [&[BlockQ8_0U]; PANEL_TOKENS] = [&[]; PANEL_TOKENS];
                            let mut ss: [&[f32]; PANEL_TOKENS] = [&[]; PANEL_TOKENS];
                            for i in 0..nt {
                                xs[i] = token(t0 + i);
                                ss[i] = token_sums(t0 + i);
                            }
                            let at = t0 * rows_here + p0;
                            vnni.panel_dot(panel, &xs[..nt], &ss[..nt], &mut dst[at..], rows_here);
                        }
                    }
                });
            }),
        )
    }
}

impl CpuKernels {
    /// The job for `w` through its packed form `p` (every call, decode or
    /// prefill): groups of eight rows, four tokens per kernel call.
    pub(super) fn packed_job<'a>(
        &'a self,
        vnni: Vnni,
        w: &QuantMatrix<'a>,
        p: &'a PackedMatrix,
        acts: &'a Activations<'a>,
    ) -> Job<'a> {
        let n_tokens = acts.tokens();
        let blocks = p.blocks();
        // K-quants take Q8_K activations, as their row kernels do; the
        // others Q8_0.
        let k_quant = matches!(p.ty(), GgmlType::Q4K | GgmlType::Q6K);
        let (ys, sums, ys_k): (&[BlockQ8_0], &[i32], &[BlockQ8K]) = if k_quant {
            (&[], &[], acts.q8_k(self))
        } else {
            (acts.q8_0(self), acts.q8_0_isums(self), &[])
        };
        // Whole groups per task, at least four tasks a thread.
        let groups = w.rows.div_ceil(PACK_ROWS);
        let chunk = groups.div_ceil(self.threads() * 4).clamp(1, 8) * PACK_ROWS;
        self.new_job(
            w,
            n_tokens,
            chunk,
            Box::new(move |first_row, dst| {
                if n_tokens == 1 {
                    // Decode: the task's groups in one call.
                    vnni.packed_matvec(p, first_row / PACK_ROWS, ys, sums, ys_k, dst);
                    return;
                }
                let rows_here = dst.len() / n_tokens;
                for r0 in (0..rows_here).step_by(PACK_ROWS) {
                    let nr = PACK_ROWS.min(rows_here - r0);
                    let g = (first_row + r0) / PACK_ROWS;
                    for t0 in (0..n_tokens).step_by(PACKED_TOKENS) {
                        let nt = PACKED_TOKENS.min(n_tokens - t0);
                        let mut res = [[0.0f32; PACK_ROWS]; PACKED_TOKENS];
                        if k_quant {
                            let mut xs: [&[BlockQ8K]; PACKED_TOKENS] = [&[]; PACKED_TOKENS];
                            for (i, x) in xs[..nt].iter_mut().enumerate() {
                                let t = t0 + i;
                                *x = &ys_k[t * blocks..(t + 1) * blocks];
                            }
                            vnni.packed_dot_k(p, g, &xs[..nt], &mut res[..nt]);
                        } else {
                            let mut xs: [&[BlockQ8_0]; PACKED_TOKENS] = [&[]; PACKED_TOKENS];
                            let mut ss: [&[i32]; PACKED_TOKENS] = [&[]; PACKED_TOKENS];
                            for i in 0..nt {
                                let t = t0 + i;
                                xs[i] = &ys[t * blocks..(t + 1) * blocks];
                                ss[i] = &sums[t * blocks..(t + 1) * blocks];
                            }
                            vnni.packed_dot(p, g, &xs[..nt], &ss[..nt], &mut res[..nt]);
                        }
                        for (i, res) in res[..nt].iter().enumerate() {
                            let at = (t0 + i) * rows_here + r0;
                            if nr == PACK_ROWS {
                                let out: &mut [f32; PACK_ROWS] =
                                    (&mut dst[at..at + PACK_ROWS]).try_into().expect("a group");
                                *out = *res;
                            } else {
                                dst[at..at + nr].copy_from_slice(&res[..nr]);
                            }
                        }
                    }
                }
            }),
        )
    }

    /// The job for F16 weights `w` (a multiple of eight columns) through
    /// F16 panels of `kernel`, two at a time.
    pub(super) fn f16_panels_job<'a, K: F16Panels>(
        &'a self,
        kernel: K,
        w: &QuantMatrix<'a>,
        acts: &'a Activations<'a>,
    ) -> Job<'a> {
        let pair = 2 * K::ROWS;
        let n_tokens = acts.tokens();
        let x = acts.f32();
        let cols = w.cols;
        let (data, row_bytes) = (w.data, w.row_bytes());
        // Whole panel pairs per task, at least four tasks a thread.
        let pairs = w.rows.div_ceil(pair);
        let chunk = pairs.div_ceil(self.threads() * 4).clamp(1, 4) * pair;
        self.new_job(
            w,
            n_tokens,
            chunk,
            Box::new(move |first_row, dst| {
                let rows_here = dst.len() / n_tokens;
                K::with_panels(|panels| {
                    let mut rows = Vec::with_capacity(K::ROWS);
                    let mut xs = Vec::with_capacity(K::TOKENS);
                    let mut res = vec![0.0f32; K::TOKENS * pair];
                    for p0 in (0..rows_here).step_by(pair) {
                        let nr = pair.min(rows_here - p0);
                        let n_panels = nr.div_ceil(K::ROWS);
                        for (p, panel) in panels[..n_panels].iter_mut().enumerate() {
                            let r0 = first_row + p0 + p * K::ROWS;
                            let r1 = (r0 + K::ROWS).min(first_row + p0 + nr);
                            rows.clear();
                            rows.extend(
                                (r0..r1).map(|r| &data[r * row_bytes..(r + 1) * row_bytes]),
                            );
                            kernel.pack(&rows, panel);
                        }
                        let refs = [&panels[0], &panels[1]];
                        for t0 in (0..n_tokens).step_by(K::TOKENS) {
                            let nt = K::TOKENS.min(n_tokens - t0);
                            xs.clear();
                            xs.extend((t0..t0 + nt).map(|t| &x[t * cols..(t + 1) * cols]));
                            kernel.dot(&refs[..n_panels], &xs, &mut res[..nt * pair]);
                            for (i, res) in res[..nt * pair].chunks_exact(pair).enumerate() {
                                let at = (t0 + i) * rows_here + p0;
                                dst[at..at + nr].copy_from_slice(&res[..nr]);
                            }
                        }
                    }
                });
            }),
        )
    }
}

/// An F16 panel kernel: AVX2's (eight-row panels, six tokens a call) or
/// AVX-512's (sixteen-row panels, twelve tokens a call; the same sums).
pub(super) trait F16Panels: Copy + Send + Sync + 'static {
    /// Rows in a panel.
    const ROWS: usize;
    /// Most tokens a [`F16Panels::dot`] call takes.
    const TOKENS: usize;
    type Panel;
    /// Runs `f` on this thread's pair of panels (reused across tasks).
    fn with_panels(f: impl FnOnce(&mut [Self::Panel; 2]));
    /// Widens up to [`F16Panels::ROWS`] rows into `panel`.
    fn pack(self, rows: &[&[u8]], panel: &mut Self::Panel);
    /// `out[t · 2·ROWS + p · ROWS + r]` = row `r` of `panels[p]` · `xs[t]`.
    fn dot(self, panels: &[&Self::Panel], xs: &[&[f32]], out: &mut [f32]);
}

impl F16Panels for Avx2 {
    const ROWS: usize = F16_PANEL_ROWS;
    const TOKENS: usize = F16_PANEL_TOKENS;
    type Panel = F16Panel;
    fn with_panels(f: impl FnOnce(&mut [F16Panel; 2])) {
        F16_PANELS.with_borrow_mut(f)
    }
    fn pack(self, rows: &[&[u8]], panel: &mut F16Panel) {
        self.pack_f16_panel(rows, panel);
    }
    fn dot(self, panels: &[&F16Panel], xs: &[&[f32]], out: &mut [f32]) {
        let mut res = [F16PanelOut::default(); F16_PANEL_TOKENS];
        self.f16_panel_dot(panels, xs, &mut res[..xs.len()]);
        out.copy_from_slice(res[..xs.len()].as_flattened().as_flattened());
    }
}

impl F16Panels for Vnni {
    const ROWS: usize = F16_WIDE_ROWS;
    const TOKENS: usize = F16_WIDE_TOKENS;
    type Panel = F16WidePanel;
    fn with_panels(f: impl FnOnce(&mut [F16WidePanel; 2])) {
        F16_WIDE_PANELS.with_borrow_mut(f)
    }
    fn pack(self, rows: &[&[u8]], panel: &mut F16WidePanel) {
        self.pack_f16_wide(rows, panel);
    }
    fn dot(self, panels: &[&F16WidePanel], xs: &[&[f32]], out: &mut [f32]) {
        let mut res = [F16WideOut::default(); F16_WIDE_TOKENS];
        self.f16_wide_dot(panels, xs, &mut res[..xs.len()]);
        out.copy_from_slice(res[..xs.len()].as_flattened().as_flattened());
    }
}
