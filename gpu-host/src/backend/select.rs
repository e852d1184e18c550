//! Which backend `serve` runs on: the operator's `--backend` against what
//! this build and this machine have. Pure decision over a probe result, so
//! every combination is tested without a GPU; `cli/serve.rs` acts on it.

use std::fmt;

use crate::hip::{DeviceProperties, HipAvailability, HipError};

/// `--backend`: what the operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// HIP when this build has it and a device is visible, else the CPU
    /// (saying why in one log line).
    Auto,
    /// The CPU backend, whatever else exists.
    Cpu,
    /// HIP or nothing: no HIP device is an error, not a silent fallback.
    Hip,
}

/// Whether the engine can run a model on HIP (the HIP `Backend`,
/// `backend/hip/`). Separate from the runtime being present: a
/// build can see a device before its engine can use one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HipEngine {
    Available,
    Missing,
}

/// This build's engine: `HipBackend` (backend/hip/) serves on a
/// device whenever the runtime finds one (only builds with `hip` do).
pub const HIP_ENGINE: HipEngine = HipEngine::Available;

/// What `serve` will run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendPlan {
    /// The CPU backend; `fallback` says why HIP was not used when the
    /// choice was `auto` and HIP was built in (one log line).
    Cpu { fallback: Option<String> },
    /// HIP on this device.
    Hip { device: DeviceProperties },
}

/// `--backend hip` that cannot be honoured.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendSelectError {
    #[error("--backend hip: {0}")]
    HipUnavailable(HipError),
    #[error("--backend hip --hip-device {ordinal}: {count} HIP device(s) visible")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error(
        "--backend hip: {device} is visible, but this build's engine has no HIP backend yet \
         (use --backend cpu or auto)"
    )]
    NoHipEngine { device: DeviceLabel },
}

/// "HIP device 0 (AMD Instinct MI325X, gfx942)", for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLabel(String);

impl DeviceLabel {
    pub fn of(device: &DeviceProperties) -> DeviceLabel {
        DeviceLabel(format!(
            "HIP device {} ({}, {})",
            device.ordinal,
            device.name,
            device.arch()
        ))
    }
}

