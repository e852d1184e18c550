//! The multi-tenant schedulers: the host's partitions (a CU set, a KV
//! budget and a request queue each), every partition's scheduler thread,
//! and each model's continuous batch: a step planner (`plan`: which
//! tenant's sequences prefill which chunk, which decode, which wait and
//! which are preempted, by weighted deficit round robin over rows and
//! prefill tokens; no model) and the executor that runs its plans
//! (`batch`).
//!
//! May import the engine, the backends, `models` and `affinity`; never the
//! server, nor the wire's types or status codes: a stream carries
//! `Event`s and `SchedError`s, the partitions report a `PartitionsReport`,
//! and the server turns them into gRPC.

mod batch;
mod counters;
mod error;
mod job;
mod partitions;
mod plan;
mod queue;
mod scheduler;
mod sequence;
mod shares;
mod sink;
mod trace;

pub use batch::Batcher;
pub(crate) use error::SchedError;
pub(crate) use job::{Event, Job};
pub use partitions::MAX_TENANTS;
pub(crate) use partitions::{PartitionSettings, Partitions, Workers};
pub use plan::{
    BATCH_PREFILL_CHUNK, BatchLimits, BatchStats, Chunk, PartitionKv, Planned, Planner, StepPlan,
    TenantCounts, TenantShare,
};
pub use sequence::{NewSequence, SequenceError, SequenceSink, StepRun};
pub(crate) use trace::SeqTrace;
