//! The model families beyond Llama 2 and Qwen2 (Llama 3.1 RoPE scaling,
//! Qwen2 with YaRN, Qwen3, Phi-3, Gemma 2, Gemma 3) against independent
//! references: logits and greedy tokens from Hugging Face transformers
//! (F32, the models built with transformers' own classes) and llama.cpp's
//! error on the quantized file, as `tests/reference/make_families.py`
//! recorded them on files llama.cpp's `convert_hf_to_gguf.py` converted.

mod logits;

use bulkhead_gpu_host::backend::{Backend, CpuBackend};
use bulkhead_kernels::Isa;
use logits::{backend, error, eval, greedy, model, reference};

/// The bound on F32 logits against transformers (max |diff| over
/// max |logit|). Measured errors are printed; they sit well below it.
const F32_BOUND: f64 = 1e-4;

fn f32_logits_match_transformers(family: &str) {
    let r = reference(family);
    let m = model(family, "f32");
    for b in [CpuBackend::with_isa(2, Isa::Scalar).unwrap(), backend()] {
        let ours = eval(&m, &b, &r.prompt_tokens);
        let (max_rel, rms_rel) = error(&ours, &r.transformers_f32_logits);
        let (llama_max, _) = error(&r.llamacpp["f32"], &r.transformers_f32_logits);
        eprintln!(
            "{family} f32 {}: max rel {max_rel:.2e}, rms rel {rms_rel:.2e} (llama.cpp: max rel {llama_max:.2e})",
            b.name()
        );
        assert!(
            max_rel < F32_BOUND,
            "{family} f32 on {}: max rel error {max_rel:.3e}",
            b.name()
        );
    }
}

fn greedy_matches_transformers(family: &str) {
    let r = reference(family);
    let m = model(family, "f32");
    let ours = greedy(
        &m,
        &backend(),
        &r.greedy.prompt_tokens,
        r.greedy.tokens.len(),
    );
    assert_eq!(
        ours, r.greedy.tokens,
        "{family}: greedy tokens differ from transformers"
    );
}

/// How much worse than llama.cpp's our quantized error may be: 1% (the
/// order of float sums), and 3% for the GeGLU families. llama.cpp computes
/// GELU from an f16 table (its F32 error against transformers is 2-3e-4
/// there, ours 5e-7), and through the activations' quantization that
/// perturbation moves its quantized error by a few percent either way:
/// with the table emulated our Gemma errors equal llama.cpp's to four
/// digits; with the exact GELU gemma3 Q8_0 measured 2.7% above it on the
/// 20 recorded positions and 0.4% above over 160 positions of another text.
fn tolerance(family: &str) -> f64 {
    if family.starts_with("gemma") {
        1.03
    } else {
        1.01
    }
}

fn quantized_no_worse_than_llamacpp(family: &str) {
    let r = reference(family);
    let b = backend();
    let mut checked = 0;
    for (ty, llama_logits) in &r.llamacpp {
        if ty == "f32" {
            continue;
        }
        let m = model(family, ty);
        let (llama_max, llama_rms) = error(llama_logits, &r.transformers_f32_logits);
        // The file's layout, then (on AVX-512 VNNI) the weights packed as
        // `generate`, `eval` and `bench` load them.
        for packed in [false, true] {
            if packed {
                m.preload(&b).unwrap();
            }
            let ours = eval(&m, &b, &r.prompt_tokens);
            let (ours_max, ours_rms) = error(&ours, &r.transformers_f32_logits);
            eprintln!(
                "{family} {ty} ({} matrices packed): error vs transformers F32 — ours rms \
                 {ours_rms:.3e} max {ours_max:.3e}; llama.cpp rms {llama_rms:.3e} max {llama_max:.3e}",
                m.packed_matrices()
            );
            // Same weights and activation quantization as llama.cpp; see
            // `tolerance`.
            assert!(
                ours_rms <= llama_rms * tolerance(family),
                "{family} {ty}: our rms error {ours_rms:.3e} is worse than llama.cpp's {llama_rms:.3e}"
            );
        }
        checked += 1;
    }
    assert!(checked > 0, "{family}: no quantized file recorded");
}

macro_rules! family {
    ($family:ident) => {
        mod $family {
            #[test]
            fn f32_logits_match_transformers() {
                super::f32_logits_match_transformers(stringify!($family));
            }

            #[test]
            fn greedy_matches_transformers() {
                super::greedy_matches_transformers(stringify!($family));
            }

            #[test]
            fn quantized_no_worse_than_llamacpp() {
                super::quantized_no_worse_than_llamacpp(stringify!($family));
            }
        }
    };
}

family!(llama31);
family!(qwen2yarn);
family!(qwen3);
family!(phi3);
family!(gemma2);
family!(gemma3);
