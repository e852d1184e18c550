//! Attention's two inner loops over one head's cached positions, whose rows
//! may lie anywhere in the cache (one sequence's contiguous cache, or the
//! blocks of a paged pool): the scores `q · k_p` eight positions at a
//! time, and `o += Σ_p s_p v_p` with a slice of `o` held in registers.
//!
//! One `dot` and one `axpy` call per (head, position) cost more in calls,
//! horizontal sums and reloads of `o` than in arithmetic at a head size of
//! 64: attention took a quarter of two-thread decode time on a 110M model
//! while reading a sixth of its bytes.

use std::arch::x86_64::*;

use super::Avx2;
use super::simd::*;

/// Positions whose scores one pass computes.
const GROUP: usize = 8;
/// Floats of `o` one weighted-sum pass keeps in registers.
const O_CHUNK: usize = 64;

/// `out[j] = q · k[rows[j]..][..q.len()]`, `q.len()` a multiple of 8.
///
/// Per position: eight lane sums, each over its lane's elements in order,
/// then the lanes added as `((0+1)+(2+3)) + ((4+5)+(6+7))`. A position's
/// score is the same whichever positions share its group.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores(q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]) {
    let d = q.len();
    let (qc, _) = q.as_chunks::<8>();
    for (rs, o) in rows.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
        // A short last group repeats its last row; those sums are dropped.
        let mut kr: [&[[f32; 8]]; GROUP] = [&[]; GROUP];
        for (j, slot) in kr.iter_mut().enumerate() {
            let r = rs[j.min(rs.len() - 1)];
            *slot = k[r..r + d].as_chunks::<8>().0;
        }
        let mut acc = [_mm256_setzero_ps(); GROUP];
        for (c, q) in qc.iter().enumerate() {
            let qv = load_f32x8(q);
            for j in 0..GROUP {
                acc[j] = _mm256_fmadd_ps(qv, load_f32x8(&kr[j][c]), acc[j]);
            }
        }
        // hadd pairs lanes within each 128-bit half: after two rounds, half
        // h of position j's sum sits in lane j % 4 of half h of `h0123`
        // (j < 4) or `h4567`.
        let h01 = _mm256_hadd_ps(acc[0], acc[1]);
        let h23 = _mm256_hadd_ps(acc[2], acc[3]);
        let h45 = _mm256_hadd_ps(acc[4], acc[5]);
        let h67 = _mm256_hadd_ps(acc[6], acc[7]);
        let h0123 = _mm256_hadd_ps(h01, h23);
        let h4567 = _mm256_hadd_ps(h45, h67);
        let low = _mm256_permute2f128_ps::<0x20>(h0123, h4567);
        let high = _mm256_permute2f128_ps::<0x31>(h0123, h4567);
        let mut lanes = [0.0f32; GROUP];
        store_f32x8(&mut lanes, _mm256_add_ps(low, high));
        o.copy_from_slice(&lanes[..o.len()]);
    }
}

/// `o += Σ_j s[j] · v[rows[j]..][..o.len()]`, `o.len()` a multiple of 8:
/// per element the FMAs of `axpy` position by position, in order, so the
/// result equals one `axpy` per position bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_sum(s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]) {
    for (c, oc) in o.chunks_mut(O_CHUNK).enumerate() {
        let at = c * O_CHUNK;
        let (oc, _) = oc.as_chunks_mut::<8>();
        match oc.len() {
            8 => weighted_chunk::<8>(s, v, rows, at, oc),
            7 => weighted_chunk::<7>(s, v, rows, at, oc),
            6 => weighted_chunk::<6>(s, v, rows, at, oc),
            5 => weighted_chunk::<5>(s, v, rows, at, oc),
            4 => weighted_chunk::<4>(s, v, rows, at, oc),
            3 => weighted_chunk::<3>(s, v, rows, at, oc),
            2 => weighted_chunk::<2>(s, v, rows, at, oc),
            _ => weighted_chunk::<1>(s, v, rows, at, oc),
        }
    }
}

/// [`weighted_sum`] for `8 N` floats of `o` starting at `at`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_chunk<const N: usize>(
    s: &[f32],
    v: &[f32],
    rows: &[usize],
    at: usize,
    o: &mut [[f32; 8]],
) {
    let mut acc = [_mm256_setzero_ps(); N];
    for (a, o) in acc.iter_mut().zip(o.iter()) {
        *a = load_f32x8(o);
    }
    for (&sj, &r) in s.iter().zip(rows) {
        let sv = _mm256_set1_ps(sj);
        let (vc, _) = v[r + at..r + at + 8 * N].as_chunks::<8>();
        for (a, x) in acc.iter_mut().zip(vc) {
            *a = _mm256_fmadd_ps(sv, load_f32x8(x), *a);
        }
    }
    for (a, o) in acc.iter().zip(o.iter_mut()) {
        store_f32x8(o, *a);
    }
}

impl Avx2 {
    /// `out[j] = q · k[rows[j]..][..q.len()]` for every cached position `j`
    /// of one head (`rows[j]`: where its key starts in `k`).
    ///
    /// # Panics
    /// If `q.len()` is not a multiple of 8, `rows` and `out` differ in
    /// length, or a row runs past the end of `k`.
    pub fn attention_scores(self, q: &[f32], k: &[f32], rows: &[usize], out: &mut [f32]) {
        assert!(
            q.len().is_multiple_of(8),
            "attention_scores: head size {} is not a multiple of 8",
            q.len()
        );
        assert_eq!(
            rows.len(),
            out.len(),
            "attention_scores: rows and out differ"
        );
        // SAFETY: `self` proves avx2, fma and f16c; the kernel slices with
        // bounds checks.
        unsafe { scores(q, k, rows, out) }
    }

    /// `o += Σ_j s[j] · v[rows[j]..][..o.len()]`, bit for bit one
    /// [`Avx2::axpy`] per position in order.
    ///
    /// # Panics
    /// If `o.len()` is not a multiple of 8, `s` and `rows` differ in length,
    /// or a row runs past the end of `v`.
    pub fn attention_weighted_sum(self, s: &[f32], v: &[f32], rows: &[usize], o: &mut [f32]) {
        assert!(
            o.len().is_multiple_of(8),
            "attention_weighted_sum: head size {} is not a multiple of 8",
            o.len()
        );
        assert_eq!(
            s.len(),
            rows.len(),
            "attention_weighted_sum: s and rows differ"
        );
        // SAFETY: as above.
        unsafe { weighted_sum(s, v, rows, o) }
    }
}
