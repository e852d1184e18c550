use anyhow::bail;
use bulkhead_gpu_host::hip::{self, DeviceProperties, HipAvailability};
use bulkhead_partition::format_bytes;
use clap::Args;

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print the devices as a JSON array (every property) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the HIP devices; no device (or no HIP in this build) is an error
/// exit saying which, so scripts can test for a usable GPU.
pub fn run(a: DevicesArgs) -> anyhow::Result<()> {
    let devices = match hip::probe() {
        HipAvailability::Devices(devices) => devices,
        HipAvailability::NotBuilt => bail!("{}", hip::HipError::NotBuilt),
        HipAvailability::Unavailable(err) => bail!("{err}"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
    } else {
        for device in &devices {
            println!("{}", line(device));
        }
    }
    Ok(())
}

/// `0  AMD Instinct MI325X  gfx942:sramecc+:xnack-  304 CUs  wave64  255GiB free of 256GiB  pci 0000:0c:00`
fn line(d: &DeviceProperties) -> String {
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
