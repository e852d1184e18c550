//! The host's partitions: the tenant set the gateway sends
//! (`SetPartitions`) planned with `bulkhead_partition::plan` for this
//! host's device, one scheduler per partition, and the routing of each job
//! to its tenant's partition (tenants the plan does not list go to the
//! shared pool).
//!
//! The CPU device has `--threads` compute units (cores) and `--kv-memory`
//! bytes of KV cache; weights are outside that budget (loaded once, shared
//! read-only by every partition). A HIP device has its CUs (8 XCDs on
//! MI300-class parts) and its memory, of which `--kv-memory` is the
//! partitions' and the rest the model reservation; each partition's
//! scheduler gets streams on its CUs and a budget of its memory
//! ([`PartitionedDevice::partition`]), the weights stay one copy per
//! device. A layout is immutable: a new one starts new schedulers (on a
//! device: new streams and budgets) and takes new jobs at once, while the
//! old schedulers finish the streams they hold and exit, releasing theirs
//! (**a re-partition drops no request in flight**). The same set again
//! changes nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use bulkhead_partition::{
    Device, Layout, PartitionError, PartitionKind, PartitionsReport, TenantRequest, plan,
};

use super::counters::Counters;
use super::error::SchedError;
use super::job::Job;
use super::queue::{SchedulerHandle, SchedulerSettings, SchedulerView};
use super::scheduler::{PartitionLoad, PartitionSpec};
use crate::affinity::CpuMap;
use crate::backend::ComputeBackend;
use crate::models::ModelRegistry;

mod report;

/// Most tenants one `SetPartitions` may list.
pub const MAX_TENANTS: usize = 10_000;

/// A layout and the schedulers that run it. Its number is 1 for the
/// layout the host starts with and one more for every change.
#[derive(Debug)]
struct Epoch {
    number: u64,
    layout: Layout,
    schedulers: Vec<SchedulerHandle>,
    /// Tenant → index in `schedulers`.
    by_tenant: BTreeMap<String, usize>,
    shared: Option<usize>,
}

/// Host-wide settings every scheduler gets.
#[derive(Debug)]
pub(crate) struct PartitionSettings {
    pub device: Device,
    /// Memory of `device` kept for weights, outside every partition (0 on
    /// the CPU, whose device memory is the KV memory alone).
    pub model_reservation_bytes: u64,
    pub cpus: CpuMap,
    /// Sequences one model's batch holds at once.
    pub max_running: usize,
    /// Requests that may wait in each partition's queue (shared among its
    /// tenants as [`super::shares`] says).
    pub capacity: usize,
    /// What each partition's scheduler computes with.
    pub compute: ComputeBackend,
}

/// The router and the control of the layout.
#[derive(Debug)]
pub(crate) struct Partitions {
    settings: PartitionSettings,
    registry: Arc<ModelRegistry>,
    host: Arc<Counters>,
    /// The epoch in force.
    current: ArcSwap<Epoch>,
    /// Serializes layout changes; the views of replaced schedulers still draining.
    control: Mutex<Vec<Arc<SchedulerView>>>,
    /// Every scheduler thread started, joined at shutdown.
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Counts of schedulers that exited, so `Health`'s totals never go back.
    retired_preemptions: AtomicU64,
    retired_device_errors: AtomicU64,
    retired_kv_refusals: AtomicU64,
}

