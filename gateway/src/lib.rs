//! Bulkhead's gateway: the OpenAI-compatible HTTP API in front of the
//! gpu-hosts, with per-tenant JWT auth, limits and policy files, and model
//! signing and verification.

#![forbid(unsafe_code)]

mod api;
mod app;
pub mod auth;
pub mod limits;
mod metrics;
mod pipeline;
pub mod policy;
mod pool;
mod reconcile;
pub mod registration;
mod request;
mod serving;
mod snapshot;
mod source;
mod upstream;

pub use api::{
    Access, ApiError, App, Endpoint, InferenceRequest, Listener, LocalReport, LocalRun,
    LocalRunError, Method, Prompt, ROUTES, Route, request_json, run_locally,
};
pub use app::{Listening, ServeError, ServeOptions, serve};
/// The audit log (crate `bulkhead-audit`).
pub use bulkhead_audit as audit;
/// Model signing and verification (crate `bulkhead-model-signing`).
pub use bulkhead_model_signing as signing;
/// Tenants' WebAssembly plugins (crate `bulkhead-plugin-host`).
pub use bulkhead_plugin_host as plugins;
pub use snapshot::{Snapshot, build_snapshot};
