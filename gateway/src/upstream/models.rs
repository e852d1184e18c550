//! Model loading on the gpu-host: `LoadModel` and `UnloadModel`, whose
//! refusals the registration code needs told apart (a file that does not
//! match its signature is not a busy host), so they are mapped here rather
//! than through [`UpstreamError`]'s generation-oriented `From<Status>`.

use std::time::Duration;

use bulkhead_protocol::v1::{LoadModelRequest, LoadModelResponse, UnloadModelRequest};
use tokio::sync::watch;
use tonic::{Code, Status};

use super::{Upstream, UpstreamError, UpstreamState};

/// How long a load waits, in all, while the host is busy loading another
/// model (another gateway's, or a restart's) before giving up.
const BUSY_WAIT: Duration = Duration::from_secs(30);
/// Pause between tries while the host is busy.
const BUSY_RETRY: Duration = Duration::from_millis(250);

/// Why the gpu-host did not load a model.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The host already serves a model under this name.
    #[error("{0}")]
    NameTaken(String),
    /// The file does not exist on the host.
    #[error("{0}")]
    FileNotFound(String),
    /// The file's bytes are not the signed ones (the message names the
    /// file and how it differs).
    #[error("{0}")]
    Mismatch(String),
    /// The file matched but is not a model the host can run, or a field
    /// was refused.
    #[error("{0}")]
    Invalid(String),
    /// Another load kept the host busy for longer than [`BUSY_WAIT`].
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl From<Status> for LoadError {
    fn from(status: Status) -> LoadError {
        let message = status.message().to_string();
        match status.code() {
            Code::AlreadyExists => LoadError::NameTaken(message),
            Code::NotFound => LoadError::FileNotFound(message),
            Code::FailedPrecondition => LoadError::Mismatch(message),
            Code::InvalidArgument => LoadError::Invalid(message),
            Code::ResourceExhausted => LoadError::Busy(message),
            _ => LoadError::Upstream(UpstreamError::from(status)),
        }
    }
}

impl Upstream {
    /// The same host, whose readiness follows `state` instead: the request
    /// path's handle waits for the models to be loaded, not just for the
    /// process to listen.
    pub fn with_state(&self, state: watch::Receiver<UpstreamState>) -> Upstream {
        Upstream {
            state,
            ..self.clone()
        }
    }

    /// Loads a model, waiting (bounded) while the host is busy with
    /// another load. The host hashes every byte; nothing is served unless
    /// they match.
    pub async fn load_model(
        &self,
        request: LoadModelRequest,
    ) -> Result<LoadModelResponse, LoadError> {
        let deadline = tokio::time::Instant::now() + BUSY_WAIT;
        loop {
            self.ready().await?;
            let mut client = self.client.clone();
            match client.load_model(request.clone()).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status)
                    if status.code() == Code::ResourceExhausted
                        && tokio::time::Instant::now() + BUSY_RETRY < deadline =>
                {
                    tokio::time::sleep(BUSY_RETRY).await;
                }
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Stops serving a model; `Ok(false)` when the host did not have it.
    pub async fn unload_model(&self, name: &str) -> Result<bool, UpstreamError> {
        self.ready().await?;
        let mut client = self.client.clone();
        match client
            .unload_model(UnloadModelRequest {
                name: name.to_string(),
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(status) if status.code() == Code::NotFound => Ok(false),
            Err(status) => Err(status.into()),
        }
    }
}
