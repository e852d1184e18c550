//! The CUDA driver API through cudarc's raw bindings (loaded at run time):
//! device listing, the kernels' fatbin as one context-independent library
//! (`cuLibraryLoadData`, so a kernel launches in the primary context and
//! in every green context alike), and views of the device on a stream of
//! their own — all SMs, or a partition's green context.
//!
//! Every call first makes the view's context current on the calling
//! thread, so any thread may drive any view.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, Weak};

use bulkhead_kernels::hip::{CUDA_FATBIN, DeviceError, DeviceErrorKind, KernelDevice, names};
use bulkhead_partition::CuSet;
use cudarc::driver::sys;

use super::{CudaDeviceInfo, SmGroups, SmIsolation};

/// The driver version green contexts need (12.4).
const GREEN_CONTEXTS_SINCE: i32 = 12040;

/// A failed driver call: the call and the driver's name for the code.
#[derive(Debug)]
struct CallError {
    call: &'static str,
    code: sys::CUresult,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {:?}", self.call, self.code)
    }
}

impl CallError {
    /// What the failure means for the work around it: memory, a refusal,
    /// or a context the device can no longer run (sticky errors).
    fn kind(&self) -> DeviceErrorKind {
        let name = format!("{:?}", self.code);
        if name == "CUDA_ERROR_OUT_OF_MEMORY" {
            return DeviceErrorKind::OutOfMemory;
        }
        const LOST: &[&str] = &[
            "ILLEGAL_ADDRESS",
            "LAUNCH_FAILED",
            "ILLEGAL_INSTRUCTION",
            "MISALIGNED_ADDRESS",
            "INVALID_ADDRESS_SPACE",
            "INVALID_PC",
            "HARDWARE_STACK_ERROR",
            "LAUNCH_TIMEOUT",
            "ECC_UNCORRECTABLE",
            "CONTEXT_IS_DESTROYED",
            "DEVICE_UNAVAILABLE",
            "SYSTEM_NOT_READY",
            "DEINITIALIZED",
        ];
        if LOST.iter().any(|l| name.ends_with(l)) {
            DeviceErrorKind::Lost
        } else {
            DeviceErrorKind::Failed
        }
    }

    fn to_device_error(&self, what: &str) -> DeviceError {
        DeviceError::of_kind(self.kind(), what, self.to_string())
    }
}

fn check(call: &'static str, code: sys::CUresult) -> Result<(), CallError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CallError { call, code })
    }
}

/// Loads the driver library and initializes it, once; the reason when
/// there is none (no NVIDIA driver is not an error of ours to panic on).
fn init() -> Result<(), String> {
    static INIT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to open the library; cudarc would panic on
        // first use without it, so nothing else is called before this.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver: libcuda.so could not be loaded \
                        (install the NVIDIA driver; run `nvidia-smi` to check)"
                .into());
        }
        // SAFETY: plain driver call with no pointers.
        check("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| format!("no CUDA device: {e}"))
    })
    .clone()
}

/// Whether the loaded driver exports `name` (newer entry points such as
/// green contexts are missing from older drivers, and cudarc would panic).
fn has_symbol(name: &str) -> bool {
    // SAFETY: the library was loaded by `init`; looking a symbol up does
    // not call it.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
}

fn driver_version() -> Result<i32, CallError> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<u32, CallError> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; `dev` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v.max(0) as u32)
}

/// The primary context of `dev`, retained (released on drop).
struct Primary {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl Primary {
    fn retain(dev: sys::CUdevice) -> Result<Primary, CallError> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        Ok(Primary { dev, ctx })
    }

    fn make_current(&self) -> Result<(), CallError> {
        // SAFETY: `ctx` is retained while `self` lives.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // SAFETY: releases the retain of `Primary::retain`, once.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

fn info(ordinal: usize) -> Result<(CudaDeviceInfo, Primary), CallError> {
    let mut dev = 0;
    // SAFETY: `dev` is a valid out-pointer.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: `name` holds 256 chars; the driver writes a NUL-terminated name.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
    })?;
    // SAFETY: NUL-terminated by the driver, inside the array.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    use sys::CUdevice_attribute as A;
    let major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let primary = Primary::retain(dev)?;
    primary.make_current()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers, with the device's primary context current.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    let version = driver_version()?;
    let info = CudaDeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        multiprocessors: sms,
        free_memory_bytes: free as u64,
        total_memory_bytes: total as u64,
        driver_version: version.max(0) as u32,
        green_contexts: version >= GREEN_CONTEXTS_SINCE && has_symbol("cuGreenCtxCreate"),
    };
    Ok((info, primary))
}

/// Every CUDA device, or why there are none.
pub fn devices() -> Result<Vec<CudaDeviceInfo>, String> {
    init()?;
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })
    .map_err(|e| e.to_string())?;
    (0..count.max(0) as usize)
        .map(|i| info(i).map(|(info, _)| info).map_err(|e| e.to_string()))
        .collect()
}

