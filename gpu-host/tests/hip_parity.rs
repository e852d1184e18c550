//! The HIP backend against the CPU backend: whole-model logits of the
//! committed fixture models, through the contiguous cache (prefill: the
//! tiled matmul; decode: the matvecs) and the paged batch path (paged
//! attention, per-row matvecs).
//!
//! `device_kernels_match_scalar_oracle` runs the kernel-level cases of
//! kernels/tests/hip_cases on the device first. The `partitions` cases run
//! the same model on two partitions of one device (disjoint CU sets, each
//! with its own stream and budget, one copy of the weights).
//!
//! Two devices run the same bodies:
//! - the kernel emulator (`bulkhead_kernels::hip::emulator`: the kernels'
//!   own source on CPU threads, wave 64) — every machine with a C++20
//!   compiler; it checks the backend's host code and the kernels together;
//! - a real device, the `device_*` tests: HIP device 0 (`cargo test
//!   --features hip` where one is visible), or CUDA device 0 with
//!   `BULKHEAD_TEST_DEVICE=cuda` (`emulated` runs them on the emulator,
//!   which is how tests/gpu/device-check is itself checked without a GPU).
//!   Whether one is visible is decided before a test's body (the runtime's
//!   own answer, `hip::probe` or `cuda::probe`): without one the device
//!   tests skip for `hip-device` or `cuda-device` (a failure where
//!   `BULKHEAD_REQUIRE` lists it); with one, any error opening or using it
//!   fails the test. The emulator tests skip
//!   only when there is no C++ compiler (`cxx`); a build error fails them.
//!
//! Tolerances. F32/F16 weights: both backends compute the same products in
//! another order, so logits agree to 1e-4 of their largest magnitude (the
//! bound the f32 model meets against transformers). Quantized weights: the
//! CPU quantizes every activation to Q8 before its integer dot products;
//! the HIP matvecs do the same, but its prefill matmul keeps f32
//! activations, so logits differ by the activation-quantization noise. There
//! the check is that the HIP backend's error against the transformers F32
//! reference is no worse than the CPU backend's (within 5%), and that both
//! pick the same greedy token.

// The kernel-level parity cases of bulkhead-kernels (each kernel against
// the scalar oracle), run here on the real device.
#[path = "../../kernels/tests/common/mod.rs"]
mod common;
#[path = "../../kernels/tests/hip_cases/mod.rs"]
mod hip_cases;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bulkhead_gpu_host::backend::{
    Backend, CpuBackend, HipBackend, PartitionCompute, PartitionedDevice, StreamSource,
    open_cuda_device, open_cuda_partitions, open_hip_device, open_hip_partitions,
};
use bulkhead_gpu_host::engine::{BatchEntry, Logits, Model, argmax};
use bulkhead_gpu_host::hip::{HipAvailability, probe};
use bulkhead_kernels::hip::emulator::{Emulator, HarnessError, build_harness};
use bulkhead_kernels::hip::{DeviceErrorKind, KernelDevice};
use bulkhead_kernels::{GgmlType, QuantMatrix};
use bulkhead_partition::{CuSet, Device};
use bulkhead_testkit::{Need, skip};
use serde::Deserialize;

/// The committed fixtures, or `BULKHEAD_FIXTURES` (tests/gpu/prepare
/// carries a copy to a machine without the repository).
fn fixtures() -> PathBuf {
    match std::env::var_os("BULKHEAD_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
    }
}

/// What the `device_*` tests run on (`BULKHEAD_TEST_DEVICE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestDevice {
    Hip,
    Cuda,
    Emulated,
}

fn test_device() -> TestDevice {
    match std::env::var("BULKHEAD_TEST_DEVICE").as_deref() {
        Err(_) | Ok("") | Ok("hip") => TestDevice::Hip,
        Ok("cuda") => TestDevice::Cuda,
        Ok("emulated") => TestDevice::Emulated,
        Ok(other) => panic!("BULKHEAD_TEST_DEVICE={other:?}: expected hip, cuda or emulated"),
    }
}

#[derive(Deserialize)]
struct Reference {
    prompt_tokens: Vec<u32>,
    transformers_f32_logits: Vec<Vec<f32>>,
}

