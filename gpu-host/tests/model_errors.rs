//! Models whose metadata or tensors are wrong are refused with an error that
//! names the key or tensor; a valid tiny model built here runs.

use std::sync::atomic::{AtomicUsize, Ordering};

use bulkhead_gpu_host::backend::CpuBackend;
use bulkhead_gpu_host::engine::{ForwardError, Logits, Model};
use bulkhead_gpu_host::gguf::writer::GgufWriter;
use bulkhead_gpu_host::gguf::{Gguf, Value};

const DIM: u64 = 32;
const FFN: u64 = 64;
const VOCAB: u64 = 16;

/// A tiny llama GGUF; `edit` may change metadata or tensors before writing.
fn tiny_llama(
    edit: impl FnOnce(&mut Vec<(&'static str, Value)>, &mut Vec<(String, Vec<u64>)>),
) -> Vec<u8> {
    let mut meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(DIM as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(VOCAB as u32)),
    ];
    let kv = DIM / 2;
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![DIM, VOCAB]),
        ("blk.0.attn_norm.weight".into(), vec![DIM]),
        ("blk.0.attn_q.weight".into(), vec![DIM, DIM]),
        ("blk.0.attn_k.weight".into(), vec![DIM, kv]),
        ("blk.0.attn_v.weight".into(), vec![DIM, kv]),
        ("blk.0.attn_output.weight".into(), vec![DIM, DIM]),
        ("blk.0.ffn_norm.weight".into(), vec![DIM]),
        ("blk.0.ffn_gate.weight".into(), vec![DIM, FFN]),
        ("blk.0.ffn_up.weight".into(), vec![DIM, FFN]),
        ("blk.0.ffn_down.weight".into(), vec![FFN, DIM]),
        ("output_norm.weight".into(), vec![DIM]),
    ];
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.metadata(k, v);
    }
    let mut seed = 1u32;
    for (name, dims) in tensors {
        let n: u64 = dims.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        w.tensor_f32(&name, &dims, &values);
    }
    w.to_bytes()
}

