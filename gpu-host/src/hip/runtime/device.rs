//! Devices: enumeration, properties, making one current.

use std::ffi::{CStr, c_char};
use std::mem::MaybeUninit;

use bulkhead_hip_sys as sys;

use super::{HipError, check, device_count};
use crate::hip::props::DeviceProperties;

/// A HIP device this process may use. Cheap to clone (an ordinal and its
/// properties). HIP's "current device" is per thread, so every call here
/// that creates something on the device first makes it current.
#[derive(Clone, Debug)]
pub struct Device {
    props: DeviceProperties,
}

/// Device memory as `hipMemGetInfo` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// Every visible device, in ordinal order: never an empty list, "nothing
/// to run on" is an error for which [`HipError::is_no_device`] holds.
pub fn devices() -> Result<Vec<DeviceProperties>, HipError> {
    let count = device_count()?;
    (0..count).map(read_properties).collect()
}

impl Device {
    /// Device `ordinal`, after checking it exists and reading its properties.
    pub fn open(ordinal: usize) -> Result<Device, HipError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(HipError::NoSuchDevice { ordinal, count });
        }
        Ok(Device {
            props: read_properties(ordinal)?,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.props.ordinal
    }

    /// The properties read when the device was opened (free memory then).
    pub fn properties(&self) -> &DeviceProperties {
        &self.props
    }

    /// Free and total memory now.
    pub fn memory_info(&self) -> Result<MemoryInfo, HipError> {
        self.make_current()?;
        memory_info()
    }

    /// Makes this device current on the calling thread (`hipSetDevice`).
    pub fn make_current(&self) -> Result<(), HipError> {
        set_device(self.ordinal())
    }
}

fn set_device(ordinal: usize) -> Result<(), HipError> {
    let id = i32::try_from(ordinal).map_err(|_| HipError::NoSuchDevice {
        ordinal,
        count: i32::MAX as usize,
    })?;
    // SAFETY: plain value argument; an invalid id is an error code.
    check("hipSetDevice", unsafe { sys::hipSetDevice(id) })
}

/// `hipMemGetInfo` for the current device.
fn memory_info() -> Result<MemoryInfo, HipError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers for the call.
    check("hipMemGetInfo", unsafe {
        sys::hipMemGetInfo(&mut free, &mut total)
    })?;
    Ok(MemoryInfo {
        free_bytes: free as u64,
        total_bytes: total as u64,
    })
}

/// `hipGetDeviceProperties` (R0600 on ROCm 6) and `hipMemGetInfo`,
/// converted and checked for sense.
fn read_properties(ordinal: usize) -> Result<DeviceProperties, HipError> {
    set_device(ordinal)?;
    let mut raw = MaybeUninit::<sys::hipDeviceProp_t>::zeroed();
    // SAFETY: `raw` is a writable hipDeviceProp_t of the layout these
    // bindings were generated for (the build warns when they come from
    // other headers, and `check` below refuses garbage); the id was just
    // accepted by hipSetDevice.
    check("hipGetDeviceProperties", unsafe {
        sys::hipGetDeviceProperties(raw.as_mut_ptr(), ordinal as i32)
    })?;
    // SAFETY: zeroed is a valid bit pattern for this plain C struct, and
    // the call filled it in.
    let raw = unsafe { raw.assume_init() };
    let memory = memory_info()?;
    let bad = |what: String| HipError::BadProperties { ordinal, what };
    let unsigned = |field: &str, value: i32| {
        u32::try_from(value).map_err(|_| bad(format!("{field} = {value}")))
    };
    let dims = |field: &str, values: [i32; 3]| -> Result<[u32; 3], HipError> {
        let mut out = [0; 3];
        for (o, v) in out.iter_mut().zip(values) {
            *o = unsigned(field, v)?;
        }
        Ok(out)
    };
    let props = DeviceProperties {
        ordinal,
        name: c_text(&raw.name).ok_or_else(|| bad("name is not NUL-terminated".into()))?,
        gcn_arch_name: c_text(&raw.gcnArchName)
            .ok_or_else(|| bad("gcnArchName is not NUL-terminated".into()))?,
        compute_units: unsigned("multiProcessorCount", raw.multiProcessorCount)?,
        warp_size: unsigned("warpSize", raw.warpSize)?,
        total_memory_bytes: raw.totalGlobalMem as u64,
        free_memory_bytes: memory.free_bytes,
        max_threads_per_block: unsigned("maxThreadsPerBlock", raw.maxThreadsPerBlock)?,
        max_block_dims: dims("maxThreadsDim", raw.maxThreadsDim)?,
        max_grid_dims: dims("maxGridSize", raw.maxGridSize)?,
        shared_memory_per_block_bytes: raw.sharedMemPerBlock as u64,
        l2_cache_bytes: u64::from(unsigned("l2CacheSize", raw.l2CacheSize)?),
        clock_rate_khz: unsigned("clockRate", raw.clockRate)?,
        memory_clock_rate_khz: unsigned("memoryClockRate", raw.memoryClockRate)?,
        memory_bus_width_bits: unsigned("memoryBusWidth", raw.memoryBusWidth)?,
        pci_domain: unsigned("pciDomainID", raw.pciDomainID)?,
        pci_bus: unsigned("pciBusID", raw.pciBusID)?,
        pci_device: unsigned("pciDeviceID", raw.pciDeviceID)?,
    };
    props.check().map_err(bad)?;
    Ok(props)
}

/// A fixed-size C string field, up to its NUL; `None` without one.
fn c_text(field: &[c_char]) -> Option<String> {
    // SAFETY: c_char and u8 have the same size and alignment.
    let bytes = unsafe { std::slice::from_raw_parts(field.as_ptr().cast::<u8>(), field.len()) };
    let text = CStr::from_bytes_until_nul(bytes).ok()?;
    Some(text.to_string_lossy().into_owned())
}
