//! The `GpuHost` gRPC service: resolves the model, validates the request,
//! queues it and hands back the stream its worker fills (its events put on
//! the wire as they are read, see `wire.rs`).

use std::sync::Arc;

use bulkhead_protocol::v1;
use bulkhead_protocol::v1::gpu_host_server::{GpuHost, GpuHostServer};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::adapters::Map;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::auth::BearerAuth;
use super::lanes::LaneListeners;
use super::wire::{self, StreamItem};
use crate::sched::{Event, Job, Partitions, SchedError, SeqTrace};
use bulkhead_protocol::digest::Hash;

use super::request::to_engine;
use crate::models::{BadModelSpec, LoadRefused, LoadedModel, ModelRegistry, ModelSpec};
use crate::verify::Expected;
use crate::verify::flip_resident_bit;

/// Events buffered per stream in its channel; beyond that they wait in the
/// stream's backlog on the scheduler (see `sink.rs`).
const EVENT_BUFFER: usize = 64;

/// How a stream's items go on the wire ([`wire::stream_item`]).
type ToWire = fn(Result<Event, SchedError>) -> StreamItem;

/// Whether the test-only RPCs answer (`--enable-test-hooks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestHooks {
    Disabled,
    Enabled,
}

/// The service; its copies (the main listener's and each lane's) share
/// one registry, one set of partitions and one set of lanes.
#[derive(Clone, Debug)]
pub(crate) struct GpuHostService {
    registry: Arc<ModelRegistry>,
    partitions: Arc<Partitions>,
    lanes: Arc<LaneListeners>,
    auth: BearerAuth,
    test_hooks: TestHooks,
}

impl GpuHostService {
    pub(crate) fn new(
        registry: Arc<ModelRegistry>,
        partitions: Arc<Partitions>,
        lanes: Arc<LaneListeners>,
        auth: BearerAuth,
        test_hooks: TestHooks,
    ) -> Self {
        GpuHostService {
            registry,
            partitions,
            lanes,
            auth,
            test_hooks,
        }
    }

    /// What a listener serves: this service behind the bearer check.
    pub(crate) fn routes(&self) -> Routes {
        Routes::new(GpuHostServer::with_interceptor(
            self.clone(),
            self.auth.clone(),
        ))
    }

    fn model(&self, name: &str) -> Result<Arc<LoadedModel>, Status> {
        // Not the list of what is served: a caller learns about its own
        // request only (`ListModels` lists the models).
        self.registry
            .get(name)
            .ok_or_else(|| Status::not_found(format!("model `{name}` is not served here")))
    }
}

/// What `ListModels` and `LoadModel` say about a model.
fn model_info(m: &LoadedModel) -> v1::ModelInfo {
    let config = m.model.config();
    v1::ModelInfo {
        name: m.name.clone(),
        architecture: config.arch.name().to_string(),
        context_length: u32::try_from(config.context_length).unwrap_or(u32::MAX),
        vocab_size: u32::try_from(m.tokenizer.vocab_size()).unwrap_or(u32::MAX),
        digest: m.digest.clone(),
        serving: m.weights.unavailable_reason().is_none(),
        unavailable_reason: m.weights.unavailable_reason().unwrap_or_default().into(),
        weights_verified_at_unix_ms: m.weights.verified_at_ms(),
        scrubbed_bytes: m.weights.scrubbed_bytes(),
        scrub_passes: m.weights.passes(),
        scrub_floor_bytes: m.weights.floor_bytes(),
    }
}

/// A 32-byte digest field of `LoadModelRequest`: empty (absent) or 32 bytes.
fn digest_field(bytes: &[u8], field: &str) -> Result<Option<Hash>, Status> {
    match bytes.len() {
        0 => Ok(None),
        32 => Ok(Some(bytes.try_into().expect("length checked"))),
        n => Err(Status::invalid_argument(format!(
            "{field}: a SHA-256 digest is 32 bytes, not {n}"
        ))),
    }
}

#[tonic::async_trait]
impl GpuHost for GpuHostService {
    type GenerateStream = Map<ReceiverStream<Result<Event, SchedError>>, ToWire>;

    async fn generate(
        &self,
        request: Request<v1::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // The caller's trace (W3C `traceparent` in the metadata), if any.
        let parent = bulkhead_telemetry::propagation::extract(request.metadata().as_ref());
        let req = request.into_inner();
        let model = self.model(&req.model)?;
        if let Some(reason) = model.weights.unavailable_reason() {
            return Err(SchedError::OutOfService {
                model: model.name.clone(),
                reason: reason.to_string(),
            }
            .into());
        }
        let engine_request = to_engine(&model, &req)?;
        let (events, stream) = mpsc::channel(EVENT_BUFFER);
        let trace = SeqTrace::start(
            &parent,
            &req.tenant,
            &model.name,
            u32::try_from(engine_request.max_tokens).unwrap_or(u32::MAX),
            engine_request.prompt_tokens.len(),
        );
        self.partitions.submit(Job {
            model,
            request: engine_request,
            tenant: req.tenant.clone(),
            priority: req.priority.unwrap_or(0),
            events,
            trace,
        })?;
        Ok(Response::new(
            ReceiverStream::new(stream).map(wire::stream_item as ToWire),
        ))
    }

    async fn list_models(
        &self,
        _request: Request<v1::ListModelsRequest>,
    ) -> Result<Response<v1::ListModelsResponse>, Status> {
        let models = self.registry.all().iter().map(|m| model_info(m)).collect();
        Ok(Response::new(v1::ListModelsResponse { models }))
    }

