//! The multi-token (prefill) AVX2 kernels against the single-row kernels they
//! replace: same weight row, N = 1..=4 token rows, equal up to float
//! re-association (1e-6 of Σ|w||x|). The AVX-512 VNNI kernels (N = 1..=8)
//! must equal the single-row AVX2 kernels bit for bit.

mod common;

use bulkhead_kernels::avx2::{Avx2, Vnni};
use bulkhead_kernels::{
    BlockQ8_0, BlockQ8_0U, BlockQ8K, GgmlType, quantize_row_q8_0, quantize_row_q8_k, scalar,
};
use bulkhead_testkit::{Need, skip};
use common::{Rng, dequantized, random_matrix};

/// 1e-6 · Σ|w||x|, with a floor for rows that happen to be all zero.
fn tolerance(w: &[f32], x: &[f32]) -> f32 {
    let mag: f64 = w.iter().zip(x).map(|(w, x)| f64::from((w * x).abs())).sum();
    (1e-6 * mag + 1e-12) as f32
}

/// For each N in 1..=4: a random row of `ty` and N random token rows;
/// `multi(row, tokens)` must match `single(row, token)` for every token.
fn check<B>(
    ty: GgmlType,
    quantize: impl Fn(&[f32]) -> Vec<B>,
    single: impl Fn(&[u8], &[B]) -> f32,
    multi: impl Fn(&[u8], &[&[B]], &mut [f32]),
) {
    for cols in [256, 768, 4096] {
        for n in 1..=Avx2::MAX_TOKENS {
            let mut rng = Rng::new((cols * 10 + n) as u64);
            let row = random_matrix(&mut rng, ty, 1, cols);
            let w = dequantized(ty, &row, 1, cols);
            let xs: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(cols, 3.0)).collect();
            let acts: Vec<Vec<B>> = xs.iter().map(|x| quantize(x)).collect();
            let refs: Vec<&[B]> = acts.iter().map(Vec::as_slice).collect();
            let mut got = vec![f32::NAN; n];
            multi(&row, &refs, &mut got);
            for (t, (&g, a)) in got.iter().zip(&acts).enumerate() {
                let want = single(&row, a);
                let tol = tolerance(&w, &xs[t]);
                assert!(
                    (g - want).abs() <= tol,
                    "{ty} cols {cols} N {n} token {t}: multi {g} vs single {want} (tol {tol})"
                );
            }
        }
    }
}

fn q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
    let mut q = vec![BlockQ8_0::default(); x.len() / 32];
    quantize_row_q8_0(x, &mut q);
    q
}

fn q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    let mut q = vec![BlockQ8K::default(); x.len() / 256];
    quantize_row_q8_k(x, &mut q);
    q
}

fn avx2() -> Option<Avx2> {
    let k = Avx2::detect();
    if k.is_none() {
        skip(Need::Isa("avx2"), "this CPU lacks avx2/fma/f16c");
    }
    k
}

/// What `f` panicked with (it must panic).
fn panic_message(f: impl FnOnce()) -> String {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .expect_err("the call should have panicked");
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[test]
fn f16_tokens_match_single_row() {
    let Some(k) = avx2() else { return };
    check(
        GgmlType::F16,
        <[f32]>::to_vec,
        |w, x| k.dot_f16(w, x),
        |w, x, o| k.dot_f16_tokens(w, x, o),
    );
}

#[test]
fn f16_two_row_tiles_match_single_row() {
    let Some(k) = avx2() else { return };
    // 1000 columns: not a multiple of 8, so the scalar tail runs too.
    for cols in [256, 1000] {
        for n in 1..=Avx2::MAX_TOKENS {
            let mut rng = Rng::new((cols + n) as u64);
            let data = random_matrix(&mut rng, GgmlType::F16, 2, cols);
            let w = dequantized(GgmlType::F16, &data, 2, cols);
            let rows: Vec<&[u8]> = data.chunks_exact(2 * cols).collect();
            let xs: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(cols, 3.0)).collect();
            let refs: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let mut got = vec![f32::NAN; 2 * n];
            k.dot_f16_rows_tokens(&rows, &refs, &mut got);
            let mut one_row = vec![f32::NAN; n];
            for (r, row) in rows.iter().enumerate() {
                k.dot_f16_tokens(row, &refs, &mut one_row);
                for (t, x) in xs.iter().enumerate() {
                    let (g, want) = (got[r * n + t], k.dot_f16(row, x));
                    let tol = tolerance(&w[r * cols..(r + 1) * cols], x);
                    assert!(
                        (g - want).abs() <= tol,
                        "cols {cols} N {n} row {r} token {t}: tile {g} vs single {want} (tol {tol})"
                    );
                    // One or two rows per call: same summation order, same bits.
                    assert_eq!(g.to_bits(), one_row[t].to_bits(), "row {r} token {t}");
                }
            }
        }
    }
}

#[test]
fn q4_0_tokens_match_single_row() {
    let Some(k) = avx2() else { return };
    check(
        GgmlType::Q4_0,
        q8_0,
        |w, x| k.dot_q4_0(w, x),
        |w, x, o| k.dot_q4_0_tokens(w, x, o),
    );
}

