//! How Bulkhead's tests skip.
//!
//! A test may skip only for one missing thing it names (a [`Need`]),
//! decided before its body runs. Every skip is said on stderr and, when
//! `BULKHEAD_SKIP_LEDGER` names a file, appended to it (one line: test,
//! need, why) so `tests/run-all` can print what was skipped and why. A
//! need listed in `BULKHEAD_REQUIRE` (comma-separated, e.g.
//! `cxx,isa:avx2,python-sdk`) must be met: skipping for it fails the test.
//! CI lists every need its machine can meet.

#![forbid(unsafe_code)]

pub mod wasm;

use std::fmt;
use std::io::Write;

/// Something a test needs that a machine may lack. Its [`Need::key`] is
/// what `BULKHEAD_REQUIRE` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A C++20 compiler (`CXX`, g++ or clang++): the HIP kernel emulator.
    Cxx,
    /// A HIP GPU the runtime can see (and a build with feature `hip`).
    HipDevice,
    /// hipcc and the ROCm headers and runtime library.
    HipToolchain,
    /// An NVIDIA GPU the CUDA driver can see (and a build with feature
    /// `cuda` whose kernels nvcc built).
    CudaDevice,
    /// A CPU instruction set: `"avx2"` (with FMA and F16C) or
    /// `"avx512vnni"` (with AVX-512 F and VL).
    Isa(&'static str),
    /// `BULKHEAD_TEST_PYTHON`: a Python with the pinned test tools (the
    /// openai SDK, model-signing).
    PythonSdk,
    /// The wasm32-wasip2 plugin guests (`BULKHEAD_EXAMPLE_PLUGINS`,
    /// `BULKHEAD_C_PLUGIN`, the test guests' build).
    WasmGuests,
    /// Root (CAP_SYS_ADMIN): mounting a small tmpfs for full-disk tests.
    Root,
    /// At least this many CPUs this process may run on.
    Cpus(usize),
}

impl Need {
    /// The name `BULKHEAD_REQUIRE` and the ledger use.
    pub fn key(&self) -> String {
        match self {
            Need::Cxx => "cxx".into(),
            Need::HipDevice => "hip-device".into(),
            Need::HipToolchain => "hip-toolchain".into(),
            Need::CudaDevice => "cuda-device".into(),
            Need::Isa(isa) => format!("isa:{isa}"),
            Need::PythonSdk => "python-sdk".into(),
            Need::WasmGuests => "wasm-guests".into(),
            Need::Root => "root".into(),
            Need::Cpus(n) => format!("cpus:{n}"),
        }
    }

    /// Whether `BULKHEAD_REQUIRE` lists this need.
    pub fn required(&self) -> bool {
        let listed = std::env::var("BULKHEAD_REQUIRE").unwrap_or_default();
        let key = self.key();
        listed.split(',').map(str::trim).any(|k| k == key)
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// Skips the calling test for `need`, saying `why`: recorded in the
/// ledger, and a failure (panic) when `need` is required. Call it before
/// the test's body, then return.
#[track_caller]
pub fn skip(need: Need, why: impl fmt::Display) {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed)")
        .to_string();
    let required = need.required();
    // One line, tabs and newlines flattened, so the ledger stays a table.
    let why = why.to_string().replace(['\t', '\n', '\r'], " ");
    if let Some(path) = std::env::var_os("BULKHEAD_SKIP_LEDGER") {
        let outcome = if required {
            "FAILED (required)"
        } else {
            "skipped"
        };
        let line = format!("{test}\t{need}\t{outcome}\t{why}\n");
        // One write of a short line to an O_APPEND file: lines from tests
        // running at once do not interleave.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
    if required {
        panic!("{test} needs {need}, which BULKHEAD_REQUIRE makes required: {why}");
    }
    eprintln!("SKIPPED {test} (needs {need}): {why}");
}

/// Whether this CPU has the instruction set `isa` names (see [`Need::Isa`]).
pub fn has_isa(isa: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            "avx2" => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            "avx512vnni" => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// `true` when the CPU has `isa`; otherwise skips the calling test for it
/// and returns `false` (the test then returns).
#[track_caller]
pub fn require_isa(isa: &'static str) -> bool {
    if has_isa(isa) {
        return true;
    }
    skip(Need::Isa(isa), format!("this CPU lacks {isa}"));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_what_bulkhead_require_lists() {
        assert_eq!(Need::Isa("avx2").key(), "isa:avx2");
        assert_eq!(Need::Cpus(2).key(), "cpus:2");
        assert_eq!(Need::PythonSdk.to_string(), "python-sdk");
    }
}
