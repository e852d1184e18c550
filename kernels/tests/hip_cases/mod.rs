//! Parity cases for the HIP kernels: each launches one kernel on a
//! [`KernelDevice`] with random inputs and edge shapes and compares the result
//! with the CPU scalar oracle, within the tolerance stated beside it. The same
//! bodies run on the CPU emulation of the kernels (kernels/tests/hip_emulated.rs,
//! wave 32 and 64, every machine) and on a real device where one exists.
//!
//! Tolerances: where both sides do the same f32 operations in the same order
//! (dequantization, activation quantization, add) results must be equal.
//! Where only the summation order differs, the bound is the classic
//! worst case for reordering an n-term f32 sum, n·ε·Σ|term|. Where the
//! device's exp/sqrt may differ from the host libm by a few ulp (softmax,
//! SiLU, attention), a few ε relative to the output's scale.
#![allow(dead_code)] // each test binary uses a different subset

use bulkhead_kernels::hip::{self, KernelArgs, names};
use bulkhead_kernels::{
    BlockQ8_0, BlockQ8K, CpuKernels, GgmlType, Isa, PagedSeq, PagedShape, RopeStyle, ScoreMask,
    dequantize_row_scalar, quantize_row_q8_0, quantize_row_q8_k, scalar,
};

use crate::common::{Rng, random_matrix};

pub use bulkhead_kernels::hip::KernelDevice;

/// The few calls the cases make, panicking with the device's message.
trait Dev {
    fn upload(&self, bytes: &[u8]) -> u64;
    fn download(&self, addr: u64, len: usize) -> Vec<u8>;
    fn run(&self, kernel: &str, grid: [u32; 3], threads: u32, args: &dyn KernelArgs);
}

impl<D: KernelDevice + ?Sized> Dev for D {
    fn upload(&self, bytes: &[u8]) -> u64 {
        let addr = self.alloc(bytes.len()).unwrap_or_else(|e| panic!("{e}"));
        self.write(addr, bytes).unwrap_or_else(|e| panic!("{e}"));
        addr
    }
    fn download(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.read(addr, &mut out).unwrap_or_else(|e| panic!("{e}"));
        out
    }
    fn run(&self, kernel: &str, grid: [u32; 3], threads: u32, args: &dyn KernelArgs) {
        self.launch(kernel, grid, threads, &args.to_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn zeros(dev: &dyn KernelDevice, floats: usize) -> u64 {
    dev.upload(&vec![0u8; 4 * floats])
}

fn read_f32(dev: &dyn KernelDevice, addr: u64, n: usize) -> Vec<f32> {
    f32s(&dev.download(addr, 4 * n))
}

/// `|got - want| <= tol[i]` for every element, naming the first that is not.
fn assert_close(got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        assert!(
            (g - w).abs() <= t || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: device {g}, CPU {w}, tolerance {t}"
        );
    }
}

fn blocks(n: u64, per_block: u32) -> u32 {
    u32::try_from(n.div_ceil(u64::from(per_block))).expect("grid fits u32")
}

/// Types whose dequantization the embedding kernel implements: all of them.
const ALL_TYPES: [GgmlType; 13] = GgmlType::ALL;

/// Embedding rows of every type are bit-identical to `dequantize_row_scalar`,
/// several tokens (one repeated) in one launch.
pub fn embedding_every_type(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(7);
    for ty in ALL_TYPES {
        let (rows, cols) = (3, 2 * ty.block_elements().max(32));
        let table = random_matrix(&mut rng, ty, rows, cols);
        let row_bytes = table.len() / rows;
        let t = dev.upload(&table);
        let tokens = [rows - 1, 0, rows - 1];
        let ids: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as u32).to_le_bytes())
            .collect();
        let out = zeros(dev, tokens.len() * cols);
        let args = hip::EmbeddingArgs {
            table: t,
            tokens: dev.upload(&ids),
            out,
            row_bytes: row_bytes as u64,
            cols: cols as u32,
            ty: ty.id(),
        };
        dev.run(
            names::EMBEDDING,
            [blocks(cols as u64, 256), tokens.len() as u32, 1],
            256,
            &args,
        );
        let got = read_f32(dev, out, tokens.len() * cols);
        for (r, &token) in tokens.iter().enumerate() {
            let mut want = vec![0.0; cols];
            dequantize_row_scalar(ty, &table[token * row_bytes..][..row_bytes], &mut want);
            assert_eq!(
                got[r * cols..(r + 1) * cols]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "embedding {ty} row {token} (output row {r})"
            );
        }
    }
}

