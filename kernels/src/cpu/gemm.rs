//! Prefill matmuls on panels: every eight weight rows repacked once and
//! run against every token of the call. Quantized types go through the
//! VNNI panels (`avx2::Panel`, four tokens per kernel call), F16 through
//! the AVX2 F16 panels (`avx2::F16Panel`, sixteen rows and six tokens per
//! call).

use std::cell::RefCell;

use super::matmul::{Activations, Job};
use super::{CpuKernels, QuantMatrix};
use crate::GgmlType;
use crate::avx2::{
    Avx2, F16_PANEL_ROWS, F16_PANEL_TOKENS, F16Panel, F16PanelOut, PACKED_TOKENS, PANEL_ROWS,
    PANEL_TOKENS, Panel, Vnni,
};
use crate::quantize::{BlockQ8_0, BlockQ8_0U, BlockQ8K};
use crate::{PACK_ROWS, PackedMatrix};

thread_local! {
    /// Each thread's panel, reused across tasks and calls.
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    /// Each thread's pair of F16 panels.
    static F16_PANELS: RefCell<[F16Panel; 2]> = RefCell::new(Default::default());
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
    /// F16 panels, two at a time.
    pub(super) fn f16_panels_job<'a>(
        &'a self,
        avx2: Avx2,
        w: &QuantMatrix<'a>,
        acts: &'a Activations<'a>,
    ) -> Job<'a> {
        const PAIR: usize = 2 * F16_PANEL_ROWS;
        let n_tokens = acts.tokens();
        let x = acts.f32();
        let cols = w.cols;
        let (data, row_bytes) = (w.data, w.row_bytes());
        // Whole panel pairs per task, at least four tasks a thread.
        let pairs = w.rows.div_ceil(PAIR);
        let chunk = pairs.div_ceil(self.threads() * 4).clamp(1, 4) * PAIR;
        self.new_job(
            w,
            n_tokens,
            chunk,
            Box::new(move |first_row, dst| {
                let rows_here = dst.len() / n_tokens;
                F16_PANELS.with_borrow_mut(|panels| {
                    for p0 in (0..rows_here).step_by(PAIR) {
                        let nr = PAIR.min(rows_here - p0);
                        let n_panels = nr.div_ceil(F16_PANEL_ROWS);
                        for (p, panel) in panels[..n_panels].iter_mut().enumerate() {
                            let r0 = first_row + p0 + p * F16_PANEL_ROWS;
                            let r1 = (r0 + F16_PANEL_ROWS).min(first_row + p0 + nr);
                            let mut rows: [&[u8]; F16_PANEL_ROWS] = [&[]; F16_PANEL_ROWS];
                            for (slot, r) in rows.iter_mut().zip(r0..r1) {
                                *slot = &data[r * row_bytes..(r + 1) * row_bytes];
                            }
                            avx2.pack_f16_panel(&rows[..r1 - r0], panel);
                        }
                        let refs: [&F16Panel; 2] = [&panels[0], &panels[1]];
                        for t0 in (0..n_tokens).step_by(F16_PANEL_TOKENS) {
                            let nt = F16_PANEL_TOKENS.min(n_tokens - t0);
                            let mut xs: [&[f32]; F16_PANEL_TOKENS] = [&[]; F16_PANEL_TOKENS];
                            for (i, xt) in xs[..nt].iter_mut().enumerate() {
                                let t = t0 + i;
                                *xt = &x[t * cols..(t + 1) * cols];
                            }
                            let mut res = [F16PanelOut::default(); F16_PANEL_TOKENS];
                            avx2.f16_panel_dot(&refs[..n_panels], &xs[..nt], &mut res[..nt]);
                            for (i, res) in res[..nt].iter().enumerate() {
                                let at = (t0 + i) * rows_here + p0;
                                let res = res.as_flattened();
                                dst[at..at + nr].copy_from_slice(&res[..nr]);
                            }
                        }
                    }
                });
            }),
        )
    }
}
