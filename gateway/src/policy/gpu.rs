//! `[gpu]` in tenant files and the device of `[local_gpu_host]`, checked
//! with the partition manager the gpu-host will use (`bulkhead-partition`):
//! each value where it is written, then all tenants together, so
//! over-subscription is an error naming the tenants and the numbers.
//! Enforced by the gpu-host: the gateway sends it the tenant set
//! (`reconcile`, `SetPartitions`), and the host plans the
//! same way against its own device (`--threads` cores, `--kv-memory` bytes
//! of KV cache) and runs one pinned scheduler per partition. A local child
//! gets `--threads` and `--kv-memory` from this device (memory − model
//! reservation), so a set `policy check` accepts for a `cpu` device is one
//! the child accepts.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_partition::{
    Compute, Device, GpuRequest, Isolation, Layout, PartitionError, TenantRequest,
    default_kv_memory_bytes, format_bytes, host_cores, parse_bytes, plan,
};
use toml::Spanned;

use super::files::{GpuFile, IsolationFile, LocalGpuHostFile};
use super::{PolicyError, SourceFile, TenantPolicy};

const DEVICES: &str = "\"cpu\" or \"mi325x\"";

/// `[local_gpu_host]`'s device (`threads` cores by default) and the memory
/// it sets aside for model weights (by default the model files' sizes:
/// weights are loaded once, as they are on disk).
pub(super) fn check_device(
    source: &SourceFile,
    local: &LocalGpuHostFile,
    threads: Option<usize>,
    files_bytes: u64,
    errors: &mut Vec<PolicyError>,
) -> (Device, u64) {
    let memory = local
        .memory
        .as_ref()
        .and_then(|m| size(source, "memory", m, errors));
    let reservation = match &local.model_reservation {
        None => files_bytes,
        Some(written) => {
            let bytes = size(source, "model_reservation", written, errors).unwrap_or(files_bytes);
            if bytes < files_bytes {
                errors.push(source.error_at(
                    written.span(),
                    format!(
                        "`model_reservation` is {}, less than the model files take ({})",
                        format_bytes(bytes),
                        format_bytes(files_bytes)
                    ),
                ));
            }
            bytes
        }
    };
    let device = match local
        .device
        .as_ref()
        .map(|d| (d.get_ref().as_str(), d.span()))
    {
        None | Some(("cpu", _)) => cpu_device(threads, memory, reservation),
        Some(("mi325x", _)) => {
            if let Some(m) = &local.memory {
                errors.push(source.error_at(
                    m.span(),
                    "`memory` is set by the device for \"mi325x\" (256GiB); \
                     set it only for device = \"cpu\"",
                ));
            }
            Device::mi325x()
        }
        Some((other, span)) => {
            errors.push(source.error_at(
                span,
                format!("unknown device `{other}`: expected {DEVICES}"),
            ));
            Device::mi325x() // stand-in; the error discards it
        }
    };
    if reservation > device.memory_bytes {
        let span = local
            .model_reservation
            .as_ref()
            .or(local.memory.as_ref())
            .map_or(0..0, Spanned::span);
        errors.push(source.error_at(
            span,
            format!(
                "the model reservation ({}) is more than the {} device has ({})",
                format_bytes(reservation),
                device.name,
                format_bytes(device.memory_bytes)
            ),
        ));
    }
    (device, reservation)
}

/// The CPU device the local child runs: `threads` cores (default: all, as
/// the child counts them) and `memory` bytes; without `memory`, the
/// weights' `reservation` plus the KV memory the child takes by default
/// (`--kv-memory`'s default). The child is always started with
/// `--kv-memory` = memory − reservation ([`LocalGpuHost::kv_memory_bytes`]),
/// so it plans the tenants against the same numbers.
///
/// [`LocalGpuHost::kv_memory_bytes`]: super::LocalGpuHost::kv_memory_bytes
fn cpu_device(threads: Option<usize>, memory: Option<u64>, reservation: u64) -> Device {
    let cores = threads.map_or_else(host_cores, |t| u32::try_from(t).unwrap_or(u32::MAX));
    let memory = memory.unwrap_or_else(|| reservation.saturating_add(default_kv_memory_bytes()));
    // `threads` is at least 1 (checked) and host_cores() is too; the
    // stand-in is never used.
    Device::cpu(cores.max(1), memory).unwrap_or_else(|_| Device::mi325x())
}

