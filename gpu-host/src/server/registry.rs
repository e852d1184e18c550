//! The models a host serves, loaded once at start and read-only afterwards
//! (requests share them through `Arc` without locks).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::ServeError;
use crate::engine::Model;
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
}

#[derive(Debug)]
pub(crate) struct ModelRegistry {
    models: BTreeMap<String, Arc<LoadedModel>>,
}

impl ModelRegistry {
    pub(crate) fn load(specs: &[ModelSpec]) -> Result<ModelRegistry, ServeError> {
        if specs.is_empty() {
            return Err(ServeError::NoModels);
        }
        let mut models = BTreeMap::new();
        for spec in specs {
            if models.contains_key(&spec.name) {
                return Err(ServeError::DuplicateModel(spec.name.clone()));
            }
            let failed = |message: String| ServeError::LoadModel {
                name: spec.name.clone(),
                path: spec.path.clone(),
                message,
            };
            let model = Model::open(&spec.path).map_err(|e| failed(e.to_string()))?;
            let tokenizer = Tokenizer::from_metadata(model.gguf().metadata())
                .map_err(|e| failed(format!("tokenizer: {e}")))?;
            let chat_template = ChatTemplate::from_metadata(model.gguf().metadata(), &tokenizer)
                .map_err(|e| e.to_string());
            let loaded = LoadedModel {
                name: spec.name.clone(),
                model,
                tokenizer,
                chat_template,
            };
            models.insert(spec.name.clone(), Arc::new(loaded));
        }
        Ok(ModelRegistry { models })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<LoadedModel>> {
        self.models.get(name)
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &LoadedModel> {
        self.models.values().map(Arc::as_ref)
    }

    pub(crate) fn len(&self) -> usize {
        self.models.len()
    }
}
