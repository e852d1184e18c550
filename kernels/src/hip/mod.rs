//! The HIP kernels (`kernels/hip/*.hip`) as the Rust side sees them: the code
//! objects `build.rs` compiled, the kernel names, and the argument structs
//! each kernel takes by value.
//!
//! Built with the `hip` feature, [`CODE_OBJECTS`] holds one code object per
//! architecture of `BULKHEAD_HIP_ARCHS` (default `gfx942`), ready for
//! `hipModuleLoadData`. Without it the list is empty and [`code_object_for`]
//! says the feature is off; names and argument layouts exist either way, so
//! the host code that uses them compiles (and is checked) everywhere.
//! [`KernelDevice`] is what that host code drives; [`emulator`] runs the
//! kernels' source on CPU threads behind it for tests.
#![forbid(unsafe_code)]

mod args;
mod device;
pub mod emulator;

pub use args::*;
pub use device::{DeviceError, DeviceErrorKind, KernelDevice};

/// A compiled code object: every kernel of `kernels/hip`, for one GPU
/// architecture, in the offload-bundle form `hipcc --genco` writes (which
/// `hipModuleLoadData` accepts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// The target id it was built for (`gfx942`, `gfx90a:xnack-`).
    pub arch: &'static str,
    pub bytes: &'static [u8],
    /// How long hipcc took to build it, in ms (at the build that made it).
    pub compile_millis: u64,
}

#[cfg(feature = "hip")]
include!(concat!(env!("OUT_DIR"), "/hip_code_objects.rs"));

/// Without the `hip` feature no kernels are compiled.
#[cfg(not(feature = "hip"))]
pub const CODE_OBJECTS: &[CodeObject] = &[];

/// The kernels for NVIDIA GPUs: one fatbin from nvcc (feature `cuda`, with
/// nvcc at build time) holding a cubin per `sm_NN` target and PTX per
/// `compute_NN` one, ready for `cuModuleLoadData`, which picks the cubin
/// of the device's compute capability or JIT-compiles the PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaFatbin {
    /// `BULKHEAD_CUDA_ARCHS` at build time (`sm_80`, `sm_90`, `compute_90`).
    pub targets: &'static [&'static str],
    pub bytes: &'static [u8],
    /// How long nvcc took, in ms.
    pub compile_millis: u64,
}

#[cfg(feature = "cuda")]
include!(concat!(env!("OUT_DIR"), "/cuda_fatbin.rs"));

/// Without the `cuda` feature no CUDA kernels are compiled.
#[cfg(not(feature = "cuda"))]
pub const CUDA_FATBIN: Result<CudaFatbin, &str> =
    Err("bulkhead-kernels was built without the `cuda` feature, so it holds no CUDA kernels");

/// Why no code object fits a device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeObjectError {
    #[error("bulkhead-kernels was built without the `hip` feature, so it holds no HIP kernels")]
    FeatureOff,
    #[error(
        "no HIP kernels for {device_arch}: this build has {built:?}; rebuild with \
         BULKHEAD_HIP_ARCHS including {device_base}"
    )]
    NoMatch {
        device_arch: String,
        device_base: String,
        built: Vec<&'static str>,
    },
}

/// The code object for a device whose `gcnArchName` is `device_arch`
/// (`gfx942:sramecc+:xnack-`). A code object built for the bare processor
/// (`gfx942`) runs on every feature setting of it; one built with features
/// (`gfx90a:xnack-`) only where the device reports each of them.
pub fn code_object_for(device_arch: &str) -> Result<&'static CodeObject, CodeObjectError> {
    if !cfg!(feature = "hip") {
        return Err(CodeObjectError::FeatureOff);
    }
    let mut device = device_arch.split(':');
    let device_base = device.next().unwrap_or_default();
    let device_features: Vec<&str> = device.collect();
    CODE_OBJECTS
        .iter()
        .find(|co| {
            let mut built = co.arch.split(':');
            built.next() == Some(device_base) && built.all(|f| device_features.contains(&f))
        })
        .ok_or_else(|| CodeObjectError::NoMatch {
            device_arch: device_arch.to_owned(),
            device_base: device_base.to_owned(),
            built: CODE_OBJECTS.iter().map(|co| co.arch).collect(),
        })
}

/// Kernel names, as `hipModuleGetFunction` finds them (all `extern "C"`).
pub mod names {
    pub const EMBEDDING: &str = "bh_embedding";
    pub const QUANTIZE_Q8_0: &str = "bh_quantize_q8_0";
    pub const QUANTIZE_Q8_K: &str = "bh_quantize_q8_k";
    pub const MATVEC_F16: &str = "bh_matvec_f16";
    pub const MATVEC_Q8_0: &str = "bh_matvec_q8_0";
    pub const MATVEC_Q4_0: &str = "bh_matvec_q4_0";
    pub const MATVEC_Q4_K: &str = "bh_matvec_q4k";
    pub const MATVEC_Q6_K: &str = "bh_matvec_q6k";
    /// Any weight type, dequantizing element by element (F32, BF16, Q4_1, Q5_0, Q5_1, Q5_K).
    pub const MATVEC_DEQUANT: &str = "bh_matvec_dequant";
    pub const MATMUL_TILED: &str = "bh_matmul_tiled";
    pub const RMS_NORM: &str = "bh_rms_norm";
    pub const ROPE: &str = "bh_rope";
    pub const SOFTMAX: &str = "bh_softmax";
    pub const SILU_MUL: &str = "bh_silu_mul";
    pub const ADD: &str = "bh_add";
    pub const ATTENTION_PARTIAL: &str = "bh_attention_partial";
    pub const ATTENTION_REDUCE: &str = "bh_attention_reduce";
    /// A step's keys and values into the paged pool.
    pub const KV_STORE: &str = "bh_kv_store";
    /// A bias added to every row.
    pub const ADD_ROWS: &str = "bh_add_rows";
    /// `a = b` over n floats (a KV pool into its grown allocation).
    pub const COPY: &str = "bh_copy";
    /// Rows picked by index (the rows whose logits are wanted).
    pub const GATHER_ROWS: &str = "bh_gather_rows";
    pub const SHA256_LEAVES: &str = "bh_sha256_leaves";

