//! The forward pass on the host: activation buffers in host memory, every
//! op one or more calls of the [`Backend`]'s host ops, and the two places
//! keys and values live there (one sequence's contiguous cache, or the
//! paged pool of a batch: [`KvStore`]).

use bulkhead_kernels::{Activation, AttentionShape, QuantMatrix};

use super::zeroed::ZeroedFloats;
use crate::backend::{
    Act, Backend, DeviceError, ForwardPass, Heads, MoeFfn, OpResult, PassShape, RopeAngles,
    RopeAnglesKey, RopeParams, Segment, matmul_spans,
};

/// The host's pass: buffers in host memory, every op one or more calls of
/// the [`Backend`]'s host ops.
///
/// Matmuls take every row at once (the weights are read once per call,
/// whatever the number of sequences). Everything else is per row or per
/// segment, so a sequence's rows are computed bit for bit the same
/// whatever else shares the call: the AVX2 element-wise kernels finish a
/// slice's tail with scalar code, so running them over a whole batch
/// would shift which elements take that path.
pub(super) struct HostPass<'a> {
    backend: &'a dyn Backend,
    shape: PassShape,
    tokens: &'a [u32],
    segments: &'a [Segment],
    /// Position of every row.
    positions: Vec<usize>,
    kv: &'a mut dyn KvStore,
    wanted: &'a [usize],
    bufs: [Vec<f32>; 9],
    /// Every row's RoPE angles, per set of frequencies the pass has used
    /// (one for most models; Gemma 3's local and global layers differ):
    /// worked out at the first layer, reused by the others.
    angles: Vec<(RopeAnglesKey, Vec<RopeAngles>)>,
}

impl<'a> HostPass<'a> {
    pub(super) fn new(
        backend: &'a dyn Backend,
        shape: PassShape,
        tokens: &'a [u32],
        segments: &'a [Segment],
        kv: &'a mut dyn KvStore,
        wanted: &'a [usize],
    ) -> HostPass<'a> {
        let positions: Vec<usize> = segments
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.rows)
            .collect();
        debug_assert_eq!(positions.len(), tokens.len());
        let n = tokens.len();
        HostPass {
            backend,
            shape,
            tokens,
            segments,
            positions,
            kv,
            wanted,
            bufs: Act::ALL.map(|a| vec![0.0f32; n * a.width(&shape)]),
            angles: Vec::new(),
        }
    }

    /// Runs `f` with `out` taken out of the pass (so `f` may read the
    /// other buffers).
    fn with_out<R>(&mut self, out: Act, f: impl FnOnce(&Self, &mut [f32]) -> R) -> R {
        let mut buf = std::mem::take(&mut self.bufs[out.index()]);
        let r = f(self, &mut buf);
        self.bufs[out.index()] = buf;
        r
    }

    /// `op(a, b)` on each segment's rows.
    fn per_segment(
        &mut self,
        a: Act,
        b: Act,
        op: impl Fn(&dyn Backend, &mut [f32], &[f32]) -> OpResult,
    ) -> OpResult {
        let width = a.width(&self.shape);
        self.with_out(a, |p, a| {
            let b = &p.bufs[b.index()];
            let mut at = 0;
            for s in p.segments {
                let span = at..at + s.rows * width;
                op(p.backend, &mut a[span.clone()], &b[span])?;
                at += s.rows * width;
            }
            Ok(())
        })
    }
}