    async fn health(
        &self,
        _request: Request<v1::HealthRequest>,
    ) -> Result<Response<v1::HealthResponse>, Status> {
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let load = self.partitions.health();
        Ok(Response::new(v1::HealthResponse {
            serving: true,
            models: small(self.registry.len()),
            queued: small(load.queued),
            queue_capacity: small(self.partitions.capacity()),
            workers: small(load.schedulers),
            running: small(load.running),
            max_running: small(self.partitions.max_running()),
            preemptions: load.preemptions,
            kv_refusals: load.kv_refusals,
            device_errors: load.device_errors,
            kv_bytes: load.kv_bytes,
            kv_bytes_used: load.kv_bytes_used,
        }))
    }

    async fn set_partitions(
        &self,
        request: Request<v1::SetPartitionsRequest>,
    ) -> Result<Response<v1::SetPartitionsResponse>, Status> {
        let tenants = wire::tenant_requests(&request.into_inner().tenants)?;
        let changed = self.partitions.set(&tenants)?;
        if changed {
            // Blocks while a new lane's thread starts, as `set` does while
            // the schedulers' threads start.
            self.lanes
                .apply(&self.partitions.lane_cpus(), || self.routes());
        }
        let layout = self.partitions.report(&self.lanes.advertised());
        if changed {
            let described: Vec<String> = layout
                .partitions
                .iter()
                .filter(|p| !p.draining)
                .map(|p| match &p.lane {
                    None => format!("{} on cores {:?}", p.id, p.units),
                    Some(lane) => format!("{} on cores {:?}, lane {lane}", p.id, p.units),
                })
                .collect();
            tracing::info!(
                "partitions: layout {} ({})",
                layout.epoch,
                described.join(", ")
            );
        }
        Ok(Response::new(v1::SetPartitionsResponse {
            changed,
            layout: Some(v1::PartitionsResponse::from(layout)),
        }))
    }

    async fn partitions(
        &self,
        _request: Request<v1::PartitionsRequest>,
    ) -> Result<Response<v1::PartitionsResponse>, Status> {
        let report = self.partitions.report(&self.lanes.advertised());
        Ok(Response::new(v1::PartitionsResponse::from(report)))
    }

    async fn corrupt_resident_weights(
        &self,
        request: Request<v1::CorruptResidentWeightsRequest>,
    ) -> Result<Response<v1::CorruptResidentWeightsResponse>, Status> {
        if self.test_hooks == TestHooks::Disabled {
            return Err(Status::permission_denied(
                "test hooks are off (start the host with --enable-test-hooks)",
            ));
        }
        let req = request.into_inner();
        let model = self.model(&req.model)?;
        let file_len = model.model.gguf().file_len();
        let (bytes, at) = usize::try_from(req.offset)
            .ok()
            .and_then(|o| model.served_byte(o))
            .ok_or_else(|| {
                Status::out_of_range(format!(
                    "offset {} is past the end ({file_len} bytes)",
                    req.offset
                ))
            })?;
        let offset = req.offset;
        flip_resident_bit(bytes, at)
            .map_err(|e| Status::internal(format!("flipping a bit: {e}")))?;
        tracing::warn!(
            "TEST HOOK: flipped a bit of `{}` at byte {offset}",
            model.name
        );
        Ok(Response::new(v1::CorruptResidentWeightsResponse {}))
    }

    async fn load_model(
        &self,
        request: Request<v1::LoadModelRequest>,
    ) -> Result<Response<v1::LoadModelResponse>, Status> {
        let req = request.into_inner();
        let spec: ModelSpec = format!("{}={}", req.name, req.path)
            .parse()
            .map_err(|e: BadModelSpec| Status::invalid_argument(format!("name/path: {e}")))?;
        let expected = Expected {
            size: req.size,
            chunk_root: digest_field(&req.chunk_root, "chunk_root")?,
            sha256: digest_field(&req.sha256, "sha256")?,
        };
        if expected.chunk_root.is_none() && expected.sha256.is_none() {
            return Err(Status::invalid_argument(
                "give the file's chunk_root or sha256: a model is only loaded against a digest",
            ));
        }
        let digest = (!req.digest.is_empty()).then_some(req.digest);
        let started = std::time::Instant::now();
        let loaded = self
            .registry
            .add(spec, expected, digest)
            .await
            .map_err(|e| match e {
                LoadRefused::NameTaken(_) => Status::already_exists(e.to_string()),
                LoadRefused::Busy => Status::resource_exhausted(e.to_string()),
                LoadRefused::NotFound(_) => Status::not_found(e.to_string()),
                LoadRefused::Mismatch(_) => Status::failed_precondition(e.to_string()),
                LoadRefused::Invalid(_) => Status::invalid_argument(e.to_string()),
            })?;
        let load_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            "loaded model `{}` ({}) in {load_ms} ms, every byte verified",
            loaded.name,
            loaded.digest
        );
        Ok(Response::new(v1::LoadModelResponse {
            model: Some(model_info(&loaded)),
            load_ms,
        }))
    }

    async fn unload_model(
        &self,
        request: Request<v1::UnloadModelRequest>,
    ) -> Result<Response<v1::UnloadModelResponse>, Status> {
        let name = request.into_inner().name;
        match self.registry.remove(&name) {
            Some(_) => {
                tracing::info!("unloaded model `{name}`");
                Ok(Response::new(v1::UnloadModelResponse {}))
            }
            None => Err(Status::not_found(format!("model `{name}` is not loaded"))),
        }
    }
}
