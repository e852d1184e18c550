//! Reading hyperparameters: each architecture's defaults, and errors that
//! name the key.

use super::*;
use crate::gguf::writer::GgufWriter;
use bulkhead_kernels::RopeStyle;

/// A GGUF with `arch`'s required hyperparameters and `extra` metadata.
fn gguf(arch: &str, extra: Vec<(String, Value)>) -> Gguf {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String(arch.into()));
    for (k, v) in [
        ("embedding_length", 64u64),
        ("block_count", 6),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("feed_forward_length", 128),
        ("context_length", 512),
        ("vocab_size", 32),
    ] {
        w.metadata(&format!("{arch}.{k}"), Value::U32(v as u32));
    }
    for (k, v) in extra {
        w.metadata(&k, v);
    }
    Gguf::from_bytes("test.gguf", &w.to_bytes()).unwrap()
}

fn config(arch: &str, extra: Vec<(String, Value)>) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_gguf(&gguf(arch, extra))
}

fn kv(key: &str, v: Value) -> (String, Value) {
    (key.to_string(), v)
}

#[test]
fn llama_and_qwen_keep_their_defaults() {
    let c = config("llama", vec![]).unwrap();
    assert_eq!(
        (c.head_dim, c.rope.dim, c.rope.style),
        (16, 16, RopeStyle::Normal)
    );
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(
        (c.embedding_scale, c.attn_softcap, c.final_softcap),
        (None, None, None)
    );
    assert_eq!(c.attention_scale, 0.25);
    assert!((0..6).all(|l| c.window(l).is_none()));
    assert_eq!((c.rope.scale, c.rope.yarn), (1.0, None));
    let c = config("qwen3", vec![]).unwrap();
    assert_eq!(c.rope.style, RopeStyle::Neox);
}

#[test]
fn key_length_sets_the_head_size() {
    let c = config(
        "qwen3",
        vec![kv("qwen3.attention.key_length", Value::U32(32))],
    )
    .unwrap();
    assert_eq!(
        (c.head_dim, c.q_dim(), c.kv_dim(), c.rope.dim),
        (32, 128, 64, 32)
    );
    assert_eq!(c.attention_scale, 1.0 / 32f32.sqrt());
    let e = config(
        "qwen3",
        vec![
            kv("qwen3.attention.key_length", Value::U32(32)),
            kv("qwen3.attention.value_length", Value::U32(16)),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("qwen3.attention.value_length"), "{e}");
}

#[test]
fn gemma2_defaults_follow_llama_cpp() {
    let c = config("gemma2", vec![]).unwrap();
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embedding_scale, Some(8.0));
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    // A 4096 window on every other layer, from the first.
    let windows: Vec<_> = (0..6).map(|l| c.window(l)).collect();
    assert_eq!(
        windows,
        [Some(4096), None, Some(4096), None, Some(4096), None]
    );
    let c = config(
        "gemma2",
        vec![
            kv("gemma2.attention.sliding_window", Value::U32(8)),
            kv("gemma2.attn_logit_softcapping", Value::F32(20.0)),
        ],
    )
    .unwrap();
    assert_eq!((c.window(0), c.attn_softcap), (Some(8), Some(20.0)));
}

