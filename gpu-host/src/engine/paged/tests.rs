//! The paged pool and the batched pass against the contiguous cache and
//! single-sequence runs, on the fixture models: bit-identical logits.

use super::*;
use crate::backend::CpuBackend;
use crate::engine::Logits;

fn fixture(name: &str) -> Model {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name);
    Model::open(path).expect("fixture model opens")
}

/// The Llama and Qwen2 files, and one of each newer family: sliding
/// windows (Gemma, a window of 8 that the sequences here outgrow within a
/// block), GeGLU, soft caps, query/key norms, fused projections, RoPE
/// factors and YaRN; IQ4 weights and a mixture of experts (Mixtral).
const MODELS: [&str; 12] = [
    "llama-q8_0.gguf",
    "qwen2-q4_0.gguf",
    "llama-f16.gguf",
    "llama31-q4_0.gguf",
    "qwen2yarn-q8_0.gguf",
    "qwen3-q4_0.gguf",
    "phi3-q8_0.gguf",
    "gemma2-q4_0.gguf",
    "gemma3-q8_0.gguf",
    "llama-iq4_xs.gguf",
    "mixtral-q8_0.gguf",
    "mixtral-f32.gguf",
];

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn argmax(x: &[f32]) -> u32 {
    crate::engine::argmax(x)
}

/// A table of `n` blocks taken from the top of the pool down, every third
/// one from `first`: scattered and out of order, as a busy pool hands them
/// out, and three such tables (`first` 0, 1, 2) interleave without sharing.
fn scattered(first: u32, n: usize, pool: u32) -> Vec<u32> {
    (0..n as u32).map(|i| pool - 1 - (first + 3 * i)).collect()
}

#[test]
fn one_sequence_through_blocks_matches_the_contiguous_cache() {
    let backend = CpuBackend::new(2).unwrap();
    for name in MODELS {
        let model = fixture(name);
        let prompt: Vec<u32> = (0..37).map(|i| 3 + (i * 7) % 200).collect();
        let mut cache = model.new_cache(64);
        let mut want = model
            .forward(&backend, &mut cache, &prompt, Logits::Last)
            .unwrap();
        let mut pool = model.new_kv_blocks(16);
        let table = scattered(0, 4, 16);
        let mut got = model
            .forward_batch(
                &backend,
                &mut pool,
                &[BatchEntry {
                    tokens: &prompt,
                    start_pos: 0,
                    blocks: &table,
                    logits: true,
                }],
            )
            .unwrap();
        for (step, pos) in (prompt.len()..).take(10).enumerate() {
            assert_eq!(bits(&got), bits(&want), "{name}: step {step}");
            let next = [argmax(&want)];
            want = model
                .forward(&backend, &mut cache, &next, Logits::Last)
                .unwrap();
            got = model
                .forward_batch(
                    &backend,
                    &mut pool,
                    &[BatchEntry {
                        tokens: &next,
                        start_pos: pos,
                        blocks: &table,
                        logits: true,
                    }],
                )
                .unwrap();
        }
    }
}

/// Greedy decode of several sequences, each alone (contiguous cache), and
/// all together in batched steps that mix one sequence's prefill chunk
/// with the others' decode rows: the same tokens and the same logit bits.
#[test]
fn batched_steps_match_each_sequence_alone() {
    let backend = CpuBackend::new(2).unwrap();
    for name in MODELS {
        let model = fixture(name);
        let prompts: Vec<Vec<u32>> = [5usize, 19, 33]
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                (0..n as u32)
                    .map(|i| 2 + (i * 13 + s as u32 * 29) % 250)
                    .collect()
            })
            .collect();
        let steps = 12;
        let alone: Vec<Vec<Vec<u32>>> = prompts
            .iter()
            .map(|p| {
                let mut cache = model.new_cache(64);
                let mut logits = model
                    .forward(&backend, &mut cache, p, Logits::Last)
                    .unwrap();
                let mut out = vec![bits(&logits)];
                for _ in 0..steps {
                    let next = [argmax(&logits)];
                    logits = model
                        .forward(&backend, &mut cache, &next, Logits::Last)
                        .unwrap();
                    out.push(bits(&logits));
                }
                out
            })
            .collect();

        let mut pool = model.new_kv_blocks(32);
        let tables: Vec<Vec<u32>> = (0..3).map(|s| scattered(s, 4, 32)).collect();
        // Interleaved tables: adjacent blocks belong to different sequences.
        // Check none is shared.
        let mut all: Vec<u32> = tables.iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 12);

        // Sequence s joins at step s (its whole prompt is one chunk), then
        // decodes along with those already running.
        let mut pos = [0usize; 3];
        let mut next: Vec<Option<u32>> = vec![None; 3];
        let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); 3];
        for step in 0..steps + 3 {
            let inputs: Vec<Vec<u32>> = (0..3)
                .map(|s| match next[s] {
                    Some(t) if got[s].len() <= steps => vec![t],
                    None if s == step => prompts[s].clone(),
                    _ => Vec::new(),
                })
                .collect();
            let entries: Vec<BatchEntry<'_>> = (0..3)
                .filter(|&s| !inputs[s].is_empty())
                .map(|s| BatchEntry {
                    tokens: &inputs[s],
                    start_pos: pos[s],
                    blocks: &tables[s],
                    logits: true,
                })
                .collect();
            let running: Vec<usize> = (0..3).filter(|&s| !inputs[s].is_empty()).collect();
            let logits = model.forward_batch(&backend, &mut pool, &entries).unwrap();
            let vocab = model.config().vocab_size;
            for (row, &s) in logits.chunks_exact(vocab).zip(&running) {
                got[s].push(bits(row));
                pos[s] += inputs[s].len();
                next[s] = Some(argmax(row));
            }
        }
        for s in 0..3 {
            assert_eq!(got[s].len(), steps + 1, "{name}: sequence {s}");
            for (i, (g, w)) in got[s].iter().zip(&alone[s]).enumerate() {
                assert!(g == w, "{name}: sequence {s} differs at step {i}");
            }
        }
    }
}

