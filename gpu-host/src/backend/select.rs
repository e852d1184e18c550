//! Which backend `serve` runs on: the operator's `--backend` against what
//! this build and this machine have. Pure decision over a probe result, so
//! every combination is tested without a GPU; `cli/serve.rs` acts on it.

use std::fmt;

use crate::cuda::{CudaAvailability, CudaDeviceInfo};
use crate::hip::{DeviceProperties, HipAvailability, HipError};

/// `--backend`: what the operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// HIP when this build has it and a device is visible, else CUDA
    /// likewise, else the CPU (saying why in one log line).
    Auto,
    /// The CPU backend, whatever else exists.
    Cpu,
    /// HIP or nothing: no HIP device is an error, not a silent fallback.
    Hip,
    /// CUDA or nothing, as `hip`.
    Cuda,
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
    /// CUDA on this device.
    Cuda { device: CudaDeviceInfo },
}

/// `--backend hip` that cannot be honoured.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendSelectError {
    #[error("--backend hip: {0}")]
    HipUnavailable(HipError),
    #[error("--backend hip --hip-device {ordinal}: {count} HIP device(s) visible")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("--backend cuda: {0}")]
    CudaUnavailable(String),
    #[error("--backend cuda --cuda-device {ordinal}: {count} CUDA device(s) visible")]
    NoSuchCudaDevice { ordinal: usize, count: usize },
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

/// Which device of each kind `--backend` means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ordinals {
    pub hip: usize,
    pub cuda: usize,
}

/// Decides the backend for `choice` on the devices `ordinals` name, given
/// what the HIP runtime and the CUDA driver reported and whether the engine
/// can use HIP. `auto` prefers HIP, then CUDA.
pub fn plan_backend(
    choice: BackendChoice,
    ordinals: Ordinals,
    hip: &HipAvailability,
    cuda: &CudaAvailability,
    engine: HipEngine,
) -> Result<BackendPlan, BackendSelectError> {
    let cuda_plan = || match cuda {
        CudaAvailability::NotBuilt => Err(BackendSelectError::CudaUnavailable(
            "this build of bulkhead-gpu-host has no CUDA support (rebuild with `--features cuda`)"
                .into(),
        )),
        CudaAvailability::Unavailable(why) => Err(BackendSelectError::CudaUnavailable(why.clone())),
        CudaAvailability::Devices(devices) => devices
            .get(ordinals.cuda)
            .map(|device| BackendPlan::Cuda {
                device: device.clone(),
            })
            .ok_or(BackendSelectError::NoSuchCudaDevice {
                ordinal: ordinals.cuda,
                count: devices.len(),
            }),
    };
    match choice {
        BackendChoice::Cuda => cuda_plan(),
        BackendChoice::Auto => match plan_hip(choice, ordinals.hip, hip, engine)? {
            BackendPlan::Cpu { fallback } => match (cuda_plan(), cuda) {
                (Ok(plan), _) => Ok(plan),
                // A build without CUDA has nothing to say about it.
                (Err(_), CudaAvailability::NotBuilt) => Ok(BackendPlan::Cpu {
                    fallback: fallback.map(|why| format!("not HIP: {why}")),
                }),
                (Err(err), _) => {
                    let cuda_why = err.to_string().replacen("--backend cuda: ", "", 1);
                    let why = match fallback {
                        Some(hip_why) => format!("not HIP: {hip_why}; not CUDA: {cuda_why}"),
                        None => format!("not CUDA: {cuda_why}"),
                    };
                    Ok(BackendPlan::Cpu {
                        fallback: Some(why),
                    })
                }
            },
            plan => Ok(plan),
        },
        _ => plan_hip(choice, ordinals.hip, hip, engine),
    }
}

