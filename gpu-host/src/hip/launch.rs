//! Kernel launch geometry and arguments, checked and packed on the host.
//!
//! Arguments are packed as the kernel's parameter list is laid out in its
//! kernarg segment — a C struct of the parameters in order, each at its
//! natural alignment — and handed to `hipModuleLaunchKernel` through
//! `HIP_LAUNCH_PARAM_BUFFER_POINTER`. The runtime copies the buffer at
//! launch, so it need not outlive the call.

use std::marker::PhantomData;

use super::HipError;
use super::props::DeviceProperties;

/// The largest explicit argument block a kernel may take (what HIP and
/// CUDA allow; our kernels take a few dozen bytes).
pub const MAX_KERNEL_ARG_BYTES: usize = 4096;

/// A grid or block size in three dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    /// `x * y * z`, without overflow.
    pub fn count(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
}

impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Dim3 {
        Dim3 { x, y, z: 1 }
    }
}

impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Dim3 {
        Dim3 { x, y, z }
    }
}

/// What a device allows a launch: taken from its properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchLimits {
    pub max_threads_per_block: u32,
    pub max_block_dims: [u32; 3],
    pub max_grid_dims: [u32; 3],
    pub max_shared_bytes: u64,
}

impl LaunchLimits {
    pub fn of(props: &DeviceProperties) -> LaunchLimits {
        LaunchLimits {
            max_threads_per_block: props.max_threads_per_block,
            max_block_dims: props.max_block_dims,
            max_grid_dims: props.max_grid_dims,
            max_shared_bytes: props.shared_memory_per_block_bytes,
        }
    }

    /// Refuses a launch the device cannot run, naming the limit, before the
    /// runtime answers a bare `hipErrorInvalidConfiguration`.
    pub fn check(
        &self,
        grid: Dim3,
        block: Dim3,
        shared_bytes: u32,
        args: &KernelArgs<'_>,
    ) -> Result<(), HipError> {
        let bad = |why: String| Err(HipError::Launch(why));
        let dims = |d: Dim3| [d.x, d.y, d.z];
        if grid.count() == 0 || block.count() == 0 {
            return bad(format!("empty grid {grid:?} or block {block:?}"));
        }
        if block.count() > u64::from(self.max_threads_per_block) {
            return bad(format!(
                "block {block:?} has {} threads, more than the device's {}",
                block.count(),
                self.max_threads_per_block
            ));
        }
        for (axis, ((b, g), (max_b, max_g))) in ["x", "y", "z"].iter().zip(
            dims(block)
                .into_iter()
                .zip(dims(grid))
                .zip(self.max_block_dims.into_iter().zip(self.max_grid_dims)),
        ) {
            if b > max_b {
                return bad(format!(
                    "block.{axis} = {b}, more than the device's {max_b}"
                ));
            }
            if g > max_g {
                return bad(format!("grid.{axis} = {g}, more than the device's {max_g}"));
            }
        }
        if u64::from(shared_bytes) > self.max_shared_bytes {
            return bad(format!(
                "{shared_bytes} bytes of dynamic shared memory, more than the device's {}",
                self.max_shared_bytes
            ));
        }
        if args.len() > MAX_KERNEL_ARG_BYTES {
            return bad(format!(
                "{} bytes of arguments, more than {MAX_KERNEL_ARG_BYTES}",
                args.len()
            ));
        }
        Ok(())
    }
}

/// A device address as a kernel argument (a `T*` parameter). Only the HIP
/// allocator layer makes non-null ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct DevicePtr(pub(crate) u64);

impl DevicePtr {
    /// The null pointer, for optional pointer parameters.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address, for logs.
    pub fn addr(&self) -> u64 {
        self.0
    }
}

/// A value that can be a kernel parameter: plain old data whose bytes are
/// what the kernel reads.
///
/// # Safety
/// Implementors must be `Copy` types without padding or pointers into host
/// memory, laid out as the matching C type (`float`, `uint32_t`, `T*` …).
pub unsafe trait KernelArg: Copy {}

// SAFETY: primitive numbers have no padding and are their C counterparts.
unsafe impl KernelArg for u8 {}
// SAFETY: as above.
unsafe impl KernelArg for i8 {}
// SAFETY: as above.
unsafe impl KernelArg for u16 {}
// SAFETY: as above.
unsafe impl KernelArg for i16 {}
// SAFETY: as above.
unsafe impl KernelArg for u32 {}
// SAFETY: as above.
unsafe impl KernelArg for i32 {}
// SAFETY: as above.
unsafe impl KernelArg for u64 {}
// SAFETY: as above.
unsafe impl KernelArg for i64 {}
// SAFETY: as above (`size_t` / `ptrdiff_t` on the 64-bit hosts HIP runs on).
unsafe impl KernelArg for usize {}
// SAFETY: as above.
unsafe impl KernelArg for isize {}
// SAFETY: as above.
unsafe impl KernelArg for f32 {}
// SAFETY: as above.
unsafe impl KernelArg for f64 {}
// SAFETY: `half::f16` is `repr(transparent)` over u16, laid out as `_Float16`/`__half`.
unsafe impl KernelArg for half::f16 {}
// SAFETY: `half::bf16` is `repr(transparent)` over u16, laid out as `__bf16`.
unsafe impl KernelArg for half::bf16 {}
// SAFETY: a 64-bit device address, as a `T*` parameter is.
unsafe impl KernelArg for DevicePtr {}

