//! Mixture-of-experts models against independent references: tiny
//! random-weight `MixtralForCausalLM` and `Qwen3MoeForCausalLM` models from
//! transformers, converted by
//! llama.cpp's `convert_hf_to_gguf.py` and quantized by llama.cpp
//! (`tests/reference/make_moe.py`).

mod logits;

use bulkhead_gpu_host::backend::{Backend, CpuBackend};
use bulkhead_gpu_host::engine::{Logits, argmax};
use bulkhead_kernels::Isa;
use logits::{error, eval, model, reference_json, rows, tokens};

fn f32_logits_match_transformers(family: &str) {
    let r = reference_json(&format!("{family}.json"));
    let prompt = tokens(&r["prompt_tokens"]);
    let want = rows(&r["transformers_f32_logits"]);
    let m = model(family, "f32");
    assert!(m.config().moe.is_some(), "{family}: a mixture of experts");
    for b in [
        CpuBackend::with_isa(2, Isa::Scalar).unwrap(),
        CpuBackend::new(2).unwrap(),
    ] {
        let ours = eval(&m, &b, &prompt);
        let (max_rel, rms_rel) = error(&ours, &want);
        eprintln!(
            "{family} f32 {}: max rel {max_rel:.2e}, rms rel {rms_rel:.2e}",
            b.name()
        );
        // The bound is 1e-4; llama.cpp's own F32 reaches 5e-7.
        assert!(
            max_rel < 1e-5,
            "{family} f32 on {}: max rel {max_rel:.3e}",
            b.name()
        );
    }
}

fn greedy_matches_transformers(family: &str) {
    let r = reference_json(&format!("{family}.json"));
    let prompt = tokens(&r["greedy"]["prompt_tokens"]);
    let want = tokens(&r["greedy"]["tokens"]);
    let m = model(family, "f32");
    let b = CpuBackend::new(2).unwrap();
    let mut cache = m.new_cache(prompt.len() + want.len());
    let mut logits = m.forward(&b, &mut cache, &prompt, Logits::Last).unwrap();
    let mut ours = Vec::new();
    for _ in 0..want.len() {
        let next = argmax(&logits);
        ours.push(next);
        logits = m.forward(&b, &mut cache, &[next], Logits::Last).unwrap();
    }
    assert_eq!(
        ours, want,
        "{family}: greedy tokens differ from transformers"
    );
}

fn quantized_no_worse_than_llamacpp(family: &str) {
    let r = reference_json(&format!("{family}.json"));
    let prompt = tokens(&r["prompt_tokens"]);
    let want = rows(&r["transformers_f32_logits"]);
    let b = CpuBackend::new(2).unwrap();
    let types = r["llamacpp"].as_object().expect("llamacpp logits");
    for (ty, llamacpp) in types {
        if ty == "f32" {
            continue;
        }
        let m = model(family, ty);
        let ours = eval(&m, &b, &prompt);
        let (ours_max, ours_rms) = error(&ours, &want);
        let (llama_max, llama_rms) = error(&rows(llamacpp), &want);
        let (vs_llamacpp, _) = error(&ours, &rows(llamacpp));
        eprintln!(
            "{family} {ty}: vs transformers F32 ours rms {ours_rms:.4e} max {ours_max:.4e}; \
             llama.cpp rms {llama_rms:.4e} max {llama_max:.4e}; ours vs llama.cpp max {vs_llamacpp:.2e}"
        );
        assert!(
            ours_rms <= llama_rms * 1.01,
            "{family} {ty}: our rms error {ours_rms:.4e} is worse than llama.cpp's {llama_rms:.4e}"
        );
    }
}

#[test]
fn mixtral_f32_logits_match_transformers() {
    f32_logits_match_transformers("mixtral");
}

#[test]
fn mixtral_greedy_matches_transformers() {
    greedy_matches_transformers("mixtral");
}

#[test]
fn mixtral_quantized_no_worse_than_llamacpp() {
    quantized_no_worse_than_llamacpp("mixtral");
}

#[test]
fn qwen3moe_f32_logits_match_transformers() {
    f32_logits_match_transformers("qwen3moe");
}

#[test]
fn qwen3moe_greedy_matches_transformers() {
    greedy_matches_transformers("qwen3moe");
}

#[test]
fn qwen3moe_quantized_no_worse_than_llamacpp() {
    quantized_no_worse_than_llamacpp("qwen3moe");
}
