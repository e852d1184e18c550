//! Matmul on the CPU: each weight matrix of a call becomes a [`Job`] (its
//! kernel chosen, its activations quantized once and shared by every
//! matrix of the call that reads them the same way), and all the jobs' row
//! chunks run as one team job. Projections of one input (q, k and v; gate
//! and up) therefore cost one synchronization, not one each.

use std::cell::OnceCell;

use super::{Backend, CpuKernels, MIN_PARALLEL_MACS, MIN_PARALLEL_QUANTIZE, QuantMatrix};
use crate::avx2::{Avx2, F16_PANEL_ROWS, Vnni};
use crate::quantize::{
    BlockQ8_0, BlockQ8_0U, BlockQ8_1, BlockQ8K, quantize_row_q8_0, quantize_row_q8_1,
    quantize_row_q8_k,
};
use crate::{GgmlType, scalar};

/// Tokens from which a matmul goes through panels. Below it the repack
/// (one pass over the weights, as the matmul itself) is shared by too few
/// tokens to pay off against the multi-token row kernels.
const MIN_PANEL_TOKENS: usize = 4;

/// Whether matmul may hand several tokens to one kernel call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenGrouping {
    /// One single-row dot per (row, token): decode, and the old prefill path.
    One,
    /// Several tokens per weight row where a multi-token kernel exists
    /// (prefill): the VNNI panels, or [`Avx2::MAX_TOKENS`] /
    /// [`Vnni::MAX_TOKENS`] tokens per row kernel call.
    Several,
    /// As `Several`, but only through kernels that keep the one-row
    /// accumulation order (Q4_0, Q8_0, Q4_K row kernels): every result is
    /// bit-identical to a one-row call (batched decode).
    Exact,
}

/// Weight rows one grouped kernel call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowsPerCall {
    One,
    /// Two rows share activation loads (F16, where those dominate).
    Two,
}

/// The shape of one grouped kernel call: rows × tokens.
#[derive(Clone, Copy, Debug)]
struct Tile {
    rows: RowsPerCall,
    /// At most [`Tile::MAX_TOKENS`].
    tokens: usize,
}

impl Tile {
    const MAX_TOKENS: usize = Vnni::MAX_TOKENS;

    /// The AVX2 multi-token kernels: up to four tokens.
    fn avx2(rows: RowsPerCall) -> Tile {
        Tile {
            rows,
            tokens: Avx2::MAX_TOKENS,
        }
    }

    /// The VNNI kernels: one row, up to eight tokens.
    fn vnni() -> Tile {
        Tile {
            rows: RowsPerCall::One,
            tokens: Vnni::MAX_TOKENS,
        }
    }
}

/// Rows handed to one task: enough to amortise claiming it, few enough that
/// every thread gets several tasks (dynamic claiming evens out stragglers).
/// Even, so row pairs (see [`CpuKernels::rows_dot_grouped`]) never straddle
/// two tasks and the pairing does not depend on the thread count.
fn rows_per_task(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads * 4).clamp(8, 64).next_multiple_of(2)
}

/// `out[t * rows + r]` from `blocked`, which holds the result in blocks of
/// `chunk` rows (the last may be shorter), each block `[token][row of the
/// block]`: one contiguous copy per (block, token).
fn unblock_rows(blocked: &[f32], n_tokens: usize, rows: usize, chunk: usize, out: &mut [f32]) {
    for (c, block) in blocked.chunks(chunk * n_tokens).enumerate() {
        let nr = block.len() / n_tokens;
        let r0 = c * chunk;
        for (t, src) in block.chunks_exact(nr).enumerate() {
            out[t * rows + r0..t * rows + r0 + nr].copy_from_slice(src);
        }
    }
}

/// Picks the scalar or AVX2 version of a row kernel, as a closure over the
/// backend so the per-row dispatch is one predictable branch.
macro_rules! row_kernel {
    ($backend:expr, $name:ident) => {{
        let backend = $backend;
        move |w: &[u8], x: &[_]| match backend {
            Backend::Scalar => scalar::$name(w, x),
            Backend::Avx2(k) => k.$name(w, x),
        }
    }};
}

