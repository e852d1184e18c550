//! The committed quickstart model, `models/bulkhead-demo-tiny/bulkhead-demo-tiny-q8_0.gguf`,
//! against the fixture `tools/demo-model/train.py` recorded next to it: the
//! model loads, its tokenizer gives Hugging Face `tokenizers`' ids and
//! round-trips text, and greedy decoding matches llama.cpp token for token.

use std::path::PathBuf;

use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::backend::CpuBackend;
use bulkhead_gpu_host::engine::{Logits, Model, argmax};
use serde::Deserialize;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

#[derive(Deserialize)]
struct Reference {
    prompt: String,
    prompt_tokens: Vec<u32>,
    greedy_llamacpp: Vec<u32>,
    tokenizer_cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn reference() -> Reference {
    let path = models().join("bulkhead-demo-tiny.reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn model() -> Model {
    Model::open(models().join("bulkhead-demo-tiny/bulkhead-demo-tiny-q8_0.gguf")).unwrap()
}

fn tokenizer(model: &Model) -> Tokenizer {
    Tokenizer::from_metadata(model.gguf().metadata()).unwrap()
}

#[test]
fn demo_model_loads() {
    let m = model();
    let c = m.config();
    assert_eq!(c.vocab_size, 4096);
    assert!(c.context_length >= 256);
    let md = m.gguf().metadata();
    assert_eq!(
        md.require_str("general.name").unwrap(),
        "bulkhead-demo-tiny"
    );
    assert!(md.require_str("tokenizer.chat_template").is_ok());
}

#[test]
fn demo_tokenizer_matches_hf_and_round_trips() {
    let r = reference();
    let m = model();
    let tok = tokenizer(&m);
    for case in &r.tokenizer_cases {
        let ids = tok.encode(&case.text, false);
        assert_eq!(
            ids, case.ids,
            "ids of {:?} differ from HF tokenizers",
            case.text
        );
        assert_eq!(
            tok.decode(&ids),
            case.text,
            "decode(encode({:?}))",
            case.text
        );
    }
    for text in [
        "She was the youngest of the two daughters of a most affectionate, indulgent father.",
        "\"Oh! Mr. Knightley,\" cried Emma -- 'twas 1816.\n\nNext paragraph.",
        "tabs\tand   runs of   spaces,\r\nCRLF, and ünïcödé 🦀",
    ] {
        assert_eq!(tok.decode(&tok.encode(text, false)), text);
    }
    assert_eq!(
        tok.encode(&r.prompt, true),
        r.prompt_tokens,
        "prompt tokens differ from llama.cpp"
    );
}

#[test]
fn demo_greedy_matches_llamacpp() {
    let r = reference();
    let m = model();
    let backend = CpuBackend::new(2).unwrap();
    let n = r.greedy_llamacpp.len();
    let mut cache = m.new_cache(r.prompt_tokens.len() + n);
    let mut logits = m
        .forward(&backend, &mut cache, &r.prompt_tokens, Logits::Last)
        .unwrap();
    let mut ours = Vec::with_capacity(n);
    for _ in 0..n {
        let next = argmax(&logits);
        ours.push(next);
        logits = m
            .forward(&backend, &mut cache, &[next], Logits::Last)
            .unwrap();
    }
    let tok = tokenizer(&m);
    assert_eq!(
        ours,
        r.greedy_llamacpp,
        "greedy tokens differ from llama.cpp:\n ours:      {:?}\n llama.cpp: {:?}",
        tok.decode(&ours),
        tok.decode(&r.greedy_llamacpp)
    );
}
