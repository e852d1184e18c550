//! The FFI half of the HIP layer (feature `hip`): every call into
//! `libamdhip64` is here, each `unsafe` block with its SAFETY argument,
//! every error code turned into a [`HipError`] naming the call.

mod device;
mod event;
mod memory;
mod module;
mod stream;

use std::ffi::{CStr, c_char};

use bulkhead_hip_sys as sys;
use sys::hipError_t;

use super::{CallFailure, HipError};

pub use device::{Device, MemoryInfo, devices};
pub use event::Event;
pub use memory::{DeviceBuffer, DeviceCopy};
pub use module::{Function, Module};
pub use stream::Stream;

/// `Ok` for `hipSuccess`, else the failure of `call`.
fn check(call: &'static str, code: hipError_t) -> Result<(), HipError> {
    if code == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(HipError::Call(failure(call, code)))
    }
}

/// What the runtime says about `code`.
fn failure(call: &'static str, code: hipError_t) -> CallFailure {
    // SAFETY: both accept any code and return a pointer to a static C
    // string (or null, handled by `text`).
    let (name, message) = unsafe { (sys::hipGetErrorName(code), sys::hipGetErrorString(code)) };
    CallFailure {
        call,
        code: i64::from(code.0),
        name: text(name),
        message: text(message),
    }
}

/// A C string the runtime owns, copied; "" for null.
fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-null pointers from the runtime's string calls point to
    // NUL-terminated static strings.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Codes with which `hipInit` / `hipGetDeviceCount` say there is nothing
/// to run on: no GPU, no usable `/dev/kfd`, a driver too old. (ROCm 5.2's
/// `hipInit` answers `hipErrorInvalidDevice` on a machine without a GPU.)
fn means_no_device(code: hipError_t) -> bool {
    [
        hipError_t::hipErrorNoDevice,
        hipError_t::hipErrorInvalidDevice,
        hipError_t::hipErrorInsufficientDriver,
        hipError_t::hipErrorNotInitialized,
    ]
    .contains(&code)
}

/// `hipInit` then `hipGetDeviceCount`; "nothing to run on" is
/// [`HipError::NoDevice`] or [`HipError::NoDeviceCounted`], never `Ok(0)`.
fn device_count() -> Result<usize, HipError> {
    let no_device = |call, code| {
        if means_no_device(code) {
            HipError::NoDevice(failure(call, code))
        } else {
            HipError::Call(failure(call, code))
        }
    };
    // SAFETY: hipInit takes flags (0 is the only defined value) and may be
    // called any number of times.
    let code = unsafe { sys::hipInit(0) };
    if code != hipError_t::hipSuccess {
        return Err(no_device("hipInit", code));
    }
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer for the call.
    let code = unsafe { sys::hipGetDeviceCount(&mut count) };
    if code != hipError_t::hipSuccess {
        return Err(no_device("hipGetDeviceCount", code));
    }
    match usize::try_from(count) {
        Ok(0) | Err(_) => Err(HipError::NoDeviceCounted),
        Ok(count) => Ok(count),
    }
}

/// The HIP driver and runtime versions (`hipDriverGetVersion`,
/// `hipRuntimeGetVersion`), e.g. 50221153 for ROCm 5.2.3's HIP 5.2.21153.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub driver: i32,
    pub runtime: i32,
}

/// The versions; works without a device.
pub fn runtime_version() -> Result<RuntimeVersion, HipError> {
    let (mut driver, mut runtime) = (0, 0);
    // SAFETY: valid out-pointers for each call.
    check("hipDriverGetVersion", unsafe {
        sys::hipDriverGetVersion(&mut driver)
    })?;
    // SAFETY: as above.
    check("hipRuntimeGetVersion", unsafe {
        sys::hipRuntimeGetVersion(&mut runtime)
    })?;
    Ok(RuntimeVersion { driver, runtime })
}
