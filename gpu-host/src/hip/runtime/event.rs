//! Events: points in a stream, for timing kernels and waiting on them.

use bulkhead_hip_sys as sys;

use super::{Device, HipError, Stream, check};

/// A marker recorded into a stream, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::hipEvent_t,
    device: usize,
}

// SAFETY: HIP events are thread-safe handles.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// A timing-capable event on `device`.
    pub fn new(device: &Device) -> Result<Event, HipError> {
        device.make_current()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("hipEventCreate", unsafe { sys::hipEventCreate(&mut raw) })?;
        Ok(Event {
            raw,
            device: device.ordinal(),
        })
    }

    /// Records the event after the work queued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<(), HipError> {
        if stream.device_ordinal() != self.device {
            return Err(HipError::WrongDevice {
                what: "the stream",
                expected: self.device,
                got: stream.device_ordinal(),
            });
        }
        // SAFETY: both handles are live and on the same device.
        check("hipEventRecord", unsafe {
            sys::hipEventRecord(self.raw, stream.raw())
        })
    }

    /// Waits until the recorded work has finished.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // SAFETY: `raw` is our live event.
        check("hipEventSynchronize", unsafe {
            sys::hipEventSynchronize(self.raw)
        })
    }

    /// Milliseconds between `self` (recorded first) and `end`, both
    /// recorded and completed (synchronize `end` first).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, HipError> {
        let mut ms = 0.0f32;
        // SAFETY: valid out-pointer and live events; the runtime reports
        // unrecorded or unfinished events as an error code.
        check("hipEventElapsedTime", unsafe {
            sys::hipEventElapsedTime(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `raw` is our event, destroyed once.
        let code = unsafe { sys::hipEventDestroy(self.raw) };
        if let Err(err) = check("hipEventDestroy", code) {
            eprintln!("warning: destroying a HIP event: {err}");
        }
    }
}
