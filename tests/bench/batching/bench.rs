//! Batched decode throughput (a measurement, not a check; run with
//! `tests/bench/batching/run`): total decode tokens/s of the continuous
//! batcher with N concurrent sequences, against one sequence at a time
//! (`generate`, the contiguous cache, as the CLI runs it).
//!
//! The model is a random-weights Llama of ~114M parameters (dim 768, 12
//! layers, 12 heads, ffn 3072; Q8_0, or F32 with `--weights f32`), written
//! with the in-repo GGUF writer and the fixture tokenizer (768 tokens). Throughput does not depend on
//! what the weights say; the row of the end-of-sequence token in the output
//! projection is zero so no sequence stops early.
//!
//! Decode time is measured from the step after every sequence has its
//! first token (prefill done) to the end; tokens are those streamed in it
//! (a token whose text is held back for a multi-byte character arrives
//! with the next one, so the window's count can be off by one per sequence).

use std::cell::Cell;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::backend::{Backend, CpuBackend};
use bulkhead_gpu_host::engine::{
    Decoded, GenerateRequest, Logits, Model, Piece, SamplingParams, generate,
};
use bulkhead_gpu_host::gguf::Gguf;
use bulkhead_gpu_host::gguf::Value;
use bulkhead_gpu_host::gguf::writer::GgufWriter;
use bulkhead_gpu_host::sched::{BatchLimits, Batcher, NewSequence, SequenceError, SequenceSink};
use bulkhead_kernels::{GgmlType, Isa};

const DIM: usize = 768;
const LAYERS: usize = 12;
const HEADS: usize = 12;
const FFN: usize = 3072;
const CONTEXT: u32 = 1024;

struct Args {
    threads: usize,
    repeats: usize,
    max_tokens: usize,
    concurrency: Vec<usize>,
    weights: GgmlType,
    isas: Vec<Isa>,
    /// Repack the weights as `serve` does (on a VNNI backend).
    pack: bool,
}

