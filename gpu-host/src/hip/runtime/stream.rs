//! Streams: plain, or limited to a set of compute units (a partition).

use bulkhead_hip_sys as sys;
use bulkhead_partition::CuSet;

use super::{Device, HipError, check};
use crate::hip::cu_mask::{check_cu_mask, cu_mask_for};

/// An in-order queue of work on one device, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::hipStream_t,
    device: usize,
    /// The CU mask it was created with; `None` for all CUs.
    cu_mask: Option<Vec<u32>>,
}

// SAFETY: HIP streams are thread-safe handles: work may be queued on and
// synchronized with one stream from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A stream that may use every compute unit of `device`.
    pub fn new(device: &Device) -> Result<Stream, HipError> {
        device.make_current()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("hipStreamCreate", unsafe { sys::hipStreamCreate(&mut raw) })?;
        Ok(Stream {
            raw,
            device: device.ordinal(),
            cu_mask: None,
        })
    }

    /// A stream whose kernels run only on the compute units set in `mask`
    /// (`hipExtStreamCreateWithCUMask`: bit `i % 32` of word `i / 32` is
    /// CU `i`), checked against the device first.
    pub fn with_cu_mask(device: &Device, mask: &[u32]) -> Result<Stream, HipError> {
        check_cu_mask(mask, device.properties().compute_units)?;
        device.make_current()?;
        let mut raw = std::ptr::null_mut();
        // The check bounds the length by the device's CU count.
        let words = mask.len() as u32;
        // SAFETY: `raw` is a valid out-pointer; `mask` is `words` readable
        // u32s, read during the call only.
        check("hipExtStreamCreateWithCUMask", unsafe {
            sys::hipExtStreamCreateWithCUMask(&mut raw, words, mask.as_ptr())
        })?;
        Ok(Stream {
            raw,
            device: device.ordinal(),
            cu_mask: Some(mask.to_vec()),
        })
    }

    /// A stream on the CUs of a partition's [`CuSet`] (which must range
    /// over this device's CUs).
    pub fn for_cu_set(device: &Device, set: &CuSet) -> Result<Stream, HipError> {
        let mask = cu_mask_for(set, device.properties().compute_units)?;
        Stream::with_cu_mask(device, &mask)
    }

    /// Waits until all work queued so far has finished.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // SAFETY: `raw` is our live stream.
        check("hipStreamSynchronize", unsafe {
            sys::hipStreamSynchronize(self.raw)
        })
    }

    pub fn device_ordinal(&self) -> usize {
        self.device
    }

    /// The CU mask, if the stream was created with one.
    pub fn cu_mask(&self) -> Option<&[u32]> {
        self.cu_mask.as_deref()
    }

    pub(super) fn raw(&self) -> sys::hipStream_t {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` is our stream, destroyed once; HIP waits for its
        // queued work before releasing it.
        let code = unsafe { sys::hipStreamDestroy(self.raw) };
        if let Err(err) = check("hipStreamDestroy", code) {
            eprintln!("warning: destroying a HIP stream: {err}");
        }
    }
}
