//! The test guests in `gateway/tests/plugins/`, built from Rust for
//! `wasm32-wasip2` once per test process (`cargo build --release` in their
//! own workspace, into `$CARGO_TARGET_DIR/test-plugins` or
//! `target/test-plugins`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Whether the guests can be built here: the `wasm32-wasip2` standard
/// library is installed. Without it guest tests skip for `wasm-guests`
/// (`require_guests!`), a failure where `BULKHEAD_REQUIRE` lists it.
pub(crate) fn available() -> bool {
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

/// Where the guests' `.wasm` files are, after building them on first use.
fn wasm_dir() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build("tests/plugins", "test-plugins")
            .unwrap_or_else(|e| panic!("building the test plugins: {e}"))
    })
}

/// The bytes of one of the guest SDK's example plugins (`pii-redact`, …),
/// built on first use into the target dir, where `tests/run-all` (via
/// `guest-sdk/build`) already built them.
pub(crate) fn example(name: &str) -> Vec<u8> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        build("../guest-sdk", "").unwrap_or_else(|e| panic!("building the examples: {e}"))
    });
    let file = dir.join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// The bytes of one guest (`echo`, `rewrite`, `hostile`, `observer`,
/// `fs-user`).
pub(crate) fn guest(name: &str) -> Vec<u8> {
    let file = wasm_dir().join(format!("test_plugin_{}.wasm", name.replace('-', "_")));
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// Builds the workspace at `workspace` (relative to the gateway crate) into
/// the target dir's `subdir`.
fn build(workspace: &str, subdir: &str) -> Result<PathBuf, String> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = crate_dir.join(workspace).join("Cargo.toml");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_dir.join("../target"))
        .join(subdir);
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
        // Flags meant for the gateway's own build (native CPU features,
        // `-D warnings` in CI) are not the guests'.
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
