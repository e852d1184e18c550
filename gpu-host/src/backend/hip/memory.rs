//! Device memory for the HIP backend: buffers freed on drop, and the
//! weights every partition of a device reads from one shared copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bulkhead_kernels::hip::{DeviceError, KernelDevice};

use crate::backend::OpResult;

/// Bytes of a weight sampled at each end to tell two weights at the same
/// address apart (a model unloaded and another mapped where it was).
pub(super) const FINGERPRINT_BYTES: usize = 256;

/// Weights on the device, uploaded at load (or the first time an op sees
/// them) and shared read-only by every backend made with
/// [`HipBackend::sharing`](super::HipBackend::sharing):
/// **one copy per device, however many partitions use the model.** It
/// also holds what every partition must know of the device: whether it
/// was lost.
#[derive(Debug)]
pub struct DeviceWeights {
    /// The first error that found the device lost; set once, for good.
    lost: OnceLock<DeviceError>,
    /// Where weights are allocated (on a GPU: charged to the model
    /// reservation's budget, not to any partition's).
    device: Arc<dyn KernelDevice>,
    /// By (host address, length).
    cache: Mutex<HashMap<(usize, usize), CachedWeight>>,
}

impl DeviceWeights {
    /// An empty cache allocating on `device`.
    pub fn new(device: Arc<dyn KernelDevice>) -> Arc<DeviceWeights> {
        Arc::new(DeviceWeights {
            lost: OnceLock::new(),
            device,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Bytes of weights on the device.
    pub fn bytes(&self) -> usize {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.values().map(|w| w.buffer.len).sum()
    }

    /// The error that took the device out of service, if one did.
    pub fn lost(&self) -> Option<&DeviceError> {
        self.lost.get()
    }

    /// Takes the device out of service for every backend sharing it (the
    /// first error that found it lost is the one kept).
    pub(super) fn mark_lost(&self, error: &DeviceError) {
        let _ = self.lost.set(error.clone());
    }

    /// Drops every cached weight (when models are unloaded). An op running
    /// meanwhile keeps the weights it is using until it returns.
    pub fn clear(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The weight at host address `key.0` of `key.1` bytes on the device,
    /// uploading `bytes()` the first time (or when the weight at that
    /// address is no longer the one cached: its ends differ). The caller
    /// holds it until its launch has finished, so a weight replaced or
    /// cleared meanwhile (by another partition) is not freed under it.
    pub(super) fn cached(
        &self,
        key: (usize, usize),
        fingerprint: Vec<u8>,
        bytes: impl FnOnce() -> Vec<u8>,
    ) -> Result<Arc<DeviceBuffer>, DeviceError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(&key) {
            Some(w) if w.fingerprint == fingerprint => Ok(Arc::clone(&w.buffer)),
            _ => {
                let buffer = Arc::new(DeviceBuffer::from_bytes(&self.device, &bytes())?);
                // Every partition's stream reads it: the copy (queued on
                // this view's stream) must be done before any of them does.
                self.device.synchronize()?;
                cache.insert(
                    key,
                    CachedWeight {
                        buffer: Arc::clone(&buffer),
                        fingerprint,
                    },
                );
                Ok(buffer)
            }
        }
    }
}

#[derive(Debug)]
struct CachedWeight {
    buffer: Arc<DeviceBuffer>,
    fingerprint: Vec<u8>,
}

/// Device memory freed on drop.
#[derive(Debug)]
pub(super) struct DeviceBuffer {
    device: Arc<dyn KernelDevice>,
    pub(super) addr: u64,
    pub(super) len: usize,
}

impl DeviceBuffer {
    pub(super) fn alloc(
        device: &Arc<dyn KernelDevice>,
        len: usize,
    ) -> Result<DeviceBuffer, DeviceError> {
        let addr = device.alloc(len.max(1))?;
        Ok(DeviceBuffer {
            device: Arc::clone(device),
            addr,
            len,
        })
    }

    pub(super) fn from_bytes(
        device: &Arc<dyn KernelDevice>,
        bytes: &[u8],
    ) -> Result<DeviceBuffer, DeviceError> {
        let b = DeviceBuffer::alloc(device, bytes.len())?;
        if !bytes.is_empty() {
            device.write(b.addr, bytes)?;
        }
        Ok(b)
    }

    pub(super) fn from_f32(
        device: &Arc<dyn KernelDevice>,
        v: &[f32],
    ) -> Result<DeviceBuffer, DeviceError> {
        DeviceBuffer::from_bytes(device, &f32_bytes(v))
    }

    pub(super) fn from_u32(
        device: &Arc<dyn KernelDevice>,
        v: &[u32],
    ) -> Result<DeviceBuffer, DeviceError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        DeviceBuffer::from_bytes(device, &bytes)
    }

    pub(super) fn read_f32(&self, out: &mut [f32]) -> OpResult {
        assert!(out.len() * 4 <= self.len, "HIP backend: read past a buffer");
        let mut bytes = vec![0u8; out.len() * 4];
        self.device.read(self.addr, &mut bytes)?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Nothing useful to do with a failed free in a destructor; the
        // device's own teardown reclaims it.
        let _ = self.device.free(self.addr);
    }
}

pub(super) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The first and last `n` elements of `v` (all of it when shorter than 2n).
pub(super) fn ends<T: Copy>(v: &[T], n: usize) -> Vec<T> {
    if v.len() <= 2 * n {
        v.to_vec()
    } else {
        [&v[..n], &v[v.len() - n..]].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::budgeted::fake::MemoryOnly;

    #[test]
    fn a_weight_in_use_outlives_its_replacement_and_a_clear() {
        let device = Arc::new(MemoryOnly::default());
        let weights = DeviceWeights::new(device.clone());
        let held = weights.cached((0x1000, 8), vec![1], || vec![1; 8]).unwrap();
        let again = weights
            .cached((0x1000, 8), vec![1], || panic!("uploaded twice"))
            .unwrap();
        assert_eq!(held.addr, again.addr);
        drop(again);
        // Another weight at the same address (a model replaced), while an
        // op of another partition still uses the first.
        let replaced = weights.cached((0x1000, 8), vec![2], || vec![2; 8]).unwrap();
        assert_ne!(replaced.addr, held.addr);
        assert_eq!(device.live(), 2, "the weight in use is not freed");
        assert_eq!(weights.bytes(), 8, "only the new one is cached");
        weights.clear();
        assert_eq!((device.live(), weights.bytes()), (2, 0));
        drop(held);
        assert_eq!(device.live(), 1);
        drop(replaced);
        assert_eq!(device.live(), 0);
    }
}
