//! Row ops and attention: scalar and AVX2 against straightforward f64 formulas.

mod common;

use bulkhead_kernels::avx2::Avx2;
use bulkhead_kernels::{
    Activation, AttentionShape, CpuKernels, Isa, PagedSeq, PagedShape, RopeFreqs, RopeStyle,
    ScoreMask, Yarn, scalar,
};
use common::Rng;

/// Lengths that exercise full vectors, tails and the empty case.
const LENGTHS: [usize; 6] = [0, 1, 7, 8, 33, 4096];

fn close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(scale * 1e-3) + 1e-30;
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn avx2() -> Option<Avx2> {
    let k = Avx2::detect();
    if k.is_none() {
        bulkhead_testkit::skip(
            bulkhead_testkit::Need::Isa("avx2"),
            "the AVX2 half of this test: this CPU lacks avx2/fma/f16c",
        );
    }
    k
}

#[test]
fn rms_norm_matches_f64() {
    let mut rng = Rng::new(1);
    for n in LENGTHS {
        let x = rng.vec(n, 3.0);
        let w = rng.vec(n, 1.5);
        let eps = 1e-5f64;
        let mean = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n.max(1) as f64;
        let want: Vec<f64> = x
            .iter()
            .zip(&w)
            .map(|(&x, &w)| f64::from(x) / (mean + eps).sqrt() * f64::from(w))
            .collect();
        let mut out = vec![f32::NAN; n];
        scalar::rms_norm(&x, &w, eps as f32, &mut out);
        close(&out, &want, 1e-5, "scalar rms_norm");
        if let Some(k) = avx2() {
            k.rms_norm(&x, &w, eps as f32, &mut out);
            close(&out, &want, 1e-5, "avx2 rms_norm");
        }
        bulkhead_kernels::rms_norm(&x, &w, eps as f32, &mut out);
        close(&out, &want, 1e-5, "dispatched rms_norm");
    }
}

fn softmax_f64(x: &[f32]) -> Vec<f64> {
    let max = x
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn softmax_matches_f64() {
    let mut rng = Rng::new(2);
    for n in LENGTHS {
        // Wide range: scores far below the max underflow to ~0 in both.
        let x = rng.vec(n, 40.0);
        let want = softmax_f64(&x);
        let mut got = x.clone();
        scalar::softmax(&mut got);
        close(&got, &want, 1e-5, "scalar softmax");
        if let Some(k) = avx2() {
            let mut got = x.clone();
            k.softmax(&mut got);
            close(&got, &want, 1e-5, "avx2 softmax");
        }
        let mut got = x.clone();
        bulkhead_kernels::softmax(&mut got);
        close(&got, &want, 1e-5, "dispatched softmax");
    }
}

#[test]
fn silu_mul_and_add_match_f64() {
    let mut rng = Rng::new(3);
    for n in LENGTHS {
        let mut gate = rng.vec(n, 12.0);
        if n > 2 {
            gate[0] = -100.0;
            gate[1] = 100.0;
        }
        let up = rng.vec(n, 2.0);
        let want: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| {
                let g = f64::from(g);
                g / (1.0 + (-g).exp()) * f64::from(u)
            })
            .collect();
        let mut got = gate.clone();
        scalar::silu_mul(&mut got, &up);
        close(&got, &want, 1e-5, "scalar silu_mul");
        if let Some(k) = avx2() {
            let mut got = gate.clone();
            k.silu_mul(&mut got, &up);
            close(&got, &want, 1e-5, "avx2 silu_mul");
        }
        let mut got = gate.clone();
        bulkhead_kernels::silu_mul(&mut got, &up);
        close(&got, &want, 1e-5, "dispatched silu_mul");

        let want: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(&a, &b)| f64::from(a + b))
            .collect();
        let mut got = gate.clone();
        scalar::add(&mut got, &up);
        close(&got, &want, 0.0, "scalar add");
        if let Some(k) = avx2() {
            let mut got = gate.clone();
            k.add(&mut got, &up);
            close(&got, &want, 0.0, "avx2 add");
        }
    }
}

