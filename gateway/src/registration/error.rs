//! Why a registration was refused or failed, by whose fault.

use std::path::PathBuf;

use super::MODEL_NAME_RULE;
use crate::audit::AuditError;
use crate::signing::ModelError;
use crate::upstream::{LoadError, UpstreamError};

/// Every way registering or unregistering a model can fail. The caller's
/// mistakes name the field; the host's refusals carry its message (which
/// names the file and how it differs).
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("model name `{}` is not valid: {MODEL_NAME_RULE}", .0.escape_debug())]
    InvalidName(String),
    /// `dir` is not a folder path the gpu-host can be given.
    #[error("`dir`: {0}")]
    InvalidDir(String),
    #[error(
        "the signature bundle is {size} bytes; a registration's is limited to {limit} bytes \
         (its audit entry must fit in 1 MiB)"
    )]
    BundleTooLarge { size: usize, limit: usize },
    /// The bundle is not a model-signing bundle we accept, or a trusted key
    /// signed a statement we refuse.
    #[error("the signature bundle: {0}")]
    InvalidBundle(ModelError),
    /// No trusted publisher's key verifies the signature.
    #[error("{0}")]
    Untrusted(String),
    /// `file` does not name a signed file, or there is no single GGUF.
    #[error("{0}")]
    File(String),
    #[error("model `{0}` is already registered")]
    Exists(String),
    #[error(
        "model `{0}` is configured in the policy (gateway.toml); remove it there to stop \
         serving it"
    )]
    Configured(String),
    #[error("model `{0}` is not registered")]
    NotFound(String),
    #[error("at most {0} models may be registered through the API")]
    TooMany(usize),
    #[error(
        "model registration through the API is off: add `[models] registry = \"...\"` (or a \
         PostgreSQL `[state] store`) to gateway.toml"
    )]
    Disabled,
    /// The gpu-host refused or failed the load.
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("{action} {}: {source}", path.display())]
    Store {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The state database cannot take the change now (503; retry).
    #[error("the state database: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// One of several gpu-hosts refused or failed the load.
    #[error("gpu-host `{0}`: {1}")]
    OnHost(String, Box<RegistrationError>),
}

impl RegistrationError {
    pub(crate) fn store(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> RegistrationError {
        let path = path.to_path_buf();
        move |source| RegistrationError::Store {
            action,
            path,
            source,
        }
    }
}
