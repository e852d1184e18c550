//! Tenant plugins: WebAssembly components run in wasmtime under hard
//! limits. The lifecycle is split by cost (expensive work once, cheap work per call):
//!
//! - once per gateway, [`PluginEngine::new`]: the engine (pooling
//!   allocator, epoch interruption and its ticker thread) and the linker
//!   with every allowed import ([`ALLOWED_IMPORTS`]);
//! - once per upload, [`PluginEngine::validate_and_compile`]: size cap,
//!   component check, import allow-list, exports, compile with a time
//!   budget → [`CompiledPlugin`] (keyed by its [`PluginDigest`]);
//! - per request, [`CompiledPlugin::instantiate`] → [`PluginCall`]: a fresh
//!   store and instance with the call's [`PluginLimits`], then the hooks.
//!
//! Uploads are kept by [`PluginRegistry`] (`store/`): on disk by digest,
//! or in a [`SharedPlugins`] store the gateway replicas share; compiled
//! code cached under a MAC, and an in-memory index the request path reads
//! with [`PluginRegistry::get`].
//!
//! The gateway sees only the plain types here ([`Request`],
//! [`Response`], [`Rejection`], …); the generated bindings stay inside.
//! Calls are synchronous: run them on a blocking thread, each holding a
//! [`GatePass`] from the gateway's [`HookGate`] (the cap on plugin code
//! running at once, fair between tenants).

// One `unsafe` block: loading compiled plugin code this host sealed
// itself (`engine.rs`, `deserialize_verified`).
#![deny(unsafe_code)]

mod bindings;
mod call;
mod compile_queue;
mod engine;
mod error;
mod gate;
mod host;
mod instances;
mod limits;
mod runtime;
pub mod signature;
mod store;
mod ticker;
mod types;
mod validate;
mod wasi;

#[cfg(test)]
mod tests;

pub use call::{CallContext, PluginCall};
pub use compile_queue::Compiler;
pub use engine::{CompiledPlugin, PluginDigest, PluginEngine, PluginEngineConfig};
pub use error::{Hook, PluginError};
pub use gate::{GatePass, HookGate, MAX_GATE_SLOTS, default_gate_slots};
pub use host::{LogStats, PluginConfig};
pub use limits::*;
pub use store::{
    FileStoreContents, Listing, LoadFailure, LoadReport, MAX_PLUGINS_PER_TENANT,
    MAX_VERSION_FLOORS_PER_TENANT, PLUGIN_NAME_RULE, PluginInfo, PluginName, PluginRegistry,
    SharedEntry, SharedPlugins, SharedPut, StoreError, StoredBlob, UploadOutcome, VersionFloor,
    read_file_store,
};
pub use types::{Message, Prompt, Rejection, Request, Response, Sampling};
pub use validate::{ALLOWED_IMPORTS, AllowedImport, REQUIRED_EXPORTS};
