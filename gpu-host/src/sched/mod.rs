//! The multi-tenant schedulers: the host's partitions (a CU set, a KV
//! budget and a request queue each), every partition's scheduler thread,
//! and the continuous batcher that decides each step which tenant's
//! sequences prefill which chunk, which decode, which wait and which are
//! preempted (weighted deficit round robin over rows and prefill tokens).
//!
//! May import the engine, the backends, `models` and `affinity`; never the
//! server (`sink` turns a sequence's events into the wire's stream).

mod batch;
mod partitions;
mod queue;
mod scheduler;
mod shares;
mod sink;

pub use batch::{
    BATCH_PREFILL_CHUNK, BatchLimits, BatchStats, Batcher, DEFAULT_KV_WAIT, MAX_KV_WAIT,
    NewSequence, PartitionKv, SequenceError, SequenceSink, TenantCounts, TenantShare,
};
pub use partitions::{MAX_TENANT_BYTES, MAX_TENANTS};
pub(crate) use partitions::{PartitionSettings, Partitions, Workers, tenant_requests};
pub(crate) use queue::Job;
pub(crate) use sink::out_of_service;