/// GELU (tanh form) times `up`, as PyTorch's `gelu(approximate="tanh")`
/// defines it, in f64.
fn gelu_tanh_mul_f64(gate: &[f32], up: &[f32]) -> Vec<f64> {
    let beta = (2.0 / std::f64::consts::PI).sqrt();
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            0.5 * g * (1.0 + (beta * (g + 0.044715 * g * g * g)).tanh()) * f64::from(u)
        })
        .collect()
}

#[test]
fn gelu_tanh_mul_matches_f64_on_every_isa() {
    let mut rng = Rng::new(31);
    for n in LENGTHS {
        let mut gate = rng.vec(n, 6.0);
        if n > 3 {
            (gate[0], gate[1], gate[2]) = (-100.0, 100.0, 0.0);
        }
        let up = rng.vec(n, 2.0);
        let want = gelu_tanh_mul_f64(&gate, &up);
        // f32's 1 + tanh(z) cancels for very negative inputs (as PyTorch's
        // does): an absolute error of a few 1e-8 of |up| is the floor.
        let check = |got: &[f32], what: &str| {
            for (i, ((&g, &w), &u)) in got.iter().zip(&want).zip(&up).enumerate() {
                let tol = 1e-5 * w.abs() + 1e-7 * f64::from(u.abs());
                assert!(
                    (f64::from(g) - w).abs() <= tol,
                    "{what}[{i}]: got {g}, want {w} (gate {})",
                    gate[i]
                );
            }
        };
        let mut got = gate.clone();
        scalar::gelu_tanh_mul(&mut got, &up);
        check(&got, "scalar gelu_tanh_mul");
        if let Some(k) = avx2() {
            let mut got = gate.clone();
            k.gelu_tanh_mul(&mut got, &up);
            check(&got, "avx2 gelu_tanh_mul");
        }
        let mut got = gate.clone();
        bulkhead_kernels::gated(Activation::GeluTanh, &mut got, &up);
        check(&got, "dispatched gelu");
        // The SiLU choice is silu_mul itself.
        let (mut a, mut b) = (gate.clone(), gate.clone());
        bulkhead_kernels::gated(Activation::Silu, &mut a, &up);
        bulkhead_kernels::silu_mul(&mut b, &up);
        assert_eq!(a, b);
    }
}

/// Plain frequencies through `rope_ext` are exactly `rope`; per-pair factors
/// divide each angle.
#[test]
fn rope_ext_plain_is_rope_and_factors_divide_the_angle() {
    let mut rng = Rng::new(32);
    let (n_heads, head_dim, rot_dim) = (3, 32, 32);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for pos in [0, 5, 511] {
            let x = rng.vec(n_heads * head_dim, 1.0);
            let mut want = x.clone();
            bulkhead_kernels::rope(
                &mut want, n_heads, head_dim, rot_dim, pos, 500000.0, 0.5, style,
            );
            let plain = RopeFreqs {
                rot_dim,
                freq_base: 500000.0,
                freq_scale: 0.5,
                factors: None,
                yarn: None,
            };
            let mut got = x.clone();
            bulkhead_kernels::rope_ext(&mut got, n_heads, head_dim, pos, &plain, style);
            assert_eq!(got, want, "{style:?} pos {pos}: plain rope_ext is not rope");

            let factors: Vec<f32> = (0..rot_dim / 2).map(|i| 1.0 + i as f32).collect();
            let with = RopeFreqs {
                factors: Some(&factors),
                freq_scale: 1.0,
                ..plain
            };
            let mut got = x.clone();
            bulkhead_kernels::rope_ext(&mut got, n_heads, head_dim, pos, &with, style);
            let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for head in want.chunks_exact_mut(head_dim) {
                for (i, f) in factors.iter().enumerate() {
                    let theta = pos as f64 * 500000f64.powf(-2.0 * i as f64 / rot_dim as f64)
                        / f64::from(*f);
                    let (a, b) = match style {
                        RopeStyle::Normal => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + rot_dim / 2),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * theta.cos() - x1 * theta.sin();
                    head[b] = x0 * theta.sin() + x1 * theta.cos();
                }
            }
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-6,
                    "{style:?} pos {pos} factors[{i}]: got {g}, want {w}"
                );
            }
        }
    }
}

