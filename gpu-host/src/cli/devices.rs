use anyhow::bail;
use bulkhead_gpu_host::cuda::{self, CudaAvailability, CudaDeviceInfo};
use bulkhead_gpu_host::hip::{self, DeviceProperties, HipAvailability};
use bulkhead_partition::format_bytes;
use clap::Args;
use serde_json::json;

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print `{"hip": [...], "cuda": [...]}` (every property) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the HIP and the CUDA devices, one line each; no device of either
/// kind is an error exit saying why for each, so scripts can test for a
/// usable GPU.
pub fn run(a: DevicesArgs) -> anyhow::Result<()> {
    let (hip_devices, hip_why) = match hip::probe() {
        HipAvailability::Devices(devices) => (devices, None),
        HipAvailability::NotBuilt => (Vec::new(), Some(hip::HipError::NotBuilt.to_string())),
        HipAvailability::Unavailable(err) => (Vec::new(), Some(err.to_string())),
    };
    let (cuda_devices, cuda_why) = match cuda::probe() {
        CudaAvailability::Devices(devices) => (devices, None),
        CudaAvailability::NotBuilt => (
            Vec::new(),
            Some("this build of bulkhead-gpu-host has no CUDA support (`--features cuda`)".into()),
        ),
        CudaAvailability::Unavailable(why) => (Vec::new(), Some(why)),
    };
    if hip_devices.is_empty() && cuda_devices.is_empty() {
        bail!(
            "no GPU device: HIP: {}; CUDA: {}",
            hip_why.unwrap_or_default(),
            cuda_why.unwrap_or_default()
        );
    }
    if a.json {
        let report = json!({ "hip": hip_devices, "cuda": cuda_devices });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for device in &hip_devices {
            println!("hip   {}", hip_line(device));
        }
        for device in &cuda_devices {
            println!("cuda  {}", cuda_line(device));
        }
    }
    Ok(())
}

/// `0  AMD Instinct MI325X  gfx942:sramecc+:xnack-  304 CUs  wave64  255GiB free of 256GiB  pci 0000:0c:00`
fn hip_line(d: &DeviceProperties) -> String {
    format!(
        "{}  {}  {}  {} CUs  wave{}  {} free of {}  pci {:04x}:{:02x}:{:02x}",
        d.ordinal,
        d.name,
        d.gcn_arch_name,
        d.compute_units,
        d.warp_size,
        format_bytes(d.free_memory_bytes),
        format_bytes(d.total_memory_bytes),
        d.pci_domain,
        d.pci_bus,
        d.pci_device
    )
}

/// `0  NVIDIA H200  sm_90  132 SMs  139GiB free of 140GiB  driver 12.8  green contexts`
fn cuda_line(d: &CudaDeviceInfo) -> String {
    format!(
        "{}  {}  {}  {} SMs  {} free of {}  driver {}.{}  {}",
        d.ordinal,
        d.name,
        d.arch(),
        d.multiprocessors,
        format_bytes(d.free_memory_bytes),
        format_bytes(d.total_memory_bytes),
        d.driver_version / 1000,
        d.driver_version % 1000 / 10,
        if d.green_contexts {
            "green contexts"
        } else {
            "no green contexts"
        }
    )
}
