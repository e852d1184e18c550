//! The HIP runtime (`crate::hip`) as a [`KernelDevice`]: the kernels' code
//! object for the device's architecture loaded once per device, every
//! kernel looked up by name, and views of the device (`HipStreams`) that
//! each launch on a stream of their own — on all CUs, or only on a
//! partition's (`hipExtStreamCreateWithCUMask`) — and share its memory.
//! [`open_hip_backend`] and [`open_hip_device`] give one view on every CU;
//! [`open_hip_partitions`] is what `serve` splits among partitions. Without
//! feature `hip` they say the build has no HIP.

use std::sync::Arc;

use bulkhead_kernels::hip::KernelDevice;
use bulkhead_partition::{Device, XcdGrouping, format_bytes};

use super::hip::HipBackend;
use super::partitioned::PartitionedDevice;
use crate::hip::{DeviceProperties, MemoryBudget};

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
    #[error("this bulkhead-gpu-host was built without the `cuda` feature")]
    CudaNotBuilt,
    #[error("{0}")]
    Cuda(String),
    #[error("splitting the device into partitions: {0}")]
    Partitions(String),
}

/// A [`HipBackend`] on device `ordinal` (every CU), its memory charged to `budget`.
pub fn open_hip_backend(
    ordinal: usize,
    budget: Arc<MemoryBudget>,
) -> Result<HipBackend, HipDeviceError> {
    Ok(HipBackend::new(open_hip_device(ordinal, budget)?))
}

/// HIP device `ordinal` with the kernels loaded, as a [`KernelDevice`]
/// launching on one stream over every CU, its allocations charged to
/// `budget` (tests and benchmarks drive it directly).
pub fn open_hip_device(
    ordinal: usize,
    budget: Arc<MemoryBudget>,
) -> Result<Arc<dyn KernelDevice>, HipDeviceError> {
    #[cfg(feature = "hip")]
    {
        use super::budgeted::BudgetedDevice;
        use super::partitioned::StreamSource;
        let streams = runtime::HipStreams::open(ordinal)?;
        let all = bulkhead_partition::CuSet::full(streams.compute_units());
        let view = streams
            .streams_for(&all)
            .map_err(HipDeviceError::Partitions)?;
        Ok(Arc::new(BudgetedDevice::new(view, budget)))
    }
    #[cfg(not(feature = "hip"))]
    {
        let _ = (ordinal, budget);
        Err(HipDeviceError::NotBuilt)
    }
}

/// HIP device `ordinal` for partitions: `partition_memory_bytes` of its
/// memory for the partitions the planner makes, the rest the model
/// reservation (weights, uploaded once and shared).
pub fn open_hip_partitions(
    ordinal: usize,
    partition_memory_bytes: u64,
) -> Result<PartitionedDevice, HipDeviceError> {
    #[cfg(feature = "hip")]
    {
        let streams = Arc::new(runtime::HipStreams::open(ordinal)?);
        let (model, reservation) = planning_device(streams.properties(), partition_memory_bytes)
            .map_err(HipDeviceError::Partitions)?;
        PartitionedDevice::new(model, reservation, streams).map_err(HipDeviceError::Partitions)
    }
    #[cfg(not(feature = "hip"))]
    {
        let _ = (ordinal, partition_memory_bytes);
        Err(HipDeviceError::NotBuilt)
    }
}

