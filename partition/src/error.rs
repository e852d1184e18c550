//! The crate's one error enum. Policy-shaped errors (over-subscription,
//! invalid requests) name the tenants and the numbers, because an operator
//! reads them in `bulkhead policy check` and must fix a file from them alone.

use crate::size::format_bytes;

/// Everything that can go wrong planning partitions or accounting KV blocks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// A size such as `"24GiB"` did not parse (the operator's fault).
    #[error("`{text}` is not a size: {reason}")]
    InvalidSize { text: String, reason: String },

    /// A device description that cannot be partitioned (no compute, …).
    #[error("invalid device: {reason}")]
    InvalidDevice { reason: String },

    /// One field of one tenant's GPU request is out of range.
    #[error("tenant {tenant}: `{field}` {reason}")]
    InvalidRequest {
        tenant: String,
        field: &'static str,
        reason: String,
    },

    /// The same tenant appears twice in one plan's input (a caller bug).
    #[error("tenant {tenant} is listed twice")]
    DuplicateTenant { tenant: String },

    /// Dedicated tenants ask for more compute than the device has.
    #[error(
        "dedicated {unit}: {} = {total} > {available} on {device}",
        terms(.tenants, |n| n.to_string())
    )]
    DedicatedComputeOversubscribed {
        device: String,
        /// `"CUs"` or `"cores"`.
        unit: &'static str,
        tenants: Vec<(String, u64)>,
        total: u64,
        available: u64,
    },

    /// Tenants' `hbm` plus the model reservation exceed the device's memory.
    #[error(
        "memory: {}{} = {} > {} on {device}",
        terms(.tenants, format_bytes),
        reservation_term(.tenants.is_empty(), *.model_reservation_bytes),
        format_bytes(*.total_bytes),
        format_bytes(*.device_memory_bytes)
    )]
    MemoryOversubscribed {
        device: String,
        tenants: Vec<(String, u64)>,
        model_reservation_bytes: u64,
        total_bytes: u64,
        device_memory_bytes: u64,
    },

    /// Dedicated partitions take every compute unit, but some tenants share.
    #[error(
        "no shared pool: dedicated tenants take all {available} {unit} of {device}, \
         leaving none for {}",
        .tenants.join(", ")
    )]
    NoSharedCompute {
        device: String,
        unit: &'static str,
        available: u64,
        /// The tenants left without compute (shared, or without a `[gpu]` table).
        tenants: Vec<String>,
    },

    /// Every byte is taken by `hbm` budgets and the model reservation, but
    /// some tenants set no `hbm` and would get nothing.
    #[error(
        "no memory left on {device} for tenants without `hbm`: {} (the `hbm` budgets \
         and the model reservation take all {})",
        .tenants.join(", "),
        format_bytes(*.device_memory_bytes)
    )]
    NoSharedMemory {
        device: String,
        device_memory_bytes: u64,
        tenants: Vec<String>,
    },

    /// A dedicated partition owns its memory, so it must say how much.
    #[error("tenant {tenant}: a dedicated partition needs `hbm` (its own memory budget)")]
    DedicatedWithoutMemory { tenant: String },

    /// A shared tenant caps its compute above what the shared pool has.
    #[error(
        "tenant {tenant}: shared compute capped at {cap} {unit}, but the shared pool of \
         {device} has {pool} after dedicated partitions"
    )]
    CapAbovePool {
        tenant: String,
        device: String,
        unit: &'static str,
        cap: u64,
        pool: u64,
    },

    /// Invalid KV geometry (a zero dimension, or a size past 64 bits).
    #[error("invalid KV geometry: {reason}")]
    InvalidKvGeometry { reason: String },

    /// Invalid KV pool setup (guarantees above the pool, …): a caller bug.
    #[error("invalid KV pool: {reason}")]
    InvalidKvPool { reason: String },

    /// Admission: the request's prompt + `max_tokens` does not fit. The
    /// gateway maps this to 400 `kv_budget_exceeded` (no wait would help).
    #[error(
        "tenant {tenant} needs {needed_blocks} KV blocks ({needed_tokens} tokens) but has \
         {available_blocks} ({available_tokens} tokens) {of}"
    )]
    KvBudgetExceeded {
        tenant: String,
        needed_blocks: u64,
        needed_tokens: u64,
        available_blocks: u64,
        available_tokens: u64,
        /// Which limit: "left of its budget" (retry later) or "as its
        /// guaranteed share" (never fits; a smaller request will).
        of: &'static str,
    },

    /// No free block in the partition's pool: pick a victim or wait.
    #[error("the KV pool is exhausted (tenant {tenant} asked for a block)")]
    KvPoolExhausted { tenant: String },

    /// A sequence asked for more blocks than its admission reserved (a
    /// scheduler bug: generation must stop at `max_tokens`).
    #[error("sequence {seq} already holds every block its admission reserved")]
    KvReservationUsed { seq: u64 },

    #[error("unknown tenant {tenant}")]
    UnknownTenant { tenant: String },

    #[error("unknown sequence {seq}")]
    UnknownSequence { seq: u64 },
}

