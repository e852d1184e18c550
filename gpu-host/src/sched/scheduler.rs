//! The scheduler thread: one per partition, running every model its
//! tenants use on the partition's own worker pool (pinned to its cores, see
//! [`super::queue::SchedulerHandle::start`]). It keeps a continuous batch per
//! model ([`Batcher`], its KV pool sized from the partition's memory and
//! shared among the partition's tenants as their plan says; every model's
//! blocks charged to one [`PartitionKv`], so the models together hold no
//! more than the partition's memory) and loops: take
//! new jobs, run one step of each model with work, hand each stream what
//! its channel has room for, publish the partition's load.
//!
//! One thread per partition on purpose: the partition's worker threads are
//! shared by its models, so two forward passes at once would only contend
//! for them; batching is what shares the weights' memory traffic among
//! sequences. Weights are shared read-only by every partition (the jobs
//! carry the registry's `Arc`); KV caches are per partition.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use arc_swap::ArcSwap;
use bulkhead_partition::{PartitionKind, TenantSlot};

use super::batch::Batcher;
use super::error::SchedError;
use super::job::{Job, Queued};
use super::plan::{BatchLimits, PartitionKv, TenantCounts, TenantShare};
use super::sequence::{NewSequence, SequenceSink};
use super::sink::{Outbox, StreamSink};
use crate::backend::Backend;
use crate::engine::ForwardError;
use crate::models::{LoadedModel, ModelRegistry};

/// How long the thread waits for new work while streams still have
/// backlogged events but no sequence runs (a slow client reading).
const FLUSH_INTERVAL: Duration = Duration::from_millis(2);

/// Sequences a batch keeps in KV per decode row of a step. Above one, so a
/// step chooses its rows fairly across tenants (`RowPicker`) from more
/// sequences than it runs; with one, the tenant that filled the batch
/// first would keep every row until its sequences end. Two keeps the extra
/// KV and the stalled sequences' wait modest.
const RESIDENT_PER_ROW: usize = 2;

/// How long a step that could run nothing (every sequence waiting for KV
/// blocks another holds) waits before trying again, instead of spinning.
const STALLED_STEP_PAUSE: Duration = Duration::from_millis(1);

/// One partition of the layout, as its scheduler runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartitionSpec {
    /// `dedicated:TENANT` or `shared`.
    pub id: String,
    pub kind: PartitionKind,
    /// Its compute units (device core ids, 0..N).
    pub units: Vec<u32>,
    /// The CPUs those units are (what its threads are pinned to).
    pub cpus: Vec<usize>,
    /// KV-cache bytes of each model's pool in this partition.
    pub memory_bytes: u64,
    /// Its tenants as planned.
    pub tenants: Vec<TenantSlot>,
}

/// What a scheduler runs with.
#[derive(Clone, Debug)]
pub(crate) struct SchedulerConfig {
    /// Decode rows of one model's step (`--max-batch`); its batch keeps
    /// [`RESIDENT_PER_ROW`] times that many sequences in KV.
    pub max_running: usize,
    pub partition: Arc<PartitionSpec>,
}

/// A partition's load, published by its scheduler after every step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartitionLoad {
    /// Bytes of KV blocks held, all models.
    pub kv_bytes_used: u64,
    /// Sequences preempted since the partition started.
    pub preemptions: u64,
    /// Requests refused because they could never fit their tenant's budget.
    pub kv_refusals: u64,
    /// Steps the device failed (their requests ended with `device_error`).
    pub device_errors: u64,
    /// Per tenant, all models.
    pub tenants: BTreeMap<String, TenantLoad>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TenantLoad {
    pub kv_blocks: u64,
    pub kv_bytes: u64,
    pub preemptions: u64,
    pub kv_refusals: u64,
}

/// What the scheduler shares with the rest of the host.
#[derive(Debug)]
pub(crate) struct Shared {
    pub registry: Arc<ModelRegistry>,
    pub load: Arc<ArcSwap<PartitionLoad>>,
}