/// CUDA device `ordinal` with the kernels loaded, as a [`KernelDevice`]
/// launching on one stream over every SM, its allocations charged to
/// `budget`.
pub fn open_cuda_device(
    ordinal: usize,
    budget: Arc<MemoryBudget>,
) -> Result<Arc<dyn KernelDevice>, HipDeviceError> {
    #[cfg(feature = "cuda")]
    {
        use super::budgeted::BudgetedDevice;
        use super::partitioned::StreamSource;
        let streams = crate::cuda::CudaStreams::open(ordinal).map_err(HipDeviceError::Cuda)?;
        let all = bulkhead_partition::CuSet::full(streams.info().multiprocessors);
        let view = streams
            .streams_for(&all)
            .map_err(HipDeviceError::Partitions)?;
        Ok(Arc::new(BudgetedDevice::new(view, budget)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, budget);
        Err(HipDeviceError::CudaNotBuilt)
    }
}

/// CUDA device `ordinal` for partitions, as [`open_hip_partitions`]: the
/// planner's compute units are its SMs (no XCD grouping), and how apart
/// partitions are kept (green contexts or shared streams) comes back too.
pub fn open_cuda_partitions(
    ordinal: usize,
    partition_memory_bytes: u64,
) -> Result<(PartitionedDevice, crate::cuda::SmIsolation), HipDeviceError> {
    #[cfg(feature = "cuda")]
    {
        let streams = crate::cuda::CudaStreams::open(ordinal).map_err(HipDeviceError::Cuda)?;
        let info = streams.info().clone();
        let isolation = streams.isolation().clone();
        let reservation = info
            .total_memory_bytes
            .checked_sub(partition_memory_bytes)
            .filter(|r| *r > 0)
            .ok_or_else(|| {
                HipDeviceError::Partitions(format!(
                    "{} has {} of memory; the partitions' {} leave none for the weights",
                    info.label(),
                    format_bytes(info.total_memory_bytes),
                    format_bytes(partition_memory_bytes)
                ))
            })?;
        let model = Device {
            name: info.label(),
            compute_units: info.multiprocessors,
            memory_bytes: info.total_memory_bytes,
            xcds: None,
        };
        let split = PartitionedDevice::new(model, reservation, Arc::new(streams))
            .map_err(HipDeviceError::Partitions)?;
        Ok((split, isolation))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, partition_memory_bytes);
        Err(HipDeviceError::CudaNotBuilt)
    }
}

#[cfg(feature = "cuda")]
impl super::partitioned::StreamSource for crate::cuda::CudaStreams {
    fn describe(&self) -> String {
        self.info().label()
    }

    fn streams_for(
        &self,
        cus: &bulkhead_partition::CuSet,
    ) -> Result<Arc<dyn KernelDevice>, String> {
        self.view(cus)
    }

    fn isolation(&self) -> String {
        crate::cuda::CudaStreams::isolation(self).describe()
    }
}

/// Active CUs of one XCD on MI300X, MI325X and MI300A (304 = 8 × 38,
/// 228 = 6 × 38): how many XCDs a device of theirs spans, whole or in a
/// DPX/QPX hardware partition (152 = 4 × 38, 76 = 2 × 38).
const MI300_CUS_PER_XCD: u32 = 38;

