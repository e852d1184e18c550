//! `inspect` says of any GGUF whether the engine can run it, and if not
//! names the architecture, the metadata key, or each tensor and its type:
//! checked on fixtures and on files crafted from them byte by byte.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name)
}

/// `inspect`'s stdout (it must succeed) or, on failure, its stderr.
fn inspect(path: &Path) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead-gpu-host"))
        .args(["inspect", "--model"])
        .arg(path)
        .output()
        .expect("binary runs");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The `runnable:` line.
fn verdict(path: &Path) -> String {
    let text = inspect(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("runnable: "))
        .unwrap_or_else(|| panic!("no runnable line in:\n{text}"))
        .to_string()
}

/// A copy of fixture `from` with `edit` applied to its bytes.
fn crafted(from: &str, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(fixture(from)).unwrap();
    edit(&mut bytes);
    let dir = std::env::temp_dir().join(format!("bulkhead-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Replaces the first `from` (in the header) with `to`, of the same length.
fn replace(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not in the file", String::from_utf8_lossy(from)));
    bytes[at..at + to.len()].copy_from_slice(to);
}

/// Sets the GGML type id of 2-D tensor `tensor` in the tensor table.
fn set_type(bytes: &mut [u8], tensor: &str, type_id: u32) {
    let mut entry = (tensor.len() as u64).to_le_bytes().to_vec();
    entry.extend_from_slice(tensor.as_bytes());
    let at = bytes
        .windows(entry.len())
        .position(|w| w == entry.as_slice())
        .unwrap();
    let dims_at = at + entry.len();
    assert_eq!(bytes[dims_at..dims_at + 4], 2u32.to_le_bytes(), "a matrix");
    let ty = dims_at + 4 + 16;
    bytes[ty..ty + 4].copy_from_slice(&type_id.to_le_bytes());
}

#[test]
fn runnable_files_say_where_they_run() {
    let v = verdict(&fixture("llama-q8_0.gguf"));
    assert_eq!(v, "yes (llama on the CPU backend and on GPU backends)");
    let v = verdict(&fixture("phi3-q8_0.gguf"));
    assert_eq!(v, "yes (phi3 on the CPU backend and on GPU backends)");
    let v = verdict(&fixture("gemma2-q4_0.gguf"));
    assert!(
        v.starts_with("yes (gemma2 on the CPU backend only (a GPU backend lacks the GELU")
            && v.contains("sliding-window attention"),
        "{v}"
    );
}

#[test]
fn an_unsupported_architecture_is_named() {
    let path = crafted("llama-q8_0.gguf", "mamba.gguf", |b| {
        replace(
            b,
            b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
            b"\x05\x00\x00\x00\x00\x00\x00\x00mamba",
        )
    });
    let v = verdict(&path);
    assert!(
        v.starts_with("no: unsupported architecture \"mamba\" (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3)"),
        "{v}"
    );
}

#[test]
fn a_missing_or_invalid_metadata_key_is_named() {
    let path = crafted("qwen3-q4_0.gguf", "no-context.gguf", |b| {
        replace(b, b"qwen3.context_length", b"qwen3.context_lengtX")
    });
    assert_eq!(
        verdict(&path),
        "no: metadata key \"qwen3.context_length\" is missing"
    );
    let path = crafted("qwen2yarn-q8_0.gguf", "bad-scaling.gguf", |b| {
        replace(
            b,
            b"\x04\x00\x00\x00\x00\x00\x00\x00yarn",
            b"\x04\x00\x00\x00\x00\x00\x00\x00xarn",
        )
    });
    assert_eq!(
        verdict(&path),
        "no: metadata qwen2.rope.scaling.type: unsupported rope scaling type \"xarn\" \
         (supported: none, linear, yarn)"
    );
    let path = crafted("qwen2yarn-q8_0.gguf", "no-orig.gguf", |b| {
        replace(b, b"scaling.original_context", b"scaling.original_contexX")
    });
    let v = verdict(&path);
    assert!(
        v.starts_with("no: metadata qwen2.rope.scaling.original_context_length: YaRN needs"),
        "{v}"
    );
    let path = crafted("gemma3-q8_0.gguf", "no-tokens.gguf", |b| {
        replace(b, b"tokenizer.ggml.tokens", b"tokenizer.ggml.tokenX")
    });
    let v = verdict(&path);
    assert!(
        v.starts_with("no: tokenizer:") && v.contains("tokenizer.ggml.tokens"),
        "{v}"
    );
}

#[test]
fn a_missing_tensor_is_named() {
    let path = crafted("phi3-q8_0.gguf", "no-qkv.gguf", |b| {
        replace(b, b"blk.1.attn_qkv.weight", b"blk.1.attn_qkX.weight")
    });
    // Without the fused tensor the separate ones are looked for.
    assert_eq!(verdict(&path), "no: tensor blk.1.attn_q.weight: missing");
}

#[test]
fn tensors_of_unsupported_types_are_each_named_with_their_type() {
    let path = crafted("llama-f32.gguf", "iq.gguf", |b| {
        set_type(b, "blk.0.attn_q.weight", 16);
        set_type(b, "blk.1.ffn_down.weight", 21);
        set_type(b, "output.weight", 99);
    });
    let text = inspect(&path).unwrap();
    assert!(
        text.contains(
            "runnable: no: 3 of 21 tensors have types the engine cannot compute with \
             (IQ2_XXS: 1, IQ3_S: 1, unknown type id 99: 1)"
        ),
        "{text}"
    );
    for line in [
        "blk.0.attn_q.weight              IQ2_XXS",
        "blk.1.ffn_down.weight            IQ3_S",
        "output.weight                    unknown type id 99",
        "general.architecture = \"llama\"",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    // Loading it says the same of the first one.
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead-gpu-host"))
        .args(["generate", "--prompt", "x", "--model"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"blk.0.attn_q.weight\": tensor type IQ2_XXS (GGML id 16)"),
        "{err}"
    );
}

#[test]
fn a_file_that_is_not_gguf_is_still_an_error() {
    let path = crafted("llama-q8_0.gguf", "truncated.gguf", |b| b.truncate(100));
    let err = inspect(&path).unwrap_err();
    assert!(err.contains("truncated"), "{err}");
}