/// YaRN against transformers' formulation (`_compute_yarn_parameters`):
/// the inverse frequencies blended by a linear ramp between the correction
/// dimensions, cos and sin scaled by `0.1 ln(factor) + 1`. Ours follows
/// ggml's (angle blend, ramp on the pair index); both must agree.
#[test]
fn rope_yarn_matches_transformers_formulation() {
    let mut rng = Rng::new(33);
    let (n_heads, head_dim) = (2, 64);
    for (base, factor, orig_ctx, rot_dim) in [
        (1e6f64, 4.0f64, 128usize, 64usize),
        (10000.0, 8.0, 4096, 64),
        (1e6, 2.0, 32768, 48),
    ] {
        let dim = rot_dim as f64;
        let corr = |turns: f64| {
            dim * (orig_ctx as f64 / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let low = corr(32.0).floor().max(0.0);
        let high = corr(1.0).ceil().min(dim - 1.0);
        let attn = 0.1 * factor.ln() + 1.0;
        let inv_freq: Vec<f64> = (0..rot_dim / 2)
            .map(|i| {
                let extrap = 1.0 / base.powf(2.0 * i as f64 / dim);
                let interp = extrap / factor;
                let hi = if high == low { high + 0.001 } else { high };
                let ramp = ((i as f64 - low) / (hi - low)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interp * (1.0 - keep) + extrap * keep
            })
            .collect();
        let freqs = RopeFreqs {
            rot_dim,
            freq_base: base as f32,
            freq_scale: (1.0 / factor) as f32,
            factors: None,
            yarn: Some(Yarn {
                orig_ctx,
                ext_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: attn as f32,
            }),
        };
        for pos in [1, 77, 3000] {
            let x = rng.vec(n_heads * head_dim, 1.0);
            let mut got = x.clone();
            bulkhead_kernels::rope_ext(&mut got, n_heads, head_dim, pos, &freqs, RopeStyle::Neox);
            let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for head in want.chunks_exact_mut(head_dim) {
                for (i, f) in inv_freq.iter().enumerate() {
                    let theta = pos as f64 * f;
                    let (c, s) = (theta.cos() * attn, theta.sin() * attn);
                    let (x0, x1) = (head[i], head[i + rot_dim / 2]);
                    head[i] = x0 * c - x1 * s;
                    head[i + rot_dim / 2] = x0 * s + x1 * c;
                }
            }
            // f32 cos/sin and rotation: an absolute bound, as for plain rope.
            let what = format!("yarn base {base} factor {factor} pos {pos}");
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-6,
                    "{what}[{i}]: got {g}, want {w}"
                );
            }
        }
    }
}

/// RoPE straight from the formula, in f64.
fn rope_f64(
    x: &[f32],
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    base: f64,
    fscale: f64,
    style: RopeStyle,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for head in out.chunks_exact_mut(head_dim) {
        for i in 0..rot_dim / 2 {
            let theta = pos as f64 * fscale * base.powf(-2.0 * i as f64 / rot_dim as f64);
            let (a, b) = match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + rot_dim / 2),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * theta.cos() - x1 * theta.sin();
            head[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
    out
}

#[test]
fn rope_matches_f64_for_both_styles() {
    let mut rng = Rng::new(4);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_heads, head_dim, rot_dim) in [
            (4, 64, 64),
            (2, 128, 128),
            (3, 64, 32),
            (2, 14, 14),
            (1, 40, 36),
            (2, 2, 2),
        ] {
            for (pos, base, fscale) in [(0, 10000.0, 1.0), (17, 10000.0, 1.0), (4095, 1e6, 0.25)] {
                let x = rng.vec(n_heads * head_dim, 1.0);
                let want = rope_f64(&x, head_dim, rot_dim, pos, base, fscale, style);
                let mut got = x.clone();
                bulkhead_kernels::rope(
                    &mut got,
                    n_heads,
                    head_dim,
                    rot_dim,
                    pos,
                    base as f32,
                    fscale as f32,
                    style,
                );
                let what = format!("{style:?} rope {n_heads}×{head_dim} rot {rot_dim} pos {pos}");
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(g) - w).abs() <= 1e-6,
                        "{what}[{i}]: got {g}, want {w}"
                    );
                }
                if rot_dim < head_dim {
                    for (h, head) in got.chunks(head_dim).enumerate() {
                        let orig = &x[h * head_dim + rot_dim..(h + 1) * head_dim];
                        assert_eq!(&head[rot_dim..], orig, "{what}: unrotated tail changed");
                    }
                }
            }
        }
    }
}

