//! What the runtime says about a device, as plain data (also in builds
//! without HIP, so the CLI and the backend choice need no cfg).

use serde::Serialize;

/// One HIP device as `hipGetDeviceProperties` and `hipMemGetInfo` describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceProperties {
    /// The HIP ordinal (`hipSetDevice`); a hardware partition (CPX, NPS4)
    /// is a device of its own.
    pub ordinal: usize,
    /// Marketing name, e.g. "AMD Instinct MI325X".
    pub name: String,
    /// The ISA and its features, e.g. "gfx942:sramecc+:xnack-".
    pub gcn_arch_name: String,
    /// Compute units (`multiProcessorCount`): the width of a CU mask.
    pub compute_units: u32,
    /// Threads in a wavefront: 64 on CDNA, 32 on RDNA.
    pub warp_size: u32,
    pub total_memory_bytes: u64,
    /// Free device memory when these properties were read.
    pub free_memory_bytes: u64,
    pub max_threads_per_block: u32,
    /// Largest block per dimension.
    pub max_block_dims: [u32; 3],
    /// Largest grid per dimension.
    pub max_grid_dims: [u32; 3],
    pub shared_memory_per_block_bytes: u64,
    pub l2_cache_bytes: u64,
    pub clock_rate_khz: u32,
    pub memory_clock_rate_khz: u32,
    pub memory_bus_width_bits: u32,
    /// PCI location `domain:bus:device`.
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

/// Above any GPU HIP runs on (MI325X: 304); a larger count means the
/// properties were read with the wrong struct layout.
const MAX_PLAUSIBLE_COMPUTE_UNITS: u32 = 4096;

impl DeviceProperties {
    /// The ISA without feature flags: "gfx942" for "gfx942:sramecc+:xnack-".
    pub fn arch(&self) -> &str {
        self.gcn_arch_name
            .split(':')
            .next()
            .unwrap_or(&self.gcn_arch_name)
    }

    /// Refuses properties no real device has: garbage from a mismatched
    /// `hipDeviceProp_t` layout must not size CU masks or launches.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("empty name".into());
        }
        if !self.arch().starts_with("gfx") {
            return Err(format!(
                "gcnArchName {:?} is not a gfxNNN ISA",
                self.gcn_arch_name
            ));
        }
        if !(1..=MAX_PLAUSIBLE_COMPUTE_UNITS).contains(&self.compute_units) {
            return Err(format!("{} compute units", self.compute_units));
        }
        if !matches!(self.warp_size, 32 | 64) {
            return Err(format!("warp size {}", self.warp_size));
        }
        if self.total_memory_bytes == 0 || self.free_memory_bytes > self.total_memory_bytes {
            return Err(format!(
                "{} bytes free of {} total",
                self.free_memory_bytes, self.total_memory_bytes
            ));
        }
        if self.max_threads_per_block == 0 || self.max_block_dims.contains(&0) {
            return Err("a zero block limit".into());
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What an MI325X reports (from its documented figures; not read from
    /// hardware here).
    pub(crate) fn mi325x() -> DeviceProperties {
        DeviceProperties {
            ordinal: 0,
            name: "AMD Instinct MI325X".into(),
            gcn_arch_name: "gfx942:sramecc+:xnack-".into(),
            compute_units: 304,
            warp_size: 64,
            total_memory_bytes: 256 << 30,
            free_memory_bytes: 255 << 30,
            max_threads_per_block: 1024,
            max_block_dims: [1024, 1024, 1024],
            max_grid_dims: [i32::MAX as u32; 3],
            shared_memory_per_block_bytes: 64 << 10,
            l2_cache_bytes: 4 << 20,
            clock_rate_khz: 2_100_000,
            memory_clock_rate_khz: 1_300_000,
            memory_bus_width_bits: 8192,
            pci_domain: 0,
            pci_bus: 0x0c,
            pci_device: 0,
        }
    }

    #[test]
    fn arch_drops_the_feature_flags() {
        assert_eq!(mi325x().arch(), "gfx942");
        let plain = DeviceProperties {
            gcn_arch_name: "gfx90a".into(),
            ..mi325x()
        };
        assert_eq!(plain.arch(), "gfx90a");
    }

    #[test]
    fn impossible_properties_are_refused_by_name() {
        assert_eq!(mi325x().check(), Ok(()));
        let cases = [
            (
                DeviceProperties {
                    compute_units: 0,
                    ..mi325x()
                },
                "0 compute units",
            ),
            (
                DeviceProperties {
                    warp_size: 48,
                    ..mi325x()
                },
                "warp size 48",
            ),
            (
                DeviceProperties {
                    gcn_arch_name: "\u{1}\u{2}".into(),
                    ..mi325x()
                },
                "is not a gfxNNN ISA",
            ),
            (
                DeviceProperties {
                    free_memory_bytes: 300 << 30,
                    ..mi325x()
                },
                "bytes free of",
            ),
        ];
        for (props, expected) in cases {
            let err = props.check().unwrap_err();
            assert!(err.contains(expected), "{err:?} should say {expected:?}");
        }
    }
}
