//! The CPU backend: a thread pool plus the chosen ISA, running matmul and
//! attention in parallel on top of the row-level kernels.
#![forbid(unsafe_code)]

use rayon::prelude::*;

use crate::avx2::{Avx2, Vnni};
use crate::quantize::{BlockQ8_0U, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};
use crate::{GgmlType, Isa, KernelError, scalar};

mod attention;
pub use attention::{AttentionShape, PagedSeq, PagedShape, ScoreMask};

/// A weight matrix as stored in GGUF: `rows` rows of `cols` elements each
/// (GGUF `ne[0] = cols`), every row a contiguous run of blocks.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> QuantMatrix<'a> {
    /// Wraps `data`, checking that `cols` is a whole number of blocks and
    /// that `data` holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let m = QuantMatrix {
            ty,
            data,
            rows,
            cols,
        };
        m.check()?;
        Ok(m)
    }

    /// Bytes per row (assumes a shape that passed [`QuantMatrix::new`]).
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elements() * self.ty.block_bytes()
    }

    /// The raw bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    fn check(&self) -> Result<(), KernelError> {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        let row_bytes = ty
            .bytes_for(cols as u64)
            .map_err(|source| KernelError::RowLength { cols, source })?;
        let expected = row_bytes
            .checked_mul(rows as u64)
            .ok_or(KernelError::TooLarge { ty, rows, cols })?;
        if self.data.len() as u64 != expected {
            return Err(KernelError::DataLength {
                ty,
                rows,
                cols,
                expected,
                actual: self.data.len(),
            });
        }
        Ok(())
    }
}

/// Whether matmul may hand several tokens to one kernel call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenGrouping {
    /// One single-row dot per (row, token): decode, and the old prefill path.
    One,
    /// Several tokens per weight row where a multi-token kernel exists:
    /// [`Avx2::MAX_TOKENS`], or [`Vnni::MAX_TOKENS`] for its kernels.
    Several,
    /// As `Several`, but only for the types whose multi-token kernels keep
    /// the one-row accumulation order (Q4_0, Q8_0, Q4_K): every result is
    /// bit-identical to a one-row call.
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

/// Q8_0 activations offset to unsigned for the VNNI kernels.
fn offset(q: &[crate::BlockQ8_0]) -> Vec<BlockQ8_0U> {
    q.iter().map(BlockQ8_0U::from).collect()
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Scalar,
    Avx2(Avx2),
}

/// The CPU compute backend: an ISA and a thread pool of a chosen size.
#[derive(Debug)]
pub struct CpuKernels {
    backend: Backend,
    /// Present with [`Isa::Avx512Vnni`]: the multi-token Q8_0/Q4_0 kernels
    /// take up to eight tokens per weight block instead of four.
    vnni: Option<Vnni>,
    pool: rayon::ThreadPool,
}

/// Rows handed to one pool task: enough to amortise scheduling, few enough
/// that every thread gets several tasks (work stealing evens out stragglers).
/// Even, so row pairs (see [`CpuKernels::rows_dot_grouped`]) never straddle
/// two tasks and the pairing does not depend on the thread count.
fn rows_per_task(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads * 4).clamp(8, 64).next_multiple_of(2)
}

/// Multiply-adds below which a call runs on the calling thread, not the pool.
///
/// Handing work to the pool costs ~15 µs here (the caller sleeps on a latch,
/// the workers are woken from sleep, then the caller again). Measured on the
/// 2-core dev box (AVX2, decode, median of 9): 384×384 Q8_0 7 µs on one thread
/// vs 22 µs on two, 768×768 23 vs 26 µs, 1024×1024 39 vs 35 µs, 768×3072
/// 83 vs 63 µs. In a whole model the workers are often still awake between
/// consecutive matmuls, so the hand-off is cheaper than in isolation: end to
/// end (tests/bench/engine_vs_llamacpp, 2 threads) 2^20 left a dim-768
/// model's 768×768 projections serial and lost ~20% decode speed, 2^18 sent a
/// dim-384 model's 384×1024 matmuls to the pool and lost ~35%; 2^19 keeps
/// both. Results do not change either way: every row is computed the same way.
const MIN_PARALLEL_MACS: usize = 1 << 19;

/// Activations below which quantization runs on the calling thread: a
/// batched decode step of 16 sequences quantizes 16 × 768 or 16 × 3072
/// floats per matmul, a few µs of work against the ~15 µs of a hand-off
/// to the pool (see [`MIN_PARALLEL_MACS`]) on top of the matmul's own.
const MIN_PARALLEL_QUANTIZE: usize = 1 << 16;

