//! The HIP kernels' source run on the CPU (`bulkhead_kernels::hip::emulator`):
//! every parity case of `hip_cases` at wave size 32 and 64, against the
//! scalar oracle. This is how the kernels' logic is tested on machines
//! without a GPU; it says nothing about device speed or the device's math
//! library (gpu-host/tests/hip_parity.rs runs the backend on a real device).
//!
//! Needs a C++20 compiler (`CXX`, else g++ or clang++); without one each test
//! skips for `cxx` (a failure where `BULKHEAD_REQUIRE` lists it, as CI
//! does). A compiler that fails on the kernels' source fails every test.

mod common;
mod hip_cases;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bulkhead_kernels::hip::KernelDevice;
use bulkhead_kernels::hip::emulator::{Emulator, HarnessError, build_harness};
use bulkhead_testkit::{Need, skip};

/// The emulator, or `None` after skipping for the missing compiler. A
/// build that fails is a failure.
fn harness() -> Option<&'static Path> {
    static HARNESS: OnceLock<Result<PathBuf, HarnessError>> = OnceLock::new();
    match HARNESS.get_or_init(|| build_harness(Path::new(env!("CARGO_TARGET_TMPDIR")))) {
        Ok(path) => Some(path),
        Err(HarnessError::NoCompiler(why)) => {
            skip(Need::Cxx, why);
            None
        }
        Err(e @ HarnessError::Build(_)) => panic!("{e}"),
    }
}

/// Runs `case` at both wave sizes (or skips for the missing compiler).
fn on_both_wave_sizes(case: fn(&dyn KernelDevice)) {
    let Some(harness) = harness() else {
        return;
    };
    for wave in [32, 64] {
        let device = Emulator::start(harness, wave).unwrap_or_else(|e| panic!("{e}"));
        case(&device);
    }
}

#[test]
fn embedding_every_type() {
    on_both_wave_sizes(hip_cases::embedding_every_type);
}

#[test]
fn quantize_matches_cpu() {
    on_both_wave_sizes(hip_cases::quantize_matches_cpu);
}

#[test]
fn matvec_matches_scalar_dot() {
    on_both_wave_sizes(hip_cases::matvec_matches_scalar_dot);
}

#[test]
fn matmul_tiled_matches_dequantized_product() {
    on_both_wave_sizes(hip_cases::matmul_tiled_matches_dequantized_product);
}

#[test]
fn row_ops_match_scalar() {
    on_both_wave_sizes(hip_cases::row_ops_match_scalar);
}

#[test]
fn attention_paged_matches_cpu() {
    on_both_wave_sizes(hip_cases::attention_paged_matches_cpu);
}

#[test]
fn step_glue_matches_host() {
    on_both_wave_sizes(hip_cases::step_glue_matches_host);
}

#[test]
fn sha256_leaves_match_cpu() {
    on_both_wave_sizes(hip_cases::sha256_leaves_match_cpu);
}

/// Device errors come back as errors naming the operation, not a hang or a
/// crash: an unknown kernel, a read past an allocation, a bad geometry.
#[test]
fn emulator_refuses_bad_requests_with_clear_errors() {
    let Some(harness) = harness() else {
        return;
    };
    let dev = Emulator::start(harness, 64).unwrap();
    let addr = dev.alloc(16).unwrap();
    let e = dev.launch("bh_nope", [1, 1, 1], 64, &[]).unwrap_err();
    assert_eq!(e.to_string(), "launch bh_nope: unknown kernel bh_nope");
    let mut out = [0u8; 32];
    let e = dev.read(addr, &mut out).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
    let e = dev.write(addr + 8, &[1; 16]).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
    let e = dev.launch("bh_add", [1, 1, 1], 100, &[0; 24]).unwrap_err();
    assert!(e.to_string().contains("multiple of the wave size"), "{e}");
    // Still serving after errors.
    dev.write(addr, &[7; 16]).unwrap();
    let mut back = [0u8; 16];
    dev.read(addr, &mut back).unwrap();
    assert_eq!(back, [7; 16]);
    dev.free(addr).unwrap();
    assert!(dev.free(addr).is_err());
}
