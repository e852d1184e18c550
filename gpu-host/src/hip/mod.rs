//! The HIP runtime, safely: devices, device memory charged to partition
//! budgets, streams (optionally CU-masked), events, code-object modules
//! and kernel launches. The FFI lives in `runtime/` and is built only with
//! cargo feature `hip`; without it [`probe`] says so and nothing else of
//! the runtime exists. Budgets, CU masks, code-object checks, launch
//! limits and argument packing are plain Rust, built and tested always.

mod budget;
mod code_object;
mod cu_mask;
mod error;
// `unsafe trait KernelArg` and the byte view of a pushed argument.
#[allow(unsafe_code)]
mod launch;
mod props;

#[cfg(feature = "hip")]
#[allow(unsafe_code)]
mod runtime;

pub use budget::{BUDGET_GRANULE_BYTES, BudgetError, MemoryBudget, Reservation};
pub use code_object::{CodeObject, MAX_CODE_OBJECT_BYTES};
pub use cu_mask::{check_cu_mask, cu_mask_for};
pub use error::{CallFailure, HipError};
pub use launch::{DevicePtr, Dim3, KernelArg, KernelArgs, LaunchLimits, MAX_KERNEL_ARG_BYTES};
pub use props::DeviceProperties;
#[cfg(test)]
pub(crate) use props::tests::mi325x as test_mi325x;
#[cfg(feature = "hip")]
pub use runtime::{
    Device, DeviceBuffer, DeviceCopy, Event, Function, MemoryInfo, Module, RuntimeVersion, Stream,
    devices, runtime_version,
};

/// Whether this build has HIP support (cargo feature `hip`).
pub const BUILT_WITH_HIP: bool = cfg!(feature = "hip");

/// What HIP this process can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HipAvailability {
    /// Built without feature `hip`.
    NotBuilt,
    /// Built with HIP, but the runtime sees no device (the error says what
    /// the runtime answered) or could not describe the ones it sees.
    Unavailable(HipError),
    /// These devices, in ordinal order (never empty).
    Devices(Vec<DeviceProperties>),
}

/// Asks the runtime which devices are visible. Never panics: no driver,
/// no `/dev/kfd` or no GPU is [`HipAvailability::Unavailable`].
pub fn probe() -> HipAvailability {
    #[cfg(feature = "hip")]
    {
        match devices() {
            Ok(found) => HipAvailability::Devices(found),
            Err(err) => HipAvailability::Unavailable(err),
        }
    }
    #[cfg(not(feature = "hip"))]
    {
        HipAvailability::NotBuilt
    }
}
