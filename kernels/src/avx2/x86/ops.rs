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