/// `[gpu]` of tenant `tenant`, each value checked where it is written
/// (against `device` when the gateway knows it). `None` when a value is
/// wrong (the errors say which); no table is the default request.
pub(super) fn check_tenant(
    source: &SourceFile,
    tenant: &str,
    gpu: Option<&Spanned<GpuFile>>,
    device: Option<&Device>,
    errors: &mut Vec<PolicyError>,
) -> Option<GpuRequest> {
    let Some(table) = gpu else {
        return Some(GpuRequest::default());
    };
    let before = errors.len();
    let file = table.get_ref();
    let compute = match (&file.cus, &file.share) {
        (Some(_), Some(share)) => {
            errors.push(source.error_at(share.span(), "set `cus` or `share`, not both"));
            Compute::Unset
        }
        (Some(cus), None) => Compute::Cus(*cus.get_ref()),
        (None, Some(share)) => Compute::Share(*share.get_ref()),
        (None, None) => Compute::Unset,
    };
    let hbm_bytes = file
        .hbm
        .as_ref()
        .and_then(|hbm| size(source, "hbm", hbm, errors));
    let request = GpuRequest {
        compute,
        hbm_bytes,
        isolation: match file.isolation.as_ref().map(|i| *i.get_ref()) {
            Some(IsolationFile::Dedicated) => Isolation::Dedicated,
            Some(IsolationFile::Shared) | None => Isolation::Shared,
        },
        weight: file.weight.as_ref().map_or(1, |w| *w.get_ref()),
        kv_wait: file
            .kv_wait_ms
            .as_ref()
            .map(|ms| Duration::from_millis(*ms.get_ref())),
    };
    if let Err(found) = request.check(tenant, device) {
        for e in found {
            let (span, message) = match &e {
                PartitionError::InvalidRequest { field, reason, .. } => {
                    (field_span(table, field), format!("`{field}` {reason}"))
                }
                PartitionError::DedicatedWithoutMemory { .. } => (
                    file.isolation.as_ref().map_or(table.span(), Spanned::span),
                    "a dedicated partition needs `hbm` (its own memory budget)".to_string(),
                ),
                _ => (table.span(), e.to_string()),
            };
            errors.push(source.error_at(span, message));
        }
    }
    (errors.len() == before).then_some(request)
}

/// Where `[gpu]`'s `field` is written, or the table if it is not.
fn field_span(table: &Spanned<GpuFile>, field: &str) -> Range<usize> {
    let file = table.get_ref();
    let span = match field {
        "cus" => file.cus.as_ref().map(Spanned::span),
        "share" => file.share.as_ref().map(Spanned::span),
        "hbm" => file.hbm.as_ref().map(Spanned::span),
        "weight" => file.weight.as_ref().map(Spanned::span),
        "kv_wait_ms" => file.kv_wait_ms.as_ref().map(Spanned::span),
        _ => None,
    };
    span.unwrap_or_else(|| table.span())
}

/// A size such as `"24GiB"` written as `key`.
fn size(
    source: &SourceFile,
    key: &str,
    written: &Spanned<String>,
    errors: &mut Vec<PolicyError>,
) -> Option<u64> {
    parse_bytes(written.get_ref())
        .map_err(|e| errors.push(source.error_at(written.span(), format!("`{key}`: {e}"))))
        .ok()
}

/// Plans the partitions of `device` for every tenant. Each error is
/// reported in the file of the first tenant it names, at its `[gpu]` table
/// (`gpu_spans`) or else at the top.
pub(super) fn plan_partitions(
    device: &Device,
    model_reservation_bytes: u64,
    tenants: &BTreeMap<String, TenantPolicy>,
    gpu_spans: &BTreeMap<String, Range<usize>>,
    errors: &mut Vec<PolicyError>,
) -> Option<Arc<Layout>> {
    let requests: Vec<TenantRequest> = tenants
        .values()
        .map(|t| TenantRequest {
            tenant: t.id.clone(),
            gpu: t.gpu.clone(),
        })
        .collect();
    match plan(device, model_reservation_bytes, &requests) {
        Ok(layout) => Some(Arc::new(layout)),
        Err(found) => {
            for e in found {
                let first = e.tenants().first().and_then(|t| tenants.get(*t));
                errors.push(match first {
                    Some(tenant) => {
                        let span = gpu_spans.get(&tenant.id).cloned().unwrap_or(0..0);
                        tenant.source.error_at(span, e.to_string())
                    }
                    None => PolicyError::at_path("gateway.toml".as_ref(), e.to_string()),
                });
            }
            None
        }
    }
}

#[cfg(test)]
mod tests;
