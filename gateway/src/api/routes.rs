//! Every route the gateway serves, declared once in [`ROUTES`] with its
//! listener, the kind of principal it serves and the scope it needs; the
//! two routers are built from this table and nothing else, and the check
//! the table names runs before the handler (and before a body is read).
//!
//! This is where authorization is decided:
//! - **Listener.** Tenant routes are served on the public listener only,
//!   operator routes on the admin listener only; elsewhere they do not
//!   exist (404).
//! - **Principal.** A tenant route verifies the token against tenant
//!   issuers and hands the handler a [`TenantCall`]; an operator route
//!   verifies it against operator issuers only and hands an
//!   [`OperatorCall`]. A tenant's token on an operator route is an unknown
//!   issuer (401), whatever scopes it claims.
//! - **Scope.** The token must carry the route's scope (403 otherwise).
//!   Handlers then scope data to the caller's tenant themselves: a
//!   [`TenantCall`] only ever reaches its own tenant's plugins, usage and
//!   audit entries.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use tracing::Span;
use tracing::field::Empty;

use super::identity::{OperatorCall, TenantCall, operator_identity, tenant_identity};
use super::{App, trace};
use crate::auth::Scope;
use crate::metrics::AdminRefusalLabels;

/// Which listener serves a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// Tenants: `listen` in gateway.toml.
    Public,
    /// Operators and monitoring: `[admin] listen`.
    Admin,
}

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone who reaches the listener (health, metrics).
    Anonymous,
    /// A tenant's token carrying this (tenant) scope.
    Tenant(Scope),
    /// An operator's token carrying this (operator) scope.
    Operator(Scope),
}

/// An HTTP method a route answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Method::Get => MethodFilter::GET,
            Method::Post => MethodFilter::POST,
            Method::Put => MethodFilter::PUT,
            Method::Delete => MethodFilter::DELETE,
        }
    }
}

/// One route: where it is served, who may call it, and its handler.
#[derive(Clone, Copy)]
pub struct Route {
    pub method: Method,
    /// The path as axum matches it (`{name}` is one segment).
    pub path: &'static str,
    pub listener: Listener,
    pub access: Access,
    handler: fn(MethodFilter) -> MethodRouter<App>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} ({:?}, {:?})",
            self.method.as_str(),
            self.path,
            self.listener,
            self.access
        )
    }
}

use super::{audit, gpu_hosts, inference, partitions, plugins, registrations, self_service};
use Access::{Anonymous, Operator, Tenant};
use Listener::{Admin, Public};
use Method::{Delete, Get, Post, Put};

const fn route(
    method: Method,
    path: &'static str,
    listener: Listener,
    access: Access,
    handler: fn(MethodFilter) -> MethodRouter<App>,
) -> Route {
    Route {
        method,
        path,
        listener,
        access,
        handler,
    }
}

/// The authorization table: every route either router serves. One row a
/// route, kept as a table (rustfmt would spread each over seven lines).
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    // Health, on both listeners (load balancers probe the public one, the
    // orchestrator may probe either).
    route(Get,    "/healthz",                           Public, Anonymous,                    |m| on(m, super::healthz)),
    route(Get,    "/readyz",                            Public, Anonymous,                    |m| on(m, super::readyz)),
    route(Get,    "/healthz",                           Admin,  Anonymous,                    |m| on(m, super::healthz)),
    route(Get,    "/readyz",                            Admin,  Anonymous,                    |m| on(m, super::readyz)),
    // Tenants.
    route(Post,   "/v1/chat/completions",               Public, Tenant(Scope::Inference),     |m| on(m, inference::chat)),
    route(Post,   "/v1/completions",                    Public, Tenant(Scope::Inference),     |m| on(m, inference::completions)),
    route(Get,    "/v1/models",                         Public, Tenant(Scope::Inference),     |m| on(m, super::models)),
    route(Get,    "/v1/usage",                          Public, Tenant(Scope::Inference),     |m| on(m, self_service::usage)),
    route(Get,    "/v1/plugins",                        Public, Tenant(Scope::PluginsWrite),  |m| on(m, plugins::list)),
    route(Get,    "/v1/plugins/{name}",                 Public, Tenant(Scope::PluginsWrite),  |m| on(m, plugins::get)),
    route(Put,    "/v1/plugins/{name}",                 Public, Tenant(Scope::PluginsWrite),  |m| on(m, plugins::put)),
    route(Delete, "/v1/plugins/{name}",                 Public, Tenant(Scope::PluginsWrite),  |m| on(m, plugins::delete)),
    route(Get,    "/v1/audit/entries",                  Public, Tenant(Scope::PluginsWrite),  |m| on(m, self_service::audit_entries)),
    // Operators.
    route(Get,    "/metrics",                           Admin,  Anonymous,                    |m| on(m, super::metrics)),
    route(Get,    "/admin/v1/models",                   Admin,  Operator(Scope::ModelsRead),  |m| on(m, registrations::list)),
    route(Post,   "/admin/v1/models",                   Admin,  Operator(Scope::ModelsWrite), |m| on(m, registrations::register)),
    route(Delete, "/admin/v1/models/{name}",            Admin,  Operator(Scope::ModelsWrite), |m| on(m, registrations::unregister)),
    route(Get,    "/admin/v1/partitions",               Admin,  Operator(Scope::PartitionsRead), |m| on(m, partitions::list)),
    route(Get,    "/admin/v1/gpu-hosts",                Admin,  Operator(Scope::GpuHostsRead), |m| on(m, gpu_hosts::list)),
    route(Post,   "/admin/v1/gpu-hosts/{name}/drain",   Admin,  Operator(Scope::GpuHostsWrite), |m| on(m, gpu_hosts::drain)),
    route(Post,   "/admin/v1/gpu-hosts/{name}/resume",  Admin,  Operator(Scope::GpuHostsWrite), |m| on(m, gpu_hosts::resume)),
    route(Get,    "/admin/v1/tenants",                  Admin,  Operator(Scope::TenantsRead), |m| on(m, self_service::tenants)),
    route(Get,    "/admin/v1/usage",                    Admin,  Operator(Scope::UsageRead),   |m| on(m, self_service::all_usage)),
    route(Get,    "/admin/v1/audit/checkpoint",         Admin,  Operator(Scope::AuditRead),   |m| on(m, audit::checkpoint)),
    route(Get,    "/admin/v1/audit/entries",            Admin,  Operator(Scope::AuditRead),   |m| on(m, audit::entries)),
    route(Get,    "/admin/v1/audit/proof/inclusion",    Admin,  Operator(Scope::AuditRead),   |m| on(m, audit::inclusion)),
    route(Get,    "/admin/v1/audit/proof/consistency",  Admin,  Operator(Scope::AuditRead),   |m| on(m, audit::consistency)),
];