fn reference(family: &str) -> Reference {
    let path = fixtures().join(format!("reference/{family}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn model(family: &str, ty: &str) -> Model {
    Model::open(fixtures().join(format!("models/{family}-{ty}.gguf"))).unwrap()
}

/// The emulated device, or `None` after skipping for the missing C++
/// compiler. A failed build or start fails the test.
fn emulator() -> Option<Arc<dyn KernelDevice>> {
    static HARNESS: OnceLock<Result<PathBuf, HarnessError>> = OnceLock::new();
    let harness =
        match HARNESS.get_or_init(|| build_harness(Path::new(env!("CARGO_TARGET_TMPDIR")))) {
            Ok(harness) => harness,
            Err(HarnessError::NoCompiler(why)) => {
                skip(Need::Cxx, why);
                return None;
            }
            Err(e @ HarnessError::Build(_)) => panic!("{e}"),
        };
    let device = Emulator::start(harness, 64).unwrap_or_else(|e| panic!("{e}"));
    Some(Arc::new(device))
}

/// Whether a HIP device is visible, decided before a device test's body:
/// `false` after skipping for `hip-device` when the build has no HIP or
/// the runtime says there is no device; any other answer fails the test.
fn device_visible() -> bool {
    match test_device() {
        TestDevice::Hip => {}
        TestDevice::Emulated => return emulator().is_some(),
        TestDevice::Cuda => {
            use bulkhead_gpu_host::cuda::{self, CudaAvailability};
            return match cuda::probe() {
                CudaAvailability::Devices(_) => true,
                CudaAvailability::NotBuilt => {
                    skip(Need::CudaDevice, "built without the `cuda` feature");
                    false
                }
                CudaAvailability::Unavailable(why) => {
                    skip(Need::CudaDevice, why);
                    false
                }
            };
        }
    }
    match probe() {
        HipAvailability::Devices(_) => true,
        HipAvailability::NotBuilt => {
            skip(Need::HipDevice, "built without the `hip` feature");
            false
        }
        HipAvailability::Unavailable(e) if e.is_no_device() => {
            skip(Need::HipDevice, e);
            false
        }
        HipAvailability::Unavailable(e) => panic!("the HIP runtime failed: {e}"),
    }
}

/// HIP device 0 (a budget of all its memory), or `None` after skipping
/// because none is visible. Failing to open a visible one fails the test.
fn hip_device() -> Option<Arc<dyn KernelDevice>> {
    if !device_visible() {
        return None;
    }
    let budget = bulkhead_gpu_host::hip::MemoryBudget::new("hip_parity", u64::MAX);
    Some(match test_device() {
        TestDevice::Hip => {
            open_hip_device(0, budget).unwrap_or_else(|e| panic!("opening HIP device 0: {e}"))
        }
        TestDevice::Cuda => {
            open_cuda_device(0, budget).unwrap_or_else(|e| panic!("opening CUDA device 0: {e}"))
        }
        TestDevice::Emulated => emulator()?,
    })
}

/// HIP device 0 split for partitions, as [`hip_device`].
fn hip_partitions(memory_bytes: u64) -> Option<PartitionedDevice> {
    if !device_visible() {
        return None;
    }
    Some(match test_device() {
        TestDevice::Hip => open_hip_partitions(0, memory_bytes)
            .unwrap_or_else(|e| panic!("opening HIP device 0 for partitions: {e}")),
        TestDevice::Cuda => {
            let (split, isolation) = open_cuda_partitions(0, memory_bytes)
                .unwrap_or_else(|e| panic!("opening CUDA device 0 for partitions: {e}"));
            eprintln!("{}: {}", split.device().name, isolation.describe());
            split
        }
        TestDevice::Emulated => emulated_split(emulator()?),
    })
}

/// (max |diff| / max |reference|, rms diff / rms reference) over all rows.
fn error(ours: &[f32], reference: &[f32]) -> (f64, f64) {
    assert_eq!(ours.len(), reference.len());
    let (mut max_diff, mut max_ref, mut sq_diff, mut sq_ref) = (0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in ours.iter().zip(reference) {
        let d = (f64::from(x) - f64::from(y)).abs();
        max_diff = max_diff.max(d);
        max_ref = max_ref.max(f64::from(y).abs());
        sq_diff += d * d;
        sq_ref += f64::from(y) * f64::from(y);
    }
    (max_diff / max_ref, (sq_diff / sq_ref).sqrt())
}

/// Prompt tokens used: few, because the emulator runs every GPU thread on
/// the CPU; enough for a multi-token prefill and several positions.
const PROMPT: usize = 5;

/// Prefill of the prompt prefix (contiguous cache), then one decode step.
fn prefill_and_decode(m: &Model, b: &dyn Backend, prompt: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut cache = m.new_cache(prompt.len() + 1);
    let prefill = m.forward(b, &mut cache, prompt, Logits::All).unwrap();
    let next = argmax(&prefill[prefill.len() - m.config().vocab_size..]);
    let decode = m.forward(b, &mut cache, &[next], Logits::Last).unwrap();
    (prefill, decode)
}

fn logits_match_cpu(device: Arc<dyn KernelDevice>, family: &str, ty: &str) {
    let r = reference(family);
    let m = model(family, ty);
    let prompt = &r.prompt_tokens[..PROMPT];
    let hip = HipBackend::new(device);
    let cpu = CpuBackend::new(2).unwrap();
    let (hip_prefill, hip_decode) = prefill_and_decode(&m, &hip, prompt);
    let (cpu_prefill, cpu_decode) = prefill_and_decode(&m, &cpu, prompt);
    let vocab = m.config().vocab_size;
    let (max_rel, rms_rel) = error(&hip_prefill, &cpu_prefill);
    let (dmax_rel, drms_rel) = error(&hip_decode, &cpu_decode);
    eprintln!(
        "{family} {ty} on {}: prefill vs CPU max {max_rel:.2e} rms {rms_rel:.2e}; \
         decode max {dmax_rel:.2e} rms {drms_rel:.2e}; {} weight bytes cached",
        hip.name(),
        hip.cached_weight_bytes()
    );
    assert_eq!(
        argmax(&hip_decode),
        argmax(&cpu_decode),
        "{family} {ty}: greedy token after decode"
    );
    if matches!(ty, "f32" | "f16") {
        assert!(
            max_rel < 1e-4,
            "{family} {ty} prefill: max rel {max_rel:.3e}"
        );
        assert!(
            dmax_rel < 1e-4,
            "{family} {ty} decode: max rel {dmax_rel:.3e}"
        );
    } else {
        let want: Vec<f32> = r.transformers_f32_logits[..PROMPT].concat();
        let (_, hip_rms) = error(&hip_prefill, &want);
        let (_, cpu_rms) = error(&cpu_prefill, &want);
        eprintln!("  vs transformers F32: HIP rms {hip_rms:.3e}, CPU rms {cpu_rms:.3e}");
        assert!(
            hip_rms <= cpu_rms * 1.05,
            "{family} {ty}: HIP rms error {hip_rms:.3e} vs CPU's {cpu_rms:.3e}"
        );
        // The decode step's dot products match the CPU's, but it reads the
        // K/V rows the prefill wrote, so it inherits the prefill's
        // difference: bound it by that difference (x1.5), which a decode-path
        // bug (wrong position, block or row) exceeds by far.
        let bound = 1.5 * max_rel + 1e-4;
        assert!(
            dmax_rel <= bound,
            "{family} {ty} decode: max rel {dmax_rel:.3e} > {bound:.3e}"
        );
    }
    for (row, (h, c)) in hip_prefill
        .chunks_exact(vocab)
        .zip(cpu_prefill.chunks_exact(vocab))
        .enumerate()
    {
        assert_eq!(
            argmax(h),
            argmax(c),
            "{family} {ty}: greedy token of prompt row {row}"
        );
    }
}

/// Two sequences in one paged batch (a prefill chunk and, after it, a
/// decode step of each): paged attention across a block boundary and the
/// per-row matvecs, against the CPU backend on the same batch.
fn paged_batch_matches_cpu(device: Arc<dyn KernelDevice>, family: &str, ty: &str) {
    let r = reference(family);
    let m = model(family, ty);
    let hip = HipBackend::new(device);
    let cpu = CpuBackend::new(2).unwrap();
    let run = |b: &dyn Backend| {
        let mut kv = m.new_kv_blocks(6);
        // Sequence A holds 17 positions after its prefill: its decode reads
        // across the 16-token block boundary. B is short and uses other blocks.
        let a_prompt: Vec<u32> = r.prompt_tokens.iter().copied().cycle().take(17).collect();
        let b_prompt = &r.prompt_tokens[..3];
        let (a_blocks, b_blocks) = ([4u32, 1], [3u32]);
        let first = m
            .forward_batch(
                b,
                &mut kv,
                &[
                    BatchEntry {
                        tokens: &a_prompt,
                        start_pos: 0,
                        blocks: &a_blocks,
                        logits: true,
                    },
                    BatchEntry {
                        tokens: b_prompt,
                        start_pos: 0,
                        blocks: &b_blocks,
                        logits: true,
                    },
                ],
            )
            .unwrap();
        let vocab = m.config().vocab_size;
        let (na, nb) = (argmax(&first[..vocab]), argmax(&first[vocab..]));
        let second = m
            .forward_batch(
                b,
                &mut kv,
                &[
                    BatchEntry {
                        tokens: &[na],
                        start_pos: 17,
                        blocks: &a_blocks,
                        logits: true,
                    },
                    BatchEntry {
                        tokens: &[nb],
                        start_pos: 3,
                        blocks: &b_blocks,
                        logits: true,
                    },
                ],
            )
            .unwrap();
        (first, second)
    };
    let (hip_first, hip_second) = run(&hip);
    let (cpu_first, cpu_second) = run(&cpu);
    let vocab = m.config().vocab_size;
    for (what, h, c) in [
        ("prefill", &hip_first, &cpu_first),
        ("decode", &hip_second, &cpu_second),
    ] {
        let (max_rel, rms_rel) = error(h, c);
        eprintln!("{family} {ty} paged {what}: max rel {max_rel:.2e} rms {rms_rel:.2e}");
        for (i, (hr, cr)) in h.chunks_exact(vocab).zip(c.chunks_exact(vocab)).enumerate() {
            assert_eq!(
                argmax(hr),
                argmax(cr),
                "{family} {ty} paged {what}: greedy token of sequence {i}"
            );
        }
        // F32: reordered sums only. Quantized: the activation-quantization
        // noise of the prefill matmul, at most 1.7e-2 on the contiguous
        // fixtures above; 5e-2 leaves room without hiding a wrong block.
        let bound = if ty == "f32" { 1e-4 } else { 5e-2 };
        assert!(
            max_rel < bound,
            "{family} {ty} paged {what}: max rel {max_rel:.3e} ≥ {bound}"
        );
    }
}

/// Two partitions of `split` on disjoint CU sets (`a`, `b`): each one's
/// logits match the CPU backend's (as [`logits_match_cpu`] checks), the
/// weights are uploaded once for both (the ledger of the reservation's
/// view does not move after the first pass) and charged to the model
/// reservation, and each partition's activations to its own budget (all
/// given back when its ops return).
fn partitions_match_cpu(split: &PartitionedDevice, a: &CuSet, b: &CuSet) {
    assert!(a.is_disjoint(b), "the partitions must not share CUs");
    let memory = 64 << 20;
    let pa = split.partition("dedicated:a", a, memory).unwrap();
    let pb = split.partition("dedicated:b", b, memory).unwrap();
    let m = model("llama", "f32");
    let r = reference("llama");
    let prompt = &r.prompt_tokens[..PROMPT];
    let cpu = CpuBackend::new(2).unwrap();
    let (cpu_prefill, cpu_decode) = prefill_and_decode(&m, &cpu, prompt);
    // The load: every weight up once, through the reservation's view (the
    // partitions share the copy, so loading through either is the same).
    m.preload(&*pa.backend).unwrap();
    let loaded = split.weight_transfers();
    let file_bytes = std::fs::metadata(fixtures().join("models/llama-f32.gguf"))
        .unwrap()
        .len();
    assert!(
        loaded.host_to_device_bytes > file_bytes * 9 / 10
            && loaded.host_to_device_bytes <= file_bytes,
        "the load uploads the weights: {loaded:?} of a {file_bytes}-byte file"
    );
    assert_eq!((loaded.launches, loaded.device_to_host_bytes), (0, 0));
    let mut weight_bytes = None;
    let mut weights_moved = Some(loaded);
    for (name, p) in [("a", &pa), ("b", &pb)] {
        let before = p.transfers();
        let (prefill, decode) = prefill_and_decode(&m, &*p.backend, prompt);
        // What the per-op design moves (the transfer ledger), for
        // docs/gpu-performance.md's figures of it.
        eprintln!(
            "partition {name}: a {PROMPT}-token prefill and one decode step: {:?}",
            p.transfers().since(&before)
        );
        let (max_rel, _) = error(&prefill, &cpu_prefill);
        let (dmax_rel, _) = error(&decode, &cpu_decode);
        eprintln!(
            "partition {name} on {}: prefill max rel {max_rel:.2e}, decode {dmax_rel:.2e}",
            p.backend.name()
        );
        assert!(max_rel < 1e-4, "partition {name} prefill: {max_rel:.3e}");
        assert!(dmax_rel < 1e-4, "partition {name} decode: {dmax_rel:.3e}");
        assert_eq!(argmax(&decode), argmax(&cpu_decode), "partition {name}");
        // The pass workspace stays for the next step (reused: another
        // run allocates nothing more); the cache's KV memory went back
        // when the cache was dropped.
        let held = p.budget.used_bytes();
        assert!(held >= workspace_bytes(p), "partition {name}: {held}");
        let again = prefill_and_decode(&m, &*p.backend, prompt);
        assert_eq!(again, (prefill, decode), "partition {name}: a second run");
        assert_eq!(
            p.budget.used_bytes(),
            held,
            "partition {name}: only the workspace is held"
        );
        let cached = split.weights().bytes();
        assert_eq!(
            *weight_bytes.get_or_insert(cached),
            cached,
            "uploaded again"
        );
        // After the load, no weight byte moves again: neither partition's
        // passes copy anything through the reservation's view.
        let moved = split.weight_transfers();
        assert_eq!(*weights_moved.get_or_insert(moved), moved, "weights moved");
    }
    let cached = weight_bytes.unwrap() as u64;
    assert!(cached > 0);
    assert!(
        split.weights_budget().used_bytes() >= cached,
        "the weights are charged to the model reservation"
    );
}

/// The emulator as a device of `compute_units` CUs: every CU set gets the
/// same emulated device (it has no CUs to mask; the host code above it is
/// what runs).
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

/// The emulator split as an MI325X with 1 GiB, half of it for weights.
fn emulated_split(d: Arc<dyn KernelDevice>) -> PartitionedDevice {
    let device = Device {
        memory_bytes: 1 << 30,
        ..Device::mi325x()
    };
    PartitionedDevice::new(device, 512 << 20, Arc::new(EmulatorStreams(d))).unwrap()
}

#[test]
fn emulated_partitions_match_cpu_sharing_one_copy_of_the_weights() {
    on_emulator(|d| {
        let split = emulated_split(d);
        let device = split.device().clone();
        partitions_match_cpu(&split, &device.xcd(0), &device.xcd(1));
    });
}

/// On a real device: two partitions on disjoint CUs ([`two_halves`]), each
/// on its own CU-masked stream.
#[test]
fn device_partitions_on_disjoint_cus_match_cpu() {
    if let Some(split) = hip_partitions(1 << 30) {
        let (a, b) = two_halves(split.device());
        partitions_match_cpu(&split, &a, &b);
    }
}

/// Two disjoint CU sets of a real device: an XCD each on an MI300-class
/// part, the lower and upper half of the CUs elsewhere.
fn two_halves(device: &Device) -> (CuSet, CuSet) {
    match device.xcds {
        Some(_) => (device.xcd(0), device.xcd(1)),
        None => {
            let (n, half) = (device.compute_units, (device.compute_units / 2).max(1));
            (CuSet::from_ids(n, 0..half), CuSet::from_ids(n, half..n))
        }
    }
}

/// Both partitions at once from two threads, `rounds` times each (on a
/// real device: kernels on two CU-masked streams concurrently, frees
/// waiting for running launches): each still matches the CPU as alone.
fn partitions_running_at_once_match_cpu(split: &PartitionedDevice, rounds: usize) {
    let (a, b) = two_halves(split.device());
    let pa = split.partition("dedicated:a", &a, 64 << 20).unwrap();
    let pb = split.partition("dedicated:b", &b, 64 << 20).unwrap();
    let m = model("llama", "f32");
    let r = reference("llama");
    let prompt = &r.prompt_tokens[..PROMPT];
    let cpu = CpuBackend::new(2).unwrap();
    let (cpu_prefill, cpu_decode) = prefill_and_decode(&m, &cpu, prompt);
    let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|scope| {
        let runs: Vec<_> = [&pa, &pb]
            .into_iter()
            .map(|p| {
                let m = &m;
                scope.spawn(move || {
                    let mut last = None;
                    for _ in 0..rounds {
                        last = Some(prefill_and_decode(m, &*p.backend, prompt));
                    }
                    last.expect("at least one round")
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (prefill, decode)) in results.iter().enumerate() {
        let (max_rel, _) = error(prefill, &cpu_prefill);
        let (dmax_rel, _) = error(decode, &cpu_decode);
        assert!(max_rel < 1e-4, "partition {i} prefill: {max_rel:.3e}");
        assert!(dmax_rel < 1e-4, "partition {i} decode: {dmax_rel:.3e}");
    }
    // Each holds its workspace only: one more run allocates nothing more.
    for p in [&pa, &pb] {
        let held = p.budget.used_bytes();
        assert!(held >= workspace_bytes(p));
        prefill_and_decode(&m, &*p.backend, prompt);
        assert_eq!(p.budget.used_bytes(), held);
    }
}

/// What a partition's backend keeps between passes.
fn workspace_bytes(p: &PartitionCompute) -> u64 {
    p.backend.workspace_bytes() as u64
}

#[test]
fn device_partitions_running_at_once_match_cpu() {
    // Several rounds, so the two partitions' launches overlap.
    if let Some(split) = hip_partitions(1 << 30) {
        partitions_running_at_once_match_cpu(&split, 8);
    }
}

#[test]
fn emulated_partitions_running_at_once_match_cpu() {
    on_emulator(|d| partitions_running_at_once_match_cpu(&emulated_split(d), 1));
}

/// A partition whose budget cannot hold an op's activations: the op fails
/// with an out-of-memory error carrying the budget's message, and nothing
/// stays charged.
fn partition_past_its_budget_is_refused_naming_it(split: &PartitionedDevice) {
    let (a, _) = two_halves(split.device());
    let tiny = split.partition("dedicated:tiny", &a, 4096).unwrap();
    let w = vec![0u8; 4 * 16 * 4];
    let m = QuantMatrix::new(GgmlType::F32, &w, 4, 16).unwrap();
    let mut out = vec![0.0f32; 4];
    let failed = tiny
        .backend
        .matmul(&m, &[1.0; 16], 1, &mut out)
        .expect_err("the output cannot fit a one-page budget the input fills");
    assert_eq!(failed.kind, DeviceErrorKind::OutOfMemory);
    let message = failed.to_string();
    assert!(
        message.contains(
            "partition \"dedicated:tiny\" cannot allocate 16B: 4KiB of its 4KiB \
             device-memory budget is in use, 0B left"
        ),
        "{message}"
    );
    assert_eq!(tiny.budget.used_bytes(), 0, "the input was given back");
}

#[test]
fn device_partition_past_its_budget_is_refused_naming_it() {
    if let Some(split) = hip_partitions(1 << 30) {
        partition_past_its_budget_is_refused_naming_it(&split);
    }
}

#[test]
fn emulated_partition_past_its_budget_is_refused_naming_it() {
    on_emulator(|d| partition_past_its_budget_is_refused_naming_it(&emulated_split(d)));
}

fn on_emulator(case: impl FnOnce(Arc<dyn KernelDevice>)) {
    if let Some(d) = emulator() {
        case(d);
    }
}

fn on_hip_device(case: impl FnOnce(Arc<dyn KernelDevice>)) {
    if let Some(d) = hip_device() {
        case(d);
    }
}

/// A weight replaced in place (same address, same length, other bytes: a
/// model unloaded and another loaded where it was) is uploaded again, not
/// served from the cache.
#[test]
fn emulated_weight_cache_notices_a_different_weight_at_the_same_address() {
    on_emulator(|d| {
        let hip = HipBackend::new(d);
        let (rows, cols) = (2, 32);
        let fill = |w: &mut Vec<u8>, v: f32| {
            w.clear();
            w.extend((0..rows * cols).flat_map(|_| v.to_le_bytes()));
        };
        let mut w = Vec::with_capacity(rows * cols * 4);
        let x = vec![1.0f32; cols];
        let mut out = vec![0.0f32; rows];
        for value in [1.0f32, 2.0] {
            fill(&mut w, value);
            let m = QuantMatrix::new(GgmlType::F32, &w, rows, cols).unwrap();
            hip.matmul(&m, &x, 1, &mut out).unwrap();
            assert_eq!(out, vec![value * cols as f32; rows], "weights of {value}");
        }
        assert_eq!(
            hip.cached_weight_bytes(),
            rows * cols * 4,
            "replaced, not added"
        );
    });
}

#[test]
fn emulated_llama_f32_logits_match_cpu() {
    on_emulator(|d| logits_match_cpu(d, "llama", "f32"));
}

#[test]
fn emulated_qwen2_q8_0_logits_match_cpu() {
    on_emulator(|d| logits_match_cpu(d, "qwen2", "q8_0"));
}

#[test]
fn emulated_llama_q4_k_m_logits_match_cpu() {
    on_emulator(|d| logits_match_cpu(d, "llama", "q4_k_m"));
}

/// IQ4 weights go through the dequantizing matvec and the tiled matmul.
#[test]
fn emulated_llama_iq4_logits_match_cpu() {
    on_emulator(|d| {
        logits_match_cpu(Arc::clone(&d), "llama", "iq4_nl");
        logits_match_cpu(d, "llama", "iq4_xs");
    });
}

#[test]
fn emulated_paged_batch_matches_cpu() {
    on_emulator(|d| paged_batch_matches_cpu(d, "llama", "f32"));
}

#[test]
fn device_logits_match_cpu_every_fixture() {
    on_hip_device(|d| {
        for family in ["llama", "qwen2"] {
            for ty in ["f32", "f16", "q8_0", "q4_0", "q4_k_m"] {
                logits_match_cpu(Arc::clone(&d), family, ty);
            }
        }
        logits_match_cpu(Arc::clone(&d), "llama288", "q4_k_m");
    });
}

#[test]
fn device_paged_batch_matches_cpu() {
    on_hip_device(|d| {
        for ty in ["f32", "q4_0", "q4_k_m"] {
            paged_batch_matches_cpu(Arc::clone(&d), "llama", ty);
        }
    });
}

/// Every kernel against the scalar oracle on the device (the same cases
/// kernels/tests/hip_emulated.rs runs on the emulator at wave 32 and 64).
#[test]
fn device_kernels_match_scalar_oracle() {
    on_hip_device(|d| {
        hip_cases::embedding_every_type(&*d);
        hip_cases::quantize_matches_cpu(&*d);
        hip_cases::matvec_matches_scalar_dot(&*d);
        hip_cases::matmul_tiled_matches_dequantized_product(&*d);
        hip_cases::row_ops_match_scalar(&*d);
        hip_cases::attention_paged_matches_cpu(&*d);
        hip_cases::step_glue_matches_host(&*d);
        hip_cases::sha256_leaves_match_cpu(&*d);
    });
}

/// The transfer ledger of resident passes on the emulator, per decode step
/// of `batch` sequences in one paged batch, after the load: no weight
/// byte moves; host to device at most 64 bytes per sequence plus the
/// block-table entries that changed (4 bytes each: a sequence entering a
/// new block); device to host exactly the logits (batch × vocab × 4); one
/// synchronization; no allocation or free.
fn decode_steps_move_token_ids_in_and_logits_out(d: Arc<dyn KernelDevice>, ty: &str, batch: usize) {
    let split = emulated_split(d);
    let device = split.device().clone();
    let p = split
        .partition("dedicated:ledger", &device.xcd(0), 64 << 20)
        .unwrap();
    let m = model("llama", ty);
    let r = reference("llama");
    let vocab = m.config().vocab_size;
    m.preload(&*p.backend).unwrap();
    let loaded = split.weight_transfers();
    let mut kv = m.new_kv_blocks(2 * batch as u32);
    // Sequence i: a 3-token prompt, blocks [2i, 2i + 1]; the decode steps
    // below cross position 16, into each sequence's second block.
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|i| {
            r.prompt_tokens
                .iter()
                .copied()
                .cycle()
                .skip(i)
                .take(3)
                .collect()
        })
        .collect();
    let tables: Vec<[u32; 2]> = (0..batch as u32).map(|i| [2 * i, 2 * i + 1]).collect();
    let mut entries = |tokens: &[Vec<u32>], start: usize| -> Vec<Vec<f32>> {
        let batch: Vec<BatchEntry<'_>> = tokens
            .iter()
            .zip(&tables)
            .map(|(t, blocks)| BatchEntry {
                tokens: t,
                start_pos: start,
                blocks,
                logits: true,
            })
            .collect();
        let logits = m.forward_batch(&*p.backend, &mut kv, &batch).unwrap();
        logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
    };
    let mut next: Vec<Vec<u32>> = entries(&prompts, 0)
        .iter()
        .map(|l| vec![argmax(l)])
        .collect();
    let mut launches = Vec::new();
    for pos in 3..20 {
        let before = p.transfers();
        let logits = entries(&next, pos);
        let step = p.transfers().since(&before);
        let entering = if pos == 16 { batch as u64 } else { 0 };
        // Each new table entry may come with a few unchanged neighbours
        // (runs of changes closer than 8 entries are one copy).
        let allowed = 64 * batch as u64 + 36 * entering;
        assert!(
            step.host_to_device_bytes <= allowed,
            "{ty} b{batch} decode at {pos}: {step:?}, allowed {allowed} bytes up"
        );
        assert_eq!(
            step.device_to_host_bytes,
            (batch * vocab * 4) as u64,
            "{ty} b{batch} decode at {pos}: only the logits come back"
        );
        assert_eq!(step.synchronizations, 1, "{ty} b{batch} at {pos}: {step:?}");
        assert_eq!(
            (step.allocations, step.frees),
            (0, 0),
            "{ty} b{batch} at {pos}: the steady state allocates nothing"
        );
        assert_eq!(split.weight_transfers(), loaded, "weights moved at {pos}");
        launches.push(step.launches);
        if pos == 4 {
            eprintln!("{ty} batch {batch}: a decode step moved {step:?}");
        }
        next = logits.iter().map(|l| vec![argmax(l)]).collect();
    }
    // Launches do not grow with the batch or the position: one pass.
    assert!(launches.windows(2).all(|w| w[0] == w[1]), "{launches:?}");
}

#[test]
fn emulated_decode_steps_move_token_ids_in_and_logits_out() {
    for (ty, batch) in [("f32", 1), ("q8_0", 4), ("q4_k_m", 16)] {
        on_emulator(|d| decode_steps_move_token_ids_in_and_logits_out(d, ty, batch));
    }
}

/// Continuous batching on the emulated device: `n` sequences in one batch,
/// from two tenants, the second arriving once the first holds the whole
/// KV pool and taking its guaranteed half back (so the batch preempts some
/// of the first's sequences, which later recompute their KV and go on);
/// then a re-partition: more requests arrive and run on the new layout's
/// partition (other CUs, its own budget) while the old one finishes its
/// own. Every sequence gives the tokens it gives alone on the device.
fn batches_match_each_sequence_alone(d: Arc<dyn KernelDevice>, n: usize) {
    use bulkhead_gpu_host::Tokenizer;
    use bulkhead_gpu_host::engine::{GenerateRequest, SamplingParams, generate};
    use bulkhead_gpu_host::sched::{BatchLimits, Batcher, TenantShare};
    let split = emulated_split(d);
    let device = split.device().clone();
    let m = model("llama", "q8_0");
    let tok = Tokenizer::from_metadata(m.gguf().metadata()).unwrap();
    let old = split
        .partition("shared:epoch1", &device.xcd(0), 64 << 20)
        .unwrap();
    let words = ["Once", "The sky", "Hello there", "One two three", "A cat"];
    let after = n.div_ceil(4);
    // Prompts of 12 tokens and a few more generated: each sequence
    // crosses into its second 16-position block, and two blocks hold it.
    let reqs: Vec<GenerateRequest> = (0..n + after)
        .map(|i| GenerateRequest {
            prompt_tokens: tok
                .encode(
                    &format!("{} {i}, and then the story went on", words[i % words.len()]),
                    true,
                )
                .into_iter()
                .take(12)
                .collect(),
            max_tokens: 6 + i % 4,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
        })
        .collect();
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            generate(&m, &tok, &*old.backend, r, &mut |_| {})
                .unwrap()
                .tokens
        })
        .collect();
    let logs: Vec<Arc<std::sync::Mutex<Vec<u32>>>> = reqs.iter().map(|_| Arc::default()).collect();
    // A sequence needs two blocks of 16 positions; the pool holds half of
    // the batch's, so the first tenant alone fills it.
    let limits = BatchLimits {
        max_running: n,
        max_rows: n,
        kv_blocks: (n as u32).max(2),
    };
    let calm = n / 4;
    // The emulator is slow: waits for a tenant's budget must not time out.
    let share = TenantShare {
        weight: 1,
        own_blocks: None,
        kv_wait: std::time::Duration::from_secs(3600),
        max_rows: None,
    };
    let shares = ["flood", "calm", "late"]
        .map(|t| (t.to_string(), share))
        .into();
    let mut first = Batcher::with_shares(&m, limits, shares).unwrap();
    for i in 0..n - calm {
        first.add(&tok, sequence("flood", reqs[i].clone(), &logs[i]));
    }
    for _ in 0..3 {
        first.step(&m, &tok, &*old.backend).unwrap();
    }
    for i in n - calm..n {
        first.add(&tok, sequence("calm", reqs[i].clone(), &logs[i]));
    }
    for _ in 0..3 {
        first.step(&m, &tok, &*old.backend).unwrap();
    }
    // The re-partition.
    let new = split
        .partition("shared:epoch2", &device.xcd(1), 64 << 20)
        .unwrap();
    let more = BatchLimits {
        kv_blocks: 2 * after as u32,
        ..limits
    };
    let mut second = Batcher::new(&m, more).unwrap();
    for i in n..n + after {
        second.add(&tok, sequence("late", reqs[i].clone(), &logs[i]));
    }
    for _ in 0..2_000 {
        if first.is_idle() && second.is_idle() {
            break;
        }
        if !first.is_idle() {
            first.step(&m, &tok, &*old.backend).unwrap();
        }
        if !second.is_idle() {
            second.step(&m, &tok, &*new.backend).unwrap();
        }
    }
    assert!(first.is_idle() && second.is_idle(), "stalled");
    let preemptions = first.stats().preemptions;
    eprintln!("batch of {n}: {preemptions} preemptions");
    if calm > 0 {
        assert!(preemptions > 0, "the second tenant was meant to preempt");
    }
    for (i, (log, want)) in logs.iter().zip(&alone).enumerate() {
        assert_eq!(*log.lock().unwrap(), *want, "batch of {n}: sequence {i}");
    }
}

/// A sequence whose sink appends its tokens to `log`.
fn sequence(
    tenant: &str,
    request: bulkhead_gpu_host::engine::GenerateRequest,
    log: &Arc<std::sync::Mutex<Vec<u32>>>,
) -> bulkhead_gpu_host::sched::NewSequence {
    use bulkhead_gpu_host::engine::{Decoded, Piece};
    use bulkhead_gpu_host::sched::{NewSequence, SequenceError, SequenceSink};
    use std::ops::ControlFlow;
    struct Sink(Arc<std::sync::Mutex<Vec<u32>>>);
    impl SequenceSink for Sink {
        fn started(&mut self) {}
        fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
            self.0.lock().unwrap().extend_from_slice(piece.tokens);
            ControlFlow::Continue(())
        }
        fn check(&mut self) -> ControlFlow<()> {
            ControlFlow::Continue(())
        }
        fn finished(&mut self, result: Result<Decoded, SequenceError>) {
            let d = result.unwrap_or_else(|e| panic!("a sequence failed: {e}"));
            assert_eq!(d.tokens, *self.0.lock().unwrap());
        }
    }
    NewSequence {
        tenant: tenant.to_string(),
        priority: 0,
        request,
        sink: Box::new(Sink(Arc::clone(log))),
    }
}

#[test]
fn emulated_batches_of_1_4_16_match_each_sequence_alone() {
    for n in [1, 4, 16] {
        on_emulator(|d| batches_match_each_sequence_alone(d, n));
    }
}