#[test]
fn gemma3_slides_five_layers_in_six_with_their_own_rope_base() {
    let c = config(
        "gemma3",
        vec![
            kv("gemma3.attention.sliding_window", Value::U32(8)),
            kv("gemma3.rope.freq_base", Value::F32(1e6)),
            kv("gemma3.rope.scaling.type", Value::String("linear".into())),
            kv("gemma3.rope.scaling.factor", Value::F32(8.0)),
        ],
    )
    .unwrap();
    let windows: Vec<_> = (0..6).map(|l| c.window(l)).collect();
    assert_eq!(windows, [Some(8), Some(8), Some(8), Some(8), Some(8), None]);
    assert_eq!(c.rope.base_and_scale(true), (10_000.0, 1.0));
    assert_eq!(c.rope.base_and_scale(false), (1e6, 0.125));
    assert_eq!((c.attn_softcap, c.final_softcap), (None, None));
    // No window key: no sliding layers at all.
    let c = config("gemma3", vec![]).unwrap();
    assert!((0..6).all(|l| c.window(l).is_none()));
    // A pattern as flags, one per layer.
    let c = config(
        "gemma3",
        vec![
            kv("gemma3.attention.sliding_window", Value::U32(8)),
            kv(
                "gemma3.attention.sliding_window_pattern",
                Value::Array(Array::Bool(vec![true, false, true, true, false, false])),
            ),
        ],
    )
    .unwrap();
    let windows: Vec<_> = (0..6).map(|l| c.window(l).is_some()).collect();
    assert_eq!(windows, [true, false, true, true, false, false]);
    let e = config(
        "gemma3",
        vec![
            kv("gemma3.attention.sliding_window", Value::U32(8)),
            kv(
                "gemma3.attention.sliding_window_pattern",
                Value::Array(Array::Bool(vec![true])),
            ),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("gemma3.attention.sliding_window_pattern"), "{e}");
}

#[test]
fn yarn_reads_its_keys_and_defaults_to_transformers_attention_factor() {
    let c = config(
        "qwen2",
        vec![
            kv("qwen2.rope.scaling.type", Value::String("yarn".into())),
            kv("qwen2.rope.scaling.factor", Value::F32(4.0)),
            kv(
                "qwen2.rope.scaling.original_context_length",
                Value::U32(128),
            ),
        ],
    )
    .unwrap();
    let y = c.rope.yarn.unwrap();
    assert_eq!(
        (c.rope.scale, y.orig_ctx, y.beta_fast, y.beta_slow),
        (0.25, 128, 32.0, 1.0)
    );
    assert!((y.attn_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-7);
    let e = config(
        "qwen2",
        vec![
            kv("qwen2.rope.scaling.type", Value::String("yarn".into())),
            kv("qwen2.rope.scaling.factor", Value::F32(4.0)),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("qwen2.rope.scaling.original_context_length"),
        "{e}"
    );
    let e = config(
        "phi3",
        vec![kv(
            "phi3.rope.scaling.type",
            Value::String("longrope".into()),
        )],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("phi3.rope.scaling.type") && e.contains("longrope"),
        "{e}"
    );
}

#[test]
fn unknown_architectures_are_named_with_the_supported_list() {
    let e = config("mamba", vec![]).unwrap_err().to_string();
    assert!(e.contains("\"mamba\"") && e.contains("gemma3"), "{e}");
}

#[test]
fn windows_apply_where_llama_cpp_applies_them_and_phi3_as_transformers() {
    // llama.cpp's llama and qwen graphs have no window: neither have we.
    let c = config(
        "llama",
        vec![kv("llama.attention.sliding_window", Value::U32(4096))],
    )
    .unwrap();
    assert!(c.window(0).is_none());
    // Phi-4 writes a zero window: none.
    let c = config(
        "phi3",
        vec![kv("phi3.attention.sliding_window", Value::U32(0))],
    )
    .unwrap();
    assert!(c.window(0).is_none());
    let c = config(
        "phi3",
        vec![kv("phi3.attention.sliding_window", Value::U32(2047))],
    )
    .unwrap();
    assert!((0..6).all(|l| c.window(l) == Some(2047)));
}

#[test]
fn qwen3moe_is_qwen3_with_experts_it_must_have() {
    let c = config(
        "qwen3moe",
        vec![
            kv("qwen3moe.expert_count", Value::U32(8)),
            kv("qwen3moe.expert_used_count", Value::U32(2)),
            kv("qwen3moe.expert_feed_forward_length", Value::U32(48)),
        ],
    )
    .unwrap();
    assert_eq!((c.arch, c.rope.style), (Arch::Qwen3Moe, RopeStyle::Neox));
    let moe = c.moe.expect("experts");
    assert_eq!(
        (moe.experts, moe.experts_used, moe.expert_ffn_dim),
        (8, 2, 48)
    );
    let e = config("qwen3moe", vec![]).unwrap_err().to_string();
    assert!(e.contains("qwen3moe.expert_count"), "{e}");
    // The dense Qwen3 reads no experts even when a key names some.
    let c = config("qwen3", vec![kv("qwen3.expert_count", Value::U32(8))]).unwrap();
    assert!(c.moe.is_none());
}
