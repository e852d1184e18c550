//! Matmul: AVX2 against the scalar oracle, quantized results against f32 math
//! on the dequantized weights, thread-count independence and bad input.

mod common;

use bulkhead_testkit::{Need, skip};
use std::sync::LazyLock;

use bulkhead_kernels::{CpuKernels, GgmlType, Isa, KernelError, QuantMatrix};
use common::{Rng, dequantized, random_matrix};
use proptest::prelude::*;

static SCALAR_1: LazyLock<CpuKernels> = LazyLock::new(|| CpuKernels::new(1, Isa::Scalar).unwrap());
static SCALAR_3: LazyLock<CpuKernels> = LazyLock::new(|| CpuKernels::new(3, Isa::Scalar).unwrap());
static AVX2_1: LazyLock<Option<CpuKernels>> = LazyLock::new(|| CpuKernels::new(1, Isa::Avx2).ok());
static AVX2_3: LazyLock<Option<CpuKernels>> = LazyLock::new(|| CpuKernels::new(3, Isa::Avx2).ok());
static VNNI_1: LazyLock<Option<CpuKernels>> =
    LazyLock::new(|| CpuKernels::new(1, Isa::Avx512Vnni).ok());
static VNNI_3: LazyLock<Option<CpuKernels>> =
    LazyLock::new(|| CpuKernels::new(3, Isa::Avx512Vnni).ok());

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    data: Vec<u8>,
    x: Vec<f32>,
    /// Dequantized weights, row-major.
    w: Vec<f32>,
}

impl Case {
    fn new(ty: GgmlType, rows: usize, cols: usize, n_tokens: usize, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let data = random_matrix(&mut rng, ty, rows, cols);
        let mut x = rng.vec(n_tokens * cols, 2.0);
        // An outlier per token, as real activations have.
        for t in 0..n_tokens {
            x[t * cols + (seed as usize + 7 * t) % cols] = 9.0;
        }
        let w = dequantized(ty, &data, rows, cols);
        Case {
            ty,
            rows,
            cols,
            n_tokens,
            data,
            x,
            w,
        }
    }

    fn matrix(&self) -> QuantMatrix<'_> {
        QuantMatrix::new(self.ty, &self.data, self.rows, self.cols).unwrap()
    }

    fn run(&self, k: &CpuKernels) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.n_tokens * self.rows];
        k.matmul(&self.matrix(), &self.x, self.n_tokens, &mut out);
        out
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.w[r * self.cols..(r + 1) * self.cols]
    }

    fn token(&self, t: usize) -> &[f32] {
        &self.x[t * self.cols..(t + 1) * self.cols]
    }

    /// Σ |w||x| for (token, row): the scale float rounding is relative to.
    fn magnitude(&self, t: usize, r: usize) -> f64 {
        let w = self.row(r);
        let x = self.token(t);
        w.iter().zip(x).map(|(w, x)| f64::from((w * x).abs())).sum()
    }

    /// Elements per activation block for this weight type (0: f32 activations).
    fn act_block(&self) -> usize {
        match self.ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::IQ4XS => 256,
            _ => 32,
        }
    }

    /// How far the true dot of the dequantized weights may be from ours:
    /// each activation moves by at most half a quantization step (amax/127
    /// of its block) plus the f16 rounding of the block scale.
    fn quantization_bound(&self, t: usize, r: usize) -> f64 {
        self.quantization_bound_for(self.act_block(), t, r)
    }

    /// [`Case::quantization_bound`] with activations quantized in blocks of
    /// `block` (the VNNI panels quantize every type's in blocks of 32).
    fn quantization_bound_for(&self, block: usize, t: usize, r: usize) -> f64 {
        let mag = self.magnitude(t, r);
        if block == 0 {
            return 1e-5 * mag + 1e-6;
        }
        let w = self.row(r);
        let x = self.token(t);
        let mut bound = 0.0f64;
        for (wb, xb) in w.chunks(block).zip(x.chunks(block)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let step = f64::from(amax) / 127.0;
            let wsum: f64 = wb.iter().map(|v| f64::from(v.abs())).sum();
            bound += wsum * step * 0.5 * 1.01;
        }
        bound + 1e-3 * mag + 1e-5
    }
}