/// One call's activations, quantized into each format on first use and
/// shared by every matrix of the call that takes that format.
pub(super) struct Activations<'x> {
    x: &'x [f32],
    n_tokens: usize,
    cols: usize,
    q8_0: OnceCell<Vec<BlockQ8_0>>,
    q8_0u: OnceCell<Vec<BlockQ8_0U>>,
    /// `Σ q` of every Q8_0 block.
    q8_0_isums: OnceCell<Vec<i32>>,
    q8_1: OnceCell<Vec<BlockQ8_1>>,
    q8_k: OnceCell<Vec<BlockQ8K>>,
    /// The Q8_K blocks as 32-element offset blocks, with their sums.
    q8_k_32: OnceCell<(Vec<BlockQ8_0U>, Vec<f32>)>,
}

impl<'x> Activations<'x> {
    fn new(x: &'x [f32], n_tokens: usize, cols: usize) -> Self {
        Activations {
            x,
            n_tokens,
            cols,
            q8_0: OnceCell::new(),
            q8_0u: OnceCell::new(),
            q8_0_isums: OnceCell::new(),
            q8_1: OnceCell::new(),
            q8_k: OnceCell::new(),
            q8_k_32: OnceCell::new(),
        }
    }

    pub(super) fn tokens(&self) -> usize {
        self.n_tokens
    }

    /// The f32 activations, one row per token.
    pub(super) fn f32(&self) -> &'x [f32] {
        self.x
    }

    /// Q8_0, for Q4_0, Q5_0 and Q8_0 weights: the AVX2 quantizer where the
    /// backend has it (the same blocks, faster).
    pub(super) fn q8_0(&self, k: &CpuKernels) -> &[BlockQ8_0] {
        self.q8_0.get_or_init(|| match k.backend {
            Backend::Scalar => k.quantize(self, 32, quantize_row_q8_0),
            Backend::Avx2(a) => {
                k.quantize(self, 32, |x: &[f32], q: &mut [_]| a.quantize_row_q8_0(x, q))
            }
        })
    }

    /// The Q8_0 blocks offset to unsigned, for the VNNI kernels.
    pub(super) fn q8_0u(&self, k: &CpuKernels) -> &[BlockQ8_0U] {
        self.q8_0u
            .get_or_init(|| self.q8_0(k).iter().map(BlockQ8_0U::from).collect())
    }

    /// `Σ q` of every Q8_0 block (the packed matvec's offset terms).
    pub(super) fn q8_0_isums(&self, k: &CpuKernels) -> &[i32] {
        self.q8_0_isums.get_or_init(|| {
            self.q8_0(k)
                .iter()
                .map(|b| b.qs.iter().map(|&v| i32::from(v)).sum())
                .collect()
        })
    }

    /// The Q8_K blocks (as K-quant weights take them, and ggml quantizes
    /// them) cut into 32-element offset blocks for the VNNI panels, each
    /// with its `d · Σ q`: the panels read every type's activations in
    /// blocks of 32.
    pub(super) fn q8_k_as_32(&self, k: &CpuKernels) -> (&[BlockQ8_0U], &[f32]) {
        let (blocks, sums) = self.q8_k_32.get_or_init(|| {
            let q = self.q8_k(k);
            let mut blocks = Vec::with_capacity(q.len() * 8);
            let mut sums = Vec::with_capacity(q.len() * 8);
            for b in q {
                for (j, qs) in b.qs.chunks_exact(32).enumerate() {
                    let mut u = BlockQ8_0U {
                        d: b.d,
                        qs: [0; 32],
                    };
                    for (u, &q) in u.qs.iter_mut().zip(qs) {
                        *u = (q as u8) ^ 0x80;
                    }
                    blocks.push(u);
                    let sum = i32::from(b.bsums[2 * j]) + i32::from(b.bsums[2 * j + 1]);
                    sums.push(b.d * sum as f32);
                }
            }
            (blocks, sums)
        });
        (blocks, sums)
    }

    fn q8_1(&self, k: &CpuKernels) -> &[BlockQ8_1] {
        self.q8_1
            .get_or_init(|| k.quantize(self, 32, quantize_row_q8_1))
    }

    /// Q8_K, for the K-quants and IQ4_XS: the AVX2 quantizer where the
    /// backend has it (the same blocks, faster).
    pub(super) fn q8_k(&self, k: &CpuKernels) -> &[BlockQ8K] {
        self.q8_k.get_or_init(|| match k.backend {
            Backend::Scalar => k.quantize(self, 256, quantize_row_q8_k),
            Backend::Avx2(a) => k.quantize(self, 256, |x: &[f32], q: &mut [_]| {
                a.quantize_row_q8_k(x, q)
            }),
        })
    }
}