/// The scheduler threads, joined at shutdown once every queue's sender is
/// gone and every stream in flight has drained.
#[derive(Debug)]
pub(crate) struct Workers(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl Workers {
    pub(crate) fn join(self) {
        loop {
            let next = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match next {
                Some(handle) => {
                    let _ = handle.join();
                }
                None => return,
            }
        }
    }
}

impl Partitions {
    /// Starts the schedulers of the layout with no tenants listed: one
    /// shared pool on every core with all the memory.
    pub(crate) fn start(
        settings: PartitionSettings,
        registry: Arc<ModelRegistry>,
    ) -> Result<(Partitions, Workers), String> {
        let layout = plan(&settings.device, settings.model_reservation_bytes, &[])
            .map_err(|errors| join(&errors))?;
        let threads = Arc::new(Mutex::new(Vec::new()));
        let host = Arc::new(Counters::default());
        let first = start_epoch(1, layout, &settings, &registry, &host, &threads)?;
        let partitions = Partitions {
            settings,
            registry,
            host,
            current: ArcSwap::from_pointee(first),
            control: Mutex::new(Vec::new()),
            threads: Arc::clone(&threads),
            retired_preemptions: AtomicU64::new(0),
            retired_device_errors: AtomicU64::new(0),
            retired_kv_refusals: AtomicU64::new(0),
        };
        Ok((partitions, Workers(threads)))
    }

    /// Routes a job to its tenant's partition and queues it there.
    pub(crate) fn submit(&self, job: Job) -> Result<(), SchedError> {
        let epoch = self.current.load();
        let Some(at) = epoch.by_tenant.get(&job.tenant).copied().or(epoch.shared) else {
            return Err(SchedError::NoPartition { tenant: job.tenant });
        };
        epoch.schedulers[at].submit(job)
    }

    /// Plans `tenants`; a new layout replaces the current one (true), the
    /// same one changes nothing (false). Refused: the planner's errors,
    /// and the current layout stays.
    pub(crate) fn set(&self, requests: &[TenantRequest]) -> Result<bool, SchedError> {
        let mut draining = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let settings = &self.settings;
        let layout = plan(&settings.device, settings.model_reservation_bytes, requests).map_err(
            |errors| {
                let device = &settings.device;
                SchedError::Unplannable {
                    host: format!(
                        "{}, {} {}, {} of KV memory",
                        device.name,
                        device.compute_units,
                        device.unit(),
                        bulkhead_partition::format_bytes(
                            device.memory_bytes - settings.model_reservation_bytes
                        ),
                    ),
                    errors: join(&errors),
                }
            },
        )?;
        let current = self.current.load_full();
        if current.layout == layout {
            return Ok(false);
        }
        let next = start_epoch(
            current.number + 1,
            layout,
            &self.settings,
            &self.registry,
            &self.host,
            &self.threads,
        )
        .map_err(SchedError::Internal)?;
        let old = self.current.swap(Arc::new(next));
        draining.extend(old.schedulers.iter().map(|s| Arc::clone(&s.view)));
        // `old` drops here (or when the last submit that loaded it ends),
        // and with it the old queues' senders: those schedulers finish
        // their streams and exit.
        drop(old);
        self.reap(&mut draining);
        Ok(true)
    }

    /// Forgets schedulers that exited, keeping their counts.
    fn reap(&self, draining: &mut Vec<Arc<SchedulerView>>) {
        draining.retain(|view| {
            if !view.exited.load(Ordering::SeqCst) {
                return true;
            }
            let load = view.load.load();
            self.retired_preemptions
                .fetch_add(load.preemptions, Ordering::SeqCst);
            self.retired_kv_refusals
                .fetch_add(load.kv_refusals, Ordering::SeqCst);
            self.retired_device_errors
                .fetch_add(load.device_errors, Ordering::SeqCst);
            false
        });
    }

    /// Every live scheduler: the current layout's, then the draining ones.
    fn views(&self) -> (Arc<Epoch>, Vec<Arc<SchedulerView>>) {
        let mut draining = self.control.lock().unwrap_or_else(|e| e.into_inner());
        self.reap(&mut draining);
        (self.current.load_full(), draining.clone())
    }

    /// The partitions and their load; `lanes` maps a tenant to the target
    /// of its I/O lane, advertised on its dedicated partition.
    pub(crate) fn report(&self, lanes: &BTreeMap<String, String>) -> PartitionsReport {
        let (epoch, draining) = self.views();
        let device = &self.settings.device;
        let on_cpus = matches!(self.settings.compute, ComputeBackend::Cpu);
        let current = epoch.schedulers.iter().map(|s| (&*s.view, false));
        let old = draining.iter().map(|v| (&**v, true));
        PartitionsReport {
            device: device.name.clone(),
            unit: device.unit().to_string(),
            compute_units: device.compute_units,
            memory_bytes: device.memory_bytes,
            epoch: epoch.number,
            isolation: match &self.settings.compute {
                ComputeBackend::Cpu => "pinned cores".into(),
                ComputeBackend::Device(device) => device.isolation(),
            },
            partitions: current
                .chain(old)
                .map(|(view, draining)| {
                    let mut info = report::partition_report(view, draining);
                    if on_cpus {
                        info.host_cpus = view.spec.cpus.clone();
                    }
                    if let (false, PartitionKind::Dedicated, Some(tenant)) =
                        (draining, view.spec.kind, view.spec.tenants.first())
                    {
                        info.lane = lanes.get(&tenant.tenant).cloned();
                    }
                    info
                })
                .collect(),
        }
    }

    /// Each dedicated tenant of the layout in force and the CPUs of its
    /// partition: where its I/O lane runs. None on a GPU, whose partitions'
    /// units are not CPUs.
    pub(crate) fn lane_cpus(&self) -> BTreeMap<String, Vec<usize>> {
        if !matches!(self.settings.compute, ComputeBackend::Cpu) {
            return BTreeMap::new();
        }
        let epoch = self.current.load();
        epoch
            .schedulers
            .iter()
            .map(|s| &s.view.spec)
            .filter(|spec| spec.kind == PartitionKind::Dedicated)
            .filter_map(|spec| {
                let tenant = spec.tenants.first()?;
                Some((tenant.tenant.clone(), spec.cpus.clone()))
            })
            .collect()
    }

    /// Every CPU the host may run on: where a lane goes once its tenant is
    /// no longer dedicated.
    pub(crate) fn all_cpus(&self) -> Vec<usize> {
        self.settings.cpus.all()
    }

    /// Host-wide numbers for `Health`.
    pub(crate) fn health(&self) -> HostLoad {
        let (epoch, draining) = self.views();
        let views: Vec<&SchedulerView> = epoch
            .schedulers
            .iter()
            .map(|s| &*s.view)
            .chain(draining.iter().map(|v| &**v))
            .collect();
        let sum =
            |f: fn(&PartitionLoad) -> u64| -> u64 { views.iter().map(|v| f(&v.load.load())).sum() };
        HostLoad {
            queued: self.host.queued.load(Ordering::SeqCst),
            running: self.host.running.load(Ordering::SeqCst),
            schedulers: views.len(),
            preemptions: sum(|l| l.preemptions) + self.retired_preemptions.load(Ordering::SeqCst),
            kv_refusals: sum(|l| l.kv_refusals) + self.retired_kv_refusals.load(Ordering::SeqCst),
            device_errors: sum(|l| l.device_errors)
                + self.retired_device_errors.load(Ordering::SeqCst),
            kv_bytes: epoch
                .schedulers
                .iter()
                .map(|s| s.view.spec.memory_bytes)
                .sum(),
            kv_bytes_used: sum(|l| l.kv_bytes_used),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.settings.capacity
    }

    pub(crate) fn max_running(&self) -> usize {
        self.settings.max_running
    }
}

/// What `Health` reports of the partitions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostLoad {
    pub queued: usize,
    pub running: usize,
    pub schedulers: usize,
    pub preemptions: u64,
    pub kv_refusals: u64,
    pub device_errors: u64,
    /// KV memory of the current layout's partitions, and what all (the
    /// draining ones too) hold now.
    pub kv_bytes: u64,
    pub kv_bytes_used: u64,
}

/// Starts one scheduler per partition of `layout`; none if one fails.
fn start_epoch(
    number: u64,
    layout: Layout,
    settings: &PartitionSettings,
    registry: &Arc<ModelRegistry>,
    host: &Arc<Counters>,
    threads: &Mutex<Vec<JoinHandle<()>>>,
) -> Result<Epoch, String> {
    let mut schedulers = Vec::new();
    let mut by_tenant = BTreeMap::new();
    let mut shared = None;
    let mut handles = Vec::new();
    for (i, partition) in layout.partitions.iter().enumerate() {
        let id = match partition.kind {
            PartitionKind::Shared => PartitionKind::Shared.as_str().to_string(),
            PartitionKind::Dedicated => format!(
                "dedicated:{}",
                partition.tenants.first().map_or("", |t| t.tenant.as_str())
            ),
        };
        let units: Vec<u32> = partition.cus.iter().collect();
        let cpus = match settings.compute {
            ComputeBackend::Cpu => settings.cpus.cpus_of(units.iter().copied()),
            // Its units are the GPU's CUs; the thread that drives them may
            // run on any CPU.
            ComputeBackend::Device(_) => settings.cpus.all(),
        };
        let spec = PartitionSpec {
            id,
            kind: partition.kind,
            cpus,
            units,
            memory_bytes: partition.memory_bytes,
            tenants: partition.tenants.clone(),
        };
        // Dropping what started so far stops it (its queue closes empty).
        let (scheduler, handle) = SchedulerHandle::start(
            Arc::new(spec),
            SchedulerSettings {
                max_running: settings.max_running,
                queue_capacity: settings.capacity,
                compute: settings.compute.clone(),
            },
            Arc::clone(registry),
            Arc::clone(host),
        )?;
        handles.push(handle);
        for slot in &partition.tenants {
            by_tenant.insert(slot.tenant.clone(), i);
        }
        if partition.kind == PartitionKind::Shared {
            shared = Some(i);
        }
        schedulers.push(scheduler);
    }
    threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(handles);
    Ok(Epoch {
        number,
        layout,
        schedulers,
        by_tenant,
        shared,
    })
}

fn join(errors: &[PartitionError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
