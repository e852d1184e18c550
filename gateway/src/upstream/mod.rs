//! The gateway's side of the gRPC contract: a client for one gpu-host, whether
//! a remote one or the local child [`supervisor`] keeps running.

mod generate;
mod model_watch;
mod models;
mod partitions;
mod supervisor;

use std::sync::Arc;
use std::time::Duration;

use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::v1::{
    GenerateEvent, GenerateRequest, HealthRequest, HealthResponse, ListModelsRequest, ModelInfo,
    generate_event,
};
use bulkhead_protocol::{AUTHORIZATION, ClientTls, Target, bearer_value, connect_lazy_with};
use tokio::sync::{Notify, watch};
use tonic::codegen::InterceptedService;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub use generate::{Event, Events, Finish, Generate, Prompt, Started};
pub use model_watch::watch_models;
pub use models::LoadError;
pub use partitions::watch_partitions;
pub use supervisor::{ChildConfig, ChildTelemetry, LocalGpuHost, Supervisor, SupervisorError};

/// Whether the gpu-host can take requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamState {
    /// The local child is starting (or restarting after a crash).
    Starting,
    /// Requests can be sent.
    Ready,
    /// The gateway is shutting down; the child will not come back.
    Stopped,
}

/// Why a call to the gpu-host failed, in terms the HTTP layer can map.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The host is down, restarting, or the connection broke mid-request.
    #[error("the GPU host is unavailable: {0}")]
    Unavailable(String),
    /// The host's queue is full.
    #[error("the GPU host is overloaded: {0}")]
    Overloaded(String),
    /// The request can never fit the tenant's share of the KV cache (the
    /// host's message says how many tokens it needs and has).
    #[error("{0}")]
    KvBudgetExceeded(String),
    /// The host does not serve the model.
    #[error("{0}")]
    ModelNotFound(String),
    /// The host refused an argument (the message names it).
    #[error("{0}")]
    InvalidArgument(String),
    /// The model is out of service: its resident weights no longer match
    /// what was verified (the message says which chunk).
    #[error("{0}")]
    ModelUnavailable(String),
    /// The device failed the step the request was in; `kind` is the
    /// host's name for why (`out_of_memory`, `failed`, `device_lost`), the
    /// message the host's whole text (for the log).
    #[error("{message}")]
    DeviceError { kind: String, message: String },
    /// The host broke the contract (events out of order, unknown codes).
    #[error("the GPU host answered unexpectedly: {0}")]
    Protocol(String),
}

/// How the gpu-host starts a RESOURCE_EXHAUSTED that is the tenant's KV
/// budget rather than the host's queue.
const KV_BUDGET_EXCEEDED: &str = "kv_budget_exceeded:";

/// How the gpu-host starts an UNAVAILABLE that is its device failing a
/// step (followed by the kind and `:`), not the host going away.
const DEVICE_ERROR: &str = "device_error: ";

/// How tonic starts the message of a status it makes from an HTTP/2 error
/// (`Status::from_h2_error`, and `from_hyper_error` for a hyper error an h2
/// one caused). Its code is the h2 reason's: ENHANCE_YOUR_CALM, which h2
/// sends (or raises on its own side) when it closes a connection for too
/// many resets, becomes RESOURCE_EXHAUSTED, though it says nothing of the
/// host's queue; INADEQUATE_SECURITY becomes PERMISSION_DENIED.
const TONIC_H2_ERROR: &str = "h2 protocol error";

/// Whether `status` is the connection to the host failing rather than an
/// answer from the host. A status the host sends arrives in `grpc-status`
/// and carries no source; one tonic makes from a transport error carries
/// that error: a `hyper::Error`, or an `h2::Error` (this crate does not
/// depend on h2), whose statuses start with [`TONIC_H2_ERROR`].
fn is_transport_failure(status: &Status) -> bool {
    status.message().starts_with(TONIC_H2_ERROR)
        || causes(status).any(|cause| cause.is::<hyper::Error>())
}

/// The errors beneath `status`, outermost first.
fn causes(status: &Status) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(status), |cause| cause.source())
}

