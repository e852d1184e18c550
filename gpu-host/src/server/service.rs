//! The `GpuHost` gRPC service: resolves the model, validates the request,
//! queues it and hands back the stream its worker fills.

use std::sync::Arc;

use bulkhead_protocol::v1::{self, gpu_host_server::GpuHost};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::queue::{Job, WorkQueue};
use super::registry::ModelRegistry;
use super::request::to_engine;

/// Events buffered per stream before a slow client makes its worker wait.
const EVENT_BUFFER: usize = 64;

#[derive(Debug)]
pub(crate) struct GpuHostService {
    registry: Arc<ModelRegistry>,
    queue: WorkQueue,
}

impl GpuHostService {
    pub(crate) fn new(registry: Arc<ModelRegistry>, queue: WorkQueue) -> Self {
        GpuHostService { registry, queue }
    }
}

#[tonic::async_trait]
impl GpuHost for GpuHostService {
    type GenerateStream = ReceiverStream<Result<v1::GenerateEvent, Status>>;

    async fn generate(
        &self,
        request: Request<v1::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let req = request.into_inner();
        let model = self.registry.get(&req.model).ok_or_else(|| {
            let served: Vec<&str> = self.registry.names().collect();
            Status::not_found(format!(
                "model `{}` is not served here (serving: {})",
                req.model,
                served.join(", ")
            ))
        })?;
        let engine_request = to_engine(model, &req)?;
        let (events, stream) = mpsc::channel(EVENT_BUFFER);
        self.queue.submit(Job {
            model: model.clone(),
            request: engine_request,
            events,
        })?;
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn list_models(
        &self,
        _request: Request<v1::ListModelsRequest>,
    ) -> Result<Response<v1::ListModelsResponse>, Status> {
        let models = self
            .registry
            .iter()
            .map(|m| {
                let config = m.model.config();
                v1::ModelInfo {
                    name: m.name.clone(),
                    architecture: config.arch.name().to_string(),
                    context_length: u32::try_from(config.context_length).unwrap_or(u32::MAX),
                    vocab_size: u32::try_from(m.tokenizer.vocab_size()).unwrap_or(u32::MAX),
                }
            })
            .collect();
        Ok(Response::new(v1::ListModelsResponse { models }))
    }

    async fn health(
        &self,
        _request: Request<v1::HealthRequest>,
    ) -> Result<Response<v1::HealthResponse>, Status> {
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(v1::HealthResponse {
            serving: true,
            models: small(self.registry.len()),
            queued: small(self.queue.queued()),
            queue_capacity: small(self.queue.capacity()),
            workers: small(self.queue.workers()),
        }))
    }
}
