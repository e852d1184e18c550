//! The models a host serves, loaded once at start and read-only afterwards
//! (requests share them through `Arc` without locks).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use bulkhead_protocol::digest::{CHUNK_BYTES, leaf_hash, to_hex};

use crate::backend::CpuBackend;
use crate::engine::Model;
use crate::gguf::Gguf;
use crate::verify::{Expected, LoadError, Piece, Scrubbable, WeightState, load_resident};
use crate::{ChatTemplate, Tokenizer};

/// `NAME=PATH` from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    pub path: PathBuf,
}

/// Why a `NAME=PATH` was refused.
#[derive(Debug, thiserror::Error)]
#[error("`{0}`: expected NAME=PATH with a name of letters, digits and `._:/-`")]
pub struct BadModelSpec(String);

impl FromStr for ModelSpec {
    type Err = BadModelSpec;

    fn from_str(s: &str) -> Result<ModelSpec, BadModelSpec> {
        let (name, path) = s.split_once('=').ok_or_else(|| BadModelSpec(s.into()))?;
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
        if !name_ok || path.is_empty() {
            return Err(BadModelSpec(s.into()));
        }
        Ok(ModelSpec {
            name: name.into(),
            path: path.into(),
        })
    }
}

/// A model ready to run.
#[derive(Debug)]
pub(crate) struct LoadedModel {
    pub name: String,
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// The chat template, or why the model's one could not be compiled
    /// (text and token prompts still work).
    pub chat_template: Result<ChatTemplate, String>,
    /// What the resident weights were verified as, and whether they still are.
    pub weights: WeightState,
    /// What responses name the weights by (`x-bulkhead-model-digest`).
    pub digest: String,
}

impl LoadedModel {
    /// Where the served copy of the file's byte `offset` is (for the test
    /// hook that corrupts it): that byte of the resident file, or, in a
    /// matrix served from a packed copy whose file pages were freed, the
    /// byte at the same relative position of the copy. `None` past the end.
    pub fn served_byte(&self, offset: usize) -> Option<(&[u8], usize)> {
        let file = self.model.gguf().mapped_bytes();
        if offset >= file.len() {
            return None;
        }
        let scrubbed_in_file = |o: &usize| {
            self.weights
                .pieces()
                .iter()
                .any(|p| p.region == 0 && p.range.contains(o))
        };
        if scrubbed_in_file(&offset) {
            return Some((file, offset));
        }
        let packed = self.model.packed_forms().find(|(_, r)| r.contains(&offset));
        Some(match packed {
            Some((p, r)) => {
                let bytes = p.as_bytes();
                (bytes, (offset - r.start) * bytes.len() / r.len())
            }
            None => (file, offset),
        })
    }
}

impl Scrubbable for LoadedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn region(&self, index: usize) -> &[u8] {
        match index {
            0 => self.model.gguf().mapped_bytes(),
            i => self
                .model
                .packed_forms()
                .nth(i - 1)
                .map_or(&[], |(p, _)| p.as_bytes()),
        }
    }

    fn state(&self) -> &WeightState {
        &self.weights
    }
}

/// The models a host serves: a snapshot the request path reads without
/// locks, replaced whole when a model is loaded or unloaded.
#[derive(Debug)]
pub(crate) struct ModelRegistry {
    models: ArcSwap<BTreeMap<String, Arc<LoadedModel>>>,
    /// Where the host's passes run: a device host refuses models that need
    /// ops its kernels lack.
    place: PassPlace,
    /// One load at a time: each already uses every core, and a second would
    /// double the memory being filled.
    loading: tokio::sync::Mutex<()>,
}

/// Where a host's forward passes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassPlace {
    /// On the CPU: every model the engine reads runs.
    Host,
    /// On a HIP or CUDA device, whose kernels lack some architectures' ops.
    Device,
}

