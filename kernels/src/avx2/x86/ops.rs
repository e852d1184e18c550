//! Element-wise and per-row ops on f32 vectors.

use std::arch::x86_64::*;

use super::simd::*;

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ac, at) = a.as_chunks::<16>();
    let (bc, bt) = b.as_chunks::<16>();
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    for (a, b) in ac.iter().zip(bc) {
        let (a, _) = a.as_chunks::<8>();
        let (b, _) = b.as_chunks::<8>();
        acc0 = _mm256_fmadd_ps(load_f32x8(&a[0]), load_f32x8(&b[0]), acc0);
        acc1 = _mm256_fmadd_ps(load_f32x8(&a[1]), load_f32x8(&b[1]), acc1);
    }
    let mut sum = hsum_ps(_mm256_add_ps(acc0, acc1));
    for (a, b) in at.iter().zip(bt) {
        sum += a * b;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let av = _mm256_set1_ps(a);
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (x, y) in xc.iter().zip(yc) {
        let v = _mm256_fmadd_ps(av, load_f32x8(x), load_f32x8(y));
        store_f32x8(y, v);
    }
    for (x, y) in xt.iter().zip(yt) {
        *y += a * x;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn add(a: &mut [f32], b: &[f32]) {
    let (ac, at) = a.as_chunks_mut::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    for (a, b) in ac.iter_mut().zip(bc) {
        let v = _mm256_add_ps(load_f32x8(a), load_f32x8(b));
        store_f32x8(a, v);
    }
    for (a, b) in at.iter_mut().zip(bt) {
        *a += b;
    }
}

/// RoPE rotation of every head of `x` (see `scalar::rope_rotate`), eight
/// dimensions at a time; any tail is rotated by the scalar code.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn rope_rotate(
    x: &mut [f32],
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    style: crate::RopeStyle,
) {
    let half = cos.len();
    // Pairs handled by vectors; the scalar code finishes the rest.
    let done = match style {
        crate::RopeStyle::Normal => half / 4 * 4,
        crate::RopeStyle::Neox => half / 8 * 8,
    };
    for head in x.chunks_exact_mut(head_dim) {
        match style {
            crate::RopeStyle::Normal => {
                // Four adjacent pairs per vector: [x0 x1 x2 x3 …] with
                // [c0 c0 c1 c1 …]; addsub gives x0·c − x1·s, x1·c + x0·s.
                let (pairs, _) = head[..2 * done].as_chunks_mut::<8>();
                let (cs, _) = cos[..done].as_chunks::<4>();
                let (ss, _) = sin[..done].as_chunks::<4>();
                for ((v, c), s) in pairs.iter_mut().zip(cs).zip(ss) {
                    let c = load_f32x4(c);
                    let s = load_f32x4(s);
                    let c = _mm256_set_m128(_mm_unpackhi_ps(c, c), _mm_unpacklo_ps(c, c));
                    let s = _mm256_set_m128(_mm_unpackhi_ps(s, s), _mm_unpacklo_ps(s, s));
                    let xv = load_f32x8(v);
                    let swapped = _mm256_permute_ps::<0b10_11_00_01>(xv);
                    store_f32x8(
                        v,
                        _mm256_addsub_ps(_mm256_mul_ps(xv, c), _mm256_mul_ps(swapped, s)),
                    );
                }
            }
            crate::RopeStyle::Neox => {
                let (lo, hi) = head.split_at_mut(half);
                let (a, _) = lo[..done].as_chunks_mut::<8>();
                let (b, _) = hi[..done].as_chunks_mut::<8>();
                let (cs, _) = cos[..done].as_chunks::<8>();
                let (ss, _) = sin[..done].as_chunks::<8>();
                for (((a, b), c), s) in a.iter_mut().zip(b.iter_mut()).zip(cs).zip(ss) {
                    let (av, bv) = (load_f32x8(a), load_f32x8(b));
                    let (c, s) = (load_f32x8(c), load_f32x8(s));
                    store_f32x8(a, _mm256_sub_ps(_mm256_mul_ps(av, c), _mm256_mul_ps(bv, s)));
                    store_f32x8(b, _mm256_add_ps(_mm256_mul_ps(av, s), _mm256_mul_ps(bv, c)));
                }
            }
        }
        for i in done..half {
            let (a, b) = match style {
                crate::RopeStyle::Normal => (2 * i, 2 * i + 1),
                crate::RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// F16 values to f32, eight at a time with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    let (sc, st) = src.as_chunks::<16>();
    let (dc, dt) = dst.as_chunks_mut::<8>();
    for (s, d) in sc.iter().zip(dc) {
        store_f32x8(d, _mm256_cvtph_ps(load_u8x16(s)));
    }
    for (s, d) in st.chunks_exact(2).zip(dt) {
        *d = f16_to_f32(s[0], s[1]);
    }
}

/// BF16 values to f32: each is the top half of an f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    let (sc, st) = src.as_chunks::<16>();
    let (dc, dt) = dst.as_chunks_mut::<8>();
    for (s, d) in sc.iter().zip(dc) {
        let wide = _mm256_cvtepu16_epi32(load_u8x16(s));
        store_f32x8(d, _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide)));
    }
    for (s, d) in st.chunks_exact(2).zip(dt) {
        *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
    }
}

/// Sixteen i8 values times `d`, into sixteen f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8x16_scaled(q: __m128i, d: __m256, out: &mut [f32; 16]) {
    let (lo, hi) = out.split_at_mut(8);
    let lo: &mut [f32; 8] = lo.try_into().expect("8 lanes");
    let hi: &mut [f32; 8] = hi.try_into().expect("8 lanes");
    store_f32x8(
        lo,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d),
    );
    let q_hi = _mm_srli_si128::<8>(q);
    store_f32x8(
        hi,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q_hi)), d),
    );
}