/// The status's message and the causes it does not already say: for an h2
/// failure, whether the host closed the connection ("connection error
/// received") or this process's own h2 did ("... detected"), and why.
fn with_causes(status: &Status) -> String {
    let mut text = status.message().to_string();
    for cause in causes(status) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

impl From<Status> for UpstreamError {
    fn from(status: Status) -> UpstreamError {
        // Before the codes: tonic gives a broken connection whatever code
        // its h2 reason maps to. It is the host being unavailable (the pool
        // ejects it, a supervised host is retried after its restart, the
        // client is told `upstream_unavailable`), not the host's refusal.
        if is_transport_failure(&status) {
            return UpstreamError::Unavailable(with_causes(&status));
        }
        let message = status.message().to_string();
        match status.code() {
            Code::NotFound => UpstreamError::ModelNotFound(message),
            Code::InvalidArgument | Code::OutOfRange => UpstreamError::InvalidArgument(message),
            Code::ResourceExhausted if message.starts_with(KV_BUDGET_EXCEEDED) => {
                UpstreamError::KvBudgetExceeded(message)
            }
            Code::ResourceExhausted => UpstreamError::Overloaded(message),
            Code::FailedPrecondition => UpstreamError::ModelUnavailable(message),
            Code::Unavailable if message.starts_with(DEVICE_ERROR) => {
                let kind = message[DEVICE_ERROR.len()..]
                    .split_once(':')
                    .map_or("failed", |(kind, _)| kind)
                    .to_string();
                UpstreamError::DeviceError { kind, message }
            }
            // A dropped connection shows up as UNAVAILABLE or UNKNOWN (h2 reset),
            // a killed host mid-stream as CANCELLED or INTERNAL from h2.
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal => {
                UpstreamError::Unavailable(message)
            }
            other => UpstreamError::Protocol(format!("{other:?}: {message}")),
        }
    }
}

/// Adds `authorization: Bearer <secret>` when the host needs one.
#[derive(Clone, Debug)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

type Client = GpuHostClient<InterceptedService<Channel, Bearer>>;

/// A handle on one gpu-host, cheap to clone.
#[derive(Clone, Debug)]
pub struct Upstream {
    client: Client,
    /// What the client sends with each call (kept for [`Upstream::for_target`]).
    bearer: Bearer,
    /// TLS to a `tcp:` host (kept for [`Upstream::for_target`]).
    tls: Option<ClientTls>,
    state: watch::Receiver<UpstreamState>,
    /// How long a new request waits for a (re)starting host before 503.
    ready_wait: Duration,
    /// A supervisor restarts this host when it dies (the local child).
    supervised: Supervised,
    /// Told when this gateway's `SetPartitions` changed the host's layout,
    /// so the partition watcher reads the new one at once.
    layout_changed: Arc<Notify>,
}

/// Whether someone restarts the host when it dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Supervised {
    /// The local child: a failed connection means "restarting"; wait and retry.
    Yes,
    /// A remote host: a failed connection is reported at once.
    No,
}

/// How long a failed call waits for the supervisor to notice that the child
/// died (it learns from SIGCHLD, within milliseconds) before retrying anyway.
const NOTICE_DEATH: Duration = Duration::from_secs(1);
/// Tries of a generation that fails before it starts on a supervised host:
/// the first, one after the restart, and one more because a channel may
/// report its broken connection once more before it reconnects.
const ATTEMPTS: u32 = 3;

/// How long a request waits for a restarting gpu-host before giving up with
/// 503: long enough to cover a crash-restart of a small model, short enough
/// that clients are not left hanging.
pub const DEFAULT_READY_WAIT: Duration = Duration::from_secs(10);

impl Upstream {
    /// A client for `target`. `state` says when the host is ready (for a
    /// remote host, a channel that always says `Ready`).
    pub fn new(
        target: &Target,
        secret: Option<&str>,
        tls: Option<&ClientTls>,
        state: watch::Receiver<UpstreamState>,
        ready_wait: Duration,
        supervised: Supervised,
    ) -> Result<Upstream, UpstreamError> {
        let channel = connect_lazy_with(target, tls)
            .map_err(|e| UpstreamError::Unavailable(e.to_string()))?;
        let bearer = match secret {
            Some(secret) => Some(
                bearer_value(secret)
                    .parse()
                    .map_err(|_| UpstreamError::Protocol("the secret is not ASCII".into()))?,
            ),
            None => None,
        };
        let bearer = Bearer(bearer);
        Ok(Upstream {
            client: GpuHostClient::with_interceptor(channel, bearer.clone()),
            bearer,
            tls: tls.cloned(),
            state,
            ready_wait,
            supervised,
            layout_changed: Arc::new(Notify::new()),
        })
    }