/// Causal GQA attention, naively in f64: a query at position `p` sees
/// `p + 1 - window ..= p` (all of `0..=p` without a window), and a soft
/// cap turns each scaled score `s` into `cap · tanh(s / cap)`.
fn attention_f64(q: &[f32], k: &[f32], v: &[f32], s: AttentionShape) -> Vec<f64> {
    let (hd, nh, nkv) = (s.head_dim, s.n_heads, s.n_kv_heads);
    let mut out = vec![0.0; q.len()];
    for t in 0..s.n_tokens {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let qv = &q[(t * nh + h) * hd..][..hd];
            let n_pos = s.start_pos + t + 1;
            let first = s.mask.window.map_or(0, |w| n_pos.saturating_sub(w));
            let scores: Vec<f32> = (first..n_pos)
                .map(|p| {
                    let kv = &k[(p * nkv + kvh) * hd..][..hd];
                    let d: f64 = qv
                        .iter()
                        .zip(kv)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let d = d * f64::from(s.scale);
                    let d = match s.mask.softcap {
                        Some(cap) => f64::from(cap) * (d / f64::from(cap)).tanh(),
                        None => d,
                    };
                    d as f32
                })
                .collect();
            let p = softmax_f64(&scores);
            let o = &mut out[(t * nh + h) * hd..][..hd];
            for (i, w) in p.iter().enumerate() {
                let pos = first + i;
                let vv = &v[(pos * nkv + kvh) * hd..][..hd];
                for (o, &x) in o.iter_mut().zip(vv) {
                    *o += w * f64::from(x);
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_f64() {
    let mut rng = Rng::new(5);
    let mut backends = vec![
        CpuKernels::new(1, Isa::Scalar).unwrap(),
        CpuKernels::new(3, Isa::Scalar).unwrap(),
    ];
    if Isa::Avx2.is_available() {
        backends.push(CpuKernels::new(1, Isa::Avx2).unwrap());
        backends.push(CpuKernels::new(3, Isa::Avx2).unwrap());
    }
    // Plain causal; a sliding window (shorter and longer than some rows'
    // history); a soft cap (tight, so it changes the weights); both.
    let masks = [
        ScoreMask::default(),
        ScoreMask {
            window: Some(3),
            softcap: None,
        },
        ScoreMask {
            window: None,
            softcap: Some(1.5),
        },
        ScoreMask {
            window: Some(12),
            softcap: Some(0.7),
        },
    ];
    // (n_tokens, start_pos, n_heads, n_kv_heads, head_dim): decode, prefill,
    // prefill after a cached prefix, GQA groups of 4 and 7, odd head_dim,
    // head sizes past one 64-float register chunk (96: 64 + 32; 128).
    let cases = [
        (1, 0, 4, 4, 64),
        (2, 70, 4, 2, 96),
        (1, 130, 2, 1, 128),
        (1, 37, 8, 2, 64),
        (5, 0, 4, 1, 32),
        (4, 9, 14, 2, 64),
        (3, 2, 2, 2, 13),
        // Above the size that runs on the calling thread: the pool path,
        // and a decode row there (one head per task).
        (4, 300, 16, 4, 64),
        (1, 300, 16, 4, 64),
    ];
    for ((n_tokens, start_pos, n_heads, n_kv_heads, head_dim), mask) in
        cases.into_iter().flat_map(|c| masks.map(|m| (c, m)))
    {
        let shape = AttentionShape {
            n_tokens,
            start_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            mask,
        };
        let n_ctx = start_pos + n_tokens;
        let q = rng.vec(n_tokens * n_heads * head_dim, 2.0);
        // One spare cache row past n_ctx: attention must not read it.
        let mut k = rng.vec((n_ctx + 1) * n_kv_heads * head_dim, 2.0);
        let mut v = rng.vec((n_ctx + 1) * n_kv_heads * head_dim, 1.0);
        let tail = n_ctx * n_kv_heads * head_dim;
        v[tail..].fill(1e6);
        // Nor the rows before every query's window.
        let unseen = mask.first_position(start_pos) * n_kv_heads * head_dim;
        k[..unseen].fill(f32::NAN);
        v[..unseen].fill(f32::NAN);
        let want = attention_f64(&q, &k, &v, shape);
        let mut first: Option<Vec<f32>> = None;
        for kern in &backends {
            let mut out = vec![f32::NAN; q.len()];
            kern.attention(&q, &k, &v, shape, &mut out);
            let what = format!("{:?}×{} attention {shape:?}", kern.isa(), kern.threads());
            // Outputs are convex combinations of V rows in [-1, 1], so an
            // absolute bound is the meaningful one (f32 sums of ~n_ctx terms).
            for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-5,
                    "{what}[{i}]: got {g}, want {w}"
                );
            }
            match (&first, kern.threads()) {
                (Some(f), 3) => assert_eq!(f, &out, "{what}: thread count changed the result"),
                _ => first = Some(out),
            }
        }
    }
}

/// The AVX2 kernels that take a head's positions at once: a position's
/// score does not depend on which positions share its call (nor its group
/// of eight), and the weighted sum is one `axpy` per position, bit for bit.
#[test]
fn avx2_attention_kernels_match_per_position_ops() {
    let Some(k) = Avx2::detect() else {
        return;
    };
    let mut rng = Rng::new(17);
    for d in [8, 64, 96, 128, 256] {
        let n = 21;
        let stride = d + 8;
        let q = rng.vec(d, 2.0);
        let cache = rng.vec(n * stride + d, 2.0);
        // Rows out of order and with gaps, as a paged pool has them.
        let rows: Vec<usize> = (0..n).map(|j| ((j * 7) % n) * stride + 3).collect();
        let mut all = vec![0.0; n];
        k.attention_scores(&q, &cache, &rows, &mut all);
        for j in 0..n {
            let row = &cache[rows[j]..rows[j] + d];
            let exact: f64 = q
                .iter()
                .zip(row)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            assert!(
                (f64::from(all[j]) - exact).abs() < 1e-4,
                "d {d}, position {j}"
            );
            let mut alone = [0.0];
            k.attention_scores(&q, &cache, &rows[j..=j], &mut alone);
            assert_eq!(alone[0], all[j], "d {d}: position {j} alone differs");
        }
        let mut some = vec![0.0; n - 5];
        k.attention_scores(&q, &cache, &rows[5..], &mut some);
        assert_eq!(some, all[5..], "d {d}: a shifted group changed the scores");

        let s = rng.vec(n, 1.0);
        let mut want = rng.vec(d, 1.0);
        let mut got = want.clone();
        for (&a, &r) in s.iter().zip(&rows) {
            k.axpy(a, &cache[r..r + d], &mut want);
        }
        k.attention_weighted_sum(&s, &cache, &rows, &mut got);
        assert_eq!(
            got, want,
            "d {d}: weighted sum is not one axpy per position"
        );
    }
}

/// Paged attention reads each position through the block table and must
/// give bit-identical results to the contiguous kernel over the same values,
/// for several sequences of different lengths in one call, blocks scattered
/// and out of order in the pool.
#[test]
fn paged_attention_is_bit_identical_to_contiguous() {
    const BT: usize = 16;
    let mut rng = Rng::new(11);
    let mut isas = vec![Isa::Scalar];
    if Isa::Avx2.is_available() {
        isas.push(Isa::Avx2);
    }
    let (n_heads, n_kv_heads, head_dim) = (8, 2, 32);
    let kv_width = n_kv_heads * head_dim;
    let pool_blocks = 64;
    let mut k_pool: Vec<f32> = rng.vec(pool_blocks * BT * kv_width, 2.0);
    let mut v_pool: Vec<f32> = rng.vec(pool_blocks * BT * kv_width, 1.0);
    // (n_tokens, start_pos) per sequence: decode, prefill, chunk after a prefix, long decode.
    let cases: [(usize, usize); 4] = [(1, 40), (7, 0), (16, 33), (1, 300)];
    let mut next_block = 0u32;
    let tables: Vec<Vec<u32>> = cases
        .iter()
        .map(|&(n, start)| {
            let blocks = (start + n).div_ceil(BT);
            // Every third block of the pool, walking backwards: scattered.
            (0..blocks)
                .map(|_| {
                    next_block += 1;
                    (pool_blocks as u32 - 1) - ((next_block * 3) % pool_blocks as u32)
                })
                .collect()
        })
        .collect();
    for t in &tables {
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            t.iter().all(|b| seen.insert(*b)),
            "test tables reuse a block"
        );
    }
    // Distinct tables must not share blocks across sequences either.
    let all: Vec<u32> = tables.iter().flatten().copied().collect();
    let unique: std::collections::BTreeSet<u32> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len());
    // Blocks nobody's table names must never be read: poison them.
    for pool in [&mut k_pool, &mut v_pool] {
        for (b, chunk) in pool.chunks_exact_mut(BT * kv_width).enumerate() {
            if !unique.contains(&(b as u32)) {
                chunk.fill(f32::NAN);
            }
        }
    }
    let rows: usize = cases.iter().map(|c| c.0).sum();
    let q = rng.vec(rows * n_heads * head_dim, 2.0);
    let scale = 1.0 / (head_dim as f32).sqrt();
    // Plain, and a window shorter than the long sequences with a soft cap.
    let masks = [
        ScoreMask::default(),
        ScoreMask {
            window: Some(20),
            softcap: Some(2.0),
        },
    ];
    for (isa, mask) in isas.into_iter().flat_map(|i| masks.map(|m| (i, m))) {
        for threads in [1, 3] {
            let kern = CpuKernels::new(threads, isa).unwrap();
            // The contiguous oracle: copy each sequence's blocks out in order.
            let mut want = Vec::new();
            let mut row = 0;
            for (&(n, start), table) in cases.iter().zip(&tables) {
                let gather = |pool: &[f32]| -> Vec<f32> {
                    table
                        .iter()
                        .flat_map(|&b| {
                            let at = b as usize * BT * kv_width;
                            pool[at..at + BT * kv_width].to_vec()
                        })
                        .collect()
                };
                let shape = AttentionShape {
                    n_tokens: n,
                    start_pos: start,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    scale,
                    mask,
                };
                let width = n_heads * head_dim;
                let mut out = vec![0.0; n * width];
                let (k, v) = (gather(&k_pool), gather(&v_pool));
                kern.attention(&q[row * width..(row + n) * width], &k, &v, shape, &mut out);
                want.extend(out);
                row += n;
            }
            let seqs: Vec<PagedSeq> = cases
                .iter()
                .zip(&tables)
                .map(|(&(n_tokens, start_pos), t)| PagedSeq {
                    n_tokens,
                    start_pos,
                    blocks: t,
                })
                .collect();
            let shape = PagedShape {
                block_tokens: BT,
                n_heads,
                n_kv_heads,
                head_dim,
                scale,
                mask,
            };
            let mut got = vec![f32::NAN; q.len()];
            kern.attention_paged(&q, &k_pool, &v_pool, &seqs, shape, &mut got);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{isa:?}×{threads} {mask:?}: paged differs from contiguous"
            );
        }
    }
}

