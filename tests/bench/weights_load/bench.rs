//! Weight loading figures (a measurement, not a check; run with
//! `tests/bench/weights_load/run`):
//!
//! 1. load-and-verify of a 1 GiB GGUF — copy into host memory, hash every
//!    4 MiB chunk, compare the chunk root with the registered one, parse —
//!    on 1 and on 2 threads, side by side with `sha256sum` on the same file
//!    in the same run (page cache warm for both, runs interleaved);
//! 2. what the background scrub costs: the time to re-hash one chunk (how
//!    long it holds a core at a time) and the share of one core the default
//!    rate takes.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bulkhead_gpu_host::gguf::Gguf;
use bulkhead_gpu_host::gguf::writer::GgufWriter;
use bulkhead_gpu_host::verify::{Expected, load_resident};
use bulkhead_kernels::GgmlType;
use bulkhead_protocol::digest::{CHUNK_BYTES, FileDigest, leaf_hash, to_hex};

const FILE_BYTES: usize = 1 << 30;
const ROUNDS: usize = 5;
/// The gpu-host's default scrub rate (`--scrub-bytes-per-s`).
const DEFAULT_SCRUB_BYTES_PER_S: f64 = (64 << 20) as f64;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A GGUF holding one F32 tensor of ~1 GiB of pseudo-random bytes.
fn write_model() -> Scratch {
    let path =
        std::env::temp_dir().join(format!("bulkhead-load-bench-{}.gguf", std::process::id()));
    let mut data = vec![0u8; FILE_BYTES - (1 << 20)];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for word in data.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    let elements = (data.len() / 4) as u64;
    let mut writer = GgufWriter::new();
    writer.tensor("weights", &[elements], GgmlType::F32, data);
    std::fs::write(&path, writer.to_bytes()).unwrap();
    Scratch(path)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn gb_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}

fn sha256sum(path: &PathBuf) -> (Duration, String) {
    let start = Instant::now();
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    let elapsed = start.elapsed();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    (elapsed, text.split_whitespace().next().unwrap().to_string())
}

fn load(path: &PathBuf, expected: &Expected, threads: usize) -> Duration {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let start = Instant::now();
    pool.install(|| {
        let resident = load_resident(path, Some(expected)).expect("the file matches its digest");
        Gguf::from_resident(path, resident.map).expect("a valid GGUF")
    });
    start.elapsed()
}

#[test]
#[ignore = "a benchmark: run it with tests/bench/weights_load/run"]
fn load_and_verify_against_sha256sum() {
    let file = write_model();
    let bytes = std::fs::read(&file.0).unwrap();
    let size = bytes.len() as u64;
    let digest = FileDigest::of(&bytes);
    let expected = Expected {
        size,
        chunk_root: Some(digest.chunk_root),
        sha256: None,
    };
    // The same bytes, hashed the same way by an independent tool.
    let (_, theirs) = sha256sum(&file.0);
    assert_eq!(theirs, to_hex(&digest.sha256));

    // One chunk: how long the scrub holds a core at a time.
    let chunk = &bytes[..CHUNK_BYTES];
    let chunk_times: Vec<Duration> = (0..50)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(leaf_hash(std::hint::black_box(chunk)));
            start.elapsed()
        })
        .collect();
    drop(bytes);

    let (mut sums, mut one, mut two) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        sums.push(sha256sum(&file.0).0);
        one.push(load(&file.0, &expected, 1));
        two.push(load(&file.0, &expected, 2));
    }
    let (sums, one, two) = (median(sums), median(one), median(two));
    let chunk = median(chunk_times);
    println!(
        "file: {size} bytes (GGUF, one F32 tensor), page cache warm, {ROUNDS} interleaved rounds, medians"
    );
    println!(
        "sha256sum (coreutils, 1 core):     {:>8.1} ms  {:.2} GB/s",
        sums.as_secs_f64() * 1e3,
        gb_per_s(size, sums)
    );
    println!(
        "load + verify, 1 thread:           {:>8.1} ms  {:.2} GB/s  = {:.2}x sha256sum",
        one.as_secs_f64() * 1e3,
        gb_per_s(size, one),
        sums.as_secs_f64() / one.as_secs_f64()
    );
    println!(
        "load + verify, 2 threads:          {:>8.1} ms  {:.2} GB/s  = {:.2}x sha256sum",
        two.as_secs_f64() * 1e3,
        gb_per_s(size, two),
        sums.as_secs_f64() / two.as_secs_f64()
    );
    println!(
        "scrub: one 4 MiB chunk re-hashed in {:.2} ms; the default 64 MiB/s takes {:.1}% of one core",
        chunk.as_secs_f64() * 1e3,
        100.0 * DEFAULT_SCRUB_BYTES_PER_S * chunk.as_secs_f64() / CHUNK_BYTES as f64
    );
}
