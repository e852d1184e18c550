//! Code-object modules and their kernels.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use bulkhead_hip_sys as sys;

use super::{Device, HipError, Stream, check};
use crate::hip::code_object::CodeObject;
use crate::hip::launch::{Dim3, KernelArgs, LaunchLimits};

/// Longer than any kernel name we emit (mangled C++ names stay far below).
const MAX_KERNEL_NAME_BYTES: usize = 1024;

/// A loaded code object (`hipModuleLoadData`), unloaded when the module
/// and every [`Function`] from it are gone.
#[derive(Clone, Debug)]
pub struct Module {
    inner: Arc<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    raw: sys::hipModule_t,
    device: usize,
    limits: LaunchLimits,
}

// SAFETY: a loaded module is immutable; HIP allows looking up and
// launching its functions from any thread.
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

impl Module {
    /// Loads `image` (an AMDGPU ELF or an offload bundle, as `hipcc
    /// --genco` writes) onto `device`, after checking it is one and, for a
    /// bundle, that it has code for the device's arch.
    pub fn load(device: &Device, image: &[u8]) -> Result<Module, HipError> {
        let code = CodeObject::parse(image)?;
        code.check_arch(device.properties().arch())?;
        // The runtime reads the image as an ELF, which wants 8-byte
        // alignment; `include_bytes!` gives 1. Copy into aligned words.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `aligned` has at least `image.len()` bytes; regions are
        // distinct allocations.
        unsafe {
            std::ptr::copy_nonoverlapping(
                image.as_ptr(),
                aligned.as_mut_ptr().cast::<u8>(),
                image.len(),
            );
        }
        device.make_current()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `aligned` holds a complete
        // code object and outlives the call (the runtime copies what it
        // keeps).
        check("hipModuleLoadData", unsafe {
            sys::hipModuleLoadData(&mut raw, aligned.as_ptr().cast::<c_void>())
        })?;
        Ok(Module {
            inner: Arc::new(Loaded {
                raw,
                device: device.ordinal(),
                limits: LaunchLimits::of(device.properties()),
            }),
        })
    }

    /// The kernel `name` (its symbol: declare kernels `extern "C"` to keep
    /// names unmangled).
    pub fn function(&self, name: &str) -> Result<Function, HipError> {
        let bad = |why| HipError::KernelName {
            name: name.to_string(),
            why,
        };
        if name.is_empty() {
            return Err(bad("empty"));
        }
        if name.len() > MAX_KERNEL_NAME_BYTES {
            return Err(bad("longer than 1024 bytes"));
        }
        let c_name = CString::new(name).map_err(|_| bad("contains a NUL byte"))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer, our live module, a NUL-terminated name.
        check("hipModuleGetFunction", unsafe {
            sys::hipModuleGetFunction(&mut raw, self.inner.raw, c_name.as_ptr())
        })?;
        Ok(Function {
            raw,
            name: name.to_string(),
            module: Arc::clone(&self.inner),
        })
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: `raw` is our module, unloaded once, after every Function
        // (each holds this `Loaded`) is gone.
        let code = unsafe { sys::hipModuleUnload(self.raw) };
        if let Err(err) = check("hipModuleUnload", code) {
            eprintln!("warning: unloading a HIP module: {err}");
        }
    }
}

/// A kernel of a loaded [`Module`]; keeps the module loaded.
#[derive(Clone, Debug)]
pub struct Function {
    raw: sys::hipFunction_t,
    name: String,
    module: Arc<Loaded>,
}

// SAFETY: a function handle is immutable; launching it from several
// threads (on their own streams) is allowed by HIP.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues the kernel on `stream` with `grid` blocks of `block` threads,
    /// `shared_bytes` of dynamic shared memory and `args`, after checking
    /// them against the device's limits and the stream's device. Returns
    /// once queued; errors inside the kernel surface at the next
    /// synchronization.
    ///
    /// # Safety
    /// The kernel runs arbitrary device code with these arguments, so the
    /// caller guarantees what the compiler cannot:
    /// - `args` match the kernel's parameters in number, order and type
    ///   (a `DevicePtr` for each `T*`, the same scalar types otherwise);
    /// - every buffer the kernel reads or writes is large enough for the
    ///   indices this grid makes it touch, and lives on this device;
    /// - no buffer the kernel touches is freed, or read or written by the
    ///   host or other streams, until `stream` (or an event recorded after
    ///   the launch) has been synchronized.
    pub unsafe fn launch(
        &self,
        grid: impl Into<Dim3>,
        block: impl Into<Dim3>,
        shared_bytes: u32,
        stream: &Stream,
        args: &KernelArgs<'_>,
    ) -> Result<(), HipError> {
        let (grid, block) = (grid.into(), block.into());
        self.module.limits.check(grid, block, shared_bytes, args)?;
        if stream.device_ordinal() != self.module.device {
            return Err(HipError::WrongDevice {
                what: "the stream",
                expected: self.module.device,
                got: stream.device_ordinal(),
            });
        }
        let mut block_bytes = args.to_kernarg_block();
        let mut size = block_bytes.len();
        let mut extra = [
            sys::HIP_LAUNCH_PARAM_BUFFER_POINTER,
            block_bytes.as_mut_ptr().cast::<c_void>(),
            sys::HIP_LAUNCH_PARAM_BUFFER_SIZE,
            (&raw mut size).cast::<c_void>(),
            sys::HIP_LAUNCH_PARAM_END,
        ];
        // SAFETY: the handles are live and on one device; `extra` is the
        // documented buffer-pointer/size/end list, whose buffer and size
        // outlive the call (the runtime copies the arguments at launch);
        // the kernel's own memory accesses are the caller's contract above.
        check("hipModuleLaunchKernel", unsafe {
            sys::hipModuleLaunchKernel(
                self.raw,
                grid.x,
                grid.y,
                grid.z,
                block.x,
                block.y,
                block.z,
                shared_bytes,
                stream.raw(),
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })
    }
}
