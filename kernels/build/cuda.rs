//! The CUDA half of the build script: kernels/hip/bulkhead.hip through
//! nvcc (compat.h's CUDA path) into one fatbin holding a cubin per `sm_XX`
//! and PTX per `compute_XX` of `BULKHEAD_CUDA_ARCHS` (default
//! `sm_80,sm_90,compute_90`: A100, H100/H200, and PTX a later GPU's driver
//! compiles), embedded by `src/hip/mod.rs` as `CUDA_FATBIN`.
//!
//! nvcc is looked up in `NVCC`, `$CUDA_PATH/bin`, `$CUDA_HOME/bin`, `PATH`
//! and `/usr/local/cuda/bin`. None found: the build goes on without CUDA
//! kernels (the CUDA backend then says so at run time) unless
//! `BULKHEAD_CUDA_ARCHS` is set, which asks for them: then it is an error.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use std::{env, fs};

const ARCHS_VAR: &str = "BULKHEAD_CUDA_ARCHS";
const DEFAULT_ARCHS: &str = "sm_80,sm_90,compute_90";
const MAX_ARCHS: usize = 16;

pub fn build() -> Result<(), String> {
    for var in [ARCHS_VAR, "NVCC", "CUDA_PATH", "CUDA_HOME", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=hip");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let asked = env::var(ARCHS_VAR).ok();
    let archs = parse_archs(asked.as_deref().unwrap_or(DEFAULT_ARCHS))?;
    let table = match find_nvcc() {
        Ok(nvcc) => {
            let file = out_dir.join("bulkhead.fatbin");
            let millis = compile(&nvcc, &manifest, &archs, &file)?;
            format!(
                "/// The kernels for NVIDIA GPUs, built by nvcc at build time.\n\
                 pub const CUDA_FATBIN: Result<CudaFatbin, &str> = Ok(CudaFatbin {{ \
                 targets: &{archs:?}, bytes: include_bytes!({file:?}), compile_millis: {millis} }});\n",
                file = file.display().to_string(),
            )
        }
        Err(why) if asked.is_some() => return Err(format!("{ARCHS_VAR} is set but {why}")),
        Err(why) => {
            let mut t = String::new();
            writeln!(
                t,
                "/// No nvcc at build time, so no kernels for NVIDIA GPUs.\n\
                 pub const CUDA_FATBIN: Result<CudaFatbin, &str> = Err({:?});",
                format!(
                    "this binary was built without CUDA kernels: {why} at build time \
                     (install the CUDA toolkit or set NVCC, and rebuild)"
                )
            )
            .expect("writing to a String");
            t
        }
    };
    fs::write(out_dir.join("cuda_fatbin.rs"), table)
        .map_err(|e| format!("writing cuda_fatbin.rs into {}: {e}", out_dir.display()))
}

/// `sm_80,sm_90,compute_90`: each `sm_NN` (a cubin) or `compute_NN` (PTX),
/// at most [`MAX_ARCHS`], no duplicates.
fn parse_archs(list: &str) -> Result<Vec<String>, String> {
    let mut archs: Vec<String> = Vec::new();
    for raw in list.split(',') {
        let arch = raw.trim();
        let number = arch
            .strip_prefix("sm_")
            .or_else(|| arch.strip_prefix("compute_"));
        let ok = number.is_some_and(|n| {
            (2..=4).contains(&n.len())
                && n.bytes().take(n.len() - 1).all(|b| b.is_ascii_digit())
                && n.bytes()
                    .last()
                    .is_some_and(|b| b.is_ascii_digit() || b == b'a')
        });
        if !ok {
            return Err(format!(
                "{ARCHS_VAR}={list:?}: {arch:?} is not an NVIDIA target \
                 (expected e.g. sm_80, sm_90a or compute_90, comma-separated)"
            ));
        }
        if archs.iter().any(|a| a == arch) {
            return Err(format!("{ARCHS_VAR}={list:?} names {arch} twice"));
        }
        archs.push(arch.to_owned());
    }
    if archs.len() > MAX_ARCHS {
        return Err(format!(
            "{ARCHS_VAR} names {} targets; at most {MAX_ARCHS}",
            archs.len()
        ));
    }
    Ok(archs)
}

fn find_nvcc() -> Result<PathBuf, String> {
    if let Some(path) = env::var_os("NVCC") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("NVCC={} is not a file", path.display()))
        };
    }
    let mut candidates = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = env::var_os(var) {
            candidates.push(Path::new(&root).join("bin/nvcc"));
        }
    }
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|c| c.is_file()).ok_or_else(|| {
        "nvcc was not found (NVCC, CUDA_PATH, CUDA_HOME, PATH, /usr/local/cuda/bin)".into()
    })
}

/// `-gencode` for each target: `sm_NN` a cubin, `compute_NN` PTX.
fn gencode(arch: &str) -> String {
    match arch.strip_prefix("sm_") {
        Some(n) => format!("arch=compute_{n},code=sm_{n}"),
        None => format!("arch={arch},code={arch}"),
    }
}

/// The flags of kernels/hip/nvcc-check (and the hipcc build's): no
/// floating-point contraction, every warning an error, spills included.
fn compile(nvcc: &Path, manifest: &Path, archs: &[String], out: &Path) -> Result<u128, String> {
    let hip_dir = manifest.join("hip");
    let started = Instant::now();
    let mut cmd = Command::new(nvcc);
    cmd.args(["-x", "cu", "-std=c++17", "-O3", "--fmad=false"])
        .args([
            "-Werror",
            "all-warnings",
            "-Xptxas",
            "-warn-spills",
            "--fatbin",
        ]);
    for arch in archs {
        cmd.arg("-gencode").arg(gencode(arch));
    }
    let output = cmd
        .arg("-I")
        .arg(&hip_dir)
        .arg(hip_dir.join("bulkhead.hip"))
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}):\n{}",
            nvcc.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(started.elapsed().as_millis())
}
