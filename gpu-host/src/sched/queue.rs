//! One partition's scheduler and the queue in front of it: the router
//! ([`super::partitions`]) submits validated jobs; the partition refuses one
//! at once ([`SchedError::QueueFull`], RESOURCE_EXHAUSTED on the wire) when
//! its tenant has used its part of the partition's queue and the rest is
//! full ([`super::shares`]): a queue is never shared across partitions, so
//! a dedicated tenant's is its own. The engine is synchronous and
//! CPU-bound, so each partition runs on its own thread
//! ([`super::scheduler`]), off the async runtime, and streams events back
//! through each request's channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel, sync_channel};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use bulkhead_partition::CuSet;

use super::counters::{Counted, Counters};
use super::error::SchedError;
use super::job::{Job, Queued};
use super::scheduler::{self, PartitionLoad, PartitionSpec, SchedulerConfig, Shared};
use super::shares::QueueShares;
use crate::affinity::pin_current_thread;
use crate::backend::{Backend, ComputeBackend, CpuBackend};
use crate::models::ModelRegistry;

/// What the rest of the host sees of a partition's scheduler, kept while
/// its thread runs (also after its layout was replaced, while it drains).
#[derive(Debug)]
pub(crate) struct SchedulerView {
    pub spec: Arc<PartitionSpec>,
    pub counters: Arc<Counters>,
    pub load: Arc<ArcSwap<PartitionLoad>>,
    /// Its queue, shared among its tenants.
    pub queue: QueueShares,
    /// Set by the thread as it exits (every stream drained).
    pub exited: Arc<AtomicBool>,
}

/// The sending side of one partition's queue: dropping it (a new layout,
/// shutdown) lets the scheduler finish what it has and exit.
#[derive(Debug)]
pub(crate) struct SchedulerHandle {
    sender: Sender<Queued>,
    host: Arc<Counters>,
    pub view: Arc<SchedulerView>,
}

/// What every partition's scheduler starts with.
#[derive(Clone, Debug)]
pub(crate) struct SchedulerSettings {
    /// Decode rows of one model's step.
    pub max_running: usize,
    /// Requests that may wait in the partition's queue ([`QueueShares`]).
    pub queue_capacity: usize,
    pub compute: ComputeBackend,
}

/// Sets its flag when dropped, however the thread ends.
struct ExitFlag(Arc<AtomicBool>);

impl Drop for ExitFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl SchedulerHandle {
    /// Starts the scheduler thread of `spec`: it pins itself to the
    /// partition's CPUs, then starts its backend — on the CPU one worker
    /// per compute unit (its workers inherit the pinning); on a device
    /// streams on the partition's CUs and a budget of its memory — then
    /// runs. Returns once the backend is up, or why it could not start. The
    /// backend lives as long as the thread: a replaced partition's streams
    /// and budget go when it has drained.
    pub(crate) fn start(
        spec: Arc<PartitionSpec>,
        settings: SchedulerSettings,
        registry: Arc<ModelRegistry>,
        host: Arc<Counters>,
    ) -> Result<(SchedulerHandle, JoinHandle<()>), String> {
        let SchedulerSettings {
            max_running,
            queue_capacity,
            compute,
        } = settings;
        let (sender, receiver) = channel();
        let view = Arc::new(SchedulerView {
            spec: Arc::clone(&spec),
            counters: Arc::new(Counters::default()),
            load: Arc::new(ArcSwap::default()),
            queue: QueueShares::new(&spec, queue_capacity),
            exited: Arc::new(AtomicBool::new(false)),
        });
        let shared = Shared {
            registry,
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
            Ok(Ok(())) => Ok((SchedulerHandle { sender, host, view }, handle)),
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

    /// Queues a job, or refuses it at once when its tenant has used its
    /// part of this partition's queue and the rest is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), SchedError> {
        let tenant_queued = self
            .view
            .queue
            .enter(&job.tenant, &self.view.counters.queued)?;
        self.host.queued.fetch_add(1, Ordering::SeqCst);
        let counted = Counted {
            host: Arc::clone(&self.host),
            partition: Arc::clone(&self.view.counters),
            tenant_queued,
        };
        if let Err(refused) = self.sender.send(Queued { job, counted }) {
            refused.0.counted.unqueue();
            return Err(SchedError::ShuttingDown);
        }
        Ok(())
    }
}