impl fmt::Display for DeviceLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decides the backend for `choice` on device `hip_device`, given what the
/// HIP runtime reported and whether the engine can use HIP.
pub fn plan_backend(
    choice: BackendChoice,
    hip_device: usize,
    hip: &HipAvailability,
    engine: HipEngine,
) -> Result<BackendPlan, BackendSelectError> {
    let usable = match hip {
        HipAvailability::NotBuilt => Err(HipError::NotBuilt),
        HipAvailability::Unavailable(err) => Err(err.clone()),
        HipAvailability::Devices(devices) => Ok(devices),
    };
    match (choice, usable) {
        (BackendChoice::Cpu, _) => Ok(BackendPlan::Cpu { fallback: None }),
        // Nothing to fall back from: a CPU-only build says nothing.
        (BackendChoice::Auto, Err(HipError::NotBuilt)) => Ok(BackendPlan::Cpu { fallback: None }),
        (BackendChoice::Auto, Err(err)) => Ok(BackendPlan::Cpu {
            fallback: Some(err.to_string()),
        }),
        (BackendChoice::Hip, Err(err)) => Err(BackendSelectError::HipUnavailable(err)),
        (choice, Ok(devices)) => {
            let Some(device) = devices.get(hip_device) else {
                let err = BackendSelectError::NoSuchDevice {
                    ordinal: hip_device,
                    count: devices.len(),
                };
                return match choice {
                    BackendChoice::Hip => Err(err),
                    _ => Ok(BackendPlan::Cpu {
                        fallback: Some(err.to_string()),
                    }),
                };
            };
            match (engine, choice) {
                (HipEngine::Available, _) => Ok(BackendPlan::Hip {
                    device: device.clone(),
                }),
                (HipEngine::Missing, BackendChoice::Hip) => Err(BackendSelectError::NoHipEngine {
                    device: DeviceLabel::of(device),
                }),
                (HipEngine::Missing, _) => Ok(BackendPlan::Cpu {
                    fallback: Some(format!(
                        "{} is visible, but this build's engine has no HIP backend yet",
                        DeviceLabel::of(device)
                    )),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hip::CallFailure;
    use BackendChoice::{Auto, Cpu, Hip};

    fn no_device() -> HipAvailability {
        HipAvailability::Unavailable(HipError::NoDevice(CallFailure {
            call: "hipInit",
            code: 101,
            name: "hipErrorInvalidDevice".into(),
            message: "hipErrorInvalidDevice".into(),
        }))
    }

    fn one_device() -> HipAvailability {
        HipAvailability::Devices(vec![crate::hip::test_mi325x()])
    }

    fn plan(
        choice: BackendChoice,
        hip: &HipAvailability,
        engine: HipEngine,
    ) -> Result<BackendPlan, String> {
        plan_backend(choice, 0, hip, engine).map_err(|e| e.to_string())
    }

    fn fallback(reason: &str) -> Result<BackendPlan, String> {
        Ok(BackendPlan::Cpu {
            fallback: Some(reason.into()),
        })
    }

    const CPU: Result<BackendPlan, String> = Ok(BackendPlan::Cpu { fallback: None });

    #[test]
    fn cpu_is_always_honoured_silently() {
        for hip in [HipAvailability::NotBuilt, no_device(), one_device()] {
            for engine in [HipEngine::Available, HipEngine::Missing] {
                assert_eq!(plan(Cpu, &hip, engine), CPU);
            }
        }
    }

    #[test]
    fn auto_falls_back_to_the_cpu_saying_why() {
        assert_eq!(
            plan(Auto, &HipAvailability::NotBuilt, HipEngine::Available),
            CPU
        );
        assert_eq!(
            plan(Auto, &no_device(), HipEngine::Available),
            fallback("no HIP device visible: hipInit failed: hipErrorInvalidDevice (101)")
        );
        assert_eq!(
            plan(Auto, &one_device(), HipEngine::Missing),
            fallback(
                "HIP device 0 (AMD Instinct MI325X, gfx942) is visible, but this build's \
                 engine has no HIP backend yet"
            )
        );
        assert_eq!(
            plan_backend(Auto, 3, &one_device(), HipEngine::Available).map_err(|e| e.to_string()),
            fallback("--backend hip --hip-device 3: 1 HIP device(s) visible")
        );
        let HipAvailability::Devices(devices) = one_device() else {
            unreachable!()
        };
        assert_eq!(
            plan(Auto, &one_device(), HipEngine::Available),
            Ok(BackendPlan::Hip {
                device: devices[0].clone()
            })
        );
    }

    #[test]
    fn hip_is_hip_or_a_clear_error() {
        assert_eq!(
            plan(Hip, &HipAvailability::NotBuilt, HipEngine::Available).unwrap_err(),
            "--backend hip: this build of bulkhead-gpu-host has no HIP support (rebuild with \
             `--features hip` where ROCm is installed)"
        );
        assert_eq!(
            plan(Hip, &no_device(), HipEngine::Available).unwrap_err(),
            "--backend hip: no HIP device visible: hipInit failed: hipErrorInvalidDevice (101)"
        );
        assert_eq!(
            plan(Hip, &one_device(), HipEngine::Missing).unwrap_err(),
            "--backend hip: HIP device 0 (AMD Instinct MI325X, gfx942) is visible, but this \
             build's engine has no HIP backend yet (use --backend cpu or auto)"
        );
        assert_eq!(
            plan_backend(Hip, 1, &one_device(), HipEngine::Available)
                .unwrap_err()
                .to_string(),
            "--backend hip --hip-device 1: 1 HIP device(s) visible"
        );
        assert!(matches!(
            plan(Hip, &one_device(), HipEngine::Available),
            Ok(BackendPlan::Hip { .. })
        ));
    }
}
