//! NVIDIA GPUs through the CUDA driver API: what `devices` lists, and the
//! kernels of `kernels/hip` (built by nvcc into `CUDA_FATBIN`) run behind
//! the same [`KernelDevice`](bulkhead_kernels::hip::KernelDevice) the HIP
//! backend drives, so the engine, the device-resident pass and the
//! partition manager are the same code on both vendors.
//!
//! The driver (`libcuda.so.1`) is loaded at run time through `cudarc`
//! (feature `cuda`), so a build with the feature runs where there is no
//! CUDA and says so. Partitions: a dedicated partition's SMs are a green
//! context (CUDA 12.4+: the device's SMs split once into equal groups,
//! [`SmGroups`], and a partition gets the groups its CU range covers); on
//! an older driver every partition shares all SMs, with streams and memory
//! budgets of its own ([`SmIsolation`]).

use bulkhead_partition::CuSet;
use serde::Serialize;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod driver;
#[cfg(feature = "cuda")]
pub use driver::CudaStreams;

/// One NVIDIA device, as `devices` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CudaDeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`: (9, 0) on H100/H200, (8, 0) on A100.
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub free_memory_bytes: u64,
    pub total_memory_bytes: u64,
    /// The driver's CUDA version (12040 for 12.4).
    pub driver_version: u32,
    /// Whether the driver has green contexts (dedicated SM sets).
    pub green_contexts: bool,
}

impl CudaDeviceInfo {
    /// `sm_90`, the target whose cubin fits it.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// "CUDA device 0 (NVIDIA H200, sm_90)", for messages.
    pub fn label(&self) -> String {
        format!(
            "CUDA device {} ({}, {})",
            self.ordinal,
            self.name,
            self.arch()
        )
    }
}

/// What the CUDA driver reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaAvailability {
    /// This build has no `cuda` feature.
    NotBuilt,
    /// No driver, or no device, and why.
    Unavailable(String),
    Devices(Vec<CudaDeviceInfo>),
}

/// Asks the driver for its devices (never panics: a missing library or a
/// driver too old is an `Unavailable` with the reason).
pub fn probe() -> CudaAvailability {
    #[cfg(feature = "cuda")]
    {
        match driver::devices() {
            Ok(devices) if devices.is_empty() => {
                CudaAvailability::Unavailable("the CUDA driver reports no device".into())
            }
            Ok(devices) => CudaAvailability::Devices(devices),
            Err(why) => CudaAvailability::Unavailable(why),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        CudaAvailability::NotBuilt
    }
}

/// Why a CUDA device cannot be used for partitions with their own SMs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum SmIsolation {
    /// Green contexts: each dedicated partition runs on SMs of its own.
    GreenContexts { sms_per_group: u32, groups: u32 },
    /// Every partition's stream runs on every SM; memory budgets and
    /// scheduling still apply. `why`: what the driver lacked.
    SharedStreams { why: String },
}

impl SmIsolation {
    /// For `GET /admin/v1/partitions` and logs.
    pub fn describe(&self) -> String {
        match self {
            SmIsolation::GreenContexts {
                sms_per_group,
                groups,
            } => format!("green contexts ({groups} groups of {sms_per_group} SMs)"),
            SmIsolation::SharedStreams { why } => {
                format!("shared streams: partitions share every SM ({why})")
            }
        }
    }
}

/// The device's SMs split once into `count` disjoint groups of `size`
/// (the driver's granularity: 8 on compute capability 9.0, 2 or 4 before;
/// SMs left over join no group). The planner's CU ids are SM ids; a
/// partition's range of ids gets the whole groups it covers, so disjoint
/// ranges get disjoint groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmGroups {
    pub size: u32,
    pub count: u32,
}

impl SmGroups {
    /// The groups (first index and count) for `cus`, a contiguous range of
    /// SM ids: from the group holding its first id to the last group it
    /// ends inside or past, rounded so that neighbouring ranges never share
    /// a group. A range that covers no whole group, or has gaps, is refused.
    pub fn for_cus(&self, cus: &CuSet) -> Result<(u32, u32), String> {
        let first = cus.iter().next().ok_or("an empty SM set")?;
        let last = cus.iter().last().unwrap_or(first);
        if last - first + 1 != cus.len() {
            return Err(format!(
                "SMs {first}..={last} with gaps: green contexts take contiguous ranges"
            ));
        }
        // A group belongs to the range holding its first SM.
        let start = first.div_ceil(self.size);
        let end = ((last + 1).div_ceil(self.size)).min(self.count);
        if end <= start {
            return Err(format!(
                "SMs {first}..={last} hold no whole group of {} SMs (the driver's granularity); \
                 give the partition more compute units",
                self.size
            ));
        }
        Ok((start, end - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(width: u32, ids: std::ops::Range<u32>) -> CuSet {
        CuSet::from_ids(width, ids)
    }

    #[test]
    fn neighbouring_ranges_get_disjoint_groups() {
        // H200: 132 SMs in 16 groups of 8 (4 left over).
        let g = SmGroups { size: 8, count: 16 };
        assert_eq!(g.for_cus(&range(132, 0..66)), Ok((0, 9)));
        assert_eq!(g.for_cus(&range(132, 66..132)), Ok((9, 7)));
        assert_eq!(g.for_cus(&range(132, 0..132)), Ok((0, 16)));
        // Any cut point: the two sides never overlap and cover every group.
        for cut in 1..132 {
            let (a, n) = g.for_cus(&range(132, 0..cut)).unwrap_or((0, 0));
            let (b, m) = g.for_cus(&range(132, cut..132)).unwrap_or((16, 0));
            assert!(a + n <= b, "cut {cut}: {a}+{n} vs {b}");
            assert_eq!(n + m, 16, "cut {cut}");
        }
    }

    #[test]
    fn too_small_or_gapped_ranges_are_refused_saying_why() {
        let g = SmGroups { size: 8, count: 16 };
        let err = g.for_cus(&range(132, 3..7)).unwrap_err();
        assert!(err.contains("no whole group of 8 SMs"), "{err}");
        let gapped = CuSet::from_ids(132, [0, 1, 2, 10]);
        assert!(g.for_cus(&gapped).unwrap_err().contains("gaps"));
        assert!(g.for_cus(&CuSet::empty(132)).is_err());
    }

    #[test]
    fn isolation_says_what_partitions_share() {
        let shared = SmIsolation::SharedStreams {
            why: "driver 12.2 has no green contexts".into(),
        };
        assert_eq!(
            shared.describe(),
            "shared streams: partitions share every SM (driver 12.2 has no green contexts)"
        );
        assert_eq!(
            serde_json::to_value(&shared).unwrap()["mode"],
            "shared_streams"
        );
    }

    #[test]
    fn without_a_driver_the_probe_says_so() {
        // CI machines have no NVIDIA driver; a machine that has one lists it.
        let answer = probe();
        assert_eq!(
            answer == CudaAvailability::NotBuilt,
            !cfg!(feature = "cuda")
        );
        match answer {
            CudaAvailability::NotBuilt => {}
            CudaAvailability::Unavailable(why) => assert!(
                why.starts_with("no CUDA") || why.contains("reports no device"),
                "{why}"
            ),
            CudaAvailability::Devices(d) => assert!(d.iter().all(|d| d.multiprocessors > 0)),
        }
    }
}