/// A stream of a view, in the primary context or its own green context.
struct Stream {
    raw: sys::CUstream,
    /// The context work on it is queued in.
    ctx: sys::CUcontext,
    green: Option<sys::CUgreenCtx>,
    sms: u32,
}

// SAFETY: CUDA streams and contexts are thread-safe handles: work may be
// queued on and synchronized with a stream from any thread once its
// context is current there, which every call below makes it.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    fn make_current(&self) -> Result<(), CallError> {
        // SAFETY: `ctx` lives as long as the primary retain or the green
        // context this stream holds.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    fn synchronize(&self) -> Result<(), CallError> {
        self.make_current()?;
        // SAFETY: our live stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: our stream and green context, destroyed once, the stream
        // first; the driver waits for queued work before releasing it.
        unsafe {
            sys::cuStreamDestroy_v2(self.raw);
            if let Some(green) = self.green {
                sys::cuGreenCtxDestroy(green);
            }
        }
    }
}

struct Core {
    info: CudaDeviceInfo,
    primary: Primary,
    _library: Library,
    kernels: HashMap<&'static str, sys::CUkernel>,
    /// Allocations by address, with their sizes.
    buffers: Mutex<BTreeMap<u64, usize>>,
    streams: Mutex<Vec<Weak<Stream>>>,
    /// The device's SMs split into groups, when green contexts exist.
    groups: Option<(SmGroups, Vec<sys::CUdevResource>)>,
    isolation: SmIsolation,
}

// SAFETY: the handles in `Core` (library, kernels, SM resources) are
// read-only after open and thread-safe in the driver; the maps are behind
// mutexes.
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

struct Library(sys::CUlibrary);

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: loaded once in `open`, unloaded once.
        unsafe { sys::cuLibraryUnload(self.0) };
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let buffers = std::mem::take(self.buffers.get_mut().unwrap_or_else(|p| p.into_inner()));
        if self.primary.make_current().is_ok() {
            for addr in buffers.into_keys() {
                // SAFETY: our allocation; every view (and so every stream
                // that could use it) is gone, since each holds the Core.
                unsafe { sys::cuMemFree_v2(addr) };
            }
        }
    }
}

/// A CUDA device with the kernels loaded, handing out views on streams
/// of their own (`backend/device.rs` makes it the partitions' stream source).
pub struct CudaStreams {
    core: Arc<Core>,
}

impl std::fmt::Debug for CudaStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStreams")
            .field("device", &self.core.info.label())
            .finish_non_exhaustive()
    }
}