/// `cpu`, `hip`, or `auto` as far as HIP goes.
fn plan_hip(
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
        // `cuda` never asks for HIP (plan_backend answers it).
        (BackendChoice::Hip | BackendChoice::Cuda, Err(err)) => {
            Err(BackendSelectError::HipUnavailable(err))
        }
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
    use BackendChoice::{Auto, Cpu, Cuda, Hip};

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
        plan_backend(
            choice,
            Ordinals::default(),
            hip,
            &CudaAvailability::NotBuilt,
            engine,
        )
        .map_err(|e| e.to_string())
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
            fallback("not HIP: no HIP device visible: hipInit failed: hipErrorInvalidDevice (101)")
        );
        assert_eq!(
            plan(Auto, &one_device(), HipEngine::Missing),
            fallback(
                "not HIP: HIP device 0 (AMD Instinct MI325X, gfx942) is visible, but this \
                 build's engine has no HIP backend yet"
            )
        );
        assert_eq!(
            plan_backend(
                Auto,
                Ordinals { hip: 3, cuda: 0 },
                &one_device(),
                &CudaAvailability::NotBuilt,
                HipEngine::Available
            )
            .map_err(|e| e.to_string()),
            fallback("not HIP: --backend hip --hip-device 3: 1 HIP device(s) visible")
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
            plan_backend(
                Hip,
                Ordinals { hip: 1, cuda: 0 },
                &one_device(),
                &CudaAvailability::NotBuilt,
                HipEngine::Available
            )
            .unwrap_err()
            .to_string(),
            "--backend hip --hip-device 1: 1 HIP device(s) visible"
        );
        assert!(matches!(
            plan(Hip, &one_device(), HipEngine::Available),
            Ok(BackendPlan::Hip { .. })
        ));
    }

    fn h200() -> CudaAvailability {
        CudaAvailability::Devices(vec![CudaDeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            free_memory_bytes: 140 << 30,
            total_memory_bytes: 141 << 30,
            driver_version: 12080,
            green_contexts: true,
        }])
    }

    fn with_cuda(
        choice: BackendChoice,
        hip: &HipAvailability,
        cuda: &CudaAvailability,
    ) -> Result<BackendPlan, String> {
        plan_backend(choice, Ordinals::default(), hip, cuda, HipEngine::Available)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn auto_prefers_hip_then_cuda_then_the_cpu_saying_why() {
        assert!(matches!(
            with_cuda(Auto, &one_device(), &h200()),
            Ok(BackendPlan::Hip { .. })
        ));
        assert!(matches!(
            with_cuda(Auto, &HipAvailability::NotBuilt, &h200()),
            Ok(BackendPlan::Cuda { .. })
        ));
        assert!(matches!(
            with_cuda(Auto, &no_device(), &h200()),
            Ok(BackendPlan::Cuda { .. })
        ));
        let none =
            CudaAvailability::Unavailable("no CUDA driver: libcuda.so could not be loaded".into());
        assert_eq!(
            with_cuda(Auto, &no_device(), &none),
            fallback(
                "not HIP: no HIP device visible: hipInit failed: hipErrorInvalidDevice (101); \
                 not CUDA: no CUDA driver: libcuda.so could not be loaded"
            )
        );
        assert_eq!(
            with_cuda(Auto, &HipAvailability::NotBuilt, &none),
            fallback("not CUDA: no CUDA driver: libcuda.so could not be loaded")
        );
    }

    #[test]
    fn cuda_is_cuda_or_a_clear_error() {
        assert!(matches!(
            with_cuda(Cuda, &one_device(), &h200()),
            Ok(BackendPlan::Cuda { .. })
        ));
        assert_eq!(
            with_cuda(Cuda, &one_device(), &CudaAvailability::NotBuilt).unwrap_err(),
            "--backend cuda: this build of bulkhead-gpu-host has no CUDA support (rebuild with \
             `--features cuda`)"
        );
        let none = CudaAvailability::Unavailable("the CUDA driver reports no device".into());
        assert_eq!(
            with_cuda(Cuda, &one_device(), &none).unwrap_err(),
            "--backend cuda: the CUDA driver reports no device"
        );
        assert_eq!(
            plan_backend(
                Cuda,
                Ordinals { hip: 0, cuda: 2 },
                &HipAvailability::NotBuilt,
                &h200(),
                HipEngine::Available
            )
            .unwrap_err()
            .to_string(),
            "--backend cuda --cuda-device 2: 1 CUDA device(s) visible"
        );
    }
}
