//! A layout: the partitions the manager chose for one device. Layouts are
//! immutable values; a re-partition builds a new one and publishes it
//! through a [`LayoutCell`], while work already running keeps the `Arc` of
//! the layout it started on and finishes there.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::{CuSet, Device};

/// Every partition of one device, as planned by [`plan`](crate::plan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub device: Device,
    /// Memory set aside for model weights (loaded once, shared read-only,
    /// charged to no tenant).
    pub model_reservation_bytes: u64,
    /// Dedicated partitions in tenant order, then the shared pool when it
    /// has compute units or tenants.
    pub partitions: Vec<Partition>,
}

impl Layout {
    /// The partition `tenant` runs in, and its slot there.
    pub fn placement(&self, tenant: &str) -> Option<(&Partition, &TenantSlot)> {
        self.partitions.iter().find_map(|partition| {
            let slot = partition.tenants.iter().find(|s| s.tenant == tenant)?;
            Some((partition, slot))
        })
    }

    /// The shared pool, if there is one.
    pub fn shared(&self) -> Option<&Partition> {
        self.partitions
            .iter()
            .find(|p| p.kind == PartitionKind::Shared)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionKind {
    /// One tenant owns these compute units and this memory.
    Dedicated,
    /// Every non-dedicated tenant, weighted-fair.
    Shared,
}

impl PartitionKind {
    /// `dedicated` or `shared`: how reports and the wire name it.
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionKind::Dedicated => "dedicated",
            PartitionKind::Shared => "shared",
        }
    }

    /// The kind [`PartitionKind::as_str`] names, if any.
    pub fn from_name(name: &str) -> Option<PartitionKind> {
        [PartitionKind::Dedicated, PartitionKind::Shared]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// A set of compute units with a memory budget and the tenants that use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub kind: PartitionKind,
    /// CU-mask bits on a GPU, core ids on the CPU.
    pub cus: CuSet,
    /// XCDs this partition owns entirely (their L2 is not shared with other
    /// partitions); empty on the CPU and for spread partitions.
    pub whole_xcds: Vec<u32>,
    /// KV-cache memory of the partition (weights are not in it).
    pub memory_bytes: u64,
    /// Sorted by tenant.
    pub tenants: Vec<TenantSlot>,
}

/// One tenant's standing inside its partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSlot {
    pub tenant: String,
    /// Its weight for fair sharing (deficit round robin in the shared pool).
    pub weight: u32,
    /// Memory it always gets, reclaiming it from tenants over their own
    /// guarantee when needed: its `hbm`, or, without one, its weighted share
    /// of the memory no `hbm` claims.
    pub guaranteed_bytes: u64,
    /// The most it may hold: its `hbm`, or, without one, all the memory no
    /// `hbm` claims (borrowed while others leave it idle).
    pub budget_bytes: u64,
    /// Whether that memory is its own (`hbm` set, or a dedicated
    /// partition) rather than borrowed from the pool.
    pub owns_memory: bool,
    /// Compute units its work may run on (its own, or its cap in the pool).
    pub max_cus: u32,
    /// How long its requests wait for KV memory (see [`GpuRequest::kv_wait`](crate::GpuRequest::kv_wait)).
    pub kv_wait: Duration,
}

/// The current layout, read without locks by the serving path and replaced
/// whole by a re-partition.
#[derive(Debug)]
pub struct LayoutCell {
    current: ArcSwap<Layout>,
}

impl LayoutCell {
    pub fn new(layout: Layout) -> LayoutCell {
        LayoutCell {
            current: ArcSwap::from_pointee(layout),
        }
    }

    /// The layout now; work that starts keeps this `Arc` until it ends.
    pub fn current(&self) -> Arc<Layout> {
        self.current.load_full()
    }

    /// Makes `layout` current and returns the previous one (which lives on
    /// as long as work started on it holds it).
    pub fn publish(&self, layout: Layout) -> Arc<Layout> {
        self.current.swap(Arc::new(layout))
    }
}