/// The router of `listener`: its routes from [`ROUTES`], each behind the
/// check its entry names, and 404 for anything else. `max_body_bytes` is
/// the gateway-wide cap, enforced while a body is read (after the check).
pub fn router(app: App, listener: Listener, max_body_bytes: usize) -> Router {
    let mut router = Router::new();
    for route in ROUTES.iter().filter(|r| r.listener == listener) {
        let guard = Guard {
            app: app.clone(),
            route: *route,
        };
        let mut handler = (route.handler)(route.method.filter())
            .route_layer(middleware::from_fn_with_state(guard, authorize));
        if route.access != Access::Anonymous {
            // Outside `authorize`, so that auth is a child of the request's
            // span. Health and metrics scrapes are not traced.
            let name: Arc<str> = format!("{} {}", route.method.as_str(), route.path).into();
            handler =
                handler.route_layer(middleware::from_fn(move |request: Request, next: Next| {
                    let span = trace::server_span(
                        &name,
                        route.method.as_str(),
                        route.path,
                        request.headers(),
                    );
                    trace::in_server_span(span, request, next)
                }));
        }
        router = router.route(route.path, handler);
    }
    router
        .fallback(super::not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            super::deadline::body_deadline,
        ))
        .with_state(app)
}

#[derive(Clone)]
struct Guard {
    app: App,
    route: Route,
}

/// The route's check, before its handler: anonymous routes pass; others
/// need a verified token of the route's principal with its scope.
async fn authorize(State(guard): State<Guard>, mut request: Request, next: Next) -> Response {
    let Guard { app, route } = guard;
    match route.access {
        Access::Anonymous => {}
        Access::Tenant(scope) => {
            let snapshot = app.snapshot.load_full();
            let request_span = Span::current();
            let span = tracing::info_span!(target: trace::TARGET, "auth", outcome = Empty);
            let verified = span.in_scope(|| tenant_identity(&snapshot, request.headers(), scope));
            match verified {
                Ok(identity) => {
                    span.record("outcome", "ok");
                    // The verified tenant only: a refused token's claim
                    // never reaches a span.
                    request_span.record("bulkhead.tenant", identity.tenant.as_str());
                    request
                        .extensions_mut()
                        .insert(TenantCall { identity, snapshot });
                }
                Err((tenant, error)) => {
                    span.record("outcome", error.code);
                    trace::record_error(&request_span, error.code);
                    app.metrics.reject(&tenant, error.code);
                    return error.into_response();
                }
            }
        }
        Access::Operator(scope) => {
            let snapshot = app.snapshot.load();
            let span = tracing::info_span!(target: trace::TARGET, "auth", outcome = Empty);
            match span.in_scope(|| operator_identity(&snapshot, request.headers(), scope)) {
                Ok(identity) => {
                    span.record("outcome", "ok");
                    request.extensions_mut().insert(OperatorCall { identity });
                }
                Err(error) => {
                    span.record("outcome", error.code);
                    trace::record_error(&Span::current(), error.code);
                    app.metrics
                        .admin_refusals
                        .get_or_create(&AdminRefusalLabels { reason: error.code })
                        .inc();
                    // Never the token: the route and why are enough.
                    tracing::warn!(
                        route = %format_args!("{} {}", route.method.as_str(), route.path),
                        reason = error.code,
                        "operator call refused: {}",
                        error.message
                    );
                    return error.into_response();
                }
            }
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests;
