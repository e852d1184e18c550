//! The measuring half of tests/gpu/device-check (gpu-host example
//! `gpu_check`; prepare puts it in the bundle). Three commands, each
//! printing one JSON object on stdout:
//!
//! - `write --size 1b|tiny --type q4_0|q8_0|f16 --tokenizer-from GGUF --out FILE`:
//!   a random-weight Llama (1b: dim 2048, 16 layers, 32 heads, 8 KV heads,
//!   FFN 8192, about 0.98B parameters; tiny: dim 64, 2 layers, for the
//!   emulator) with the tokenizer of an existing GGUF. The output row of
//!   the end-of-sequence token is zero, so no sequence stops early.
//! - `decode --backend cuda|emulated --model FILE --batch 1,16,64 --tokens N`:
//!   decode tokens/s of a continuous batch of each size, the effective
//!   weight-read bandwidth that is (the model's bytes, read ⌈B/8⌉ times a
//!   step: the matvecs take 8 rows a pass), the device's own copy bandwidth
//!   measured in the same run (`bh_copy`, device to device), their ratio,
//!   and the median ledger of a decode step.
//! - `isolation --backend cuda|emulated --model FILE --tokens N --flood B`:
//!   two dedicated partitions on disjoint halves of the device; one decodes
//!   one sequence alone, then again while the other runs batches of B
//!   without pause; the p50/p99 inter-token latency of each run.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::backend::{
    Backend, BudgetedDevice, HipBackend, PartitionedDevice, StreamSource, Transfers,
    open_cuda_device, open_cuda_partitions,
};
use bulkhead_gpu_host::engine::{Decoded, GenerateRequest, Model, Piece, SamplingParams};
use bulkhead_gpu_host::gguf::writer::GgufWriter;
use bulkhead_gpu_host::gguf::{Gguf, Value};
use bulkhead_gpu_host::hip::MemoryBudget;
use bulkhead_gpu_host::sched::{BatchLimits, Batcher, NewSequence, SequenceError, SequenceSink};
use bulkhead_kernels::GgmlType;
use bulkhead_kernels::hip::emulator::{Emulator, build_harness};
use bulkhead_kernels::hip::{BinaryArgs, KernelArgs, KernelDevice, names};
use bulkhead_partition::{CuSet, Device};
use serde_json::{Value as Json, json};

fn main() {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let flags = Flags::parse(args);
    let result = match command.as_str() {
        "write" => write(&flags),
        "decode" => decode(&flags),
        "isolation" => isolation(&flags),
        _ => Err("usage: gpu_check write|decode|isolation [--flag value ...]".into()),
    };
    match result {
        Ok(report) => println!("{report}"),
        Err(why) => {
            eprintln!("gpu_check {command}: {why}");
            std::process::exit(1);
        }
    }
}

/// `--name value` pairs.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(mut args: impl Iterator<Item = String>) -> Flags {
        let mut flags = Vec::new();
        while let Some(flag) = args.next() {
            let name = flag.trim_start_matches("--").to_owned();
            flags.push((name, args.next().unwrap_or_default()));
        }
        Flags(flags)
    }

    fn get(&self, name: &str) -> Result<&str, String> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| format!("--{name} is required"))
    }

    fn number(&self, name: &str, default: usize) -> Result<usize, String> {
        match self.get(name) {
            Ok(v) => v
                .parse()
                .map_err(|_| format!("--{name} {v:?}: not a number")),
            Err(_) => Ok(default),
        }
    }
}

// ---- write ------------------------------------------------------------------

struct Shape {
    dim: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
}

const ONE_B: Shape = Shape {
    dim: 2048,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    ffn: 8192,
};
const TINY: Shape = Shape {
    dim: 64,
    layers: 2,
    heads: 2,
    kv_heads: 1,
    ffn: 128,
};

