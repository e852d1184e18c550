//! A bounded queue of generations drained by worker threads: the engine is
//! synchronous and CPU-bound, so it runs off the async runtime, and each
//! worker streams events back through the request's tokio channel.

use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use bulkhead_protocol::v1::{self, generate_event::Event};
use tokio::sync::mpsc;
use tonic::Status;

use super::registry::LoadedModel;
use super::service::out_of_service;
use crate::engine::{
    CpuBackend, FinishReason, GenerateError, GenerateRequest, Piece, generate_streaming,
};

/// Where a generation's events go; dropped by the client side when it leaves.
pub(crate) type EventSender = mpsc::Sender<Result<v1::GenerateEvent, Status>>;

/// One queued generation, already validated.
#[derive(Debug)]
pub(crate) struct Job {
    pub model: Arc<LoadedModel>,
    pub request: GenerateRequest,
    pub events: EventSender,
}

/// The sending side, held by the service.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    sender: SyncSender<Job>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    workers: usize,
}

/// The worker threads, joined at shutdown once the queue's sender is gone.
#[derive(Debug)]
pub(crate) struct Workers(Vec<JoinHandle<()>>);

impl Workers {
    pub(crate) fn join(self) {
        for handle in self.0 {
            let _ = handle.join();
        }
    }
}

impl WorkQueue {
    /// Starts `workers` threads sharing `backend`, behind a queue of `capacity`.
    pub(crate) fn start(
        capacity: usize,
        workers: usize,
        backend: CpuBackend,
    ) -> std::io::Result<(Self, Workers)> {
        let (sender, receiver) = sync_channel(capacity);
        let receiver = Arc::new(Mutex::new(receiver));
        let backend = Arc::new(backend);
        let queued = Arc::new(AtomicUsize::new(0));
        let handles = (0..workers)
            .map(|i| {
                let (receiver, backend, queued) =
                    (receiver.clone(), backend.clone(), queued.clone());
                std::thread::Builder::new()
                    .name(format!("generate-{i}"))
                    .spawn(move || work(&receiver, &backend, &queued))
            })
            .collect::<std::io::Result<_>>()?;
        let queue = WorkQueue {
            sender,
            queued,
            capacity,
            workers,
        };
        Ok((queue, Workers(handles)))
    }

    /// Queues a job, or refuses it at once when the queue is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Status> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let refused = match self.sender.try_send(job) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => Status::resource_exhausted(format!(
                "the request queue is full ({} waiting); retry later",
                self.capacity
            )),
            Err(TrySendError::Disconnected(_)) => Status::unavailable("the host is shutting down"),
        };
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Err(refused)
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn workers(&self) -> usize {
        self.workers
    }
}

fn work(receiver: &Mutex<Receiver<Job>>, backend: &CpuBackend, queued: &AtomicUsize) {
    loop {
        let next = receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .recv();
        let Ok(job) = next else {
            return; // the service is gone: shutting down
        };
        queued.fetch_sub(1, Ordering::SeqCst);
        let events = job.events.clone();
        if catch_unwind(AssertUnwindSafe(|| run(job, backend))).is_err() {
            let _ = events.blocking_send(Err(Status::internal("generation failed (a bug)")));
        }
    }
}

/// Runs one job, streaming Started, Deltas and Finished (or an error status).
fn run(job: Job, backend: &CpuBackend) {
    let Job {
        model,
        request,
        events,
    } = job;
    if events.is_closed() {
        return; // the client left while queued
    }
    let send = |event| events.blocking_send(Ok(v1::GenerateEvent { event: Some(event) }));
    let started = Event::Started(v1::Started {
        prompt_tokens: count(request.prompt_tokens.len()),
        model: model.name.clone(),
        model_digest: model.digest.clone(),
        weights_verified_at_unix_ms: model.weights.verified_at_ms(),
    });
    if send(started).is_err() {
        return;
    }
    let mut on_piece = |piece: Piece<'_>| {
        // Out of service at once: a generation in flight stops at its next
        // piece rather than finishing on weights that no longer verify.
        if let Some(reason) = model.weights.unavailable_reason() {
            let _ = events.blocking_send(Err(out_of_service(&model.name, reason)));
            return ControlFlow::Break(());
        }
        let delta = Event::Delta(v1::Delta {
            text: piece.text.to_string(),
            token_ids: piece.tokens.to_vec(),
        });
        match send(delta) {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()), // client gone: stop generating
        }
    };
    let result = generate_streaming(
        &model.model,
        &model.tokenizer,
        backend,
        &request,
        &mut on_piece,
    );
    match result {
        Ok(generation) => {
            let reason = match generation.finish_reason {
                FinishReason::Stop => v1::FinishReason::Stop,
                FinishReason::Length => v1::FinishReason::Length,
            };
            let _ = send(Event::Finished(v1::Finished {
                finish_reason: reason.into(),
                usage: Some(v1::Usage {
                    prompt_tokens: count(generation.prompt_tokens.len()),
                    completion_tokens: count(generation.tokens.len()),
                }),
            }));
        }
        Err(GenerateError::Cancelled) => {}
        Err(e @ GenerateError::Forward(_)) => {
            let _ = events.blocking_send(Err(Status::internal(e.to_string())));
        }
        // Validated before queueing; kept as the client's fault should it happen.
        Err(e) => {
            let _ = events.blocking_send(Err(Status::invalid_argument(e.to_string())));
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
