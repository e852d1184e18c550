//! The inference engine: model config and weights, the forward pass over a
//! backend, sampling and the generation loop.

mod backend;
mod batch;
mod budgeted;
mod config;
mod generate;
mod hip_backend;
mod hip_device;
mod model;
mod paged;
mod partitioned;
mod sampling;
mod select;
mod weights;

pub use backend::{Backend, ComputeBackend, CpuBackend, RopeParams};
pub use batch::{
    BATCH_PREFILL_CHUNK, BatchLimits, BatchStats, Batcher, DEFAULT_KV_WAIT, MAX_KV_WAIT,
    NewSequence, PartitionKv, SequenceError, SequenceSink, TenantCounts, TenantShare,
};
pub use budgeted::BudgetedDevice;
pub use config::{Arch, ConfigError, ModelConfig};
pub use generate::{
    Decoded, Decoding, FinishReason, GenerateError, GenerateRequest, Generation, MAX_STOP_BYTES,
    MAX_STOP_STRINGS, Next, Piece, generate, generate_streaming,
};
pub use hip_backend::{DeviceWeights, HipBackend};
pub use hip_device::{
    HipDeviceError, open_hip_backend, open_hip_device, open_hip_partitions, planning_device,
};
pub use model::{ForwardError, KvCache, Logits, Model, PREFILL_CHUNK};
pub use paged::{BLOCK_TOKENS, BatchEntry, KvBlocks};
#[cfg(test)]
pub(crate) use partitioned::tests as partitioned_test_support;
pub use partitioned::{MODEL_RESERVATION, PartitionCompute, PartitionedDevice, StreamSource};
pub use sampling::{Sampler, SamplingError, SamplingParams, argmax};
pub use select::{
    BackendChoice, BackendPlan, BackendSelectError, DeviceLabel, HIP_ENGINE, HipEngine,
    plan_backend,
};