#[test]
fn bad_entries_are_refused_not_run() {
    let backend = CpuBackend::new(1).unwrap();
    let model = fixture("llama-q8_0.gguf");
    let mut pool = model.new_kv_blocks(4);
    let entry = |tokens, blocks| BatchEntry {
        tokens,
        start_pos: 0,
        blocks,
        logits: true,
    };
    // 17 tokens need two blocks.
    let long = [1u32; 17];
    let err = model
        .forward_batch(&backend, &mut pool, &[entry(&long, &[0])])
        .unwrap_err();
    assert!(matches!(err, ForwardError::ContextFull { .. }), "{err}");
    // A table longer than the pool (blocks repeated) holds no more than
    // the pool: 65 positions do not fit 4 blocks of 16.
    let err = model
        .forward_batch(&backend, &mut pool, &[entry(&[1; 65], &[0, 1, 2, 3, 0])])
        .unwrap_err();
    assert_eq!(
        err,
        ForwardError::ContextFull {
            needed: 65,
            capacity: 64
        }
    );
    let err = model
        .forward_batch(&backend, &mut pool, &[entry(&[1], &[9])])
        .unwrap_err();
    assert!(matches!(err, ForwardError::BlockOutOfRange { .. }), "{err}");
    let err = model
        .forward_batch(&backend, &mut pool, &[entry(&[u32::MAX], &[0])])
        .unwrap_err();
    assert!(matches!(err, ForwardError::TokenOutOfRange { .. }), "{err}");
}

/// A device pass that fails returns the device's error for its call (the
/// pool stays usable); a lost device is out of service for every backend
/// sharing it, whose next pass fails at once without reaching it. On a
/// device that only holds memory: the numbers are meaningless, the calls
/// are what is checked.
#[test]
fn a_failed_device_pass_is_an_error_and_a_lost_device_refuses_the_next() {
    use std::sync::Arc;

    use crate::backend::fake_device::MemoryOnly;
    use crate::backend::{DeviceError, DeviceErrorKind, DeviceWeights, HipBackend};

    let model = fixture("llama-q8_0.gguf");
    let device = Arc::new(MemoryOnly::default());
    let weights = DeviceWeights::new(device.clone());
    let a = HipBackend::sharing(device.clone(), Arc::clone(&weights));
    let b = HipBackend::sharing(device.clone(), weights);
    let vocab = model.config().vocab_size;
    let tokens = [1u32, 2, 3];
    let entry = |blocks: &'static [u32]| BatchEntry {
        tokens: &tokens,
        start_pos: 0,
        blocks,
        logits: true,
    };
    let (mut pool_a, mut pool_b) = (model.new_kv_blocks(4), model.new_kv_blocks(4));
    let logits = model
        .forward_batch(&a, &mut pool_a, &[entry(&[0])])
        .unwrap();
    assert_eq!(logits.len(), vocab, "the pass ran on the device");
    device.fail_launches(DeviceError::new("launch bh_rms_norm", "refused"));
    let kind = |r: Result<Vec<f32>, ForwardError>| match r {
        Err(ForwardError::Device(e)) => e.kind,
        other => panic!("not a device error: {other:?}"),
    };
    assert_eq!(
        kind(model.forward_batch(&a, &mut pool_a, &[entry(&[1])])),
        DeviceErrorKind::Failed
    );
    assert!(
        a.out_of_service().is_none(),
        "a failed launch is not a lost device"
    );
    device.fail_launches(DeviceError::lost("launch", "hipErrorIllegalAddress (700)"));
    assert_eq!(
        kind(model.forward_batch(&a, &mut pool_a, &[entry(&[1])])),
        DeviceErrorKind::Lost
    );
    let launched = device.launches().len();
    assert_eq!(
        kind(model.forward_batch(&b, &mut pool_b, &[entry(&[0])])),
        DeviceErrorKind::Lost
    );
    assert_eq!(
        device.launches().len(),
        launched,
        "nothing reached the device"
    );
}