fn open(bytes: &[u8]) -> Result<Model, String> {
    let dir = std::env::temp_dir().join(format!("bulkhead-model-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = dir.join(format!("{}.gguf", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, bytes).unwrap();
    let result =
        Model::from_gguf(Gguf::open(&path).map_err(|e| e.to_string())?).map_err(|e| e.to_string());
    std::fs::remove_file(&path).unwrap();
    result
}

fn refused(
    edit: impl FnOnce(&mut Vec<(&'static str, Value)>, &mut Vec<(String, Vec<u64>)>),
) -> String {
    open(&tiny_llama(edit)).expect_err("model should be refused")
}

fn set(meta: &mut [(&'static str, Value)], key: &str, value: Value) {
    meta.iter_mut().find(|(k, _)| *k == key).unwrap().1 = value;
}

#[test]
fn a_valid_tiny_model_runs_with_tied_embeddings() {
    let model = open(&tiny_llama(|_, _| {})).unwrap();
    let c = model.config();
    assert_eq!(
        (c.heads, c.kv_heads, c.head_dim, c.vocab_size),
        (4, 2, 8, VOCAB as usize)
    );
    let backend = CpuBackend::new(2).unwrap();
    let mut cache = model.new_cache(8);
    let logits = model
        .forward(&backend, &mut cache, &[1, 2, 3], Logits::All)
        .unwrap();
    assert_eq!(logits.len(), 3 * VOCAB as usize);
    assert!(logits.iter().all(|x| x.is_finite()));

    // Decoding one token after a prefill equals the last row of a full prefill.
    let mut cache2 = model.new_cache(8);
    model
        .forward(&backend, &mut cache2, &[1, 2], Logits::Last)
        .unwrap();
    let last = model
        .forward(&backend, &mut cache2, &[3], Logits::Last)
        .unwrap();
    for (a, b) in last.iter().zip(&logits[2 * VOCAB as usize..]) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn forward_refuses_bad_tokens_and_a_full_cache() {
    let model = open(&tiny_llama(|_, _| {})).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let mut cache = model.new_cache(4);
    let err = model
        .forward(&backend, &mut cache, &[VOCAB as u32], Logits::Last)
        .unwrap_err();
    assert_eq!(
        err,
        ForwardError::TokenOutOfRange {
            token: VOCAB as u32,
            vocab: VOCAB as usize
        }
    );
    let err = model
        .forward(&backend, &mut cache, &[1; 5], Logits::Last)
        .unwrap_err();
    assert_eq!(
        err,
        ForwardError::ContextFull {
            needed: 5,
            capacity: 4
        }
    );
    assert!(cache.is_empty(), "a refused call must not touch the cache");
}

#[test]
fn metadata_problems_name_the_key() {
    let err = refused(|m, _| set(m, "general.architecture", Value::String("gpt-neox".into())));
    assert!(err.contains("gpt-neox"), "{err}");
    let err = refused(|m, _| m.retain(|(k, _)| *k != "llama.block_count"));
    assert!(
        err.contains("llama.block_count") && err.contains("missing"),
        "{err}"
    );
    let err = refused(|m, _| set(m, "llama.attention.head_count_kv", Value::U32(3)));
    assert!(err.contains("head_count_kv"), "{err}");
    let err = refused(|m, _| set(m, "llama.block_count", Value::U32(1_000_000)));
    assert!(err.contains("llama.block_count"), "{err}");
    let err = refused(|m, _| set(m, "llama.embedding_length", Value::String("32".into())));
    assert!(err.contains("llama.embedding_length"), "{err}");
    let err = refused(|m, _| {
        set(
            m,
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(-1.0),
        )
    });
    assert!(err.contains("layer_norm_rms_epsilon"), "{err}");
    // YaRN without the context it extends; a scaling type we lack.
    let err = refused(|m, _| m.push(("llama.rope.scaling.type", Value::String("yarn".into()))));
    assert!(
        err.contains("llama.rope.scaling.original_context_length"),
        "{err}"
    );
    let err = refused(|m, _| m.push(("llama.rope.scaling.type", Value::String("longrope".into()))));
    assert!(
        err.contains("llama.rope.scaling.type") && err.contains("longrope"),
        "{err}"
    );
}

#[test]
fn tensor_problems_name_the_tensor() {
    let err = refused(|_, t| t.retain(|(n, _)| n != "blk.0.ffn_up.weight"));
    assert!(
        err.contains("blk.0.ffn_up.weight") && err.contains("missing"),
        "{err}"
    );
    let err = refused(|_, t| t[2].1 = vec![DIM, DIM / 2]);
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("shape"),
        "{err}"
    );
    // Llama 3.1's factors: one per rotated pair (head 8: four).
    let err = refused(|_, t| t.push(("rope_freqs.weight".into(), vec![3])));
    assert!(
        err.contains("rope_freqs.weight") && err.contains("shape"),
        "{err}"
    );
    open(&tiny_llama(|_, t| {
        t.push(("rope_freqs.weight".into(), vec![4]))
    }))
    .unwrap();
    // qwen2 requires q/k/v biases.
    let err = refused(|m, _| {
        for (k, v) in m.iter_mut() {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = Box::leak(format!("qwen2.{rest}").into_boxed_str());
            }
            if *k == "general.architecture" {
                *v = Value::String("qwen2".into());
            }
        }
    });
    assert!(err.contains("blk.0.attn_q.bias"), "{err}");
}

/// The tiny model with a mixture of 4 experts (top 2) in place of its FFN.
fn to_moe(meta: &mut Vec<(&'static str, Value)>, tensors: &mut Vec<(String, Vec<u64>)>) {
    meta.push(("llama.expert_count", Value::U32(4)));
    meta.push(("llama.expert_used_count", Value::U32(2)));
    tensors.retain(|(n, _)| !n.starts_with("blk.0.ffn_") || n == "blk.0.ffn_norm.weight");
    tensors.push(("blk.0.ffn_gate_inp.weight".into(), vec![DIM, 4]));
    tensors.push(("blk.0.ffn_gate_exps.weight".into(), vec![DIM, FFN, 4]));
    tensors.push(("blk.0.ffn_up_exps.weight".into(), vec![DIM, FFN, 4]));
    tensors.push(("blk.0.ffn_down_exps.weight".into(), vec![FFN, DIM, 4]));
}

#[test]
fn mixture_of_experts_problems_name_the_key_or_tensor() {
    let model = open(&tiny_llama(to_moe)).unwrap();
    let moe = model.config().moe.expect("a mixture of experts");
    assert_eq!(
        (moe.experts, moe.experts_used, moe.expert_ffn_dim),
        (4, 2, FFN as usize)
    );
    let backend = CpuBackend::new(1).unwrap();
    let mut cache = model.new_cache(4);
    let logits = model
        .forward(&backend, &mut cache, &[1, 2], Logits::All)
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));

    let key = "llama.expert_used_count";
    let err = refused(|m, t| {
        to_moe(m, t);
        m.retain(|(k, _)| *k != key);
    });
    assert!(err.contains(key) && err.contains("missing"), "{err}");
    let err = refused(|m, t| {
        to_moe(m, t);
        set(m, key, Value::U32(5));
    });
    assert!(err.contains(key) && err.contains("1..=4"), "{err}");
    let err = refused(|m, t| {
        to_moe(m, t);
        set(m, "llama.expert_count", Value::U32(1 << 20));
    });
    assert!(err.contains("llama.expert_count"), "{err}");
    for name in [
        "blk.0.ffn_gate_inp.weight",
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_down_exps.weight",
    ] {
        let err = refused(|m, t| {
            to_moe(m, t);
            t.retain(|(n, _)| n != name);
        });
        assert!(err.contains(name) && err.contains("missing"), "{err}");
    }
    // Experts stacked the wrong way round (gate's shape for down).
    let err = refused(|m, t| {
        to_moe(m, t);
        t.last_mut().unwrap().1 = vec![DIM, FFN, 4];
    });
    assert!(
        err.contains("blk.0.ffn_down_exps.weight") && err.contains("shape"),
        "{err}"
    );
}