fn reference_dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter()
        .zip(x)
        .map(|(&w, &x)| f64::from(w) * f64::from(x))
        .sum()
}

fn check_case(case: &Case) {
    let scalar = case.run(&SCALAR_1);
    for t in 0..case.n_tokens {
        for r in 0..case.rows {
            let got = f64::from(scalar[t * case.rows + r]);
            let want = reference_dot(case.row(r), case.token(t));
            let bound = case.quantization_bound(t, r);
            assert!(
                (got - want).abs() <= bound,
                "{} scalar token {t} row {r}: {got} vs f64 dot of dequantized {want} (bound {bound})",
                case.ty
            );
        }
    }
    assert_bit_identical(&scalar, &case.run(&SCALAR_3), case, "scalar 1 vs 3 threads");
    let (Some(avx1), Some(avx3)) = (AVX2_1.as_ref(), AVX2_3.as_ref()) else {
        skip(
            Need::Isa("avx2"),
            "the AVX2 comparison: this CPU lacks avx2/fma/f16c",
        );
        return;
    };
    let fast = case.run(avx1);
    for t in 0..case.n_tokens {
        for r in 0..case.rows {
            let (s, f) = (scalar[t * case.rows + r], fast[t * case.rows + r]);
            let tol = 2e-6 * case.magnitude(t, r) + 1e-6;
            assert!(
                f64::from((s - f).abs()) <= tol,
                "{} token {t} row {r}: scalar {s} vs avx2 {f} (tol {tol})",
                case.ty
            );
        }
    }
    assert_bit_identical(&fast, &case.run(avx3), case, "avx2 1 vs 3 threads");
    let (Some(vnni1), Some(vnni3)) = (VNNI_1.as_ref(), VNNI_3.as_ref()) else {
        skip(
            Need::Isa("avx512vnni"),
            "the AVX-512 VNNI comparison: this CPU lacks avx512f/avx512vl/avx512vnni",
        );
        return;
    };
    let vnni = case.run(vnni1);
    assert_bit_identical(&vnni, &case.run(vnni3), case, "avx512vnni 1 vs 3 threads");
    if vnni1.uses_panels(case.ty, case.cols, case.n_tokens) && case.ty != GgmlType::F16 {
        // The VNNI panels: the same quantized activations, exact integer
        // sums, float rounding in another order.
        check_against_reference(case, &vnni, case.act_block(), "avx512vnni panels");
        for t in 0..case.n_tokens {
            for r in 0..case.rows {
                let (s, v) = (scalar[t * case.rows + r], vnni[t * case.rows + r]);
                let tol = 2e-6 * case.magnitude(t, r) + 1e-6;
                assert!(
                    f64::from((s - v).abs()) <= tol,
                    "{} token {t} row {r}: scalar {s} vs avx512vnni panels {v} (tol {tol})",
                    case.ty
                );
            }
        }
    } else {
        // Its eight-token Q8_0/Q4_0 kernels keep the AVX2 kernels' order of
        // summation, and the wide F16 panels run each (row, token) through
        // the AVX2 panels' chain of FMAs, so every other call gives the
        // same bits as AVX2.
        assert_bit_identical(&fast, &vnni, case, "avx2 vs avx512vnni");
    }
}

/// Every output of `got` against the f64 dot of the dequantized weights,
/// within the error of activations quantized in blocks of `block`.
fn check_against_reference(case: &Case, got: &[f32], block: usize, what: &str) {
    for t in 0..case.n_tokens {
        for r in 0..case.rows {
            let got = f64::from(got[t * case.rows + r]);
            let want = reference_dot(case.row(r), case.token(t));
            let bound = case.quantization_bound_for(block, t, r);
            assert!(
                (got - want).abs() <= bound,
                "{} {what} token {t} row {r}: {got} vs f64 dot of dequantized {want} (bound {bound})",
                case.ty
            );
        }
    }
}

