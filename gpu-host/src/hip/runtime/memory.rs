//! Device memory: RAII buffers charged to a partition's [`MemoryBudget`].

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use bulkhead_hip_sys as sys;
use sys::hipMemcpyKind;

use super::{Device, HipError, Stream, check};
use crate::hip::budget::{MemoryBudget, Reservation};
use crate::hip::launch::{DevicePtr, KernelArgs};

/// Element types that may live in device memory and be copied bytewise
/// to and from the host.
///
/// # Safety
/// Every bit pattern must be a valid value (the device writes arbitrary
/// bytes) and the type must hold no pointers into host memory.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

// SAFETY: every bit pattern of a primitive number is a valid value.
unsafe impl DeviceCopy for u8 {}
// SAFETY: as above.
unsafe impl DeviceCopy for i8 {}
// SAFETY: as above.
unsafe impl DeviceCopy for u16 {}
// SAFETY: as above.
unsafe impl DeviceCopy for i16 {}
// SAFETY: as above.
unsafe impl DeviceCopy for u32 {}
// SAFETY: as above.
unsafe impl DeviceCopy for i32 {}
// SAFETY: as above.
unsafe impl DeviceCopy for u64 {}
// SAFETY: as above.
unsafe impl DeviceCopy for i64 {}
// SAFETY: as above (NaN payloads included).
unsafe impl DeviceCopy for f32 {}
// SAFETY: as above.
unsafe impl DeviceCopy for f64 {}
// SAFETY: `repr(transparent)` over u16; every pattern is some f16.
unsafe impl DeviceCopy for half::f16 {}
// SAFETY: `repr(transparent)` over u16; every pattern is some bf16.
unsafe impl DeviceCopy for half::bf16 {}

/// `len` elements of `T` in one device's memory, freed on drop, charged to
/// a budget for as long as they live. `DeviceBuffer<u8>` is a byte buffer.
#[derive(Debug)]
pub struct DeviceBuffer<T: DeviceCopy> {
    /// Null for an empty buffer (nothing allocated).
    ptr: *mut c_void,
    len: usize,
    device: usize,
    reservation: Reservation,
    _elements: PhantomData<T>,
}

