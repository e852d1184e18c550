//! IQ4_NL and IQ4_XS: dequantization of hand-made blocks, the scalar dots
//! against the f64 dot of the dequantized weights and the quantized
//! activations, and the AVX2 kernels (one row and up to four tokens)
//! against the scalar oracle and each other. `matmul.rs` runs both types
//! through `CpuKernels` with every other type; `dequant_reference.rs`
//! checks them against gguf-py.

mod common;

use bulkhead_kernels::avx2::Avx2;
use bulkhead_kernels::{
    BlockQ8_0, BlockQ8K, GgmlType, dequantize_row_scalar, quantize_row_q8_0, quantize_row_q8_k,
    scalar,
};
use bulkhead_testkit::{Need, skip};
use common::{Rng, dequantized, random_matrix};
use half::f16;

/// ggml's `kvalues_iq4nl`, written out here independently of the crate's copy.
const TABLE: [f32; 16] = [
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0,
    89.0, 113.0,
];

#[test]
fn iq4_nl_block_is_scale_times_table_value() {
    // Byte j holds index j (low nibble, element j) and 15 - j (high, element 16 + j).
    let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut y = [0.0f32; 32];
    dequantize_row_scalar(GgmlType::IQ4NL, &block, &mut y);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * TABLE[j], "element {j}");
        assert_eq!(y[16 + j], 0.5 * TABLE[15 - j], "element {}", 16 + j);
    }
}

