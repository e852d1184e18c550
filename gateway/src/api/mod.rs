//! The HTTP API: OpenAI-compatible inference, the model list and tenant
//! self-service on the public listener; the operator API and metrics on
//! the admin listener. Every route and who may call it is in
//! [`routes::ROUTES`]. Handlers read one policy [`Snapshot`] per request
//! and never wait on the control plane.

mod audit;
mod error;
mod generation;
mod hooks;
mod inference;
mod local_run;
mod openai;
mod partitions;
mod plugins;
mod registrations;
mod respond;
mod routes;
mod self_service;

use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use crate::auth::Verifiers;
use crate::limits::{Limiters, UsageBook};
use crate::metrics::Metrics;
use crate::plugins::PluginRegistry;
use crate::policy::Policy;
use crate::registration::ModelRegistry;
use crate::upstream::{Upstream, UpstreamState};

pub use error::ApiError;
pub use local_run::{LocalReport, LocalRun, LocalRunError, request_json, run_locally};
pub use openai::{Endpoint, InferenceRequest, Prompt};
pub use routes::{Access, Listener, Method, ROUTES, Route, TenantCall};

/// Everything a request reads from the control plane, published as one
/// value so a request sees a consistent policy, keys and limits.
#[derive(Debug)]
pub struct Snapshot {
    pub policy: Policy,
    pub verifiers: Verifiers,
    pub limiters: Limiters,
}

/// Shared state of every handler.
#[derive(Clone, Debug)]
pub struct App {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// The gpu-host, ready once it listens and the configured models are
    /// loaded.
    pub upstream: Upstream,
    /// The registered models: the request path serves only these
    /// (`get`); the registration API (`registrations.rs`) changes them.
    pub models: ModelRegistry,
    pub metrics: Arc<Metrics>,
    /// Tenant plugins: the request path reads them with `get`; the plugin
    /// API (`plugins.rs`) uploads and deletes them.
    pub plugins: PluginRegistry,
    /// The cap on plugin code running at once (`[plugins]
    /// max_concurrent_calls`), shared fairly by tenants.
    pub plugin_gate: Arc<crate::plugins::HookGate>,
    /// The audit log: control-plane actions append to it, the admin API
    /// (`audit.rs`) reads it. Never touched by the inference path.
    pub audit: crate::audit::Audit,
    /// Every tenant's usage by model and day (`GET /v1/usage`).
    pub usage: UsageBook,
}

/// The public listener's router: tenants' routes and health. Every
/// `/admin/...` path is 404 here. `max_body_bytes` is the gateway-wide cap,
/// enforced while the body is read; tenants' lower caps are checked after
/// auth. Plugin uploads read their body themselves, capped at the plugin
/// size limit.
pub fn router(app: App, max_body_bytes: usize) -> Router {
    routes::router(app, Listener::Public, max_body_bytes)
}

/// The admin listener's router: the operator API, `/metrics` and health.
pub fn admin_router(app: App, max_body_bytes: usize) -> Router {
    routes::router(app, Listener::Admin, max_body_bytes)
}

/// A unique, unpredictable-enough id for a request (24 hex chars) and a
/// sampling seed for requests that bring none. Neither needs to be secret:
/// one OS random draw per process, then SplitMix64 over a counter (a
/// `getrandom` syscall per request showed up in the gateway's profile).
fn request_id() -> String {
    let n = next_draw();
    format!("{:016x}{:08x}", splitmix64(n), n as u32)
}

/// A seed for a request without one.
fn random_seed() -> u64 {
    splitmix64(next_draw() ^ 0x5eed_5eed_5eed_5eed)
}

fn next_draw() -> u64 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: OnceLock<AtomicU64> = OnceLock::new();
    COUNTER
        .get_or_init(|| AtomicU64::new(rand_core::RngCore::next_u64(&mut rand_core::OsRng)))
        .fetch_add(1, Ordering::Relaxed)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `GET /v1/models`: the models this tenant may use that are registered
/// (and that the host serves, when it can be asked).
async fn models(State(app): State<App>, Extension(call): Extension<TenantCall>) -> Response {
    let TenantCall { identity, snapshot } = call;
    let Some(tenant) = snapshot.policy.tenants.get(&identity.tenant) else {
        return ApiError::internal("a verified tenant is missing from the policy").into_response();
    };
    let served = app.upstream.list_models().await.ok();
    let data: Vec<_> = tenant
        .models
        .iter()
        .filter(|name| app.models.get(name).is_some())
        .filter(|name| {
            served
                .as_ref()
                .is_none_or(|served| served.iter().any(|m| &m.name == *name))
        })
        .map(|name| json!({"id": name, "object": "model", "created": 0, "owned_by": "bulkhead"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: a policy is loaded, the gpu-host takes requests and the
/// configured models have been loaded (or refused, loudly).
async fn readyz(State(app): State<App>) -> Response {
    match app.upstream.state() {
        UpstreamState::Ready => (StatusCode::OK, "ready\n").into_response(),
        state => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: gpu-host {state:?}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(app): State<App>) -> Response {
    app.metrics
        .upstream_ready
        .set(i64::from(app.upstream.state() == UpstreamState::Ready));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("unknown_url", "no such endpoint")
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_unique_and_fixed_width() {
        let ids: std::collections::BTreeSet<String> =
            (0..1000).map(|_| super::request_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(
            ids.iter()
                .all(|id| id.len() == 24 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }
}