/// Why a `LoadModel` failed, by whose fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadRefused {
    #[error("model `{0}` is already loaded")]
    NameTaken(String),
    #[error("another model is being loaded; retry when it is done")]
    Busy,
    #[error("{0}")]
    NotFound(String),
    /// The bytes are not what was registered.
    #[error("{0}")]
    Mismatch(String),
    /// The file is not a model this host can run.
    #[error("{0}")]
    Invalid(String),
}

/// Reads, verifies and prepares one model (blocking: the file is read and
/// hashed on every core).
pub(crate) fn load_model(
    spec: &ModelSpec,
    expected: Option<&Expected>,
    digest: Option<String>,
    place: PassPlace,
) -> Result<LoadedModel, LoadRefused> {
    let invalid = |message: String| LoadRefused::Invalid(message);
    // Copied into memory and hashed on the way (every byte once).
    let resident = load_resident(&spec.path, expected).map_err(|e| match e {
        LoadError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            LoadRefused::NotFound(e.to_string())
        }
        LoadError::SizeMismatch { .. }
        | LoadError::ChunkRootMismatch { .. }
        | LoadError::Sha256Mismatch { .. }
        | LoadError::Truncated(_) => LoadRefused::Mismatch(e.to_string()),
        LoadError::Io { .. } | LoadError::Empty(_) => invalid(e.to_string()),
    })?;
    let weights = WeightState::new(&resident);
    let digest =
        digest.unwrap_or_else(|| format!("chunks-sha256:{}", to_hex(weights.chunk_root())));
    let gguf = Gguf::from_resident(&spec.path, resident.map).map_err(|e| invalid(e.to_string()))?;
    let model = Model::from_gguf(gguf).map_err(|e| invalid(e.to_string()))?;
    let weights = match place {
        PassPlace::Device => {
            model
                .check_device_support()
                .map_err(|e| invalid(e.to_string()))?;
            weights
        }
        PassPlace::Host => pack(&model, weights),
    };
    let tokenizer = Tokenizer::from_metadata(model.gguf().metadata())
        .map_err(|e| invalid(format!("tokenizer: {e}")))?;
    let chat_template =
        ChatTemplate::from_metadata(model.gguf().metadata(), &tokenizer).map_err(|e| e.to_string());
    Ok(LoadedModel {
        name: spec.name.clone(),
        model,
        tokenizer,
        chat_template,
        weights,
        digest,
    })
}

/// Repacks the matrices the CPU kernels read faster in another form (on
/// AVX-512 VNNI; the partitions' backends detect the same instruction set,
/// so every pass reads the packed copies), frees the resident pages they
/// replace, and points the scrub at what is served: the file's other bytes
/// and the packed copies, each hashed now, right after the bytes they come
/// from were verified. Without a packed form, `weights` is returned as is.
fn pack(model: &Model, weights: WeightState) -> WeightState {
    use rayon::prelude::*;
    let Ok(cpu) = CpuBackend::new(1) else {
        return weights; // no packing: the passes read the file's bytes
    };
    let gguf = model.gguf();
    let freed = std::sync::Mutex::new(Vec::new());
    let packed = model.pack(&cpu, |range| {
        if let Some(range) = gguf.discard_resident_pages(range)
            && !range.is_empty()
        {
            freed.lock().unwrap_or_else(|e| e.into_inner()).push(range);
        }
    });
    if packed == 0 {
        return weights;
    }
    let mut freed = freed.into_inner().unwrap_or_else(|e| e.into_inner());
    freed.sort_by_key(|r| r.start);
    // What is still read of the file: the gaps between freed ranges.
    let mut kept = Vec::new();
    let mut at = 0;
    for range in freed.iter().chain([&(gguf.file_len()..gguf.file_len())]) {
        kept.push(at..range.start);
        at = range.end;
    }
    let mut parts: Vec<(usize, Range<usize>)> = Vec::new();
    let mut cut = |region: usize, range: Range<usize>| {
        for start in range.clone().step_by(CHUNK_BYTES) {
            parts.push((region, start..range.end.min(start + CHUNK_BYTES)));
        }
    };
    for range in kept {
        cut(0, range);
    }
    for (i, (p, _)) in model.packed_forms().enumerate() {
        cut(i + 1, 0..p.as_bytes().len());
    }
    let forms: Vec<&[u8]> = model.packed_forms().map(|(p, _)| p.as_bytes()).collect();
    let bytes = |region: usize| match region {
        0 => gguf.mapped_bytes(),
        i => forms[i - 1],
    };
    let pieces = parts
        .into_par_iter()
        .map(|(region, range)| Piece {
            leaf: leaf_hash(&bytes(region)[range.clone()]),
            region,
            range,
        })
        .collect();
    weights.scrubbing(pieces)
}