#[test]
fn iq4_xs_sub_blocks_take_their_own_six_bit_scale() {
    let mut block = vec![0u8; 136];
    block[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    // Sub-block ib gets the 6-bit scale 32 + ib - 4 (so -4..=3 after the
    // offset): low nibble in scales_l, top two bits in scales_h.
    let raw: Vec<u8> = (0..8).map(|ib| 28 + ib).collect();
    let mut h = 0u16;
    for (ib, &s) in raw.iter().enumerate() {
        h |= u16::from(s >> 4) << (2 * ib);
        block[4 + ib / 2] |= (s & 0x0F) << (4 * (ib % 2));
    }
    block[2..4].copy_from_slice(&h.to_le_bytes());
    // Every nibble of sub-block ib indexes entry (ib + 3) % 16, low and high.
    for ib in 0..8 {
        let k = ((ib + 3) % 16) as u8;
        block[8 + 16 * ib..8 + 16 * (ib + 1)].fill(k | (k << 4));
    }
    let mut y = [0.0f32; 256];
    dequantize_row_scalar(GgmlType::IQ4XS, &block, &mut y);
    for (i, &v) in y.iter().enumerate() {
        let ib = i / 32;
        let want = 0.25 * (ib as f32 - 4.0) * TABLE[(ib + 3) % 16];
        assert_eq!(v, want, "element {i} (sub-block {ib})");
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

/// The activations a Q8 block list stands for, as f32.
fn q8_0_values(q: &[BlockQ8_0]) -> Vec<f64> {
    q.iter()
        .flat_map(|b| b.qs.map(|v| f64::from(v) * f64::from(b.d)))
        .collect()
}

fn q8_k_values(q: &[BlockQ8K]) -> Vec<f64> {
    q.iter()
        .flat_map(|b| b.qs.map(|v| f64::from(v) * f64::from(b.d)))
        .collect()
}

/// The scalar dots equal Σ w·x over the dequantized weights and the
/// activations the Q8 blocks hold, to f32 rounding: nothing is lost but
/// float rounding once the activations are quantized.
#[test]
fn scalar_dots_equal_the_exact_dot_of_their_inputs() {
    let mut rng = Rng::new(4);
    for cols in [256usize, 1024] {
        for _ in 0..20 {
            let x = rng.vec(cols, 3.0);
            let check = |ty: GgmlType, got: f32, xq: &[f64], row: &[u8]| {
                let w = dequantized(ty, row, 1, cols);
                let want: f64 = w.iter().zip(xq).map(|(&w, &x)| f64::from(w) * x).sum();
                let mag: f64 = w
                    .iter()
                    .zip(xq)
                    .map(|(&w, &x)| (f64::from(w) * x).abs())
                    .sum();
                assert!(
                    (f64::from(got) - want).abs() <= 1e-6 * mag + 1e-9,
                    "{ty} cols {cols}: {got} vs {want}"
                );
            };
            let row = random_matrix(&mut rng, GgmlType::IQ4NL, 1, cols);
            let q = q8_0(&x);
            check(
                GgmlType::IQ4NL,
                scalar::dot_iq4_nl(&row, &q),
                &q8_0_values(&q),
                &row,
            );
            let row = random_matrix(&mut rng, GgmlType::IQ4XS, 1, cols);
            let q = q8_k(&x);
            check(
                GgmlType::IQ4XS,
                scalar::dot_iq4_xs(&row, &q),
                &q8_k_values(&q),
                &row,
            );
        }
    }
}

fn avx2() -> Option<Avx2> {
    let k = Avx2::detect();
    if k.is_none() {
        skip(Need::Isa("avx2"), "this CPU lacks avx2/fma/f16c");
    }
    k
}

/// For N in 1..=4 tokens and odd, even and single block counts: the
/// multi-token kernel equals the one-row AVX2 kernel bit for bit (batched
/// decode depends on it), and both are within float re-association
/// (1e-6 of Σ|w||x|) of the scalar oracle.
fn check_avx2<B>(
    ty: GgmlType,
    quantize: impl Fn(&[f32]) -> Vec<B>,
    oracle: impl Fn(&[u8], &[B]) -> f32,
    single: impl Fn(&[u8], &[B]) -> f32,
    multi: impl Fn(&[u8], &[&[B]], &mut [f32]),
) {
    let block = ty.block_elements();
    for blocks in [1usize, 2, 3, 16, 17] {
        let cols = blocks * block;
        for n in 1..=Avx2::MAX_TOKENS {
            let mut rng = Rng::new((cols * 10 + n) as u64);
            let row = random_matrix(&mut rng, ty, 1, cols);
            let w = dequantized(ty, &row, 1, cols);
            let mut xs: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(cols, 3.0)).collect();
            // Every quant at ±127, the extreme of the sign trick.
            xs[n - 1] = (0..cols)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            let acts: Vec<Vec<B>> = xs.iter().map(|x| quantize(x)).collect();
            let refs: Vec<&[B]> = acts.iter().map(Vec::as_slice).collect();
            let mut got = vec![f32::NAN; n];
            multi(&row, &refs, &mut got);
            for (t, (&g, a)) in got.iter().zip(&acts).enumerate() {
                let one = single(&row, a);
                assert_eq!(
                    g.to_bits(),
                    one.to_bits(),
                    "{ty} cols {cols} N {n} token {t}: tokens {g} vs one row {one}"
                );
                let s = oracle(&row, a);
                let mag: f64 = w
                    .iter()
                    .zip(&xs[t])
                    .map(|(w, x)| f64::from((w * x).abs()))
                    .sum();
                let tol = (1e-6 * mag + 1e-12) as f32;
                assert!(
                    (g - s).abs() <= tol,
                    "{ty} cols {cols} N {n} token {t}: avx2 {g} vs scalar {s} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn iq4_nl_avx2_matches_scalar_and_tokens_match_one_row() {
    let Some(k) = avx2() else { return };
    check_avx2(
        GgmlType::IQ4NL,
        q8_0,
        scalar::dot_iq4_nl,
        |w, x| k.dot_iq4_nl(w, x),
        |w, x, o| k.dot_iq4_nl_tokens(w, x, o),
    );
}

#[test]
fn iq4_xs_avx2_matches_scalar_and_tokens_match_one_row() {
    let Some(k) = avx2() else { return };
    check_avx2(
        GgmlType::IQ4XS,
        q8_k,
        scalar::dot_iq4_xs,
        |w, x| k.dot_iq4_xs(w, x),
        |w, x, o| k.dot_iq4_xs_tokens(w, x, o),
    );
}