thread_local! {
    /// The caller's scratch for prefill outputs in blocks (see
    /// [`CpuKernels::run_jobs`]); it keeps its largest size.
    static BLOCKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a task of a [`Job`] runs: rows `first_row..` of the result into
/// `dst`, as `[token][row]` (`dst.len() / n_tokens` rows).
pub(super) type Work<'a> = Box<dyn Fn(usize, &mut [f32]) + Sync + 'a>;

/// One matrix of a matmul call, ready to run: its rows, the rows a task
/// takes, and the work.
pub(super) struct Job<'a> {
    pub(super) rows: usize,
    pub(super) macs: usize,
    pub(super) chunk: usize,
    pub(super) work: Work<'a>,
}

impl CpuKernels {
    /// `out[t * w.rows + r] = dot(row r of w, x[t * w.cols .. (t + 1) * w.cols])`
    /// for `t` in `0..n_tokens`.
    ///
    /// Quantized weights take activations quantized the way ggml pairs them
    /// (Q8_0, Q8_1 or Q8_K), once per call. With AVX-512 VNNI, prefill-sized
    /// calls of Q8_0, Q4_0, Q5_0 and the K-quants go through the VNNI panels
    /// ([`CpuKernels::uses_panels`]). With AVX2 and more than one token, F16,
    /// Q4_0, Q8_0, Q4_K and Q6_K weights go through multi-token kernels
    /// that unpack each weight block once for up to four tokens (eight for
    /// Q8_0 and Q4_0 with VNNI, same results). Results do not depend on the
    /// thread count.
    ///
    /// # Panics
    /// If `w` is malformed or `x`/`out` have the wrong length (caller bugs).
    pub fn matmul(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.matmuls(x, n_tokens, &mut [(*w, out)], TokenGrouping::Several);
    }

    /// [`CpuKernels::matmul`] with every (row, token) pair computed by its own
    /// single-row dot: the path before the multi-token kernels, kept for
    /// benchmarks and as a test oracle.
    ///
    /// # Panics
    /// As [`CpuKernels::matmul`].
    pub fn matmul_per_token(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.matmuls(x, n_tokens, &mut [(*w, out)], TokenGrouping::One);
    }

    /// [`CpuKernels::matmul`] with every row of the result bit-identical to
    /// what a one-token call computes for that token: batched decode, where
    /// a sequence must get the same logits whatever else is in the batch.
    /// Multi-token kernels only where they sum in the one-row order (Q4_0,
    /// Q8_0, Q4_K, IQ4_NL, IQ4_XS), and packed weights; single-row dots
    /// otherwise (F16, Q6_K, …).
    ///
    /// # Panics
    /// As [`CpuKernels::matmul`].
    pub fn matmul_row_exact(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.matmuls(x, n_tokens, &mut [(*w, out)], TokenGrouping::Exact);
    }

    /// `out_i = w_i · x` for every `(w_i, out_i)` of `outs`, all matrices
    /// taking the same `n_tokens` rows of `x`: as [`CpuKernels::matmul`]
    /// (`grouping` [`TokenGrouping::Several`]) or
    /// [`CpuKernels::matmul_row_exact`] ([`TokenGrouping::Exact`]) each, with
    /// the same results, but the activations quantized once per format and
    /// every matrix's rows split across the team in one go.
    ///
    /// # Panics
    /// If the matrices' column counts differ, a matrix is malformed or an
    /// output has the wrong length (caller bugs).
    pub fn matmuls(
        &self,
        x: &[f32],
        n_tokens: usize,
        outs: &mut [(QuantMatrix, &mut [f32])],
        grouping: TokenGrouping,
    ) {
        let Some((first, _)) = outs.first() else {
            return;
        };
        let cols = first.cols;
        for (w, out) in outs.iter() {
            if let Err(e) = w.check() {
                panic!("matmul: {e}");
            }
            assert_eq!(w.cols, cols, "matmuls: matrices of different widths");
            assert_eq!(
                out.len(),
                n_tokens * w.rows,
                "matmul: out is not n_tokens × rows"
            );
        }
        assert_eq!(x.len(), n_tokens * cols, "matmul: x is not n_tokens × cols");
        if n_tokens == 0 {
            return;
        }
        let acts = Activations::new(x, n_tokens, cols);
        let jobs: Vec<Job<'_>> = outs
            .iter()
            .map(|(w, _)| self.job(w, &acts, grouping))
            .collect();
        let mut dsts: Vec<&mut [f32]> = outs.iter_mut().map(|(_, out)| &mut **out).collect();
        self.run_jobs(&jobs, n_tokens, &mut dsts);
    }

