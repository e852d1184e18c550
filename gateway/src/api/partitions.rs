//! `GET /admin/v1/partitions` (scope `partitions:read`): each gpu-host's
//! partitions as its `Partitions` RPC reports them, as JSON (shape in
//! docs/partitions.md): one device per host. Read only; one RPC per host.

use axum::Json;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use bulkhead_partition::PartitionsReport;
use serde_json::{Value, json};

use super::App;
use super::error::ApiError;
use super::identity::OperatorCall;

/// `GET /admin/v1/partitions`.
pub async fn list(State(app): State<App>, Extension(_): Extension<OperatorCall>) -> Response {
    let hosts = app.hosts.hosts();
    let reports =
        futures_util::future::join_all(hosts.iter().map(|h| h.requests().partitions())).await;
    let mut data = Vec::new();
    for (host, report) in hosts.iter().zip(reports) {
        match report {
            Ok(report) => {
                let mut device = report_json(&report);
                device["host"] = json!(host.name());
                data.push(device);
            }
            // One host: its error is the answer, as it always was.
            Err(e) if hosts.len() == 1 => return ApiError::from(e).into_response(),
            Err(e) => data.push(json!({
                "object": "device",
                "host": host.name(),
                "error": e.to_string(),
            })),
        }
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// One host's report as JSON: the device, its partitions, and each
/// partition's tenants.
pub fn report_json(report: &PartitionsReport) -> Value {
    let partitions: Vec<Value> = report
        .partitions
        .iter()
        .map(|p| {
            let tenants: Vec<Value> = p
                .tenants
                .iter()
                .map(|t| {
                    json!({
                        "tenant": t.tenant,
                        "weight": t.weight,
                        "kv_blocks": t.kv_blocks,
                        "kv_bytes": t.kv_bytes,
                        "guaranteed_bytes": t.guaranteed_bytes,
                        "budget_bytes": t.budget_bytes,
                        "preemptions": t.preemptions,
                        "kv_refusals": t.kv_refusals,
                        "queued": t.queued,
                        "queue_guaranteed": t.queue_guaranteed,
                        "queue_refusals": t.queue_refusals,
                    })
                })
                .collect();
            json!({
                "id": p.id,
                "kind": p.kind.as_str(),
                "cores": p.units,
                "host_cpus": p.host_cpus,
                "memory_bytes": p.memory_bytes,
                "memory_used_bytes": p.memory_used_bytes,
                "queued": p.queued,
                "running": p.running,
                "preemptions": p.preemptions,
                "device_errors": p.device_errors,
                "draining": p.draining,
                "tenants": tenants,
            })
        })
        .collect();
    json!({
        "object": "device",
        "device": report.device,
        "unit": report.unit,
        "compute_units": report.compute_units,
        "memory_bytes": report.memory_bytes,
        "generation": report.epoch,
        "isolation": report.isolation,
        "partitions": partitions,
    })
}
