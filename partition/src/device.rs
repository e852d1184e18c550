//! The device model: compute units, memory bytes, and (on MI300-class GPUs)
//! how compute units group into XCDs. CPU cores are compute units too, so
//! one partition manager serves both backends.

use std::io::Read;

use crate::{CuSet, PartitionError};

/// A device the partition manager splits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Shown in messages: `"mi325x"`, `"cpu"`.
    pub name: String,
    /// CUs on a GPU, cores on the CPU backend.
    pub compute_units: u32,
    /// HBM on a GPU; on the CPU backend the host-RAM budget for weights and KV.
    pub memory_bytes: u64,
    /// How compute units group into XCDs; `None` on the CPU.
    pub xcds: Option<XcdGrouping>,
}

/// MI300-class compute-unit grouping. The CU mask of
/// `hipExtStreamCreateWithCUMask` is interleaved across XCDs: mask bit `i`
/// lands on XCD `i % xcds`, as CU `i / xcds` of that XCD. Ids in a
/// [`CuSet`] are those mask bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XcdGrouping {
    pub xcds: u32,
    pub cus_per_xcd: u32,
}

impl Device {
    /// AMD Instinct MI325X (gfx942): 304 CUs as 8 XCDs of 38, 256 GiB HBM3E.
    pub fn mi325x() -> Device {
        Device {
            name: "mi325x".to_string(),
            compute_units: 304,
            memory_bytes: 256 << 30,
            xcds: Some(XcdGrouping {
                xcds: 8,
                cus_per_xcd: 38,
            }),
        }
    }

    /// The CPU backend: `cores` worker cores (ids 0..cores) and a host-RAM
    /// budget of `memory_bytes`.
    pub fn cpu(cores: u32, memory_bytes: u64) -> Result<Device, PartitionError> {
        if cores == 0 {
            return Err(PartitionError::InvalidDevice {
                reason: "a CPU device needs at least one core".to_string(),
            });
        }
        Ok(Device {
            name: "cpu".to_string(),
            compute_units: cores,
            memory_bytes,
            xcds: None,
        })
    }

    /// What a compute unit is called in messages.
    pub fn unit(&self) -> &'static str {
        if self.xcds.is_some() { "CUs" } else { "cores" }
    }

    /// Every compute unit of the device.
    pub fn all(&self) -> CuSet {
        CuSet::full(self.compute_units)
    }

    /// The XCD compute unit `cu` lands on (`None` without XCDs).
    pub fn xcd_of(&self, cu: u32) -> Option<u32> {
        self.xcds.map(|g| cu % g.xcds)
    }

    /// Every compute unit of XCD `xcd` (empty without XCDs or past the last).
    pub fn xcd(&self, xcd: u32) -> CuSet {
        let mut set = CuSet::empty(self.compute_units);
        if let Some(g) = self.xcds
            && xcd < g.xcds
        {
            for cu in (xcd..self.compute_units).step_by(g.xcds as usize) {
                set.insert(cu);
            }
        }
        set
    }

    /// `count` compute units from `free`, spread evenly over XCDs: taken
    /// round-robin over the XCDs, the lowest free id of each in turn, so the
    /// counts per XCD differ by at most one while every XCD has free units.
    /// Spreading gives a tenant every XCD's L2 and memory channels rather
    /// than a few of them. Without XCDs: the `count` lowest free ids (cores).
    /// `None` if `free` has fewer than `count`.
    pub fn spread(&self, free: &CuSet, count: u32) -> Option<CuSet> {
        if free.len() < count {
            return None;
        }
        let mut taken = CuSet::empty(self.compute_units);
        let Some(g) = self.xcds else {
            for cu in free.iter().take(count as usize) {
                taken.insert(cu);
            }
            return Some(taken);
        };
        let mut per_xcd: Vec<std::vec::IntoIter<u32>> = (0..g.xcds)
            .map(|k| {
                free.iter()
                    .filter(|cu| cu % g.xcds == k)
                    .collect::<Vec<_>>()
                    .into_iter()
            })
            .collect();
        while taken.len() < count {
            for ids in &mut per_xcd {
                if taken.len() == count {
                    break;
                }
                if let Some(cu) = ids.next() {
                    taken.insert(cu);
                }
            }
        }
        Some(taken)
    }
}

/// Cores this process may run on (the CPU device's default size).
pub fn host_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// Cap of [`default_kv_memory_bytes`].
const DEFAULT_KV_MEMORY_CAP_BYTES: u64 = 4 << 30;