fn assert_bit_identical(a: &[f32], b: &[f32], case: &Case, what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{} {what}: output {i} {x} vs {y}",
            case.ty
        );
    }
}

#[test]
fn every_type_matches_reference_on_a_fixed_shape() {
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        check_case(&Case::new(ty, 67, 512, 3, 1000 + i as u64));
    }
}

#[test]
fn row_chunks_cover_large_matrices() {
    // More rows than one pool task takes, and a single token (the decode path).
    for ty in [GgmlType::Q4_0, GgmlType::Q6K, GgmlType::F16] {
        check_case(&Case::new(ty, 300, 256, 1, 77));
    }
}

#[test]
fn large_matmuls_take_the_pool_path() {
    // Over 2^20 multiply-adds, so three threads really split the rows (smaller
    // calls stay on the calling thread): decode and an 8-token prefill.
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        check_case(&Case::new(ty, 300, 4096, 1, 78));
    }
    check_case(&Case::new(GgmlType::Q4K, 70, 2048, 8, 79));
}

#[test]
fn prefill_token_counts_match_scalar() {
    // 1..=9 tokens: whole groups of four, remainders of 1..3, and decode.
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        for n_tokens in 1..=9 {
            check_case(&Case::new(
                ty,
                37,
                512,
                n_tokens,
                5000 + 16 * i as u64 + n_tokens as u64,
            ));
        }
    }
}

#[test]
fn grouped_matmul_matches_per_token_matmul() {
    let Some(avx) = AVX2_3.as_ref() else {
        skip(Need::Isa("avx2"), "this CPU lacks avx2/fma/f16c");
        return;
    };
    for ty in [
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
    ] {
        let case = Case::new(ty, 70, 768, 7, 31);
        let grouped = case.run(avx);
        let mut per_token = vec![f32::NAN; grouped.len()];
        avx.matmul_per_token(&case.matrix(), &case.x, case.n_tokens, &mut per_token);
        for t in 0..case.n_tokens {
            for r in 0..case.rows {
                let (g, p) = (grouped[t * case.rows + r], per_token[t * case.rows + r]);
                let tol = 1e-6 * case.magnitude(t, r) + 1e-9;
                assert!(
                    f64::from((g - p).abs()) <= tol,
                    "{ty} token {t} row {r}: grouped {g} vs per-token {p} (tol {tol})"
                );
            }
        }
    }
}