/// Q8_0 blocks to f32: `d · q`, as the scalar code computes it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<{ crate::blocks::Q8_0_BYTES }>();
    let (outs, _) = dst.as_chunks_mut::<32>();
    for (b, y) in blocks.iter().zip(outs) {
        let d = _mm256_set1_ps(f16_to_f32(b[0], b[1]));
        let (y0, y1) = y.split_at_mut(16);
        let qs = &b[2..];
        i8x16_scaled(
            load_u8x16(super::dot::arr(qs)),
            d,
            y0.try_into().expect("16"),
        );
        i8x16_scaled(
            load_u8x16(super::dot::arr(&qs[16..])),
            d,
            y1.try_into().expect("16"),
        );
    }
}

/// Q4_0 blocks to f32: `d · (q − 8)`, low nibbles first, as the scalar code.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    let (blocks, _) = src.as_chunks::<{ crate::blocks::Q4_0_BYTES }>();
    let (outs, _) = dst.as_chunks_mut::<32>();
    for (b, y) in blocks.iter().zip(outs) {
        let d = _mm256_set1_ps(f16_to_f32(b[0], b[1]));
        let q = _mm256_sub_epi8(
            super::dot::nibbles(super::dot::arr(&b[2..])),
            _mm256_set1_epi8(8),
        );
        let (y0, y1) = y.split_at_mut(16);
        i8x16_scaled(_mm256_castsi256_si128(q), d, y0.try_into().expect("16"));
        i8x16_scaled(
            _mm256_extracti128_si256::<1>(q),
            d,
            y1.try_into().expect("16"),
        );
    }
}

/// `v * c` for every element of `x`, in place.
#[target_feature(enable = "avx2,fma,f16c")]
fn scale(x: &mut [f32], c: f32) {
    let cv = _mm256_set1_ps(c);
    let (xc, xt) = x.as_chunks_mut::<8>();
    for x in xc {
        let v = _mm256_mul_ps(load_f32x8(x), cv);
        store_f32x8(x, v);
    }
    for x in xt {
        *x *= c;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks::<8>();
    let mut acc = _mm256_setzero_ps();
    for x in xc {
        let v = load_f32x8(x);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    let mut sum = f64::from(hsum_ps(acc));
    for &v in xt {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let s = 1.0 / (mean + eps).sqrt();
    let sv = _mm256_set1_ps(s);
    let (wc, wt) = weight.as_chunks::<8>();
    let (oc, ot) = out.as_chunks_mut::<8>();
    for ((x, w), o) in xc.iter().zip(wc).zip(oc) {
        let v = _mm256_mul_ps(_mm256_mul_ps(load_f32x8(x), sv), load_f32x8(w));
        store_f32x8(o, v);
    }
    for ((&x, &w), o) in xt.iter().zip(wt).zip(ot) {
        *o = x * s * w;
    }
}

/// e^x for eight lanes: Cephes-style range reduction to `x = n ln2 + r`,
/// |r| ≤ ln2/2, a degree-6 polynomial for e^r, and 2^n built in the exponent
/// bits. Within 2 ulp of libm over the clamped range; inputs below -87.3
/// (where the result would be subnormal) give e^-87.3 instead of ~0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp_ps(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln2 split in two so n·ln2 is subtracted with extra precision.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let er = _mm256_fmadd_ps(
        p,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(er, _mm256_castsi256_ps(pow2n))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let mut max = f32::NEG_INFINITY;
    {
        let (xc, xt) = x.as_chunks::<8>();
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for x in xc {
            mv = _mm256_max_ps(mv, load_f32x8(x));
        }
        let mut lanes = [0.0f32; 8];
        store_f32x8(&mut lanes, mv);
        for v in lanes.iter().chain(xt) {
            max = max.max(*v);
        }
    }
    let maxv = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let (xc, xt) = x.as_chunks_mut::<8>();
    for x in xc {
        let e = exp_ps(_mm256_sub_ps(load_f32x8(x), maxv));
        acc = _mm256_add_ps(acc, e);
        store_f32x8(x, e);
    }
    let mut sum = f64::from(hsum_ps(acc));
    for v in xt {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    scale(x, (1.0 / sum) as f32);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    let (gc, gt) = gate.as_chunks_mut::<8>();
    let (uc, ut) = up.as_chunks::<8>();
    for (g, u) in gc.iter_mut().zip(uc) {
        let gv = load_f32x8(g);
        let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        let silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        store_f32x8(g, _mm256_mul_ps(silu, load_f32x8(u)));
    }
    for (g, &u) in gt.iter_mut().zip(ut) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `gate = gelu_tanh(gate) * up`, with `0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z))`
/// so GELU reuses [`exp_ps`]: `gelu(g) = g / (1 + e^(-2β(g + κg³)))`.
/// Within a few ulp of the scalar `tanh` form; the tail is that form.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    let minus_two_beta = _mm256_set1_ps(-2.0 * crate::scalar::GELU_BETA);
    let kappa = _mm256_set1_ps(crate::scalar::GELU_KAPPA);
    let (gc, gt) = gate.as_chunks_mut::<8>();
    let (uc, ut) = up.as_chunks::<8>();
    for (g, u) in gc.iter_mut().zip(uc) {
        let x = load_f32x8(g);
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let inner = _mm256_fmadd_ps(kappa, x3, x);
        let e = exp_ps(_mm256_mul_ps(minus_two_beta, inner));
        let gelu = _mm256_div_ps(x, _mm256_add_ps(one, e));
        store_f32x8(g, _mm256_mul_ps(gelu, load_f32x8(u)));
    }
    crate::scalar::gelu_tanh_mul(gt, &ut[..gt.len()]);
}
