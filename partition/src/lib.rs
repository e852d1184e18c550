//! Bulkhead's partition logic: how one device's compute units and memory are
//! split among tenants, how KV-cache blocks are charged, and how a shared
//! partition is scheduled fairly (admission and prefill by [`Drr`], decode
//! rows by [`RowPicker`]). Pure and deterministic, so the gateway's
//! `policy check` and the gpu-host run the same code.

#![forbid(unsafe_code)]

mod cuset;
mod device;
mod drr;
mod error;
mod kv;
mod layout;
mod manager;
mod report;
mod rows;
mod size;

pub use cuset::CuSet;
pub use device::{Device, XcdGrouping, default_kv_memory_bytes, host_cores, host_memory_bytes};
pub use drr::{DEFAULT_QUANTUM_TOKENS, Drr, Scheduled};
pub use error::PartitionError;
pub use kv::{BlockId, KV_BLOCK_TOKENS, KvDtype, KvGeometry, KvPool, SeqId, TenantBlocks, Victim};
pub use layout::{Layout, LayoutCell, Partition, PartitionKind, TenantSlot};
pub use manager::{
    Compute, DEFAULT_KV_WAIT, GpuRequest, Isolation, MAX_KV_WAIT, TenantRequest, plan,
};
pub use report::{PartitionReport, PartitionsReport, TenantReport};
pub use rows::{RowCandidate, RowPicker, RowTerms};
pub use size::{format_bytes, parse_bytes};
