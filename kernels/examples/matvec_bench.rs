//! Quick matvec benchmark: a 4096 × 4096 matrix times one token, per weight
//! type, ISA and thread count. Reports weight bandwidth and GFLOP/s.
//!
//!     cargo run --release -p bulkhead-kernels --example matvec_bench [-- ROWS COLS]
//!
//! Each figure is the median of 9 timed batches. `BENCH_TYPES=Q4_0,Q8_0`
//! limits the weight types, `BENCH_AVX2_ONLY=1` skips the scalar kernels.

use std::time::{Duration, Instant};

use bulkhead_kernels::{CpuKernels, GgmlType, Isa, QuantMatrix};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols) = (
        args.first().copied().unwrap_or(4096),
        args.get(1).copied().unwrap_or(4096),
    );
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..cols)
        .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let avx2_only = std::env::var_os("BENCH_AVX2_ONLY").is_some();
    let types = std::env::var("BENCH_TYPES").ok();
    let mut isas = vec![];
    if !avx2_only || !Isa::Avx2.is_available() {
        isas.push(Isa::Scalar);
    }
    if Isa::Avx2.is_available() {
        isas.push(Isa::Avx2);
    }
    println!("{rows} x {cols} matvec (1 token)");
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F16,
    ] {
        if let Some(t) = &types
            && !t.split(',').any(|n| n.eq_ignore_ascii_case(ty.name()))
        {
            continue;
        }
        let bytes = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
        // Random bytes with every f16 scale field forced to a small value is
        // overkill here: speed does not depend on the values, only on their
        // not being NaN, so zero the bytes and set a few quants.
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
        for &isa in &isas {
            for threads in [1, 2] {
                let k = CpuKernels::new(threads, isa).unwrap();
                let mut out = vec![0.0f32; rows];
                k.matmul(&w, &x, 1, &mut out);
                let mut samples: Vec<f64> = (0..9)
                    .map(|_| {
                        let mut iters = 0u32;
                        let start = Instant::now();
                        while start.elapsed() < Duration::from_millis(40) || iters < 3 {
                            k.matmul(&w, &x, 1, &mut out);
                            iters += 1;
                        }
                        start.elapsed().as_secs_f64() / f64::from(iters)
                    })
                    .collect();
                samples.sort_by(f64::total_cmp);
                let per = samples[samples.len() / 2];
                println!(
                    "{:5} {:6?} {threads}t: {:8.3} ms  {:6.2} GB/s  {:6.2} GFLOP/s",
                    ty.name(),
                    isa,
                    per * 1e3,
                    bytes as f64 / per / 1e9,
                    2.0 * (rows * cols) as f64 / per / 1e9
                );
            }
        }
    }
}