/// xorshift64: cheap, seeded; the weights' values do not matter here.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `rows × cols` random weights of `ty`, about ±0.02; row `zero` all zero.
fn matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize, zero: Option<usize>) -> Vec<u8> {
    let (block, bytes) = (ty.block_elements(), ty.block_bytes());
    let mut out = Vec::with_capacity(rows * cols / block * bytes);
    // One pass writes a Q4_0 or Q8_0 block, or four F16 values.
    let per_pass = block.max(4);
    for r in 0..rows {
        if Some(r) == zero {
            out.resize(out.len() + cols / block * bytes, 0);
            continue;
        }
        for _ in 0..cols / per_pass {
            match ty {
                GgmlType::Q4_0 => {
                    out.extend_from_slice(&half::f16::from_f32(0.02 / 8.0).to_le_bytes());
                    out.extend_from_slice(&rng.next().to_le_bytes());
                    out.extend_from_slice(&rng.next().to_le_bytes());
                }
                GgmlType::Q8_0 => {
                    out.extend_from_slice(&half::f16::from_f32(0.02 / 127.0).to_le_bytes());
                    for _ in 0..4 {
                        out.extend_from_slice(&rng.next().to_le_bytes());
                    }
                }
                _ => {
                    let x = rng.next();
                    for k in 0..4 {
                        let v = ((x >> (16 * k)) as u16 as f32 / 65536.0 - 0.5) * 0.04;
                        out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
    }
    out
}

fn write(f: &Flags) -> Result<Json, String> {
    let shape = match f.get("size")? {
        "1b" => ONE_B,
        "tiny" => TINY,
        other => return Err(format!("--size {other:?}: 1b or tiny")),
    };
    let ty = match f.get("type")? {
        "q4_0" => GgmlType::Q4_0,
        "q8_0" => GgmlType::Q8_0,
        "f16" => GgmlType::F16,
        other => return Err(format!("--type {other:?}: q4_0, q8_0 or f16")),
    };
    let out = PathBuf::from(f.get("out")?);
    let source = Gguf::open(f.get("tokenizer-from")?).map_err(|e| e.to_string())?;
    let md = source.metadata();
    let vocab = Tokenizer::from_metadata(md)
        .map_err(|e| e.to_string())?
        .vocab_size();
    let eos = md
        .get_u32("tokenizer.ggml.eos_token_id")
        .map_err(|e| e.to_string())?
        .unwrap_or(2) as usize;
    let Shape {
        dim,
        layers,
        heads,
        kv_heads,
        ffn,
    } = shape;
    let head = dim / heads;
    let mut w = GgufWriter::new();
    let dims = [
        ("llama.block_count", layers),
        ("llama.context_length", 1024),
        ("llama.embedding_length", dim),
        ("llama.feed_forward_length", ffn),
        ("llama.attention.head_count", heads),
        ("llama.attention.head_count_kv", kv_heads),
        ("llama.attention.key_length", head),
        ("llama.attention.value_length", head),
        ("llama.rope.dimension_count", head),
    ];
    for (key, value) in md.iter() {
        if key.starts_with("tokenizer.") || key == "general.architecture" {
            w.metadata(key, value.clone());
        }
    }
    for (key, v) in dims {
        w.metadata(key, Value::U32(v as u32));
    }
    w.metadata("general.name", Value::String("bulkhead-gpu-check".into()));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (d, kv) = (dim as u64, (kv_heads * head) as u64);
    let ones = vec![1.0f32; dim];
    let started = Instant::now();
    w.tensor(
        "token_embd.weight",
        &[d, vocab as u64],
        ty,
        matrix(&mut rng, ty, vocab, dim, None),
    );
    w.tensor(
        "output.weight",
        &[d, vocab as u64],
        ty,
        matrix(&mut rng, ty, vocab, dim, Some(eos)),
    );
    w.tensor_f32("output_norm.weight", &[d], &ones);
    for l in 0..layers {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        let mut m = |name: &str, rows: u64, cols: u64| {
            let data = matrix(&mut rng, ty, rows as usize, cols as usize, None);
            w.tensor(&n(name), &[cols, rows], ty, data);
        };
        m("attn_q", d, d);
        m("attn_k", kv, d);
        m("attn_v", kv, d);
        m("attn_output", d, d);
        m("ffn_gate", ffn as u64, d);
        m("ffn_up", ffn as u64, d);
        m("ffn_down", d, ffn as u64);
        w.tensor_f32(&n("attn_norm"), &[d], &ones);
        w.tensor_f32(&n("ffn_norm"), &[d], &ones);
    }
    let bytes = w.to_bytes();
    std::fs::write(&out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
    let params =
        vocab * dim * 2 + layers * (dim * dim * 2 + 2 * dim * kv_heads * head + 3 * dim * ffn);
    Ok(json!({
        "model": out.display().to_string(),
        "type": ty.name(),
        "parameters": params,
        "bytes": bytes.len(),
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

// ---- the device -------------------------------------------------------------

/// CUDA device 0, or the kernel emulator (built into a temporary folder).
fn open_device(backend: &str) -> Result<Arc<dyn KernelDevice>, String> {
    match backend {
        "cuda" => open_cuda_device(0, MemoryBudget::new("gpu_check", u64::MAX))
            .map_err(|e| format!("opening CUDA device 0: {e}")),
        "emulated" => {
            let dir =
                std::env::temp_dir().join(format!("bulkhead-gpu-check-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let harness = build_harness(&dir).map_err(|e| e.to_string())?;
            Ok(Arc::new(
                Emulator::start(&harness, 64).map_err(|e| e.to_string())?,
            ))
        }
        other => Err(format!("--backend {other:?}: cuda or emulated")),
    }
}

/// Device-to-device copy bandwidth (bytes read + written per second) with
/// the kernels' own `bh_copy` over two `bytes`-long buffers.
fn copy_bandwidth(device: &dyn KernelDevice, bytes: usize) -> Result<f64, String> {
    let err = |e: bulkhead_kernels::hip::DeviceError| e.to_string();
    let (src, dst) = (
        device.alloc(bytes).map_err(err)?,
        device.alloc(bytes).map_err(err)?,
    );
    let floats = (bytes / 4) as u64;
    let args = BinaryArgs {
        a: dst,
        b: src,
        n: floats,
    }
    .to_bytes();
    let blocks = floats.div_ceil(256).min(4096) as u32;
    let run = |reps: usize| -> Result<f64, String> {
        device.synchronize().map_err(err)?;
        let t = Instant::now();
        for _ in 0..reps {
            device
                .launch(names::COPY, [blocks, 1, 1], 256, &args)
                .map_err(err)?;
        }
        device.synchronize().map_err(err)?;
        Ok(t.elapsed().as_secs_f64())
    };
    run(1)?; // warm-up
    let reps = 10;
    let seconds = run(reps)?;
    device.free(src).map_err(err)?;
    device.free(dst).map_err(err)?;
    Ok(2.0 * bytes as f64 * reps as f64 / seconds)
}

/// Tokens, with the time each one arrived.
struct Timed(Rc<RefCell<Vec<Instant>>>);

impl SequenceSink for Timed {
    fn started(&mut self) {}
    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
        let now = Instant::now();
        self.0.borrow_mut().extend(piece.tokens.iter().map(|_| now));
        ControlFlow::Continue(())
    }
    fn check(&mut self) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
    fn finished(&mut self, result: Result<Decoded, SequenceError>) {
        if let Err(e) = result {
            eprintln!("gpu_check: a sequence failed: {e}");
            std::process::exit(1);
        }
    }
}

/// `n` sequences of `tokens` each through one batch; every token's time,
/// and the ledger of each decode step (after every sequence's first token).
fn run_batch(
    model: &Model,
    tok: &Tokenizer,
    backend: &dyn Backend,
    ledger: Option<&BudgetedDevice>,
    n: usize,
    tokens: usize,
) -> Result<(Vec<Vec<Instant>>, Vec<Transfers>), String> {
    let blocks = (32 + tokens).div_ceil(16) as u32;
    let limits = BatchLimits {
        max_running: n,
        max_rows: n,
        kv_blocks: blocks * n as u32,
    };
    let mut batcher = Batcher::new(model, limits).map_err(|e| e.to_string())?;
    let times: Vec<Rc<RefCell<Vec<Instant>>>> = (0..n).map(|_| Rc::default()).collect();
    for (i, t) in times.iter().enumerate() {
        let request = GenerateRequest {
            prompt_tokens: tok.encode(&format!("Sequence {i} begins here"), true),
            max_tokens: tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
        };
        let new = NewSequence {
            tenant: "gpu-check".into(),
            priority: 0,
            request,
            sink: Box::new(Timed(t.clone())),
        };
        batcher.add(tok, new);
    }
    let mut steps = Vec::new();
    while !batcher.is_idle() {
        let decoding = times.iter().all(|t| !t.borrow().is_empty());
        let before = ledger.map(|l| l.transfers());
        batcher
            .step(model, tok, backend)
            .map_err(|e| e.to_string())?;
        if let (true, Some(l), Some(before)) = (decoding, ledger, before) {
            steps.push(l.transfers().since(&before));
        }
    }
    let times = times.iter().map(|t| t.borrow().clone()).collect();
    Ok((times, steps))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn open_model(f: &Flags) -> Result<(Model, Tokenizer, u64), String> {
    let path = f.get("model")?;
    let model = Model::open(path).map_err(|e| format!("{path}: {e}"))?;
    let tok = Tokenizer::from_metadata(model.gguf().metadata()).map_err(|e| e.to_string())?;
    let bytes = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    Ok((model, tok, bytes))
}

fn decode(f: &Flags) -> Result<Json, String> {
    let backend_name = f.get("backend")?;
    let (model, tok, model_bytes) = open_model(f)?;
    let tokens = f.number("tokens", 64)?;
    let batches: Vec<usize> = f
        .get("batch")
        .unwrap_or("1,16,64")
        .split(',')
        .map(|b| b.parse().map_err(|_| format!("--batch {b:?}")))
        .collect::<Result<_, _>>()?;
    let device = open_device(backend_name)?;
    let copy_bytes = f.number("copy-mib", 1024)? << 20;
    let copy = copy_bandwidth(&*device, copy_bytes)?;
    let view = Arc::new(BudgetedDevice::new(
        device,
        MemoryBudget::new("gpu_check", u64::MAX),
    ));
    let backend = HipBackend::new(view.clone());
    let load = Instant::now();
    model.preload(&backend).map_err(|e| e.to_string())?;
    let load_seconds = load.elapsed().as_secs_f64();
    run_batch(&model, &tok, &backend, None, 1, 4)?; // warm-up: workspace, KV pool
    let mut rows = Vec::new();
    for &n in &batches {
        let (times, steps) = run_batch(&model, &tok, &backend, Some(&view), n, tokens)?;
        // The decode window: from the last first token to the last token.
        let start = times.iter().filter_map(|t| t.first()).max().copied();
        let end = times.iter().filter_map(|t| t.last()).max().copied();
        let (Some(start), Some(end)) = (start, end) else {
            return Err(format!("batch {n}: no tokens"));
        };
        let decoded: usize = times
            .iter()
            .map(|t| t.iter().filter(|&&x| x > start).count())
            .sum();
        let seconds = (end - start).as_secs_f64();
        let steps_per_s = steps.len() as f64 / seconds.max(1e-9);
        let reads = n.div_ceil(8) as f64;
        let weight_rate = model_bytes as f64 * reads * steps_per_s;
        let mut ledger = json!({});
        for (i, (name, _)) in Transfers::default().named().into_iter().enumerate() {
            ledger[name] = json!(median(
                steps.iter().map(|t| t.named()[i].1 as f64).collect()
            ));
        }
        eprintln!(
            "decode batch {n}: {:.1} tokens/s, weights read at {:.1} GB/s, {:.0}% of the copy's {:.1} GB/s",
            decoded as f64 / seconds.max(1e-9),
            weight_rate / 1e9,
            100.0 * weight_rate / copy,
            copy / 1e9
        );
        rows.push(json!({
            "batch": n,
            "decode_tokens_per_s": decoded as f64 / seconds.max(1e-9),
            "steps_per_s": steps_per_s,
            "weight_read_bytes_per_s": weight_rate,
            "bandwidth_fraction": weight_rate / copy,
            "ledger_median_step": ledger,
        }));
    }
    Ok(json!({
        "backend": backend.name(),
        "model_bytes": model_bytes,
        "load_seconds": load_seconds,
        "tokens": tokens,
        "copy_bytes_per_s": copy,
        "batches": rows,
    }))
}

// ---- isolation --------------------------------------------------------------

/// The emulator as a stream source: every partition on the one emulator.
#[derive(Debug)]
struct EmulatorStreams(Arc<dyn KernelDevice>);

impl StreamSource for EmulatorStreams {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn streams_for(&self, _cus: &CuSet) -> Result<Arc<dyn KernelDevice>, String> {
        Ok(Arc::clone(&self.0))
    }
}

fn split(backend: &str, partition_bytes: u64) -> Result<(PartitionedDevice, String), String> {
    match backend {
        "cuda" => {
            let (split, isolation) =
                open_cuda_partitions(0, partition_bytes).map_err(|e| e.to_string())?;
            Ok((split, isolation.describe()))
        }
        _ => {
            let device = Device {
                memory_bytes: 1 << 30,
                ..Device::mi325x()
            };
            let streams = Arc::new(EmulatorStreams(open_device(backend)?));
            let split = PartitionedDevice::new(device, 512 << 20, streams)?;
            Ok((split, "one emulator: no isolation to measure".into()))
        }
    }
}

/// Inter-token gaps of one sequence, in ms.
fn gaps_ms(times: &[Instant]) -> Vec<f64> {
    times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect()
}

fn isolation(f: &Flags) -> Result<Json, String> {
    let backend_name = f.get("backend")?;
    let (model, tok, _) = open_model(f)?;
    let tokens = f.number("tokens", 128)?;
    let flood = f.number("flood", 64)?;
    let partition_bytes = (f.number("partition-mib", 8192)? as u64) << 20;
    let (split, how) = split(backend_name, partition_bytes)?;
    let n = split.device().compute_units;
    let (a, b) = (CuSet::from_ids(n, 0..n / 2), CuSet::from_ids(n, n / 2..n));
    let half = partition_bytes / 2;
    let quiet = split.partition("dedicated:quiet", &a, half)?;
    let noisy = split.partition("dedicated:noisy", &b, half)?;
    model.preload(&*quiet.backend).map_err(|e| e.to_string())?;
    run_batch(&model, &tok, &*quiet.backend, None, 1, 4)?;
    run_batch(&model, &tok, &*noisy.backend, None, 1, 4)?;
    let (alone, _) = run_batch(&model, &tok, &*quiet.backend, None, 1, tokens)?;
    let stop = AtomicBool::new(false);
    let (flooded, flood_tokens) = std::thread::scope(|s| {
        let noisy_run = s.spawn(|| {
            let mut total = 0usize;
            while !stop.load(Ordering::Relaxed) {
                match run_batch(&model, &tok, &*noisy.backend, None, flood, 32) {
                    Ok((t, _)) => total += t.iter().map(Vec::len).sum::<usize>(),
                    Err(e) => return Err(e),
                }
            }
            Ok(total)
        });
        let quiet_run = run_batch(&model, &tok, &*quiet.backend, None, 1, tokens);
        stop.store(true, Ordering::Relaxed);
        let noisy_total = noisy_run
            .join()
            .unwrap_or_else(|_| Err("the flood panicked".into()));
        (quiet_run, noisy_total)
    });
    let (flooded, _) = flooded?;
    let flood_tokens = flood_tokens?;
    let (alone, flooded) = (gaps_ms(&alone[0]), gaps_ms(&flooded[0]));
    let (p99_alone, p99_flood) = (
        percentile(alone.clone(), 0.99),
        percentile(flooded.clone(), 0.99),
    );
    eprintln!(
        "isolation ({how}): p99 inter-token {p99_alone:.2} ms alone, {p99_flood:.2} ms beside a flood of {flood}"
    );
    Ok(json!({
        "partitions": how,
        "quiet_sms": a.len(),
        "noisy_sms": b.len(),
        "flood_batch": flood,
        "flood_tokens": flood_tokens,
        "alone_ms": {"p50": percentile(alone, 0.5), "p99": p99_alone},
        "under_flood_ms": {"p50": percentile(flooded, 0.5), "p99": p99_flood},
        "p99_ratio": p99_flood / p99_alone,
    }))
}