    /// Every kernel in the code objects.
    pub const ALL: [&str; 22] = [
        EMBEDDING,
        QUANTIZE_Q8_0,
        QUANTIZE_Q8_K,
        MATVEC_F16,
        MATVEC_Q8_0,
        MATVEC_Q4_0,
        MATVEC_Q4_K,
        MATVEC_Q6_K,
        MATVEC_DEQUANT,
        MATMUL_TILED,
        RMS_NORM,
        ROPE,
        SOFTMAX,
        SILU_MUL,
        ADD,
        ATTENTION_PARTIAL,
        ATTENTION_REDUCE,
        KV_STORE,
        ADD_ROWS,
        COPY,
        GATHER_ROWS,
        SHA256_LEAVES,
    ];
}

/// Threads per block for every kernel but [`names::SHA256_LEAVES`]
/// (`BH_BLOCK` in compat.h; the tiled matmul and attention require exactly this).
pub const BLOCK_THREADS: u32 = 256;
/// Threads per block of the SHA-256 kernel: one thread compresses, the rest
/// stage input, so small blocks let more chunks run per compute unit.
pub const SHA256_BLOCK_THREADS: u32 = 64;
/// Tokens one wave of a matvec takes against its row (`BH_MV_TOKENS`): a
/// matvec's grid has `ceil(n_tokens / MATVEC_TOKENS)` rows.
pub const MATVEC_TOKENS: u32 = 8;
/// Rows and tokens per tile of [`names::MATMUL_TILED`] (`BH_TM`, `BH_TN`).
pub const MATMUL_TILE: u32 = 64;
/// Largest `head_dim` the attention kernels take (`BH_MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 256;

#[cfg(test)]
mod tests {
    /// A fatbin, when nvcc built one, is nvcc's container (its magic
    /// 0xBA55ED50, little-endian) naming the targets asked for.
    #[test]
    fn a_cuda_fatbin_is_a_fatbin_of_the_targets_asked_for() {
        match CUDA_FATBIN {
            Ok(fatbin) => {
                assert!(fatbin.bytes.starts_with(&0xBA55_ED50u32.to_le_bytes()));
                assert!(!fatbin.targets.is_empty());
                // nvcc leaves the cubins and PTX uncompressed: every kernel's
                // name is in them (cuLibraryGetKernel looks them up by it).
                for name in names::ALL {
                    let found = fatbin
                        .bytes
                        .windows(name.len())
                        .any(|w| w == name.as_bytes());
                    assert!(found, "{name} is not in the fatbin");
                }
            }
            Err(why) => assert!(why.contains("without"), "{why}"),
        }
    }

    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut seen = std::collections::HashSet::new();
        for name in names::ALL {
            assert!(name.starts_with("bh_"), "{name}");
            assert!(seen.insert(name), "{name} twice");
        }
    }

    #[cfg(not(feature = "hip"))]
    #[test]
    fn without_the_feature_there_are_no_code_objects() {
        assert!(CODE_OBJECTS.is_empty());
        assert_eq!(code_object_for("gfx942"), Err(CodeObjectError::FeatureOff));
    }

    /// Each code object is an offload bundle naming its architecture and
    /// defining every kernel (the names sit in its ELF symbol table).
    #[cfg(feature = "hip")]
    #[test]
    fn code_objects_hold_every_kernel_for_their_arch() {
        assert!(!CODE_OBJECTS.is_empty(), "BULKHEAD_HIP_ARCHS built nothing");
        for co in CODE_OBJECTS {
            assert!(
                co.bytes.starts_with(b"__CLANG_OFFLOAD_BUNDLE__"),
                "{}",
                co.arch
            );
            let target = format!("amdgcn-amd-amdhsa--{}", co.arch);
            assert!(
                contains(co.bytes, target.as_bytes()),
                "{} bundle lacks {target}",
                co.arch
            );
            for name in names::ALL {
                let symbol = format!("{name}.kd");
                assert!(
                    contains(co.bytes, symbol.as_bytes()),
                    "{} lacks {name}",
                    co.arch
                );
            }
        }
    }

    #[cfg(feature = "hip")]
    #[test]
    fn code_object_for_matches_processor_and_features() {
        let first = CODE_OBJECTS[0].arch;
        let base = first.split(':').next().unwrap();
        // A device reports its feature settings; a bare build runs on all of them.
        let device = format!("{base}:sramecc+:xnack-");
        if first == base {
            assert_eq!(code_object_for(&device).unwrap().arch, first);
        }
        match code_object_for("gfx1") {
            Err(CodeObjectError::NoMatch {
                device_base, built, ..
            }) => {
                assert_eq!(device_base, "gfx1");
                assert_eq!(built.len(), CODE_OBJECTS.len());
            }
            other => panic!("gfx1 matched: {other:?}"),
        }
    }

    #[cfg(feature = "hip")]
    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }
}
