//! Prefill benchmark: a ROWS × COLS matrix times TOKENS tokens per weight
//! type, AVX2, 1 and 2 threads, the per-token path (`matmul_per_token`, one
//! single-row dot per row and token) against the grouped path (`matmul`,
//! weight blocks unpacked once per four tokens), interleaved in one run so
//! machine load hits both alike. Reports medians.
//!
//!     cargo run --release -p bulkhead-kernels --example prefill_bench [-- ROWS COLS TOKENS REPS]

use std::time::Instant;

use bulkhead_kernels::{CpuKernels, GgmlType, Isa, QuantMatrix};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (rows, cols, n_tokens, reps) = (arg(0, 4096), arg(1, 4096), arg(2, 128), arg(3, 5));
    if !Isa::Avx2.is_available() {
        println!("this CPU lacks avx2/fma/f16c: nothing to compare");
        return;
    }
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..n_tokens * cols)
        .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let flops = 2.0 * (rows * cols * n_tokens) as f64;
    println!("{rows} x {cols} matmul, {n_tokens} tokens, AVX2, median of {reps}");
    println!("type  thr  per-token ms  GFLOP/s   grouped ms  GFLOP/s  speedup");
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F16,
    ] {
        let bytes = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
        // Speed does not depend on the values, only on their not being NaN.
        let data: Vec<u8> = (0..bytes)
            .map(|i| {
                if i % 7 == 0 {
                    0x3c
                } else {
                    (next() & 0x0f) as u8
                }
            })
            .collect();
        let w = QuantMatrix::new(ty, &data, rows, cols).unwrap();
        for threads in [1, 2] {
            let k = CpuKernels::new(threads, Isa::Avx2).unwrap();
            let mut out = vec![0.0f32; rows * n_tokens];
            let (mut old, mut new) = (Vec::new(), Vec::new());
            k.matmul(&w, &x, n_tokens, &mut out); // warm-up
            for _ in 0..reps {
                let start = Instant::now();
                k.matmul_per_token(&w, &x, n_tokens, &mut out);
                old.push(start.elapsed().as_secs_f64());
                let start = Instant::now();
                k.matmul(&w, &x, n_tokens, &mut out);
                new.push(start.elapsed().as_secs_f64());
            }
            let (old, new) = (median(old), median(new));
            println!(
                "{:5} {threads}t  {:10.1}  {:8.1}  {:10.1}  {:7.1}  {:6.2}x",
                ty.name(),
                old * 1e3,
                flops / old / 1e9,
                new * 1e3,
                flops / new / 1e9,
                old / new
            );
        }
    }
}