/// Activation quantization is bit-identical to the CPU's (same scales, same
/// integers), including all-zero blocks and a block holding an infinity-free
/// extreme.
pub fn quantize_matches_cpu(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(11);
    let (n_tokens, cols) = (3usize, 512usize);
    let mut x = rng.vec(n_tokens * cols, 4.0);
    x[..256].fill(0.0); // an all-zero Q8_K block and eight all-zero Q8_0 blocks
    x[300] = 1.0e4;
    let xd = dev.upload(&f32_bytes(&x));

    let nb = n_tokens * cols / 32;
    let out = dev.upload(&vec![0u8; nb * hip::Q8_0_DEVICE_BYTES]);
    let args = hip::QuantizeArgs {
        x: xd,
        out,
        n_tokens: n_tokens as u32,
        cols: cols as u32,
    };
    dev.run(
        names::QUANTIZE_Q8_0,
        [blocks(nb as u64, 64), 1, 1],
        64,
        &args,
    );
    let got = dev.download(out, nb * hip::Q8_0_DEVICE_BYTES);
    let mut want = vec![BlockQ8_0::default(); nb];
    quantize_row_q8_0(&x, &mut want);
    for (i, (g, w)) in got
        .chunks_exact(hip::Q8_0_DEVICE_BYTES)
        .zip(&want)
        .enumerate()
    {
        assert_eq!(
            f32::from_le_bytes(g[..4].try_into().unwrap()).to_bits(),
            w.d.to_bits(),
            "Q8_0 block {i} d"
        );
        let qs: Vec<i8> = g[4..36].iter().map(|&b| b as i8).collect();
        assert_eq!(qs, w.qs, "Q8_0 block {i} quants");
    }

    let nb = n_tokens * cols / 256;
    let out = dev.upload(&vec![0u8; nb * hip::Q8_K_DEVICE_BYTES]);
    let args = hip::QuantizeArgs {
        x: xd,
        out,
        n_tokens: n_tokens as u32,
        cols: cols as u32,
    };
    dev.run(names::QUANTIZE_Q8_K, [1, 1, 1], 64, &args);
    let got = dev.download(out, nb * hip::Q8_K_DEVICE_BYTES);
    let mut want = vec![BlockQ8K::default(); nb];
    quantize_row_q8_k(&x, &mut want);
    for (i, (g, w)) in got
        .chunks_exact(hip::Q8_K_DEVICE_BYTES)
        .zip(&want)
        .enumerate()
    {
        assert_eq!(
            f32::from_le_bytes(g[..4].try_into().unwrap()).to_bits(),
            w.d.to_bits(),
            "Q8_K block {i} d"
        );
        let qs: Vec<i8> = g[4..260].iter().map(|&b| b as i8).collect();
        assert_eq!(qs, w.qs, "Q8_K block {i} quants");
        let sums: Vec<i16> = g[260..292]
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(sums, w.bsums, "Q8_K block {i} sums");
    }
}

