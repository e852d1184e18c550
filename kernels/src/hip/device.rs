//! What the HIP kernels run on, as the host code that drives them sees it:
//! device memory by address and launches by kernel name. The HIP runtime
//! implements it in the gpu-host (feature `hip`); [`super::emulator`]
//! implements it on CPU threads so the same host code and tests run on
//! machines without a GPU.

use std::fmt;

/// A failed device operation: what it means for what runs next, the
/// device's own words (the HIP error name and string, or the emulator's
/// message) and what was being done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    /// What was asked ("launch bh_matvec_q8_0", "alloc 4096 bytes").
    pub operation: String,
    pub message: String,
}

/// What a device failure means for the work around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceErrorKind {
    /// Memory ran out: the device's, or the partition's budget. The work
    /// that needed it fails; the device is fine.
    OutOfMemory,
    /// The operation was refused or failed (a bad argument, a launch the
    /// device would not run); the device is fine.
    Failed,
    /// The device cannot be used any more: it was lost or reset, a fault
    /// poisoned its context, the emulator's process is gone.
    Lost,
}

impl DeviceErrorKind {
    /// The kind's name on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceErrorKind::OutOfMemory => "out_of_memory",
            DeviceErrorKind::Failed => "failed",
            DeviceErrorKind::Lost => "device_lost",
        }
    }

    /// The kind named `name` ([`DeviceErrorKind::as_str`]).
    pub fn from_name(name: &str) -> Option<DeviceErrorKind> {
        [
            DeviceErrorKind::OutOfMemory,
            DeviceErrorKind::Failed,
            DeviceErrorKind::Lost,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }
}

impl DeviceError {
    /// An operation that failed on a device that is still usable.
    pub fn new(operation: impl Into<String>, message: impl Into<String>) -> DeviceError {
        DeviceError::of_kind(DeviceErrorKind::Failed, operation, message)
    }

    pub fn of_kind(
        kind: DeviceErrorKind,
        operation: impl Into<String>,
        message: impl Into<String>,
    ) -> DeviceError {
        DeviceError {
            kind,
            operation: operation.into(),
            message: message.into(),
        }
    }

    /// An allocation that did not fit.
    pub fn out_of_memory(operation: impl Into<String>, message: impl Into<String>) -> DeviceError {
        DeviceError::of_kind(DeviceErrorKind::OutOfMemory, operation, message)
    }

    /// A device that can no longer be used.
    pub fn lost(operation: impl Into<String>, message: impl Into<String>) -> DeviceError {
        DeviceError::of_kind(DeviceErrorKind::Lost, operation, message)
    }
}

/// A device the kernels of [`super::CODE_OBJECTS`] run on. Addresses are
/// device addresses (what kernel arguments hold). Copies to the device and
/// launches are queued in order and may return before the device has done
/// them (a GPU's stream); a read waits for everything queued before it,
/// so a step that ends with reading its results synchronizes once. An
/// error of queued work may surface at a later call.
pub trait KernelDevice: Send + Sync + fmt::Debug {
    /// For logs: the device's name and architecture.
    fn describe(&self) -> String;
    /// Threads per wave (64 on CDNA, 32 on RDNA and NVIDIA).
    fn wave_size(&self) -> u32;
    /// `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<u64, DeviceError>;
    /// Releases an address `alloc` returned, once no queued work can use it.
    fn free(&self, addr: u64) -> Result<(), DeviceError>;
    /// Queues a copy of `bytes` to `addr` (inside one allocation); `bytes`
    /// may be reused as soon as this returns.
    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError>;
    /// Copies `out.len()` bytes from `addr` (inside one allocation) once
    /// everything queued before has run: a synchronization.
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Queues `kernel` over `grid` blocks of `threads` threads with the
    /// argument bytes `args` ([`super::KernelArgs::to_bytes`]).
    fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        threads: u32,
        args: &[u8],
    ) -> Result<(), DeviceError>;
    /// Waits for everything queued. A device whose calls finish before
    /// they return (the emulator) has nothing to wait for.
    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}
