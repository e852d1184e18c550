//! What a partition's scheduler computes with: its own CPU backend, or a
//! view of a device that the partitions split.

use std::sync::Arc;

use super::partitioned::PartitionedDevice;

/// What the host's partition schedulers compute with.
#[derive(Clone, Debug, Default)]
pub enum ComputeBackend {
    /// A CPU backend per partition, one worker thread per compute unit,
    /// pinned with the partition's scheduler to its cores.
    #[default]
    Cpu,
    /// A device the partitions split: each partition's scheduler gets a
    /// backend of its own from it (streams on the partition's CUs, a
    /// budget of its memory), all reading one copy of the weights.
    Device(Arc<PartitionedDevice>),
}