/// Σ|w|·|x| of one row against one token: the scale of its reordering error.
fn l1(w_row: &[f32], x: &[f32]) -> f32 {
    w_row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

/// The decode matvecs against the scalar dot of the same weights and the
/// same quantized activations. Shapes: one row, rows not a multiple of the
/// waves per block, one and three tokens, rows of one block and of several.
pub fn matvec_matches_scalar_dot(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(23);
    let cases = [
        (GgmlType::F16, names::MATVEC_F16),
        (GgmlType::Q8_0, names::MATVEC_Q8_0),
        (GgmlType::Q4_0, names::MATVEC_Q4_0),
        (GgmlType::Q4K, names::MATVEC_Q4_K),
        (GgmlType::Q6K, names::MATVEC_Q6_K),
        (GgmlType::F32, names::MATVEC_DEQUANT),
        (GgmlType::BF16, names::MATVEC_DEQUANT),
        (GgmlType::Q4_1, names::MATVEC_DEQUANT),
        (GgmlType::Q5_0, names::MATVEC_DEQUANT),
        (GgmlType::Q5_1, names::MATVEC_DEQUANT),
        (GgmlType::Q5K, names::MATVEC_DEQUANT),
        (GgmlType::IQ4NL, names::MATVEC_DEQUANT),
        (GgmlType::IQ4XS, names::MATVEC_DEQUANT),
    ];
    for (ty, kernel) in cases {
        let be = ty.block_elements().max(32);
        let col_options = if ty == GgmlType::F16 {
            vec![be * 3, 33 * 3]
        } else {
            vec![be, be * 3]
        };
        for cols in col_options {
            // 11 tokens: a full group of MATVEC_TOKENS and a partial one.
            for (rows, n_tokens) in [(1usize, 1usize), (7, 1), (13, 3), (5, 11)] {
                let w = random_matrix(&mut rng, ty, rows, cols);
                let x = rng.vec(n_tokens * cols, 2.0);
                let row_bytes = w.len() / rows;
                let quantized = matches!(
                    ty,
                    GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4K | GgmlType::Q6K
                );
                let (x_dev, q8_0, q8_k) =
                    device_activations(dev, ty, &x, n_tokens, cols, quantized);
                let out = zeros(dev, rows * n_tokens);
                let args = hip::MatArgs {
                    w: dev.upload(&w),
                    x: x_dev,
                    out,
                    row_bytes: row_bytes as u64,
                    rows: rows as u32,
                    cols: cols as u32,
                    n_tokens: n_tokens as u32,
                    ty: ty.id(),
                };
                // 256 threads: 4 rows per block on wave 64, 8 on wave 32.
                let grid = [
                    blocks(rows as u64, 4),
                    blocks(n_tokens as u64, hip::MATVEC_TOKENS),
                    1,
                ];
                dev.run(kernel, grid, 256, &args);
                let got = read_f32(dev, out, rows * n_tokens);
                // Each token's row is bit for bit what it is alone (batched
                // decode relies on it): the last token by itself.
                if n_tokens > 1 {
                    let last = n_tokens - 1;
                    let one = zeros(dev, rows);
                    let x_last = match ty {
                        GgmlType::Q8_0 | GgmlType::Q4_0 => {
                            args.x + (last * cols / 32 * hip::Q8_0_DEVICE_BYTES) as u64
                        }
                        GgmlType::Q4K | GgmlType::Q6K => {
                            args.x + (last * cols / 256 * hip::Q8_K_DEVICE_BYTES) as u64
                        }
                        _ => args.x + (last * cols * 4) as u64,
                    };
                    let alone = hip::MatArgs {
                        x: x_last,
                        out: one,
                        n_tokens: 1,
                        ..args
                    };
                    dev.run(kernel, [blocks(rows as u64, 4), 1, 1], 256, &alone);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&read_f32(dev, one, rows)),
                        bits(&got[last * rows..]),
                        "{kernel} {ty} {rows}x{cols}: token {last} alone"
                    );
                }
                let mut want = vec![0.0f32; rows * n_tokens];
                let mut scale = vec![0.0f32; rows * n_tokens];
                let per_token_0 = cols / 32;
                let per_token_k = cols / 256;
                for t in 0..n_tokens {
                    let xt = &x[t * cols..][..cols];
                    for r in 0..rows {
                        let wr = &w[r * row_bytes..][..row_bytes];
                        want[t * rows + r] = match ty {
                            GgmlType::Q8_0 => {
                                scalar::dot_q8_0(wr, &q8_0[t * per_token_0..][..per_token_0])
                            }
                            GgmlType::Q4_0 => {
                                scalar::dot_q4_0(wr, &q8_0[t * per_token_0..][..per_token_0])
                            }
                            GgmlType::Q4K => {
                                scalar::dot_q4k(wr, &q8_k[t * per_token_k..][..per_token_k])
                            }
                            GgmlType::Q6K => {
                                scalar::dot_q6k(wr, &q8_k[t * per_token_k..][..per_token_k])
                            }
                            _ => {
                                let mut wf = vec![0.0; cols];
                                dequantize_row_scalar(ty, wr, &mut wf);
                                wf.iter().zip(xt).map(|(a, b)| a * b).sum()
                            }
                        };
                        let mut wf = vec![0.0; cols];
                        dequantize_row_scalar(ty, wr, &mut wf);
                        // Quantized activations move each product by up to
                        // 1/127 of the block's largest: bound the terms with
                        // a little headroom over |x|.
                        scale[t * rows + r] = 1.05 * l1(&wf, xt);
                    }
                }
                let n = cols as f32;
                assert_close(
                    &got,
                    &want,
                    |i| n * f32::EPSILON * scale[i] + 1e-6,
                    &format!("{kernel} {ty} {rows}x{cols} × {n_tokens}"),
                );
            }
        }
    }
}

