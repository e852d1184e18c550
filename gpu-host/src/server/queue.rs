//! One partition's scheduler and the queue in front of it: the router
//! ([`super::partitions`]) submits validated jobs; the host as a whole
//! refuses one at once (RESOURCE_EXHAUSTED) when `capacity` requests already
//! wait to join a batch. The engine is synchronous and CPU-bound, so each
//! partition runs on its own thread ([`super::scheduler`]), off the async
//! runtime, and streams events back through each request's channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel, sync_channel};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use bulkhead_partition::CuSet;
use bulkhead_protocol::v1;
use tokio::sync::mpsc;
use tonic::Status;

use super::affinity::pin_current_thread;
use super::registry::{LoadedModel, ModelRegistry};
use super::scheduler::{self, PartitionLoad, PartitionSpec, SchedulerConfig, Shared};
use super::sink::{Counted, Counters};
use crate::engine::{Backend, ComputeBackend, CpuBackend, GenerateRequest};

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

/// What the rest of the host sees of a partition's scheduler, kept while
/// its thread runs (also after its layout was replaced, while it drains).
#[derive(Debug)]
pub(crate) struct SchedulerView {
    pub spec: Arc<PartitionSpec>,
    pub counters: Arc<Counters>,
    pub load: Arc<ArcSwap<PartitionLoad>>,
    /// Set by the thread as it exits (every stream drained).
    pub exited: Arc<AtomicBool>,
}

/// The sending side of one partition's queue: dropping it (a new layout,
/// shutdown) lets the scheduler finish what it has and exit.
#[derive(Debug)]
pub(crate) struct Scheduler {
    sender: Sender<Job>,
    host: Arc<Counters>,
    pub view: Arc<SchedulerView>,
}

/// Sets its flag when dropped, however the thread ends.
struct ExitFlag(Arc<AtomicBool>);

impl Drop for ExitFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Scheduler {
    /// Starts the scheduler thread of `spec`: it pins itself to the
    /// partition's CPUs, then starts its backend — on the CPU one worker
    /// per compute unit (its workers inherit the pinning); on a device
    /// streams on the partition's CUs and a budget of its memory — then
    /// runs. Returns once the backend is up, or why it could not start. The
    /// backend lives as long as the thread: a replaced partition's streams
    /// and budget go when it has drained.
    pub(crate) fn start(
        spec: Arc<PartitionSpec>,
        max_running: usize,
        compute: ComputeBackend,
        registry: Arc<ModelRegistry>,
        host: Arc<Counters>,
    ) -> Result<(Scheduler, JoinHandle<()>), String> {
        let (sender, receiver) = channel();
        let counters = Arc::new(Counters::default());
        let view = Arc::new(SchedulerView {
            spec: Arc::clone(&spec),
            counters: Arc::clone(&counters),
            load: Arc::new(ArcSwap::default()),
            exited: Arc::new(AtomicBool::new(false)),
        });
        let shared = Shared {
            registry,
            counters: Counted {
                host: Arc::clone(&host),
                partition: counters,
            },
            load: Arc::clone(&view.load),
        };
        let exit = ExitFlag(Arc::clone(&view.exited));
        let config = SchedulerConfig {
            max_running,
            partition: Arc::clone(&spec),
        };
        let (ready_tx, ready) = sync_channel(1);
        // Linux keeps 15 bytes of a thread's name: `part:TENANT` for a
        // dedicated partition, `part-shared` for the pool.
        let name: String = match spec.id.strip_prefix("dedicated:") {
            Some(tenant) => format!("part:{tenant}"),
            None => format!("part-{}", spec.id),
        }
        .chars()
        .take(15)
        .collect();
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _exit = exit;
                let started = pin_current_thread(&spec.cpus)
                    .map_err(|e| format!("pinning to CPUs {:?}: {e}", spec.cpus))
                    .and_then(|()| match compute {
                        ComputeBackend::Cpu => CpuBackend::new(spec.units.len().max(1))
                            .map(|cpu| Arc::new(cpu) as Arc<dyn Backend>)
                            .map_err(|e| format!("starting the CPU backend: {e}")),
                        ComputeBackend::Device(device) => {
                            let cus = CuSet::from_ids(
                                device.device().compute_units,
                                spec.units.iter().copied(),
                            );
                            device
                                .partition(&spec.id, &cus, spec.memory_bytes)
                                .map(|p| p.backend as Arc<dyn Backend>)
                        }
                    });
                let backend = match started {
                    Ok(backend) => {
                        let _ = ready_tx.send(Ok(()));
                        backend
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                scheduler::run(&receiver, &*backend, &config, &shared);
            })
            .map_err(|e| format!("starting a scheduler thread: {e}"))?;
        match ready.recv() {
            Ok(Ok(())) => Ok((Scheduler { sender, host, view }, handle)),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => {
                let _ = handle.join();
                Err("the scheduler thread died while starting".to_string())
            }
        }
    }

    /// Queues a job, or refuses it at once when `capacity` requests already
    /// wait host-wide.
    pub(crate) fn submit(&self, job: Job, capacity: usize) -> Result<(), Status> {
        let counted = Counted {
            host: Arc::clone(&self.host),
            partition: Arc::clone(&self.view.counters),
        };
        let before = self.host.queued.fetch_add(1, Ordering::SeqCst);
        if before >= capacity {
            self.host.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::resource_exhausted(format!(
                "the request queue is full ({capacity} waiting); retry later"
            )));
        }
        self.view.counters.queued.fetch_add(1, Ordering::SeqCst);
        if self.sender.send(job).is_err() {
            counted.unqueue();
            return Err(Status::unavailable("the host is shutting down"));
        }
        Ok(())
    }
}
