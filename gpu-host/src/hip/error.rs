//! The HIP backend's one error type.

use bulkhead_kernels::hip::{DeviceError, DeviceErrorKind};

use super::budget::BudgetError;

/// Why a HIP operation failed: whose fault it is is in the variant (no
/// device, a bad argument of ours, or the runtime refusing a call).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HipError {
    /// Built without cargo feature `hip`: nothing HIP can run.
    #[error(
        "this build of bulkhead-gpu-host has no HIP support (rebuild with `--features hip` \
         where ROCm is installed)"
    )]
    NotBuilt,
    /// No driver, no `/dev/kfd`, or no GPU: what `hipInit` or
    /// `hipGetDeviceCount` said.
    #[error("no HIP device visible: {0}")]
    NoDevice(CallFailure),
    /// The runtime started but counts no device (all hidden by
    /// `HIP_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES`, for one).
    #[error(
        "no HIP device visible: hipGetDeviceCount counted 0 (check HIP_VISIBLE_DEVICES and \
         ROCR_VISIBLE_DEVICES)"
    )]
    NoDeviceCounted,
    /// A runtime call returned an error.
    #[error("{0}")]
    Call(CallFailure),
    /// A device ordinal past the visible devices.
    #[error("HIP device {ordinal} does not exist ({count} visible)")]
    NoSuchDevice { ordinal: usize, count: usize },
    /// The runtime reported device properties that cannot be right (for
    /// example bindings built from another ROCm's headers).
    #[error("HIP device {ordinal} reported impossible properties: {what}")]
    BadProperties { ordinal: usize, what: String },
    /// An allocation past its partition's memory budget.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// A compute-unit mask that selects nothing or CUs the device lacks.
    #[error("invalid CU mask: {0}")]
    CuMask(String),
    /// Bytes that are not an AMD GPU code object.
    #[error("invalid code object: {0}")]
    CodeObject(String),
    /// A kernel name the runtime cannot be asked for.
    #[error("invalid kernel name {name:?}: {why}")]
    KernelName { name: String, why: &'static str },
    /// Grid, block, shared memory or arguments outside the device's limits.
    #[error("invalid kernel launch: {0}")]
    Launch(String),
    /// A copy whose lengths or offsets do not fit the buffer.
    #[error("invalid copy: {0}")]
    Copy(String),
    /// Objects of different devices used together (a stream of device 0
    /// with a kernel of device 1).
    #[error("{what} belongs to HIP device {got}, expected device {expected}")]
    WrongDevice {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

impl HipError {
    /// Whether this means "nothing to run on here" (as opposed to a
    /// failure on a device that exists).
    pub fn is_no_device(&self) -> bool {
        matches!(self, HipError::NoDevice(_) | HipError::NoDeviceCounted)
    }

    /// What the failure means for the device: out of memory (its own or a
    /// partition's budget), lost (a fault that poisons the context, so
    /// nothing more can run on it until the process restarts), or a failed
    /// call on a device that is still fine.
    pub fn device_error_kind(&self) -> DeviceErrorKind {
        match self {
            HipError::Budget(_) => DeviceErrorKind::OutOfMemory,
            HipError::Call(f) if f.name == "hipErrorOutOfMemory" => DeviceErrorKind::OutOfMemory,
            HipError::Call(f) if STICKY.contains(&f.name.as_str()) => DeviceErrorKind::Lost,
            HipError::NoDevice(_) | HipError::NoDeviceCounted => DeviceErrorKind::Lost,
            _ => DeviceErrorKind::Failed,
        }
    }

    /// This error as the kernels' device interface reports it.
    pub fn to_device_error(&self, operation: impl Into<String>) -> DeviceError {
        DeviceError::of_kind(self.device_error_kind(), operation, self.to_string())
    }
}

/// Runtime errors after which a HIP context cannot be used again (the
/// same set CUDA documents as sticky): a kernel's memory fault or trap,
/// an uncorrectable ECC error, the device gone.
const STICKY: &[&str] = &[
    "hipErrorIllegalAddress",
    "hipErrorLaunchFailure",
    "hipErrorLaunchTimeOut",
    "hipErrorECCNotCorrectable",
    "hipErrorHardwareStackError",
    "hipErrorIllegalInstruction",
    "hipErrorMisalignedAddress",
    "hipErrorInvalidAddressSpace",
    "hipErrorInvalidPc",
    "hipErrorAssert",
    "hipErrorContextIsDestroyed",
    "hipErrorDeinitialized",
    "hipErrorNoDevice",
];

/// A HIP runtime call that returned an error: which call, the code, and
/// what `hipGetErrorName` / `hipGetErrorString` say about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallFailure {
    /// The C function, e.g. `hipMalloc`.
    pub call: &'static str,
    /// The `hipError_t` value.
    pub code: i64,
    /// `hipGetErrorName`, e.g. `hipErrorOutOfMemory`.
    pub name: String,
    /// `hipGetErrorString` (ROCm 5 returns the name again).
    pub message: String,
}

impl std::fmt::Display for CallFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let CallFailure {
            call,
            code,
            name,
            message,
        } = self;
        if message.is_empty() || message == name {
            write!(f, "{call} failed: {name} ({code})")
        } else {
            write!(f, "{call} failed: {name} ({code}): {message}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(message: &str) -> CallFailure {
        CallFailure {
            call: "hipGetDeviceCount",
            code: 100,
            name: "hipErrorNoDevice".into(),
            message: message.into(),
        }
    }

    #[test]
    fn messages_name_the_call_the_code_and_the_runtime_text() {
        assert_eq!(
            HipError::NoDevice(failure("no ROCm-capable device is detected")).to_string(),
            "no HIP device visible: hipGetDeviceCount failed: hipErrorNoDevice (100): \
             no ROCm-capable device is detected"
        );
        assert!(HipError::NoDeviceCounted.is_no_device());
        assert!(HipError::NoDevice(failure("")).is_no_device());
        assert!(!HipError::Call(failure("")).is_no_device());
        assert_eq!(
            HipError::Call(failure("")).device_error_kind(),
            DeviceErrorKind::Lost,
            "hipErrorNoDevice after start: the device is gone"
        );
        let oom = CallFailure {
            call: "hipMalloc",
            code: 2,
            name: "hipErrorOutOfMemory".into(),
            message: "out of memory".into(),
        };
        assert_eq!(
            HipError::Call(oom).device_error_kind(),
            DeviceErrorKind::OutOfMemory
        );
        let fault = CallFailure {
            call: "hipStreamSynchronize",
            code: 700,
            name: "hipErrorIllegalAddress".into(),
            message: "an illegal memory access was encountered".into(),
        };
        let e = HipError::Call(fault).to_device_error("launch bh_add");
        assert_eq!(e.kind, DeviceErrorKind::Lost);
        assert_eq!(e.operation, "launch bh_add");
        assert!(e.message.contains("hipErrorIllegalAddress (700)"), "{e}");
        assert_eq!(
            HipError::Launch("grid too large".into()).device_error_kind(),
            DeviceErrorKind::Failed
        );
        // ROCm 5's hipGetErrorString repeats the name: said once.
        assert_eq!(
            HipError::Call(failure("hipErrorNoDevice")).to_string(),
            "hipGetDeviceCount failed: hipErrorNoDevice (100)"
        );
    }
}
