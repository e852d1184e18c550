//! Which models a device backend may run: refused up front, by name.

use std::sync::Arc;

use super::*;
use crate::backend::fake_device::MemoryOnly;
use crate::backend::{CpuBackend, HipBackend};

fn fixture(name: &str) -> Model {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name);
    Model::open(path).expect("fixture model opens")
}

#[test]
fn a_device_refuses_models_whose_ops_its_kernels_lack_naming_them() {
    let device = HipBackend::new(Arc::new(MemoryOnly::default()));
    let cpu = CpuBackend::new(1).unwrap();
    // Llama 2, Qwen2 and Phi-3 (fused projections are row ranges of one
    // matrix) need nothing new.
    for ok in ["llama-q8_0.gguf", "qwen2-q4_0.gguf", "phi3-q8_0.gguf"] {
        fixture(ok).check_backend(&device).unwrap();
    }
    for (name, arch, ops) in [
        ("llama31-q4_0.gguf", "llama", &["rope_freqs"][..]),
        ("qwen2yarn-q8_0.gguf", "qwen2", &["YaRN"]),
        ("qwen3-q4_0.gguf", "qwen3", &["query/key norms"]),
        (
            "gemma2-q4_0.gguf",
            "gemma2",
            &["GELU", "embedding scale", "sliding-window", "soft-capping"],
        ),
        (
            "gemma3-q8_0.gguf",
            "gemma3",
            &[
                "GELU",
                "embedding scale",
                "query/key norms",
                "sliding-window",
            ],
        ),
    ] {
        let model = fixture(name);
        let e = model.check_backend(&device).unwrap_err().to_string();
        assert!(e.contains(&format!("this {arch} model needs")), "{e}");
        for op in ops {
            assert!(e.contains(op), "{name}: {e} does not name {op}");
        }
        // The CPU runs them all.
        model.check_backend(&cpu).unwrap();
    }
}