// SAFETY: the buffer owns its allocation; device memory is not tied to the
// thread that allocated it, and `&self` methods only read it (copies out).
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}
// SAFETY: as above.
unsafe impl<T: DeviceCopy> Sync for DeviceBuffer<T> {}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// `len` uninitialized elements on `device`, charged to `budget`
    /// before anything is allocated (a refusal allocates nothing).
    /// Contents are whatever the memory held: [`DeviceBuffer::zero`] or
    /// copy in before reading.
    pub fn alloc(
        device: &Device,
        len: usize,
        budget: &Arc<MemoryBudget>,
    ) -> Result<DeviceBuffer<T>, HipError> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            HipError::Copy(format!(
                "{len} elements of {} bytes overflow the address space",
                size_of::<T>()
            ))
        })?;
        let reservation = budget.reserve(bytes as u64)?;
        let mut ptr = std::ptr::null_mut();
        if bytes > 0 {
            device.make_current()?;
            // SAFETY: `ptr` is a valid out-pointer; the size is non-zero.
            check("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, bytes) })?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            device: device.ordinal(),
            reservation,
            _elements: PhantomData,
        })
    }

    /// `len` zeroed elements.
    pub fn zeroed(
        device: &Device,
        len: usize,
        budget: &Arc<MemoryBudget>,
    ) -> Result<DeviceBuffer<T>, HipError> {
        let mut buffer = DeviceBuffer::alloc(device, len, budget)?;
        buffer.zero()?;
        Ok(buffer)
    }

    /// A copy of `data` on `device`.
    pub fn from_host(
        device: &Device,
        data: &[T],
        budget: &Arc<MemoryBudget>,
    ) -> Result<DeviceBuffer<T>, HipError> {
        let mut buffer = DeviceBuffer::alloc(device, data.len(), budget)?;
        buffer.copy_from_host(data)?;
        Ok(buffer)
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of device memory the elements take.
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device the memory is on.
    pub fn device_ordinal(&self) -> usize {
        self.device
    }

    /// The budget this buffer is charged to.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        self.reservation.budget()
    }

    /// The device address of the first element (null when empty), for
    /// kernel arguments; prefer [`KernelArgs::buffer`], which also keeps
    /// the buffer borrowed.
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as u64)
    }

    /// Sets every byte to zero (`hipMemset`; synchronous).
    pub fn zero(&mut self) -> Result<(), HipError> {
        if self.ptr.is_null() {
            return Ok(());
        }
        // SAFETY: `ptr` is our live allocation of `size_bytes()` bytes.
        check("hipMemset", unsafe {
            sys::hipMemset(self.ptr, 0, self.size_bytes())
        })
    }

    /// Copies all of `src` in; `src` must be exactly as long as the buffer.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<(), HipError> {
        self.check_len("copy in", src.len())?;
        self.copy_from_host_at(0, src)
    }

    /// Copies `src` in starting at element `offset` (synchronous).
    pub fn copy_from_host_at(&mut self, offset: usize, src: &[T]) -> Result<(), HipError> {
        let (dst, bytes) = self.range("copy in", offset, src.len())?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst..dst+bytes` lies in our allocation (checked by
        // `range`); `src` is a live host slice of exactly `bytes` bytes.
        check("hipMemcpy", unsafe {
            sys::hipMemcpy(
                dst,
                src.as_ptr().cast(),
                bytes,
                hipMemcpyKind::hipMemcpyHostToDevice,
            )
        })
    }

    /// Copies the whole buffer out; `dst` must be exactly as long.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), HipError> {
        self.check_len("copy out", dst.len())?;
        self.copy_to_host_at(0, dst)
    }

    /// Copies `dst.len()` elements out starting at element `offset`
    /// (synchronous: waits for work that writes the buffer on the null
    /// stream; synchronize other streams first).
    pub fn copy_to_host_at(&self, offset: usize, dst: &mut [T]) -> Result<(), HipError> {
        let (src, bytes) = self.range("copy out", offset, dst.len())?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `src..src+bytes` lies in our allocation; `dst` is a live,
        // exclusively borrowed host slice of `bytes` bytes, and any bit
        // pattern is a valid `T` (`DeviceCopy`).
        check("hipMemcpy", unsafe {
            sys::hipMemcpy(
                dst.as_mut_ptr().cast(),
                src,
                bytes,
                hipMemcpyKind::hipMemcpyDeviceToHost,
            )
        })
    }

    /// The whole buffer, copied into a new vector.
    pub fn to_host_vec(&self) -> Result<Vec<T>, HipError> {
        let mut out = Vec::with_capacity(self.len);
        let spare = &mut out.spare_capacity_mut()[..self.len];
        let (src, bytes) = self.range("copy out", 0, self.len)?;
        if bytes > 0 {
            // SAFETY: `spare` is `len` writable elements; `src` our allocation.
            check("hipMemcpy", unsafe {
                sys::hipMemcpy(
                    spare.as_mut_ptr().cast(),
                    src,
                    bytes,
                    hipMemcpyKind::hipMemcpyDeviceToHost,
                )
            })?;
        }
        // SAFETY: the copy above initialized all `len` elements (any bit
        // pattern is a valid `T`).
        unsafe { out.set_len(self.len) };
        Ok(out)
    }

    /// Queues a copy of `src` into the buffer at element `offset` on
    /// `stream` and returns at once.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified, and the buffer must not be
    /// read, written or dropped, until `stream` has been synchronized.
    pub unsafe fn copy_from_host_async(
        &mut self,
        offset: usize,
        src: &[T],
        stream: &Stream,
    ) -> Result<(), HipError> {
        let (dst, bytes) = self.range("async copy in", offset, src.len())?;
        self.check_stream(stream)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: ranges checked as for the synchronous copy; the caller
        // keeps `src` and the buffer alive until the stream is synchronized.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(
                dst,
                src.as_ptr().cast(),
                bytes,
                hipMemcpyKind::hipMemcpyHostToDevice,
                stream.raw(),
            )
        })
    }

    /// Queues a copy of the buffer from element `offset` into `dst` on
    /// `stream` and returns at once.
    ///
    /// # Safety
    /// `dst` must stay alive and must not be read or written, and the
    /// buffer must not be dropped, until `stream` has been synchronized.
    pub unsafe fn copy_to_host_async(
        &self,
        offset: usize,
        dst: &mut [T],
        stream: &Stream,
    ) -> Result<(), HipError> {
        let (src, bytes) = self.range("async copy out", offset, dst.len())?;
        self.check_stream(stream)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as for `copy_from_host_async`, the other way round.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(
                dst.as_mut_ptr().cast(),
                src,
                bytes,
                hipMemcpyKind::hipMemcpyDeviceToHost,
                stream.raw(),
            )
        })
    }

    fn check_len(&self, what: &str, len: usize) -> Result<(), HipError> {
        if len == self.len {
            return Ok(());
        }
        Err(HipError::Copy(format!(
            "{what} of {len} elements, but the device buffer holds {}",
            self.len
        )))
    }

    /// The device address of element `offset` and the byte count of `count`
    /// elements from there, if they lie inside the buffer.
    fn range(
        &self,
        what: &str,
        offset: usize,
        count: usize,
    ) -> Result<(*mut c_void, usize), HipError> {
        let end = offset.checked_add(count);
        if end.is_none_or(|end| end > self.len) {
            return Err(HipError::Copy(format!(
                "{what} of {count} elements at element {offset}, but the device buffer holds {}",
                self.len
            )));
        }
        let start = offset * size_of::<T>();
        Ok((self.ptr.wrapping_byte_add(start), count * size_of::<T>()))
    }

    fn check_stream(&self, stream: &Stream) -> Result<(), HipError> {
        if stream.device_ordinal() != self.device {
            return Err(HipError::WrongDevice {
                what: "the stream",
                expected: self.device,
                got: stream.device_ordinal(),
            });
        }
        Ok(())
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: `ptr` came from hipMalloc and is freed once, here.
        let code = unsafe { sys::hipFree(self.ptr) };
        if let Err(err) = check("hipFree", code) {
            // Nothing to return to; the budget is credited regardless, as
            // the runtime no longer lets us use the memory.
            eprintln!(
                "warning: freeing a device buffer of {} bytes: {err}",
                self.size_bytes()
            );
        }
    }
}

impl<'a> KernelArgs<'a> {
    /// Pushes `buffer`'s device address (a `T*` parameter), keeping the
    /// buffer borrowed as long as these arguments exist.
    pub fn buffer<T: DeviceCopy>(&mut self, buffer: &'a DeviceBuffer<T>) -> &mut Self {
        self.push(buffer.device_ptr())
    }

    /// As [`KernelArgs::buffer`], for a buffer the kernel writes: the
    /// exclusive borrow keeps host code from touching it meanwhile.
    pub fn buffer_mut<T: DeviceCopy>(&mut self, buffer: &'a mut DeviceBuffer<T>) -> &mut Self {
        self.push(buffer.device_ptr())
    }
}