struct ModelBatch {
    model: Arc<LoadedModel>,
    batcher: Batcher,
    block_bytes: u64,
}

/// Runs until the queue's sender is gone and every stream has drained.
pub(crate) fn run(
    receiver: &Receiver<Queued>,
    backend: &dyn Backend,
    config: &SchedulerConfig,
    shared: &Shared,
) {
    let mut batches: Vec<ModelBatch> = Vec::new();
    // One KV budget for all the partition's models.
    let on_device = backend.resident().is_some();
    let kv = PartitionKv::new(kv_memory(config.partition.memory_bytes, on_device));
    let mut outboxes: Vec<Rc<RefCell<Outbox>>> = Vec::new();
    // Counts of batches dropped (model unloaded), so totals never go back.
    let mut retired = PartitionLoad::default();
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
                Ok(job) => accept(job, &mut batches, &mut outboxes, config, &kv),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        while open {
            match receiver.try_recv() {
                Ok(job) => accept(job, &mut batches, &mut outboxes, config, &kv),
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
                Ok(Err(ForwardError::Device(e))) => {
                    // The step's requests were told; the batch goes on.
                    retired.device_errors += 1;
                    tracing::warn!(
                        "model `{}` in partition {}: the device failed a step ({}): {e}",
                        b.model.name,
                        config.partition.id,
                        e.kind.as_str()
                    );
                }
                Ok(Err(e)) => {
                    tracing::error!("model `{}`: a batched step failed: {e}", b.model.name)
                }
                Err(payload) => failed.push((i, panic_message(&*payload))),
            }
        }
        // A step that panicked (a bug: device failures are errors, above)
        // left its batch in an unknown state: drop it (each stream is told
        // "generation failed" and why); other models go on.
        for (i, why) in failed.into_iter().rev() {
            let mut gone = batches.remove(i);
            retire(&gone, &mut retired);
            gone.batcher.fail_all(&why);
            tracing::error!(
                "model `{}` in partition {}: a batched step panicked, its batch is dropped: {why}",
                gone.model.name,
                config.partition.id
            );
        }
        // An outbox stays while its sequence lives (the sink holds it) or
        // it has events its client has not taken yet.
        outboxes.retain(|o| {
            o.borrow_mut().flush();
            Rc::strong_count(o) > 1 || !o.borrow().is_settled()
        });
        // A model unloaded from the registry is released once its batch is
        // empty (other partitions may still hold it, so ask the registry).
        batches.retain(|b| {
            let unloaded = shared
                .registry
                .get(&b.model.name)
                .is_none_or(|m| !Arc::ptr_eq(&m, &b.model));
            let keep = !(b.batcher.is_idle() && unloaded);
            if !keep {
                retire(b, &mut retired);
            }
            keep
        });
        publish(&batches, &retired, &shared.load);
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

/// What a panic said (its `&str` or `String` payload).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

/// Adds a dropped batch's counts to `retired`.
fn retire(batch: &ModelBatch, retired: &mut PartitionLoad) {
    let stats = batch.batcher.stats();
    retired.preemptions += stats.preemptions;
    retired.kv_refusals += stats.kv_refusals;
    for (tenant, c) in batch.batcher.tenant_counts() {
        let t = retired.tenants.entry(tenant).or_default();
        t.preemptions += c.preemptions;
        t.kv_refusals += c.kv_refusals;
    }
}

/// Publishes the partition's load when it changed.
fn publish(batches: &[ModelBatch], retired: &PartitionLoad, load: &ArcSwap<PartitionLoad>) {
    let mut now = retired.clone();
    for b in batches {
        let stats = b.batcher.stats();
        now.kv_bytes_used += u64::from(stats.kv_blocks_used) * b.block_bytes;
        now.preemptions += stats.preemptions;
        now.kv_refusals += stats.kv_refusals;
        for (tenant, c) in b.batcher.tenant_counts() {
            add(now.tenants.entry(tenant).or_default(), c, b.block_bytes);
        }
    }
    if **load.load() != now {
        load.store(Arc::new(now));
    }
}

fn add(t: &mut TenantLoad, c: TenantCounts, block_bytes: u64) {
    t.kv_blocks += c.held_blocks;
    t.kv_bytes += c.held_blocks * block_bytes;
    t.preemptions += c.preemptions;
    t.kv_refusals += c.kv_refusals;
}

/// Puts a job in its model's batch (creating the batch on first use).
fn accept(
    queued: Queued,
    batches: &mut Vec<ModelBatch>,
    outboxes: &mut Vec<Rc<RefCell<Outbox>>>,
    config: &SchedulerConfig,
    kv: &PartitionKv,
) {
    let Queued {
        job:
            Job {
                model,
                request,
                tenant,
                priority,
                events,
                trace,
            },
        counted,
    } = queued;
    let outbox = Outbox::new(events);
    outboxes.push(outbox.clone());
    let prompt_tokens = request.prompt_tokens.len();
    let mut sink = StreamSink::new(model.clone(), prompt_tokens, outbox, counted, trace);
    if sink.check().is_break() {
        return; // client gone or model out of service while queued
    }
    let at = match batches.iter().position(|b| Arc::ptr_eq(&b.model, &model)) {
        Some(at) => at,
        None => match new_batch(&model, config, kv) {
            Ok((batcher, block_bytes)) => {
                batches.push(ModelBatch {
                    model: model.clone(),
                    batcher,
                    block_bytes,
                });
                batches.len() - 1
            }
            Err(error) => return sink.refuse(error),
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

/// The least of a device partition's memory kept for its pass workspace.
const WORKSPACE_RESERVE_MIN: u64 = 64 << 20;

/// What a partition's KV may take of its `memory_bytes`. On a device the
/// pass workspace (activations, attention partials, logits) is allocated
/// in the same budget as the KV pools, so a sixteenth of it (at least
/// [`WORKSPACE_RESERVE_MIN`], at most half) is kept for it: the planner
/// then refuses or waits before the device would run out. The CPU's
/// workspace is host memory outside the KV budget.
pub(crate) fn kv_memory(memory_bytes: u64, on_device: bool) -> u64 {
    if !on_device {
        return memory_bytes;
    }
    let reserve = (memory_bytes / 16)
        .max(WORKSPACE_RESERVE_MIN)
        .min(memory_bytes / 2);
    memory_bytes - reserve
}

/// A batch for `model` with the partition's memory as KV blocks, shared as
/// its plan says and charged to `kv`, the partition's memory all its
/// models share (any one may use all of it, together no more); and the
/// bytes of one block.
fn new_batch(
    model: &LoadedModel,
    config: &SchedulerConfig,
    kv: &PartitionKv,
) -> Result<(Batcher, u64), SchedError> {
    let geometry = model
        .model
        .kv_geometry()
        .map_err(|e| SchedError::Internal(format!("KV geometry of `{}`: {e}", model.name)))?;
    let partition = &config.partition;
    let blocks = u32::try_from(geometry.blocks_in(kv.limit_bytes())).unwrap_or(u32::MAX);
    let limits = BatchLimits {
        max_running: config.max_running.saturating_mul(RESIDENT_PER_ROW),
        max_rows: config.max_running,
        kv_blocks: blocks,
    };
    let shares = tenant_shares(partition, config.max_running, |bytes| {
        geometry.blocks_in(bytes)
    });
    let batcher = Batcher::in_partition(&model.model, limits, shares, kv.clone())
        .map_err(|e| SchedError::Internal(format!("KV pool of `{}`: {e}", model.name)))?;
    Ok((batcher, geometry.bytes_per_block()))
}

/// The plan's tenants as the batcher shares its pool: a dedicated tenant
/// owns the whole pool; in the shared pool a tenant with `hbm` owns that
/// much (`guaranteed == budget`), the others split the rest by weight, and
/// a tenant whose `cus` (or `share`) is less than the pool's units gets at
/// most that fraction of a step's `max_rows` decode rows while others wait
/// (rounded down, at least one).
pub(crate) fn tenant_shares(
    partition: &PartitionSpec,
    max_rows: usize,
    blocks_in: impl Fn(u64) -> u64,
) -> BTreeMap<String, TenantShare> {
    let pool_units = partition.units.len();
    partition
        .tenants
        .iter()
        .map(|t| {
            let units = usize::try_from(t.max_cus).unwrap_or(usize::MAX);
            let capped = partition.kind == PartitionKind::Shared && units < pool_units;
            let share = TenantShare {
                weight: t.weight.max(1),
                own_blocks: t.owns_memory.then(|| blocks_in(t.budget_bytes)),
                kv_wait: t.kv_wait,
                max_rows: capped.then(|| (max_rows.saturating_mul(units) / pool_units).max(1)),
            };
            (t.tenant.clone(), share)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::panic::catch_unwind;

    use super::*;

    #[test]
    fn a_device_partition_keeps_part_of_its_memory_for_the_pass_workspace() {
        let gib = 1u64 << 30;
        // The CPU's workspace is outside the KV budget.
        assert_eq!(kv_memory(16 * gib, false), 16 * gib);
        // A sixteenth on a device, at least 64 MiB, at most half.
        assert_eq!(kv_memory(16 * gib, true), 15 * gib);
        assert_eq!(kv_memory(gib, true), gib - (64 << 20));
        assert_eq!(kv_memory(64 << 20, true), 32 << 20);
    }

    fn planned(tenant: &str, max_cus: u32, owns_memory: bool) -> TenantSlot {
        TenantSlot {
            tenant: tenant.to_string(),
            weight: 2,
            guaranteed_bytes: 1 << 20,
            budget_bytes: 1 << 20,
            owns_memory,
            max_cus,
            kv_wait: Duration::from_secs(1),
        }
    }

    fn spec(kind: PartitionKind, tenants: Vec<TenantSlot>) -> PartitionSpec {
        PartitionSpec {
            id: "p".to_string(),
            kind,
            units: vec![0, 1, 2, 3],
            cpus: vec![0, 1, 2, 3],
            memory_bytes: 4 << 20,
            tenants,
        }
    }

    #[test]
    fn a_shared_tenants_cus_cap_becomes_its_part_of_the_steps_rows() {
        let shared = spec(
            PartitionKind::Shared,
            vec![
                planned("quarter", 1, false),
                planned("three", 3, true),
                planned("whole", 4, false),
            ],
        );
        let shares = tenant_shares(&shared, 32, |bytes| bytes >> 16);
        assert_eq!(shares["quarter"].max_rows, Some(8));
        assert_eq!(shares["three"].max_rows, Some(24));
        assert_eq!(shares["whole"].max_rows, None);
        assert_eq!(shares["three"].own_blocks, Some(16));
        assert_eq!(shares["quarter"].own_blocks, None);
        assert_eq!(shares["quarter"].weight, 2);
        // At least one row, however small the batch.
        assert_eq!(
            tenant_shares(&shared, 2, |b| b)["quarter"].max_rows,
            Some(1)
        );
        // A dedicated tenant's cores are all its partition has: no cap.
        let dedicated = spec(PartitionKind::Dedicated, vec![planned("own", 4, true)]);
        let shares = tenant_shares(&dedicated, 32, |bytes| bytes >> 16);
        assert_eq!(shares["own"].max_rows, None);
    }

    #[test]
    fn a_panics_message_is_read_from_either_payload() {
        let formatted = catch_unwind(|| panic!("alloc {} bytes: over budget", 16)).unwrap_err();
        assert_eq!(panic_message(&*formatted), "alloc 16 bytes: over budget");
        let literal = catch_unwind(|| panic!("a literal")).unwrap_err();
        assert_eq!(panic_message(&*literal), "a literal");
        let other = catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&*other), "(no message)");
    }
}
