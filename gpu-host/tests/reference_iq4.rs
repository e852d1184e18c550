//! IQ4_NL and IQ4_XS end to end: the llama fixture quantized by llama.cpp
//! (`tests/reference/make_iq4.py`), its logits against transformers' F32
//! logits of the same prompt, no worse than llama.cpp's on the same file.

mod logits;

use bulkhead_gpu_host::backend::{Backend, CpuBackend};
use bulkhead_kernels::Isa;
use logits::{error, eval, model, reference_json, rows, tokens};

/// `close`: how far (max |diff| / max |logit|) our logits may be from
/// llama.cpp's on the same file.
fn iq4_no_worse_than_llamacpp(ty: &str, tensor_type: &str, close: f64) {
    let llama = reference_json("llama.json");
    let transformers = rows(&llama["transformers_f32_logits"]);
    let iq4 = reference_json("llama-iq4.json");
    let prompt = tokens(&iq4["prompt_tokens"]);
    assert_eq!(prompt, tokens(&llama["prompt_tokens"]), "same prompt");
    let case = &iq4["types"][ty];
    let llamacpp = rows(&case["llamacpp_logits"]);
    let m = model("llama", ty);
    let quantized = m
        .gguf()
        .tensors()
        .iter()
        .filter(|t| t.ty.name() == tensor_type)
        .count();
    // The file's projections really are of the type under test (llama.cpp
    // keeps the output projection at Q6_K).
    assert!(quantized >= 14, "{ty}: {quantized} {tensor_type} tensors");
    let (_, llamacpp_rms) = error(&llamacpp, &transformers);
    let scalar = CpuBackend::with_isa(2, Isa::Scalar).unwrap();
    let fast = CpuBackend::new(2).unwrap();
    let mut by_backend = Vec::new();
    for b in [&scalar as &dyn Backend, &fast] {
        let ours = eval(&m, b, &prompt);
        let (ours_max, ours_rms) = error(&ours, &transformers);
        let (vs_llamacpp, _) = error(&ours, &llamacpp);
        eprintln!(
            "llama {ty} on {}: vs transformers F32 rms {ours_rms:.4e} max {ours_max:.4e}; \
             llama.cpp rms {llamacpp_rms:.4e}; max rel diff from llama.cpp {vs_llamacpp:.2e}",
            b.name()
        );
        // Same weights, same activation quantization (Q8_0 / Q8_K) as
        // llama.cpp; only the order of float sums differs.
        assert!(
            ours_rms <= llamacpp_rms * 1.01,
            "llama {ty} on {}: rms error {ours_rms:.4e}, llama.cpp's {llamacpp_rms:.4e}",
            b.name()
        );
        // And the two computations agree closely: a wrong table entry or
        // scale bit would move them apart by 1e-2 and more.
        assert!(
            vs_llamacpp < close,
            "llama {ty} on {}: {vs_llamacpp:.3e} from llama.cpp",
            b.name()
        );
        by_backend.push(ours);
    }
    let (max, _) = error(&by_backend[0], &by_backend[1]);
    assert!(max < 1e-4, "llama {ty}: scalar vs SIMD max rel {max:.3e}");
}

#[test]
fn llama_iq4_nl_no_worse_than_llamacpp() {
    // Q8_0 activations, quantized as llama.cpp does: measured 5.5e-7.
    iq4_no_worse_than_llamacpp("iq4_nl", "IQ4_NL", 1e-5);
}

#[test]
fn llama_iq4_xs_no_worse_than_llamacpp() {
    // Q8_K activations: measured 1.2e-3, as on the Q8_K-paired types
    // before (llama-q4_k_m.gguf: 1.8e-3 from llama.cpp, the same rms error).
    iq4_no_worse_than_llamacpp("iq4_xs", "IQ4_XS", 3e-3);
}
