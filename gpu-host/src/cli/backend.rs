//! `--backend cpu|hip|cuda|emulated` for the commands that run a model once
//! (`generate`, `eval`), and the device counts `--json` reports.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use bulkhead_gpu_host::backend::{
    Backend, BudgetedDevice, CpuBackend, HipBackend, Transfers, open_cuda_device, open_hip_device,
};
use bulkhead_gpu_host::engine::Model;
use bulkhead_gpu_host::hip::MemoryBudget;
use bulkhead_kernels::hip::KernelDevice;
use bulkhead_kernels::hip::emulator::{Emulator, HarnessError, build_harness, source_dir};
use clap::ValueEnum;
use serde_json::{Value, json};

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The CPU kernels (AVX2/AVX-512 where the processor has them).
    #[default]
    Cpu,
    /// The HIP kernels on HIP device 0 (a build with feature `hip`).
    Hip,
    /// The same kernels, built by nvcc, on CUDA device 0 (feature `cuda`,
    /// with nvcc at build time).
    Cuda,
    /// The HIP kernels on the kernel emulator: the HIP backend's host code
    /// and kernels run on CPU threads (slow; small models only). Built
    /// from the kernels' source with the first C++ compiler there is.
    Emulated,
}

/// An open backend; on a device, the view whose ledger counts what the
/// backend asks of it.
pub struct OpenBackend {
    pub backend: Box<dyn Backend>,
    device: Option<Arc<BudgetedDevice>>,
}

impl OpenBackend {
    pub fn open(kind: BackendKind, threads: usize) -> anyhow::Result<OpenBackend> {
        let device: Arc<dyn KernelDevice> = match kind {
            BackendKind::Cpu => {
                let cpu = CpuBackend::new(threads).context("starting the CPU backend")?;
                return Ok(OpenBackend {
                    backend: Box::new(cpu),
                    device: None,
                });
            }
            BackendKind::Hip => open_hip_device(0, MemoryBudget::new("hip device 0", u64::MAX))
                .context("opening HIP device 0")?,
            BackendKind::Cuda => open_cuda_device(0, MemoryBudget::new("cuda device 0", u64::MAX))
                .context("opening CUDA device 0")?,
            BackendKind::Emulated => Arc::new(emulator()?),
        };
        let view = Arc::new(BudgetedDevice::new(
            device,
            MemoryBudget::new("command line", u64::MAX),
        ));
        let backend = HipBackend::new(view.clone());
        Ok(OpenBackend {
            backend: Box::new(backend),
            device: Some(view),
        })
    }

    /// What the backend has asked of its device so far (none on the CPU).
    pub fn transfers(&self) -> Option<Transfers> {
        self.device.as_ref().map(|d| d.transfers())
    }

    /// Puts the model's weights on the device, so passes move only
    /// activations; a no-op on the CPU.
    pub fn load(&self, model: &Model) -> anyhow::Result<()> {
        model.check_backend(&*self.backend)?;
        model
            .preload(&*self.backend)
            .context("uploading the weights to the device")
    }

    /// The device's name, for `--json`.
    pub fn describe(&self) -> String {
        self.backend.name()
    }
}

/// The kernel emulator, built (once per source change: the compiler
/// rebuilds it each start, in a second or so) into the user's cache.
fn emulator() -> anyhow::Result<Emulator> {
    let source = source_dir();
    if !source.is_dir() {
        bail!(
            "the emulated backend is built from the HIP kernels' source, expected at {}; \
             run this binary from a checkout of the repository",
            source.display()
        );
    }
    let dir = cache_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let harness = build_harness(&dir).map_err(|e| match e {
        HarnessError::NoCompiler(_) => anyhow::anyhow!("{e}; install g++ or clang++, or set CXX"),
        HarnessError::Build(_) => anyhow::anyhow!(e),
    })?;
    Emulator::start(&harness, 64).context("starting the HIP kernel emulator")
}

/// `$XDG_CACHE_HOME/bulkhead` or `~/.cache/bulkhead`: the user's own, so
/// no other user can swap the binary we run.
fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set: nowhere to build the emulator")?;
    Ok(base.join("bulkhead").join("hip-emulator"))
}

/// Records the device's counts between phases of a run.
pub struct Phases<'b> {
    backend: &'b OpenBackend,
    last: Transfers,
    pub load: Transfers,
    pub prefill: Vec<(usize, Transfers)>,
    pub decode: Vec<Transfers>,
}

impl<'b> Phases<'b> {
    /// Starts counting now (before the model's load).
    pub fn new(backend: &'b OpenBackend) -> Phases<'b> {
        Phases {
            backend,
            last: backend.transfers().unwrap_or_default(),
            load: Transfers::default(),
            prefill: Vec::new(),
            decode: Vec::new(),
        }
    }

    /// What happened since the last call.
    fn take(&mut self) -> Transfers {
        let now = self.backend.transfers().unwrap_or_default();
        let since = now.since(&self.last);
        self.last = now;
        since
    }

    pub fn loaded(&mut self) {
        self.load = self.take();
    }

    pub fn prefilled(&mut self, tokens: usize) {
        let t = self.take();
        self.prefill.push((tokens, t));
    }

    pub fn decoded(&mut self) {
        let t = self.take();
        self.decode.push(t);
    }

    /// The `device` object of `--json`: the load, each prefill chunk, and
    /// the decode steps' median and max of each count.
    pub fn to_json(&self) -> Value {
        let chunks: Vec<Value> = self
            .prefill
            .iter()
            .map(|(tokens, t)| {
                let mut v = counts(t);
                v["tokens"] = json!(tokens);
                v
            })
            .collect();
        let (mut median, mut max) = (json!({}), json!({}));
        for (i, (name, _)) in Transfers::default().named().into_iter().enumerate() {
            let mut v: Vec<u64> = self.decode.iter().map(|t| t.named()[i].1).collect();
            v.sort_unstable();
            // The upper median of an even count: a figure that was measured.
            median[name] = json!(v.get(v.len() / 2).copied().unwrap_or(0));
            max[name] = json!(v.last().copied().unwrap_or(0));
        }
        json!({
            "backend": self.backend.describe(),
            "load": counts(&self.load),
            "prefill_chunks": chunks,
            "decode_steps": { "count": self.decode.len(), "median": median, "max": max },
        })
    }
}

fn counts(t: &Transfers) -> Value {
    let mut v = json!({});
    for (name, n) in t.named() {
        v[name] = json!(n);
    }
    v
}