impl ForwardPass for HostPass<'_> {
    fn embed(&mut self, table: &QuantMatrix<'_>, out: Act) -> OpResult {
        let d = out.width(&self.shape);
        self.with_out(out, |p, out| {
            for (row, &t) in out.chunks_exact_mut(d).zip(p.tokens) {
                p.backend.embedding(table, t, row)?;
            }
            Ok(())
        })
    }

    fn scale(&mut self, x: Act, c: f32) -> OpResult {
        self.with_out(x, |p, x| p.backend.scale(x, c))
    }

    fn rms_norm(&mut self, x: Act, weight: &[f32], eps: f32, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            p.backend.rms_norm(&p.bufs[x.index()], weight, eps, out)
        })
    }

    /// Each head is a row of its own to the norm, so a sequence's heads
    /// come out the same whatever else shares the pass.
    fn head_norm(&mut self, x: Act, weight: &[f32], eps: f32) -> OpResult {
        self.with_out(x, |p, x| {
            let input = x.to_vec();
            p.backend.rms_norm(&input, weight, eps, x)
        })
    }

    fn matmul(&mut self, w: &QuantMatrix<'_>, x: Act, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            matmul_by_segment(p.backend, p.segments, w, &p.bufs[x.index()], out)
        })
    }

    fn matmuls(&mut self, x: Act, ws: &[(&QuantMatrix<'_>, Act)]) -> OpResult {
        let mut bufs: Vec<Vec<f32>> = ws
            .iter()
            .map(|&(_, out)| std::mem::take(&mut self.bufs[out.index()]))
            .collect();
        let x = &self.bufs[x.index()];
        let r = matmuls_by_segment(self.backend, self.segments, ws, x, &mut bufs);
        for (&(_, out), buf) in ws.iter().zip(bufs) {
            self.bufs[out.index()] = buf;
        }
        r
    }

    fn moe_ffn(&mut self, moe: &MoeFfn<'_>, x: Act, out: Act) -> OpResult {
        self.with_out(out, |p, out| {
            super::moe::moe_ffn(p.backend, p.segments, moe, &p.bufs[x.index()], out)
        })
    }

    fn add_bias(&mut self, x: Act, bias: &[f32]) -> OpResult {
        self.with_out(x, |p, x| {
            for row in x.chunks_exact_mut(bias.len()) {
                p.backend.add(row, bias)?;
            }
            Ok(())
        })
    }

    fn rope(&mut self, x: Act, heads: usize, params: &RopeParams<'_>) -> OpResult {
        let width = x.width(&self.shape);
        let key = params.angles_key();
        let table = match self.angles.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let angles = self
                    .positions
                    .iter()
                    .map(|&pos| params.angles(pos))
                    .collect();
                self.angles.push((key, angles));
                self.angles.len() - 1
            }
        };
        let mut buf = std::mem::take(&mut self.bufs[x.index()]);
        let (_, angles) = &self.angles[table];
        let mut r = Ok(());
        for ((row, &pos), a) in buf.chunks_exact_mut(width).zip(&self.positions).zip(angles) {
            r = self.backend.rope_with(row, heads, pos, params, a);
            if r.is_err() {
                break;
            }
        }
        self.bufs[x.index()] = buf;
        r
    }

    fn store_kv(&mut self, layer: usize, k: Act, v: Act) -> OpResult {
        self.kv
            .store(layer, &self.bufs[k.index()], &self.bufs[v.index()]);
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: Act, heads: Heads, out: Act) -> OpResult {
        let mut buf = std::mem::take(&mut self.bufs[out.index()]);
        let r = self
            .kv
            .attend(self.backend, layer, &self.bufs[q.index()], heads, &mut buf);
        self.bufs[out.index()] = buf;
        r
    }

    fn add(&mut self, a: Act, b: Act) -> OpResult {
        self.per_segment(a, b, |backend, a, b| backend.add(a, b))
    }

    fn gated(&mut self, act: Activation, gate: Act, up: Act) -> OpResult {
        self.per_segment(gate, up, |backend, a, b| backend.gated(act, a, b))
    }

    /// Only the rows whose logits are wanted go through the output projection.
    fn logits(
        &mut self,
        x: Act,
        norm: &[f32],
        eps: f32,
        output: &QuantMatrix<'_>,
    ) -> Result<Vec<f32>, DeviceError> {
        let d = x.width(&self.shape);
        let x = &self.bufs[x.index()];
        let rows = self.wanted.len();
        let mut normed = vec![0.0f32; rows * d];
        for (out, &r) in normed.chunks_exact_mut(d).zip(self.wanted) {
            self.backend
                .rms_norm(&x[r * d..(r + 1) * d], norm, eps, out)?;
        }
        let mut out = vec![0.0f32; rows * self.shape.vocab];
        if self.segments.len() == 1 {
            self.backend.matmul(output, &normed, rows, &mut out)?;
        } else {
            // Alone, each of these rows is a one-row projection.
            self.backend
                .matmul_per_row(output, &normed, rows, &mut out)?;
        }
        Ok(out)
    }
}