/// Uploads the activations in the form `ty`'s matvec takes; returns the
/// device address and the CPU's quantized blocks (for the oracle).
fn device_activations(
    dev: &dyn KernelDevice,
    ty: GgmlType,
    x: &[f32],
    n_tokens: usize,
    cols: usize,
    quantized: bool,
) -> (u64, Vec<BlockQ8_0>, Vec<BlockQ8K>) {
    let xd = dev.upload(&f32_bytes(x));
    if !quantized {
        return (xd, Vec::new(), Vec::new());
    }
    let args_for = |out| hip::QuantizeArgs {
        x: xd,
        out,
        n_tokens: n_tokens as u32,
        cols: cols as u32,
    };
    if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
        let nb = n_tokens * cols / 256;
        let out = dev.upload(&vec![0u8; nb * hip::Q8_K_DEVICE_BYTES]);
        dev.run(
            names::QUANTIZE_Q8_K,
            [blocks(nb as u64, 64), 1, 1],
            64,
            &args_for(out),
        );
        let mut q = vec![BlockQ8K::default(); nb];
        quantize_row_q8_k(x, &mut q);
        (out, Vec::new(), q)
    } else {
        let nb = n_tokens * cols / 32;
        let out = dev.upload(&vec![0u8; nb * hip::Q8_0_DEVICE_BYTES]);
        dev.run(
            names::QUANTIZE_Q8_0,
            [blocks(nb as u64, 64), 1, 1],
            64,
            &args_for(out),
        );
        let mut q = vec![BlockQ8_0::default(); nb];
        quantize_row_q8_0(x, &mut q);
        (out, q, Vec::new())
    }
}

/// The prefill matmul: dequantized weights · f32 activations (f64 oracle),
/// with rows, tokens and columns that are not multiples of the 64×64×32 tile.
pub fn matmul_tiled_matches_dequantized_product(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(31);
    for (ty, rows, cols, n_tokens) in [
        (GgmlType::F16, 70, 40, 5),
        (GgmlType::F32, 3, 31, 65),
        (GgmlType::Q8_0, 65, 96, 2),
        (GgmlType::Q4_0, 64, 64, 64),
        (GgmlType::Q4K, 33, 256, 3),
        (GgmlType::Q6K, 5, 512, 9),
        (GgmlType::Q5K, 2, 256, 1),
    ] {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let x = rng.vec(n_tokens * cols, 1.0);
        let out = zeros(dev, rows * n_tokens);
        let args = hip::MatArgs {
            w: dev.upload(&w),
            x: dev.upload(&f32_bytes(&x)),
            out,
            row_bytes: (w.len() / rows) as u64,
            rows: rows as u32,
            cols: cols as u32,
            n_tokens: n_tokens as u32,
            ty: ty.id(),
        };
        let tile = hip::MATMUL_TILE;
        dev.run(
            names::MATMUL_TILED,
            [blocks(rows as u64, tile), blocks(n_tokens as u64, tile), 1],
            256,
            &args,
        );
        let got = read_f32(dev, out, rows * n_tokens);
        let wf = crate::common::dequantized(ty, &w, rows, cols);
        let mut want = vec![0.0f32; rows * n_tokens];
        let mut scale = vec![0.0f32; rows * n_tokens];
        for t in 0..n_tokens {
            for r in 0..rows {
                let (wr, xt) = (&wf[r * cols..][..cols], &x[t * cols..][..cols]);
                want[t * rows + r] = wr
                    .iter()
                    .zip(xt)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32;
                scale[t * rows + r] = l1(wr, xt);
            }
        }
        let n = cols as f32;
        assert_close(
            &got,
            &want,
            |i| n * f32::EPSILON * scale[i] + 1e-7,
            &format!("matmul {ty} {rows}x{cols} × {n_tokens}"),
        );
    }
}

