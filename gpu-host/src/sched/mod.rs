//! The multi-tenant schedulers: the host's partitions (a CU set, a KV
//! budget and a request queue each), every partition's scheduler thread,
//! and each model's continuous batch: a step planner (`plan`: which
//! tenant's sequences prefill which chunk, which decode, which wait and
//! which are preempted, by weighted deficit round robin over rows and
//! prefill tokens; no model) and the executor that runs its plans
//! (`batch`).
//!
//! May import the engine, the backends, `models` and `affinity`; never the
//! server (`sink` turns a sequence's events into the wire's stream).

mod batch;
mod counters;
mod job;
mod partitions;
mod plan;
mod queue;
mod scheduler;
mod sequence;
mod shares;
mod sink;

pub use batch::Batcher;
pub(crate) use job::Job;
pub use partitions::MAX_TENANTS;
pub(crate) use partitions::{PartitionSettings, Partitions, Workers, tenant_requests};
pub use plan::{
    BATCH_PREFILL_CHUNK, BatchLimits, BatchStats, Chunk, PartitionKv, Planned, Planner, StepPlan,
    TenantCounts, TenantShare,
};
pub use sequence::{NewSequence, SequenceError, SequenceSink};
pub(crate) use sink::out_of_service;