/// Batched decode relies on this: each row of a `matmul_row_exact` call is
/// bit for bit what a one-token `matmul` gives, for every type, on both ISAs.
#[test]
fn row_exact_matmul_equals_one_token_calls_bit_for_bit() {
    let kernels = [
        Some(&*SCALAR_3),
        AVX2_1.as_ref(),
        AVX2_3.as_ref(),
        VNNI_1.as_ref(),
        VNNI_3.as_ref(),
    ];
    for k in kernels.into_iter().flatten() {
        for ty in GgmlType::ALL {
            let cols = if ty.block_elements() == 256 { 512 } else { 768 };
            let case = Case::new(ty, 70, cols, 7, 41);
            let mut rows = vec![f32::NAN; case.n_tokens * case.rows];
            k.matmul_row_exact(&case.matrix(), &case.x, case.n_tokens, &mut rows);
            for t in 0..case.n_tokens {
                let mut one = vec![f32::NAN; case.rows];
                let x = &case.x[t * cols..(t + 1) * cols];
                k.matmul(&case.matrix(), x, 1, &mut one);
                let got = &rows[t * case.rows..(t + 1) * case.rows];
                let same = got
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} {:?}×{} token {t}", k.isa(), k.threads());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn matmul_agrees_across_isas_and_threads(
        ty_index in 0..GgmlType::ALL.len(),
        rows in 1usize..70,
        blocks in 1usize..4,
        n_tokens in 1usize..5,
        seed in any::<u64>(),
    ) {
        check_case(&Case::new(GgmlType::ALL[ty_index], rows, blocks * 256, n_tokens, seed));
    }
}

#[test]
fn zero_tokens_is_a_no_op() {
    let case = Case::new(GgmlType::Q8_0, 4, 32, 1, 5);
    let mut out: [f32; 0] = [];
    SCALAR_1.matmul(&case.matrix(), &[], 0, &mut out);
}

#[test]
fn bad_shapes_are_errors_naming_the_problem() {
    let data = vec![0u8; 18 * 4];
    let e = QuantMatrix::new(GgmlType::Q4_0, &data, 3, 32).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::DataLength {
                expected: 54,
                actual: 72,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("Q4_0") && msg.contains("54") && msg.contains("72"),
        "{msg}"
    );

    let e = QuantMatrix::new(GgmlType::Q4K, &data, 1, 100).unwrap_err();
    assert!(
        matches!(e, KernelError::RowLength { cols: 100, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("100") && msg.contains("Q4_K"), "{msg}");

    let e = QuantMatrix::new(GgmlType::F32, &data, usize::MAX, usize::MAX / 2).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::TooLarge { .. } | KernelError::RowLength { .. }
        ),
        "{e:?}"
    );

    assert_eq!(
        CpuKernels::new(0, Isa::Scalar).unwrap_err(),
        KernelError::ZeroThreads
    );
    assert!(QuantMatrix::new(GgmlType::Q4_0, &data, 4, 32).is_ok());
}

#[test]
fn kernels_report_their_configuration() {
    assert_eq!(SCALAR_3.threads(), 3);
    assert_eq!(SCALAR_3.isa(), Isa::Scalar);
    if Isa::Avx2.is_available() {
        assert_eq!(AVX2_1.as_ref().unwrap().isa(), Isa::Avx2);
    } else {
        assert_eq!(
            CpuKernels::new(1, Isa::Avx2).unwrap_err(),
            KernelError::IsaUnavailable { isa: Isa::Avx2 }
        );
    }
    if Isa::Avx512Vnni.is_available() {
        assert_eq!(Isa::detect(), Isa::Avx512Vnni);
        assert_eq!(VNNI_3.as_ref().unwrap().isa(), Isa::Avx512Vnni);
    } else {
        let e = CpuKernels::new(1, Isa::Avx512Vnni).unwrap_err();
        assert_eq!(
            e,
            KernelError::IsaUnavailable {
                isa: Isa::Avx512Vnni
            }
        );
        assert!(e.to_string().contains("avx512vnni"), "{e}");
        let best = if Isa::Avx2.is_available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        };
        assert_eq!(Isa::detect(), best);
    }
}

/// The VNNI tiles take eight tokens per call: token counts around and
/// between multiples of eight (and of the AVX2 kernels' four), row counts
/// that split unevenly into pool tasks and odd block counts must all give
/// each token exactly what a one-token call gives it in a row-exact call,
/// and what the dequantized weights give in a prefill call (panels).
#[test]
fn vnni_tiles_equal_one_token_calls_on_edge_shapes() {
    let (Some(vnni1), Some(vnni3)) = (VNNI_1.as_ref(), VNNI_3.as_ref()) else {
        skip(
            Need::Isa("avx512vnni"),
            "this CPU lacks avx512f/avx512vl/avx512vnni",
        );
        return;
    };
    let mut seed = 9000;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        for (rows, cols) in [(1, 32), (7, 96), (65, 800), (130, 4096)] {
            for n_tokens in [2, 7, 8, 9, 15, 16, 17, 33] {
                seed += 1;
                let case = Case::new(ty, rows, cols, n_tokens, seed);
                let mut one = vec![f32::NAN; rows];
                let mut want = Vec::with_capacity(n_tokens * rows);
                for t in 0..n_tokens {
                    vnni1.matmul(&case.matrix(), case.token(t), 1, &mut one);
                    want.extend_from_slice(&one);
                }
                for k in [vnni1, vnni3] {
                    let mut got = vec![f32::NAN; n_tokens * rows];
                    k.matmul_row_exact(&case.matrix(), &case.x, n_tokens, &mut got);
                    let what = format!("row_exact {rows}×{cols} {n_tokens} tokens");
                    assert_bit_identical(&want, &got, &case, &what);
                    k.matmul(&case.matrix(), &case.x, n_tokens, &mut got);
                    let what = format!("matmul {rows}×{cols} {n_tokens} tokens");
                    if k.uses_panels(ty, cols, n_tokens) {
                        check_against_reference(&case, &got, case.act_block(), &what);
                    } else {
                        assert_bit_identical(&want, &got, &case, &what);
                    }
                }
            }
        }
    }
}