/// RMSNorm, softmax, SiLU·mul, add and both RoPE styles against the scalar ops.
pub fn row_ops_match_scalar(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(41);
    for (n_rows, width) in [(1usize, 1usize), (3, 33), (2, 4096), (1, 257)] {
        let x = rng.vec(n_rows * width, 3.0);
        let wt = rng.vec(width, 1.5);
        let eps = 1e-5;
        let out = zeros(dev, n_rows * width);
        let args = hip::RmsNormArgs {
            x: dev.upload(&f32_bytes(&x)),
            weight: dev.upload(&f32_bytes(&wt)),
            out,
            n_rows: n_rows as u32,
            width: width as u32,
            eps,
            pad: 0,
        };
        dev.run(names::RMS_NORM, [n_rows as u32, 1, 1], 256, &args);
        let got = read_f32(dev, out, n_rows * width);
        let mut want = vec![0.0; n_rows * width];
        for (xr, or) in x.chunks_exact(width).zip(want.chunks_exact_mut(width)) {
            scalar::rms_norm(xr, &wt, eps, or);
        }
        // The f64 sum of squares in another order can move the f32 mean by an ulp.
        assert_close(
            &got,
            &want,
            |i| 4.0 * f32::EPSILON * want[i].abs(),
            &format!("rms_norm {n_rows}x{width}"),
        );

        let xd = dev.upload(&f32_bytes(&x));
        dev.run(
            names::SOFTMAX,
            [n_rows as u32, 1, 1],
            256,
            &hip::SoftmaxArgs {
                x: xd,
                n_rows: n_rows as u32,
                width: width as u32,
            },
        );
        let got = read_f32(dev, xd, n_rows * width);
        let mut want = x.clone();
        want.chunks_exact_mut(width).for_each(scalar::softmax);
        // Probabilities: device expf may differ from libm by a couple of ulp.
        assert_close(
            &got,
            &want,
            |i| 8.0 * f32::EPSILON * want[i].abs() + 1e-9,
            &format!("softmax {n_rows}x{width}"),
        );

        let n = n_rows * width;
        let up = rng.vec(n, 2.0);
        let (ad, bd) = (dev.upload(&f32_bytes(&x)), dev.upload(&f32_bytes(&up)));
        let args = hip::BinaryArgs {
            a: ad,
            b: bd,
            n: n as u64,
        };
        dev.run(
            names::SILU_MUL,
            [blocks(n as u64, 256).min(1024), 1, 1],
            256,
            &args,
        );
        let got = read_f32(dev, ad, n);
        let mut want = x.clone();
        scalar::silu_mul(&mut want, &up);
        assert_close(
            &got,
            &want,
            |i| 8.0 * f32::EPSILON * want[i].abs() + 1e-9,
            &format!("silu_mul {n}"),
        );

        let ad = dev.upload(&f32_bytes(&x));
        let args = hip::BinaryArgs {
            a: ad,
            b: bd,
            n: n as u64,
        };
        // Fewer blocks than elements / 256: the grid-stride loop covers the rest.
        dev.run(names::ADD, [1, 1, 1], 256, &args);
        let got = read_f32(dev, ad, n);
        let mut want = x.clone();
        scalar::add(&mut want, &up);
        assert_close(&got, &want, |_| 0.0, &format!("add {n}"));
    }

    for (style, code) in [
        (RopeStyle::Normal, hip::ROPE_NORMAL),
        (RopeStyle::Neox, hip::ROPE_NEOX),
    ] {
        for (n_tokens, n_heads, head_dim, rot_dim, start_pos) in [
            (1usize, 4usize, 64usize, 64usize, 0usize),
            (3, 2, 64, 32, 4093),
            (2, 3, 128, 128, 70000),
        ] {
            let x = rng.vec(n_tokens * n_heads * head_dim, 2.0);
            let xd = dev.upload(&f32_bytes(&x));
            let (base, fscale) = (10000.0f32, 1.0f32);
            // Rows of one launch need not be consecutive positions (a
            // batch of sequences): the last row goes back to position 1.
            let positions: Vec<usize> = (0..n_tokens)
                .map(|t| {
                    if t > 0 && t == n_tokens - 1 {
                        1
                    } else {
                        start_pos + t
                    }
                })
                .collect();
            let pos_bytes: Vec<u8> = positions
                .iter()
                .flat_map(|&p| (p as u32).to_le_bytes())
                .collect();
            let args = hip::RopeArgs {
                x: xd,
                positions: dev.upload(&pos_bytes),
                n_tokens: n_tokens as u32,
                n_heads: n_heads as u32,
                head_dim: head_dim as u32,
                rot_dim: rot_dim as u32,
                freq_base: base,
                freq_scale: fscale,
                style: code,
                pad: 0,
            };
            let pairs = (n_tokens * n_heads * rot_dim / 2) as u64;
            dev.run(names::ROPE, [blocks(pairs, 256), 1, 1], 256, &args);
            let got = read_f32(dev, xd, x.len());
            let mut want = x.clone();
            let width = n_heads * head_dim;
            for (t, tok) in want.chunks_exact_mut(width).enumerate() {
                scalar::rope(
                    tok,
                    n_heads,
                    head_dim,
                    rot_dim,
                    positions[t],
                    base,
                    fscale,
                    style,
                );
            }
            // Same f64 angle, same f32 rotation; the device's f64 cos/sin may
            // round the angle's cosine to a neighbouring f32.
            let mag = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_close(
                &got,
                &want,
                |_| 4.0 * f32::EPSILON * mag,
                &format!("rope {style:?} pos {start_pos}"),
            );
        }
    }
}

