//! The HIP kernels' source run on the CPU (kernels/hip/emulate): every parity
//! case of `hip_cases` at wave size 32 and 64, against the scalar oracle. This
//! is how the kernels' logic is tested on machines without a GPU; it says
//! nothing about device speed or the device's math library (the real-device
//! runs of the same cases are gpu-host/tests/hip_parity.rs).
//!
//! Needs a C++20 compiler (`CXX`, else g++ or clang++); without one each test
//! prints why it skipped, unless BULKHEAD_REQUIRE_EMULATOR=1 makes that a failure.

mod common;
mod hip_cases;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use bulkhead_kernels::hip::KernelArgs;
use hip_cases::KernelDevice;

/// Where the harness maps buffer i (kernels/hip/emulate/harness.cpp).
const BASE: u64 = 0x1000_0000_0000;

/// The compiled harness, or why there is none.
fn harness() -> Result<&'static Path, &'static str> {
    static HARNESS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            let hip_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hip");
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bh-emulate");
            let candidates: Vec<String> = match std::env::var("CXX") {
                Ok(cxx) => vec![cxx],
                Err(_) => vec!["g++".into(), "clang++".into()],
            };
            let mut why = Vec::new();
            for cxx in candidates {
                let result = Command::new(&cxx)
                    .args([
                        "-std=c++20",
                        "-O2",
                        "-DBH_EMULATE",
                        "-Wno-unknown-pragmas",
                        "-pthread",
                        "-I",
                    ])
                    .arg(&hip_dir)
                    .arg(hip_dir.join("emulate/harness.cpp"))
                    .arg("-o")
                    .arg(&out)
                    .output();
                match result {
                    Ok(o) if o.status.success() => return Ok(out),
                    Ok(o) => why.push(format!("{cxx}: {}", String::from_utf8_lossy(&o.stderr))),
                    Err(e) => why.push(format!("{cxx}: {e}")),
                }
            }
            Err(format!(
                "no C++20 compiler built the emulator ({})",
                why.join("; ")
            ))
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(String::as_str)
}

/// Buffers live here; each launch ships them all to the harness and back.
struct Emulator {
    wave: u32,
    buffers: Vec<Vec<u8>>,
    harness: &'static Path,
    scratch: PathBuf,
}

impl Emulator {
    fn new(wave: u32, harness: &'static Path, test: &str) -> Emulator {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("emu-{test}-w{wave}"));
        Emulator {
            wave,
            buffers: Vec::new(),
            harness,
            scratch,
        }
    }
}

impl KernelDevice for Emulator {
    fn upload(&mut self, bytes: &[u8]) -> u64 {
        self.buffers.push(bytes.to_vec());
        BASE + ((self.buffers.len() as u64 - 1) << 32)
    }

    fn download(&mut self, addr: u64, len: usize) -> Vec<u8> {
        let buf = &self.buffers[((addr - BASE) >> 32) as usize];
        buf[..len].to_vec()
    }

    fn launch(&mut self, kernel: &str, grid: [u32; 3], threads: u32, args: &dyn KernelArgs) {
        let mut file = b"BHEMU1\0\0".to_vec();
        let u32le = |f: &mut Vec<u8>, v: u32| f.extend_from_slice(&v.to_le_bytes());
        u32le(&mut file, kernel.len() as u32);
        file.extend_from_slice(kernel.as_bytes());
        for v in [grid[0], grid[1], grid[2], threads, self.wave] {
            u32le(&mut file, v);
        }
        let args = args.to_bytes();
        u32le(&mut file, args.len() as u32);
        file.extend_from_slice(&args);
        u32le(&mut file, self.buffers.len() as u32);
        for b in &self.buffers {
            file.extend_from_slice(&(b.len() as u64).to_le_bytes());
            file.extend_from_slice(b);
        }
        let (input, output) = (
            self.scratch.with_extension("in"),
            self.scratch.with_extension("out"),
        );
        std::fs::write(&input, &file).expect("writing the launch file");
        let run = Command::new(self.harness)
            .arg(&input)
            .arg(&output)
            .output()
            .expect("running bh-emulate");
        assert!(
            run.status.success(),
            "{kernel}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let back = std::fs::read(&output).expect("reading the emulator's output");
        let mut at = 4;
        for b in &mut self.buffers {
            let len = u64::from_le_bytes(back[at..at + 8].try_into().unwrap()) as usize;
            b.copy_from_slice(&back[at + 8..at + 8 + len]);
            at += 8 + len;
        }
    }
}

/// Runs `case` at both wave sizes, or says why it cannot.
fn on_both_wave_sizes(test: &str, case: fn(&mut dyn KernelDevice)) {
    let harness = match harness() {
        Ok(h) => h,
        Err(why) if std::env::var_os("BULKHEAD_REQUIRE_EMULATOR").is_some_and(|v| v == "1") => {
            panic!("BULKHEAD_REQUIRE_EMULATOR=1 but {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    for wave in [32, 64] {
        case(&mut Emulator::new(wave, harness, test));
    }
}

#[test]
fn embedding_every_type() {
    on_both_wave_sizes("embedding", hip_cases::embedding_every_type);
}

#[test]
fn quantize_matches_cpu() {
    on_both_wave_sizes("quantize", hip_cases::quantize_matches_cpu);
}

#[test]
fn matvec_matches_scalar_dot() {
    on_both_wave_sizes("matvec", hip_cases::matvec_matches_scalar_dot);
}

#[test]
fn matmul_tiled_matches_dequantized_product() {
    on_both_wave_sizes(
        "matmul",
        hip_cases::matmul_tiled_matches_dequantized_product,
    );
}

#[test]
fn row_ops_match_scalar() {
    on_both_wave_sizes("row_ops", hip_cases::row_ops_match_scalar);
}

#[test]
fn attention_paged_matches_cpu() {
    on_both_wave_sizes("attention", hip_cases::attention_paged_matches_cpu);
}

#[test]
fn sha256_leaves_match_cpu() {
    on_both_wave_sizes("sha256", hip_cases::sha256_leaves_match_cpu);
}
