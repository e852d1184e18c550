//! With the `cuda` feature, and nvcc found: compiles the same source with
//! nvcc into one fatbin for `BULKHEAD_CUDA_ARCHS` (cuda.rs) and writes
//! `cuda_fatbin.rs`; without nvcc that file says there is no fatbin.
//!
//! With the `hip` feature: compiles `hip/bulkhead.hip` (every HIP kernel)
//! with `hipcc --genco` once per GPU architecture in `BULKHEAD_HIP_ARCHS`
//! and writes `hip_code_objects.rs` into OUT_DIR, which `src/hip.rs`
//! includes (the code objects themselves are embedded with include_bytes!).
//! Without the feature it does nothing, so the default build needs no ROCm.
//!
//! hipcc is looked up in `HIPCC`, `$ROCM_PATH/bin`, `hipconfig --path`,
//! `/opt/rocm/bin`, `/usr/bin`. A missing hipcc or an architecture hipcc
//! does not know is a build error that says what to install or set: the
//! feature asks for kernels, so building without them would only move the
//! failure to run time.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use std::{env, fs};

const ARCHS_VAR: &str = "BULKHEAD_HIP_ARCHS";
/// MI300X/MI325X. Debian's ROCm 5.2 hipcc predates it (CI builds gfx90a,gfx940).
const DEFAULT_ARCHS: &str = "gfx942";
/// More than a handful of architectures in one build is a typo, not a plan.
const MAX_ARCHS: usize = 16;
/// Longest target id accepted (`gfx90a:sramecc+:xnack-` is 22).
const MAX_ARCH_LEN: usize = 40;
/// The translation unit that includes every kernel file.
const SOURCE: &str = "hip/bulkhead.hip";

#[path = "build/cuda.rs"]
mod cuda;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_some()
        && let Err(message) = cuda::build()
    {
        eprintln!("error: bulkhead-kernels (feature `cuda`): {message}");
        std::process::exit(1);
    }
    if env::var_os("CARGO_FEATURE_HIP").is_none() {
        return;
    }
    if let Err(message) = build() {
        eprintln!("error: bulkhead-kernels (feature `hip`): {message}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    for var in [ARCHS_VAR, "HIPCC", "ROCM_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // A directory: cargo re-runs when any file under it changes.
    println!("cargo:rerun-if-changed=hip");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let archs = parse_archs(&env::var(ARCHS_VAR).unwrap_or_else(|_| DEFAULT_ARCHS.to_owned()))?;
    let hipcc = find_hipcc()?;

    let mut table = String::from(
        "/// One code object per architecture of `BULKHEAD_HIP_ARCHS` at build time.\n\
         pub const CODE_OBJECTS: &[CodeObject] = &[\n",
    );
    for arch in &archs {
        let file = out_dir.join(format!("bulkhead-{}.co", arch.replace(':', "_")));
        let millis = compile(&hipcc, &manifest, arch, &file)?;
        writeln!(
            table,
            "    CodeObject {{ arch: {arch:?}, bytes: include_bytes!({file:?}), compile_millis: {millis} }},",
            file = file.display().to_string(),
        )
        .expect("writing to a String");
    }
    table.push_str("];\n");
    fs::write(out_dir.join("hip_code_objects.rs"), table).map_err(|e| {
        format!(
            "writing hip_code_objects.rs into {}: {e}",
            out_dir.display()
        )
    })
}

/// The comma-separated architecture list: each a gfx target id such as
/// `gfx942` or `gfx90a:xnack-`, at most [`MAX_ARCHS`], duplicates refused.
fn parse_archs(list: &str) -> Result<Vec<String>, String> {
    let mut archs: Vec<String> = Vec::new();
    for raw in list.split(',') {
        let arch = raw.trim();
        let (base, features) = arch.split_once(':').unwrap_or((arch, ""));
        let base_ok = base.len() > 3
            && base.starts_with("gfx")
            && base[3..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let features_ok = features.is_empty()
            || features.split(':').all(|f| {
                (f.ends_with('+') || f.ends_with('-'))
                    && f.len() > 1
                    && f[..f.len() - 1].bytes().all(|b| b.is_ascii_lowercase())
            });
        if arch.len() > MAX_ARCH_LEN || !base_ok || !features_ok {
            return Err(format!(
                "{ARCHS_VAR}={list:?}: {arch:?} is not a GPU target id \
                 (expected e.g. gfx942 or gfx90a:xnack-, comma-separated)"
            ));
        }
        if archs.iter().any(|a| a == arch) {
            return Err(format!("{ARCHS_VAR}={list:?} names {arch} twice"));
        }
        archs.push(arch.to_owned());
    }
    if archs.len() > MAX_ARCHS {
        return Err(format!(
            "{ARCHS_VAR} names {} architectures; at most {MAX_ARCHS}",
            archs.len()
        ));
    }
    Ok(archs)
}

fn find_hipcc() -> Result<PathBuf, String> {
    if let Some(path) = env::var_os("HIPCC") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("HIPCC={} is not a file", path.display()))
        };
    }
    let mut tried = Vec::new();
    let mut candidates = Vec::new();
    if let Some(rocm) = env::var_os("ROCM_PATH") {
        candidates.push(Path::new(&rocm).join("bin/hipcc"));
    }
    if let Ok(out) = Command::new("hipconfig").arg("--path").output()
        && out.status.success()
    {
        let prefix = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !prefix.is_empty() {
            candidates.push(Path::new(&prefix).join("bin/hipcc"));
        }
    }
    candidates.push(PathBuf::from("/opt/rocm/bin/hipcc"));
    candidates.push(PathBuf::from("/usr/bin/hipcc"));
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(format!(
        "hipcc not found (tried HIPCC, {}). Install ROCm, or on Debian/Ubuntu \
         `apt-get install hipcc libamdhip64-dev rocm-device-libs`, or set HIPCC; \
         or build without the `hip` feature",
        tried.join(", ")
    ))
}

/// Compiles every kernel for `arch` into `out`; returns the wall time in ms.
fn compile(hipcc: &Path, manifest: &Path, arch: &str, out: &Path) -> Result<u128, String> {
    let hip_dir = manifest.join("hip");
    let started = Instant::now();
    let output = Command::new(hipcc)
        .arg("--genco")
        .arg(format!("--offload-arch={arch}"))
        // -ffp-contract=off: products round as the CPU oracle's do (the
        // kernels call fmaf where they want a fused multiply-add).
        .args(["-O3", "-std=c++17", "-ffp-contract=off", "-Wall"])
        .arg("-I")
        .arg(&hip_dir)
        .arg(manifest.join(SOURCE))
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("running {}: {e}", hipcc.display()))?;
    let millis = started.elapsed().as_millis();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let hint = if stderr.contains("invalid target ID") || stderr.contains("unknown target") {
            format!(
                "\nhint: this hipcc does not know {arch}; ROCm 5.x (Debian's) knows CDNA3 only as \
                 gfx940, ROCm 6.x adds gfx942. Set {ARCHS_VAR} (e.g. gfx90a,gfx940) or use a newer ROCm."
            )
        } else {
            String::new()
        };
        return Err(format!(
            "{} failed for {arch} ({}):\n{stderr}{hint}",
            hipcc.display(),
            output.status
        ));
    }
    for line in stderr.lines().filter(|l| l.contains("warning:")) {
        println!("cargo:warning={line}");
    }
    Ok(millis)
}