/// Paged attention against `CpuKernels::attention_paged` (scalar): several
/// sequences with scattered block tables, a decode row at a position just
/// past a block boundary, a prefill chunk crossing blocks, a one-position
/// sequence, GQA, and splits shorter than a block so rows see several splits
/// and some splits see no positions.
pub fn attention_paged_matches_cpu(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(53);
    let cpu = CpuKernels::new(1, Isa::Scalar).expect("scalar kernels");
    for (head_dim, n_heads, n_kv_heads, split_positions) in [
        (64usize, 4usize, 2usize, 8u32),
        (128, 2, 2, 256),
        (32, 6, 1, 5),
    ] {
        let block_tokens = 16usize;
        let pool_blocks = 12usize;
        let kv_width = n_kv_heads * head_dim;
        let k_pool = rng.vec(pool_blocks * block_tokens * kv_width, 1.0);
        let v_pool = rng.vec(pool_blocks * block_tokens * kv_width, 1.0);
        // (n_tokens, start_pos, table)
        let seq_specs: [(usize, usize, Vec<u32>); 3] = [
            (1, 16, vec![7, 2]),     // decode at the first position of its second block
            (5, 30, vec![0, 11, 4]), // prefill rows 30..35 cross a block boundary
            (1, 0, vec![9]),         // one position
        ];
        let seqs: Vec<PagedSeq> = seq_specs
            .iter()
            .map(|(n, s, b)| PagedSeq {
                n_tokens: *n,
                start_pos: *s,
                blocks: b,
            })
            .collect();
        let rows: usize = seqs.iter().map(|s| s.n_tokens).sum();
        let q = rng.vec(rows * n_heads * head_dim, 1.0);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let shape = PagedShape {
            block_tokens,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            mask: ScoreMask::default(),
        };
        let mut want = vec![0.0; q.len()];
        cpu.attention_paged(&q, &k_pool, &v_pool, &seqs, shape, &mut want);

        let mut tables = Vec::new();
        let mut row_table = Vec::new();
        let mut row_pos = Vec::new();
        for s in &seqs {
            let start = tables.len() as u32;
            tables.extend_from_slice(s.blocks);
            for t in 0..s.n_tokens {
                row_table.push(start);
                row_pos.push((s.start_pos + t) as u32);
            }
        }
        let max_pos = *row_pos.iter().max().unwrap() as u64 + 1;
        let n_splits = blocks(max_pos, split_positions);
        let u32_bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let parts = rows * n_heads * n_splits as usize;
        let out = zeros(dev, q.len());
        let args = hip::AttentionArgs {
            q: dev.upload(&f32_bytes(&q)),
            k_pool: dev.upload(&f32_bytes(&k_pool)),
            v_pool: dev.upload(&f32_bytes(&v_pool)),
            tables: dev.upload(&u32_bytes(&tables)),
            row_table: dev.upload(&u32_bytes(&row_table)),
            row_pos: dev.upload(&u32_bytes(&row_pos)),
            partial_o: zeros(dev, parts * head_dim),
            partial_ml: zeros(dev, parts * 2),
            out,
            n_rows: rows as u32,
            n_heads: n_heads as u32,
            n_kv_heads: n_kv_heads as u32,
            head_dim: head_dim as u32,
            block_tokens: block_tokens as u32,
            split_positions,
            n_splits,
            scale,
        };
        dev.run(
            names::ATTENTION_PARTIAL,
            [n_splits, n_heads as u32, rows as u32],
            256,
            &args,
        );
        dev.run(
            names::ATTENTION_REDUCE,
            [n_heads as u32, rows as u32, 1],
            256,
            &args,
        );
        let got = read_f32(dev, out, q.len());
        // Outputs are convex combinations of v (|v| ≤ 1): online versus
        // two-pass softmax and device expf differ by a few ε of that scale.
        assert_close(
            &got,
            &want,
            |_| 2e-6,
            &format!("attention d{head_dim} h{n_heads}/{n_kv_heads} split {split_positions}"),
        );
    }
}