/// Why the models given at start could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("model name `{0}` is given twice")]
    DuplicateModel(String),
    #[error("loading model `{name}` from {}: {message}", path.display())]
    LoadModel {
        name: String,
        path: PathBuf,
        message: String,
    },
}

impl ModelRegistry {
    /// Loads the models given at start (hashed, not checked against a
    /// registration: the command line is trusted like the binary).
    pub(crate) fn load(specs: &[ModelSpec], place: PassPlace) -> Result<ModelRegistry, StartError> {
        let mut models = BTreeMap::new();
        for spec in specs {
            if models.contains_key(&spec.name) {
                return Err(StartError::DuplicateModel(spec.name.clone()));
            }
            let loaded =
                load_model(spec, None, None, place).map_err(|e| StartError::LoadModel {
                    name: spec.name.clone(),
                    path: spec.path.clone(),
                    message: e.to_string(),
                })?;
            models.insert(spec.name.clone(), Arc::new(loaded));
        }
        Ok(ModelRegistry {
            models: ArcSwap::from_pointee(models),
            place,
            loading: tokio::sync::Mutex::new(()),
        })
    }

    /// Loads and verifies a registered model, then publishes it.
    pub(crate) async fn add(
        &self,
        spec: ModelSpec,
        expected: Expected,
        digest: Option<String>,
    ) -> Result<Arc<LoadedModel>, LoadRefused> {
        let _one_at_a_time = self.loading.try_lock().map_err(|_| LoadRefused::Busy)?;
        if self.get(&spec.name).is_some() {
            return Err(LoadRefused::NameTaken(spec.name));
        }
        let place = self.place;
        let loaded =
            tokio::task::spawn_blocking(move || load_model(&spec, Some(&expected), digest, place))
                .await
                .map_err(|e| LoadRefused::Invalid(format!("loading failed (a bug): {e}")))??;
        let loaded = Arc::new(loaded);
        // Loads are serialized by `loading`, so nothing else added this name.
        self.models.rcu(|current| {
            let mut next = BTreeMap::clone(current);
            next.insert(loaded.name.clone(), loaded.clone());
            next
        });
        Ok(loaded)
    }