/// The panels on the shapes that stress them: row counts that leave a
/// partial panel (or panel pair) or split unevenly into tasks, token counts
/// around the four a kernel call takes (F16: six with AVX2, twelve with
/// AVX-512), every packed type,
/// one and three threads (equal bits), against the f64 product of the
/// dequantized weights.
#[test]
fn vnni_panels_match_the_dequantized_product_on_edge_shapes() {
    let (Some(vnni1), Some(vnni3)) = (VNNI_1.as_ref(), VNNI_3.as_ref()) else {
        skip(
            Need::Isa("avx512vnni"),
            "this CPU lacks avx512f/avx512vl/avx512vnni",
        );
        return;
    };
    let mut seed = 12_000;
    let types = [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];
    for ty in types {
        for (rows, blocks) in [(1, 1), (7, 3), (8, 1), (9, 2), (17, 1), (65, 3), (300, 2)] {
            // F16 "blocks" are single elements: give its rows some width.
            let cols = blocks * ty.block_elements().max(32);
            for n_tokens in [4, 5, 7, 8, 9, 12, 13, 33] {
                seed += 1;
                let case = Case::new(ty, rows, cols, n_tokens, seed);
                assert!(
                    vnni1.uses_panels(ty, cols, n_tokens),
                    "{ty} {n_tokens} tokens"
                );
                let got = case.run(vnni1);
                let what = format!("panels {rows}×{cols} {n_tokens} tokens");
                check_against_reference(&case, &got, case.act_block(), &what);
                assert_bit_identical(&got, &case.run(vnni3), &case, &what);
            }
        }
    }
}

/// `matmuls` runs several matrices over one input as one call (q, k, v of a
/// layer; gate and up): each output must be bit for bit what its own
/// `matmul` (or `matmul_row_exact`) call gives, whatever mix of types and
/// row counts shares the call, on every ISA and thread count.
#[test]
fn matmuls_of_one_input_equal_separate_calls() {
    use bulkhead_kernels::TokenGrouping;
    let kernels = [
        Some(&*SCALAR_1),
        Some(&*SCALAR_3),
        AVX2_3.as_ref(),
        VNNI_1.as_ref(),
        VNNI_3.as_ref(),
    ];
    let cols = 512;
    for n_tokens in [1, 3, 9] {
        let mats = [
            Case::new(GgmlType::Q4K, 70, cols, n_tokens, 61),
            Case::new(GgmlType::Q6K, 20, cols, n_tokens, 62),
            Case::new(GgmlType::F16, 33, cols, n_tokens, 63),
            Case::new(GgmlType::Q8_0, 300, cols, n_tokens, 64),
        ];
        let x = &mats[0].x;
        for k in kernels.into_iter().flatten() {
            for grouping in [TokenGrouping::Several, TokenGrouping::Exact] {
                let mut outs: Vec<Vec<f32>> = mats
                    .iter()
                    .map(|m| vec![f32::NAN; n_tokens * m.rows])
                    .collect();
                let mut pairs: Vec<_> = mats
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(m, o)| (m.matrix(), o.as_mut_slice()))
                    .collect();
                k.matmuls(x, n_tokens, &mut pairs, grouping);
                for (m, got) in mats.iter().zip(&outs) {
                    let mut want = vec![f32::NAN; got.len()];
                    match grouping {
                        TokenGrouping::Exact => {
                            k.matmul_row_exact(&m.matrix(), x, n_tokens, &mut want)
                        }
                        _ => k.matmul(&m.matrix(), x, n_tokens, &mut want),
                    }
                    let what = format!(
                        "{:?}×{} {grouping:?} {n_tokens} tokens",
                        k.isa(),
                        k.threads()
                    );
                    assert_bit_identical(&want, got, m, &what);
                }
            }
        }
    }
}