/// `out[t * rows + r] = by_row[r * n_tokens + t]`, a tile of rows at a time.
///
/// The plain loop (rows outer, tokens inner) stores down a column of `out`,
/// `rows` floats apart: for 768- and 3072-row matrices every store of a row
/// lands in the same few L1 sets, and it was ~7% of a 16-sequence decode
/// step (perf, VNNI kernels). A tile's rows stay in L1 while each token's
/// run of `out` is written in order.
fn transpose_rows(by_row: &[f32], n_tokens: usize, rows: usize, out: &mut [f32]) {
    const TILE_ROWS: usize = 64;
    for r0 in (0..rows).step_by(TILE_ROWS) {
        let r1 = (r0 + TILE_ROWS).min(rows);
        let tile = &by_row[r0 * n_tokens..r1 * n_tokens];
        for (t, dst) in out.chunks_exact_mut(rows).enumerate() {
            for (d, vals) in dst[r0..r1].iter_mut().zip(tile.chunks_exact(n_tokens)) {
                *d = vals[t];
            }
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

impl CpuKernels {
    /// A backend running on `threads` threads with `isa` kernels; fails if
    /// `threads` is 0 or the CPU lacks the ISA.
    pub fn new(threads: usize, isa: Isa) -> Result<Self, KernelError> {
        if threads == 0 {
            return Err(KernelError::ZeroThreads);
        }
        let unavailable = || KernelError::IsaUnavailable { isa };
        let (backend, vnni) = match isa {
            Isa::Scalar => (Backend::Scalar, None),
            Isa::Avx2 => (Backend::Avx2(Avx2::detect().ok_or_else(unavailable)?), None),
            Isa::Avx512Vnni => {
                let vnni = Vnni::detect().ok_or_else(unavailable)?;
                let avx2 = Avx2::detect().ok_or_else(unavailable)?;
                (Backend::Avx2(avx2), Some(vnni))
            }
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("bulkhead-kernels-{i}"))
            .build()
            .map_err(|e| KernelError::ThreadPool(e.to_string()))?;
        Ok(CpuKernels {
            backend,
            vnni,
            pool,
        })
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        match (self.backend, self.vnni) {
            (Backend::Scalar, _) => Isa::Scalar,
            (Backend::Avx2(_), None) => Isa::Avx2,
            (Backend::Avx2(_), Some(_)) => Isa::Avx512Vnni,
        }
    }

    /// `out[t * w.rows + r] = dot(row r of w, x[t * w.cols .. (t + 1) * w.cols])`
    /// for `t` in `0..n_tokens`.
    ///
    /// Quantized weights take activations quantized the way ggml pairs them
    /// (Q8_0, Q8_1 or Q8_K), once per call. With AVX2 and more than one
    /// token, F16, Q4_0, Q8_0, Q4_K and Q6_K weights go through multi-token
    /// kernels that unpack each weight block once for up to four tokens
    /// (eight for Q8_0 and Q4_0 with [`Isa::Avx512Vnni`], same results).
    /// Results do not depend on the thread count.
    ///
    /// # Panics
    /// If `w` is malformed or `x`/`out` have the wrong length (caller bugs).
    pub fn matmul(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.matmul_by(w, x, n_tokens, out, TokenGrouping::Several);
    }

    /// [`CpuKernels::matmul`] with every (row, token) pair computed by its own
    /// single-row dot: the path before the multi-token kernels, kept for
    /// benchmarks and as a test oracle.
    ///
    /// # Panics
    /// As [`CpuKernels::matmul`].
    pub fn matmul_per_token(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        self.matmul_by(w, x, n_tokens, out, TokenGrouping::One);
    }

    /// [`CpuKernels::matmul`] with every row of the result bit-identical to
    /// what a one-token call computes for that token: batched decode, where
    /// a sequence must get the same logits whatever else is in the batch.
    /// Multi-token kernels only where they sum in the one-row order (Q4_0,
    /// Q8_0, Q4_K); single-row dots otherwise (F16, Q6_K, …).
    ///
    /// # Panics
    /// As [`CpuKernels::matmul`].
    pub fn matmul_row_exact(&self, w: &QuantMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let grouping = match w.ty {
            GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4K => TokenGrouping::Exact,
            _ => TokenGrouping::One,
        };
        self.matmul_by(w, x, n_tokens, out, grouping);
    }

    fn matmul_by(
        &self,
        w: &QuantMatrix,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        grouping: TokenGrouping,
    ) {
        if let Err(e) = w.check() {
            panic!("matmul: {e}");
        }
        assert_eq!(
            x.len(),
            n_tokens * w.cols,
            "matmul: x is not n_tokens × cols"
        );
        assert_eq!(
            out.len(),
            n_tokens * w.rows,
            "matmul: out is not n_tokens × rows"
        );
        if out.is_empty() {
            return;
        }
        let b = self.backend;
        // Decode (one token) stays on the single-row kernels: nothing to share.
        let grouped = match (b, grouping) {
            (Backend::Avx2(k), TokenGrouping::Several | TokenGrouping::Exact) if n_tokens > 1 => {
                Some(k)
            }
            _ => None,
        };
        match w.ty {
            GgmlType::F32 => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_f32), out),
            GgmlType::F16 => match grouped {
                Some(k) => self.rows_dot_grouped(
                    w,
                    x,
                    n_tokens,
                    Tile::avx2(RowsPerCall::Two),
                    |w, x, o| k.dot_f16_rows_tokens(w, x, o),
                    out,
                ),
                None => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_f16), out),
            },
            GgmlType::BF16 => self.rows_dot(w, x, n_tokens, row_kernel!(b, dot_bf16), out),
            GgmlType::Q4_0 => {
                let q = self.quantize_q8_0(x, n_tokens, w.cols);
                match (grouped, self.vnni) {
                    (Some(_), Some(v)) => self.rows_dot_grouped(
                        w,
                        &offset(&q),
                        n_tokens,
                        Tile::vnni(),
                        |w, x, o| v.dot_q4_0_tokens(w[0], x, o),
                        out,
                    ),
                    (Some(k), None) => self.rows_dot_grouped(
                        w,
                        &q,
                        n_tokens,
                        Tile::avx2(RowsPerCall::One),
                        |w, x, o| k.dot_q4_0_tokens(w[0], x, o),
                        out,
                    ),
                    (None, _) => self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q4_0), out),
                }
            }
            GgmlType::Q5_0 => {
                let q = self.quantize_q8_0(x, n_tokens, w.cols);
                self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q5_0), out);
            }
            GgmlType::Q8_0 => {
                let q = self.quantize_q8_0(x, n_tokens, w.cols);
                match (grouped, self.vnni) {
                    (Some(_), Some(v)) => self.rows_dot_grouped(
                        w,
                        &offset(&q),
                        n_tokens,
                        Tile::vnni(),
                        |w, x, o| v.dot_q8_0_tokens(w[0], x, o),
                        out,
                    ),
                    (Some(k), None) => self.rows_dot_grouped(
                        w,
                        &q,
                        n_tokens,
                        Tile::avx2(RowsPerCall::One),
                        |w, x, o| k.dot_q8_0_tokens(w[0], x, o),
                        out,
                    ),
                    (None, _) => self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q8_0), out),
                }
            }
            GgmlType::Q4_1 => {
                let q = self.quantize(x, n_tokens, w.cols, 32, quantize_row_q8_1);
                self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q4_1), out);
            }
            GgmlType::Q5_1 => {
                let q = self.quantize(x, n_tokens, w.cols, 32, quantize_row_q8_1);
                self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q5_1), out);
            }
            GgmlType::Q4K => {
                let q = self.quantize(x, n_tokens, w.cols, 256, quantize_row_q8_k);
                match grouped {
                    Some(k) => self.rows_dot_grouped(
                        w,
                        &q,
                        n_tokens,
                        Tile::avx2(RowsPerCall::One),
                        |w, x, o| k.dot_q4k_tokens(w[0], x, o),
                        out,
                    ),
                    None => self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q4k), out),
                }
            }
            GgmlType::Q5K => {
                let q = self.quantize(x, n_tokens, w.cols, 256, quantize_row_q8_k);
                self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q5k), out);
            }
            GgmlType::Q6K => {
                let q = self.quantize(x, n_tokens, w.cols, 256, quantize_row_q8_k);
                match grouped {
                    Some(k) => self.rows_dot_grouped(
                        w,
                        &q,
                        n_tokens,
                        Tile::avx2(RowsPerCall::One),
                        |w, x, o| k.dot_q6k_tokens(w[0], x, o),
                        out,
                    ),
                    None => self.rows_dot(w, &q, n_tokens, row_kernel!(b, dot_q6k), out),
                }
            }
        }
    }

    /// Q8_0 activations for Q4_0, Q5_0 and Q8_0 weights: the AVX2
    /// quantizer where the backend has it (the same blocks, faster).
    fn quantize_q8_0(&self, x: &[f32], n_tokens: usize, cols: usize) -> Vec<crate::BlockQ8_0> {
        match self.backend {
            Backend::Scalar => self.quantize(x, n_tokens, cols, 32, quantize_row_q8_0),
            Backend::Avx2(k) => self.quantize(x, n_tokens, cols, 32, |x: &[f32], q: &mut [_]| {
                k.quantize_row_q8_0(x, q)
            }),
        }
    }

    /// Quantizes each token's row of `x` into `cols / block` activation blocks.
    fn quantize<B: Clone + Default + Send>(
        &self,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        block: usize,
        quantize_row: impl Fn(&[f32], &mut [B]) + Sync,
    ) -> Vec<B> {
        let per_token = cols / block;
        let mut q = vec![B::default(); n_tokens * per_token];
        if n_tokens == 1 || self.threads() == 1 || x.len() < MIN_PARALLEL_QUANTIZE {
            for (q, x) in q.chunks_exact_mut(per_token).zip(x.chunks_exact(cols)) {
                quantize_row(x, q);
            }
        } else {
            self.pool.install(|| {
                q.par_chunks_exact_mut(per_token)
                    .zip(x.par_chunks_exact(cols))
                    .for_each(|(q, x)| quantize_row(x, q));
            });
        }
        q
    }

    /// Runs `dot(row, token activations)` for every row and token: row chunks
    /// in parallel, and within a chunk tokens outer, rows inner, so a chunk of
    /// weights stays in cache while each token's activations stream past it.
    fn rows_dot<B, D>(&self, w: &QuantMatrix, acts: &[B], n_tokens: usize, dot: D, out: &mut [f32])
    where
        B: Sync,
        D: Fn(&[u8], &[B]) -> f32 + Sync,
    {
        let per_token = acts.len() / n_tokens;
        let row_bytes = w.row_bytes();
        self.row_chunks(w, n_tokens, out, |first_row, dst| {
            let rows_here = dst.len() / n_tokens;
            let weights = &w.data[first_row * row_bytes..(first_row + rows_here) * row_bytes];
            for (t, xt) in acts.chunks_exact(per_token).enumerate() {
                for (i, row) in weights.chunks_exact(row_bytes).enumerate() {
                    dst[i * n_tokens + t] = dot(row, xt);
                }
            }
        });
    }

    /// As [`Self::rows_dot`], but `dot(rows, tokens, out)` takes up to
    /// `tile.tokens` tokens and up to `tile.rows` rows at once, writing
    /// `out[r * tokens.len() + t]`. Within a chunk, token groups outer, rows
    /// inner. Groups are fixed by token index (0..4, 4..8, … or 0..8, …) and
    /// row pairs by row index (chunks start on even rows), never by the
    /// thread split, so results do not depend on the thread count.
    fn rows_dot_grouped<B, D>(
        &self,
        w: &QuantMatrix,
        acts: &[B],
        n_tokens: usize,
        tile: Tile,
        dot: D,
        out: &mut [f32],
    ) where
        B: Sync,
        D: Fn(&[&[u8]], &[&[B]], &mut [f32]) + Sync,
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
        self.row_chunks(w, n_tokens, out, |first_row, dst| {
            let rows_here = dst.len() / n_tokens;
            let weights = &w.data[first_row * row_bytes..(first_row + rows_here) * row_bytes];
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
                    if nr == 1 {
                        // One row's results are contiguous in `dst`: no copy.
                        let first = p * rows_per_call * n_tokens + g * group;
                        dot(&ws[..1], xs, &mut dst[first..first + n]);
                        continue;
                    }
                    dot(&ws[..nr], xs, &mut res[..nr * n]);
                    for (r, vals) in res[..nr * n].chunks_exact(n).enumerate() {
                        let first = (p * rows_per_call + r) * n_tokens + g * group;
                        dst[first..first + n].copy_from_slice(vals);
                    }
                }
            }
        });
    }

    /// Splits the result into chunks of rows (as `[row][token]`), runs
    /// `work(first_row, chunk)` on each, in parallel when the pool has more
    /// than one thread, and writes `out` back as `[token][row]`.
    fn row_chunks<F>(&self, w: &QuantMatrix, n_tokens: usize, out: &mut [f32], work: F)
    where
        F: Fn(usize, &mut [f32]) + Sync,
    {
        let chunk = rows_per_task(w.rows, self.threads());
        let serial = self.threads() == 1 || w.rows * w.cols * n_tokens < MIN_PARALLEL_MACS;
        let run = |dst: &mut [f32]| {
            if serial {
                for (c, dst) in dst.chunks_mut(chunk * n_tokens).enumerate() {
                    work(c * chunk, dst);
                }
            } else {
                self.pool.install(|| {
                    dst.par_chunks_mut(chunk * n_tokens)
                        .enumerate()
                        .for_each(|(c, dst)| work(c * chunk, dst));
                });
            }
        };
        if n_tokens == 1 {
            run(out);
        } else {
            let mut by_row = vec![0.0f32; out.len()];
            run(&mut by_row);
            transpose_rows(&by_row, n_tokens, w.rows, out);
        }
    }
}
