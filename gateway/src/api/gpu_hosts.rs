//! The gpu-hosts (admin listener):
//!
//! - `GET /admin/v1/gpu-hosts` (scope `gpu-hosts:read`): each host's state,
//!   models, load and dedicated partitions.
//! - `POST /admin/v1/gpu-hosts/{name}/drain` (`gpu-hosts:write`): the host
//!   takes no new generations; answers once its generations in flight
//!   from this gateway ended (200), or at the request timeout with those
//!   still running (202, still draining).
//! - `POST /admin/v1/gpu-hosts/{name}/resume` (`gpu-hosts:write`): back in
//!   rotation.
//!
//! Draining is this gateway replica's: with several replicas, drain the
//! host on each. Both changing calls write an `admin.action` entry.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::App;
use super::error::ApiError;
use super::identity::OperatorCall;
use crate::pool::{Host, HostStatus};

/// The name the admin API and `/readyz` give a status.
pub fn status_name(status: &HostStatus) -> &'static str {
    match status {
        HostStatus::Up => "up",
        HostStatus::Starting => "starting",
        HostStatus::Ejected { .. } => "ejected",
        HostStatus::Draining => "draining",
    }
}

/// `GET /admin/v1/gpu-hosts`.
pub async fn list(State(app): State<App>, Extension(_): Extension<OperatorCall>) -> Response {
    let data: Vec<Value> = app.hosts.hosts().iter().map(host_json).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn host_json(host: &Host) -> Value {
    let status = host.status();
    let ejected_for_ms = match status {
        HostStatus::Ejected { for_ms } => Some(for_ms),
        _ => None,
    };
    let load = host.load();
    json!({
        "object": "gpu_host",
        "name": host.name(),
        "target": host.target(),
        "state": status_name(&status),
        "ejected_for_ms": ejected_for_ms,
        "last_error": host.last_error(),
        "models": host.models().iter().collect::<Vec<_>>(),
        "outstanding": host.outstanding(),
        "queued": load.map(|l| l.queued),
        "running": load.map(|l| l.running),
        "kv_bytes": load.map(|l| l.kv_bytes),
        "kv_bytes_used": load.map(|l| l.kv_bytes_used),
        "dedicated_tenants": host.dedicated().iter().collect::<Vec<_>>(),
    })
}

/// `POST /admin/v1/gpu-hosts/{name}/drain`.
pub async fn drain(
    State(app): State<App>,
    Extension(call): Extension<OperatorCall>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    // Not done at all unless it can be recorded.
    if let Err(e) = app.audit.ready().await {
        return super::audit::unrecorded(e).into_response();
    }
    let started = std::time::Instant::now();
    let mut target = String::new();
    let result = async {
        let host = find(&app, name, &mut target)?;
        let timeout = app.snapshot.load().policy.gateway.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let (at_start, left) = host.drain(deadline, &app.metrics).await;
        Ok::<_, ApiError>(json!({
            "object": "gpu_host.drain",
            "name": host.name(),
            "state": if left == 0 { "drained" } else { "draining" },
            "streams_at_start": at_start,
            "streams_left": left,
            "waited_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }))
    }
    .await;
    let route = "POST /admin/v1/gpu-hosts/{name}/drain";
    let result =
        super::registrations::record_action(&app, &call.identity, route, target, result).await;
    match result {
        Ok(body) if body["streams_left"] == 0 => (StatusCode::OK, Json(body)).into_response(),
        Ok(body) => (StatusCode::ACCEPTED, Json(body)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `POST /admin/v1/gpu-hosts/{name}/resume`.
pub async fn resume(
    State(app): State<App>,
    Extension(call): Extension<OperatorCall>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    if let Err(e) = app.audit.ready().await {
        return super::audit::unrecorded(e).into_response();
    }
    let mut target = String::new();
    let result = find(&app, name, &mut target).map(|host| {
        host.resume(&app.metrics);
        host_json(&host)
    });
    let route = "POST /admin/v1/gpu-hosts/{name}/resume";
    let result =
        super::registrations::record_action(&app, &call.identity, route, target, result).await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The host the path names (`target` set to the name for the audit entry).
fn find(
    app: &App,
    name: Result<Path<String>, PathRejection>,
    target: &mut String,
) -> Result<Host, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::invalid_param("name", e.body_text()))?;
    target.clone_from(&name);
    app.hosts.get(&name).cloned().ok_or_else(|| {
        let names: Vec<&str> = app.hosts.hosts().iter().map(Host::name).collect();
        ApiError::not_found(
            "gpu_host_not_found",
            format!(
                "no gpu-host is named `{}` (this gateway's: {})",
                name.escape_debug(),
                names.join(", ")
            ),
        )
    })
}