/// The gpu-host's KV-cache memory when `--kv-memory` is not given: a
/// quarter of host memory, at most 4 GiB (1 GiB when memory is unknown).
/// The gateway's `policy check` of a `cpu` device without `memory` plans
/// against the same number, so both sides agree.
pub fn default_kv_memory_bytes() -> u64 {
    host_memory_bytes()
        .map_or(1 << 30, |m| m / 4)
        .min(DEFAULT_KV_MEMORY_CAP_BYTES)
}

/// Physical memory (`MemTotal` of `/proc/meminfo`), or `None` where that
/// cannot be read (not Linux, a sandbox).
pub fn host_memory_bytes() -> Option<u64> {
    // meminfo is a few KiB; never read more than this of it.
    const MAX_MEMINFO_BYTES: u64 = 64 << 10;
    let mut text = String::new();
    std::fs::File::open("/proc/meminfo")
        .ok()?
        .take(MAX_MEMINFO_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    parse_mem_total(&text)
}

/// `MemTotal:  16318412 kB` → bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line["MemTotal:".len()..].split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next() == Some("kB"))
        .then_some(kib)?
        .checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mi325x_is_eight_xcds_of_38() {
        let d = Device::mi325x();
        assert_eq!(d.compute_units, 304);
        assert_eq!(d.memory_bytes, 256 << 30);
        assert_eq!(d.unit(), "CUs");
        for k in 0..8 {
            let xcd = d.xcd(k);
            assert_eq!(xcd.len(), 38);
            assert!(xcd.iter().all(|cu| d.xcd_of(cu) == Some(k)));
        }
        assert!(d.xcd(8).is_empty());
        assert!(d.xcd(0).is_disjoint(&d.xcd(1)));
    }

    #[test]
    fn the_cpu_device_counts_cores() {
        let d = Device::cpu(2, 8 << 30).unwrap();
        assert_eq!((d.compute_units, d.unit(), d.xcd_of(1)), (2, "cores", None));
        assert!(Device::cpu(0, 1).is_err());
        let cores = d.spread(&d.all(), 1).unwrap();
        assert_eq!(cores.iter().collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn spread_masks_are_even_over_xcds_and_disjoint() {
        let d = Device::mi325x();
        let mut free = d.all();
        let mut masks = Vec::new();
        for count in [40, 16, 100, 7] {
            let mask = d.spread(&free, count).unwrap();
            assert_eq!(mask.len(), count);
            assert_eq!(mask.width(), 304);
            assert_eq!(mask.hip_mask_words().len(), 10);
            let per_xcd: Vec<u32> = (0..8)
                .map(|k| mask.iter().filter(|cu| cu % 8 == k).count() as u32)
                .collect();
            let (lo, hi) = (per_xcd.iter().min().unwrap(), per_xcd.iter().max().unwrap());
            assert!(hi - lo <= 1, "{count} CUs as {per_xcd:?}");
            assert_eq!(per_xcd.iter().sum::<u32>(), count);
            free.remove_all(&mask);
            masks.push(mask);
        }
        for (i, a) in masks.iter().enumerate() {
            for b in &masks[i + 1..] {
                assert!(a.is_disjoint(b));
            }
        }
        // 40 = 5 per XCD: the first five ids of each XCD, i.e. bits 0..40.
        assert_eq!(masks[0], CuSet::from_ids(304, 0..40));
        assert_eq!(free.len(), 304 - 163);
        assert!(d.spread(&free, 142).is_none());
    }

    #[test]
    fn spreading_fills_what_each_xcd_has_left() {
        let d = Device::mi325x();
        let mut free = d.all();
        free.remove_all(&d.xcd(0));
        free.remove_all(&d.xcd(1));
        let mask = d.spread(&free, 60).unwrap();
        assert!(mask.is_disjoint(&d.xcd(0)) && mask.is_disjoint(&d.xcd(1)));
        for k in 2..8 {
            assert_eq!(mask.iter().filter(|cu| cu % 8 == k).count(), 10);
        }
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let text = "MemFree: 1 kB\nMemTotal:       16318412 kB\n";
        assert_eq!(parse_mem_total(text), Some(16_318_412 * 1024));
        assert_eq!(parse_mem_total("MemTotal: 12 MB\n"), None);
        assert_eq!(parse_mem_total("nothing"), None);
    }
}