/// A kernel's arguments, packed in order. The lifetime ties it to the
/// device buffers whose addresses it holds (see `KernelArgs::buffer` in
/// the HIP runtime layer), so they cannot be freed while it exists.
#[derive(Clone, Debug, Default)]
pub struct KernelArgs<'a> {
    bytes: Vec<u8>,
    /// The largest alignment pushed: the block's size is padded to it, as
    /// a C struct's is.
    align: usize,
    _buffers: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    pub fn new() -> KernelArgs<'a> {
        KernelArgs {
            bytes: Vec::new(),
            align: 1,
            _buffers: PhantomData,
        }
    }

    /// Appends `value` at its natural alignment.
    pub fn push<T: KernelArg>(&mut self, value: T) -> &mut Self {
        let align = std::mem::align_of::<T>();
        self.align = self.align.max(align);
        let start = self.bytes.len().next_multiple_of(align);
        self.bytes.resize(start, 0);
        // SAFETY: `KernelArg` types are padding-free plain data, so all
        // `size_of::<T>()` bytes of `value` are initialized.
        let raw = unsafe {
            std::slice::from_raw_parts((&raw const value).cast::<u8>(), std::mem::size_of::<T>())
        };
        self.bytes.extend_from_slice(raw);
        self
    }

    /// The packed bytes, padded to the largest alignment pushed: exactly
    /// the kernarg block the kernel reads.
    pub fn to_kernarg_block(&self) -> Vec<u8> {
        let mut block = self.bytes.clone();
        block.resize(self.len(), 0);
        block
    }

    /// The size of the kernarg block, in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len().next_multiple_of(self.align)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hip::props::tests::mi325x;

    #[test]
    fn arguments_are_laid_out_as_a_c_struct_of_the_parameters() {
        #[repr(C)]
        struct Params {
            flag: u8,
            x: DevicePtr,
            n: u32,
            scale: f32,
            h: half::f16,
        }
        let mut args = KernelArgs::new();
        args.push(7u8)
            .push(DevicePtr(0x1122_3344_5566_7788))
            .push(300u32)
            .push(0.5f32)
            .push(half::f16::ONE);
        assert_eq!(args.len(), std::mem::size_of::<Params>());
        let block = args.to_kernarg_block();
        assert_eq!(block.len(), 32);
        assert_eq!(block[std::mem::offset_of!(Params, flag)], 7);
        let at = |offset: usize, len: usize| &block[offset..offset + len];
        assert_eq!(
            at(std::mem::offset_of!(Params, x), 8),
            0x1122_3344_5566_7788u64.to_le_bytes()
        );
        assert_eq!(at(std::mem::offset_of!(Params, n), 4), 300u32.to_le_bytes());
        assert_eq!(
            at(std::mem::offset_of!(Params, scale), 4),
            0.5f32.to_le_bytes()
        );
        assert_eq!(at(std::mem::offset_of!(Params, h), 2), [0x00, 0x3c]);
        assert!(block[1..8].iter().all(|b| *b == 0), "padding is zero");
        assert!(KernelArgs::new().is_empty());
        assert_eq!(KernelArgs::new().len(), 0);
    }

    #[test]
    fn launches_outside_the_device_limits_are_refused_by_name() {
        let limits = LaunchLimits::of(&mi325x());
        let args = KernelArgs::new();
        assert!(
            limits
                .check(Dim3::from(1024), Dim3::from(256), 0, &args)
                .is_ok()
        );
        let message = |grid: Dim3, block: Dim3, shared: u32, args: &KernelArgs<'_>| {
            limits
                .check(grid, block, shared, args)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message(1.into(), (32, 32, 2).into(), 0, &args),
            "invalid kernel launch: block Dim3 { x: 32, y: 32, z: 2 } has 2048 threads, \
             more than the device's 1024"
        );
        assert!(message(0.into(), 64.into(), 0, &args).contains("empty grid"));
        assert_eq!(
            message(1.into(), 64.into(), 65 << 10, &args),
            "invalid kernel launch: 66560 bytes of dynamic shared memory, more than the \
             device's 65536"
        );
        let tight = LaunchLimits {
            max_block_dims: [1024, 1024, 64],
            ..limits
        };
        assert_eq!(
            tight
                .check(1.into(), (1, 1, 128).into(), 0, &args)
                .unwrap_err()
                .to_string(),
            "invalid kernel launch: block.z = 128, more than the device's 64"
        );
        let mut big = KernelArgs::new();
        for _ in 0..513 {
            big.push(0u64);
        }
        assert!(message(1.into(), 64.into(), 0, &big).contains("4104 bytes of arguments"));
    }
}
