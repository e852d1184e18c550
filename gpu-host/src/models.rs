//! The models a host serves, loaded once at start and read-only afterwards
//! (requests share them through `Arc` without locks).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use bulkhead_protocol::digest::to_hex;

use crate::engine::Model;
use crate::gguf::Gguf;
use crate::verify::{Expected, LoadError, Scrubbable, WeightState, load_resident};
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

impl Scrubbable for LoadedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn bytes(&self) -> &[u8] {
        self.model.gguf().mapped_bytes()
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
    if place == PassPlace::Device {
        model
            .check_device_support()
            .map_err(|e| invalid(e.to_string()))?;
    }
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
}
