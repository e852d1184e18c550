//! The HIP runtime (`crate::hip`) as a [`KernelDevice`]: the kernels' code
//! object for the device's architecture loaded once, every kernel looked
//! up by name, device memory charged to a [`MemoryBudget`], launches on one
//! stream and waited for. [`open_hip_backend`] is what backend selection
//! calls; without feature `hip` it says the build has no HIP.

use std::sync::Arc;

use bulkhead_kernels::hip::KernelDevice;

use crate::hip::MemoryBudget;

use super::hip_backend::HipBackend;

/// Why the HIP backend could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum HipDeviceError {
    #[error("this bulkhead-gpu-host was built without the `hip` feature")]
    NotBuilt,
    #[cfg(feature = "hip")]
    #[error(transparent)]
    Hip(#[from] crate::hip::HipError),
    #[error(transparent)]
    CodeObject(#[from] bulkhead_kernels::hip::CodeObjectError),
}

/// A [`HipBackend`] on device `ordinal`, its memory charged to `budget`.
pub fn open_hip_backend(
    ordinal: usize,
    budget: Arc<MemoryBudget>,
) -> Result<HipBackend, HipDeviceError> {
    Ok(HipBackend::new(open_hip_device(ordinal, budget)?))
}

/// HIP device `ordinal` with the kernels loaded, as a [`KernelDevice`]
/// (tests and benchmarks drive it directly).
pub fn open_hip_device(
    ordinal: usize,
    budget: Arc<MemoryBudget>,
) -> Result<Arc<dyn KernelDevice>, HipDeviceError> {
    #[cfg(feature = "hip")]
    {
        Ok(Arc::new(runtime::HipDevice::open(ordinal, budget)?))
    }
    #[cfg(not(feature = "hip"))]
    {
        let _ = (ordinal, budget);
        Err(HipDeviceError::NotBuilt)
    }
}

#[cfg(feature = "hip")]
#[allow(unsafe_code)]
mod runtime {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Arc, Mutex};

    use bulkhead_kernels::hip::{DeviceError, KernelDevice, code_object_for, names};

    use super::HipDeviceError;
    use crate::hip::{Device, DeviceBuffer, Function, KernelArgs, MemoryBudget, Module, Stream};

    /// One HIP device with the kernels loaded.
    pub struct HipDevice {
        device: Device,
        functions: HashMap<&'static str, Function>,
        stream: Stream,
        budget: Arc<MemoryBudget>,
        /// Every live allocation, by device address.
        buffers: Mutex<BTreeMap<u64, DeviceBuffer<u8>>>,
        /// Keeps the code object loaded (the functions hold it too).
        _module: Module,
    }

    impl std::fmt::Debug for HipDevice {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HipDevice")
                .field("device", &self.describe())
                .finish_non_exhaustive()
        }
    }

    impl HipDevice {
        pub fn open(
            ordinal: usize,
            budget: Arc<MemoryBudget>,
        ) -> Result<HipDevice, HipDeviceError> {
            let device = Device::open(ordinal)?;
            let code = code_object_for(device.properties().arch())?;
            let module = Module::load(&device, code.bytes)?;
            let mut functions = HashMap::new();
            for name in names::ALL {
                functions.insert(name, module.function(name)?);
            }
            let stream = Stream::new(&device)?;
            Ok(HipDevice {
                device,
                functions,
                stream,
                budget,
                buffers: Mutex::new(BTreeMap::new()),
                _module: module,
            })
        }

        /// Runs `f` on the allocation holding `[addr, addr + len)` and the
        /// offset of `addr` in it.
        fn with_buffer<R>(
            &self,
            what: &str,
            addr: u64,
            len: usize,
            f: impl FnOnce(&mut DeviceBuffer<u8>, usize) -> Result<R, crate::hip::HipError>,
        ) -> Result<R, DeviceError> {
            let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
            let (&start, buffer) = buffers
                .range_mut(..=addr)
                .next_back()
                .ok_or_else(|| DeviceError::new(what, "address outside every allocation"))?;
            let offset = (addr - start) as usize;
            if offset + len > buffer.len() {
                return Err(DeviceError::new(
                    what,
                    "range past the end of its allocation",
                ));
            }
            f(buffer, offset).map_err(|e| DeviceError::new(what, e.to_string()))
        }
    }

    impl KernelDevice for HipDevice {
        fn describe(&self) -> String {
            let p = self.device.properties();
            format!("{} {} #{}", p.name, p.arch(), p.ordinal)
        }

        fn wave_size(&self) -> u32 {
            self.device.properties().warp_size
        }

        fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
            let what = format!("alloc {bytes} bytes");
            let buffer = DeviceBuffer::<u8>::zeroed(&self.device, bytes.max(1), &self.budget)
                .map_err(|e| DeviceError::new(&what, e.to_string()))?;
            let addr = buffer.device_ptr().addr();
            self.buffers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr, buffer);
            Ok(addr)
        }

        fn free(&self, addr: u64) -> Result<(), DeviceError> {
            let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
            buffers
                .remove(&addr)
                .map(drop)
                .ok_or_else(|| DeviceError::new(format!("free {addr:#x}"), "not an allocation"))
        }

        fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
            let what = format!("write {} bytes at {addr:#x}", bytes.len());
            self.with_buffer(&what, addr, bytes.len(), |b, at| {
                b.copy_from_host_at(at, bytes)
            })
        }

        fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            let what = format!("read {} bytes at {addr:#x}", out.len());
            self.with_buffer(&what, addr, out.len(), |b, at| b.copy_to_host_at(at, out))
        }

        fn launch(
            &self,
            kernel: &str,
            grid: [u32; 3],
            threads: u32,
            args: &[u8],
        ) -> Result<(), DeviceError> {
            let what = format!("launch {kernel}");
            let function = self
                .functions
                .get(kernel)
                .ok_or_else(|| DeviceError::new(&what, "not a kernel of kernels/hip"))?;
            // Every kernel takes one args.h struct: 8-byte aligned, a
            // multiple of 8 bytes, no padding. Pushed as u64 words it packs
            // to exactly the struct's bytes.
            if !args.len().is_multiple_of(8) {
                return Err(DeviceError::new(
                    &what,
                    "argument block is not whole 8-byte words",
                ));
            }
            let mut packed = KernelArgs::new();
            for word in args.chunks_exact(8) {
                packed.push(u64::from_le_bytes(word.try_into().expect("8 bytes")));
            }
            let hold = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: `args` is the kernel's own args.h struct, encoded field
            // by field by bulkhead_kernels::hip::KernelArgs (sizes asserted on
            // both sides). Its pointers are addresses of allocations in
            // `buffers`, sized by HipBackend's shape checks for this grid.
            // `hold` keeps every allocation alive (no free can run) until
            // the stream is synchronized below, and nothing else uses the
            // stream or the buffers meanwhile.
            let launched = unsafe {
                function.launch(
                    (grid[0], grid[1], grid[2]),
                    threads,
                    0,
                    &self.stream,
                    &packed,
                )
            };
            let synced = launched.and_then(|()| self.stream.synchronize());
            drop(hold);
            synced.map_err(|e| DeviceError::new(&what, e.to_string()))
        }
    }
}