/// The step glue (`step.hip`) moves exactly the floats the host code
/// moves: a step's K and V rows land at their positions' block slots
/// (scattered tables, a prefill crossing a block, untouched slots stay
/// zero), a bias reaches every row, and copied and gathered rows are
/// copies.
pub fn step_glue_matches_host(dev: &dyn KernelDevice) {
    let mut rng = Rng::new(59);
    let u32_bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (kv_dim, block_tokens, pool_blocks) = (40usize, 4usize, 6usize);
    // Two sequences: a decode at position 5 (table [3, 1]) and a prefill of
    // positions 2..7 (table [0, 5]); tables concatenated, as a step uploads them.
    let tables = [3u32, 1, 0, 5];
    let (row_table, row_pos) = ([0u32, 2, 2, 2, 2, 2], [5u32, 2, 3, 4, 5, 6]);
    let rows = row_pos.len();
    let (k, v) = (rng.vec(rows * kv_dim, 1.0), rng.vec(rows * kv_dim, 1.0));
    let pool_floats = pool_blocks * block_tokens * kv_dim;
    let (k_pool, v_pool) = (zeros(dev, pool_floats), zeros(dev, pool_floats));
    let args = hip::KvStoreArgs {
        k: dev.upload(&f32_bytes(&k)),
        v: dev.upload(&f32_bytes(&v)),
        k_pool,
        v_pool,
        tables: dev.upload(&u32_bytes(&tables)),
        row_table: dev.upload(&u32_bytes(&row_table)),
        row_pos: dev.upload(&u32_bytes(&row_pos)),
        n_rows: rows as u32,
        kv_dim: kv_dim as u32,
        block_tokens: block_tokens as u32,
        pad: 0,
    };
    dev.run(
        names::KV_STORE,
        [blocks(kv_dim as u64, 256), rows as u32, 1],
        256,
        &args,
    );
    let (mut want_k, mut want_v) = (vec![0.0f32; pool_floats], vec![0.0f32; pool_floats]);
    for r in 0..rows {
        let pos = row_pos[r] as usize;
        let block = tables[row_table[r] as usize + pos / block_tokens] as usize;
        let at = (block * block_tokens + pos % block_tokens) * kv_dim;
        want_k[at..at + kv_dim].copy_from_slice(&k[r * kv_dim..(r + 1) * kv_dim]);
        want_v[at..at + kv_dim].copy_from_slice(&v[r * kv_dim..(r + 1) * kv_dim]);
    }
    assert_close(
        &read_f32(dev, k_pool, pool_floats),
        &want_k,
        |_| 0.0,
        "kv_store K",
    );
    assert_close(
        &read_f32(dev, v_pool, pool_floats),
        &want_v,
        |_| 0.0,
        "kv_store V",
    );

    let (width, n_rows) = (37usize, 5usize);
    let (a, bias) = (rng.vec(width * n_rows, 2.0), rng.vec(width, 2.0));
    let ad = dev.upload(&f32_bytes(&a));
    let args = hip::AddRowsArgs {
        a: ad,
        b: dev.upload(&f32_bytes(&bias)),
        n: (width * n_rows) as u64,
        width: width as u32,
        pad: 0,
    };
    // One block: the grid-stride loop covers every row.
    dev.run(names::ADD_ROWS, [1, 1, 1], 64, &args);
    let mut want = a.clone();
    for row in want.chunks_exact_mut(width) {
        scalar::add(row, &bias);
    }
    assert_close(&read_f32(dev, ad, a.len()), &want, |_| 0.0, "add_rows");

    // A pool's blocks copied into a larger allocation (one block, so the
    // grid-stride loop runs several times), the rest left zero.
    let copied = zeros(dev, 2 * a.len());
    let args = hip::BinaryArgs {
        a: copied,
        b: ad,
        n: a.len() as u64,
    };
    dev.run(names::COPY, [1, 1, 1], 64, &args);
    let mut want_copy = want.clone();
    want_copy.resize(2 * a.len(), 0.0);
    assert_close(
        &read_f32(dev, copied, 2 * a.len()),
        &want_copy,
        |_| 0.0,
        "copy",
    );

    let picked = [4u32, 0, 4];
    let out = zeros(dev, picked.len() * width);
    let args = hip::GatherArgs {
        x: ad,
        rows: dev.upload(&u32_bytes(&picked)),
        out,
        n_rows: picked.len() as u32,
        width: width as u32,
    };
    dev.run(
        names::GATHER_ROWS,
        [blocks(width as u64, 256), picked.len() as u32, 1],
        256,
        &args,
    );
    let want: Vec<f32> = picked
        .iter()
        .flat_map(|&r| want[r as usize * width..(r as usize + 1) * width].to_vec())
        .collect();
    assert_close(
        &read_f32(dev, out, want.len()),
        &want,
        |_| 0.0,
        "gather_rows",
    );
}

