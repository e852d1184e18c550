//! The HTTP API: OpenAI-compatible inference, the model list and tenant
//! self-service on the public listener; the operator API and metrics on
//! the admin listener. Every route and who may call it is in
//! [`routes::ROUTES`]. Handlers read one policy [`Snapshot`] per request
//! and never wait on the control plane.

mod audit;
mod deadline;
mod error;
mod generation;
mod gpu_hosts;
mod identity;
mod inference;
mod local_run;
mod openai;
mod partitions;
mod plugins;
mod registrations;
mod respond;
mod routes;
mod self_service;
pub mod trace;

use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use crate::limits::UsageBook;
use crate::metrics::Metrics;
use crate::plugins::PluginRegistry;
use crate::pool::HostPool;
use crate::reconcile::Reconciler;
use crate::snapshot::Snapshot;

pub use error::ApiError;
pub use identity::TenantCall;
pub use local_run::{LocalReport, LocalRun, LocalRunError, request_json, run_locally};
pub use openai::{Endpoint, InferenceRequest, Prompt};
pub use routes::{Access, Listener, Method, ROUTES, Route};

/// Shared state of every handler.
#[derive(Clone, Debug)]
pub struct App {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// `[limits] store` in Redis: admission asks it first (`None`: the
    /// snapshot's limiters decide alone).
    pub shared_limits: Option<crate::limits::SharedLimits>,
    /// The gpu-hosts: which one runs each generation (`crate::pool`).
    pub hosts: HostPool,
    /// The registered models: the request path serves only these
    /// (`get`); the registration API (`registrations.rs`) changes them.
    pub models: Reconciler,
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
    /// Each tenant's budget of plugin uploads and deletes.
    pub plugin_changes: crate::limits::ChangeLimiter,
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

/// A request's id: 128 random bits as 32 hex digits. Random, never a
/// counter: ids go back to tenants, and a counter would let one tenant
/// count the others' traffic.
fn request_id() -> String {
    let bytes: [u8; 16] = random_bytes();
    let mut id = String::with_capacity(32);
    for byte in bytes {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// A sampling seed for a request that brings none: random, so no output
/// can be reproduced from anything the gateway tells the client.
fn random_seed() -> u64 {
    u64::from_le_bytes(random_bytes())
}

/// `N` bytes from the OS's CSPRNG, drawn 4 KiB at a time per thread: a
/// `getrandom` syscall for every request showed up in the gateway's
/// profile, one per ~170 requests does not.
fn random_bytes<const N: usize>() -> [u8; N] {
    use std::cell::RefCell;
    const POOL_BYTES: usize = 4096;
    thread_local! {
        static POOL: RefCell<([u8; POOL_BYTES], usize)> = const { RefCell::new(([0; POOL_BYTES], POOL_BYTES)) };
    }
    POOL.with_borrow_mut(|(pool, used)| {
        if *used + N > POOL_BYTES {
            rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, pool);
            *used = 0;
        }
        let mut out = [0; N];
        out.copy_from_slice(&pool[*used..*used + N]);
        // Handed out once: wipe what was given.
        pool[*used..*used + N].fill(0);
        *used += N;
        out
    })
}

/// `GET /v1/models`: the models this tenant may use that are registered
/// (and that the host serves, when it can be asked).
async fn models(State(app): State<App>, Extension(call): Extension<TenantCall>) -> Response {
    let TenantCall { identity, snapshot } = call;
    let Some(tenant) = snapshot.policy.tenants.get(&identity.tenant) else {
        return ApiError::internal("a verified tenant is missing from the policy").into_response();
    };
    // While no host is up, what they serve is not known: every
    // registered model is listed.
    let known = app.hosts.ready();
    let data: Vec<_> = tenant
        .models
        .iter()
        .filter(|name| app.models.get(name).is_some())
        .filter(|name| !known || app.hosts.serves(name))
        .map(|name| json!({"id": name, "object": "model", "created": 0, "owned_by": "bulkhead"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// Liveness: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: a policy is loaded and some gpu-host takes requests: it
/// answers health checks, is not draining, and its configured models have
/// been loaded (or refused, loudly).
async fn readyz(State(app): State<App>) -> Response {
    if app.hosts.ready() {
        return (StatusCode::OK, "ready\n").into_response();
    }
    let states: Vec<String> = app
        .hosts
        .hosts()
        .iter()
        .map(|h| format!("{} {}", h.name(), gpu_hosts::status_name(&h.status())))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "not ready: no gpu-host takes requests ({})\n",
            states.join(", ")
        ),
    )
        .into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    app.metrics.upstream_ready.set(i64::from(app.hosts.ready()));
    if let Some(log) = app.audit.log() {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        app.metrics.audit_entries.set(gauge(log.size()));
        app.metrics.audit_bytes.set(gauge(log.bytes()));
        app.metrics
            .audit_failed
            .set(i64::from(log.failure().is_some()));
        let failures = &app.metrics.audit_append_failures;
        failures.inc_by(log.append_failures().saturating_sub(failures.get()));
    }
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
    fn request_ids_are_unique_random_and_fixed_width() {
        let ids: Vec<String> = (0..2000).map(|_| super::request_id()).collect();
        let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        assert!(
            ids.iter()
                .all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        );
        // No counter inside: consecutive ids share no more leading hex
        // digits than chance gives (a counter shares ~28 of 32).
        let shared =
            |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let total: usize = ids.windows(2).map(|w| shared(&w[0], &w[1])).sum();
        assert!(
            total < ids.len() / 4,
            "consecutive ids share {total} leading digits"
        );
        // Every bit position is set in about half the ids.
        for bit in 0..128 {
            let ones = ids
                .iter()
                .filter(|id| u128::from_str_radix(id, 16).unwrap() >> bit & 1 == 1)
                .count();
            assert!((800..1200).contains(&ones), "bit {bit}: {ones} of 2000");
        }
    }

    #[test]
    fn seeds_are_random() {
        let seeds: std::collections::BTreeSet<u64> =
            (0..1000).map(|_| super::random_seed()).collect();
        assert_eq!(seeds.len(), 1000);
    }
}