impl CudaStreams {
    /// Device `ordinal` with every kernel of `CUDA_FATBIN` looked up.
    pub fn open(ordinal: usize) -> Result<CudaStreams, String> {
        init()?;
        let fatbin = CUDA_FATBIN.map_err(str::to_owned)?;
        let (info, primary) = info(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
        let label = info.label();
        primary.make_current().map_err(|e| e.to_string())?;
        let mut library = std::ptr::null_mut();
        // SAFETY: `fatbin.bytes` is nvcc's fatbin, 'static; no JIT or
        // library options (null arrays with counts of 0).
        check("cuLibraryLoadData", unsafe {
            sys::cuLibraryLoadData(
                &mut library,
                fatbin.bytes.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })
        .map_err(|e| {
            format!(
                "{label}: loading the kernels (built for {}): {e}",
                fatbin.targets.join(", ")
            )
        })?;
        let library = Library(library);
        let mut kernels = HashMap::new();
        for name in names::ALL {
            let c = CString::new(name).expect("kernel names have no NUL");
            let mut kernel = std::ptr::null_mut();
            // SAFETY: valid out-pointer and NUL-terminated name.
            check("cuLibraryGetKernel", unsafe {
                sys::cuLibraryGetKernel(&mut kernel, library.0, c.as_ptr())
            })
            .map_err(|e| format!("{label}: kernel {name}: {e}"))?;
            kernels.insert(name, kernel);
        }
        let (groups, isolation) = if info.green_contexts {
            match split_sms(primary.dev) {
                Ok((groups, resources)) => (
                    Some((groups, resources)),
                    SmIsolation::GreenContexts {
                        sms_per_group: groups.size,
                        groups: groups.count,
                    },
                ),
                Err(e) => (None, SmIsolation::SharedStreams { why: e.to_string() }),
            }
        } else {
            let why = format!(
                "driver {}.{} has no green contexts (12.4+)",
                info.driver_version / 1000,
                info.driver_version % 1000 / 10
            );
            (None, SmIsolation::SharedStreams { why })
        };
        Ok(CudaStreams {
            core: Arc::new(Core {
                info,
                primary,
                _library: library,
                kernels,
                buffers: Mutex::new(BTreeMap::new()),
                streams: Mutex::new(Vec::new()),
                groups,
                isolation,
            }),
        })
    }

    pub fn info(&self) -> &CudaDeviceInfo {
        &self.core.info
    }

    /// How partitions are kept apart on this device.
    pub fn isolation(&self) -> &SmIsolation {
        &self.core.isolation
    }

    fn stream(&self, cus: &CuSet) -> Result<Stream, CallError> {
        let core = &self.core;
        let all = CuSet::full(core.info.multiprocessors);
        let groups = core.groups.as_ref().filter(|_| *cus != all);
        let Some((split, resources)) = groups else {
            core.primary.make_current()?;
            let mut raw = std::ptr::null_mut();
            // SAFETY: valid out-pointer, the primary context current.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })?;
            return Ok(Stream {
                raw,
                ctx: core.primary.ctx,
                green: None,
                sms: core.info.multiprocessors,
            });
        };
        let (first, count) = split.for_cus(cus).map_err(|_| CallError {
            call: "partition SM range",
            code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        })?;
        let mut picked: Vec<sys::CUdevResource> =
            resources[first as usize..(first + count) as usize].to_vec();
        let mut desc = std::ptr::null_mut();
        // SAFETY: `picked` are SM groups of one split, as the call requires.
        check("cuDevResourceGenerateDesc", unsafe {
            sys::cuDevResourceGenerateDesc(&mut desc, picked.as_mut_ptr(), count)
        })?;
        let mut green = std::ptr::null_mut();
        // SAFETY: valid out-pointer and the descriptor just made.
        check("cuGreenCtxCreate", unsafe {
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                core.primary.dev,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        })?;
        let mut ctx = std::ptr::null_mut();
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointers; `green` is ours (destroyed if these fail).
        // The stream is made with the green context current (cuStreamCreate
        // in it: what 12.4 offers; cuGreenCtxStreamCreate came in 12.5).
        // SAFETY: valid out-pointers; `green` is ours (destroyed if these fail).
        let made = check("cuCtxFromGreenCtx", unsafe {
            sys::cuCtxFromGreenCtx(&mut ctx, green)
        })
        .and_then(|()| check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) }))
        .and_then(|()| {
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })
        });
        if let Err(e) = made {
            // SAFETY: our green context, not used by anything yet.
            unsafe { sys::cuGreenCtxDestroy(green) };
            return Err(e);
        }
        Ok(Stream {
            raw,
            ctx,
            green: Some(green),
            sms: count * split.size,
        })
    }
}

/// The device's SMs in equal groups of the driver's smallest size.
fn split_sms(dev: sys::CUdevice) -> Result<(SmGroups, Vec<sys::CUdevResource>), CallError> {
    // SAFETY: an all-zero CUdevResource is a valid (empty) value to write into.
    let mut all: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    check("cuDeviceGetDevResource", unsafe {
        sys::cuDeviceGetDevResource(
            dev,
            &mut all,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    })?;
    // SAFETY: `all` is an SM resource, so `sm` is the union's live field.
    let total = unsafe { all.__bindgen_anon_1.sm.smCount };
    let mut count = total;
    // SAFETY: as above, zeroed values to be written.
    let mut groups: Vec<sys::CUdevResource> = vec![unsafe { std::mem::zeroed() }; total as usize];
    let mut rest: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: `groups` holds `count` elements; `all` came from the device;
    // minCount 1: the driver rounds it up to its granularity.
    check("cuDevSmResourceSplitByCount", unsafe {
        sys::cuDevSmResourceSplitByCount(groups.as_mut_ptr(), &mut count, &all, &mut rest, 0, 1)
    })?;
    groups.truncate(count as usize);
    // SAFETY: split results are SM resources.
    let size = groups
        .first()
        .map_or(0, |g| unsafe { g.__bindgen_anon_1.sm.smCount });
    if size == 0 {
        return Err(CallError {
            call: "cuDevSmResourceSplitByCount (no groups)",
            code: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        });
    }
    Ok((SmGroups { size, count }, groups))
}

impl CudaStreams {
    /// A view of the device on a stream of its own: on every SM for the
    /// full set, else in a green context over the groups `cus` covers
    /// (with shared streams: on every SM).
    pub fn view(&self, cus: &CuSet) -> Result<Arc<dyn KernelDevice>, String> {
        let stream = Arc::new(self.stream(cus).map_err(|e| {
            format!(
                "{}: a stream for {} SMs: {e}",
                self.core.info.label(),
                cus.len()
            )
        })?);
        let mut streams = self.core.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(&stream));
        Ok(Arc::new(CudaView {
            core: Arc::clone(&self.core),
            stream,
            staged: Mutex::new(Vec::new()),
        }))
    }
}