    /// Whether [`CpuKernels::matmul`] of `n_tokens` rows of `ty` weights
    /// `cols` wide runs on panels: prefill-sized calls of F16 weights on
    /// AVX2 (`avx2::F16Panel`), and of the quantized types the VNNI panels
    /// take on a CPU with AVX-512 VNNI (`avx2::Panel`). Their results differ
    /// from the one-row kernels' by float re-association only: they take
    /// the same quantized activations.
    pub fn uses_panels(&self, ty: GgmlType, cols: usize, n_tokens: usize) -> bool {
        n_tokens >= MIN_PANEL_TOKENS
            && match ty {
                GgmlType::F16 => {
                    matches!(self.backend, Backend::Avx2(_)) && cols.is_multiple_of(F16_PANEL_ROWS)
                }
                _ => self.vnni.is_some() && Vnni::packs(ty),
            }
    }

    /// The job for one matrix of a call: its kernel, over its activations.
    fn job<'a>(
        &'a self,
        w: &QuantMatrix<'a>,
        acts: &'a Activations<'a>,
        grouping: TokenGrouping,
    ) -> Job<'a> {
        let n_tokens = acts.tokens();
        // Packed weights: one kernel for decode, batched decode and
        // prefill, each row's result independent of what shares the call.
        if let (Some(p), Some(v)) = (w.packed, self.vnni) {
            return self.packed_job(v, w, p, acts);
        }
        if grouping == TokenGrouping::Several && self.uses_panels(w.ty, w.cols, n_tokens) {
            match (self.backend, self.vnni) {
                (Backend::Avx2(_), Some(v)) if w.ty == GgmlType::F16 => {
                    return self.f16_panels_job(v, w, acts);
                }
                (Backend::Avx2(k), None) if w.ty == GgmlType::F16 => {
                    return self.f16_panels_job(k, w, acts);
                }
                (_, Some(v)) => return self.panels_job(v, w, acts),
                _ => {}
            }
        }
        // Row-exact calls group tokens only where the multi-token kernel
        // sums in the one-row order.
        let grouping = match (grouping, w.ty) {
            (
                TokenGrouping::Exact,
                GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::IQ4NL | GgmlType::IQ4XS,
            ) => grouping,
            (TokenGrouping::Exact, _) => TokenGrouping::One,
            _ => grouping,
        };
        let b = self.backend;
        // Decode (one token) stays on the single-row kernels: nothing to share.
        let grouped = match (b, grouping) {
            (Backend::Avx2(k), TokenGrouping::Several | TokenGrouping::Exact) if n_tokens > 1 => {
                Some(k)
            }
            _ => None,
        };
        let x = acts.x;
        // The AVX2 multi-token kernel over one weight row at a time where
        // tokens are grouped, else the one-row kernel.
        macro_rules! one_row_avx2 {
            ($x:expr, $tokens:ident, $row:ident) => {
                match grouped {
                    Some(k) => self.rows_dot_grouped(
                        w,
                        $x,
                        n_tokens,
                        Tile::avx2(RowsPerCall::One),
                        move |w, x, o| k.$tokens(w[0], x, o),
                    ),
                    None => self.rows_dot(w, $x, n_tokens, row_kernel!(b, $row)),
                }
            };
        }
        // Q4_0 and Q8_0: the eight-token VNNI kernels (unsigned-offset
        // activations) where the CPU has them, else as above.
        macro_rules! vnni_or_avx2 {
            ($tokens:ident, $row:ident) => {
                match (grouped, self.vnni) {
                    (Some(_), Some(v)) => self.rows_dot_grouped(
                        w,
                        acts.q8_0u(self),
                        n_tokens,
                        Tile::vnni(),
                        move |w, x, o| v.$tokens(w[0], x, o),
                    ),
                    _ => one_row_avx2!(acts.q8_0(self), $tokens, $row),
                }
            };
        }
        match w.ty {
            GgmlType::F32 => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_f32)),
            GgmlType::F16 => match grouped {
                Some(k) => self.rows_dot_grouped(
                    w,
                    x,
                    n_tokens,
                    Tile::avx2(RowsPerCall::Two),
                    move |w, x, o| k.dot_f16_rows_tokens(w, x, o),
                ),
                None => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_f16)),
            },
            GgmlType::BF16 => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_bf16)),
            GgmlType::Q4_0 => vnni_or_avx2!(dot_q4_0_tokens, dot_q4_0),
            GgmlType::Q5_0 => self.rows_dot(w, acts.q8_0(self), n_tokens, row_kernel!(b, dot_q5_0)),
            GgmlType::Q8_0 => vnni_or_avx2!(dot_q8_0_tokens, dot_q8_0),
            GgmlType::Q4_1 => self.rows_dot(w, acts.q8_1(self), n_tokens, row_kernel!(b, dot_q4_1)),
            GgmlType::Q5_1 => self.rows_dot(w, acts.q8_1(self), n_tokens, row_kernel!(b, dot_q5_1)),
            GgmlType::Q4K => one_row_avx2!(acts.q8_k(self), dot_q4k_tokens, dot_q4k),
            GgmlType::Q5K => self.rows_dot(w, acts.q8_k(self), n_tokens, row_kernel!(b, dot_q5k)),
            GgmlType::IQ4NL => one_row_avx2!(acts.q8_0(self), dot_iq4_nl_tokens, dot_iq4_nl),
            GgmlType::IQ4XS => one_row_avx2!(acts.q8_k(self), dot_iq4_xs_tokens, dot_iq4_xs),
            GgmlType::Q6K => one_row_avx2!(acts.q8_k(self), dot_q6k_tokens, dot_q6k),
        }
    }

    /// Quantizes each token's row of the activations into `cols / block`
    /// blocks, across the team when there are enough of them.
    fn quantize<B: Clone + Default + Send>(
        &self,
        acts: &Activations<'_>,
        block: usize,
        quantize_row: impl Fn(&[f32], &mut [B]) + Sync,
    ) -> Vec<B> {
        let (x, n_tokens, cols) = (acts.x, acts.n_tokens, acts.cols);
        let per_token = cols / block;
        let mut q = vec![B::default(); n_tokens * per_token];
        if n_tokens == 1 || self.threads() == 1 || x.len() < MIN_PARALLEL_QUANTIZE {
            for (q, x) in q.chunks_exact_mut(per_token).zip(x.chunks_exact(cols)) {
                quantize_row(x, q);
            }
        } else {
            self.team.chunks_mut(&mut q, per_token, |t, q| {
                quantize_row(&x[t * cols..(t + 1) * cols], q);
            });
        }
        q
    }

    /// Runs `dot(row, token activations)` for every row and token: within a
    /// task's rows, tokens outer, rows inner, so the rows' weights stay in
    /// cache while each token's activations stream past them.
    fn rows_dot<'a, B, D>(
        &self,
        w: &QuantMatrix<'a>,
        acts: &'a [B],
        n_tokens: usize,
        dot: D,
    ) -> Job<'a>
    where
        B: Sync,
        D: Fn(&[u8], &[B]) -> f32 + Sync + 'a,
    {
        let per_token = acts.len() / n_tokens;
        let row_bytes = w.row_bytes();
        let data = w.data;
        self.new_job(
            w,
            n_tokens,
            rows_per_task(w.rows, self.threads()),
            Box::new(move |first_row, dst| {
                let rows_here = dst.len() / n_tokens;
                let weights = &data[first_row * row_bytes..(first_row + rows_here) * row_bytes];
                for (xt, dst) in acts
                    .chunks_exact(per_token)
                    .zip(dst.chunks_exact_mut(rows_here))
                {
                    for (d, row) in dst.iter_mut().zip(weights.chunks_exact(row_bytes)) {
                        *d = dot(row, xt);
                    }
                }
            }),
        )
    }

    /// As [`Self::rows_dot`], but `dot(rows, tokens, out)` takes up to
    /// `tile.tokens` tokens and up to `tile.rows` rows at once, writing
    /// `out[r * tokens.len() + t]`. Within a task, token groups outer, rows
    /// inner. Groups are fixed by token index (0..4, 4..8, … or 0..8, …) and
    /// row pairs by row index (tasks start on even rows), never by the
    /// thread split, so results do not depend on the thread count.
    fn rows_dot_grouped<'a, B, D>(
        &self,
        w: &QuantMatrix<'a>,
        acts: &'a [B],
        n_tokens: usize,
        tile: Tile,
        dot: D,
    ) -> Job<'a>
    where
        B: Sync,
        D: Fn(&[&[u8]], &[&[B]], &mut [f32]) + Sync + 'a,
    {
        const GROUP: usize = Tile::MAX_TOKENS;
        const MAX_ROWS: usize = 2;
        let rows_per_call = match tile.rows {
            RowsPerCall::One => 1,
            RowsPerCall::Two => 2,
        };
        let group = tile.tokens;
        let per_token = acts.len() / n_tokens;
        let row_bytes = w.row_bytes();
        let data = w.data;
        self.new_job(
            w,
            n_tokens,
            rows_per_task(w.rows, self.threads()),
            Box::new(move |first_row, dst| {
                let rows_here = dst.len() / n_tokens;
                let weights = &data[first_row * row_bytes..(first_row + rows_here) * row_bytes];
                for (g, tokens) in acts.chunks(group * per_token).enumerate() {
                    let mut xs: [&[B]; GROUP] = [&[]; GROUP];
                    for (x, token) in xs.iter_mut().zip(tokens.chunks_exact(per_token)) {
                        *x = token;
                    }
                    let n = tokens.len() / per_token;
                    let xs = &xs[..n];
                    let mut res = [0.0f32; MAX_ROWS * GROUP];
                    for (p, rows) in weights.chunks(rows_per_call * row_bytes).enumerate() {
                        let mut ws: [&[u8]; MAX_ROWS] = [&[]; MAX_ROWS];
                        for (w, row) in ws.iter_mut().zip(rows.chunks_exact(row_bytes)) {
                            *w = row;
                        }
                        let nr = rows.len() / row_bytes;
                        dot(&ws[..nr], xs, &mut res[..nr * n]);
                        for (r, vals) in res[..nr * n].chunks_exact(n).enumerate() {
                            let row = p * rows_per_call + r;
                            for (i, &v) in vals.iter().enumerate() {
                                dst[(g * group + i) * rows_here + row] = v;
                            }
                        }
                    }
                }
            }),
        )
    }

    /// A job over `w`'s rows, `chunk` rows per task.
    pub(super) fn new_job<'a>(
        &self,
        w: &QuantMatrix<'_>,
        n_tokens: usize,
        chunk: usize,
        work: Work<'a>,
    ) -> Job<'a> {
        Job {
            rows: w.rows,
            macs: w.rows * w.cols * n_tokens,
            chunk,
            work,
        }
    }

    /// Runs every job's row chunks, in parallel when the team has more than
    /// one thread and the call is large enough, and writes each result to
    /// its `outs` slice as `[token][row]`.
    ///
    /// A task writes its rows as `[token][row of the task]` into a slice of
    /// its own; with one token that is the task's part of the output, with
    /// more a scratch copy whose rows are then copied into place.
    fn run_jobs(&self, jobs: &[Job<'_>], n_tokens: usize, outs: &mut [&mut [f32]]) {
        if n_tokens == 1 {
            let dsts = outs.iter_mut().map(|o| &mut **o).collect();
            return self.run_tasks(jobs, n_tokens, dsts);
        }
        // The blocks go to a scratch buffer kept by the thread: a fresh one
        // per call was a fresh mapping for prefill-sized outputs, and its
        // page faults cost more than the copy.
        BLOCKED.with_borrow_mut(|scratch| {
            let total: usize = outs.iter().map(|o| o.len()).sum();
            if scratch.len() < total {
                scratch.resize(total, 0.0);
            }
            let mut dsts = Vec::with_capacity(outs.len());
            let mut rest = &mut scratch[..total];
            for o in outs.iter() {
                let (here, tail) = rest.split_at_mut(o.len());
                dsts.push(here);
                rest = tail;
            }
            self.run_tasks(jobs, n_tokens, dsts);
            let mut at = 0;
            for (job, out) in jobs.iter().zip(outs.iter_mut()) {
                let blocked = &scratch[at..at + out.len()];
                unblock_rows(blocked, n_tokens, job.rows, job.chunk, out);
                at += out.len();
            }
        });
    }

    /// Runs every job's row chunks into its `dsts` slice (each task's rows
    /// as a `[token][row]` block), across the team when worth it.
    fn run_tasks(&self, jobs: &[Job<'_>], n_tokens: usize, dsts: Vec<&mut [f32]>) {
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
        for (j, (job, dst)) in jobs.iter().zip(dsts).enumerate() {
            for (c, part) in dst.chunks_mut(job.chunk * n_tokens).enumerate() {
                tasks.push((j, c * job.chunk, part));
            }
        }
        let macs: usize = jobs.iter().map(|j| j.macs).sum();
        if self.threads() == 1 || macs < MIN_PARALLEL_MACS {
            for (j, first_row, dst) in tasks {
                (jobs[j].work)(first_row, dst);
            }
        } else {
            self.team.chunks_mut(&mut tasks, 1, |_, task| {
                let (j, first_row, dst) = &mut task[0];
                (jobs[*j].work)(*first_row, dst);
            });
        }
    }
}
