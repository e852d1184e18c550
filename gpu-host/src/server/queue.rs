//! The bounded queue in front of the scheduler: the service submits
//! validated jobs, refused at once (RESOURCE_EXHAUSTED) when `capacity`
//! requests already wait to join a batch. The engine is synchronous and
//! CPU-bound, so it runs on its own thread ([`super::scheduler`]), off the
//! async runtime, and streams events back through each request's channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

use bulkhead_protocol::v1;
use tokio::sync::mpsc;
use tonic::Status;

use super::registry::LoadedModel;
use super::scheduler::{self, SchedulerConfig};
use super::sink::Counters;
use crate::engine::{CpuBackend, GenerateRequest};

/// Where a generation's events go; dropped by the client side when it leaves.
pub(crate) type EventSender = mpsc::Sender<Result<v1::GenerateEvent, Status>>;

/// One queued generation, already validated.
#[derive(Debug)]
pub(crate) struct Job {
    pub model: Arc<LoadedModel>,
    pub request: GenerateRequest,
    pub tenant: String,
    pub priority: i32,
    pub events: EventSender,
}

/// The sending side, held by the service.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    sender: Sender<Job>,
    counters: Arc<Counters>,
    capacity: usize,
    max_running: usize,
}

/// The scheduler thread, joined at shutdown once the queue's sender is gone
/// and every stream in flight has drained.
#[derive(Debug)]
pub(crate) struct Workers(JoinHandle<()>);

impl Workers {
    pub(crate) fn join(self) {
        let _ = self.0.join();
    }
}

impl WorkQueue {
    /// Starts the scheduler thread on `backend`, behind a queue of `capacity`.
    pub(crate) fn start(
        capacity: usize,
        config: SchedulerConfig,
        backend: CpuBackend,
    ) -> std::io::Result<(Self, Workers)> {
        let (sender, receiver) = channel();
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let handle = std::thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || scheduler::run(&receiver, &backend, config, &shared))?;
        let queue = WorkQueue {
            sender,
            counters,
            capacity,
            max_running: config.max_running,
        };
        Ok((queue, Workers(handle)))
    }

    /// Queues a job, or refuses it at once when the queue is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Status> {
        let before = self.counters.queued.fetch_add(1, Ordering::SeqCst);
        if before >= self.capacity {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::resource_exhausted(format!(
                "the request queue is full ({} waiting); retry later",
                self.capacity
            )));
        }
        if self.sender.send(job).is_err() {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::unavailable("the host is shutting down"));
        }
        Ok(())
    }

    pub(crate) fn queued(&self) -> usize {
        self.counters.queued.load(Ordering::SeqCst)
    }

    pub(crate) fn running(&self) -> usize {
        self.counters.running.load(Ordering::SeqCst)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn max_running(&self) -> usize {
        self.max_running
    }

    /// Scheduler threads: one, for the one shared partition.
    pub(crate) fn workers(&self) -> usize {
        1
    }
}