    /// Stops serving `name`; requests holding it finish, then it is freed.
    pub(crate) fn remove(&self, name: &str) -> Option<Arc<LoadedModel>> {
        let mut removed = None;
        self.models.rcu(|current| {
            let mut next = BTreeMap::clone(current);
            removed = next.remove(name);
            next
        });
        if let Some(model) = &removed {
            model.weights.retire();
        }
        removed
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<LoadedModel>> {
        self.models.load().get(name).cloned()
    }

    /// Every model, in name order.
    pub(crate) fn all(&self) -> Vec<Arc<LoadedModel>> {
        self.models.load().values().cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.models.load().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(file: &str) -> ModelSpec {
        ModelSpec {
            name: "m".into(),
            path: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/models")
                .join(file),
        }
    }

    #[test]
    fn a_device_host_refuses_a_model_its_kernels_cannot_run_at_load() {
        let e = load_model(&spec("gemma2-q4_0.gguf"), None, None, PassPlace::Device).unwrap_err();
        let LoadRefused::Invalid(message) = e else {
            panic!("not refused as invalid: {e:?}")
        };
        assert!(
            message.contains("gemma2") && message.contains("GELU"),
            "{message}"
        );
        load_model(&spec("gemma2-q4_0.gguf"), None, None, PassPlace::Host).unwrap();
        load_model(&spec("llama-q8_0.gguf"), None, None, PassPlace::Device).unwrap();
    }

    /// A mixture of experts needs an op the device kernels lack: refused
    /// when loaded for a device, naming the architecture and the op.
    #[test]
    fn a_device_host_refuses_a_mixture_of_experts_at_load() {
        let moe = spec("mixtral-q8_0.gguf");
        let Err(LoadRefused::Invalid(message)) = load_model(&moe, None, None, PassPlace::Device)
        else {
            panic!("a mixture of experts loaded for a device");
        };
        for part in ["llama", "mixture of experts", "moe_ffn"] {
            assert!(message.contains(part), "{message}");
        }
        assert!(load_model(&moe, None, None, PassPlace::Host).is_ok());
    }

    /// A host model is served from packed copies where the CPU has them
    /// (AVX-512 VNNI), their resident pages freed: its logits equal the
    /// command line's (the mapped file, packed by `preload`, whose freed
    /// pages fault back in), so no pass reads a freed page; and the scrub
    /// covers exactly the file's other bytes and the copies.
    #[test]
    fn a_host_model_is_served_from_packed_copies_and_scrubbed_there() {
        use crate::engine::Logits;
        let vnni = bulkhead_kernels::Isa::detect() == bulkhead_kernels::Isa::Avx512Vnni;
        let cpu = CpuBackend::new(2).unwrap();
        for file in ["llama-q8_0.gguf", "qwen2-q4_0.gguf", "llama-q4_k_m.gguf"] {
            let spec = spec(file);
            let served = load_model(&spec, None, None, PassPlace::Host).unwrap();
            let cli = Model::open(&spec.path).unwrap();
            cli.preload(&cpu).unwrap();
            let packed = served.model.packed_matrices();
            assert_eq!(packed, cli.packed_matrices(), "{file}");
            assert_eq!(packed > 0, vnni, "{file}: {packed} packed");

            let tokens = [1, 5, 9, 13, 200, 7, 42, 3];
            let logits = |m: &Model| {
                let mut cache = m.new_cache(16);
                m.forward(&cpu, &mut cache, &tokens, Logits::All).unwrap()
            };
            assert_eq!(logits(&served.model), logits(&cli), "{file}");

            let pieces = served.weights.pieces();
            for p in pieces {
                let bytes = &served.region(p.region)[p.range.clone()];
                assert_eq!(leaf_hash(bytes), p.leaf, "{file}: {p:?}");
            }
            let len = served.model.gguf().file_len();
            let in_file: usize = pieces
                .iter()
                .filter(|p| p.region == 0)
                .map(|p| p.range.len())
                .sum();
            let copies: usize = served.model.packed_forms().map(|(p, _)| p.bytes()).sum();
            let in_copies: usize = pieces
                .iter()
                .filter(|p| p.region > 0)
                .map(|p| p.range.len())
                .sum();
            assert_eq!(in_copies, copies, "{file}");
            if !vnni {
                assert_eq!(in_file, len, "{file}: the whole file is scrubbed");
                continue;
            }
            // Most of the file is packed matrices: their pages were freed
            // (they read as zeros now) and are not scrubbed.
            assert!(in_file < len / 2, "{file}: {in_file} of {len} bytes");
            let resident = served.model.gguf().mapped_bytes();
            let mut at = 0;
            for p in pieces.iter().filter(|p| p.region == 0) {
                let gap = at..p.range.start;
                assert!(
                    resident[gap.clone()].iter().all(|&b| b == 0),
                    "{file}: {gap:?}"
                );
                at = p.range.end;
            }
            // The model is still named by the file's digest.
            let on_disk = std::fs::read(&spec.path).unwrap();
            let digest = bulkhead_protocol::digest::FileDigest::of(&on_disk);
            assert_eq!(served.weights.chunk_root(), &digest.chunk_root, "{file}");
        }
    }
}