/// The tenant's other sequences hold the rest of its budget: retry later.
pub(crate) const LEFT_OF_BUDGET: &str = "left of its budget";
/// One sequence larger than the tenant's guaranteed share could wait forever.
pub(crate) const AS_GUARANTEED_SHARE: &str = "as its guaranteed share";

impl PartitionError {
    /// Whether the same request may succeed later without a policy change.
    pub fn is_retryable(&self) -> bool {
        match self {
            PartitionError::KvBudgetExceeded { of, .. } => *of == LEFT_OF_BUDGET,
            PartitionError::KvPoolExhausted { .. } => true,
            _ => false,
        }
    }

    /// The tenants an error is about, sorted (for pointing at their files).
    pub fn tenants(&self) -> Vec<&str> {
        let mut names: Vec<&str> = match self {
            PartitionError::InvalidRequest { tenant, .. }
            | PartitionError::DuplicateTenant { tenant }
            | PartitionError::DedicatedWithoutMemory { tenant }
            | PartitionError::CapAbovePool { tenant, .. }
            | PartitionError::KvBudgetExceeded { tenant, .. }
            | PartitionError::KvPoolExhausted { tenant }
            | PartitionError::UnknownTenant { tenant } => vec![tenant],
            PartitionError::DedicatedComputeOversubscribed { tenants, .. }
            | PartitionError::MemoryOversubscribed { tenants, .. } => {
                tenants.iter().map(|(t, _)| t.as_str()).collect()
            }
            PartitionError::NoSharedCompute { tenants, .. }
            | PartitionError::NoSharedMemory { tenants, .. } => {
                tenants.iter().map(String::as_str).collect()
            }
            PartitionError::InvalidSize { .. }
            | PartitionError::InvalidDevice { .. }
            | PartitionError::InvalidKvGeometry { .. }
            | PartitionError::InvalidKvPool { .. }
            | PartitionError::KvReservationUsed { .. }
            | PartitionError::UnknownSequence { .. } => Vec::new(),
        };
        names.sort_unstable();
        names
    }
}

/// `"acme 200 + globex 160"`.
fn terms(tenants: &[(String, u64)], show: impl Fn(u64) -> String) -> String {
    tenants
        .iter()
        .map(|(tenant, n)| format!("{tenant} {}", show(*n)))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// `" + model reservation 20GiB"`, or without the `+` when it stands alone.
fn reservation_term(alone: bool, bytes: u64) -> String {
    match (alone, bytes) {
        (_, 0) => String::new(),
        (true, b) => format!("model reservation {}", format_bytes(b)),
        (false, b) => format!(" + model reservation {}", format_bytes(b)),
    }
}