/// SHA-256 leaves equal `SHA-256(0x00 ‖ chunk)` from the sha2 crate (what
/// bulkhead_protocol::digest::leaf_hash computes): chunk lengths around the
/// padding boundaries (55, 56, 63, 64 bytes with the prefix byte), a short
/// last chunk, and the scrub's real 4 MiB chunk.
pub fn sha256_leaves_match_cpu(dev: &dyn KernelDevice) {
    use sha2::{Digest, Sha256};
    let mut rng = Rng::new(61);
    for (len, chunk) in [
        (54usize, 54usize),
        (55, 55),
        (62, 62),
        (63, 63),
        (64, 64),
        (1000, 300),
        (4097, 4096),
        ((4 << 20) + 1, 4 << 20),
    ] {
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let n_chunks = len.div_ceil(chunk);
        let out = dev.upload(&vec![0u8; 32 * n_chunks]);
        let args = hip::Sha256Args {
            data: dev.upload(&data),
            out,
            len: len as u64,
            chunk_bytes: chunk as u64,
        };
        dev.run(
            names::SHA256_LEAVES,
            [n_chunks as u32, 1, 1],
            hip::SHA256_BLOCK_THREADS,
            &args,
        );
        let got = dev.download(out, 32 * n_chunks);
        for (i, (g, c)) in got.chunks_exact(32).zip(data.chunks(chunk)).enumerate() {
            let mut h = Sha256::new();
            h.update([0x00]);
            h.update(c);
            let want: [u8; 32] = h.finalize().into();
            assert_eq!(g, want, "leaf {i} of {len} bytes in {chunk}-byte chunks");
        }
    }
}
