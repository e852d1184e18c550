//! The partition manager: every tenant's GPU request + a device + the
//! operator's model reservation → a [`Layout`], or every reason it cannot be
//! built. Deterministic: tenants are handled in name order, compute units
//! in id order, so the same input always gives the same layout.
//!
//! Placement of dedicated tenants:
//! - On an XCD device, a tenant whose CU count is a whole number of XCDs
//!   (38, 76, … on MI325X) gets whole XCDs, lowest index first, while
//!   enough XCDs are entirely free: an XCD's L2 cache is then its own.
//! - Every other dedicated tenant gets its count spread evenly over the
//!   XCDs no one owns whole ([`Device::spread`]): its share of each XCD's
//!   L2 and memory channels, rather than all of a few.
//! - On the CPU: the lowest free core ids.
//!
//! Everything left is the shared pool, split among the other tenants by
//! weight. Memory: a dedicated tenant's `hbm` is its partition's memory (and
//! is required); in the pool a tenant with `hbm` has that much guaranteed and
//! no more, and tenants without share what no `hbm` claims, each guaranteed
//! its weighted part and allowed to borrow the rest while it is idle.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::error::PartitionError;
use crate::layout::{Layout, Partition, PartitionKind, TenantSlot};
use crate::{CuSet, Device};

/// The KV wait of a tenant that sets none: long enough to ride out a
/// burst of its own requests finishing, short enough that a client is
/// told rather than left hanging behind a stuck budget.
pub const DEFAULT_KV_WAIT: Duration = Duration::from_secs(10);

/// The longest KV wait a tenant may ask for.
pub const MAX_KV_WAIT: Duration = Duration::from_secs(120);

/// One tenant's `[gpu]` request: the whole of it, as the gateway's policy
/// reads it and the gpu-host plans it (one conversion to the wire, in
/// `bulkhead-protocol`).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRequest {
    pub compute: Compute,
    /// Memory for its KV cache; `None`: a weighted share of what is unclaimed.
    pub hbm_bytes: Option<u64>,
    pub isolation: Isolation,
    /// Weight for fair sharing; at least 1.
    pub weight: u32,
    /// How long a request that fits its budget, but not what its other
    /// sequences leave of it, waits for memory before it is refused
    /// (`kv_wait_ms`); `None`: [`DEFAULT_KV_WAIT`]. At most [`MAX_KV_WAIT`].
    pub kv_wait: Option<Duration>,
}

impl Default for GpuRequest {
    /// A tenant without a `[gpu]` table: shared, weight 1, no budget of its own.
    fn default() -> Self {
        GpuRequest {
            compute: Compute::Unset,
            hbm_bytes: None,
            isolation: Isolation::Shared,
            weight: 1,
            kv_wait: None,
        }
    }
}

/// How much compute a tenant asks for. For a dedicated tenant it is the
/// partition's size; for a shared one, a cap on how much of the pool its
/// work may run on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compute {
    /// Dedicated: not allowed; shared: the whole pool.
    Unset,
    /// This many compute units (cores on the CPU).
    Cus(u32),
    /// This fraction of the device's compute units, rounded down; in (0, 1].
    Share(f64),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Its own compute units and memory.
    Dedicated,
    /// The shared pool.
    #[default]
    Shared,
}

/// A tenant and its request.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantRequest {
    pub tenant: String,
    pub gpu: GpuRequest,
}

impl GpuRequest {
    /// Its KV wait, the default filled in.
    pub fn kv_wait(&self) -> Duration {
        self.kv_wait.unwrap_or(DEFAULT_KV_WAIT)
    }

    /// Checks the request's own fields, and with a `device` its share of
    /// that device; on success, its compute as a count of units (`None`:
    /// unset, or a share without a device to resolve it against).
    pub fn check(
        &self,
        tenant: &str,
        device: Option<&Device>,
    ) -> Result<Option<u32>, Vec<PartitionError>> {
        let mut errors = Vec::new();
        let invalid = |field: &'static str, reason: String| PartitionError::InvalidRequest {
            tenant: tenant.to_string(),
            field,
            reason,
        };
        if self.weight == 0 {
            errors.push(invalid("weight", "must be at least 1".to_string()));
        }
        if let Some(wait) = self.kv_wait
            && wait > MAX_KV_WAIT
        {
            errors.push(invalid(
                "kv_wait_ms",
                format!(
                    "is {}; at most {} (2 minutes)",
                    wait.as_millis(),
                    MAX_KV_WAIT.as_millis()
                ),
            ));
        }
        if self.hbm_bytes == Some(0) {
            errors.push(invalid("hbm", "must be more than 0 bytes".to_string()));
        }
        if self.isolation == Isolation::Dedicated && self.hbm_bytes.is_none() {
            errors.push(PartitionError::DedicatedWithoutMemory {
                tenant: tenant.to_string(),
            });
        }
        let count = match self.compute {
            Compute::Unset if self.isolation == Isolation::Dedicated => {
                errors.push(invalid(
                    "cus",
                    "or `share` is required for a dedicated partition".to_string(),
                ));
                None
            }
            Compute::Unset => None,
            Compute::Cus(0) => {
                errors.push(invalid("cus", "must be at least 1".to_string()));
                None
            }
            Compute::Cus(n) => Some(n),
            // `!(x > 0)` also catches NaN.
            Compute::Share(share) if !(share > 0.0 && share <= 1.0) => {
                errors.push(invalid(
                    "share",
                    format!("is {share}; it must be more than 0 and at most 1"),
                ));
                None
            }
            Compute::Share(_) if device.is_none() => None,
            Compute::Share(share) => {
                let (total, unit) = device.map_or((0, ""), |d| (d.compute_units, d.unit()));
                // Exact for every device size: f64 holds u32 exactly.
                let n = (share * f64::from(total)).floor() as u32;
                if n == 0 {
                    errors.push(invalid(
                        "share",
                        format!("{share} of {total} {unit} is less than one"),
                    ));
                }
                Some(n)
            }
        };
        if errors.is_empty() {
            Ok(count)
        } else {
            Err(errors)
        }
    }
}

