//! Attention on the CPU: over one contiguous cache, and over a paged KV
//! pool for several sequences at once, each (row, head) computed the same
//! way by both.

use std::cell::RefCell;

use super::{Backend, CpuKernels, MIN_PARALLEL_MACS};
use crate::avx2::Avx2;
use crate::scalar;

/// The shape of one attention call; see [`CpuKernels::attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Query tokens in this call.
    pub n_tokens: usize,
    /// Cache position of the first query token.
    pub start_pos: usize,
    pub n_heads: usize,
    /// Key/value heads; `n_heads` must be a multiple (GQA).
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Score scale, normally `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Which positions each query sees and how its scores are bounded.
    pub mask: ScoreMask,
}

/// What attention does to a query's scores besides the causal mask: a
/// sliding window (Gemma, Mistral) and a soft cap (Gemma 2).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreMask {
    /// A query at position `p` sees only positions `p + 1 - window ..= p`
    /// (Hugging Face's and llama.cpp's sliding window); `None`: all of
    /// `0..=p`.
    pub window: Option<usize>,
    /// Each scaled score `s` becomes `cap · tanh(s / cap)` before the
    /// softmax.
    pub softcap: Option<f32>,
}

impl ScoreMask {
    /// The first position a query at `pos` sees.
    pub fn first_position(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }
}

impl CpuKernels {
    /// Causal multi-head attention over an f32 KV cache.
    ///
    /// `q` and `out` are `n_tokens × (n_heads · head_dim)`; `k_cache` and
    /// `v_cache` hold at least `start_pos + n_tokens` rows of
    /// `n_kv_heads · head_dim`. Query token `i` attends to cache positions
    /// `0..=start_pos + i`; head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    /// Parallel over (token, head).
    ///
    /// # Panics
    /// If the shape is inconsistent or a buffer is too short (caller bugs).
    pub fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: AttentionShape,
        out: &mut [f32],
    ) {
        let AttentionShape {
            n_tokens,
            start_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            mask,
        } = shape;
        assert!(head_dim > 0, "attention: head_dim is 0");
        assert!(mask.window != Some(0), "attention: a window of 0 positions");
        assert!(
            n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            "attention: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"
        );
        let q_width = n_heads * head_dim;
        let kv_width = n_kv_heads * head_dim;
        let n_ctx = start_pos + n_tokens;
        assert_eq!(
            q.len(),
            n_tokens * q_width,
            "attention: q is not n_tokens × n_heads·head_dim"
        );
        assert_eq!(out.len(), q.len(), "attention: out and q lengths differ");
        assert!(
            k_cache.len() >= n_ctx * kv_width && v_cache.len() >= n_ctx * kv_width,
            "attention: KV cache shorter than {n_ctx} positions"
        );
        let group = n_heads / n_kv_heads;
        let backend = self.backend;
        let heads = heads_per_task(n_tokens, n_heads, self.threads());
        let task = |idx: usize, o: &mut [f32], scratch: &mut Scratch| {
            let first = idx * heads;
            let (t, h) = (first / n_heads, first % n_heads);
            let view = HeadsView {
                q: &q[first * head_dim..(first + heads) * head_dim],
                k: k_cache,
                v: v_cache,
                kv_width,
                head_dim,
                first_head: h,
                group,
                first_pos: mask.first_position(start_pos + t),
                n_pos: start_pos + t + 1,
                scale,
                softcap: mask.softcap,
                pages: None,
            };
            match backend {
                Backend::Scalar => attend_heads(ScalarOps, view, scratch, o),
                Backend::Avx2(k) => attend_heads(k, view, scratch, o),
            }
        };
        // q·k and the weighted sum of v: 2 · head_dim per (query head, position).
        let macs = n_tokens * n_heads * (2 * start_pos + n_tokens) * head_dim;
        if self.threads() == 1 || macs < MIN_PARALLEL_MACS {
            let mut scratch = Scratch::new();
            for (idx, o) in out.chunks_exact_mut(heads * head_dim).enumerate() {
                task(idx, o, &mut scratch);
            }
        } else {
            self.team.chunks_mut(out, heads * head_dim, |idx, o| {
                SCRATCH.with_borrow_mut(|scratch| task(idx, o, scratch));
            });
        }
    }
}

/// One sequence of a [`CpuKernels::attention_paged`] call.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeq<'a> {
    /// Its query rows in this call (they follow the previous sequence's).
    pub n_tokens: usize,
    /// Cache position of its first query row.
    pub start_pos: usize,
    /// Its block table: position `p` lives in block `blocks[p / block_tokens]`.
    pub blocks: &'a [u32],
}

/// The shape of a [`CpuKernels::attention_paged`] call.
#[derive(Clone, Copy, Debug)]
pub struct PagedShape {
    /// Positions per block.
    pub block_tokens: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub mask: ScoreMask,
}

impl CpuKernels {
    /// Causal attention for several sequences at once over a paged f32 KV
    /// pool: `k_pool`/`v_pool` are blocks of `block_tokens` rows of
    /// `n_kv_heads · head_dim`, and each sequence reads its positions
    /// through its own block table. `q` and `out` hold every sequence's rows
    /// in order. Each (row, head) is computed exactly as
    /// [`CpuKernels::attention`] computes it over a contiguous cache holding
    /// the same values. Parallel over all (row, head) pairs of all sequences.
    ///
    /// # Panics
    /// If the shape is inconsistent, a table is too short for its positions
    /// or names a block outside the pool (caller bugs).
    pub fn attention_paged(
        &self,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) {
        let PagedShape {
            block_tokens,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            mask,
        } = shape;
        assert!(
            head_dim > 0 && block_tokens > 0 && mask.window != Some(0),
            "attention_paged: zero size"
        );
        assert!(
            n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            "attention_paged: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"
        );
        let q_width = n_heads * head_dim;
        let kv_width = n_kv_heads * head_dim;
        let rows: usize = seqs.iter().map(|s| s.n_tokens).sum();
        assert_eq!(
            q.len(),
            rows * q_width,
            "attention_paged: q is not rows × width"
        );
        assert_eq!(
            out.len(),
            q.len(),
            "attention_paged: out and q lengths differ"
        );
        assert_eq!(
            k_pool.len(),
            v_pool.len(),
            "attention_paged: K and V pools differ"
        );
        let pool_blocks = k_pool.len() / (block_tokens * kv_width);
        // (sequence, position of the row) for every query row.
        let mut row_of = Vec::with_capacity(rows);
        let mut macs = 0;
        for (i, s) in seqs.iter().enumerate() {
            let n_ctx = s.start_pos + s.n_tokens;
            assert!(
                s.blocks.len() * block_tokens >= n_ctx,
                "attention_paged: block table shorter than {n_ctx} positions"
            );
            assert!(
                s.blocks.iter().all(|&b| (b as usize) < pool_blocks),
                "attention_paged: block outside the pool"
            );
            row_of.extend((0..s.n_tokens).map(|t| (i, s.start_pos + t)));
            macs += s.n_tokens * n_heads * (2 * s.start_pos + s.n_tokens) * head_dim;
        }
        let group = n_heads / n_kv_heads;
        let backend = self.backend;
        let heads = heads_per_task(rows, n_heads, self.threads());
        let task = |idx: usize, o: &mut [f32], scratch: &mut Scratch| {
            let first = idx * heads;
            let (r, h) = (first / n_heads, first % n_heads);
            let (s, pos) = row_of[r];
            let view = HeadsView {
                q: &q[first * head_dim..(first + heads) * head_dim],
                k: k_pool,
                v: v_pool,
                kv_width,
                head_dim,
                first_head: h,
                group,
                first_pos: mask.first_position(pos),
                n_pos: pos + 1,
                scale,
                softcap: mask.softcap,
                pages: Some((seqs[s].blocks, block_tokens)),
            };
            match backend {
                Backend::Scalar => attend_heads(ScalarOps, view, scratch, o),
                Backend::Avx2(k) => attend_heads(k, view, scratch, o),
            }
        };
        if self.threads() == 1 || macs < MIN_PARALLEL_MACS {
            let mut scratch = Scratch::new();
            for (idx, o) in out.chunks_exact_mut(heads * head_dim).enumerate() {
                task(idx, o, &mut scratch);
            }
        } else {
            self.team.chunks_mut(out, heads * head_dim, |idx, o| {
                SCRATCH.with_borrow_mut(|scratch| task(idx, o, scratch));
            });
        }
    }
}

thread_local! {
    /// Each thread's attention scratch, reused across tasks and calls.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
}

/// A task's scores (per head, per position) and where each position's
/// row starts in the cache.
struct Scratch {
    scores: Vec<f32>,
    rows: Vec<usize>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            scores: Vec::new(),
            rows: Vec::new(),
        }
    }
}

/// Query heads one attention task takes: all of a row's heads when there
/// are rows enough to keep every thread busy, so a task reads each cached
/// position's keys and values for all heads at once (one contiguous run of
/// `n_kv_heads · head_dim` floats, which the prefetcher follows) instead of
/// one head's slice of it per pass; a single head otherwise (a lone decode
/// row still spreads over the threads). Results are the same either way.
fn heads_per_task(rows: usize, n_heads: usize, threads: usize) -> usize {
    if rows >= threads { n_heads } else { 1 }
}

/// The vector ops attention is built from, per ISA. `rows[j]` is where
/// position `j`'s key (in `k`) or value (in `v`) starts.
trait VecOps: Copy {
    /// `out[j] = q · k[rows[j]..][..q.len()]`.
    fn scores(self, q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]);
    fn softmax(self, x: &mut [f32]);
    /// `o += Σ_j s[j] · v[rows[j]..][..o.len()]`, position by position.
    fn weighted_sum(self, s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]);
}

#[derive(Clone, Copy)]
struct ScalarOps;

impl VecOps for ScalarOps {
    fn scores(self, q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]) {
        for (s, &r) in out.iter_mut().zip(rows) {
            *s = scalar::dot(q, &k[r..r + q.len()]);
        }
    }
    fn softmax(self, x: &mut [f32]) {
        scalar::softmax(x)
    }
    fn weighted_sum(self, s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]) {
        for (&a, &r) in s.iter().zip(rows) {
            scalar::axpy(a, &v[r..r + o.len()], o);
        }
    }
}

/// The AVX2 kernels that take a head's positions at once, for head sizes
/// that are a multiple of 8 (all common models); one `dot` or `axpy` per
/// position otherwise.
impl VecOps for Avx2 {
    fn scores(self, q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]) {
        if q.len().is_multiple_of(8) {
            return self.attention_scores(q, k, rows, out);
        }
        for (s, &r) in out.iter_mut().zip(rows) {
            *s = self.dot(q, &k[r..r + q.len()]);
        }
    }
    fn softmax(self, x: &mut [f32]) {
        Avx2::softmax(self, x)
    }
    fn weighted_sum(self, s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]) {
        if o.len().is_multiple_of(8) {
            return self.attention_weighted_sum(s, v, rows, o);
        }
        for (&a, &r) in s.iter().zip(rows) {
            self.axpy(a, &v[r..r + o.len()], o);
        }
    }
}

/// Consecutive query heads of one row and their view of the cache.
struct HeadsView<'a> {
    /// The heads' queries, `head_dim` floats each.
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    kv_width: usize,
    head_dim: usize,
    /// Index of the first head in the row; head `h` reads KV head `h / group`.
    first_head: usize,
    group: usize,
    /// The positions the heads see: `first_pos..n_pos`.
    first_pos: usize,
    n_pos: usize,
    scale: f32,
    softcap: Option<f32>,
    /// `None`: position `p` is row `p` of `k`/`v`. `Some((table, block_tokens))`:
    /// it is row `p % block_tokens` of block `table[p / block_tokens]`.
    pages: Option<(&'a [u32], usize)>,
}

impl HeadsView<'_> {
    fn row(&self, p: usize) -> usize {
        match self.pages {
            None => p,
            Some((table, block_tokens)) => {
                table[p / block_tokens] as usize * block_tokens + p % block_tokens
            }
        }
    }
}

/// Positions attention takes per pass over a task's heads: their keys and
/// values for all the task's heads stay in cache between the heads.
const TILE: usize = 64;

/// For each head: `out = Σ_p softmax_p(cap(scale · q·k_p)) v_p` over
/// positions `first_pos..n_pos`. Tiles of positions outer, heads inner, so
/// a tile's cache rows are read from memory once for all the heads; per
/// head the scores, the softmax and the weighted sum are the same and in
/// the same order however heads are grouped and whether the cache is
/// contiguous or paged, so all give bit-identical results. The soft cap is
/// scalar code on every ISA.
fn attend_heads<O: VecOps>(ops: O, h: HeadsView, scratch: &mut Scratch, out: &mut [f32]) {
    let (d, first) = (h.head_dim, h.first_pos);
    let n = h.n_pos - first;
    let kv_offset = |i: usize| ((h.first_head + i) / h.group) * d;
    let Scratch { scores, rows } = scratch;
    rows.clear();
    rows.extend((first..h.n_pos).map(|p| h.row(p) * h.kv_width));
    scores.clear();
    scores.resize(out.len() / d * n, 0.0);
    for (t, tile) in rows.chunks(TILE).enumerate() {
        for (i, q) in h.q.chunks_exact(d).enumerate() {
            let s = &mut scores[i * n + t * TILE..][..tile.len()];
            ops.scores(q, &h.k[kv_offset(i)..], tile, s);
        }
    }
    for s in scores.iter_mut() {
        *s *= h.scale;
    }
    if let Some(cap) = h.softcap {
        for s in scores.iter_mut() {
            *s = scalar::softcap(*s, cap);
        }
    }
    for s in scores.chunks_exact_mut(n) {
        ops.softmax(s);
    }
    out.fill(0.0);
    for (t, tile) in rows.chunks(TILE).enumerate() {
        for (i, o) in out.chunks_exact_mut(d).enumerate() {
            let s = &scores[i * n + t * TILE..][..tile.len()];
            ops.weighted_sum(s, &h.v[kv_offset(i)..], tile, o);
        }
    }
}
