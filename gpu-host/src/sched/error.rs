//! Why the schedulers refused a request or ended its stream with an error.
//! The transport gives each its status code (`server::wire`); the texts
//! are what clients read.

use super::sequence::SequenceError;
use crate::backend::DeviceError;
use crate::engine::GenerateError;

/// A request refused at submit, a layout refused, or a stream's last word.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchedError {
    /// Its tenant has its guaranteed part of the partition's queue waiting
    /// and the rest of the queue is full ([`super::shares`]).
    #[error(
        "the request queue is full in partition `{partition}` ({capacity} places) and tenant \
         `{tenant}` has {waiting} requests waiting, its guaranteed part is {guaranteed}; retry \
         later"
    )]
    QueueFull {
        partition: String,
        capacity: usize,
        tenant: String,
        waiting: usize,
        guaranteed: usize,
    },
    /// Its KV cache did not fit its tenant's budget: a
    /// [`SequenceError::KvBudget`] or [`SequenceError::KvWait`], whose text
    /// starts with `kv_budget_exceeded:` (the gateway reads that prefix).
    #[error(transparent)]
    KvBudget(SequenceError),
    /// Its model was taken out of service (its weights no longer verify).
    #[error("model `{model}` is out of service: {reason}")]
    OutOfService { model: String, reason: String },
    /// Every partition of the layout is dedicated to other tenants.
    #[error(
        "tenant `{tenant}` has no partition on this host: every core is dedicated to other \
         tenants"
    )]
    NoPartition { tenant: String },
    /// The tenant set cannot be planned on this host; the layout in force
    /// stays. `host` describes the device, `errors` the planner's reasons.
    #[error("the partitions cannot be planned on this host ({host}): {errors}")]
    Unplannable { host: String, errors: String },
    /// The engine refused the request (the checks before queueing should
    /// have caught it; still the client's fault).
    #[error(transparent)]
    BadRequest(GenerateError),
    /// The device failed the step the request was in: out of memory in
    /// its partition's budget, a failed launch, or a lost device (then out
    /// of service for every request after it). The text starts with
    /// `device_error: ` and the kind's name (the gateway reads both).
    #[error("device_error: {kind}: {0}", kind = .0.kind.as_str())]
    Device(DeviceError),
    /// The partition's queue is closed: the host is stopping.
    #[error("the host is shutting down")]
    ShuttingDown,
    /// The host failed (a forward pass, KV accounting, a dropped batch, a
    /// scheduler that would not start) or a bug; the text says which.
    #[error("{0}")]
    Internal(String),
}

impl SchedError {
    /// A short, fixed name of the error's kind (a span's `error.type`):
    /// never the text, which may name tenants or carry a reason.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            SchedError::QueueFull { .. } => "queue_full",
            SchedError::KvBudget(_) => "kv_budget_exceeded",
            SchedError::OutOfService { .. } => "model_out_of_service",
            SchedError::NoPartition { .. } => "no_partition",
            SchedError::Unplannable { .. } => "unplannable",
            SchedError::BadRequest(_) => "bad_request",
            SchedError::Device(_) => "device_error",
            SchedError::ShuttingDown => "shutting_down",
            SchedError::Internal(_) => "internal",
        }
    }
}