/// A tenant after its own checks.
struct Checked<'a> {
    tenant: &'a str,
    gpu: &'a GpuRequest,
    /// Compute units asked for (`None`: unset).
    cus: Option<u32>,
}

/// Plans the partitions of `device` for `tenants`, with
/// `model_reservation_bytes` of its memory set aside for weights. All
/// problems are reported, each naming its tenants and numbers.
pub fn plan(
    device: &Device,
    model_reservation_bytes: u64,
    tenants: &[TenantRequest],
) -> Result<Layout, Vec<PartitionError>> {
    let mut errors = Vec::new();
    if device.compute_units == 0 {
        errors.push(PartitionError::InvalidDevice {
            reason: format!("{} has no compute units", device.name),
        });
        return Err(errors);
    }
    let mut sorted: Vec<&TenantRequest> = tenants.iter().collect();
    sorted.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let mut seen = BTreeSet::new();
    let mut checked = Vec::new();
    for request in sorted {
        if !seen.insert(request.tenant.as_str()) {
            errors.push(PartitionError::DuplicateTenant {
                tenant: request.tenant.clone(),
            });
            continue;
        }
        match request.gpu.check(&request.tenant, Some(device)) {
            Ok(cus) => checked.push(Checked {
                tenant: &request.tenant,
                gpu: &request.gpu,
                cus,
            }),
            Err(mut own) => errors.append(&mut own),
        }
    }
    check_totals(device, model_reservation_bytes, &checked, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }

    let (dedicated, shared): (Vec<&Checked>, Vec<&Checked>) = checked
        .iter()
        .partition(|t| t.gpu.isolation == Isolation::Dedicated);
    let mut free = device.all();
    let mut partitions = place_dedicated(device, &dedicated, &mut free);
    let dedicated_bytes: u64 = dedicated.iter().filter_map(|t| t.gpu.hbm_bytes).sum();
    let pool_bytes = device.memory_bytes - model_reservation_bytes - dedicated_bytes;
    if let Some(pool) = shared_pool(device, free, pool_bytes, &shared, &mut errors) {
        partitions.push(pool);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Layout {
        device: device.clone(),
        model_reservation_bytes,
        partitions,
    })
}

/// Dedicated compute within the device; every `hbm` plus the reservation
/// within its memory.
fn check_totals(
    device: &Device,
    model_reservation_bytes: u64,
    tenants: &[Checked],
    errors: &mut Vec<PartitionError>,
) {
    let dedicated: Vec<(String, u64)> = tenants
        .iter()
        .filter(|t| t.gpu.isolation == Isolation::Dedicated)
        .filter_map(|t| Some((t.tenant.to_string(), u64::from(t.cus?))))
        .collect();
    let total: u64 = dedicated.iter().map(|(_, n)| n).sum();
    if total > u64::from(device.compute_units) {
        errors.push(PartitionError::DedicatedComputeOversubscribed {
            device: device.name.clone(),
            unit: device.unit(),
            tenants: dedicated,
            total,
            available: u64::from(device.compute_units),
        });
    }
    let memory: Vec<(String, u64)> = tenants
        .iter()
        .filter_map(|t| Some((t.tenant.to_string(), t.gpu.hbm_bytes?)))
        .collect();
    // u128: a dozen 2^63-byte requests must not wrap into a small total.
    let total = memory.iter().map(|(_, b)| u128::from(*b)).sum::<u128>()
        + u128::from(model_reservation_bytes);
    if total > u128::from(device.memory_bytes) {
        errors.push(PartitionError::MemoryOversubscribed {
            device: device.name.clone(),
            tenants: memory,
            model_reservation_bytes,
            total_bytes: u64::try_from(total).unwrap_or(u64::MAX),
            device_memory_bytes: device.memory_bytes,
        });
    }
}