/// The AVX2 rotation against the scalar oracle, on shapes whose pair count is
/// not a multiple of the vector width (so the scalar tail runs too).
#[test]
fn rope_rotate_avx2_matches_scalar_with_tails() {
    let Some(k) = avx2() else {
        eprintln!("skipping: this CPU has no AVX2/FMA/F16C");
        return;
    };
    let mut rng = Rng::new(9);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_heads, head_dim, rot_dim) in [
            (3, 64, 64),
            (2, 14, 14),
            (1, 40, 36),
            (2, 2, 2),
            (4, 128, 96),
        ] {
            let (cos, sin) = scalar::rope_angles(rot_dim, 1234, 10000.0, 1.0);
            let x = rng.vec(n_heads * head_dim, 2.0);
            let mut want = x.clone();
            scalar::rope_rotate(&mut want, head_dim, &cos, &sin, style);
            let mut got = x.clone();
            k.rope_rotate(&mut got, head_dim, &cos, &sin, style);
            let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
            close(
                &got,
                &want64,
                1e-6,
                &format!("{style:?} {n_heads}×{head_dim} rot {rot_dim}"),
            );
        }
    }
}

/// The dispatched `dequantize_row` (AVX2 for F32/F16/BF16/Q8_0/Q4_0) gives the
/// scalar oracle's exact bits for every type, including float tails.
#[test]
fn dequantize_row_fast_path_is_bit_identical_to_scalar() {
    let mut rng = Rng::new(21);
    for ty in bulkhead_kernels::GgmlType::ALL {
        for cols in [256usize, 512, 768] {
            let cols = if ty.block_elements() == 1 {
                cols + 3
            } else {
                cols
            };
            let raw = common::random_matrix(&mut rng, ty, 1, cols);
            let mut fast = vec![0.0f32; cols];
            let mut oracle = vec![1.0f32; cols];
            bulkhead_kernels::dequantize_row(ty, &raw, &mut fast);
            bulkhead_kernels::dequantize_row_scalar(ty, &raw, &mut oracle);
            let same = fast
                .iter()
                .zip(&oracle)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{ty} × {cols}: fast path differs from the scalar oracle"
            );
        }
    }
    if let Some(k) = avx2() {
        // Types without a vector path are declined untouched.
        let mut dst = vec![7.0f32; 256];
        let raw = common::random_matrix(&mut rng, bulkhead_kernels::GgmlType::Q6K, 1, 256);
        assert!(!k.dequantize_row(bulkhead_kernels::GgmlType::Q6K, &raw, &mut dst));
        assert!(dst.iter().all(|&v| v == 7.0));
    }
}