    /// The same host reached at another of its listeners (a partition's
    /// own lane): same readiness, ready wait and supervision, a new client
    /// with its own connection. The connection runs on the runtime this is
    /// called on, so a connection lane calls it on its own thread.
    pub fn for_target(&self, target: &Target) -> Result<Upstream, UpstreamError> {
        let tls = if target.is_tcp() {
            self.tls.as_ref()
        } else {
            None
        };
        let channel = connect_lazy_with(target, tls)
            .map_err(|e| UpstreamError::Unavailable(e.to_string()))?;
        Ok(Upstream {
            client: GpuHostClient::with_interceptor(channel, self.bearer.clone()),
            ..self.clone()
        })
    }

    /// The current state (for `/readyz`).
    pub fn state(&self) -> UpstreamState {
        *self.state.borrow()
    }

    /// Waits (bounded) until the host is ready.
    async fn ready(&self) -> Result<(), UpstreamError> {
        let mut state = self.state.clone();
        let wait = state.wait_for(|s| *s != UpstreamState::Starting);
        match tokio::time::timeout(self.ready_wait, wait).await {
            Ok(Ok(s)) if *s == UpstreamState::Ready => Ok(()),
            Ok(_) => Err(UpstreamError::Unavailable(
                "the gateway is shutting down".into(),
            )),
            Err(_) => Err(UpstreamError::Unavailable(format!(
                "it did not come back within {} s",
                self.ready_wait.as_secs()
            ))),
        }
    }

    /// Starts a generation and waits for its `Started` event; the returned
    /// stream yields the Deltas and Finished that follow.
    ///
    /// A local host that dies before a generation starts cost the tenant
    /// nothing yet: the call waits for the supervisor's restart (bounded)
    /// and is sent again, up to [`ATTEMPTS`] times in all.
    pub async fn generate(&self, request: Generate) -> Result<(Started, Events), UpstreamError> {
        let request = GenerateRequest::from(request);
        let mut attempt = 1;
        loop {
            self.ready().await?;
            match self.start_generation(request.clone()).await {
                Err(UpstreamError::Unavailable(why))
                    if self.supervised == Supervised::Yes && attempt < ATTEMPTS =>
                {
                    tracing::warn!(
                        attempt,
                        "the gpu-host failed before generating ({why}); retrying after its restart"
                    );
                    attempt += 1;
                    // The supervisor learns of a death from SIGCHLD within
                    // milliseconds; if the state never leaves Ready, the
                    // host is up and the retry goes straight through.
                    let mut state = self.state.clone();
                    let _ = tokio::time::timeout(
                        NOTICE_DEATH,
                        state.wait_for(|s| *s != UpstreamState::Ready),
                    )
                    .await;
                }
                result => return result,
            }
        }
    }

    async fn start_generation(
        &self,
        request: GenerateRequest,
    ) -> Result<(Started, Events), UpstreamError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(request);
        // The current span's trace context (the request's `upstream` span),
        // so the gpu-host's spans continue the client's trace.
        bulkhead_telemetry::propagation::inject_span(
            &tracing::Span::current(),
            request.metadata_mut().as_mut(),
        );
        let mut events = client.generate(request).await?.into_inner();
        match events.message().await? {
            Some(GenerateEvent {
                event: Some(generate_event::Event::Started(started)),
            }) => Ok((Started::from(started), Events::new(events))),
            Some(_) => Err(UpstreamError::Protocol(
                "the first event was not Started".into(),
            )),
            None => Err(UpstreamError::Unavailable(
                "the stream ended before the generation started".into(),
            )),
        }
    }

    /// The models the host serves.
    pub async fn list_models(&self) -> Result<Vec<ModelInfo>, UpstreamError> {
        self.ready().await?;
        let mut client = self.client.clone();
        Ok(client
            .list_models(ListModelsRequest {})
            .await?
            .into_inner()
            .models)
    }

    /// The host's health, without waiting for a restart.
    pub async fn health(&self) -> Result<HealthResponse, UpstreamError> {
        if self.state() != UpstreamState::Ready {
            return Err(UpstreamError::Unavailable("restarting".into()));
        }
        let mut client = self.client.clone();
        Ok(client.health(HealthRequest {}).await?.into_inner())
    }
}

#[cfg(test)]
mod tests;