/// `out = w · x` over the rows of `segments`, span by span
/// ([`matmul_spans`]).
fn matmul_by_segment(
    backend: &dyn Backend,
    segments: &[Segment],
    w: &QuantMatrix<'_>,
    x: &[f32],
    out: &mut [f32],
) -> OpResult {
    let (cols, rows) = (w.cols, w.rows);
    for span in matmul_spans(segments) {
        let (at, n) = (span.at, span.rows);
        let (x, out) = (
            &x[at * cols..(at + n) * cols],
            &mut out[at * rows..(at + n) * rows],
        );
        if span.per_row {
            backend.matmul_per_row(w, x, n, out)?;
        } else {
            backend.matmul(w, x, n, out)?;
        }
    }
    Ok(())
}

/// [`matmul_by_segment`] for several matrices over one input, each span
/// one [`Backend::matmuls`] call.
fn matmuls_by_segment(
    backend: &dyn Backend,
    segments: &[Segment],
    ws: &[(&QuantMatrix<'_>, Act)],
    x: &[f32],
    outs: &mut [Vec<f32>],
) -> OpResult {
    let Some(&(first, _)) = ws.first() else {
        return Ok(());
    };
    let cols = first.cols;
    for span in matmul_spans(segments) {
        let (at, n) = (span.at, span.rows);
        let mut pairs: Vec<(QuantMatrix<'_>, &mut [f32])> = ws
            .iter()
            .zip(outs.iter_mut())
            .map(|(&(w, _), out)| (*w, &mut out[at * w.rows..(at + n) * w.rows]))
            .collect();
        backend.matmuls(&x[at * cols..(at + n) * cols], n, &mut pairs, span.per_row)?;
    }
    Ok(())
}

/// Where a forward call keeps keys and values and how attention reads them.
pub(super) trait KvStore {
    /// Stores the keys and values of every row of the call for `layer`.
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]);
    /// Attention of every row of the call over what its sequence holds.
    fn attend(
        &self,
        backend: &dyn Backend,
        layer: usize,
        q: &[f32],
        heads: Heads,
        out: &mut [f32],
    ) -> OpResult;
}

/// One sequence's contiguous cache in host memory, the call's rows
/// written from `start`.
pub(super) struct ContiguousStore<'c> {
    pub(super) k: &'c mut [ZeroedFloats],
    pub(super) v: &'c mut [ZeroedFloats],
    pub(super) kv_dim: usize,
    pub(super) start: usize,
}

impl KvStore for ContiguousStore<'_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kv = self.kv_dim;
        let at = self.start * kv..self.start * kv + k.len();
        self.k[layer][at.clone()].copy_from_slice(k);
        self.v[layer][at].copy_from_slice(v);
    }

    fn attend(
        &self,
        backend: &dyn Backend,
        layer: usize,
        q: &[f32],
        h: Heads,
        out: &mut [f32],
    ) -> OpResult {
        let n = q.len() / (h.n_heads * h.head_dim);
        let shape = AttentionShape {
            n_tokens: n,
            start_pos: self.start,
            n_heads: h.n_heads,
            n_kv_heads: h.n_kv_heads,
            head_dim: h.head_dim,
            scale: h.scale,
            mask: h.mask,
        };
        let seen = (self.start + n) * self.kv_dim;
        backend.attention(
            q,
            &self.k[layer][..seen],
            &self.v[layer][..seen],
            shape,
            out,
        )
    }
}