#[test]
fn q8_0_tokens_match_single_row() {
    let Some(k) = avx2() else { return };
    check(
        GgmlType::Q8_0,
        q8_0,
        |w, x| k.dot_q8_0(w, x),
        |w, x, o| k.dot_q8_0_tokens(w, x, o),
    );
}

#[test]
fn q4k_tokens_match_single_row() {
    let Some(k) = avx2() else { return };
    check(
        GgmlType::Q4K,
        q8_k,
        |w, x| k.dot_q4k(w, x),
        |w, x, o| k.dot_q4k_tokens(w, x, o),
    );
}

#[test]
fn q6k_tokens_match_single_row() {
    let Some(k) = avx2() else { return };
    check(
        GgmlType::Q6K,
        q8_k,
        |w, x| k.dot_q6k(w, x),
        |w, x, o| k.dot_q6k_tokens(w, x, o),
    );
}

#[test]
fn more_than_four_tokens_is_a_caller_bug() {
    // Decided before the body: a CPU without AVX2 skips, it does not pass.
    let Some(k) = avx2() else { return };
    let row = vec![0u8; 34];
    let act = [BlockQ8_0::default()];
    let xs: [&[BlockQ8_0]; 5] = [&act; 5];
    let message = panic_message(|| k.dot_q8_0_tokens(&row, &xs, &mut [0.0; 5]));
    assert!(message.contains("at most 4 per call"), "{message}");
}

fn vnni() -> Option<(Vnni, Avx2)> {
    let pair = Vnni::detect().zip(Avx2::detect());
    if pair.is_none() {
        skip(
            Need::Isa("avx512vnni"),
            "this CPU lacks avx512f/avx512vl/avx512vnni",
        );
    }
    pair
}

/// For N in 1..=8 and block counts even, odd and 1: `multi` on offset
/// activations gives exactly the bits of the one-row AVX2 kernel `single`
/// for every token, and is within float re-association of the scalar
/// oracle. Random quant bytes include -128 weights; one token is all ±127.
fn check_vnni(
    ty: GgmlType,
    single: impl Fn(&[u8], &[BlockQ8_0]) -> f32,
    oracle: impl Fn(&[u8], &[BlockQ8_0]) -> f32,
    multi: impl Fn(&[u8], &[&[BlockQ8_0U]], &mut [f32]),
) {
    for cols in [32, 96, 768, 800, 4096] {
        for n in 1..=Vnni::MAX_TOKENS {
            let mut rng = Rng::new((cols * 100 + n) as u64);
            let row = random_matrix(&mut rng, ty, 1, cols);
            let w = dequantized(ty, &row, 1, cols);
            let mut xs: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(cols, 3.0)).collect();
            // Every quant at ±127, the extreme the sign tricks must survive.
            xs[n - 1] = (0..cols)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            let acts: Vec<Vec<BlockQ8_0>> = xs.iter().map(|x| q8_0(x)).collect();
            let offset: Vec<Vec<BlockQ8_0U>> = acts
                .iter()
                .map(|a| a.iter().map(BlockQ8_0U::from).collect())
                .collect();
            let refs: Vec<&[BlockQ8_0U]> = offset.iter().map(Vec::as_slice).collect();
            let mut got = vec![f32::NAN; n];
            multi(&row, &refs, &mut got);
            for (t, (&g, a)) in got.iter().zip(&acts).enumerate() {
                let want = single(&row, a);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{ty} cols {cols} N {n} token {t}: vnni {g} vs one-row avx2 {want}"
                );
                let (s, tol) = (oracle(&row, a), tolerance(&w, &xs[t]));
                assert!(
                    (g - s).abs() <= tol,
                    "{ty} cols {cols} N {n} token {t}: vnni {g} vs scalar {s} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn vnni_q8_0_tokens_equal_single_row_bit_for_bit() {
    let Some((v, k)) = vnni() else { return };
    check_vnni(
        GgmlType::Q8_0,
        |w, x| k.dot_q8_0(w, x),
        scalar::dot_q8_0,
        |w, x, o| v.dot_q8_0_tokens(w, x, o),
    );
}

#[test]
fn vnni_q4_0_tokens_equal_single_row_bit_for_bit() {
    let Some((v, k)) = vnni() else { return };
    check_vnni(
        GgmlType::Q4_0,
        |w, x| k.dot_q4_0(w, x),
        scalar::dot_q4_0,
        |w, x, o| v.dot_q4_0_tokens(w, x, o),
    );
}

#[test]
fn offset_blocks_hold_quants_plus_128() {
    let b = BlockQ8_0 {
        d: 0.5,
        qs: std::array::from_fn(|i| [-127, -1, 0, 1, 127][i % 5]),
    };
    let u = BlockQ8_0U::from(&b);
    assert_eq!(u.d, 0.5);
    for (q, u) in b.qs.iter().zip(u.qs) {
        assert_eq!(i32::from(u), i32::from(*q) + 128);
    }
}

#[test]
fn more_than_eight_vnni_tokens_is_a_caller_bug() {
    let Some((v, _)) = vnni() else { return };
    let row = vec![0u8; 34];
    let act = [BlockQ8_0U::from(&BlockQ8_0::default())];
    let xs: [&[BlockQ8_0U]; 9] = [&act; 9];
    let message = panic_message(|| v.dot_q8_0_tokens(&row, &xs, &mut [0.0; 9]));
    assert!(message.contains("at most 8 per call"), "{message}");
}
