//! Plugin components built from Rust for `wasm32-wasip2`, for tests: the
//! test guests (`plugin-host/tests/plugins/`, their own workspace) and the
//! guest SDK's examples (`guest-sdk/`). Each workspace is built (`cargo
//! build --release`) once per test process into the target dir: the
//! guests into `test-plugins/`, the examples into the target dir itself,
//! where `tests/run-all` (via `guest-sdk/build`) already built them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Whether the guests can be built here: the `wasm32-wasip2` standard
/// library is installed. Without it, a test that needs them skips for
/// [`crate::Need::WasmGuests`].
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("rustc")
            .args(["--print", "target-libdir", "--target", "wasm32-wasip2"])
            .output()
            .is_ok_and(|out| {
                out.status.success()
                    && Path::new(String::from_utf8_lossy(&out.stdout).trim()).is_dir()
            })
    })
}

/// `true` when the guests can be built here; otherwise skips the calling
/// test for [`crate::Need::WasmGuests`] and returns `false` (the test then
/// returns).
#[track_caller]
pub fn require() -> bool {
    if available() {
        return true;
    }
    crate::skip(
        crate::Need::WasmGuests,
        "the wasm32-wasip2 target is not installed (`rustup target add wasm32-wasip2`)",
    );
    false
}

/// The bytes of one test guest (`echo`, `rewrite`, `hostile`, `mirror`,
/// `observer`, `fs-user`, `script`).
pub fn test_guest(name: &str) -> Vec<u8> {
    component("plugin-host/tests/plugins", &format!("test-plugin-{name}"))
}

/// The bytes of one of the guest SDK's example plugins (`pii-redact`, …).
pub fn example(name: &str) -> Vec<u8> {
    component("guest-sdk", name)
}

fn component(workspace: &'static str, crate_name: &str) -> Vec<u8> {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let dir = BUILT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(workspace)
        .or_insert_with(|| {
            build(workspace).unwrap_or_else(|e| panic!("building the plugins of {workspace}: {e}"))
        })
        .clone();
    let file = dir.join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// Builds the workspace at `workspace` (relative to the repository) and
/// returns the folder its components land in.
fn build(workspace: &str) -> Result<PathBuf, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = repo.join(workspace).join("Cargo.toml");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    let target_dir = match workspace {
        "guest-sdk" => target_dir,
        _ => target_dir.join("test-plugins"),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        // Flags meant for the host build (native CPU features, `-D
        // warnings` in CI) are not the guests'.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build of {} failed (is the wasm32-wasip2 target installed? \
             `rustup target add wasm32-wasip2`):\n{}",
            manifest.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(target_dir.join("wasm32-wasip2/release"))
}