/// Packed weights (VNNI: Q4_0, Q5_0, Q8_0, Q4_K, Q6_K): every call shape, decode to prefill, against the
/// scalar oracle on the same activations; and each token's row bits the
/// same alone or batched, on one thread or three (batched decode needs it).
#[test]
fn packed_weights_match_scalar_and_are_row_exact() {
    let (Some(vnni1), Some(vnni3)) = (VNNI_1.as_ref(), VNNI_3.as_ref()) else {
        skip(
            Need::Isa("avx512vnni"),
            "this CPU lacks avx512f/avx512vl/avx512vnni",
        );
        return;
    };
    let mut seed = 20_000;
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ];
    for ty in types {
        for (rows, blocks) in [(1, 1), (7, 3), (8, 2), (9, 8), (65, 25), (300, 64usize)] {
            // K-quant blocks are 256 wide: fewer of them for the same widths.
            let cols = if ty.block_elements() == 256 {
                256 * blocks.div_ceil(8)
            } else {
                32 * blocks
            };
            for n_tokens in [1, 2, 4, 5, 9, 33] {
                seed += 1;
                let case = Case::new(ty, rows, cols, n_tokens, seed);
                let packed = vnni1
                    .pack(&case.matrix())
                    .expect("Q4_0, Q5_0, Q8_0, Q4_K and Q6_K pack");
                let m = case.matrix().with_packed(&packed);
                let what = format!("packed {rows}×{cols} {n_tokens} tokens");
                let mut got = vec![f32::NAN; n_tokens * rows];
                vnni1.matmul(&m, &case.x, n_tokens, &mut got);
                let scalar = case.run(&SCALAR_1);
                for t in 0..n_tokens {
                    for r in 0..rows {
                        let (s, p) = (scalar[t * rows + r], got[t * rows + r]);
                        let tol = 2e-6 * case.magnitude(t, r) + 1e-6;
                        assert!(
                            f64::from((s - p).abs()) <= tol,
                            "{ty} {what} token {t} row {r}: scalar {s} vs packed {p}"
                        );
                    }
                }
                let mut alone = Vec::with_capacity(got.len());
                let mut one = vec![f32::NAN; rows];
                for t in 0..n_tokens {
                    vnni1.matmul(&m, case.token(t), 1, &mut one);
                    alone.extend_from_slice(&one);
                }
                assert_bit_identical(&alone, &got, &case, &what);
                let mut exact = vec![f32::NAN; got.len()];
                vnni3.matmul_row_exact(&m, &case.x, n_tokens, &mut exact);
                assert_bit_identical(&alone, &exact, &case, &what);
            }
        }
    }
    // Kernels without VNNI have no packed form, and ignore one attached.
    if let Some(avx2) = AVX2_1.as_ref() {
        let case = Case::new(GgmlType::Q8_0, 9, 64, 3, 7);
        assert!(avx2.pack(&case.matrix()).is_none());
        let packed = vnni1.pack(&case.matrix()).unwrap();
        let mut with = vec![f32::NAN; 27];
        avx2.matmul(&case.matrix().with_packed(&packed), &case.x, 3, &mut with);
        assert_bit_identical(
            &case.run(avx2),
            &with,
            &case,
            "avx2 ignores the packed form",
        );
    }
}