/// The planner's model of a device: its CUs, with the MI300 XCD grouping
/// when the part is MI300-class (gfx940/941/942) and its CUs are whole
/// XCDs of 38 — the CU mask then interleaves them, bit `i` on XCD
/// `i % xcds` (on a whole MI325X `i % 8`); a CPX device is one XCD and
/// needs no grouping — its memory, and the model reservation: what
/// `partition_memory_bytes` leaves.
pub fn planning_device(
    props: &DeviceProperties,
    partition_memory_bytes: u64,
) -> Result<(Device, u64), String> {
    let label = super::DeviceLabel::of(props);
    let reservation = props
        .total_memory_bytes
        .checked_sub(partition_memory_bytes)
        .filter(|r| *r > 0)
        .ok_or_else(|| {
            format!(
                "{label} has {} of memory; the partitions' {} leave none for the weights",
                format_bytes(props.total_memory_bytes),
                format_bytes(partition_memory_bytes)
            )
        })?;
    let mi300 = ["gfx940", "gfx941", "gfx942"].contains(&props.arch());
    let whole_xcds = props.compute_units / MI300_CUS_PER_XCD;
    let xcds = (mi300 && props.compute_units.is_multiple_of(MI300_CUS_PER_XCD) && whole_xcds > 1)
        .then_some(XcdGrouping {
            xcds: whole_xcds,
            cus_per_xcd: MI300_CUS_PER_XCD,
        });
    let model = Device {
        name: label.to_string(),
        compute_units: props.compute_units,
        memory_bytes: props.total_memory_bytes,
        xcds,
    };
    Ok((model, reservation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mi325x_is_planned_as_8_xcds_with_the_rest_for_weights() {
        let props = crate::hip::test_mi325x();
        let (model, reservation) = planning_device(&props, 64 << 30).unwrap();
        assert_eq!(model.compute_units, 304);
        assert_eq!(
            model.xcds,
            Some(XcdGrouping {
                xcds: 8,
                cus_per_xcd: 38
            })
        );
        assert_eq!(model.memory_bytes, props.total_memory_bytes);
        assert_eq!(reservation, props.total_memory_bytes - (64 << 30));
        assert_eq!(model.name, "HIP device 0 (AMD Instinct MI325X, gfx942)");
    }

    #[test]
    fn a_dpx_partition_is_4_xcds_of_38() {
        let dpx = DeviceProperties {
            compute_units: 152,
            ..crate::hip::test_mi325x()
        };
        let (model, _) = planning_device(&dpx, 1 << 30).unwrap();
        assert_eq!(
            model.xcds,
            Some(XcdGrouping {
                xcds: 4,
                cus_per_xcd: 38
            })
        );
        assert_eq!(model.xcd(3).len(), 38);
    }

    #[test]
    fn a_cpx_partition_or_another_arch_has_no_xcd_grouping() {
        let cpx = DeviceProperties {
            compute_units: 38,
            ..crate::hip::test_mi325x()
        };
        assert_eq!(planning_device(&cpx, 1 << 30).unwrap().0.xcds, None);
        let mi250 = DeviceProperties {
            gcn_arch_name: "gfx90a:sramecc+:xnack-".into(),
            compute_units: 104,
            ..crate::hip::test_mi325x()
        };
        assert_eq!(planning_device(&mi250, 1 << 30).unwrap().0.xcds, None);
        // An MI300-class count that is not whole XCDs of 38 (a cut-down part).
        let odd = DeviceProperties {
            compute_units: 80,
            ..crate::hip::test_mi325x()
        };
        assert_eq!(planning_device(&odd, 1 << 30).unwrap().0.xcds, None);
    }

    #[test]
    fn partitions_taking_all_the_memory_are_refused() {
        let props = DeviceProperties {
            total_memory_bytes: 8 << 30,
            ..crate::hip::test_mi325x()
        };
        assert_eq!(
            planning_device(&props, 8 << 30).unwrap_err(),
            "HIP device 0 (AMD Instinct MI325X, gfx942) has 8GiB of memory; the partitions' \
             8GiB leave none for the weights"
        );
        assert!(planning_device(&props, 9 << 30).is_err());
    }
}

#[cfg(feature = "hip")]
#[allow(unsafe_code)]
mod runtime {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Arc, Mutex, Weak};

    use bulkhead_kernels::hip::{DeviceError, KernelDevice, code_object_for, names};
    use bulkhead_partition::CuSet;

    use super::HipDeviceError;
    use crate::backend::partitioned::StreamSource;
    use crate::hip::{
        Device, DeviceBuffer, DeviceProperties, Function, KernelArgs, MemoryBudget, Module, Stream,
    };

    /// One HIP device with the kernels loaded: what every view shares.
    struct Core {
        device: Device,
        functions: HashMap<&'static str, Function>,
        /// The whole device's memory, a backstop under the views' own
        /// budgets (partitions, model reservation).
        budget: Arc<MemoryBudget>,
        /// Every live allocation of every view, by device address.
        buffers: Mutex<BTreeMap<u64, DeviceBuffer<u8>>>,
        /// Every view's stream. A free waits for all of them first, so no
        /// allocation is freed under queued work of any view (weights are
        /// read by every partition's stream); frees happen at load and
        /// unload, never in a step's steady state.
        streams: Mutex<Vec<Weak<Stream>>>,
        /// Keeps the code object loaded (the functions hold it too).
        _module: Module,
    }

    /// The device's views come from here.
    pub struct HipStreams {
        core: Arc<Core>,
    }

    impl std::fmt::Debug for HipStreams {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HipStreams")
                .field("device", &self.describe())
                .finish_non_exhaustive()
        }
    }

    impl HipStreams {
        /// Device `ordinal` with the code object of its architecture loaded.
        pub fn open(ordinal: usize) -> Result<HipStreams, HipDeviceError> {
            let device = Device::open(ordinal)?;
            let code = code_object_for(device.properties().arch())?;
            let module = Module::load(&device, code.bytes)?;
            let mut functions = HashMap::new();
            for name in names::ALL {
                functions.insert(name, module.function(name)?);
            }
            let props = device.properties();
            let budget = MemoryBudget::new(
                format!("HIP device {}", props.ordinal),
                props.total_memory_bytes,
            );
            Ok(HipStreams {
                core: Arc::new(Core {
                    device,
                    functions,
                    budget,
                    buffers: Mutex::new(BTreeMap::new()),
                    streams: Mutex::new(Vec::new()),
                    _module: module,
                }),
            })
        }

        pub fn properties(&self) -> &DeviceProperties {
            self.core.device.properties()
        }

        pub fn compute_units(&self) -> u32 {
            self.properties().compute_units
        }
    }

    impl StreamSource for HipStreams {
        fn describe(&self) -> String {
            let p = self.properties();
            format!("{} {} #{}", p.name, p.arch(), p.ordinal)
        }

        /// A stream on exactly the CUs of `cus` (all of them: a plain
        /// stream; else `hipExtStreamCreateWithCUMask`, mask bit `i` for
        /// id `i`).
        fn streams_for(&self, cus: &CuSet) -> Result<Arc<dyn KernelDevice>, String> {
            let stream = if *cus == CuSet::full(self.compute_units()) {
                Stream::new(&self.core.device)
            } else {
                Stream::for_cu_set(&self.core.device, cus)
            }
            .map_err(|e| e.to_string())?;
            let stream = Arc::new(stream);
            let mut streams = self.core.streams.lock().unwrap_or_else(|p| p.into_inner());
            streams.retain(|s| s.strong_count() > 0);
            streams.push(Arc::downgrade(&stream));
            Ok(Arc::new(HipView {
                core: Arc::clone(&self.core),
                stream,
                staged: Mutex::new(Vec::new()),
            }))
        }
    }

    /// One view: the device's kernels and memory, with its own stream.
    /// Copies and launches are queued on the stream and return at once; a
    /// read (or [`KernelDevice::synchronize`]) waits for the stream, the
    /// one synchronization of a step.
    struct HipView {
        core: Arc<Core>,
        stream: Arc<Stream>,
        /// The host bytes of copies queued and not yet known done: kept
        /// alive until the stream is next synchronized, as an async copy
        /// from host memory requires.
        staged: Mutex<Vec<Vec<u8>>>,
    }

    impl std::fmt::Debug for HipView {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HipView")
                .field("device", &self.describe())
                .field("cu_mask", &self.stream.cu_mask())
                .finish_non_exhaustive()
        }
    }

    impl HipView {
        /// Runs `f` on the allocation holding `[addr, addr + len)` and the
        /// offset of `addr` in it.
        fn with_buffer<R>(
            &self,
            what: &str,
            addr: u64,
            len: usize,
            f: impl FnOnce(&mut DeviceBuffer<u8>, usize) -> Result<R, crate::hip::HipError>,
        ) -> Result<R, DeviceError> {
            let mut buffers = self.core.buffers.lock().unwrap_or_else(|p| p.into_inner());
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
            f(buffer, offset).map_err(|e| e.to_device_error(what))
        }
    }

    impl KernelDevice for HipView {
        fn describe(&self) -> String {
            let p = self.core.device.properties();
            let cus = self.stream.cu_mask().map_or(p.compute_units, |words| {
                words.iter().map(|w| w.count_ones()).sum()
            });
            format!("{} {} #{}, {cus} CUs", p.name, p.arch(), p.ordinal)
        }

        fn wave_size(&self) -> u32 {
            self.core.device.properties().warp_size
        }

        fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
            let what = format!("alloc {bytes} bytes");
            let core = &self.core;
            let buffer = DeviceBuffer::<u8>::zeroed(&core.device, bytes.max(1), &core.budget)
                .map_err(|e| e.to_device_error(&what))?;
            let addr = buffer.device_ptr().addr();
            core.buffers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr, buffer);
            Ok(addr)
        }

        /// Waits for every view's stream first (see `Core::streams`).
        fn free(&self, addr: u64) -> Result<(), DeviceError> {
            let what = format!("free {addr:#x}");
            let streams: Vec<Arc<Stream>> = {
                let streams = self.core.streams.lock().unwrap_or_else(|p| p.into_inner());
                streams.iter().filter_map(Weak::upgrade).collect()
            };
            for stream in &streams {
                stream.synchronize().map_err(|e| e.to_device_error(&what))?;
            }
            let mut buffers = self.core.buffers.lock().unwrap_or_else(|p| p.into_inner());
            buffers
                .remove(&addr)
                .map(drop)
                .ok_or_else(|| DeviceError::new(what, "not an allocation"))
        }

        fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
            let what = format!("write {} bytes at {addr:#x}", bytes.len());
            let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
            staged.push(bytes.to_vec());
            let src = staged.last().expect("just pushed");
            // SAFETY: `src` lives in `staged` (a heap buffer that moving the
            // Vec does not move) until the stream is synchronized, and
            // the allocation stays in `core.buffers` until a free, which
            // waits for this stream first.
            self.with_buffer(&what, addr, bytes.len(), |b, at| unsafe {
                b.copy_from_host_async(at, src, &self.stream)
            })
        }

        /// Queues the copy behind everything queued before it and waits
        /// for the stream.
        fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            let what = format!("read {} bytes at {addr:#x}", out.len());
            // SAFETY: `out` is not touched until the stream is synchronized
            // right below (also when queuing failed: nothing then writes it).
            let queued = self.with_buffer(&what, addr, out.len(), |b, at| unsafe {
                b.copy_to_host_async(at, out, &self.stream)
            });
            let synced = self.synchronize();
            queued.and(synced)
        }

        fn synchronize(&self) -> Result<(), DeviceError> {
            let synced = self
                .stream
                .synchronize()
                .map_err(|e| e.to_device_error("synchronize"));
            self.staged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            synced
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
                .core
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
            // SAFETY: `args` is the kernel's own args.h struct, encoded field
            // by field by bulkhead_kernels::hip::KernelArgs (sizes asserted on
            // both sides; the runtime copies them at the call). Its pointers
            // are addresses of allocations in `core.buffers`, sized by
            // HipBackend's shape checks for this grid; an allocation leaves
            // `core.buffers` only in a free, which first waits for every
            // view's stream, so none is freed under the queued kernel. What
            // the kernel writes is the calling backend's own workspace and
            // KV pool, which no other view's stream touches (each
            // partition's backend allocates its own); weights, which every
            // view reads, are written only by copies synchronized before
            // first use (`DeviceWeights`).
            unsafe {
                function.launch(
                    (grid[0], grid[1], grid[2]),
                    threads,
                    0,
                    &self.stream,
                    &packed,
                )
            }
            .map_err(|e| e.to_device_error(&what))
        }
    }
}