/// The AVX2 Q8_0 quantizer gives the reference's blocks bit for bit: on
/// random rows of several magnitudes, on values that sit exactly on and
/// next to a rounding half, and with zeros, infinities and NaNs mixed in.
#[test]
fn avx2_quantize_q8_0_is_the_reference() {
    use bulkhead_kernels::{BlockQ8_0, quantize_row_q8_0};
    let Some(k) = avx2() else { return };
    let mut rng = Rng::new(11);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6, 0.02, 1.0, 300.0, 1e30] {
        rows.push(rng.vec(32 * 24, scale));
    }
    // amax 127 makes id ≈ 1: the quants are the values rounded, ties included.
    let mut halves: Vec<f32> = (0..32 * 16)
        .map(|i| (i % 255) as f32 - 127.0 + [0.5, 0.0, 0.25, 0.75][i % 4])
        .collect();
    for (i, v) in halves.iter_mut().enumerate() {
        if i % 3 == 1 {
            *v = v.next_up().min(127.0);
        } else if i % 3 == 2 {
            *v = v.next_down().max(-127.0);
        }
    }
    for b in halves.chunks_exact_mut(32) {
        b[31] = 127.0;
    }
    rows.push(halves);
    let mut specials = rng.vec(32 * 6, 1.0);
    specials[..32].fill(0.0);
    specials[33] = f32::INFINITY;
    specials[70] = f32::NAN;
    specials[100] = f32::NEG_INFINITY;
    specials[101] = f32::NAN;
    specials[140] = -0.0;
    rows.push(specials);
    for x in &rows {
        let mut want = vec![BlockQ8_0::default(); x.len() / 32];
        let mut got = want.clone();
        quantize_row_q8_0(x, &mut want);
        k.quantize_row_q8_0(x, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.qs, w.qs, "block {i}");
            assert_eq!(g.d.to_bits(), w.d.to_bits(), "block {i} scale");
        }
    }
}

