//! The scheduler thread: one per partition, and for now the host is one
//! shared partition, so one thread runs every model. It keeps a continuous
//! batch per model ([`Batcher`]) and loops: take new jobs, run one step of
//! each model with work, hand each stream what its channel has room for.
//!
//! One thread on purpose: the CPU backend's worker threads are shared, so
//! two forward passes at once would only contend for them; batching is what
//! shares the weights' memory traffic among sequences.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use tonic::Status;

use super::queue::Job;
use super::registry::LoadedModel;
use super::sink::{Counters, Outbox, StreamSink};
use crate::engine::{BatchLimits, Batcher, CpuBackend, NewSequence, SequenceSink};

/// How long the thread waits for new work while streams still have
/// backlogged events but no sequence runs (a slow client reading).
const FLUSH_INTERVAL: Duration = Duration::from_millis(2);

/// How long a step that could run nothing (every sequence waiting for KV
/// blocks another holds) waits before trying again, instead of spinning.
const STALLED_STEP_PAUSE: Duration = Duration::from_millis(1);

/// Limits of every model's batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SchedulerConfig {
    /// Sequences one model's batch holds at once.
    pub max_running: usize,
    /// Bytes of KV cache per model.
    pub kv_memory_bytes: u64,
}

struct ModelBatch {
    model: Arc<LoadedModel>,
    batcher: Batcher,
}

/// Runs until the queue's sender is gone and every stream has drained.
pub(crate) fn run(
    receiver: &Receiver<Job>,
    backend: &CpuBackend,
    config: SchedulerConfig,
    counters: &Arc<Counters>,
) {
    let mut batches: Vec<ModelBatch> = Vec::new();
    let mut outboxes: Vec<Rc<RefCell<Outbox>>> = Vec::new();
    let mut open = true;
    loop {
        let busy = batches.iter().any(|b| !b.batcher.is_idle());
        if !busy && open {
            // Nothing runs: block for the next job (briefly, if streams
            // still have events to deliver).
            let next = if outboxes.is_empty() {
                receiver.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                receiver.recv_timeout(FLUSH_INTERVAL)
            };
            match next {
                Ok(job) => accept(job, &mut batches, &mut outboxes, config, counters),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        while open {
            match receiver.try_recv() {
                Ok(job) => accept(job, &mut batches, &mut outboxes, config, counters),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let mut ran = 0;
        let mut failed = Vec::new();
        for (i, b) in batches.iter_mut().enumerate() {
            if b.batcher.is_idle() {
                continue;
            }
            let step = catch_unwind(AssertUnwindSafe(|| {
                b.batcher.step(&b.model.model, &b.model.tokenizer, backend)
            }));
            match step {
                Ok(Ok(tokens)) => ran += tokens,
                Ok(Err(e)) => eprintln!("model `{}`: a batched step failed: {e}", b.model.name),
                Err(_) => failed.push(i),
            }
        }
        // A step that panicked left its batch in an unknown state: drop it
        // (each stream is told "generation failed"); other models go on.
        for i in failed.into_iter().rev() {
            let gone = batches.remove(i);
            eprintln!(
                "model `{}`: a batched step panicked (a bug)",
                gone.model.name
            );
        }
        // An outbox stays while its sequence lives (the sink holds it) or
        // it has events its client has not taken yet.
        outboxes.retain(|o| {
            o.borrow_mut().flush();
            Rc::strong_count(o) > 1 || !o.borrow().is_settled()
        });
        // A model unloaded from the registry is released once its batch is empty.
        batches.retain(|b| !(b.batcher.is_idle() && Arc::strong_count(&b.model) == 1));
        let busy = batches.iter().any(|b| !b.batcher.is_idle());
        if !open && !busy && outboxes.is_empty() {
            return;
        }
        if busy && ran == 0 {
            std::thread::sleep(STALLED_STEP_PAUSE);
        }
        if !open && !busy && !outboxes.is_empty() {
            std::thread::sleep(FLUSH_INTERVAL);
        }
    }
}

/// Puts a job in its model's batch (creating the batch on first use).
fn accept(
    job: Job,
    batches: &mut Vec<ModelBatch>,
    outboxes: &mut Vec<Rc<RefCell<Outbox>>>,
    config: SchedulerConfig,
    counters: &Arc<Counters>,
) {
    let Job {
        model,
        request,
        tenant,
        priority,
        events,
    } = job;
    let outbox = Outbox::new(events);
    outboxes.push(outbox.clone());
    let mut sink = StreamSink::new(
        model.clone(),
        request.prompt_tokens.len(),
        outbox,
        counters.clone(),
    );
    if sink.check().is_break() {
        return; // client gone or model out of service while queued
    }
    let at = match batches.iter().position(|b| Arc::ptr_eq(&b.model, &model)) {
        Some(at) => at,
        None => match new_batch(&model, config) {
            Ok(batcher) => {
                batches.push(ModelBatch {
                    model: model.clone(),
                    batcher,
                });
                batches.len() - 1
            }
            Err(status) => return sink.refuse(status),
        },
    };
    let b = &mut batches[at];
    b.batcher.add(
        &b.model.tokenizer,
        NewSequence {
            tenant,
            priority,
            request,
            sink: Box::new(sink),
        },
    );
}

/// A batch for `model` with `config.kv_memory_bytes` of KV blocks.
fn new_batch(model: &LoadedModel, config: SchedulerConfig) -> Result<Batcher, Status> {
    let geometry = model
        .model
        .kv_geometry()
        .map_err(|e| Status::internal(format!("KV geometry of `{}`: {e}", model.name)))?;
    let blocks = u32::try_from(geometry.blocks_in(config.kv_memory_bytes)).unwrap_or(u32::MAX);
    let limits = BatchLimits {
        max_running: config.max_running,
        kv_blocks: blocks,
    };
    Batcher::new(&model.model, limits)
        .map_err(|e| Status::internal(format!("KV pool of `{}`: {e}", model.name)))
}