/// Dedicated partitions, in tenant order; their units are removed from
/// `free`. The totals were checked, so every tenant fits.
fn place_dedicated(device: &Device, tenants: &[&Checked], free: &mut CuSet) -> Vec<Partition> {
    let mut placed: Vec<(usize, CuSet, Vec<u32>)> = Vec::new();
    // Whole XCDs first, so spreading does not break them up.
    let mut spread = Vec::new();
    let mut next_xcd = 0;
    for (i, t) in tenants.iter().enumerate() {
        let count = t.cus.unwrap_or(0);
        match device.xcds {
            Some(g)
                if count.is_multiple_of(g.cus_per_xcd)
                    && next_xcd + count / g.cus_per_xcd <= g.xcds =>
            {
                let xcds: Vec<u32> = (next_xcd..next_xcd + count / g.cus_per_xcd).collect();
                next_xcd += count / g.cus_per_xcd;
                let mut cus = CuSet::empty(device.compute_units);
                for &k in &xcds {
                    let xcd = device.xcd(k);
                    free.remove_all(&xcd);
                    for cu in xcd.iter() {
                        cus.insert(cu);
                    }
                }
                placed.push((i, cus, xcds));
            }
            _ => spread.push(i),
        }
    }
    for i in spread {
        let count = tenants[i].cus.unwrap_or(0);
        let cus = device
            .spread(free, count)
            .unwrap_or_else(|| CuSet::empty(device.compute_units));
        free.remove_all(&cus);
        placed.push((i, cus, Vec::new()));
    }
    placed.sort_by_key(|(i, _, _)| *i);
    placed
        .into_iter()
        .map(|(i, cus, whole_xcds)| {
            let t = tenants[i];
            let bytes = t.gpu.hbm_bytes.unwrap_or(0);
            Partition {
                kind: PartitionKind::Dedicated,
                whole_xcds,
                memory_bytes: bytes,
                tenants: vec![TenantSlot {
                    tenant: t.tenant.to_string(),
                    weight: t.gpu.weight,
                    guaranteed_bytes: bytes,
                    budget_bytes: bytes,
                    owns_memory: true,
                    max_cus: cus.len(),
                    kv_wait: t.gpu.kv_wait(),
                }],
                cus,
            }
        })
        .collect()
}

/// The shared pool: the compute units no one owns, the memory no dedicated
/// partition owns, every other tenant. `None` when it would have neither
/// units nor tenants.
fn shared_pool(
    device: &Device,
    cus: CuSet,
    memory_bytes: u64,
    tenants: &[&Checked],
    errors: &mut Vec<PartitionError>,
) -> Option<Partition> {
    if tenants.is_empty() && cus.is_empty() {
        return None;
    }
    let pool = cus.len();
    if pool == 0 {
        errors.push(PartitionError::NoSharedCompute {
            device: device.name.clone(),
            unit: device.unit(),
            available: u64::from(device.compute_units),
            tenants: tenants.iter().map(|t| t.tenant.to_string()).collect(),
        });
        return None;
    }
    let claimed: u64 = tenants.iter().filter_map(|t| t.gpu.hbm_bytes).sum();
    // The totals check keeps `claimed` within `memory_bytes`.
    let unclaimed = memory_bytes.saturating_sub(claimed);
    let unbudgeted: Vec<&&Checked> = tenants
        .iter()
        .filter(|t| t.gpu.hbm_bytes.is_none())
        .collect();
    if unclaimed == 0 && !unbudgeted.is_empty() {
        errors.push(PartitionError::NoSharedMemory {
            device: device.name.clone(),
            device_memory_bytes: device.memory_bytes,
            tenants: unbudgeted.iter().map(|t| t.tenant.to_string()).collect(),
        });
    }
    let weights: u64 = unbudgeted.iter().map(|t| u64::from(t.gpu.weight)).sum();
    let mut slots = Vec::new();
    for t in tenants {
        let max_cus = match t.cus {
            Some(cap) if cap > pool => {
                errors.push(PartitionError::CapAbovePool {
                    tenant: t.tenant.to_string(),
                    device: device.name.clone(),
                    unit: device.unit(),
                    cap: u64::from(cap),
                    pool: u64::from(pool),
                });
                cap
            }
            Some(cap) => cap,
            None => pool,
        };
        let (guaranteed_bytes, budget_bytes) = match t.gpu.hbm_bytes {
            Some(bytes) => (bytes, bytes),
            None => {
                // Rounded down, so the guarantees never add up past `unclaimed`.
                let part = u128::from(unclaimed) * u128::from(t.gpu.weight) / u128::from(weights);
                (u64::try_from(part).unwrap_or(unclaimed), unclaimed)
            }
        };
        slots.push(TenantSlot {
            tenant: t.tenant.to_string(),
            weight: t.gpu.weight,
            guaranteed_bytes,
            budget_bytes,
            owns_memory: t.gpu.hbm_bytes.is_some(),
            max_cus,
            kv_wait: t.gpu.kv_wait(),
        });
    }
    let whole_xcds = (0..device.xcds.map_or(0, |g| g.xcds))
        .filter(|&k| {
            let xcd = device.xcd(k);
            xcd.iter().all(|cu| cus.contains(cu))
        })
        .collect();
    Some(Partition {
        kind: PartitionKind::Shared,
        cus,
        whole_xcds,
        memory_bytes,
        tenants: slots,
    })
}

#[cfg(test)]
mod tests;