/// The AVX2 Q8_K quantizer gives the reference's blocks bit for bit
/// (quants, block sums, scale): random rows of several magnitudes, the
/// largest magnitude met twice with both signs (the first one sets the
/// scale), values on and next to a rounding half (ties go to even), and
/// zeros, infinities and NaNs mixed in.
#[test]
fn avx2_quantize_q8_k_is_the_reference() {
    use bulkhead_kernels::{BlockQ8K, quantize_row_q8_k};
    let Some(k) = avx2() else { return };
    let mut rng = Rng::new(12);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-6, 0.02, 1.0, 300.0, 1e30] {
        rows.push(rng.vec(256 * 6, scale));
    }
    // The value of largest magnitude -127 makes iscale exactly 1: the
    // quants are the values rounded, ties included.
    let mut halves: Vec<f32> = (0..256 * 4)
        .map(|i| (i % 253) as f32 - 126.0 + [0.5, 0.0, 0.25, 0.75][i % 4])
        .map(|v: f32| v.clamp(-126.5, 126.5))
        .collect();
    for (i, v) in halves.iter_mut().enumerate() {
        if i % 3 == 1 {
            *v = v.next_up();
        } else if i % 3 == 2 {
            *v = v.next_down();
        }
    }
    for b in halves.chunks_exact_mut(256) {
        b[200] = -127.0;
    }
    rows.push(halves);
    // Both signs of the largest magnitude, in either order.
    let mut ties = rng.vec(256 * 2, 1.0);
    ties[10] = 5.0;
    ties[20] = -5.0;
    ties[256 + 10] = -5.0;
    ties[256 + 20] = 5.0;
    rows.push(ties);
    let mut specials = rng.vec(256 * 4, 1.0);
    specials[..256].fill(0.0);
    specials[256 + 33] = f32::INFINITY;
    specials[512 + 70] = f32::NAN;
    specials[768 + 100] = f32::NEG_INFINITY;
    specials[768 + 101] = f32::NAN;
    specials[768 + 140] = -0.0;
    rows.push(specials);
    let mut nans = vec![f32::NAN; 256];
    nans[3] = 0.0;
    rows.push(nans);
    for x in &rows {
        let mut want = vec![BlockQ8K::default(); x.len() / 256];
        let mut got = want.clone();
        quantize_row_q8_k(x, &mut want);
        k.quantize_row_q8_k(x, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.qs, w.qs, "block {i}");
            assert_eq!(g.bsums, w.bsums, "block {i} sums");
            assert_eq!(g.d.to_bits(), w.d.to_bits(), "block {i} scale");
        }
    }
}