/// One stream's view of the device.
struct CudaView {
    core: Arc<Core>,
    stream: Arc<Stream>,
    /// Host copies of queued writes, kept until the stream is synchronized.
    staged: Mutex<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for CudaView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaView")
            .field("device", &self.describe())
            .finish_non_exhaustive()
    }
}

impl CudaView {
    /// Checks `addr..addr+len` lies in one allocation.
    fn check_range(&self, what: &str, addr: u64, len: usize) -> Result<(), DeviceError> {
        let buffers = self.core.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, &size) = buffers
            .range(..=addr)
            .next_back()
            .ok_or_else(|| DeviceError::new(what, "address outside every allocation"))?;
        if (addr - start) as usize + len > size {
            return Err(DeviceError::new(
                what,
                "range past the end of its allocation",
            ));
        }
        Ok(())
    }
}

impl KernelDevice for CudaView {
    fn describe(&self) -> String {
        let i = &self.core.info;
        format!(
            "{} {} #{}, {} SMs",
            i.name,
            i.arch(),
            i.ordinal,
            self.stream.sms
        )
    }

    fn wave_size(&self) -> u32 {
        32
    }

    fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
        let what = format!("alloc {bytes} bytes");
        let bytes = bytes.max(1);
        let err = |e: CallError| e.to_device_error(&what);
        self.core.primary.make_current().map_err(err)?;
        let mut addr = 0;
        // SAFETY: valid out-pointer, the primary context current.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut addr, bytes)
        })
        .map_err(err)?;
        // SAFETY: `addr` is `bytes` long, just allocated.
        if let Err(e) = check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(addr, 0, bytes) }) {
            // SAFETY: ours, unused.
            unsafe { sys::cuMemFree_v2(addr) };
            return Err(err(e));
        }
        self.core
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, bytes);
        Ok(addr)
    }

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
            .ok_or_else(|| DeviceError::new(&what, "not an allocation"))?;
        self.core
            .primary
            .make_current()
            .map_err(|e| e.to_device_error(&what))?;
        // SAFETY: our allocation, no longer in the map, and every stream
        // that could use it has finished.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(addr) }).map_err(|e| e.to_device_error(&what))
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
        let what = format!("write {} bytes at {addr:#x}", bytes.len());
        self.check_range(&what, addr, bytes.len())?;
        let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        staged.push(bytes.to_vec());
        let src = staged.last().expect("just pushed");
        self.stream
            .make_current()
            .map_err(|e| e.to_device_error(&what))?;
        // SAFETY: `src` stays in `staged` (its heap buffer does not move)
        // until the stream is synchronized; the range was checked to lie
        // in an allocation, which a free only releases after waiting for
        // every stream.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(addr, src.as_ptr().cast(), src.len(), self.stream.raw)
        })
        .map_err(|e| e.to_device_error(&what))
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let what = format!("read {} bytes at {addr:#x}", out.len());
        self.check_range(&what, addr, out.len())?;
        self.stream
            .make_current()
            .map_err(|e| e.to_device_error(&what))?;
        // SAFETY: `out` is not touched until the stream is synchronized
        // right below; the range lies in an allocation.
        let queued = check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), addr, out.len(), self.stream.raw)
        })
        .map_err(|e| e.to_device_error(&what));
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
        let &function = self
            .core
            .kernels
            .get(kernel)
            .ok_or_else(|| DeviceError::new(&what, "not a kernel of kernels/hip"))?;
        if !args.len().is_multiple_of(8) || args.len() > 4096 {
            return Err(DeviceError::new(
                &what,
                "argument block is not whole 8-byte words of at most 4 KiB",
            ));
        }
        // The args.h struct, 8-byte aligned as the kernel reads it.
        let mut words: Vec<u64> = args
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        let mut size = args.len();
        let mut extra = [
            // The driver's sentinel keys, addresses that point at nothing.
            std::ptr::without_provenance_mut::<c_void>(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            words.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut::<c_void>(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            (&raw mut size).cast(),
            std::ptr::null_mut(), // CU_LAUNCH_PARAM_END
        ];
        self.stream
            .make_current()
            .map_err(|e| e.to_device_error(&what))?;
        // SAFETY: `args` is the kernel's own args.h struct (sizes asserted
        // on both sides), copied by the driver at the call. Its pointers
        // are allocations of this device sized by HipBackend's shape checks
        // for this grid; a free waits for every stream first. A CUkernel
        // launches in the context current here, the stream's. What the
        // kernel writes is the calling backend's own workspace and KV pool
        // (each partition allocates its own); weights, which every view
        // reads, are written only by copies synchronized before first use.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                function.cast(),
                grid[0],
                grid[1],
                grid[2],
                threads,
                1,
                1,
                0,
                self.stream.raw,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })
        .map_err(|e| e.to_device_error(&what))
    }
}