fn args() -> Args {
    let mut a = Args {
        threads: 2,
        repeats: 3,
        max_tokens: 64,
        concurrency: vec![1, 4, 16, 32],
        weights: GgmlType::Q8_0,
        isas: vec![Isa::detect()],
        pack: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--no-pack" {
            a.pack = false;
            continue;
        }
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--threads" => a.threads = value.parse().expect("--threads N"),
            "--repeats" => a.repeats = value.parse().expect("--repeats N"),
            "--max-tokens" => a.max_tokens = value.parse().expect("--max-tokens N"),
            "--concurrency" => {
                a.concurrency = value
                    .split(',')
                    .map(|n| n.parse().expect("--concurrency 1,4,16"))
                    .collect()
            }
            "--weights" => {
                a.weights = match value.as_str() {
                    "q8_0" => GgmlType::Q8_0,
                    "f32" => GgmlType::F32,
                    _ => panic!("--weights q8_0|f32"),
                }
            }
            "--isa" => {
                a.isas = value
                    .split(',')
                    .map(|isa| match isa {
                        "scalar" => Isa::Scalar,
                        "avx2" => Isa::Avx2,
                        "avx512vnni" => Isa::Avx512Vnni,
                        _ => panic!("--isa scalar|avx2|avx512vnni[,…]"),
                    })
                    .collect()
            }
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

/// xorshift64: cheap, seeded, good enough for random weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `rows × cols` Q8_0 bytes: per 32 weights an f16 scale and 32 int8s,
/// weights uniform in about ±0.02. `zero_row` is all zeros.
fn q8_0(rng: &mut Rng, rows: usize, cols: usize, zero_row: Option<usize>) -> Vec<u8> {
    let scale = half::f16::from_f32(0.02 / 127.0).to_le_bytes();
    let mut out = Vec::with_capacity(rows * cols / 32 * 34);
    for r in 0..rows {
        for _ in 0..cols / 32 {
            if Some(r) == zero_row {
                out.extend_from_slice(&[0; 34]);
                continue;
            }
            out.extend_from_slice(&scale);
            let (a, b, c, d) = (rng.next(), rng.next(), rng.next(), rng.next());
            for word in [a, b, c, d] {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
    }
    out
}

/// `rows × cols` random weights of type `ty` (Q8_0 or F32), about ±0.02.
fn matrix(
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    zero_row: Option<usize>,
) -> Vec<u8> {
    if ty == GgmlType::Q8_0 {
        return q8_0(rng, rows, cols, zero_row);
    }
    let mut out = Vec::with_capacity(rows * cols * 4);
    for r in 0..rows {
        for _ in 0..cols {
            let v = if Some(r) == zero_row {
                0.0
            } else {
                ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
            };
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Writes the bench model next to the fixtures' tokenizer, once.
fn model_file(out: &Path, ty: GgmlType) -> PathBuf {
    let path = out.join(format!("batching-110m-{}.gguf", ty.name().to_lowercase()));
    if path.exists() {
        return path;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fixture = Gguf::open(root.join("tests/fixtures/models/llama-q8_0.gguf")).unwrap();
    let vocab = 768usize;
    let eos = fixture
        .metadata()
        .get_u32("tokenizer.ggml.eos_token_id")
        .unwrap()
        .unwrap_or(2) as usize;
    let mut w = GgufWriter::new();
    let dims = [
        ("llama.block_count", LAYERS as u32),
        ("llama.context_length", CONTEXT),
        ("llama.embedding_length", DIM as u32),
        ("llama.feed_forward_length", FFN as u32),
        ("llama.attention.head_count", HEADS as u32),
        ("llama.attention.head_count_kv", HEADS as u32),
        ("llama.attention.key_length", (DIM / HEADS) as u32),
        ("llama.attention.value_length", (DIM / HEADS) as u32),
        ("llama.rope.dimension_count", (DIM / HEADS) as u32),
    ];
    for (key, value) in fixture.metadata().iter() {
        match dims.iter().find(|(k, _)| *k == key) {
            Some((_, v)) => w.metadata(key, Value::U32(*v)),
            None if key == "general.name" => {
                w.metadata(key, Value::String("bulkhead-bench-110m".into()))
            }
            None => w.metadata(key, value.clone()),
        };
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let d = DIM as u64;
    let ones = vec![1.0f32; DIM];
    w.tensor(
        "token_embd.weight",
        &[d, vocab as u64],
        ty,
        matrix(&mut rng, ty, vocab, DIM, None),
    );
    w.tensor(
        "output.weight",
        &[d, vocab as u64],
        ty,
        matrix(&mut rng, ty, vocab, DIM, Some(eos)),
    );
    w.tensor_f32("output_norm.weight", &[d], &ones);
    for l in 0..LAYERS {
        let n = |t: &str| format!("blk.{l}.{t}");
        for t in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            w.tensor(
                &n(&format!("{t}.weight")),
                &[d, d],
                ty,
                matrix(&mut rng, ty, DIM, DIM, None),
            );
        }
        for t in ["ffn_gate", "ffn_up"] {
            w.tensor(
                &n(&format!("{t}.weight")),
                &[d, FFN as u64],
                ty,
                matrix(&mut rng, ty, FFN, DIM, None),
            );
        }
        w.tensor(
            &n("ffn_down.weight"),
            &[FFN as u64, d],
            ty,
            matrix(&mut rng, ty, DIM, FFN, None),
        );
        w.tensor_f32(&n("attn_norm.weight"), &[d], &ones);
        w.tensor_f32(&n("ffn_norm.weight"), &[d], &ones);
    }
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// Counts tokens; nothing else.
struct Count(Rc<Cell<usize>>);

impl SequenceSink for Count {
    fn started(&mut self) {}
    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
        self.0.set(self.0.get() + piece.tokens.len());
        ControlFlow::Continue(())
    }
    fn check(&mut self) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
    fn finished(&mut self, result: Result<Decoded, SequenceError>) {
        if let Err(e) = result {
            panic!("a bench sequence failed: {e}");
        }
    }
}

fn request(tok: &Tokenizer, i: usize, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens: tok.encode(&format!("Story number {i}: once upon a time"), true),
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
    }
}

/// Decode tokens/s of `n` sequences in one batch.
fn batched(
    model: &Model,
    tok: &Tokenizer,
    backend: &CpuBackend,
    n: usize,
    max_tokens: usize,
) -> f64 {
    let per_seq_blocks = (32 + max_tokens).div_ceil(16) as u32;
    let limits = BatchLimits {
        max_running: n,
        max_rows: n,
        kv_blocks: per_seq_blocks * n as u32,
    };
    let mut batcher = Batcher::new(model, limits).unwrap();
    let counts: Vec<Rc<Cell<usize>>> = (0..n).map(|_| Rc::new(Cell::new(0))).collect();
    for (i, c) in counts.iter().enumerate() {
        batcher.add(
            tok,
            NewSequence {
                tenant: "bench".into(),
                priority: 0,
                request: request(tok, i, max_tokens),
                sink: Box::new(Count(c.clone())),
            },
        );
    }
    while counts.iter().any(|c| c.get() == 0) {
        batcher.step(model, tok, backend).unwrap();
    }
    let first: usize = counts.iter().map(|c| c.get()).sum();
    let start = Instant::now();
    while !batcher.is_idle() {
        batcher.step(model, tok, backend).unwrap();
    }
    let elapsed = start.elapsed();
    let total = counts.iter().map(|c| c.get()).sum::<usize>();
    assert_eq!(total, n * max_tokens, "a sequence stopped early");
    (total - first) as f64 / elapsed.as_secs_f64()
}

/// Decode tokens/s of one `generate` call (the CLI path, contiguous cache).
fn alone(model: &Model, tok: &Tokenizer, backend: &CpuBackend, max_tokens: usize) -> f64 {
    let g = generate(
        model,
        tok,
        backend,
        &request(tok, 0, max_tokens),
        &mut |_| {},
    )
    .unwrap();
    // The first token comes from the prefill's logits; the loop ran the rest.
    (g.tokens.len() - 1) as f64 / g.decode_time.as_secs_f64()
}

/// Milliseconds of one forward call of `n` prompt tokens (a prefill chunk),
/// the step time a joining prompt adds for every running sequence.
fn chunk_ms(model: &Model, backend: &CpuBackend, n: usize) -> f64 {
    let tokens: Vec<u32> = (0..n as u32).map(|i| 3 + i % 700).collect();
    let mut cache = model.new_cache(n);
    let start = Instant::now();
    model
        .forward(backend, &mut cache, &tokens, Logits::Last)
        .unwrap();
    start.elapsed().as_secs_f64() * 1e3
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let a = args();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-models");
    let path = model_file(&out, a.weights);
    let model = Model::open(&path).unwrap();
    let tok = Tokenizer::from_metadata(model.gguf().metadata()).unwrap();
    let backends: Vec<CpuBackend> = a
        .isas
        .iter()
        .map(|&isa| {
            CpuBackend::with_isa(a.threads, isa).unwrap_or_else(|e| panic!("--isa {isa:?}: {e}"))
        })
        .collect();
    // As `serve` does: the matrices the VNNI kernels have a packed form for
    // are repacked once (the file's pages stay, for the other backends).
    let packed = match backends.iter().find(|b| b.name().contains("vnni")) {
        Some(vnni) if a.pack => model.pack(vnni, |_| {}),
        _ => 0,
    };
    let bytes = std::fs::metadata(&path).unwrap().len();
    let names: Vec<String> = backends.iter().map(|b| b.name()).collect();
    println!(
        "model {} ({:.0} MB, {} layers, dim {}, ffn {}, {packed} matrices packed), backends {} × {} threads, max_tokens {}, repeats {} (median)",
        path.display(),
        bytes as f64 / 1e6,
        LAYERS,
        DIM,
        FFN,
        names.join(", "),
        a.threads,
        a.max_tokens,
        a.repeats
    );
    for b in &backends {
        // Warm-up: page in the weights, start the pool's threads.
        alone(&model, &tok, b, 8);
        let chunks: Vec<String> = [1, 16, 64, 256]
            .iter()
            .map(|&n| format!("{n}: {:.0} ms", chunk_ms(&model, b, n)))
            .collect();
        println!(
            "{}: one forward call of N prompt tokens: {}",
            b.name(),
            chunks.join(", ")
        );
    }
    // Each repeat runs one at a time and then every concurrency, for every
    // backend in turn, so drift in the machine's load lands on all alike;
    // the ratio is taken within a repeat, then the median over repeats.
    let (n_b, n_c) = (backends.len(), a.concurrency.len());
    let mut alone_rates = vec![Vec::new(); n_b];
    let mut rates = vec![vec![Vec::new(); n_c]; n_b];
    let mut ratios = vec![vec![Vec::new(); n_c]; n_b];
    for _ in 0..a.repeats {
        for (i, b) in backends.iter().enumerate() {
            let one = alone(&model, &tok, b, a.max_tokens);
            alone_rates[i].push(one);
            for (j, &n) in a.concurrency.iter().enumerate() {
                let rate = batched(&model, &tok, b, n, a.max_tokens);
                rates[i][j].push(rate);
                ratios[i][j].push(rate / one);
            }
        }
    }
    println!("| backend | concurrent | decode tok/s (total) | per sequence | vs one at a time |");
    println!("|---|---:|---:|---:|---:|");
    for (i, b) in backends.iter().enumerate() {
        let one = median(alone_rates[i].clone());
        println!(
            "| {} | one at a time (`generate`) | {one:.1} | {one:.1} | 1.00x |",
            b.name()
        );
        for (j, &n) in a.concurrency.iter().enumerate() {
            let rate = median(rates[i][j].clone());
            println!(
                "| {} | {n} | {rate:.1} | {:.1} | {:.2}x |",
                b.name(),
                rate / n as f64,
                median(ratios[i][j].clone())
            );
        }
    }
}
